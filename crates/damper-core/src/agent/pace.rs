//! Pacing: what a deeply suppressed pair admits follows the share of the
//! rate its agent told the master, not the share of what comes.
//!
//! Under a factor `f` the credit (see `admission`) keeps a pair's admitted
//! cost at `(1 − f)` of its attempted cost, within a few operations. That
//! passes the attempted cost's own noise on to the admitted: the master
//! computed `f = 1 − L / D` from the rates the agents reported for one
//! round, `D = Σ dᵢ`, and in the next round the agents admit
//! `(1 − f)·Σ Aᵢ = L·A / D`, where `A` is that round's attempted cost, a
//! Poisson count as noisy as `D` was. For an account of costly operations
//! spread over many agents (a few hundred operations a round) that is
//! 5–7% a round, whatever the admission rule.
//!
//! Each agent knows its own `dᵢ`: the rate it told the master, which the
//! factor answers. Paced, agent `i` admits at the rate `(1 − f)·dᵢ`, and
//! the agents together at `(1 − f)·D = L`: the limit exactly, with none of
//! the round-to-round noise. At each sub-window's end the scan moves the
//! pair's credit from following `(1 − f)` of what was attempted in it to
//! following `(1 − f)·dᵢ` of its length; the checks still decide by the
//! credit, so within the sub-window nothing on the hot path changes.
//!
//! Only by a rate a whole round measured: while the master holds an early
//! report's rate for this agent (a sub-window's, which traffic that comes
//! in lumps reads at up to twice its rate), the pair keeps the share of
//! what comes. Nor in the sub-window in which the factor arrived, under
//! it for part of its length only. And only under a master's factor of
//! [`PACE_FROM`] or more: an agent then attempts a quarter more than it
//! may admit, or more, so a round in which its own traffic came in a
//! little low still reaches its paced rate. Under a milder factor the
//! pace would hold each agent to nearly its last round, and an agent whose
//! traffic rose by chance would be refused what the rest did not use;
//! unless the agent sees so many of the pair's operations that its own
//! count seldom falls under the pace ([`DENSE_PACE_FROM`]).
//! (From 0.5 until 26 November 2026: the factors between 0.2 and 0.5
//! passed each step of a climbing demand on until the next round, 1.1%
//! over the limit in `ramp` and 1.0% in `creeping-loss`, 0.3% each
//! paced; see docs/simulation.md, "Pacing, before and after".) The credit is kept within
//! the band where decisions depend on it, widened by [`PACE_SLACK`]
//! sub-windows of the pace: a lull does not bank admissions for a burst
//! later, nor does a burst owe refusals for long. Out of suppression the
//! credit is cleared, so nothing carries into the next flood.

use std::sync::atomic::Ordering::Relaxed;

use super::admission;
use super::entry::{Entry, PACED, factor_of};
use super::frozen::word_factor;
use crate::time::Nanos;

/// The least master's factor under which a pair is paced, from the
/// second sub-window under it: a demand a quarter over the limit.
pub const PACE_FROM: f64 = 0.2;

/// The least factor under which a pair whose agent sees many operations
/// is paced: one that told `n` operations a round is paced under a
/// factor `f` of this or more when `f·√n` is at least [`DENSE_MARGIN`],
/// its pace so far under what it told that its own Poisson count seldom
/// falls under it. `ramp`'s climb through 1 200 a second (a factor of
/// 0.17, 60 operations a second on each agent) is paced so; a small
/// account of a few operations a second on each agent is not, which paced
/// from 0.1 alike admitted 2% under its limit.
pub const DENSE_PACE_FROM: f64 = 0.1;

/// See [`DENSE_PACE_FROM`]: the pace sits this many standard deviations
/// of the round's count under what the agent told.
pub const DENSE_MARGIN: f64 = 1.5;

/// Whether a pair is paced under `factor`, its agent having told `n`
/// operations a round.
pub fn paced_under(factor: f64, n: f64) -> bool {
    (PACE_FROM..1.0).contains(&factor)
        || ((DENSE_PACE_FROM..1.0).contains(&factor) && factor * n.max(0.0).sqrt() >= DENSE_MARGIN)
}

/// How many sub-windows of the pace the credit may run ahead or behind
/// beyond the admission band: traffic that comes in lumps (a batch every
/// 250 ms seen through 200-ms sub-windows) moves it by about one either
/// way, and clipping lumps unevenly would bias what is admitted.
pub const PACE_SLACK: f64 = 2.0;

