//! [`RollupLog`]: which numbered rollups a master has counted, so a rollup
//! resent after its reply was lost is counted once.

use std::collections::HashMap;
use std::time::Duration;

use crate::time::Nanos;

/// How many of one agent's latest rollup numbers are remembered. A resend
/// follows its original within a request timeout, while the agent sends a
/// handful of requests per round to each master: eight is ample.
const REMEMBERED: usize = 8;

/// The numbered rollups a master has counted lately, per agent run
/// (`agent_id`, `incarnation`): the last eight numbers of each,
/// forgotten `keep` after the run's last rollup, and at most `max_agents`
/// runs (the stalest forgotten first), so a client inventing agent ids
/// cannot grow it without bound.
#[derive(Debug)]
pub struct RollupLog {
    runs: HashMap<(Box<str>, u64), Run>,
    keep: Duration,
    max_agents: usize,
}

#[derive(Debug)]
struct Run {
    numbers: [u64; REMEMBERED],
    next: usize,
    last: Nanos,
}

impl Default for RollupLog {
    /// Remembered for 60 s, for up to 100 000 agent runs.
    fn default() -> Self {
        RollupLog::new(Duration::from_secs(60), 100_000)
    }
}

impl RollupLog {
    /// A log that forgets a run `keep` after its last rollup and holds at
    /// most `max_agents` runs.
    pub fn new(keep: Duration, max_agents: usize) -> RollupLog {
        RollupLog {
            runs: HashMap::new(),
            keep,
            max_agents: max_agents.max(1),
        }
    }

    /// Records rollup `sequence` of (`agent`, `incarnation`) at `now`, and
    /// says whether this is the first time: `false` for a resend of a
    /// rollup already counted. Unnumbered rollups (`sequence` 0) are always
    /// first.
    pub fn first_time(&mut self, now: Nanos, agent: &str, incarnation: u64, sequence: u64) -> bool {
        if sequence == 0 {
            return true;
        }
        if let Some(run) = self.runs.get_mut(&(agent.into(), incarnation)) {
            run.last = run.last.max(now);
            if run.numbers.contains(&sequence) {
                return false;
            }
            run.numbers[run.next] = sequence;
            run.next = (run.next + 1) % REMEMBERED;
            return true;
        }
        if self.runs.len() >= self.max_agents {
            self.forget(now);
        }
        let mut numbers = [0; REMEMBERED];
        numbers[0] = sequence;
        self.runs.insert(
            (agent.into(), incarnation),
            Run {
                numbers,
                next: 1,
                last: now,
            },
        );
        true
    }

    /// Forgets the runs idle for `keep`; if none is and the log is full,
    /// the stalest one.
    fn forget(&mut self, now: Nanos) {
        let keep = self.keep;
        self.runs.retain(|_, run| now.since(run.last) < keep);
        if self.runs.len() >= self.max_agents
            && let Some(stalest) = self
                .runs
                .iter()
                .min_by_key(|(_, run)| run.last)
                .map(|(key, _)| key.clone())
        {
            self.runs.remove(&stalest);
        }
    }

    /// Agent runs remembered.
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: u64) -> Nanos {
        Nanos::from_secs(1_800_000_000 + s)
    }

    #[test]
    fn a_resend_is_not_first_and_other_runs_and_numbers_are() {
        let mut log = RollupLog::default();
        assert!(log.first_time(t(0), "edge-1", 7, 1));
        assert!(!log.first_time(t(1), "edge-1", 7, 1), "the resend");
        assert!(log.first_time(t(2), "edge-1", 7, 2));
        assert!(log.first_time(t(2), "edge-1", 8, 1), "a restarted agent");
        assert!(log.first_time(t(2), "edge-2", 7, 1), "another agent");
        // Unnumbered rollups are never de-duplicated.
        assert!(log.first_time(t(3), "old-agent", 0, 0));
        assert!(log.first_time(t(3), "old-agent", 0, 0));
        // Eight numbers are remembered.
        for n in 3..=10 {
            assert!(log.first_time(t(4), "edge-1", 7, n));
        }
        assert!(!log.first_time(t(4), "edge-1", 7, 10));
        assert!(log.first_time(t(4), "edge-1", 7, 2), "long gone: counted");
    }

    #[test]
    fn the_log_is_bounded_and_forgets_idle_runs() {
        let mut log = RollupLog::new(Duration::from_secs(60), 100);
        for i in 0..1_000 {
            log.first_time(t(i / 10), &format!("made-up-{i}"), 1, 1);
        }
        assert!(log.len() <= 100, "{}", log.len());
        // The latest are remembered; idle runs go once the log fills.
        assert!(!log.first_time(t(100), "made-up-999", 1, 1));
        log.first_time(t(1_000), "late", 1, 1);
        for i in 0..200 {
            log.first_time(t(1_000), &format!("later-{i}"), 1, 1);
        }
        assert!(log.len() <= 100);
    }
}
