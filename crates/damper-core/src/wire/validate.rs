//! What a well-formed message carries: names of 1 to
//! [`MAX_NAME_LEN`] bytes, admitted never above
//! attempted, intervals that end after they start, not far in the future
//! and not absurdly long, and no more entries than a master takes in one
//! call. Masters refuse what breaks a rule, naming the field; agents never
//! send it.

use std::time::Duration;

use crate::MAX_NAME_LEN;
use crate::time::Nanos;

use super::{FactorsQuery, Rollup};

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
    /// What one operation costs, as the agent's scans tell it (the
    /// costliest seen, when costs differ); 0 when not known, as from
    /// agents that predate it. The master reads a round as a count of
    /// operations of this cost, whose chance scatter it knows before the
    /// rounds have shown any (see `DemandWindow::note_op_cost`).
    pub op_cost: u32,
    /// How many operations `attempted` counts; 0 when not known, as from
    /// agents that predate it. With `op_cost`, the costliest, it bounds
    /// the sum of the costs' squares, which a round of mixed costs
    /// scatters by (see `agent::Delta::ops`).
    pub ops: u32,
}

/// Why a report was refused. Nothing of a refused report is counted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
    /// More operations than cost attempted: each counted operation costs
    /// at least 1.
    #[error(
        "`ops` ({ops}) is more than `attempted` ({attempted}); every operation costs at least 1"
    )]
    OpsExceedAttempted {
        /// The operations reported.
        ops: u32,
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
    /// More cost than any real node attempts: over the interval, or over
    /// one second when the interval is shorter, a rate above the master's
    /// ceiling for one agent and one pair.
    #[error(
        "`attempted` ({attempted}) over {span_ms} ms is more than {max_rate} cost/s, \
         the most one agent may report for one (account, op) (max_claimed_rate)"
    )]
    Implausible {
        /// The attempted cost reported.
        attempted: u64,
        /// The interval it covers, in milliseconds.
        span_ms: u64,
        /// The ceiling, cost per second (whole: the config takes an integer).
        max_rate: u64,
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
        self.validate_counts()?;
        Interval::judge(self.start, self.end, now)?;
        Ok(())
    }

    /// The checks of [`validate`](Self::validate) that are the entry's
    /// own: its names, and admitted and operations never above attempted.
    fn validate_counts(&self) -> Result<(), ReportError> {
        validate_name("account", self.account)?;
        validate_name("op", self.op)?;
        if self.admitted > self.attempted {
            return Err(ReportError::AdmittedExceedsAttempted {
                admitted: self.admitted,
                attempted: self.attempted,
            });
        }
        if u64::from(self.ops) > self.attempted {
            return Err(ReportError::OpsExceedAttempted {
                ops: self.ops,
                attempted: self.attempted,
            });
        }
        Ok(())
    }

    /// Checks that the report claims no more than `max_rate` cost per
    /// second (over its interval, or over one second if that is shorter,
    /// so a short first interval is not held to a rate it cannot show).
    pub fn check_rate(&self, max_rate: u64) -> Result<(), ReportError> {
        Interval::new(self.start, self.end).check_rate(self.attempted, max_rate)
    }
}

/// The interval a report covers, `[start, end)`: what its checks of time
/// and of rate depend on. Every entry of a rollup without an interval of
/// its own covers the rollup's, so the rollup's is judged once.
#[derive(Clone, Copy, Debug)]
struct Interval {
    span: Duration,
    /// Most cost a report over it may claim per unit of `max_rate`: the
    /// span in seconds, at least one.
    secs: f64,
}

impl Interval {
    fn new(start: Nanos, end: Nanos) -> Interval {
        let span = end.since(start);
        Interval {
            span,
            secs: span.as_secs_f64().max(1.0),
        }
    }

    /// The interval, if it ends after it starts, not far in the future
    /// of `now` and is not absurdly long.
    fn judge(start: Nanos, end: Nanos, now: Nanos) -> Result<Interval, ReportError> {
        if end < start {
            return Err(ReportError::EndsBeforeStart { start, end });
        }
        if end > now && end.since(now) > MAX_CLOCK_AHEAD {
            return Err(ReportError::EndsInFuture {
                ahead_ms: ms(end.since(now)),
            });
        }
        let interval = Interval::new(start, end);
        if interval.span > MAX_REPORT_SPAN {
            return Err(ReportError::SpanTooLong {
                span_ms: ms(interval.span),
            });
        }
        Ok(interval)
    }