impl Entry {
    /// At the end of a sub-window `secs` long in which `cost` was
    /// attempted, of rounds `interval` long: paces the pair if its master
    /// suppresses it enough ([`paced_under`]; and the local guard no
    /// more), at the share
    /// it may keep of `told`, the rate (cost per second) this agent's last
    /// rollup told the master (`None` while the master holds an early
    /// report's instead); clears its credit if no factor is in force.
    /// With `freeze`, a sparse paced pair's next sub-window is decided by
    /// a frozen probability (see [`frozen`](super::frozen)). Scanner only.
    pub(super) fn pace(
        &self,
        now: Nanos,
        told: Option<f32>,
        secs: f64,
        interval: f64,
        cost: u32,
        freeze: bool,
    ) {
        let word = self.master_word_at(now);
        let master = word_factor(word);
        let local = self.local_factor.load(Relaxed);
        if master == 0 && local == 0 {
            admission::clear(&self.credit);
        }
        let factor = factor_of(master);
        let one = self.one();
        let told = told.filter(|rate| {
            paced_under(factor, f64::from(*rate) * interval / one) && local <= master
        });
        let was_paced = self.scanned(PACED);
        self.set_scanned(PACED, told.is_some());
        let keep = 1.0 - factor;
        if was_paced && told.is_none() && factor > 0.0 {
            // No longer paced because the master holds an early report's
            // rate (a milder factor was dealt with when it came, by
            // `unpace`).
            self.back_in_band(keep);
        }
        // The sub-window in which the factor arrived was under it for
        // part of its length only: pacing it whole would admit up to a
        // sub-window's pace more, on every agent at once.
        let Some(told) = told.filter(|_| was_paced) else {
            self.thaw();
            return;
        };
        let expected = f64::from(told) * secs;
        let target = keep * expected;
        admission::retarget(
            &self.credit,
            keep,
            target,
            f64::from(cost),
            one,
            PACE_SLACK * target,
        );
        if freeze {
            self.freeze(word, keep, expected, one);
        } else {
            self.thaw();
        }
    }

    /// A master's new `factor` has come: if it is too mild to pace by
    /// whatever the pair's count (under [`PACE_FROM`]; a dense pair still
    /// paced under it is paced again at the next scan, its slack gone),
    /// the credit goes back within the admission band at once, without
    /// the pace's slack. A flood that stops leaves its last sub-windows
    /// short of the pace, and what they banked (up to [`PACE_SLACK`]
    /// sub-windows of it) would otherwise admit everything under the new
    /// factor until it ran out, and then refuse again: an account seen
    /// released that is not. Any thread: the credit moves by `fetch_add`.
    pub(super) fn unpace(&self, factor: f64) {
        if factor > 0.0 && factor < PACE_FROM && self.scanned(PACED) {
            self.back_in_band(1.0 - factor);
        }
    }

    /// Puts the credit back within the admission band for keeping `keep`,
    /// without the pace's slack.
    fn back_in_band(&self, keep: f64) {
        admission::retarget(&self.credit, keep, 0.0, 0.0, self.one(), 0.0);
    }

