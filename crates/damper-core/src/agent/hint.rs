//! Sparse hints: what one agent can say about a flood of costly operations
//! spread so thin that no agent alone can call it.
//!
//! A publish to 50 subscribers costs 51; an account held at 2 000 cost/s
//! is 39 such operations a second. Spread over 40 agents, a 5× flood of
//! them is five operations a second on each, one per 200-ms sub-window,
//! against one every two seconds before it: any one sub-window of one
//! agent holds one operation or none, as chance does too, and the surge
//! test ([`SurgeRule::is_surge`](super::SurgeRule::is_surge)) never fires.
//! The flood waited for whole rounds: 4–5 s at 2.6–3× the limit.
//!
//! Each agent can still tell that *something* is unusual: four operations
//! within 400 ms where its rate expects 0.2 happen by chance once in
//! 18 000 such spans. That is a *hint*, not a rate: a chance hint is
//! rare, but across thousands of sparse pairs it happens, and one agent's
//! evidence is a handful of operations. So a hint moves nothing. The
//! master counts the agents that hint for one pair at once; several within
//! half a second are far beyond chance, and it polls every agent for the
//! pair (see `damper_core::master`), whose answers sum to the account's
//! rate over the last few hundred milliseconds from every agent.
//!
//! The test, at each scan of the sub-window grid (every 100 ms): over the
//! span of the sub-window just closed and the one before it (400 ms), or
//! at a peek the last whole sub-window and the half since (300 ms), the
//! operations counted (cost over the pair's learnt cost per operation) are
//! tested against a Poisson count at the rate the master last heard from
//! this agent, never less than one operation per round: a hint when the
//! count is that high by chance at most [`HINT_ALPHA`] of the time, and at
//! least [`HINT_MIN_OPS`] and twice that rate, and above the pair's own
//! measured noise (traffic in lumps is not Poisson). A pair no rollup has
//! reported yet rises from nothing whatever it does, and hints only when
//! its rate alone is [`HINT_NEW_SHARE`] of its limit and its traffic is
//! sparse itself. Only for sparse pairs (at
//! most [`SPARSE_OPS`] operations per sub-window at that rate: denser ones
//! are the surge test's), not suppressed, not reported early this round,
//! whose cost per operation the scans have learnt. A pair that hinted
//! does not hint again until its evidence has gone (a scan closes without
//! it), so one burst is one hint.

use std::sync::atomic::Ordering::Relaxed;

use super::entry::{Entry, HINTED};
use crate::wire::SurgeRates;

/// The most a hint test may fire by chance, per test of a pair at its
/// rate: with tests every 100 ms on overlapping spans, about 2.6 chance
/// hints per 10 000 seconds of a pair at one operation per round (from a
/// model of Poisson arrivals, confirmed by the simulator's quiet
/// scenarios), while a 10× rise is hinted within 0.2–0.3 s by most agents.
pub const HINT_ALPHA: f64 = 1e-4;

/// A pair is sparse, and tested for hints, while its rate expects at most
/// this many operations per sub-window: above it the surge test's noise
/// is that of a count large enough for a jump to stand out on one agent.
pub const SPARSE_OPS: f64 = 2.0;

/// How improbable a suppressed sparse pair's run of empty sub-windows must
/// be at the rate its master holds for this agent to hint a fall, under a
/// mild factor (below [`DEEP_FALL_FROM`]): at one operation per
/// sub-window, four in a row (0.8 s). Each agent's chance fall hints come
/// about three times a minute during a flood (measured in `costly-flood`:
/// 0.047 a second), so its master needs several agents at once
/// ([`crate::window::hints_needed`]). At 0.01 (five in a row) a flood's end
/// reached its last agent more than a second after it in 42 of 160 seeds
/// of `costly-flood` (median 0.95 s); at 0.02, in 17 (median 0.85 s), most
/// of them a message to one agent lost.
pub const FALL_ALPHA: f64 = 0.02;

