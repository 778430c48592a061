//! What the rollup task has done: running totals kept by the task
//! ([`Stats`]) and read by the node ([`AgentStats`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Running totals behind [`Agent::stats`](crate::Agent::stats), kept by the rollup task.
pub(crate) struct Stats {
    pub(crate) rollups_sent: AtomicU64,
    pub(crate) rollups_failed: AtomicU64,
    pub(crate) factors_expired: AtomicU64,
    pub(crate) dropped_cost: AtomicU64,
    pub(crate) forgotten: AtomicU64,
    pub(crate) entries_sent: AtomicU64,
    pub(crate) bytes_sent: AtomicU64,
    pub(crate) bytes_received: AtomicU64,
    pub(crate) early_reports: AtomicU64,
    pub(crate) early_reports_failed: AtomicU64,
    pub(crate) young_pairs_reported: AtomicU64,
    pub(crate) hints_sent: AtomicU64,
    pub(crate) polls_answered: AtomicU64,
    pub(crate) pushes_applied: AtomicU64,
    /// Cost admitted that a limit in shadow would have refused: added by
    /// `check` itself, on the shadow path only.
    pub(crate) would_reject_cost: AtomicU64,
    /// How much of it went to the metrics counter so far.
    pub(crate) would_reject_recorded: AtomicU64,
    pub(crate) latency: [AtomicU64; LATENCY_BUCKETS],
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            rollups_sent: AtomicU64::new(0),
            rollups_failed: AtomicU64::new(0),
            factors_expired: AtomicU64::new(0),
            dropped_cost: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
            entries_sent: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            early_reports: AtomicU64::new(0),
            early_reports_failed: AtomicU64::new(0),
            young_pairs_reported: AtomicU64::new(0),
            hints_sent: AtomicU64::new(0),
            polls_answered: AtomicU64::new(0),
            pushes_applied: AtomicU64::new(0),
            would_reject_cost: AtomicU64::new(0),
            would_reject_recorded: AtomicU64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Stats {
    /// The totals now.
    pub(crate) fn snapshot(&self) -> AgentStats {
        let s = self;
        AgentStats {
            rollups_sent: s.rollups_sent.load(Relaxed),
            rollups_failed: s.rollups_failed.load(Relaxed),
            factors_expired: s.factors_expired.load(Relaxed),
            dropped_cost: s.dropped_cost.load(Relaxed),
            forgotten: s.forgotten.load(Relaxed),
            entries_sent: s.entries_sent.load(Relaxed),
            bytes_sent: s.bytes_sent.load(Relaxed),
            bytes_received: s.bytes_received.load(Relaxed),
            early_reports: s.early_reports.load(Relaxed),
            early_reports_failed: s.early_reports_failed.load(Relaxed),
            young_pairs_reported: s.young_pairs_reported.load(Relaxed),
            hints_sent: s.hints_sent.load(Relaxed),
            polls_answered: s.polls_answered.load(Relaxed),
            pushes_applied: s.pushes_applied.load(Relaxed),
            would_reject_cost: s.would_reject_cost.load(Relaxed),
            rollup_latency: LatencyHistogram {
                counts: std::array::from_fn(|i| s.latency[i].load(Relaxed)),
            },
        }
    }

    /// Counts one answered rollup: its entries, request and reply sizes,
    /// and round trip.
    pub(crate) fn answered(&self, entries: usize, sent: usize, received: usize, took: Duration) {
        self.rollups_sent.fetch_add(1, Relaxed);
        self.entries_sent.fetch_add(entries as u64, Relaxed);
        self.bytes_sent.fetch_add(sent as u64, Relaxed);
        self.bytes_received.fetch_add(received as u64, Relaxed);
        self.latency[latency_bucket(took)].fetch_add(1, Relaxed);
    }
}

/// Buckets of the rollup latency histogram: four per doubling, from 1 µs.
const LATENCY_BUCKETS: usize = 128;

fn latency_bucket(took: Duration) -> usize {
    let us = took.as_micros().max(1) as f64;
    ((us.log2() * 4.0) as usize).min(LATENCY_BUCKETS - 1)
}

/// Rollup round trips, in buckets four to a doubling (each bucket's upper
/// bound is at most 19% above its lower bound).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: [u64; LATENCY_BUCKETS],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: [0; LATENCY_BUCKETS],
        }
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.count())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .finish()
    }
}

