//! The master's state machine: per-(account, op) demand windows fed by
//! agents' reports, and the suppression factor each one gets back.
//!
//! One [`MasterState`] is one shard: it takes `&mut self` and no locks. The
//! master service shards (account, op) keys over several of them so ingest
//! scales across cores; the simulator drives one per simulated master.
//!
//! ```
//! use damper_core::config::MasterConfig;
//! use damper_core::master::{MasterState, Report};
//! use damper_core::time::Nanos;
//!
//! let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
//! let mut master = MasterState::new(config);
//! let end = Nanos::from_secs(1_700_000_002);
//! // One agent saw 8000 cost attempted in 2 s: 4000/s against a 1000/s limit.
//! let report = Report {
//!     account: "acme",
//!     op: "messages",
//!     start: Nanos::from_secs(1_700_000_000),
//!     end,
//!     attempted: 8000,
//!     admitted: 8000,
//! };
//! let verdict = master.ingest(end, &report).unwrap().expect("messages are limited");
//! assert_eq!(verdict.factor, 0.75);
//! ```

use std::collections::HashMap;
use std::time::Duration;

use foldhash::fast::RandomState;

use crate::MAX_NAME_LEN;
use crate::config::MasterConfig;
use crate::limits::{LimitId, Rate};
use crate::time::Nanos;
use crate::window::{DemandWindow, Dropped, Rates};

/// One agent's counts for one (account, op) over `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report<'a> {
    /// Account id, 1..=256 bytes.
    pub account: &'a str,
    /// Operation, 1..=256 bytes.
    pub op: &'a str,
    /// Start of the interval the counts cover.
    pub start: Nanos,
    /// End (exclusive) of the interval.
    pub end: Nanos,
    /// Cost attempted: admitted plus what rejected operations would have cost.
    pub attempted: u64,
    /// Cost admitted; at most `attempted`.
    pub admitted: u64,
}

/// Why a report was refused. Nothing of a refused report is counted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// A name is empty.
    #[error("`{field}` is empty")]
    Empty {
        /// `account` or `op`.
        field: &'static str,
    },
    /// A name is longer than [`MAX_NAME_LEN`] bytes.
    #[error("`{field}` is {len} bytes long; the limit is {MAX_NAME_LEN}")]
    TooLong {
        /// `account` or `op`.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// More admitted than attempted, which cannot happen.
    #[error("`admitted` ({admitted}) is more than `attempted` ({attempted})")]
    AdmittedExceedsAttempted {
        /// The admitted cost reported.
        admitted: u64,
        /// The attempted cost reported.
        attempted: u64,
    },
    /// The interval ends before it starts.
    #[error("the interval ends ({end:?}) before it starts ({start:?})")]
    EndsBeforeStart {
        /// Reported start.
        start: Nanos,
        /// Reported end.
        end: Nanos,
    },
    /// The interval ends further ahead of the master's clock than any sane
    /// clock skew: the agent's clock, or the request, is wrong.
    #[error(
        "the interval ends {ahead_ms} ms after this master's clock; at most {} ms of clock skew is accepted",
        MAX_CLOCK_AHEAD.as_millis()
    )]
    EndsInFuture {
        /// How far ahead, in milliseconds.
        ahead_ms: u64,
    },
    /// The interval is longer than any an agent sends (agents carry counts
    /// over for at most tens of seconds).
    #[error(
        "the interval is {span_ms} ms long; at most {} ms is accepted",
        MAX_REPORT_SPAN.as_millis()
    )]
    SpanTooLong {
        /// Its length, in milliseconds.
        span_ms: u64,
    },
}

/// How far a report's end may be ahead of the master's clock. Within it, the
/// report is moved back to end at the master's `now` (clock skew between
/// hosts); beyond it, it is refused.
pub const MAX_CLOCK_AHEAD: Duration = Duration::from_secs(60);

/// The longest interval one report may cover. Agents report every rollup
/// interval and carry failed counts over for at most their `max_carry`
/// (default 30 s); anything near an hour is a bug or an attack.
pub const MAX_REPORT_SPAN: Duration = Duration::from_secs(3600);

/// Checks an account or op name: 1 to [`MAX_NAME_LEN`] bytes. `field`
/// names it in the error. The one rule masters enforce and agents respect.
pub fn validate_name(field: &'static str, name: &str) -> Result<(), ReportError> {
    if name.is_empty() {
        return Err(ReportError::Empty { field });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(ReportError::TooLong {
            field,
            len: name.len(),
        });
    }
    Ok(())
}