/// [`FALL_ALPHA`] under a deep factor: at one operation per sub-window,
/// three empty ones in a row (0.6 s). A deep factor is a flood's, whose
/// end refuses most of what comes until it is released: `costly-flood`'s
/// last agent was released more than a second after the flood in 1 of
/// 160 seeds rather than 17 (median 0.75 s rather than 0.85), for two and
/// a half times the chance hints while it floods (5% more RPCs then). A
/// mild factor's late release refuses little, and its chance hints would
/// cost traffic where nothing floods (`near-limit-small`'s account at
/// 1.1× of its limit: 2% more RPCs), so it keeps the stricter test.
pub const DEEP_FALL_ALPHA: f64 = 0.05;

/// The master's factor from which a pair's fall is tested at
/// [`DEEP_FALL_ALPHA`].
pub const DEEP_FALL_FROM: f64 = 0.5;

/// The fall test's chance per test for a pair under `factor`.
pub fn fall_alpha(factor: f64) -> f64 {
    if factor >= DEEP_FALL_FROM {
        DEEP_FALL_ALPHA
    } else {
        FALL_ALPHA
    }
}

/// The fewest operations a hint stands on: fewer are chance on some agent
/// of a large fleet all the time.
pub const HINT_MIN_OPS: u32 = 3;

/// How far above the rate the master last heard a hint's rate must be:
/// traffic that merely wanders is no flood.
const HINT_RISE: f64 = 2.0;

/// The share of its limit a pair no rollup has reported yet must reach on
/// this agent alone to hint: every new pair rises from nothing, and a node
/// sees new accounts all the time; a sixteenth of the account's limit on
/// one agent is a flood's share over a few dozen agents, and few accounts
/// start so.
pub const HINT_NEW_SHARE: f64 = 1.0 / 16.0;

/// How many of the pair's own measured sub-window noise a hint's rate must
/// stand above the rate the master heard. Poisson traffic's noise is the
/// counting noise the tail already weighs, and this passes it (the span is
/// two sub-windows, whose mean moves by 1/√2 of one's); traffic that comes
/// in lumps (a batch of operations at once, every 250 ms) moves far more
/// than its count says, and hinted by the tail alone.
const HINT_NOISE_SIGMAS: f64 = 2.0;

/// Counts below this many operations are weighed by their Poisson tail
/// ([`beyond_chance`]), larger ones by the normal law.
const EXACT_BELOW: f64 = 50.0;

/// Whether a count of `ops` operations, where a Poisson count of mean
/// `due` was expected, is more than chance: its Poisson tail at most
/// `alpha` below `EXACT_BELOW` (50) operations (where the normal law misjudges
/// small counts), else `sigmas` standard deviations (`√due`) above `due`.
/// The local guard's windows and the master's counted surges both weigh
/// their counts by it.
pub fn beyond_chance(ops: f64, due: f64, sigmas: f64, alpha: f64) -> bool {
    if ops <= due {
        return false;
    }
    if ops < EXACT_BELOW {
        poisson_tail(due, ops as u32) <= alpha
    } else {
        ops - due > sigmas * due.sqrt()
    }
}

/// `P(N ≥ n)` for `N` a Poisson count of mean `mu`.
pub fn poisson_tail(mu: f64, n: u32) -> f64 {
    if n == 0 {
        return 1.0;
    }
    if mu <= 0.0 {
        return 0.0;
    }
    // 1 − P(N < n), summed term by term; the terms are small integers'
    // powers and factorials, exact enough in f64 for tails down to 1e-12.
    let mut term = (-mu).exp();
    let mut below = term;
    for k in 1..n {
        term *= mu / f64::from(k);
        below += term;
    }
    (1.0 - below).max(0.0)
}

