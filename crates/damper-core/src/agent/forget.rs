//! Forgetting idle (account, op) pairs, without losing a check that races
//! the removal.

use std::sync::atomic::Ordering::{AcqRel, Relaxed};

use super::AgentState;
use super::counter::{RETIRED, attempted_ops, cost_of, ops_between, tally};
use crate::time::Nanos;

impl AgentState {
    /// Removes every (account, op) idle for
    /// [`AgentConfig::forget_after`](super::AgentConfig::forget_after)
    /// (counted in drains of `rollup_interval`) that holds nothing: no counts
    /// to report, no factor in force. Returns how many were removed. Off the
    /// hot path: the rollup task calls it once per interval, after sending.
    ///
    /// A check racing the removal loses nothing: its cost lands either in
    /// the removed entry before it is emptied (and moves to the pair's new
    /// entry) or after (and the check counts it there itself: the counter
    /// it added to carries a "retired" mark). Checks for a forgotten pair
    /// simply create a new entry.
    pub fn forget_idle(&self, now: Nanos) -> usize {
        let _one_drainer = self.drain_lock.lock().unwrap_or_else(|e| e.into_inner());
        let idle_drains = self
            .config
            .forget_after
            .as_nanos()
            .div_ceil(self.config.rollup_interval.as_nanos().max(1))
            .clamp(1, u128::from(u16::MAX)) as u16;
        let pinned = self.pairs.pin();
        let mut forgotten = 0;
        for found in pinned.pairs() {
            let entry = found.entry();
            if !entry.forgettable(now, idle_drains) {
                continue;
            }
            // Its name, read before its slot is vacant.
            let account = found.account();
            // Out of the table first, so checks from now on make a new
            // entry; then empty it, so late adds to this one are seen as
            // such. Its slot is made over only once this pass, and every
            // check that might have found it, is done.
            if !pinned.remove(found) {
                continue;
            }
            let admitted = entry.admitted.swap(RETIRED, AcqRel);
            let rejected = entry.rejected.swap(RETIRED, AcqRel);
            let late_admitted =
                u64::from(cost_of(admitted).wrapping_sub(entry.drained_admitted.load(Relaxed)));
            let late_rejected =
                u64::from(cost_of(rejected).wrapping_sub(entry.drained_rejected.load(Relaxed)));
            let late_ops = u64::from(ops_between(
                entry.drained_ops.load(Relaxed),
                attempted_ops(admitted, rejected),
            ));
            if late_admitted != 0 || late_rejected != 0 || late_ops != 0 {
                // Checks that found the entry just before it left the map:
                // their cost goes to the pair's new entry, for the next drain
                // (their operations with the admitted cost: the drains take
                // the two counters' operations together).
                if let Some(fresh) = self.entry(now, account.as_str(), found.op(), &pinned) {
                    fresh
                        .admitted
                        .fetch_add(tally(late_admitted, late_ops), Relaxed);
                    fresh.rejected.fetch_add(tally(late_rejected, 0), Relaxed);
                }
            }
            forgotten += 1;
        }
        drop(pinned);
        self.pairs.end_generation();
        forgotten
    }
}