    /// [`Report::check_rate`] of `attempted` over this interval.
    fn check_rate(&self, attempted: u64, max_rate: u64) -> Result<(), ReportError> {
        if attempted as f64 > max_rate as f64 * self.secs {
            return Err(ReportError::Implausible {
                attempted,
                span_ms: ms(self.span),
                max_rate,
            });
        }
        Ok(())
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Why a whole rollup or factors query was refused. Nothing of it is
/// counted, so the agent may fix it and send it again.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RollupError {
    /// More entries than the master accepts in one call: the agent splits
    /// its rollups below this.
    #[error(
        "the request carries {entries} entries; this master accepts at most {max} per call: split it"
    )]
    TooManyEntries {
        /// Entries in the request.
        entries: usize,
        /// The master's `max_entries`.
        max: usize,
    },
    /// The request's own interval ends before it starts.
    #[error("interval_end_unix_ms ({end_ms}) is before interval_start_unix_ms ({start_ms})")]
    EndsBeforeStart {
        /// Start, in milliseconds since the epoch.
        start_ms: u64,
        /// End, in milliseconds since the epoch.
        end_ms: u64,
    },
    /// An op of an early report carries not one surge per account (or an
    /// op of another query carries any).
    #[error("ops[{op}] carries {surges} surge rates for {expected} accounts")]
    Surges {
        /// Index of the op.
        op: usize,
        /// Surge rates it carries.
        surges: usize,
        /// How many it should.
        expected: usize,
    },
    /// A surge rate is negative or not a number.
    #[error(
        "ops[{op}].{field}s[{account}] is {rate}; a rate is a finite number of at least 0 \
         and at most the master's max_claimed_rate"
    )]
    SurgeRate {
        /// Index of the op.
        op: usize,
        /// Index of the account within it.
        account: usize,
        /// `rate`, `baseline` or `rollup_baseline`.
        field: &'static str,
        /// The value.
        rate: f32,
    },
    /// An early report from an agent over its budget.
    #[error(transparent)]
    SurgeBudget(#[from] crate::master::SurgeRefused),
    /// The rollup's account numbers cannot be read: this master does not
    /// hold them, or they are malformed.
    #[error(transparent)]
    Dictionary(#[from] super::dictionary::DictionaryError),
    /// One entry is malformed.
    #[error("ops[{op}].accounts[{account}]: {error}")]
    Entry {
        /// Index of its op in the request.
        op: usize,
        /// Index of the entry within its op.
        account: usize,
        /// What is wrong with it.
        error: ReportError,
    },
}

impl RollupError {
    /// Whether the request was too big (or, an early report, too soon)
    /// rather than malformed
    /// (RESOURCE_EXHAUSTED rather than INVALID_ARGUMENT on the wire).
    pub fn is_too_big(&self) -> bool {
        matches!(
            self,
            RollupError::TooManyEntries { .. } | RollupError::SurgeBudget(_)
        )
    }

    /// Whether the request gave accounts by numbers this master does not
    /// hold (FAILED_PRECONDITION on the wire): the agent resends it naming
    /// them, rather than fixing anything.
    pub fn is_unknown_numbers(&self) -> bool {
        matches!(self, RollupError::Dictionary(e) if e.is_unknown())
    }

    /// Whether an entry claims more than the master's `max_claimed_rate`
    /// ([`Report::check_rate`]): refused like any malformed entry, and
    /// counted apart, as the sign of a hostile or broken agent.
    pub fn is_implausible(&self) -> bool {
        matches!(
            self,
            RollupError::Entry {
                error: ReportError::Implausible { .. },
                ..
            }
        )
    }
}

/// What [`Rollup::validate`] hands back once every report of a rollup
/// passed [`Report::validate`] at `now`: so ingesting them
/// ([`MasterState::ingest_validated`]) checks none of them a second time,
/// and uses the same `now`. Made only by validation.
///
/// [`MasterState::ingest_validated`]: crate::master::MasterState::ingest_validated
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validated {
    now: Nanos,
}

impl Validated {
    /// `report` validated at `now`.
    pub(crate) fn report(report: &Report<'_>, now: Nanos) -> Result<Validated, ReportError> {
        report.validate(now)?;
        Ok(Validated { now })
    }

    /// When the reports were validated: the `now` they are ingested at.
    pub fn now(&self) -> Nanos {
        self.now
    }
}

impl Rollup {
    /// Checks the whole rollup, as received at `now` by the master's clock,
    /// before any of it is counted; what it returns lets its reports be
    /// ingested without checking each again.
    pub fn validate(&self, now: Nanos, max_entries: usize) -> Result<Validated, RollupError> {
        self.validate_claims(now, max_entries, None)
    }

    /// [`validate`](Self::validate), and in the same pass over the entries
    /// that none claims more than `max_rate` cost per second
    /// ([`Report::check_rate`]): one agent cannot set any account's factor
    /// by claiming a deluge no node could attempt. Such a claim is refused
    /// as [`is_implausible`](RollupError::is_implausible).
    pub fn validate_within(
        &self,
        now: Nanos,
        max_entries: usize,
        max_rate: u64,
    ) -> Result<Validated, RollupError> {
        self.validate_claims(now, max_entries, Some(max_rate))
    }

    fn validate_claims(
        &self,
        now: Nanos,
        max_entries: usize,
        max_rate: Option<u64>,
    ) -> Result<Validated, RollupError> {
        let entries = self.entries();
        if entries > max_entries {
            return Err(RollupError::TooManyEntries {
                entries,
                max: max_entries,
            });
        }
        if self.end < self.start {
            return Err(RollupError::EndsBeforeStart {
                start_ms: self.start.as_millis(),
                end_ms: self.end.as_millis(),
            });
        }
        // Numbers left: nothing here holds the sender's dictionary.
        if let Some(op) = self.ops.iter().position(|o| !o.by_id.is_empty()) {
            return Err(super::dictionary::DictionaryError::Unknown {
                op,
                id: self.ops[op].by_id[0].id,
                incarnation: self.incarnation,
                epoch: self.dictionary,
            }
            .into());
        }
        // Judged once for every entry without an interval of its own.
        let shared = Interval::judge(self.start, self.end, now);
        for (op, account, report) in self.reports() {
            report
                .validate_counts()
                .and_then(|()| {
                    if report.start == self.start {
                        shared.clone()
                    } else {
                        Interval::judge(report.start, report.end, now)
                    }
                })
                .and_then(|interval| match max_rate {
                    Some(max) => interval.check_rate(report.attempted, max),
                    None => Ok(()),
                })
                .map_err(|error| RollupError::Entry { op, account, error })?;
        }
        Ok(Validated { now })
    }
}

impl FactorsQuery {
    /// Checks that no early report's rate or baselines are above `max_rate`
    /// cost per second (see [`Rollup::validate_within`]).
    pub fn check_rates(&self, max_rate: u64) -> Result<(), RollupError> {
        self.surge_rates_within(max_rate as f64)
    }
}

impl FactorsQuery {
    /// Checks every name and the number of pairs asked for; in an early
    /// report, one surge per account, each with finite rates of at least 0.
    pub fn validate(&self, max_entries: usize) -> Result<(), RollupError> {
        let entries = self.entries();
        if entries > max_entries {
            return Err(RollupError::TooManyEntries {
                entries,
                max: max_entries,
            });
        }
        for (i, op) in self.ops.iter().enumerate() {
            for (j, account) in op.accounts.iter().enumerate() {
                validate_name("op", &op.op)
                    .and_then(|()| validate_name("account", account))
                    .map_err(|error| RollupError::Entry {
                        op: i,
                        account: j,
                        error,
                    })?;
            }
            let expected = if self.surge_at.is_some() {
                op.accounts.len()
            } else {
                0
            };
            if op.surges.len() != expected {
                return Err(RollupError::Surges {
                    op: i,
                    surges: op.surges.len(),
                    expected,
                });
            }
        }
        self.surge_rates_within(f64::INFINITY)
    }

    /// Checks that every early report's rate and baselines are finite
    /// numbers from 0 to `max` cost per second.
    fn surge_rates_within(&self, max: f64) -> Result<(), RollupError> {
        for (i, op) in self.ops.iter().enumerate() {
            for (j, s) in op.surges.iter().enumerate() {
                let rollup = s.rollup_baseline.unwrap_or(0.0);
                let rates = [
                    ("rate", s.rate),
                    ("baseline", s.baseline),
                    ("rollup_baseline", rollup),
                ];
                for (field, rate) in rates {
                    if !(rate.is_finite() && rate >= 0.0 && f64::from(rate) <= max) {
                        return Err(RollupError::SurgeRate {
                            op: i,
                            account: j,
                            field,
                            rate,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}
