//! Taking the counts for a rollup ([`AgentState::drain`], by owner), and
//! putting back what a failed rollup could not deliver.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;

use super::counter::{OPS_MASK, attempted_ops, clear_overflow, cost_of, ops_between};
use super::entry::Entry;
use super::owned::Owned;
use super::{AgentState, Delta, Pending, Routed, reportable};
use crate::ring::Ring;
use crate::time::Nanos;

/// The op cost a drain tells the master: the scans' own, but 0 for 1,
/// which tells the master nothing (every count is a count of operations
/// of 1 when nothing is said) and would cost every named entry of cheap
/// traffic two bytes.
///
/// A pair whose scans know no cost above 1, yet whose delta of `attempted`
/// cost in `ops` operations holds more than one a piece, tells the most
/// one of them can cost: `attempted − (ops − 1)`, the rest costing 1. A
/// publish to 4 000 subscribers among cheap operations, one a minute on
/// each of 20 agents, is never one their scans see alone, and told as
/// nothing, the master read its rounds as counts of operations of 1, and
/// a round that chance gave two such publishes as proof (an account at
/// 0.95× of its limit refused in 12 seeds of 20).
fn told_op_cost(cost: u32, attempted: u64, ops: u32) -> u32 {
    if cost > 1 {
        return cost;
    }
    let ops = u64::from(ops);
    if ops == 0 || attempted <= ops {
        return 0;
    }
    (attempted - (ops - 1)).min(u64::from(u32::MAX)) as u32
}

/// How much of a failed rollup's `delta` [`AgentState::undrain`] puts
/// back into `entry`'s drained marks (admitted cost, rejected cost,
/// operations): all of it, unless what the next drain would take then
/// passes [`MAX_CARRIED`] of cost (or the operations' share of it): the
/// marks take differences modulo 2^32, and a round's new cost needs the
/// rest of that room. A master unreachable for so long that a pair's
/// carried cost reaches 2^31 loses what is beyond, not all of it.
fn carried(entry: &Entry, delta: Delta) -> (u32, u32, u32) {
    let pending = |field: u64, mark: &AtomicU32| cost_of(field).wrapping_sub(mark.load(Relaxed));
    let room = |pending: u32| u64::from(MAX_CARRIED.saturating_sub(pending));
    let admitted = delta.admitted.min(room(pending(
        entry.admitted.load(Relaxed),
        &entry.drained_admitted,
    )));
    let rejected = delta
        .attempted
        .saturating_sub(delta.admitted)
        .min(room(pending(
            entry.rejected.load(Relaxed),
            &entry.drained_rejected,
        )));
    let ops = delta.ops.min(OPS_MASK / 2);
    (admitted as u32, rejected as u32, ops)
}

/// The most cost of each kind a pair carries over failed rollups: half the
/// room of the counters' cost fields (see [`carried`]).
const MAX_CARRIED: u32 = 1 << 31;

impl AgentState {
    /// Takes the counts of every (account, op) with activity since the last
    /// drain and hands them to `visit` as deltas; an (account, op) that had
    /// activity last time and none now is visited once with a zero delta,
    /// so its master sees it go quiet, and one under a master's factor at
    /// `now` is visited (with a zero delta if quiet) until a reply lifts
    /// it or it lapses.
    /// Returns how many were visited.
    ///
    /// One drain runs at a time (others wait). Concurrent checks are never
    /// lost or counted twice: they land in this drain or the next.
    pub fn drain(&self, now: Nanos, mut visit: impl FnMut(&str, &str, Delta)) -> usize {
        self.drain_keys(now, |account, op, delta, _| visit(account, op, delta))
    }

