//! Sparse hints at the master: each one tallied in its pair's window
//! ([`DemandWindow::hint`](crate::window::DemandWindow::hint)), and the
//! pair polled (a [`Push::poll`](super::Push::poll) to every agent) when
//! the hints come together beyond chance. See
//! `damper_core::agent::hint` for what an agent hints, and
//! `docs/design.md`, "Sparse hints".

use super::{HintFrom, MasterState, Verdict};
use crate::Pair;
use crate::time::Nanos;
use crate::wire::SurgeRates;

/// What sparse hints did at one master state, since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HintStats {
    /// Hints taken (each one agent's, for one pair).
    pub hints: u64,
    /// Pairs polled: their hints came together beyond chance.
    pub polls: u64,
    /// Polls not made for [`POLLS_PER_INTERVAL`].
    pub polls_refused: u64,
}

/// The most pairs one master state polls per rollup interval. A poll makes
/// every agent of the pair send an early report, so agents that hint
/// together on many pairs at once (a hostile pair of agents, or a storm)
/// cost the fleet a bounded number of reports; a pair past it is read at
/// its rounds, as before polls.
pub const POLLS_PER_INTERVAL: usize = 1_000;

impl MasterState {
    /// What sparse hints did here since the state was made.
    pub fn hint_stats(&self) -> HintStats {
        self.hints
    }

    /// Tallies a sparse hint from `agent` for entry `i` (the pair `pair`),
    /// polls the pair when the hints come together, and gives the verdict
    /// in force (asking for no recheck).
    pub(super) fn hint(
        &mut self,
        now: Nanos,
        i: u32,
        agent: &str,
        pair: Pair<'_>,
        rates: SurgeRates,
    ) -> Option<Verdict> {
        self.hints.hints += 1;
        let mut window = self.entries.take_window(i);
        let verdict = self.conclude(i, &window, pair.account, pair.op, now);
        let key = self.entries.get_mut(i);
        key.set_last_report(key.last_report().later(now));
        let hint = HintFrom {
            agent: crate::agent::agent_seed(agent) as u32,
            rate: f64::from(rates.rate),
            fall: rates.rate < rates.baseline,
        };
        // Only limited pairs are polled; an exempt one's limit is infinite.
        let limit = verdict.map_or(f64::INFINITY, |v| v.limit.get());
        let factor = verdict.map_or(0.0, |v| v.factor);
        let poll = limit.is_finite() && window.hint(&self.config.window, now, hint, limit, factor);
        self.entries.put_window(i, window);
        if poll && self.pushes.is_some() {
            let interval = crate::time::duration_nanos(self.config.window.rollup_interval).max(1);
            let this = now.as_nanos() / interval;
            if self.polls_in.0 != this {
                self.polls_in = (this, 0);
            }
            match verdict {
                Some(v) if self.polls_in.1 < POLLS_PER_INTERVAL => {
                    self.polls_in.1 += 1;
                    self.hints.polls += 1;
                    self.queue_poll(pair.account, pair.op, v);
                }
                Some(_) => self.hints.polls_refused += 1,
                None => {}
            }
        }
        // The verdict in force, with no recheck: the hint moved nothing, and
        // the agent's own rollup asks when its round is whole.
        verdict.map(|v| Verdict {
            recheck_at: None,
            ..v
        })
    }
}

#[cfg(test)]
mod tests;