/// `P(Z ≥ z)` for `Z` of the standard normal law: the chance a test of
/// `z` standard deviations leaves, for counts [`beyond_chance`] weighs by
/// their Poisson tail (`normal_tail(3.0)` = 1.35e-3). By the complementary
/// error function's Chebyshev fit (relative error under 1.2e-7 for every
/// `z`).
pub fn normal_tail(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * x);
    let poly = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ]
    .iter()
    .rev()
    .fold(0.0, |acc, c| c + t * acc);
    let erfc = t * (-x * x + poly).exp();
    if z >= 0.0 {
        erfc / 2.0
    } else {
        1.0 - erfc / 2.0
    }
}

/// What a hint test is given of one pair at one scan.
#[derive(Clone, Copy, Debug)]
pub(super) struct HintSpan {
    /// Cost attempted over the span.
    pub(super) cost: f64,
    /// The span's length, seconds.
    pub(super) secs: f64,
    /// The sub-window's length, seconds.
    pub(super) window: f64,
    /// The rollup interval, seconds: the least rate a pair is tested
    /// against is one operation per round.
    pub(super) interval: f64,
    /// Whether the scan closes a sub-window: only a close lets go of a
    /// hint whose evidence has gone.
    pub(super) close: bool,
    /// The pair's own sub-window noise as the scans measured it, as the
    /// bits of `surge_noise` (a mean squared step: half of it is a
    /// variance, cost per second squared): traffic that comes in lumps is
    /// not Poisson, and must rise further.
    pub(super) steps: u32,
    /// The pair's limit, cost per second, when known.
    pub(super) limit: Option<f64>,
    /// Whether the pair had traffic in the sub-window before the current
    /// one: a new pair's span reaches back before the pair, and reads
    /// sparse when it is not.
    pub(super) covered: bool,
}

impl Entry {
    /// This pair's sparse hint over `span`, against `baseline` (the rate
    /// the master last heard from this agent, cost per second), if its
    /// operations there are more than chance (see the module docs). A
    /// pair that hinted is not offered again while its evidence stands; a
    /// close without it lets it hint again. The caller sets [`HINTED`]
    /// when the hint is taken.
    #[inline]
    pub(super) fn sparse_hint(&self, baseline: f64, span: HintSpan) -> Option<SurgeRates> {
        let quantum = f64::from(self.op_cost());
        if quantum == 0.0 || span.secs <= 0.0 {
            return None;
        }
        // Fewer operations than any hint stands on: most pairs at most
        // scans, told apart before any division.
        if span.cost < f64::from(HINT_MIN_OPS) * quantum - 0.5 {
            self.hint_stands(span.close);
            return None;
        }
        let expected = baseline.max(quantum / span.interval);
        if expected * span.window / quantum > SPARSE_OPS {
            return None;
        }
        let ops = (span.cost / quantum).round();
        let rate = span.cost / span.secs;
        // A pair no rollup has reported yet rises from nothing whatever it
        // does: it hints only when its own rate is a good share of its
        // limit, and its traffic is sparse itself (denser new pairs are the
        // young peeks' and the surge test's).
        let new_share = || {
            span.covered
                && span.limit.is_some_and(|l| rate >= HINT_NEW_SHARE * l)
                && ops <= 2.0 * SPARSE_OPS * span.secs / span.window
        };
        let evident = (self.was_reported() || new_share())
            && ops >= f64::from(HINT_MIN_OPS)
            && rate >= HINT_RISE * expected
            && rate - expected
                > HINT_NOISE_SIGMAS * (f64::from(f32::from_bits(span.steps)) / 2.0).sqrt()
            && poisson_tail(expected * span.secs / quantum, ops as u32) <= HINT_ALPHA;
        if self.hint_stands(span.close && !evident) {
            return None;
        }
        evident.then_some(SurgeRates {
            rate: rate as f32,
            baseline: baseline as f32,
            hint: true,
            ops: ops as u32,
            ..SurgeRates::default()
        })
    }
}

