//! Wake-ups that fall at one instant, handled together: the rounds'
//! `handle_timeout` (the surge scans, the cuts and drains, a third of a
//! large run's time) on every core, then their sends in queue order.
//!
//! The agents' scans fall on one grid, so at each sub-window's end every
//! agent's wake-up is due at the same instant, one after the other in the
//! queue. A round's timeout reads and writes only its own agent (its
//! state and its round), and uses none of the simulation's draws; what it
//! sends is taken from it afterwards ([`Sim::sync`]), in the order the
//! wake-ups were queued. So the run is the same, to the byte, as one that
//! handles them one by one: the network's draws (delay, loss) are taken in
//! the same order, the events scheduled with the same sequence numbers.

use std::cmp::Reverse;

use rayon::prelude::*;

use super::{Event, Masters, Sim};

/// Below this many pairs over a batch's agents, its wake-ups are handled
/// on this thread ([`Sim::parallel_from`]). Measured on the development
/// machine (2 cores, docs/performance.md, "The simulator"): shared out,
/// the hour's batches (50 agents, 5 000 pairs, some 70 µs of scans each)
/// made it 40% slower, waking the other thread and moving the agents'
/// lines to its cache; fleet-small's (100 agents, 200 000 pairs) made it
/// 17% faster.
pub(super) const PARALLEL_PAIRS: usize = 65_536;

impl<M: Masters> Sim<M> {
    /// Handles the wake-ups that fall at one instant on every core of
    /// rayon's pool once their agents hold at least `pairs` pairs between
    /// them (by default 65 536), on this thread below. The output is the
    /// same either way; this is for tests of that, and for measuring.
    pub fn parallel_from(mut self, pairs: usize) -> Self {
        self.parallel_pairs = pairs;
        self
    }

    /// Handles each wake-up on its own, as it comes, rather than with the
    /// others due at the same instant: the plain event loop, which the
    /// batches must match to the byte (for tests of that).
    pub fn one_wake_at_a_time(mut self) -> Self {
        self.batch_wakes = false;
        self
    }

    /// Agent `first`'s wake-up at the current instant, and every wake-up
    /// queued right after it for the same instant.
    pub(super) fn wake_batch(&mut self, first: usize) {
        let mut batch = std::mem::take(&mut self.woken);
        batch.clear();
        batch.push(first);
        while self.batch_wakes
            && let Some(&Reverse((at, _, slot))) = self.queue.peek()
        {
            match self.events[slot] {
                Some(Event::Wake { agent }) if at == self.now => batch.push(agent),
                _ => break,
            }
            self.queue.pop();
            self.events[slot] = None;
            self.free.push(slot);
        }
        // Each agent's first wake-up here, if it is the one the agent asked
        // for (a superseded one does nothing), is handled at once; a later
        // one waits for its turn below, as it would have waited for the
        // first's handling and sync.
        let now = self.now;
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        for &a in &batch {
            let agent = &mut self.agents[a];
            if !self.in_batch[a] && agent.wake == Some(now) {
                agent.wake = None;
                self.in_batch[a] = true;
                due.push(a);
            }
        }
        self.handle_timeouts(&due);
        for &a in &batch {
            if std::mem::take(&mut self.in_batch[a]) {
                self.sync(a);
            } else if self.agents[a].wake == Some(now) {
                // A later wake-up of an agent whose first one asked for
                // this instant again.
                let agent = &mut self.agents[a];
                agent.wake = None;
                agent.round.handle_timeout(now, &agent.state);
                self.sync(a);
            }
        }
        self.due = due;
        self.woken = batch;
    }

    /// The round of each agent of `due` (each once, marked `in_batch`)
    /// told the time, on every core when there is enough to share.
    fn handle_timeouts(&mut self, due: &[usize]) {
        let now = self.now;
        let pairs: usize = due.iter().map(|&a| self.agents[a].state.len()).sum();
        if pairs < self.parallel_pairs || rayon::current_num_threads() < 2 {
            for &a in due {
                let agent = &mut self.agents[a];
                agent.round.handle_timeout(now, &agent.state);
            }
            return;
        }
        let marked = &self.in_batch;
        self.agents
            .par_iter_mut()
            .enumerate()
            .filter(|(a, _)| marked[*a])
            .for_each(|(_, agent)| agent.round.handle_timeout(now, &agent.state));
    }
}
