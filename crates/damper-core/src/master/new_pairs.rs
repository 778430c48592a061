//! [`NewPairBudget`]: how many (account, op) pairs one agent may add to a
//! master per round.

use std::collections::HashMap;
use std::time::Duration;

use crate::time::Nanos;

/// How many new pairs each agent has made a master track in the current
/// round, so that one agent (a compromised node, a bug that mints account
/// names) cannot take all of `max_pairs` for itself: past its budget, its
/// new pairs are not tracked and fail open, while other agents' new pairs
/// and every pair already tracked are unaffected. A legitimate node's
/// first round names every account it serves; the budget must be above
/// that. Bounded: at most `max_agents` agents are remembered, and agents
/// of earlier rounds are forgotten first.
#[derive(Debug)]
pub struct NewPairBudget {
    per_round: usize,
    round: Duration,
    max_agents: usize,
    /// Agent → (round index, pairs added in it).
    spent: HashMap<Box<str>, (u64, usize)>,
}

impl NewPairBudget {
    /// `per_round` new pairs per agent per `round` (the rollup interval),
    /// remembering at most `max_agents` agents.
    pub fn new(per_round: usize, round: Duration, max_agents: usize) -> NewPairBudget {
        NewPairBudget {
            per_round,
            round: round.max(Duration::from_millis(1)),
            max_agents: max_agents.max(1),
            spent: HashMap::new(),
        }
    }

    fn index(&self, now: Nanos) -> u64 {
        now.as_nanos() / u64::try_from(self.round.as_nanos()).unwrap_or(u64::MAX)
    }

    /// How many new pairs `agent` may still add in the round of `now`.
    pub fn left(&self, agent: &str, now: Nanos) -> usize {
        match self.spent.get(agent) {
            Some(&(round, used)) if round == self.index(now) => self.per_round.saturating_sub(used),
            _ => self.per_round,
        }
    }

    /// Records that `agent` added `added` new pairs at `now`.
    pub fn spend(&mut self, agent: &str, now: Nanos, added: usize) {
        if added == 0 {
            return;
        }
        let round = self.index(now);
        if let Some(entry) = self.spent.get_mut(agent) {
            *entry = match *entry {
                (r, used) if r == round => (r, used.saturating_add(added)),
                _ => (round, added),
            };
            return;
        }
        if self.spent.len() >= self.max_agents {
            // Agents of earlier rounds have their whole budget again:
            // forgetting them changes nothing.
            self.spent.retain(|_, &mut (r, _)| r == round);
            if self.spent.len() >= self.max_agents {
                // Every one spent this round: the budget is per agent, so
                // an unbounded number of made-up agent ids would be an
                // unbounded budget anyway; the master's `max_pairs` bounds
                // the total.
                return;
            }
        }
        self.spent.insert(agent.into(), (round, added));
    }

    /// Agents remembered.
    pub fn len(&self) -> usize {
        self.spent.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.spent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Nanos {
        Nanos::from_millis(1_700_000_000_000 + ms)
    }

    #[test]
    fn each_agent_has_its_own_budget_per_round_and_it_comes_back_the_next_round() {
        let mut b = NewPairBudget::new(100, Duration::from_secs(2), 10);
        assert_eq!(b.left("a", t(0)), 100);
        b.spend("a", t(0), 70);
        b.spend("a", t(500), 50);
        assert_eq!(b.left("a", t(1_000)), 0);
        assert_eq!(b.left("b", t(1_000)), 100);
        assert_eq!(b.left("a", t(2_000)), 100);
        b.spend("a", t(2_100), 10);
        assert_eq!(b.left("a", t(2_200)), 90);
    }

    #[test]
    fn it_remembers_a_bounded_number_of_agents() {
        let mut b = NewPairBudget::new(5, Duration::from_secs(2), 3);
        for i in 0..10 {
            b.spend(&format!("agent-{i}"), t(0), 1);
        }
        assert_eq!(b.len(), 3);
        // A new round: the earlier agents are forgotten to make room.
        b.spend("late", t(4_000), 1);
        assert_eq!(b.len(), 1);
        assert_eq!(b.left("late", t(4_000)), 4);
    }
}