impl LatencyHistogram {
    /// Round trips recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The round trip that a fraction `q` (0 to 1) of them took at most, as
    /// the upper bound of its bucket; `None` with nothing recorded.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(Duration::from_secs_f64(
                    2f64.powf((i + 1) as f64 / 4.0) / 1e6,
                ));
            }
        }
        None
    }
}

/// What the agent's rollup task has done since start: for the host's health
/// checks and tests. The same figures go to the `metrics` facade.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// Rollup requests a master answered.
    pub rollups_sent: u64,
    /// Rollup requests that failed (timeout, refused, error status); their
    /// counts were carried over.
    pub rollups_failed: u64,
    /// Fail-open events: positive factors that lapsed with no fresher one
    /// from their master, so their (account, op) went back to admitting.
    pub factors_expired: u64,
    /// Attempted cost dropped because it could not be delivered within
    /// `max_carry`.
    pub dropped_cost: u64,
    /// Idle (account, op) pairs forgotten to bound memory
    /// ([`AgentBuilder::forget_after`](crate::AgentBuilder::forget_after)).
    pub forgotten: u64,
    /// (account, op) entries in the rollups masters answered.
    pub entries_sent: u64,
    /// Encoded size of those rollup requests (protobuf, before HTTP/2 and
    /// TLS framing).
    pub bytes_sent: u64,
    /// Encoded size of the replies: the control traffic.
    pub bytes_received: u64,
    /// Early reports of surges a master answered (fast onset).
    pub early_reports: u64,
    /// Early reports that failed (refused by the master's budget, timed
    /// out, unreachable); the rollups carry the counts all the same.
    pub early_reports_failed: u64,
    /// (account, op) pairs of those early reports that were young: new to
    /// this agent and reported by their own peek between the sub-window
    /// grid's scans, because they arrived as floods.
    pub young_pairs_reported: u64,
    /// Sparse hints in those early reports: pairs of sparse costly
    /// operations that saw more of them than chance allows, too few for
    /// this agent alone to call a surge.
    pub hints_sent: u64,
    /// (account, op) pairs this agent held that a master polled (several
    /// agents' hints came together), each reported early in answer.
    pub polls_answered: u64,
    /// (account, op) verdicts a master pushed (an early report elsewhere
    /// turned the account's suppression on or off) that this agent held
    /// and applied.
    pub pushes_applied: u64,
    /// Cost admitted that a limit in shadow would have refused (the
    /// master's `[shadow]` table): what enforcing it would refuse.
    pub would_reject_cost: u64,
    /// Their round trips.
    pub rollup_latency: LatencyHistogram,
}

/// The totals over several agents (a process that runs many, like
/// `damper-load`).
impl std::iter::Sum for AgentStats {
    fn sum<I: Iterator<Item = AgentStats>>(stats: I) -> AgentStats {
        stats.fold(AgentStats::default(), |s, a| AgentStats {
            rollups_sent: s.rollups_sent + a.rollups_sent,
            rollups_failed: s.rollups_failed + a.rollups_failed,
            factors_expired: s.factors_expired + a.factors_expired,
            dropped_cost: s.dropped_cost + a.dropped_cost,
            forgotten: s.forgotten + a.forgotten,
            entries_sent: s.entries_sent + a.entries_sent,
            bytes_sent: s.bytes_sent + a.bytes_sent,
            bytes_received: s.bytes_received + a.bytes_received,
            early_reports: s.early_reports + a.early_reports,
            early_reports_failed: s.early_reports_failed + a.early_reports_failed,
            young_pairs_reported: s.young_pairs_reported + a.young_pairs_reported,
            hints_sent: s.hints_sent + a.hints_sent,
            polls_answered: s.polls_answered + a.polls_answered,
            pushes_applied: s.pushes_applied + a.pushes_applied,
            would_reject_cost: s.would_reject_cost + a.would_reject_cost,
            rollup_latency: LatencyHistogram {
                counts: std::array::from_fn(|i| {
                    s.rollup_latency.counts[i] + a.rollup_latency.counts[i]
                }),
            },
        })
    }
}
