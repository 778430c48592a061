//! Frozen admission: a sparse paced pair decides by one probability for a
//! whole sub-window, set at the sub-window's start from its credit.
//!
//! The credit rule (see `admission`) moves a pair's admission probability
//! after every operation, by its cost over `B` operations' worth: the
//! band that keeps periodic publishers from locking onto one another.
//! A pair that sees one or two operations a sub-window, a costly account
//! spread over many agents, pays for that band in full: its credit wanders
//! by about `c·√(B·a·(1 − a)/2)`, and the credits of 40 agents, read at a
//! 6-s bucket's edges, are most of what the admitted cost swings by.
//!
//! Paced (see `pace`), such a pair knows what it should admit in the next
//! sub-window: its share `a` of the rate it told its master, `A = told ×
//! length` of attempted cost, plus whatever credit `e` it owes. At each
//! sub-window's end the scan sets the probability for the next one,
//!
//! ```text
//! p = clamp(a + e / (A + c), 0, 1)
//! ```
//!
//! nearly all of the credit repaid in one sub-window (`A` against `A + c`:
//! the `c` damps the correction of a pair that expects about one operation,
//! which would otherwise swing from refusing everything to admitting
//! everything and back), and every operation in the sub-window is decided by `p`, whoever sends
//! it, in whatever order. The credit is still moved by every decision, so
//! the next sub-window's `p` repays exactly what this one strayed by, and
//! nothing is lost or gained over a round. Since no decision moves the
//! probability of the next within a sub-window, publishers taking turns
//! cannot lock onto one another there; across sub-windows the pace's
//! target is set by time, not by operations, which breaks the lock too.
//!
//! Modelled (40 agents, `a = 0.2`, Poisson arrivals, paced): the
//! admitted cost per 6-s bucket swings by 2.3% (σ) at one operation per
//! sub-window against 3.3% with the credit rule, and by 6.8% against 9.2%
//! at 0.3. From about three operations a sub-window on the credit rule is
//! the quieter (it follows a sub-window's own Poisson count, which a
//! frozen probability cannot), so pairs denser than [`FROZEN_MAX_OPS`]
//! keep it.
//!
//! Stored in the master's factor word (see `entry`), which otherwise holds
//! the factor's `f32` bits. Only pairs paced under a factor in `[0.5, 1)`
//! are frozen (those paced under a milder one keep the credit rule), and
//! there an `f32`'s sign and exponent are the same (`0x3F0…`):
//! a frozen word keeps the factor's 23-bit mantissa, exact, sets its top
//! bit to say it is frozen, and holds the probability in the 8 bits
//! between. A word without the flag is read exactly as before, so a pair
//! that is not frozen costs `check` nothing more than a test of one bit.
//! A new factor from the master replaces the word and so clears the
//! probability with it; a scan sets it by compare-and-swap on the word it
//! read, so it never outlives the factor it was set for.

use std::sync::atomic::Ordering::Relaxed;

use super::admission;
use super::entry::Entry;

/// The most operations a paced pair may expect in a sub-window (its told
/// rate times the length, over the cost of one) and still decide by a
/// frozen probability: above it the credit rule is the quieter.
pub const FROZEN_MAX_OPS: f64 = 3.0;

/// The flag of a frozen word: an `f32` factor's sign bit, never set in a
/// factor (stored clamped to `[0, 1]`).
const FROZEN: u32 = 1 << 31;
/// An `f32`'s mantissa: what a frozen word keeps of its factor.
const MANTISSA: u32 = (1 << 23) - 1;
/// The sign and exponent of every `f32` in `[0.5, 1)`.
const HALF_TO_ONE: u32 = 126 << 23;
/// Where the probability sits in a frozen word: the 8 exponent bits.
const P_SHIFT: u32 = 23;
/// The probability's steps: code `k` in `0..=255` stands for `k / 255`. A
/// step's rounding (at most 0.2%) is repaid by the credit in the next
/// sub-window, like any other stray.
const P_STEPS: f64 = 255.0;

/// The factor a master's word holds, as stored (`f32` bits; see
/// `entry::factor_bits`): the word itself unless it is frozen.
#[inline]
pub(super) fn word_factor(word: u32) -> u32 {
    if word & FROZEN == 0 {
        word
    } else {
        HALF_TO_ONE | (word & MANTISSA)
    }
}