    /// [`drain`](Self::drain), handing out each op as its interned name.
    fn drain_keys(&self, now: Nanos, mut visit: impl FnMut(&str, &Arc<str>, Delta, u32)) -> usize {
        let _one_drainer = self.drain_lock.lock().unwrap_or_else(|e| e.into_inner());
        let pinned = self.pairs.pin();
        let mut visited = 0;
        // The rate a master reads from each count (it spreads a report over
        // at least one interval): the baseline of surges.
        let interval = self.config.rollup_interval.as_secs_f64().max(1e-9);
        // The drained counts, `carried_since` and `active_last_drain` are
        // written only under the drain lock, held here (see `owned`).
        for found in pinned.pairs() {
            let entry = found.entry();
            let (admitted, rejected) = (entry.admitted.load(Relaxed), entry.rejected.load(Relaxed));
            clear_overflow(&entry.admitted, admitted);
            clear_overflow(&entry.rejected, rejected);
            let (admitted, rejected, ops) = (
                cost_of(admitted),
                cost_of(rejected),
                attempted_ops(admitted, rejected),
            );
            let d_admitted =
                u64::from(admitted.wrapping_sub(entry.drained_admitted.replace(admitted)));
            let d_rejected =
                u64::from(rejected.wrapping_sub(entry.drained_rejected.replace(rejected)));
            let d_ops = ops_between(entry.drained_ops.replace(ops), ops);
            let active = d_admitted != 0 || d_rejected != 0;
            if entry.carried_since.load(Relaxed) == 0 {
                // Counts carried over from failed rollups span more than
                // an interval: the rate before them stays the baseline.
                let rate = d_admitted.saturating_add(d_rejected) as f64 / interval;
                entry.reported_rate.store((rate as f32).to_bits(), Relaxed);
            }
            let idle = entry.idle_drains.load(Relaxed);
            entry
                .idle_drains
                .store(if active { 0 } else { idle.saturating_add(1) }, Relaxed);
            let was_active = entry.active_last_drain.replace(active);
            // A pair under a master's factor is reported, with nothing if
            // need be, until a reply lifts the factor: an agent that saw
            // the last of a deluge and then nothing would otherwise hold
            // its factor until it expires (three rounds), and refuse the
            // next operation that comes its way.
            let suppressed = entry.master_factor_at(now) != 0;
            if active || was_active || suppressed {
                let since = entry.carried_since.replace(0);
                let attempted = d_admitted.saturating_add(d_rejected);
                visit(
                    found.account().as_str(),
                    found.op(),
                    Delta {
                        attempted,
                        admitted: d_admitted,
                        since: (since != 0).then(|| Nanos::from_nanos(since)),
                        op_cost: told_op_cost(entry.op_cost(), attempted, d_ops),
                        ops: d_ops,
                    },
                    found.pos + 1,
                );
                visited += 1;
            }
        }
        visited
    }

    /// Puts back a delta that a failed rollup could not deliver, so the next
    /// drain includes it. `since` is the start of the interval it covered.
    pub fn undrain(&self, account: &str, op: &str, delta: Delta, since: Nanos) {
        let _one_drainer = self.drain_lock.lock().unwrap_or_else(|e| e.into_inner());
        if !reportable(account) || !reportable(op) {
            return;
        }
        let pinned = self.pairs.pin();
        // Created again if forgotten meanwhile: the counts must not be lost
        // (unless the table cannot hold the pair again: full).
        let Some(entry) = self.entry(since, account, op, &pinned) else {
            return;
        };
        if delta.attempted == 0 {
            // A zero report ("this agent went quiet") that did not arrive:
            // send it again next time. It carries no counts, so no start.
            entry.active_last_drain.store(true, Relaxed);
            return;
        }
        let (admitted, rejected, ops) = carried(entry, delta);
        entry.drained_admitted.fetch_sub(admitted, Relaxed);
        entry.drained_rejected.fetch_sub(rejected, Relaxed);
        entry.drained_ops.fetch_sub(ops, Relaxed);
        let since = delta.since.unwrap_or(since).as_nanos().max(1);
        let _ = entry.carried_since.fetch_update(Relaxed, Relaxed, |old| {
            Some(if old == 0 { since } else { old.min(since) })
        });
    }