    /// The cost of one operation, as the scans learnt it (1 until they
    /// have).
    fn one(&self) -> f64 {
        f64::from(self.op_cost().max(1))
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

    /// An agent (pacing `pace`) that told its master 1 000/s for the
    /// round to 2 s and was then suppressed by `factor` under `limit`,
    /// with the random source it used.
    fn told_then_suppressed(
        pace: bool,
        factor: f64,
        limit: f64,
        seed: u64,
    ) -> (AgentState, SmallRng) {
        let state = AgentState::new(AgentConfig {
            pace,
            ..AgentConfig::default()
        });
        let mut rng = SmallRng::seed_from_u64(seed);
        assert_eq!(round(&state, 0, 2_000, &mut rng), 2_000);
        state.drain(at(2_000), |_, _, _| {});
        suppress(&state, 2_000, factor, limit);
        (state, rng)
    }

    /// What the pair admits of `ops` operations in the round after it
    /// told 1 000/s and was suppressed by `factor`, under a limit this
    /// agent alone is far from, so the local guard stays out.
    fn admitted_far_from_its_limit(factor: f64, ops: u64, seed: u64) -> u64 {
        let (state, mut rng) = told_then_suppressed(true, factor, 100_000.0, seed);
        round(&state, 2_000, ops, &mut rng)
    }

    /// The master's verdict at `ms`: `factor` under `limit`, for 10 s.
    fn suppress(state: &AgentState, ms: u64, factor: f64, limit: f64) {
        let valid = Duration::from_secs(10);
        state.apply(at(ms), "acme", "messages", factor, limit, valid);
    }

    /// Runs `ops` operations of cost 1, evenly, from `from` ms for 2 s,
    /// scanning every 200 ms as the round does; returns the cost admitted.
    fn round(state: &AgentState, from: u64, ops: u64, rng: &mut SmallRng) -> u64 {
        let rule = SurgeRule::default_for(Duration::from_secs(2));
        let mut admitted = 0;
        let mut next_scan = from + 200;
        for i in 0..ops {
            let ms = from + i * 2_000 / ops;
            while ms >= next_scan {
                state.scan_surges(at(next_scan - 200), at(next_scan), &rule, |_, _| false);
                next_scan += 200;
            }
            if state.check(at(ms), "acme", "messages", 1, rng).is_admit() {
                admitted += 1;
            }
        }
        while next_scan <= from + 2_000 {
            state.scan_surges(at(next_scan - 200), at(next_scan), &rule, |_, _| false);
            next_scan += 200;
        }
        admitted
    }

    /// Told 1 000/s and suppressed by 0.8: whether 4 000 or 1 000
    /// operations come in the next round, a paced pair admits about
    /// 0.2 × 1 000/s × 1.8 s = 360 from its second sub-window on (and in
    /// the first, under the factor for part of it only, the share of what
    /// came: 80 or 20), where the share of what comes is 800 or 200.
    #[test]
    fn a_paced_pair_admits_its_share_of_what_it_told_not_of_what_comes() {
        for (ops, paced, unpaced) in [(4_000, 420..540, 790..811), (1_000, 350..400, 190..211)] {
            for (pace, expected) in [(true, paced), (false, unpaced)] {
                let (state, mut rng) = told_then_suppressed(pace, 0.8, 1_000.0, ops);
                let admitted = round(&state, 2_000, ops, &mut rng);
                assert!(
                    expected.contains(&admitted),
                    "{ops} ops, pace {pace}: admitted {admitted}"
                );
            }
        }
    }

    /// Paced from a fifth: told 1 000/s and suppressed by 0.3, with 4 000
    /// operations coming, the pair admits 0.7 × 1 000/s × 0.2 s = 140 a
    /// sub-window once paced (the first two keep 0.7 of their 400: the
    /// one the factor arrived in, and the one the first pacing scan
    /// retargets the credit for), about 1 680 in all, where the share of
    /// what comes would be 2 800.
    #[test]
    fn a_pair_suppressed_by_a_third_is_paced() {
        let admitted = admitted_far_from_its_limit(0.3, 4_000, 4);
        assert!((1_600..1_760).contains(&admitted), "{admitted}");
    }

    /// A pair whose agent told 2 000 operations a round is paced under a
    /// factor of 0.15, its pace 6.7 standard deviations of that count under
    /// it: 4 000 coming, it admits 0.85 of 400 in each of its first two
    /// sub-windows and 0.85 × 200 in each of the eight after, about 2 040,
    /// where the share of what comes would be 3 400. One that told 40 a
    /// round is not.
    #[test]
    fn a_dense_pair_is_paced_under_a_mild_factor() {
        let admitted = admitted_far_from_its_limit(0.15, 4_000, 5);
        assert!((1_950..2_130).contains(&admitted), "{admitted}");
        assert!(paced_under(0.15, 2_000.0));
        assert!(!paced_under(0.15, 40.0));
        assert!(paced_under(0.25, 5.0), "from 0.2 whatever the count");
        assert!(!paced_under(0.05, 1e9), "never under 0.1");
        assert!(!paced_under(1.0, 1e9), "a factor of 1 refuses everything");
    }

    /// Under a mild factor the pair keeps the share of what comes: an agent
    /// whose traffic rose by chance is not held to its last round.
    #[test]
    fn a_mildly_suppressed_pair_is_not_paced() {
        let admitted = admitted_far_from_its_limit(0.05, 3_000, 1);
        assert!((2_840..2_861).contains(&admitted), "{admitted}");
    }

    /// A lull under the pace banks admissions up to the slack; a milder
    /// factor after it (the flood stopped: the master's estimate fell
    /// but not yet under the limit) keeps its share of what comes from
    /// its first sub-window, rather than admitting everything until the
    /// banked slack runs out and then refusing again.
    #[test]
    fn leaving_the_pace_leaves_its_slack_behind() {
        let (state, mut rng) = told_then_suppressed(true, 0.9, 1_000.0, 3);
        round(&state, 2_000, 2_000, &mut rng);
        state.drain(at(4_000), |_, _, _| {});
        // Almost nothing comes: each sub-window is short of the pace. The
        // round's rollup tells the master so (40 operations: too few to
        // pace by under a mild factor).
        round(&state, 4_000, 40, &mut rng);
        state.drain(at(6_000), |_, _, _| {});
        suppress(&state, 6_000, 0.15, 1_000.0);
        let admitted = round(&state, 6_000, 1_000, &mut rng);
        assert!((835..875).contains(&admitted), "{admitted}");
    }

    /// What a suppression owed is cleared once it ends: the next one
    /// starts from nothing rather than refusing the debt of the last.
    #[test]
    fn a_suppression_leaves_no_debt_to_the_next() {
        let (state, mut rng) = told_then_suppressed(true, 0.8, 1_000.0, 2);
        // Twice what was told, in lumps: the credit ends deep in debt.
        round(&state, 2_000, 4_000, &mut rng);
        let credit = |state: &AgentState| {
            let pinned = state.pairs.pin();
            pinned
                .find("acme", "messages")
                .unwrap()
                .credit
                .load(Relaxed)
        };
        assert!(credit(&state) < 0);
        suppress(&state, 4_000, 0.0, 1_000.0);
        round(&state, 4_000, 200, &mut rng);
        assert_eq!(credit(&state), 0);
    }
}