/// The frozen probability a master's word holds, if any.
#[inline]
pub(super) fn word_frozen(word: u32) -> Option<f64> {
    (word & FROZEN != 0).then(|| f64::from((word >> P_SHIFT) & 0xFF) * (1.0 / P_STEPS))
}

/// The frozen word for the factor (as stored) `bits`, which must lie in
/// `[0.5, 1)`, with the probability `p` (clamped to `[0, 1]`).
fn frozen_word(bits: u32, p: f64) -> u32 {
    debug_assert_eq!(bits & !MANTISSA, HALF_TO_ONE);
    let code = (p.clamp(0.0, 1.0) * P_STEPS).round() as u32;
    FROZEN | (code << P_SHIFT) | (bits & MANTISSA)
}

impl Entry {
    /// At a paced sub-window's end, after the pace moved the credit: sets
    /// the next sub-window's frozen probability for keeping `keep` of the
    /// cost when `expected` (the told rate times the sub-window's length)
    /// is at most [`FROZEN_MAX_OPS`] operations of cost `one`, and clears
    /// it otherwise. `word` is the master's word the pace read: a factor
    /// come since leaves the word alone. Scanner only.
    pub(super) fn freeze(&self, word: u32, keep: f64, expected: f64, one: f64) {
        if expected > FROZEN_MAX_OPS * one {
            self.thaw();
            return;
        }
        let bits = word_factor(word);
        if bits & !MANTISSA != HALF_TO_ONE {
            // Outside [0.5, 1): not a factor the pace runs under.
            self.thaw();
            return;
        }
        let e = admission::credit_of(&self.credit);
        let p = keep + e / (expected + one);
        let frozen = frozen_word(bits, p);
        if frozen != word {
            let _ = self
                .master_factor
                .compare_exchange(word, frozen, Relaxed, Relaxed);
        }
    }