    /// Drains (see [`drain`](Self::drain)) and routes each (account, op)'s
    /// counts to the account's master on `ring`, sorted by op then account
    /// for each master, so replays are deterministic. Counts the ring has no
    /// master for come back in [`Routed::unroutable`].
    pub fn drain_by_owner(&self, now: Nanos, ring: &Ring) -> Routed {
        let mut routed = Routed::default();
        // Filed by the owner's place in the ring, not its address.
        let mut by_owner: Vec<Vec<Pending>> = vec![Vec::new(); ring.len()];
        self.drain_keys(now, |account, op, delta, at| {
            let pending = Pending {
                account: account.to_owned(),
                op: op.clone(),
                delta,
                at,
            };
            match ring.owner_index(account) {
                Some(owner) => by_owner[owner].push(pending),
                None => routed.unroutable.push(pending),
            }
        });
        for (owner, mut pending) in by_owner.into_iter().enumerate() {
            if pending.is_empty() {
                continue;
            }
            pending.sort_unstable_by(|a, b| {
                // One interned name per op: most comparisons are within one.
                let op = if Arc::ptr_eq(&a.op, &b.op) {
                    std::cmp::Ordering::Equal
                } else {
                    a.op.cmp(&b.op)
                };
                op.then_with(|| name_order(&a.account, &b.account))
            });
            // The address is copied once per master, not per pair.
            routed
                .by_master
                .insert(ring.member(owner).to_owned(), pending);
        }
        routed
    }

    /// Puts back counts that a rollup covering `[start, end)` could not
    /// deliver, so the next drain sends them again, unless the interval they
    /// cover began more than `max_carry` before `end`: such counts fall
    /// outside any window a master keeps, and are dropped. Returns the
    /// attempted cost dropped (0 when carried over).
    pub fn carry_over(
        &self,
        pending: Pending,
        start: Nanos,
        end: Nanos,
        max_carry: Duration,
    ) -> u64 {
        let since = pending.delta.since.unwrap_or(start);
        if end.since(since) > max_carry {
            return pending.delta.attempted;
        }
        self.undrain(&pending.account, &pending.op, pending.delta, start);
        0
    }
}

/// `a.cmp(b)`, eight bytes at a time in registers: a drain sorts every
/// pair it takes, and account names are short, where a call to `memcmp`
/// per comparison costs more than the comparing.
fn name_order(a: &str, b: &str) -> std::cmp::Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut x = a.chunks_exact(8);
    let mut y = b.chunks_exact(8);
    for (x, y) in x.by_ref().zip(y.by_ref()) {
        let x = u64::from_be_bytes(x.try_into().expect("eight bytes"));
        let y = u64::from_be_bytes(y.try_into().expect("eight bytes"));
        if x != y {
            return x.cmp(&y);
        }
    }
    let done = a.len().min(b.len()) / 8 * 8;
    for (x, y) in a[done..].iter().zip(&b[done..]) {
        if x != y {
            return x.cmp(y);
        }
    }
    a.len().cmp(&b.len())
}

#[cfg(test)]
mod name_order_tests {
    use super::name_order;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn names_order_as_strings_do(a in "[a-c0-9-]{0,20}", b in "[a-c0-9-]{0,20}") {
            prop_assert_eq!(name_order(&a, &b), a.cmp(&b));
            let c = format!("{a}{b}");
            prop_assert_eq!(name_order(&a, &c), a.as_str().cmp(c.as_str()));
            prop_assert_eq!(name_order(&c, &a), c.as_str().cmp(a.as_str()));
        }
    }

    #[test]
    fn names_that_share_whole_chunks_order_by_the_rest() {
        assert!(name_order("small-123", "small-124").is_lt());
        assert!(name_order("small-12", "small-123").is_lt());
        assert!(name_order("small-1234567890", "small-123456789").is_gt());
        assert!(name_order("", "a").is_lt());
        assert!(name_order("é", "e").is_gt());
        assert!(name_order("abcdefgh", "abcdefgh").is_eq());
    }
}
