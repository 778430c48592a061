//! The master's budget for early reports: at most one per agent per
//! `policy.surge_min_gap`. Each early report makes the master re-estimate
//! its accounts, so an agent sending them without pause (broken, or
//! hostile) is refused rather than served; other agents are not affected.

use std::collections::HashMap;
use std::time::Duration;

use crate::time::Nanos;

/// Agents tracked before the ones whose gap has passed are let go.
const TRACKED: usize = 1 << 16;

/// When each agent last had an early report taken.
#[derive(Debug, Default)]
pub struct SurgeBudget {
    last: HashMap<Box<str>, Nanos>,
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
    /// Takes one early report from `agent` at `now`, or refuses it if the
    /// last one taken from it is less than `min_gap` old.
    pub fn take(&mut self, agent: &str, now: Nanos, min_gap: Duration) -> Result<(), SurgeRefused> {
        if let Some(last) = self.last.get_mut(agent) {
            let gap = now.since(*last);
            if gap < min_gap {
                return Err(SurgeRefused {
                    agent: agent.to_owned(),
                    gap_ms: gap.as_millis() as u64,
                    min_gap_ms: min_gap.as_millis() as u64,
                });
            }
            *last = now;
            return Ok(());
        }
        if self.last.len() >= TRACKED {
            // Those whose gap has passed would be let through anyway.
            self.last.retain(|_, last| now.since(*last) < min_gap);
        }
        self.last.insert(agent.into(), now);
        Ok(())
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
        budget.take("a", t, gap).unwrap();
        let refused = budget
            .take("a", t + Duration::from_millis(40), gap)
            .unwrap_err();
        assert_eq!((refused.gap_ms, refused.min_gap_ms), (40, 100));
        assert!(refused.to_string().contains("policy.surge_min_gap_ms"));
        // Another agent is not affected; the first is served again later.
        budget
            .take("b", t + Duration::from_millis(40), gap)
            .unwrap();
        budget
            .take("a", t + Duration::from_millis(100), gap)
            .unwrap();
    }

    #[test]
    fn agents_tracked_stay_bounded() {
        let mut budget = SurgeBudget::default();
        let gap = Duration::from_millis(100);
        let mut t = Nanos::from_secs(1_000);
        for i in 0..(TRACKED + 10) {
            t = t + Duration::from_millis(1);
            budget.take(&format!("agent-{i}"), t, gap).unwrap();
        }
        assert!(budget.len() <= TRACKED);
    }
}
