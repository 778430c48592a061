//! The master's budget for early reports: at most one per agent per
//! `policy.surge_min_gap` on average. Each early report makes the master
//! re-estimate its accounts, so an agent sending them without pause
//! (broken, or hostile) is refused rather than served; other agents are
//! not affected.
//!
//! The budget is a cell rate (GCRA, as `governor` keeps it): a report may
//! come up to one gap early, as long as the agent's reports average at most
//! one per gap. Agents scan on a grid of exactly the default gap (100 ms),
//! and network jitter brings two reports of consecutive scans 96–99 ms
//! apart: judged one by one, a fifth of a busy agent's early reports were
//! refused (`many-accounts`: 219), each a false alarm to the operator and
//! a surge the master did not hear. A hostile agent still gets no more
//! than one report a gap, after a burst of two.
//!
//! It also knows which sub-window each agent's last early report measured,
//! so an agent that gave up waiting for an answer and sends the same report
//! again is answered without it counting twice.

use std::collections::HashMap;
use std::time::Duration;

use crate::time::Nanos;

/// Agents tracked before the ones whose gap has passed are let go.
const TRACKED: usize = 1 << 16;

/// Each agent's place in the budget, and the end of the sub-window its
/// last early report measured.
#[derive(Debug, Default)]
pub struct SurgeBudget {
    last: HashMap<Box<str>, Cell>,
}

/// One agent's budget.
#[derive(Clone, Copy, Debug)]
struct Cell {
    /// When its last report was taken (for the refusal's message).
    taken: Nanos,
    /// When its next report would be on time (GCRA's theoretical arrival
    /// time): a report is taken up to one gap before it.
    due: Nanos,
    /// The end of the sub-window its last report measured.
    at: Nanos,
}

/// An early report within the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SurgeTaken {
    /// A report not seen before: count it.
    New,
    /// The agent's last report again (same sub-window): it gave up waiting
    /// for the answer, which was lost. Answer it without counting it.
    Repeat,
}

/// An early report refused: its agent's reports came faster than one per
/// the budget's gap, after the burst it allows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "early reports from agent {agent:?} come {gap_ms} ms apart; this master takes one every {min_gap_ms} ms at most (policy.surge_min_gap_ms)"
)]
pub struct SurgeRefused {
    /// The agent.
    pub agent: String,
    /// Time since its last early report, in milliseconds.
    pub gap_ms: u64,
    /// The budget's gap, in milliseconds.
    pub min_gap_ms: u64,
}

impl SurgeBudget {
    /// Takes one early report from `agent` at `now`, measured over the
    /// sub-window that ended at `at`, or refuses it if the agent's reports
    /// would then come faster than one per `min_gap` (one may come up to
    /// a gap early; see the module docs).
    pub fn take(
        &mut self,
        agent: &str,
        now: Nanos,
        at: Nanos,
        min_gap: Duration,
    ) -> Result<SurgeTaken, SurgeRefused> {
        if let Some(cell) = self.last.get_mut(agent) {
            if cell.due > now + min_gap {
                return Err(SurgeRefused {
                    agent: agent.to_owned(),
                    gap_ms: now.since(cell.taken).as_millis() as u64,
                    min_gap_ms: min_gap.as_millis() as u64,
                });
            }
            cell.taken = now;
            cell.due = cell.due.max(now) + min_gap;
            if cell.at == at {
                return Ok(SurgeTaken::Repeat);
            }
            cell.at = at;
            return Ok(SurgeTaken::New);
        }
        if self.last.len() >= TRACKED {
            // Those whose budget is whole again would be let through
            // anyway (a repeat from one of them would count twice: a
            // bounded error, only past this many agents).
            self.last.retain(|_, cell| cell.due > now);
        }
        let cell = Cell {
            taken: now,
            due: now + min_gap,
            at,
        };
        self.last.insert(agent.into(), cell);
        Ok(SurgeTaken::New)
    }

    /// Agents tracked.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Whether no agent is tracked.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn one_early_report_per_gap_per_agent_after_a_burst_of_two() {
        let mut budget = SurgeBudget::default();
        let gap = ms(100);
        let t = Nanos::from_secs(1_000);
        budget.take("a", t, t, gap).unwrap();
        // One may come early (a burst of two)...
        assert_eq!(
            budget.take("a", t + ms(40), t + ms(40), gap),
            Ok(SurgeTaken::New)
        );
        // ...but not a third: the agent is 60 ms ahead of one a gap.
        let refused = budget.take("a", t + ms(60), t + ms(60), gap).unwrap_err();
        assert_eq!((refused.gap_ms, refused.min_gap_ms), (20, 100));
        assert!(refused.to_string().contains("policy.surge_min_gap_ms"));
        // Another agent is not affected.
        assert_eq!(budget.take("b", t + ms(60), t, gap), Ok(SurgeTaken::New));
        // The first is served again once back within the budget, and a
        // report every 10 ms for a second gets ten through, not a hundred.
        assert_eq!(
            budget.take("a", t + ms(100), t + ms(100), gap),
            Ok(SurgeTaken::New)
        );
        let taken = (11..111)
            .filter(|i| {
                let now = t + ms(10 * i);
                budget.take("a", now, now, gap).is_ok()
            })
            .count();
        assert_eq!(taken, 10);
    }

    /// Reports on an agent's 100-ms grid arrive 96–104 ms apart with the
    /// network's jitter: none is refused.
    #[test]
    fn reports_on_the_grid_with_jitter_are_all_taken() {
        let mut budget = SurgeBudget::default();
        let gap = ms(100);
        let t = Nanos::from_secs(1_000);
        for i in 0..1_000u64 {
            let jitter = ms([0, 4, 1, 3, 2][(i % 5) as usize]);
            let sent = t + ms(100 * i);
            let now = if i % 2 == 0 { sent + jitter } else { sent };
            assert!(budget.take("a", now, sent, gap).is_ok(), "report {i}");
        }
    }

    #[test]
    fn a_report_sent_again_is_a_repeat() {
        let mut budget = SurgeBudget::default();
        let gap = ms(100);
        let (t, at) = (Nanos::from_secs(1_000), Nanos::from_secs(999));
        assert_eq!(budget.take("a", t, at, gap), Ok(SurgeTaken::New));
        let again = t + Duration::from_millis(400);
        assert_eq!(budget.take("a", again, at, gap), Ok(SurgeTaken::Repeat));
        // The next sub-window's report is new again.
        let next = again + Duration::from_millis(200);
        assert_eq!(budget.take("a", next, t, gap), Ok(SurgeTaken::New));
    }

    #[test]
    fn agents_tracked_stay_bounded() {
        let mut budget = SurgeBudget::default();
        let gap = ms(100);
        let mut t = Nanos::from_secs(1_000);
        for i in 0..(TRACKED + 10) {
            t = t + Duration::from_millis(1);
            budget.take(&format!("agent-{i}"), t, t, gap).unwrap();
        }
        assert!(budget.len() <= TRACKED);
    }
}
