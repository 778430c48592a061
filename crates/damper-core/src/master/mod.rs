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
//!     op_cost: 0,
//!     ops: 0,
//! };
//! let verdict = master.ingest(end, &report).unwrap().expect("messages are limited");
//! assert_eq!(verdict.factor, 0.75);
//! ```
//!
//! # Layout
//! - this file: [`MasterState`]: ingest, verdicts, views, eviction,
//!   snapshots.
//! - `table`: where the pairs are kept and how one is found.
//! - `account_name`: an entry's account name in 16 bytes, long ones
//!   beside.
//! - `extras`: what few windows hold beyond their core, by position.
//! - `report_time`: when a pair's last report arrived, in four bytes.
//! - `budget`: [`SurgeBudget`], how often one agent may send early reports.
//! - `hint`: sparse hints tallied, and the pairs they poll ([`HintStats`]).
//! - `new_pairs`: [`NewPairBudget`], how many pairs one agent may add per
//!   round.
//! - `seen`: [`RollupLog`], the numbered rollups counted lately.
//! - `push`: [`Push`], verdicts an early report flipped, for every agent.

mod account_name;
mod budget;
mod extras;
mod hint;
mod new_pairs;
mod push;
mod report_time;
mod seen;
mod table;

use std::time::Duration;

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use crate::Pair;
use crate::config::{EstimatorKind, MasterConfig, PolicyKind};
use crate::limits::{LimitMatch, Rate};
use crate::time::Nanos;
use crate::window::{DemandWindow, Dropped, Estimate, Rates};

pub use crate::window::{HINT_SPAN, HintFrom, hints_needed};
pub use crate::wire::{Report, ReportError};
use crate::wire::{SurgeRates, Validated, validate_name};
pub use budget::{SurgeBudget, SurgeRefused, SurgeTaken};
pub use hint::{HintStats, POLLS_PER_INTERVAL};
pub use new_pairs::NewPairBudget;
use push::Suppression;
pub use push::{PUSH_MAX_PAIRS, Push, RELEASE_PUSH_SHARE, push_reply};
pub use report_time::MAX_REPORT_AGE;
use report_time::ReportTime;
pub use seen::RollupLog;
use table::{Entries, Op};
pub use table::{MAX_OPS, MAX_SHARD_PAIRS};

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
    /// Whether the limit is in shadow (`[shadow]`): agents admit what
    /// `factor` would refuse, and say so.
    pub shadow: bool,
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

/// What changed for an (account, op).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransitionKind {
    /// Suppression started: the factor went from 0 to positive.
    Started,
    /// Suppression stopped: the factor went back to 0, the limit was
    /// removed, or the pair went idle and was forgotten.
    Stopped,
    /// Its demand rose to `policy.near_limit_share` of its limit: it is
    /// close to being refused, nothing refused yet.
    NearLimit,
    /// Its demand fell back under the near share, less a margin
    /// ([`NEAR_LIMIT_MARGIN`]), or its limit was removed, or it went idle
    /// and was forgotten.
    NearLimitEnded,
    /// As [`Started`](Self::Started), under a limit in shadow: from now on
    /// the agents would refuse some of its operations, and admit them.
    ShadowStarted,
    /// As [`Stopped`](Self::Stopped), under a limit in shadow.
    ShadowStopped,
}

impl TransitionKind {
    /// Its name in events and logs: `suppression_started`,
    /// `suppression_ended`, `near_limit`, `near_limit_ended`,
    /// `shadow_suppression_started`, `shadow_suppression_ended`.
    pub fn name(self) -> &'static str {
        match self {
            TransitionKind::Started => "suppression_started",
            TransitionKind::Stopped => "suppression_ended",
            TransitionKind::NearLimit => "near_limit",
            TransitionKind::NearLimitEnded => "near_limit_ended",
            TransitionKind::ShadowStarted => "shadow_suppression_started",
            TransitionKind::ShadowStopped => "shadow_suppression_ended",
        }
    }

    /// Suppression starting under a limit in shadow or not.
    fn started(shadow: bool) -> TransitionKind {
        if shadow {
            TransitionKind::ShadowStarted
        } else {
            TransitionKind::Started
        }
    }

    /// Suppression stopping under a limit in shadow or not.
    fn stopped(shadow: bool) -> TransitionKind {
        if shadow {
            TransitionKind::ShadowStopped
        } else {
            TransitionKind::Stopped
        }
    }

    /// Every kind, in the order a flood goes through them.
    pub const ALL: [TransitionKind; 6] = [
        TransitionKind::NearLimit,
        TransitionKind::Started,
        TransitionKind::ShadowStarted,
        TransitionKind::Stopped,
        TransitionKind::ShadowStopped,
        TransitionKind::NearLimitEnded,
    ];
}