impl Report<'_> {
    /// Checks the report on its own, without the state, as received at
    /// `now` by the master's clock.
    pub fn validate(&self, now: Nanos) -> Result<(), ReportError> {
        validate_name("account", self.account)?;
        validate_name("op", self.op)?;
        if self.admitted > self.attempted {
            return Err(ReportError::AdmittedExceedsAttempted {
                admitted: self.admitted,
                attempted: self.attempted,
            });
        }
        if self.end < self.start {
            return Err(ReportError::EndsBeforeStart {
                start: self.start,
                end: self.end,
            });
        }
        if self.end > now && self.end.since(now) > MAX_CLOCK_AHEAD {
            return Err(ReportError::EndsInFuture {
                ahead_ms: ms(self.end.since(now)),
            });
        }
        if self.end.since(self.start) > MAX_REPORT_SPAN {
            return Err(ReportError::SpanTooLong {
                span_ms: ms(self.end.since(self.start)),
            });
        }
        Ok(())
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What the master tells agents about one limited (account, op).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// Probability of rejecting each operation, in `[0, 1]`.
    pub factor: f64,
    /// The account-wide limit that applied.
    pub limit: Rate,
    /// How long agents may apply `factor` without a fresher one.
    pub valid_for: Duration,
    /// The estimated rates the factor was computed from.
    pub rates: Rates,
    /// When the agent should ask again ([`MasterState::verdict`]) rather
    /// than hold this factor for a whole interval: the time by which the
    /// round it comes from should be whole. Set when that round is still
    /// being reported and either the factor is positive (a flood that just
    /// stopped may release) or it is the account's first round here (an
    /// account that moved to this master: early reporters saw only part of
    /// its demand).
    pub recheck_at: Option<Nanos>,
}

/// One (account, op)'s window, as a snapshot carries it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct KeySnapshot {
    /// The operation.
    pub op: String,
    /// The account.
    pub account: String,
    /// When its last report arrived (idle eviction counts from here).
    pub last_report: Nanos,
    /// Its demand window.
    pub window: DemandWindow,
}

#[derive(Debug)]
struct KeyState {
    window: DemandWindow,
    last_report: Nanos,
    /// The limit that applied under config `generation`.
    limit: Option<LimitId>,
    generation: u32,
    /// Whether the last verdict had a positive factor: a change is a
    /// [`Transition`].
    suppressed: bool,
}

/// An (account, op) starting or stopping being suppressed, as
/// [`MasterState::take_transitions`] hands it out: what operators want one
/// log line for, rather than one per rollup.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// The operation.
    pub op: String,
    /// The account.
    pub account: String,
    /// What happened.
    pub kind: TransitionKind,
    /// The factor now (0 once stopped).
    pub factor: f64,
    /// The demand rate, cost per second, it was computed from.
    pub demand: f64,
    /// The limit in force, cost per second (0 when none applies any more).
    pub limit: f64,
}

/// Whether suppression started or stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransitionKind {
    /// The factor went from 0 to positive.
    Started,
    /// The factor went back to 0, the limit was removed, or the pair went
    /// idle and was forgotten.
    Stopped,
}

/// One tracked (account, op) as the master sees it at some instant: what
/// introspection shows.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct KeyView {
    /// The account.
    pub account: String,
    /// The operation.
    pub op: String,
    /// The account-wide limit in force, cost per second; `None` when no
    /// configured limit applies (the pair is tracked, never suppressed).
    pub limit: Option<f64>,
    /// The configured key that gave the limit, such as `messages/acme`.
    pub limit_key: Option<String>,
    /// Estimated attempted cost per second (before suppression).
    pub demand: f64,
    /// Estimated admitted cost per second.
    pub admitted: f64,
    /// The suppression factor agents get now.
    pub factor: f64,
    /// When the last report for it arrived (Unix milliseconds).
    pub last_report_unix_ms: u64,
}

/// Per-(account, op) windows and the factors they give. See the module docs.
#[derive(Debug)]
pub struct MasterState {
    config: MasterConfig,
    /// Bumped by every [`set_config`](Self::set_config); cached limit
    /// matches from an older generation are looked up again.
    generation: u32,
    ops: HashMap<Box<str>, HashMap<Box<str>, KeyState, RandomState>, RandomState>,
    keys: usize,
    dropped: Dropped,
    /// Suppression starts and stops not yet taken, when tracked
    /// ([`track_transitions`](Self::track_transitions)); `None` otherwise,
    /// so a caller that never takes them (the simulator) keeps nothing.
    transitions: Option<Vec<Transition>>,
}

impl MasterState {
    /// An empty state under `config`.
    pub fn new(config: MasterConfig) -> MasterState {
        MasterState {
            config,
            generation: 0,
            ops: HashMap::default(),
            keys: 0,
            dropped: Dropped::default(),
            transitions: None,
        }
    }