    /// Clears the frozen probability, if any: the pair decides by the
    /// credit rule again. Scanner only (a new factor clears it by
    /// replacing the word).
    pub(super) fn thaw(&self) {
        let word = self.master_factor.load(Relaxed);
        if word & FROZEN != 0 {
            let _ = self
                .master_factor
                .compare_exchange(word, word_factor(word), Relaxed, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;
    use crate::agent::tests::t as at;
    use crate::agent::{AgentConfig, AgentState, SurgeRule};

    /// An agent that told its master `per_s` operations of cost 1 a
    /// second for the round to 2 s, each in the middle of its 200-ms
    /// sub-window (scanned as the round does), then was suppressed by 0.8
    /// at 2 s; and the rule it scans by.
    fn told_then_suppressed(per_s: u64) -> (AgentState, SurgeRule, SmallRng) {
        let state = AgentState::new(AgentConfig::default());
        let rule = SurgeRule::default_for(Duration::from_secs(2));
        let mut rng = SmallRng::seed_from_u64(per_s);
        for window in 0..10 {
            sub_window(&state, &rule, window * 200, per_s / 5, &mut rng);
        }
        state.drain(at(2_000), |_, _, _| {});
        suppress(&state, 2_000);
        (state, rule, rng)
    }

    /// The master's verdict at `ms`: 0.8, for 10 s.
    fn suppress(state: &AgentState, ms: u64) {
        state.apply(
            at(ms),
            "acme",
            "messages",
            0.8,
            1_000.0,
            Duration::from_secs(10),
        );
    }

    /// `ops` checks in the middle of the sub-window from `from` ms, and
    /// its scan; how many were admitted.
    fn sub_window(
        state: &AgentState,
        rule: &SurgeRule,
        from: u64,
        ops: u64,
        rng: &mut SmallRng,
    ) -> u64 {
        let admitted = (0..ops)
            .filter(|_| {
                state
                    .check(at(from + 100), "acme", "messages", 1, rng)
                    .is_admit()
            })
            .count() as u64;
        state.scan_surges(at(from), at(from + 200), rule, |_, _| false);
        admitted
    }

    /// The pair's master word and credit.
    fn word_and_credit(state: &AgentState) -> (u32, f64) {
        let pinned = state.pairs.pin();
        let entry = pinned.find("acme", "messages").unwrap();
        (
            entry.master_factor.load(Relaxed),
            admission::credit_of(&entry.credit),
        )
    }

    /// Told one operation a sub-window and paced: from the second
    /// sub-window under the factor, each is decided by a probability set
    /// from the credit at its start, `0.2 + e / (1 + 1)`; a new factor
    /// clears it.
    #[test]
    fn a_sparse_paced_pair_decides_a_sub_window_by_one_probability() {
        let (state, rule, mut rng) = told_then_suppressed(5);
        sub_window(&state, &rule, 2_000, 1, &mut rng);
        assert_eq!(
            word_frozen(word_and_credit(&state).0),
            None,
            "not paced yet"
        );
        for window in 11..40 {
            sub_window(&state, &rule, window * 200, 1, &mut rng);
            let (word, e) = word_and_credit(&state);
            let p = word_frozen(word).expect("frozen");
            let expected = (0.2 + e / 2.0).clamp(0.0, 1.0);
            assert!((p - expected).abs() <= 0.5 / P_STEPS, "{p} for credit {e}");
        }
        suppress(&state, 8_000);
        assert_eq!(word_frozen(word_and_credit(&state).0), None);
    }

    /// Told 200 operations a sub-window, the pair keeps moving its
    /// probability after each operation.
    #[test]
    fn a_dense_paced_pair_is_not_frozen() {
        let (state, rule, mut rng) = told_then_suppressed(1_000);
        for window in 10..20 {
            sub_window(&state, &rule, window * 200, 200, &mut rng);
            assert_eq!(word_frozen(word_and_credit(&state).0), None);
        }
    }

    /// Publishers taking turns by sub-window (`A, A, B`: each probability
    /// set right after a given publisher's decision) each keep their share
    /// of the pace, within 5% and the binomial noise of their admissions
    /// at 4 σ, over 60 000 sub-windows.
    #[test]
    fn publishers_taking_turns_by_sub_window_each_keep_their_share() {
        let (state, rule, mut rng) = told_then_suppressed(5);
        let (mut kept, mut tried) = ([0u64; 2], [0u64; 2]);
        for window in 10..60_010 {
            if window % 10 == 0 {
                state.drain(at(window * 200), |_, _, _| {});
                suppress(&state, window * 200);
            }
            let publisher = usize::from(window % 3 == 2);
            tried[publisher] += 1;
            kept[publisher] += sub_window(&state, &rule, window * 200, 1, &mut rng);
        }
        for p in 0..2 {
            let share = kept[p] as f64 / tried[p] as f64 / 0.2;
            let noise = 4.0 * (0.8 / (tried[p] as f64 * 0.2)).sqrt();
            assert!(
                (share - 1.0).abs() <= 0.05 + noise,
                "publisher {p}: {share:.3}"
            );
        }
    }

    /// What the frozen probabilities admit follows the pace to within
    /// the credit's band over 200 s: every sub-window's stray is repaid by
    /// the next, none is lost.
    #[test]
    fn frozen_sub_windows_admit_the_pace_exactly_over_time() {
        let (state, rule, mut rng) = told_then_suppressed(5);
        let mut admitted = 0;
        for window in 10..1_010 {
            if window % 10 == 0 {
                // The round: the agent tells its rate again, the master
                // answers the same.
                state.drain(at(window * 200), |_, _, _| {});
                suppress(&state, window * 200);
            }
            admitted += sub_window(&state, &rule, window * 200, 1, &mut rng);
        }
        // 0.2 of 5 a second for 200 s, but the first sub-window's share
        // of what came (unpaced).
        assert!((195..=205).contains(&admitted), "{admitted}");
    }

    /// A frozen word keeps its factor exactly and its probability to
    /// within half a step; a factor's own bits are never read as frozen.
    #[test]
    fn the_word_keeps_the_factor_and_the_probability_apart() {
        use crate::agent::entry::factor_bits;
        for factor in [0.5, 0.6, 0.75, 0.8, 0.9, 0.999, 0.999_999_9] {
            let bits = factor_bits(factor);
            assert_eq!((word_factor(bits), word_frozen(bits)), (bits, None));
            for p in [0.0, 0.2, 0.5, 1.0] {
                let frozen = frozen_word(bits, p);
                assert_eq!(word_factor(frozen), bits, "{factor}");
                let back = word_frozen(frozen).unwrap();
                assert!((back - p).abs() <= 0.5 / P_STEPS, "{p} → {back}");
            }
        }
        for factor in [0.0, 1e-6, 0.25, 0.499, 1.0] {
            let bits = factor_bits(factor);
            assert_eq!((word_factor(bits), word_frozen(bits)), (bits, None));
        }
    }
}
