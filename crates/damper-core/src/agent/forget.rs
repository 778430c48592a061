//! Forgetting idle (account, op) pairs, without losing a check that races
//! the removal.

use std::sync::atomic::Ordering::{AcqRel, Relaxed};

use super::AgentState;
use super::entry::RETIRED;
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
            let late_admitted = admitted.wrapping_sub(entry.drained_admitted.load(Relaxed));
            let late_rejected = rejected.wrapping_sub(entry.drained_rejected.load(Relaxed));
            if late_admitted != 0 || late_rejected != 0 {
                // Checks that found the entry just before it left the map:
                // their cost goes to the pair's new entry, for the next drain.
                if let Some(fresh) = self.entry(now, account.as_str(), found.op(), &pinned) {
                    fresh.admitted.fetch_add(late_admitted, Relaxed);
                    fresh.rejected.fetch_add(late_rejected, Relaxed);
                }
            }
            forgotten += 1;
        }
        drop(pinned);
        self.pairs.end_generation();
        forgotten
    }
}