impl Entry {
    /// This suppressed pair's sparse fall hint, against `told` (the rate
    /// its master holds for this agent, cost per second), over sub-windows
    /// of `window` seconds: when the run of sub-windows it closed empty is
    /// one its rate gives at most [`fall_alpha`] of the time under its
    /// master's factor (see the module docs). Sparse pairs only; one whose evidence stands does not
    /// hint again, and lets go of it once an operation comes. The caller
    /// sets [`HINTED`] when the hint is taken.
    pub(super) fn sparse_fall_hint(&self, told: f64, window: f64) -> Option<SurgeRates> {
        let alpha = fall_alpha(self.master_factor_held());
        let quantum = f64::from(self.op_cost());
        if quantum == 0.0 || told <= 0.0 {
            return None;
        }
        let per_window = told * window / quantum;
        if per_window > SPARSE_OPS {
            return None;
        }
        let run = self.empty_run();
        let evident = f64::from(run) * per_window >= (1.0 / alpha).ln();
        if self.hint_stands(!evident) {
            return None;
        }
        evident.then_some(SurgeRates {
            rate: 0.0,
            baseline: told as f32,
            hint: true,
            ..SurgeRates::default()
        })
    }

    /// Whether this pair's last hint stood at this scan ([`HINTED`]): if
    /// so, it offers no other, and lets go of it when `gone` (its
    /// evidence has gone), so the next burst may hint again.
    fn hint_stands(&self, gone: bool) -> bool {
        let stands = self.scanned(HINTED);
        if stands && gone {
            self.set_scanned(HINTED, false);
        }
        stands
    }