/// How far under the near share, as a share of the limit, demand must fall
/// before it is no longer near: an account hovering at the share would
/// otherwise flap between the two events at every round.
pub const NEAR_LIMIT_MARGIN: f64 = 0.05;

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
    /// Whether that limit is in shadow: `factor` is what agents would
    /// refuse, and they admit it.
    pub shadow: bool,
    /// The `[exempt]` entry that exempts it (then `limit` is `None` and
    /// `factor` 0), such as `org/vip`.
    pub exempt: Option<String>,
    /// Estimated attempted cost per second (before suppression).
    pub demand: f64,
    /// Estimated admitted cost per second.
    pub admitted: f64,
    /// The suppression factor agents get now.
    pub factor: f64,
    /// When the last report for it arrived (Unix milliseconds), to the
    /// second: the start of that second, as an entry keeps it.
    pub last_report_unix_ms: u64,
}

/// Per-(account, op) windows and the factors they give. See the module docs.
#[derive(Debug)]
pub struct MasterState {
    config: MasterConfig,
    /// Op names seen, interned; never shrinks (ops are few).
    ops: Vec<Op>,
    /// The op of the last report, which the next one most likely shares.
    last_op: u32,
    /// (op, account) → position in `entries`, by `hasher`.
    index: HashTable<table::IndexPos>,
    hasher: RandomState,
    entries: Entries,
    dropped: Dropped,
    /// Most pairs tracked at once ([`set_max_pairs`](Self::set_max_pairs));
    /// unbounded by default.
    max_pairs: usize,
    /// Reports of new pairs not tracked because `max_pairs` were, or the
    /// caller's allowance was spent.
    refused_pairs: u64,
    /// Reports not tracked because their op was new and [`MAX_OPS`] ops
    /// were interned already.
    refused_ops: u64,
    /// How many new pairs the current caller may still add
    /// ([`allow_new_pairs`](Self::allow_new_pairs)); `None`: only
    /// `max_pairs` bounds them.
    new_pairs_allowed: Option<usize>,
    /// Suppression starts and stops not yet taken, when tracked
    /// ([`track_transitions`](Self::track_transitions)); `None` otherwise,
    /// so a caller that never takes them (the simulator) keeps nothing.
    transitions: Option<Vec<Transition>>,
    /// Verdicts early reports flipped, not yet taken, when tracked
    /// ([`track_pushes`](Self::track_pushes)); `None` otherwise.
    pushes: Option<Vec<Push>>,
    /// Sparse hints taken and polls made ([`hint_stats`](Self::hint_stats)),
    /// and the polls of the current rollup interval, against
    /// [`POLLS_PER_INTERVAL`].
    hints: HintStats,
    polls_in: (u64, usize),
}

impl MasterState {
    /// An empty state under `config`.
    pub fn new(config: MasterConfig) -> MasterState {
        MasterState {
            config,
            ops: Vec::new(),
            last_op: 0,
            index: HashTable::new(),
            hasher: RandomState::default(),
            entries: Entries::default(),
            dropped: Dropped::default(),
            max_pairs: MAX_SHARD_PAIRS,
            refused_pairs: 0,
            refused_ops: 0,
            new_pairs_allowed: None,
            transitions: None,
            pushes: None,
            hints: HintStats::default(),
            polls_in: (0, 0),
        }
    }

    /// Tracks at most `max` pairs. Past it, reports of new pairs are not
    /// tracked (their verdict is none: they fail open, as under a lost
    /// master) and are counted ([`refused_pairs`](Self::refused_pairs));
    /// every pair already tracked, every suppressed one among them, keeps
    /// its state, so a flood stays held while someone floods the state
    /// with made-up names. Room comes back as idle pairs are evicted.
    /// At most [`MAX_SHARD_PAIRS`] (a state numbers its pairs in 24 bits).
    pub fn set_max_pairs(&mut self, max: usize) {
        self.max_pairs = max.min(MAX_SHARD_PAIRS);
    }

    /// Reports of new pairs refused for `max_pairs`, or past the caller's
    /// allowance, since the state was made.
    pub fn refused_pairs(&self) -> u64 {
        self.refused_pairs
    }

    /// Reports not tracked because their op was a new one past the
    /// [`MAX_OPS`] ops interned, since the state was made: they fail open,
    /// as past `max_pairs`.
    pub fn refused_ops(&self) -> u64 {
        self.refused_ops
    }

    /// Lets the reports that follow add at most `allowed` new pairs
    /// (`None`: as many as `max_pairs` leaves room for); past it, new pairs
    /// are refused as past `max_pairs`. The master service sets each
    /// agent's [`NewPairBudget`] here before its reports and reads back
    /// what is left with [`new_pairs_allowed`](Self::new_pairs_allowed).
    pub fn allow_new_pairs(&mut self, allowed: Option<usize>) {
        self.new_pairs_allowed = allowed;
    }

