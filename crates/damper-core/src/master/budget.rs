//! The master's budget for early reports: at most one per agent per
//! `policy.surge_min_gap`. Each early report makes the master re-estimate
//! its accounts, so an agent sending them without pause (broken, or
//! hostile) is refused rather than served; other agents are not affected.
//!
//! It also knows which sub-window each agent's last early report measured,
//! so an agent that gave up waiting for an answer and sends the same report
//! again is answered without it counting twice.

use std::collections::HashMap;
use std::time::Duration;

use crate::time::Nanos;

/// Agents tracked before the ones whose gap has passed are let go.
const TRACKED: usize = 1 << 16;

/// When each agent last had an early report taken, and the end of the
/// sub-window it measured.
#[derive(Debug, Default)]
pub struct SurgeBudget {
    last: HashMap<Box<str>, (Nanos, Nanos)>,
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

/// An early report refused: its agent sent another less than the budget's
/// gap before.
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
    /// sub-window that ended at `at`, or refuses it if the last one taken
    /// from it is less than `min_gap` old.
    pub fn take(
        &mut self,
        agent: &str,
        now: Nanos,
        at: Nanos,
        min_gap: Duration,
    ) -> Result<SurgeTaken, SurgeRefused> {
        if let Some((last, last_at)) = self.last.get_mut(agent) {
            let gap = now.since(*last);
            if gap < min_gap {
                return Err(SurgeRefused {
                    agent: agent.to_owned(),
                    gap_ms: gap.as_millis() as u64,
                    min_gap_ms: min_gap.as_millis() as u64,
                });
            }
            *last = now;
            if *last_at == at {
                return Ok(SurgeTaken::Repeat);
            }
            *last_at = at;
            return Ok(SurgeTaken::New);
        }
        if self.last.len() >= TRACKED {
            // Those whose gap has passed would be let through anyway (a
            // repeat from one of them would count twice: a bounded error,
            // only past this many agents).
            self.last.retain(|_, (last, _)| now.since(*last) < min_gap);
        }
        self.last.insert(agent.into(), (now, at));
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

    #[test]
    fn one_early_report_per_gap_per_agent() {
        let mut budget = SurgeBudget::default();
        let gap = Duration::from_millis(100);
        let t = Nanos::from_secs(1_000);
        budget.take("a", t, t, gap).unwrap();
        let refused = budget
            .take("a", t + Duration::from_millis(40), t, gap)
            .unwrap_err();
        assert_eq!((refused.gap_ms, refused.min_gap_ms), (40, 100));
        assert!(refused.to_string().contains("policy.surge_min_gap_ms"));
        // Another agent is not affected; the first is served again later.
        let later = t + Duration::from_millis(100);
        assert_eq!(
            budget.take("b", t + Duration::from_millis(40), t, gap),
            Ok(SurgeTaken::New)
        );
        assert_eq!(budget.take("a", later, later, gap), Ok(SurgeTaken::New));
    }

    #[test]
    fn a_report_sent_again_is_a_repeat() {
        let mut budget = SurgeBudget::default();
        let gap = Duration::from_millis(100);
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
        let gap = Duration::from_millis(100);
        let mut t = Nanos::from_secs(1_000);
        for i in 0..(TRACKED + 10) {
            t = t + Duration::from_millis(1);
            budget.take(&format!("agent-{i}"), t, t, gap).unwrap();
        }
        assert!(budget.len() <= TRACKED);
    }
}
