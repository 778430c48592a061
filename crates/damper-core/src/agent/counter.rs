//! A pair's counter word: the cost and the number of operations it
//! counted, in one atomic, so that a check's one add counts both.
//!
//! A round of operations of mixed costs scatters by chance as the sum of
//! its costs' squares, not as its cost alone: a master that knows how many
//! operations a report holds beside their cost (and the costliest one's
//! cost) bounds that sum (see `Delta::ops`). Counting operations in a
//! counter of their own would cost every check a second locked add; in
//! the word's high bits it costs nothing.
//!
//! The word, from the top: the retired mark ([`RETIRED`], see `forget`),
//! one overflow bit, 30 bits of operations, 32 bits of cost. Both fields
//! wrap, and their readers take differences of two readings (cost modulo
//! 2^32, operations modulo 2^30): exact while a pair's cost between two
//! readings (a drain, a scan, a local guard's window) stays under 2^32
//! and its operations under 2^30. A cost field that wraps carries one
//! into the operations, one operation too many per 2^32 cost, far below
//! what a count's chance moves. The operations' carry goes into the
//! overflow bit, which each drain clears ([`OVERFLOW`]), so it never
//! reaches the retired mark.

/// What [`AgentState::forget_idle`] swaps into a forgotten entry's
/// counters, after taking it out of the map. A check that found the entry
/// just before holds a reference to it still; its counter add returns the
/// old value, and this bit set there says the add came too late to be
/// taken by the forget (a single atomic's operations are totally
/// ordered), so the check counts the cost again in the pair's current
/// entry. A live counter never has it: the operations' carry stops at
/// [`OVERFLOW`], which every drain clears. (If one did, with no drains,
/// the check finds its entry still in the map and keeps the count where
/// it is.)
///
/// [`AgentState::forget_idle`]: super::AgentState::forget_idle
pub(super) const RETIRED: u64 = 1 << 63;

/// The bit the operations' field carries into once it wraps: cleared by
/// the drain that sees it ([`clear_overflow`]), 2^30 operations before it
/// could carry again.
pub(super) const OVERFLOW: u64 = 1 << 62;

/// Where the operations' field begins.
const OPS_SHIFT: u32 = 32;

/// The operations' field, once shifted down.
pub(super) const OPS_MASK: u32 = (1 << 30) - 1;

/// What one add counts: `n` operations costing `cost` together. The cost
/// of one add is kept below 2^32 (a larger one could not be told from a
/// wrap) and its operations below 2^30.
#[inline(always)]
pub(super) fn tally(cost: u64, n: u64) -> u64 {
    cost.min(u64::from(u32::MAX)) | n.min(u64::from(OPS_MASK)) << OPS_SHIFT
}

/// The cost field of a counter word.
#[inline(always)]
pub(super) fn cost_of(word: u64) -> u32 {
    word as u32
}

/// The operations' field of a counter word.
#[inline(always)]
pub(super) fn ops_of(word: u64) -> u32 {
    (word >> OPS_SHIFT) as u32 & OPS_MASK
}

/// The attempted operations of a pair's two counter words (admitted and
/// rejected), modulo 2^30.
#[inline]
pub(super) fn attempted_ops(admitted: u64, rejected: u64) -> u32 {
    ops_of(admitted).wrapping_add(ops_of(rejected)) & OPS_MASK
}

/// How many operations were counted between two readings of the
/// operations' field (or of two fields' sums).
#[inline(always)]
pub(super) fn ops_between(before: u32, after: u32) -> u32 {
    after.wrapping_sub(before) & OPS_MASK
}

/// Clears a counter word's overflow bit when `word`, just read, has it:
/// one locked instruction per 2^30 operations (the drain's).
pub(super) fn clear_overflow(counter: &std::sync::atomic::AtomicU64, word: u64) {
    if word & OVERFLOW != 0 && word & RETIRED == 0 {
        counter.fetch_and(!OVERFLOW, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    use super::*;

    #[test]
    fn one_add_counts_the_cost_and_the_operations() {
        let counter = AtomicU64::new(0);
        counter.fetch_add(tally(51, 1), Relaxed);
        counter.fetch_add(tally(1, 1), Relaxed);
        counter.fetch_add(tally(5 * 51, 5), Relaxed);
        let word = counter.load(Relaxed);
        assert_eq!(cost_of(word), 51 + 1 + 255);
        assert_eq!(ops_of(word), 7);
    }

    #[test]
    fn an_add_is_kept_within_its_fields() {
        let word = tally(u64::MAX, u64::MAX);
        assert_eq!(cost_of(word), u32::MAX);
        assert_eq!(ops_of(word), OPS_MASK);
        assert_eq!(word & (RETIRED | OVERFLOW), 0);
    }

    #[test]
    fn a_wrapping_cost_carries_one_operation_and_differences_stay_exact() {
        let counter = AtomicU64::new(tally(u64::from(u32::MAX) - 10, 3));
        let before = counter.load(Relaxed);
        counter.fetch_add(tally(100, 2), Relaxed);
        let after = counter.load(Relaxed);
        assert_eq!(cost_of(after).wrapping_sub(cost_of(before)), 100);
        // Two operations, and the carry of the cost's wrap.
        assert_eq!(ops_between(ops_of(before), ops_of(after)), 3);
    }

    #[test]
    fn wrapping_operations_reach_the_overflow_bit_and_a_drain_clears_it() {
        let counter = AtomicU64::new(tally(7, u64::from(OPS_MASK)));
        let before = counter.load(Relaxed);
        counter.fetch_add(tally(3, 2), Relaxed);
        let word = counter.load(Relaxed);
        assert_ne!(word & OVERFLOW, 0);
        assert_eq!(word & RETIRED, 0);
        assert_eq!(ops_between(ops_of(before), ops_of(word)), 2);
        clear_overflow(&counter, word);
        let cleared = counter.load(Relaxed);
        assert_eq!(cleared & OVERFLOW, 0);
        assert_eq!((cost_of(cleared), ops_of(cleared)), (10, 1));
    }
}