    /// Starts (or stops) keeping a [`Transition`] each time an (account,
    /// op) starts or stops being suppressed. The caller must drain them
    /// with [`take_transitions`](Self::take_transitions).
    pub fn track_transitions(&mut self, on: bool) {
        self.transitions = on.then(Vec::new);
    }

    /// The suppression starts and stops since the last call.
    pub fn take_transitions(&mut self) -> Vec<Transition> {
        self.transitions
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The configuration in force.
    pub fn config(&self) -> &MasterConfig {
        &self.config
    }

    /// Replaces the configuration. New limits and the policy apply from the
    /// next report on, with the windows kept; a change to how the window is
    /// cut up (sub-interval length or count, rollup interval, grace) starts
    /// every window afresh, since old counts no longer fit it.
    pub fn set_config(&mut self, config: MasterConfig) {
        if self.config.window.shape_change(&config.window).is_some() {
            for accounts in self.ops.values_mut() {
                for key in accounts.values_mut() {
                    key.window = DemandWindow::new(&config.window);
                }
            }
        }
        self.config = config;
        self.generation = self.generation.wrapping_add(1);
    }

    /// Adds one report and returns the verdict for its (account, op), or
    /// `None` when no limit applies to it.
    ///
    /// A report that ends after `now` (an agent whose clock runs ahead) is
    /// moved back to end at `now`, keeping its length, so it is neither
    /// counted in the future nor read as a higher rate.
    pub fn ingest(
        &mut self,
        now: Nanos,
        report: &Report<'_>,
    ) -> Result<Option<Verdict>, ReportError> {
        report.validate(now)?;
        let (mut start, mut end) = (report.start, report.end);
        if end > now {
            let ahead = end.since(now);
            start = start - ahead;
            end = now;
        }
        let window_config = &self.config.window;
        let accounts = match self.ops.get_mut(report.op) {
            Some(accounts) => accounts,
            None => self.ops.entry(report.op.into()).or_default(),
        };
        let key = match accounts.get_mut(report.account) {
            Some(key) => key,
            None => {
                self.keys += 1;
                accounts
                    .entry(report.account.into())
                    .or_insert_with(|| KeyState {
                        window: DemandWindow::new(window_config),
                        last_report: now,
                        limit: None,
                        generation: self.generation.wrapping_sub(1),
                        suppressed: false,
                    })
            }
        };
        let dropped =
            key.window
                .record(window_config, start, end, report.attempted, report.admitted);
        self.dropped.attempted = self.dropped.attempted.saturating_add(dropped.attempted);
        self.dropped.admitted = self.dropped.admitted.saturating_add(dropped.admitted);
        key.last_report = key.last_report.max(now);
        if key.generation != self.generation {
            key.limit = self
                .config
                .limits
                .lookup(report.account, report.op)
                .map(|m| m.id);
            key.generation = self.generation;
        }
        let verdict = key
            .limit
            .and_then(|id| self.config.limits.get(id))
            .map(|limit| verdict(&self.config, &key.window, limit.rate, now));
        let suppressed = verdict.is_some_and(|v| v.factor > 0.0);
        if suppressed != key.suppressed {
            key.suppressed = suppressed;
            if let Some(transitions) = &mut self.transitions {
                transitions.push(Transition {
                    op: report.op.to_owned(),
                    account: report.account.to_owned(),
                    kind: if suppressed {
                        TransitionKind::Started
                    } else {
                        TransitionKind::Stopped
                    },
                    factor: verdict.map_or(0.0, |v| v.factor),
                    demand: verdict.map_or(0.0, |v| v.rates.demand),
                    limit: verdict.map_or(0.0, |v| v.limit.get()),
                });
            }
        }
        Ok(verdict)
    }

    /// Every tracked (account, op) that `keep(op, account)` selects, as it
    /// stands at `now`: limit, rates and factor. For introspection; the
    /// order is unspecified.
    pub fn views(&self, now: Nanos, mut keep: impl FnMut(&str, &str) -> bool) -> Vec<KeyView> {
        let mut views = Vec::new();
        for (op, accounts) in &self.ops {
            for (account, key) in accounts {
                if !keep(op, account) {
                    continue;
                }
                let limit = self.config.limits.lookup(account, op);
                let (factor, rates) = match limit {
                    Some(m) => {
                        let v = verdict(&self.config, &key.window, m.rate, now);
                        (v.factor, v.rates)
                    }
                    None => (0.0, key.window.estimate(&self.config.window, now).rates),
                };
                views.push(KeyView {
                    account: account.to_string(),
                    op: op.to_string(),
                    limit: limit.map(|m| m.rate.get()),
                    limit_key: limit.map(|m| m.key.to_owned()),
                    demand: rates.demand,
                    admitted: rates.admitted,
                    factor,
                    last_report_unix_ms: key.last_report.as_millis(),
                });
            }
        }
        views
    }

    /// The verdict for an (account, op) at `now` without a new report:
    /// `None` when no limit applies. An (account, op) the master has no
    /// reports for reads as zero demand.
    pub fn verdict(&self, now: Nanos, account: &str, op: &str) -> Option<Verdict> {
        let rate = self.config.limits.lookup(account, op)?.rate;
        Some(match self.ops.get(op).and_then(|a| a.get(account)) {
            Some(key) => verdict(&self.config, &key.window, rate, now),
            None => {
                let rates = Rates::default();
                Verdict {
                    factor: self.config.policy.kind.factor(rate, rates),
                    limit: rate,
                    valid_for: self.config.policy.factor_validity,
                    rates,
                    recheck_at: None,
                }
            }
        })
    }

    /// Forgets every (account, op) with no report for `idle_for`, so state
    /// stays proportional to the active accounts. Returns how many went.
    pub fn evict_idle(&mut self, now: Nanos, idle_for: Duration) -> usize {
        let before = self.keys;
        for (op, accounts) in &mut self.ops {
            accounts.retain(|account, key| {
                let keep = now.since(key.last_report) < idle_for;
                if !keep && key.suppressed {
                    if let Some(transitions) = &mut self.transitions {
                        transitions.push(Transition {
                            op: op.to_string(),
                            account: account.to_string(),
                            kind: TransitionKind::Stopped,
                            factor: 0.0,
                            demand: 0.0,
                            limit: 0.0,
                        });
                    }
                }
                keep
            });
        }
        self.ops.retain(|_, accounts| !accounts.is_empty());
        self.keys = self.ops.values().map(HashMap::len).sum();
        before - self.keys
    }

    /// Copies out every (account, op)'s window, for a snapshot that a
    /// restarted master loads with [`import`](Self::import).
    pub fn export(&self) -> Vec<KeySnapshot> {
        self.ops
            .iter()
            .flat_map(|(op, accounts)| {
                accounts.iter().map(|(account, key)| KeySnapshot {
                    op: op.to_string(),
                    account: account.to_string(),
                    last_report: key.last_report,
                    window: key.window.clone(),
                })
            })
            .collect()
    }

    /// Takes in windows from a snapshot. Ones with bad names or a window of
    /// another shape than this config's are skipped; a pair already tracked
    /// keeps its own window. Returns how many were taken.
    pub fn import(&mut self, keys: impl IntoIterator<Item = KeySnapshot>) -> usize {
        let mut taken = 0;
        for k in keys {
            if validate_name("op", &k.op).is_err()
                || validate_name("account", &k.account).is_err()
                || !k.window.fits(&self.config.window)
            {
                continue;
            }
            let accounts = self.ops.entry(k.op.into_boxed_str()).or_default();
            if let std::collections::hash_map::Entry::Vacant(slot) =
                accounts.entry(k.account.into_boxed_str())
            {
                slot.insert(KeyState {
                    window: k.window,
                    last_report: k.last_report,
                    limit: None,
                    generation: self.generation.wrapping_sub(1),
                    suppressed: false,
                });
                self.keys += 1;
                taken += 1;
            }
        }
        taken
    }

    /// Number of (account, op) pairs tracked.
    pub fn len(&self) -> usize {
        self.keys
    }

    /// Whether no (account, op) is tracked.
    pub fn is_empty(&self) -> bool {
        self.keys == 0
    }

    /// For each op tracked, how many of its pairs are suppressed (their
    /// last report got a positive factor), 0 included. Counts flags,
    /// computes nothing.
    pub fn suppressed_by_op(&self) -> impl Iterator<Item = (&str, usize)> {
        self.ops
            .iter()
            .map(|(op, accounts)| (&**op, accounts.values().filter(|k| k.suppressed).count()))
    }

    /// Cost that arrived too late to fit in its window, since start.
    pub fn dropped(&self) -> Dropped {
        self.dropped
    }
}

fn verdict(config: &MasterConfig, window: &DemandWindow, limit: Rate, now: Nanos) -> Verdict {
    let estimate = window.estimate(&config.window, now);
    let factor = config.policy.kind.factor(limit, estimate.rates);
    Verdict {
        factor,
        limit,
        valid_for: config.policy.factor_validity,
        rates: estimate.rates,
        recheck_at: estimate
            .whole_by
            .filter(|_| factor > 0.0 || estimate.first_round),
    }
}

#[cfg(test)]
mod tests;