    /// Whether a rollup has taken counts of this pair: until then its
    /// master has heard no rate of it from this agent, and whatever comes
    /// reads as a rise from nothing.
    fn was_reported(&self) -> bool {
        self.drained_admitted.load(Relaxed) != 0 || self.drained_rejected.load(Relaxed) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::entry::Entry;
    use crate::agent::surge::Quantum;

    #[test]
    fn poisson_tails_are_right() {
        assert_eq!(poisson_tail(0.3, 0), 1.0);
        assert_eq!(poisson_tail(0.0, 1), 0.0);
        // 1 − e^(−μ)
        assert!((poisson_tail(0.5, 1) - (1.0 - (-0.5f64).exp())).abs() < 1e-15);
        // P(N ≥ 4 | 0.2) = 5.684e-5 (tables)
        assert!((poisson_tail(0.2, 4) / 5.684e-5 - 1.0).abs() < 1e-3);
        // P(N ≥ 10 | 3) = 1.102e-3
        assert!((poisson_tail(3.0, 10) / 1.102e-3 - 1.0).abs() < 1e-3);
    }

    /// An entry whose operations cost 51, as two sub-windows taught it,
    /// reported in a rollup before.
    fn costly() -> Entry {
        let entry = Entry::default();
        entry.drained_admitted.store(51, Relaxed);
        entry
            .quantum
            .store(Quantum::seeded(51).learn(51).0, Relaxed);
        entry
    }

    fn span(ops: u32, close: bool) -> HintSpan {
        HintSpan {
            cost: f64::from(ops * 51),
            secs: 0.4,
            window: 0.2,
            interval: 2.0,
            close,
            steps: 0,
            limit: Some(2_000.0),
            covered: true,
        }
    }

    #[test]
    fn a_few_costly_operations_beyond_chance_hint_once() {
        let entry = costly();
        // One operation a round (25.5/s): four within 400 ms are a hint,
        // three are not (P = 1.1e-3).
        assert_eq!(entry.sparse_hint(25.5, span(3, true)), None);
        let hint = entry.sparse_hint(25.5, span(4, true)).unwrap();
        assert!(hint.hint && !hint.surged && hint.ops == 4);
        assert_eq!(hint.rate, 510.0);
        entry.set_scanned(HINTED, true);
        // Hinted: not again while the evidence stands, even at a peek
        // without it; a close without it lets go.
        assert_eq!(entry.sparse_hint(25.5, span(5, true)), None);
        assert_eq!(entry.sparse_hint(25.5, span(1, false)), None);
        assert!(entry.scanned(HINTED));
        assert_eq!(entry.sparse_hint(25.5, span(1, true)), None);
        assert!(!entry.scanned(HINTED));
        assert!(entry.sparse_hint(25.5, span(4, true)).is_some());
    }

    #[test]
    fn a_suppressed_pairs_empty_run_too_long_for_its_rate_hints_a_fall() {
        let entry = costly();
        // Told 255/s: one operation per 200-ms sub-window. Three empty in
        // a row happen once in 20 runs; four, once in 55: a fall.
        for _ in 0..3 {
            entry.note_empty(true);
        }
        assert_eq!(entry.sparse_fall_hint(255.0, 0.2), None);
        entry.note_empty(true);
        let hint = entry.sparse_fall_hint(255.0, 0.2).unwrap();
        assert!(
            hint.hint && hint.rate == 0.0 && hint.baseline == 255.0,
            "{hint:?}"
        );
        entry.set_scanned(HINTED, true);
        // Not again while the run lasts; an operation lets go.
        entry.note_empty(true);
        assert_eq!(entry.sparse_fall_hint(255.0, 0.2), None);
        entry.note_empty(false);
        assert_eq!(entry.empty_run(), 0);
        assert_eq!(entry.sparse_fall_hint(255.0, 0.2), None);
        assert!(!entry.scanned(HINTED));
        // Sparser (told 51/s, a fifth of an operation per sub-window): a
        // run that unlikely is 20 sub-windows, more than the 15 the scans
        // count; such a pair's end is its rounds'.
        let sparse = costly();
        for _ in 0..20 {
            sparse.note_empty(true);
        }
        assert_eq!(sparse.empty_run(), 15);
        assert_eq!(sparse.sparse_fall_hint(51.0, 0.2), None);
        // Dense (told 2 550/s, ten a sub-window): the surge test's.
        let dense = costly();
        for _ in 0..15 {
            dense.note_empty(true);
        }
        assert_eq!(dense.sparse_fall_hint(2_550.0, 0.2), None);
    }

    #[test]
    fn dense_pairs_and_unknown_costs_never_hint() {
        // Cost unknown (fewer than two sub-windows taught it).
        let entry = costly();
        entry.quantum.store(Quantum::seeded(51).0 & 0x3fff, Relaxed);
        assert_eq!(entry.sparse_hint(25.5, span(8, true)), None);
        // Never reported: its master has no rate of it from this agent,
        // and 8 operations in 400 ms are 1 020/s, under a sixteenth of a
        // limit of 20 000/s; over one of 2 000/s, a hint.
        let entry = costly();
        entry.drained_admitted.store(0, Relaxed);
        let big_limit = HintSpan {
            limit: Some(20_000.0),
            ..span(8, true)
        };
        assert_eq!(entry.sparse_hint(25.5, big_limit), None);
        assert!(entry.sparse_hint(25.5, span(8, true)).is_some());
        // Nor when its traffic is dense: 9 operations in 400 ms is more
        // than four a sub-window.
        assert_eq!(entry.sparse_hint(25.5, span(9, true)), None);
        // Nor when its span reaches back before it.
        let first = HintSpan {
            covered: false,
            ..span(8, true)
        };
        assert_eq!(entry.sparse_hint(25.5, first), None);
        // 11 operations per sub-window at its rate: the surge test's.
        let entry = costly();
        assert_eq!(entry.sparse_hint(2_805.0, span(40, true)), None);
        // Sparse but near it (two per sub-window, 510/s): 12 operations
        // in 400 ms are chance once in 2 500; 14 are a hint.
        assert_eq!(entry.sparse_hint(510.0, span(12, true)), None);
        assert!(entry.sparse_hint(510.0, span(14, true)).is_some());
    }
}
