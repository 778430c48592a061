//! Work on many pairs under one hold on the agent's table: a caller that
//! replays many pairs' operations in a row (the simulator's steps, agent by
//! agent), or a reply's verdicts for every pair a rollup carried, takes
//! the table's generation once for all of them, rather than once per pair,
//! and finds each pair where it was when it can.

use rand::Rng;

use super::publisher::{ByPublisher, Publisher};
use super::table::Pinned;
use super::{AgentState, factor_of, reportable};
use crate::Pair;
use crate::time::Nanos;
use crate::wire::Factor;

/// A hold on an agent's table for a stretch of batches
/// ([`AgentState::hold`]). While it lives, a pair forgotten meanwhile
/// keeps its slot (its reuse waits for every hold taken before), so hold
/// it for one stretch of work, not across waits; a pair made after it was
/// taken is found through the table's lock, more slowly.
pub struct Hold<'s> {
    state: &'s AgentState,
    pinned: Pinned<'s>,
}

impl AgentState {
    /// A hold on the table for [`Hold::check_batch_at`] and
    /// [`Hold::factor_at`]: [`AgentState::check_batch`] and
    /// [`AgentState::factor`] take one per call, which costs about as much
    /// as a lookup.
    pub fn hold(&self) -> Hold<'_> {
        Hold {
            state: self,
            pinned: self.pairs.pin(),
        }
    }
}

impl Hold<'_> {
    /// [`AgentState::check_batch`], under this hold, the pair looked up
    /// first where `at` says it was (its position in the agent's table
    /// plus one; 0 for none), and `at` left where it is: a caller that
    /// keeps one `at` per pair it replays skips the hash and the index (as
    /// [`MasterState::ingest_at`](crate::master::MasterState::ingest_at)
    /// does on the master). Any `at` decides the same: a stale one is only
    /// slower.
    #[allow(clippy::too_many_arguments)]
    pub fn check_batch_at<R: Rng + ?Sized>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        cost: u64,
        n: u64,
        rng: &mut R,
        at: &mut u32,
    ) -> u64 {
        self.check_batch_by(now, account, op, cost, n, None, rng, at)
    }

    /// [`check_batch_at`](Self::check_batch_at) for `n` operations that
    /// `publisher` sent in a row, as `n` calls of
    /// [`AgentState::check_from`] would decide them.
    #[allow(clippy::too_many_arguments)]
    pub fn check_batch_from_at<R: Rng + ?Sized>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        cost: u64,
        n: u64,
        publisher: Publisher,
        rng: &mut R,
        at: &mut u32,
    ) -> u64 {
        let sender = Some(self.state.sender(account, op, publisher));
        self.check_batch_by(now, account, op, cost, n, sender, rng, at)
    }

    #[allow(clippy::too_many_arguments)]
    fn check_batch_by<R: Rng + ?Sized>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        cost: u64,
        n: u64,
        publisher: ByPublisher<'_>,
        rng: &mut R,
        at: &mut u32,
    ) -> u64 {
        if cost == 0 || n == 0 || !reportable(account) || !reportable(op) {
            return n;
        }
        let (state, pinned) = (self.state, &self.pinned);
        // A pair made here is seeded as `check` seeds it (`new_entry`);
        // one a master's answer made is not, as `check` leaves it.
        let found = match pinned.find_near(account, op, at) {
            Some(entry) => Some(entry),
            None => state
                .traffic_entry(now, account, op, pinned)
                .inspect(|entry| {
                    entry.seed_quantum(cost);
                }),
        };
        let Some(entry) = found else {
            return n;
        };
        let (mut left, mut admitted) = (n, 0);
        while left > 0 {
            let (decided, yes) = entry.decide_batch(now, cost, left, rng, &state.config, publisher);
            for (admit, count) in [(true, yes), (false, decided - yes)] {
                if count != 0 {
                    state.count(
                        now,
                        account,
                        op,
                        entry,
                        admit,
                        super::counter::tally(cost.saturating_mul(count), count),
                        pinned,
                    );
                }
            }
            admitted += yes;
            left -= decided;
        }
        admitted
    }

    /// [`AgentState::apply_factor`], under this hold, the pair looked up
    /// first where `at` says it was (see
    /// [`check_batch_at`](Self::check_batch_at)), and made if it is new.
    pub(super) fn apply_factor_at(
        &self,
        now: Nanos,
        pair: Pair<'_>,
        verdict: &Factor,
        at: &mut u32,
    ) {
        let (account, op) = (pair.account, pair.op);
        if !reportable(account) || !reportable(op) {
            return;
        }
        let (state, pinned) = (self.state, &self.pinned);
        let found = match pinned.find_near(account, op, at) {
            Some(entry) => Some(entry),
            None => state.entry(now, account, op, pinned),
        };
        if let Some(entry) = found {
            state.set_verdict(now, op, entry, verdict);
        }
    }

    /// [`AgentState::factor`], under this hold, the pair looked up first
    /// where `at` says it was (see [`check_batch_at`](Self::check_batch_at)).
    pub fn factor_at(&self, now: Nanos, account: &str, op: &str, at: &mut u32) -> Option<f64> {
        let entry = self.pinned.find_near(account, op, at)?;
        Some(factor_of(entry.master_factor_at(now)))
    }
}