    /// What is left of the allowance set by
    /// [`allow_new_pairs`](Self::allow_new_pairs).
    pub fn new_pairs_allowed(&self) -> Option<usize> {
        self.new_pairs_allowed
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
    /// next report on (each pair's cached limit is marked stale, one pass
    /// over the entries: 5–6 ms a million pairs), with the windows kept; a
    /// change to how the window is cut up (sub-interval length or count,
    /// rollup interval, grace) starts every window afresh, since old
    /// counts no longer fit it.
    pub fn set_config(&mut self, config: MasterConfig) {
        if self.config.window.shape_change(&config.window).is_some() {
            for i in 0..u32::try_from(self.entries.len).expect("fewer than 2^32 pairs") {
                self.entries
                    .put_window(i, DemandWindow::new(&config.window));
            }
        }
        self.config = config;
        self.entries.mark_stale();
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
        self.ingest_at(now, report, &mut 0)
    }

    /// [`ingest`](Self::ingest), told where the pair was last found: `at`
    /// is its position plus one (0: not known), as a master's dictionary
    /// remembers it for an account given by number
    /// ([`Expansion`](crate::wire::dictionary::Expansion)). A hint that holds the
    /// pair saves the index lookup; any other is checked and ignored. On
    /// return, `at` is where the pair is, to remember; left as it was when
    /// the hint holds the account on another op (the account's other pairs
    /// keep their hint), or when the pair is not tracked.
    pub fn ingest_at(
        &mut self,
        now: Nanos,
        report: &Report<'_>,
        at: &mut u32,
    ) -> Result<Option<Verdict>, ReportError> {
        let validated = Validated::report(report, now)?;
        Ok(self.ingest_validated(validated, report, at))
    }

    /// [`ingest_at`](Self::ingest_at) of a report of a rollup that
    /// [`Rollup::validate`](crate::wire::Rollup::validate) passed: not
    /// checked again, at the `now` it was checked at.
    pub fn ingest_validated(
        &mut self,
        validated: Validated,
        report: &Report<'_>,
        at: &mut u32,
    ) -> Option<Verdict> {
        let now = validated.now();
        debug_assert_eq!(report.validate(now), Ok(()));
        let (mut start, mut end) = (report.start, report.end);
        if end > now {
            let ahead = end.since(now);
            start = start - ahead;
            end = now;
        }
        let op = self.op_id(report.op)?;
        // Past `max_pairs`, a new pair is not tracked: it fails open, as
        // under a lost master, and every pair already tracked (every flood
        // being held among them) keeps its state.
        let i = self.find_or_insert_near(op, report.account, now, at)?;
        let mut window = self.entries.take_window(i);
        let dropped = window.record(
            &self.config.window,
            start,
            end,
            report.attempted,
            report.admitted,
        );
        window.note_op_cost(report.op_cost, report.attempted);
        window.note_ops(
            &self.config.window,
            end,
            report.op_cost,
            report.ops,
            report.attempted,
        );
        self.dropped.attempted = self.dropped.attempted.saturating_add(dropped.attempted);
        self.dropped.admitted = self.dropped.admitted.saturating_add(dropped.admitted);
        let key = self.entries.get_mut(i);
        key.set_last_report(key.last_report().later(now));
        let was_suppressed = key.is(table::SUPPRESSED);
        let verdict = self.conclude(i, &window, report.account, report.op, now);
        let pushed = was_suppressed && window.surge_pushed_suppression();
        self.entries.put_window(i, window);
        let was = Suppression {
            held: was_suppressed,
            pushed,
        };
        self.queue_release_push(report.account, report.op, was, verdict.as_ref());
        verdict
    }

    /// Takes one early report from `agent` received at `now`: its rate for
    /// an (account, op) over the sub-window that ended at `at`, against the
    /// rate it last reported (see [`DemandWindow::surge`]). Returns the
    /// verdict, marked for a recheck after the policy's `surge_recheck`
    /// (other agents' early reports of the same sub-window are still on
    /// their way), or `None` when no limit applies.
    ///
    /// A sparse hint ([`SurgeRates::hint`]) moves no estimate: it is
    /// tallied ([`DemandWindow::hint`]), and when the pair's hints come
    /// together beyond chance, the pair is polled (a [`Push::poll`], when
    /// pushes are tracked). Its verdict is the one in force.
    pub fn surge(
        &mut self,
        now: Nanos,
        at: Nanos,
        agent: &str,
        pair: Pair<'_>,
        rates: SurgeRates,
    ) -> Result<Option<Verdict>, ReportError> {
        validate_name("account", pair.account)?;
        validate_name("op", pair.op)?;
        let Some(op) = self.op_id(pair.op) else {
            return Ok(None);
        };
        let Some(i) = self.find_or_insert(op, pair.account, now) else {
            return Ok(None);
        };
        if rates.hint {
            return Ok(self.hint(now, i, agent, pair, rates));
        }
        let mut window = self.entries.take_window(i);
        // An agent whose clock runs ahead: its sub-window ended by now.
        window.surge(&self.config.window, now, at.min(now), agent, rates);
        let key = self.entries.get_mut(i);
        key.set_last_report(key.last_report().later(now));
        let was_suppressed = key.is(table::SUPPRESSED);
        let recheck_at = now + self.config.policy.surge_recheck;
        let verdict = self.conclude(i, &window, pair.account, pair.op, now);
        self.queue_surge_push(&mut window, pair, was_suppressed, verdict.as_ref(), now);
        self.entries.put_window(i, window);
        Ok(verdict.map(|v| Verdict {
            recheck_at: Some(recheck_at),
            ..v
        }))
    }

    /// The verdict of entry `i`, whose window is `window` (taken out of
    /// the table by the caller), after a report, with its limit looked up
    /// again if the config changed, and its transition noted.
    fn conclude(
        &mut self,
        i: u32,
        window: &DemandWindow,
        account: &str,
        op: &str,
        now: Nanos,
    ) -> Option<Verdict> {
        let key = self.entries.get_mut(i);
        if key.is(table::STALE) {
            key.set_limit(self.config.limits.lookup(account, op).map(|m| m.id));
            let exempt = self.config.exempt.covers(account, op).is_some();
            key.set(table::EXEMPT, exempt);
            key.set(table::STALE, false);
        }
        let verdict = if key.is(table::EXEMPT) {
            Some(exempt_verdict(&self.config, Some(window), now))
        } else {
            let held = key.is(table::SUPPRESSED);
            key.limit()
                .and_then(|id| self.config.limits.get(id))
                .map(|limit| verdict(&self.config, window, held, limit, now))
        };
        let suppressed = verdict.is_some_and(|v| v.factor > 0.0);
        let shadow = verdict.is_some_and(|v| v.shadow);
        let share = self.config.policy.near_limit_share;
        let near = verdict.is_some_and(|v| {
            let bar = if key.is(table::NEAR) {
                share - NEAR_LIMIT_MARGIN
            } else {
                share
            };
            v.rates.demand >= bar * v.limit.get()
        });
        // Near comes before started, ended after stopped; a limit moved in
        // or out of shadow while suppressing stops one kind and starts the
        // other.
        let (was_suppressed, was_shadow) = (key.is(table::SUPPRESSED), key.is(table::SHADOW));
        let mut changed = Vec::new();
        if near && !key.is(table::NEAR) {
            changed.push(TransitionKind::NearLimit);
        }
        if was_suppressed && (!suppressed || shadow != was_shadow) {
            changed.push(TransitionKind::stopped(was_shadow));
        }
        if suppressed && (!was_suppressed || shadow != was_shadow) {
            changed.push(TransitionKind::started(shadow));
        }
        if !near && key.is(table::NEAR) {
            changed.push(TransitionKind::NearLimitEnded);
        }
        key.set(table::SHADOW, shadow);
        key.set(table::NEAR, near);
        key.set(table::SUPPRESSED, suppressed);
        if let Some(transitions) = &mut self.transitions {
            for kind in changed {
                transitions.push(Transition {
                    op: op.to_owned(),
                    account: account.to_owned(),
                    kind,
                    factor: verdict.map_or(0.0, |v| v.factor),
                    demand: verdict.map_or(0.0, |v| v.rates.demand),
                    limit: verdict.map_or(0.0, |v| v.limit.get()),
                });
            }
        }
        verdict
    }

    /// Every tracked (account, op) that `keep(op, account)` selects, as it
    /// stands at `now`: limit, rates and factor. For introspection; the
    /// order is unspecified.
    pub fn views(&self, now: Nanos, mut keep: impl FnMut(Pair<'_>) -> bool) -> Vec<KeyView> {
        let mut views = Vec::new();
        for (i, key) in self.entries.iter() {
            let (op, account) = (
                &*self.ops[key.op() as usize].name,
                self.entries.account(key),
            );
            let account = &*account;
            if !keep(Pair::new(account, op)) {
                continue;
            }
            let exempt = self.config.exempt.covers(account, op);
            let limit = self
                .config
                .limits
                .lookup(account, op)
                .filter(|_| exempt.is_none());
            let (factor, rates) = match limit {
                Some(m) => {
                    let v = self.verdict_of(i, key, m, now);
                    (v.factor, v.rates)
                }
                None => {
                    let window = self.entries.window_of(i, key);
                    (0.0, window.estimate(&self.config.window, now).rates)
                }
            };
            views.push(KeyView {
                account: account.to_string(),
                op: op.to_string(),
                limit: limit.map(|m| m.rate.get()),
                limit_key: limit.map(|m| m.key.to_owned()),
                shadow: limit.is_some_and(|m| m.shadow),
                exempt: exempt.map(str::to_owned),
                demand: rates.demand,
                admitted: rates.admitted,
                factor,
                last_report_unix_ms: key.last_report().when(now).as_millis(),
            });
        }
        views
    }

    /// The verdict for the pair of `key`, entry `i`, limited by
    /// `matched`, without a new report.
    fn verdict_of(
        &self,
        i: u32,
        key: &table::Entry,
        matched: LimitMatch<'_>,
        now: Nanos,
    ) -> Verdict {
        let window = self.entries.window_of(i, key);
        verdict(
            &self.config,
            &window,
            key.is(table::SUPPRESSED),
            matched,
            now,
        )
    }

    /// The verdict for an (account, op) at `now` without a new report:
    /// `None` when no limit applies. An (account, op) the master has no
    /// reports for reads as zero demand.
    pub fn verdict(&self, now: Nanos, account: &str, op: &str) -> Option<Verdict> {
        if self.config.exempt.covers(account, op).is_some() {
            let window = self.find(op, account).map(|i| self.entries.window(i));
            return Some(exempt_verdict(&self.config, window.as_ref(), now));
        }
        let limit = self.config.limits.lookup(account, op)?;
        Some(match self.find(op, account) {
            Some(i) => self.verdict_of(i, self.entries.get(i), limit, now),
            None => {
                let rates = Rates::default();
                Verdict {
                    factor: self.config.policy.kind.factor(limit.rate, rates),
                    limit: limit.rate,
                    valid_for: self.config.policy.factor_validity,
                    rates,
                    shadow: limit.shadow,
                    recheck_at: None,
                }
            }
        })
    }

    /// Forgets every (account, op) with no report for `idle_for` (at most
    /// [`MAX_REPORT_AGE`]: a longer one is taken as that), so state stays
    /// proportional to the active accounts. Returns how many went.
    pub fn evict_idle(&mut self, now: Nanos, idle_for: Duration) -> usize {
        let mut cursor = 0;
        self.evict_idle_from(now, idle_for, &mut cursor, usize::MAX)
            .0
    }

    /// One step of an eviction pass that a caller holding a lock can
    /// spread over many short holds: looks at up to `budget` pairs from
    /// `*cursor` (0 to start a pass), forgets those idle for `idle_for`,
    /// and moves the cursor on. Returns how many went and whether the pass
    /// is over. Between steps the state may take reports as usual: new
    /// pairs go at the end, where the pass reaches them last (and keeps
    /// them, fresh), and nothing else moves pairs but eviction.
    pub fn evict_idle_from(
        &mut self,
        now: Nanos,
        idle_for: Duration,
        cursor: &mut u32,
        budget: usize,
    ) -> (usize, bool) {
        let idle_for = idle_for.min(MAX_REPORT_AGE);
        let before = self.entries.len;
        let mut i = *cursor;
        let mut looked = 0usize;
        while (i as usize) < self.entries.len && looked < budget {
            looked += 1;
            let key = self.entries.get(i);
            if key.last_report().age(now) < idle_for {
                i += 1;
                continue;
            }
            // The last entry moves into `i`: look at `i` again.
            if let Some(transitions) = &mut self.transitions {
                let ended = [
                    (
                        key.is(table::SUPPRESSED),
                        TransitionKind::stopped(key.is(table::SHADOW)),
                    ),
                    (key.is(table::NEAR), TransitionKind::NearLimitEnded),
                ];
                for (_, kind) in ended.into_iter().filter(|(was, _)| *was) {
                    transitions.push(Transition {
                        op: self.ops[key.op() as usize].name.to_string(),
                        account: self.entries.account(key).to_string(),
                        kind,
                        factor: 0.0,
                        demand: 0.0,
                        limit: 0.0,
                    });
                }
            }
            self.remove(i);
        }
        *cursor = i;
        let done = (i as usize) >= self.entries.len;
        // Give memory back once most pairs have gone, not after every pass
        // (each shrink rehashes every pair).
        if done && self.index.capacity() > 4 * self.entries.len.max(1024) {
            let (entries, hasher) = (&self.entries, &self.hasher);
            self.index
                .shrink_to_fit(|&i| entries.hash_of(hasher, entries.get(table::entry_at(i))));
            self.entries.chunks.shrink_to_fit();
        }
        if done && self.entries.names.wasteful() {
            self.entries.compact_names();
        }
        (before - self.entries.len, done)
    }

    /// Copies out every (account, op)'s window as it stands at `now`, for a
    /// snapshot that a restarted master loads with [`import`](Self::import).
    pub fn export(&self, now: Nanos) -> Vec<KeySnapshot> {
        self.entries
            .iter()
            .map(|(i, key)| KeySnapshot {
                op: self.ops[key.op() as usize].name.to_string(),
                account: self.entries.account(key).to_string(),
                last_report: key.last_report().when(now),
                window: self.entries.window_of(i, key),
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
            let Some(op) = self.op_id(&k.op) else {
                continue;
            };
            let before = self.entries.len;
            let Some(i) = self.find_or_insert(op, &k.account, k.last_report) else {
                continue;
            };
            if self.entries.len > before {
                self.entries.put_window(i, k.window);
                taken += 1;
            }
        }
        taken
    }

    /// Number of (account, op) pairs tracked.
    pub fn len(&self) -> usize {
        self.entries.len
    }

    /// Whether no (account, op) is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.len == 0
    }

    /// For each op tracked, how many of its pairs are suppressed (their
    /// last report got a positive factor), 0 included. Counts flags,
    /// computes nothing.
    pub fn suppressed_by_op(&self) -> impl Iterator<Item = (&str, usize)> {
        self.count_by_op(|k| k.is(table::SUPPRESSED) && !k.is(table::SHADOW))
    }

    /// Per op with tracked pairs: how many would be suppressed under a
    /// limit in shadow (their agents admit everything, and mark it).
    pub fn shadow_suppressed_by_op(&self) -> impl Iterator<Item = (&str, usize)> {
        self.count_by_op(|k| k.is(table::SUPPRESSED) && k.is(table::SHADOW))
    }

    fn count_by_op(
        &self,
        counted: impl Fn(&table::Entry) -> bool,
    ) -> impl Iterator<Item = (&str, usize)> {
        let mut counts = vec![0usize; self.ops.len()];
        for (_, key) in self.entries.iter().filter(|(_, k)| counted(k)) {
            counts[key.op() as usize] += 1;
        }
        self.ops
            .iter()
            .zip(counts)
            .filter(|(op, _)| op.keys > 0)
            .map(|(op, n)| (&*op.name, n))
    }

    /// Cost that arrived too late to fit in its window, since start.
    pub fn dropped(&self) -> Dropped {
        self.dropped
    }
}

/// How far above the limit a surge estimate must be before it suppresses:
/// early reports measure short sub-windows, so an account at 0.9× its limit
/// can read a few tenths above it. Between the limit and this multiple, a
/// surge estimate reads as the limit (no suppression) until whole rounds
/// confirm it; a deluge is far above.
pub const SURGE_MARGIN: f64 = 1.15;

/// How far above the limit a surge estimate must be to suppress while the
/// rounds say no demand at all (an account new to this master, or back
/// from quiet; [`Estimate::surge_from_nothing`](crate::window::Estimate)).
/// The estimate is then the sum of the agents' early reports alone, each
/// a 100-ms sub-window read as a rate, and each told because its
/// sub-window rose: an account of sparse costly publishes spread over many
/// agents reads one publish of 51 as 510/s on an agent whose rate is 144.
/// Its test of chance counts the operations of every agent's first
/// report, chosen by the rise itself. `mixed-costs` at 0.95× of its
/// limit read 1.89× and 2.07× at seeds 173 and 420 of 600, and was
/// refused in four seeds; past this margin, in one (seed 420). A deluge
/// is far above it, and an account at 2× its limit was still held at the
/// same moments (`mixed-costs`, seeds 1–24: its first early
/// suppressions read 2.4–2.8×). Between the limit and this multiple, a
/// new account waits for its first round, as it did before early
/// reports.
pub const FIRST_SURGE_MARGIN: f64 = 2.0;

/// How many standard deviations of its Poisson noise a surge estimate
/// summed from counted operations (a poll's answers: a few dozen costly
/// operations over many agents; a rise's early reports) must stand above
/// the limit to suppress.
pub const POLL_SIGMAS: f64 = 3.0;

/// The same, as the chance of a Poisson count at least that high, for
/// counts too small for the normal law (a new pair's first report of nine
/// operations, say).
const POLL_ALPHA: f64 = 1.35e-3;

/// Whether a surge estimate of `demand` whose first reports counted `ops`
/// operations (0: not counted) stands above `limit`: past [`SURGE_MARGIN`],
/// and, counted, past chance: were the rate the limit, its reports would
/// have counted `ops × limit / demand`, and a count of `ops` must be
/// [`POLL_SIGMAS`] standard deviations above that (its Poisson tail below
/// 50 operations). So a poll that chance set off on an account near its
/// limit, whose answers sum a few dozen operations, does not suppress it
/// (80 operations: 1.40×), nor does a new pair of costly operations whose
/// first sub-window held nine where four were due (2.3×: its first
/// report's own count, weighed by itself, allowed 2.0×).
pub fn surge_proven(demand: f64, limit: f64, ops: u32) -> bool {
    surge_proven_by(demand, limit, ops, 2)
}

/// [`surge_proven`] for `ops` counted by `reports` reports. A single
/// report's count must stand [`SINGLE_REPORT_SIGMAS`] above chance: it is
/// one sub-window of the many every agent measures, each tested by the
/// agent against its own noise, and the few that pass by chance would
/// each suppress its account. An account of Poisson publishes of 51 on
/// one node at 0.95× of its limit, in lumps of a 100-ms step's arrivals,
/// saw 11 in one sub-window where 1.86 are due (a chance of 10⁻⁵ a
/// sub-window, 10 a day), and was refused for a second in 12 of 1 000
/// simulated seeds. A deluge's single report stands far above it; a flood
/// spread over many agents is reported by several. The verdict asks it
/// only where one report is all there is to go on (see `verdict`).
pub fn surge_proven_by(demand: f64, limit: f64, ops: u32, reports: u16) -> bool {
    if demand <= limit * SURGE_MARGIN {
        return false;
    }
    if ops == 0 {
        return true;
    }
    let (sigmas, alpha) = if reports == 1 {
        (
            SINGLE_REPORT_SIGMAS,
            crate::agent::normal_tail(SINGLE_REPORT_SIGMAS),
        )
    } else {
        (POLL_SIGMAS, POLL_ALPHA)
    };
    let ops = f64::from(ops);
    crate::agent::beyond_chance(ops, ops * limit / demand, sigmas, alpha)
}

/// See [`surge_proven_by`]: the standard as the rounds' (`CONFIDENCE_SIGMAS`).
pub const SINGLE_REPORT_SIGMAS: f64 = crate::window::CONFIDENCE_SIGMAS;

/// How far over its limit a round's demand must be to suppress before the
/// window has seen enough whole rounds to know their scatter (eight
/// changes between them): a deluge is far above, and a round of a small
/// account (18 operations a second against 20) reads 1.15× its limit by
/// chance one time in twenty. Not enough alone for a new account of
/// costly operations, whose rounds pass it by chance: the round must also
/// be a count of operations chance does not give (see
/// [`DemandWindow::confidently_over`]).
pub const UNKNOWN_NOISE_MARGIN: f64 = 1.5;

/// How many standard deviations of its rounds' noise a suppressed pair's
/// demand must stay above its limit to stay suppressed (at most
/// `policy.confidence_sigmas`, which begins one). Held by any excess, an
/// account at 0.95× of its limit of rare publishes to 1 000 (a round's
/// scatter about 0.3× of the limit), suppressed by its agents' chance
/// lumps, stayed suppressed for eight seconds of rounds that chance read
/// 1.2–1.6× over.
pub const HOLD_SIGMAS: f64 = 1.0;

/// The verdict for an exempt pair: never suppressed, and no limit, so the
/// agents' local guard never refuses it either ([`Rate::UNLIMITED`]); its
/// demand is still estimated.
fn exempt_verdict(config: &MasterConfig, window: Option<&DemandWindow>, now: Nanos) -> Verdict {
    Verdict {
        factor: 0.0,
        limit: Rate::UNLIMITED,
        valid_for: config.policy.factor_validity,
        rates: window.map_or_else(Rates::default, |w| w.estimate(&config.window, now).rates),
        shadow: false,
        recheck_at: None,
    }
}

/// The verdict for a pair limited by `matched`, from its `window` and
/// whether its last verdict suppressed it (`held`).
fn verdict(
    config: &MasterConfig,
    window: &DemandWindow,
    held: bool,
    matched: LimitMatch<'_>,
    now: Nanos,
) -> Verdict {
    let limit = matched.rate;
    let mut estimate = window.estimate(&config.window, now);
    // A surge estimate reads as the limit (no suppression) while it may
    // be chance: a rise within its margin (within `FIRST_SURGE_MARGIN`
    // while the rounds say nothing), or a fall whose answers, within
    // their chance spread, may have brought the demand under the limit (a
    // few costly operations in a few hundred milliseconds read the rate
    // left after a flood at twice what it is one time in twenty, and held
    // the flood's suppression until the answers' next reports). A rise
    // over rounds that are themselves over the limit reads as those
    // rounds, which say what they say whatever the rise adds: read as
    // the limit, a held flood of publishes to 1 000 subscribers was
    // released whenever one agent's sub-window of a single publish (a
    // count of one, unproven) began a fresh estimate.
    // A rise is weighed by its counted reports' rates read over the time
    // they span together (lumps that agents saw one after another were
    // not there at once); a fall by its answers' noise.
    let demand = estimate.rates.demand;
    let proof = if estimate.surge_demand_over_span > 0.0 {
        estimate.surge_demand_over_span
    } else {
        demand
    };
    if estimate.surge
        && (!surge_proven_by(
            proof,
            limit.get(),
            estimate.surge_ops,
            reports_weighed(config, window, &estimate, held, limit.get()),
        ) || (estimate.surge_from_nothing() && demand <= limit.get() * FIRST_SURGE_MARGIN)
            || demand - POLL_SIGMAS * estimate.surge_fall_noise <= limit.get())
    {
        let unproven = if demand > estimate.surge_rounds {
            limit.get().max(estimate.surge_rounds)
        } else {
            limit.get()
        };
        estimate.rates.demand = demand.min(unproven);
    }
    let mut factor = config.policy.kind.factor(limit, estimate.rates);
    // A round's demand over the limit by no more than its own scatter is
    // chance, not overload: an account that keeps to its limit is never
    // refused for it. (Early reports of rises are tested for noise by the
    // agents and above; a fall says less than its rounds, so the rounds'
    // test stands for it: a chance lump reported and taken back left a
    // fall a hair under a round that chance read 1.3× high, and it
    // suppressed an account at 0.95× of its limit untested.)
    // A suppression in force (`held`, proven by a round or by early
    // reports) is asked less: it holds while the demand stays over the
    // limit by [`HOLD_SIGMAS`] of the rounds' scatter, so an overload
    // within a few of its rounds' scatter is not released and suppressed
    // by turns (a sparse costly flood at 1.6× of its limit, caught by
    // early reports, went 0.4 → 0 → 0.4 for half a minute, its rounds
    // alternately confident and not), while one that chance began is let
    // go once the rounds show no more than chance.
    let (margin, sigmas) = if held {
        (1.0, HOLD_SIGMAS.min(config.policy.confidence_sigmas))
    } else {
        (UNKNOWN_NOISE_MARGIN, config.policy.confidence_sigmas)
    };
    if factor > 0.0
        && (!estimate.surge || estimate.rates.demand <= estimate.surge_rounds)
        && matches!(config.policy.kind, PolicyKind::Demand)
        && config.window.estimator == EstimatorKind::LatestRound
        && !window.confidently_over(
            &config.window,
            limit.get(),
            estimate.rates.demand,
            margin,
            sigmas,
        )
    {
        factor = 0.0;
    }
    Verdict {
        factor,
        limit,
        valid_for: config.policy.factor_validity,
        rates: estimate.rates,
        shadow: matched.shadow,
        recheck_at: recheck_at(config, &estimate, factor, now),
    }
}

/// How many reports [`surge_proven_by`] weighs the count of a surge
/// `estimate` as: as it counted them, but as several when a single one is
/// not all there is to go on. A pair already suppressed (`held`) is not
/// released by one agent's next estimate counting few: a single node's
/// deluge, suppressed at once, was released and suppressed again within a
/// second when a fresh estimate's first report was a peek of a few
/// operations. And one agent's report of a flood the rounds prove over
/// the limit (a costly flood's hold, its estimate moved by a chance fall
/// and then by one agent's rise) is not one sub-window against them:
/// taken as one, `costly-flood` lost its hold for four seconds in 7 seeds
/// of 100. Rounds over the limit by chance prove nothing: an account at
/// 0.95× whose rounds read 1.12× let one agent's lump through.
fn reports_weighed(
    config: &MasterConfig,
    window: &DemandWindow,
    estimate: &Estimate,
    held: bool,
    limit: f64,
) -> u16 {
    if estimate.surge_reports == 1
        && (held
            || window.confidently_over(
                &config.window,
                limit,
                estimate.surge_rounds,
                UNKNOWN_NOISE_MARGIN,
                config.policy.confidence_sigmas,
            ))
    {
        u16::MAX
    } else {
        estimate.surge_reports
    }
}

/// When an agent given `factor` from `estimate` at `now` should ask
/// again: when the round the estimate comes from should be whole, if it
/// suppresses or is a first round; and while early reports are bringing
/// a fall that still suppresses (the last within
/// [`FALLING_FOR`](crate::window::FALLING_FOR)), after
/// `policy.surge_recheck` at the latest. The release comes with the next
/// answers and is pushed, but an agent that misses the push (a stream
/// redialled; a push lost in the simulator) stayed suppressed until its
/// round: `creeping-loss` released 2.15–2.45 s after the drop in 9 runs
/// of 60, one agent of twenty still refusing. Once the reports stop, the
/// estimate stands until its round, and so do the agents: a flood that
/// stepped down to 1.5× its limit and stayed there, its 20 agents asking
/// every 100 ms until the round, sent 50–90% more requests over its run
/// (and `step-overload`, from 30× to 3×, 22% more).
fn recheck_at(
    config: &MasterConfig,
    estimate: &Estimate,
    factor: f64,
    now: Nanos,
) -> Option<Nanos> {
    let whole_by = estimate
        .whole_by
        .filter(|_| factor > 0.0 || estimate.first_round);
    if estimate.surge_falling && factor > 0.0 {
        let soon = now + config.policy.surge_recheck;
        Some(whole_by.map_or(soon, |at| at.min(soon)))
    } else {
        whole_by
    }
}

#[cfg(test)]
mod tests;
