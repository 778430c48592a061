//! How sure a window is that its demand is over the limit.
//!
//! A round's demand is a sample: an account of Poisson operations at 0.95×
//! its limit reads above the limit in a good share of its rounds (a third
//! of them, for 47 operations a second of cost 101), and suppressing on
//! each of those refuses an account that kept to its limit. So a window
//! keeps, besides its rounds, how much whole rounds differ from one
//! another when nothing happens ([`Spread::noise`]) and a slower average
//! of them ([`Spread::long`]), and the master suppresses only when the
//! demand is over the limit by more than [`CONFIDENCE_SIGMAS`] times its
//! own noise: a deluge at once, from one round; a mild overload once the
//! slow average has seen enough rounds to tell it from chance.
//!
//! The noise is measured, not modelled: it covers costly operations, mixed
//! costs and bursty publishers alike, without the master knowing what one
//! operation costs.

use serde::{Deserialize, Serialize};

use crate::agent::{CostBounds, beyond_chance, effective_cost, normal_tail};

/// How many standard deviations of its own noise a demand must be above
/// the limit to be suppressed, by default (`policy.confidence_sigmas`).
/// Five, not four: a round of few operations
/// is a Poisson count, whose upper tail is far heavier than a normal one
/// (38 operations expected, 64 seen: a 4.2σ event that happens once in
/// 10 000 rounds), and the noise itself is an estimate. A deluge is tens
/// of σ out.
pub const CONFIDENCE_SIGMAS: f64 = 5.0;

/// The weight of each whole round in the moving mean of the noise: about
/// 32 rounds (a minute at 2-s rounds) make an estimate, steady enough
/// that an underestimate rarely lets chance through.
const NOISE_WEIGHT: f64 = 1.0 / 32.0;

/// The weight of each whole round in the slow average: its noise is
/// `√(w / (2 − w))` ≈ 0.18 of a round's, enough to tell 1.1× from 0.95×
/// of a limit where single rounds scatter by 7%, within half a minute.
const LONG_WEIGHT: f64 = 1.0 / 16.0;

/// A change from one whole round to the next larger than this many times
/// the noise (and than [`NOISE_LEVEL_SHARE`] of the level) is a change of
/// demand, not noise: it enters the noise clipped to this, so one deluge
/// does not make every later round look uncertain for minutes.
///
/// 2.5, not more: a demand that climbs in steps (the `ramp` scenario:
/// +25–33% every 15 s) would otherwise leave each step in the noise, and
/// hide the overload it climbs into. Clipping a normal noise at 2.5σ
/// lowers its estimate by 3%.
const CLIP_SIGMAS: f64 = 2.5;

/// Changes up to this share of the demand's level always count in full
/// as noise; larger ones are clipped unless the noise already explains
/// them: see [`Spread::close`].
const NOISE_LEVEL_SHARE: f64 = 0.03;

/// How many changes between whole rounds make a noise estimate to trust:
/// the mean of fewer squared changes is too often far below the truth (of
/// three, a tenth of it one time in twenty). Before, only a demand over
/// the limit by the caller's margin suppresses: 16 s at 2-s rounds.
pub(super) const MIN_CHANGES: u16 = 8;

/// How much more than its estimate a round's noise may be, when the
/// estimate is a mean of `changes` squared changes, beyond what it may be
/// once the moving mean holds its steady count: `√(k / χ²(k, 0.001))` for
/// `k` of them (Wilson and Hilferty's approximation of the quantile), over
/// the same at the moving mean's effective count, `(2 − w) / w` = 63, where
/// it is 1.
///
/// The estimate is itself a draw. Over a window's first rounds (trusted
/// from eight changes, 16 s) it reads under half the true noise one time
/// in a hundred, and five of its standard deviations are then two of the
/// truth: in a model of 2 000 runs of 40 rounds each, accounts at 0.95×
/// their limits (47 cost-101 operations a second against 5 000/s, 95 of
/// cost 1 against 100, 18 against 20) were suppressed in 124 of 6 000
/// runs, most within ten rounds of the trust; in the simulator,
/// `near-limit-small` refused an account in 24 of 280 seeds. Allowed for,
/// 8 of 6 000 (the rest: the slow average's first rounds, see
/// [`long_noise_share`], and a round 1.5× over before any noise is known,
/// now weighed as a count of operations too: see
/// [`Spread::confidently_over`]).
/// Once the estimate rests on its
/// steady count, its rule is as it was, which no run of thousands of
/// rounds found wrong: an old account's overload of 1.1× a limit of
/// 100/s is suppressed as soon (32 rounds after it began, median), a new
/// one's at round 11 rather than 9. 2.37 at eight changes, 1.49 at 16,
/// 1.16 at 32.
fn estimate_allowance(changes: u16) -> f64 {
    fn bound(k: f64) -> f64 {
        const Z: f64 = 3.09; // the normal law's 99.9% quantile
        let a = 2.0 / (9.0 * k);
        (1.0 / (1.0 - a - Z * a.sqrt()).max(0.1).powi(3)).sqrt()
    }
    let steady = (2.0 - NOISE_WEIGHT) / NOISE_WEIGHT;
    bound(f64::from(changes).clamp(1.0, steady)) / bound(steady)
}

/// The slow average's noise as a share of one round's, after `rounds`
/// whole rounds: a plain mean of the first `1 / w` (16) of them, `1/√n`,
/// then a moving one, in which the plain mean's share fades as
/// `(1 − w)^(n − 16)` towards `√(w / (2 − w))` (0.18). Taken at its
/// steady value from the start, the slow average's chance swings in a
/// window's first rounds suppressed accounts at 0.95× their limits in the
/// model of [`estimate_allowance`] (7 of 6 000 runs with the allowance, 1
/// with this too). Until 27 November the average was a moving one from
/// its first round, which then weighed `(1 − w)^(n − 1)`, and its share
/// was 0.61 after nine rounds where a plain mean's is 1/3: a new account
/// of five publishes of 51 a second against 100/s (2.55×) was suppressed
/// only at 40 s, by 22 s as a plain mean, and by 12 s with its rounds
/// counted together before their scatter is known (see
/// [`Spread::confidently_over`]).
fn long_noise_share(rounds: u16) -> f64 {
    let plain = (1.0 / LONG_WEIGHT).round() as i32;
    let rounds = i32::from(rounds.max(1));
    if rounds <= plain {
        return 1.0 / f64::from(rounds).sqrt();
    }
    let keep = (1.0 - LONG_WEIGHT).powi(2 * (rounds - plain));
    let steady = LONG_WEIGHT / (2.0 - LONG_WEIGHT);
    (keep / f64::from(plain) + steady * (1.0 - keep)).sqrt()
}

/// The spread of whole rounds' demand, and their slow average.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Spread {
    /// Moving mean of the squared change between consecutive whole
    /// rounds, halved: the variance of one round's demand when demand is
    /// steady. 0 until two whole rounds in a row have been seen.
    pub(super) noise: f32,
    /// Mean of whole rounds' demand: plain over the first `1 / w` (16),
    /// then moving; 0 until one round closes.
    pub(super) long: f32,
    /// How many changes between whole rounds the noise has seen
    /// (saturating at 255, past every weight's plain start): the first
    /// ones are averaged plainly, so a young window learns its noise
    /// within a few rounds.
    #[serde(default, deserialize_with = "saturating_u8")]
    pub(super) changes: u8,
    /// The effective cost of the round before the current one, once its
    /// reports' costs differed ([`step_byte`]; 0: none): what the
    /// current round's was as it ended (see
    /// [`note_ops`](Self::note_ops)).
    #[serde(default)]
    pub(super) step_before: u8,
    /// The rounds' cost step: the greatest common divisor of the attempted
    /// cost of every report since the window began, in the low
    /// [`DIVISOR_BITS`] (0: none yet, or one too large to keep), and
    /// above [`STEP_BITS`] how many reports of more than it came (up to
    /// 2), or [`STEP_STATED`]: the cost of one operation as agents stated
    /// it (the costliest they stated), which reports' divisors no longer
    /// change; [`REFUSED`] once the reports belied a statement. An account
    /// whose operations all cost 51 reports multiples of 51, so a round's
    /// demand is a count of operations, and its chance scatter is known
    /// before the rounds have shown it (see
    /// [`confidently_over`](Self::confidently_over)). Mixed costs bring it
    /// to 1, where a count says as little as before. Two bytes the
    /// struct's alignment left free.
    #[serde(default)]
    pub(super) step: u16,
}

/// Where [`Spread::step`]'s count (or [`STEP_STATED`]) begins.
const STEP_BITS: u32 = 14;
/// The bits of [`Spread::step`] that hold the divisor: costs up to 8 191
/// (a publish to 8 190 subscribers; a statement of more is kept as this).
const DIVISOR_BITS: u32 = 13;
const DIVISOR_MASK: u16 = (1 << DIVISOR_BITS) - 1;
/// The bit of [`Spread::step`] that says the reports belied a statement
/// of one operation's cost: statements are ignored from then on (see
/// [`Spread::note_op_cost`]).
const REFUSED: u16 = 1 << DIVISOR_BITS;

/// How many reports of more than the divisor make it the cost step. One
/// report of 20 000 (one agent's deluge) is divided by 20 000, and two of
/// 600 and 3 600 by 600, yet neither is a few operations of that cost;
/// the counts of cost-1 operations of three reports share a divisor of
/// `d` one time in about `2d²`. Until then the step is taken as 1.
const STEP_CONFIRMED: u16 = 2;

/// The count above [`STEP_BITS`] that says the step is an agent's
/// statement of one operation's cost ([`Spread::note_op_cost`]), not a
/// divisor of reports. Snapshots taken before statements existed may hold
/// it for a divisor three reports confirmed: a confirmed step either way.
/// With [`REFUSED`], that the divisor's bits hold the reports' effective
/// cost ([`Spread::note_ops`]).
const STEP_STATED: u16 = 3;

/// The effective cost is kept in eighths: 1 to 1 023.875. A mix of
/// costlier operations is kept as the most this holds.
const EFFECTIVE_SCALE: f64 = 8.0;

/// The round before's effective cost is kept as `2^((k − 1) / 16)` in
/// one byte `k` (0: none), rounded up: steps of 4.4%, up to 61 000.
const BEFORE_STEPS: f64 = 16.0;

/// One byte's effective cost (see [`BEFORE_STEPS`]), rounded up.
fn step_byte(effective: f64) -> u8 {
    (1.0 + (BEFORE_STEPS * effective.max(1.0).log2()).ceil()).min(255.0) as u8
}

/// The effective cost a byte holds; `None` for 0.
fn byte_step(byte: u8) -> Option<f64> {
    (byte > 0).then(|| (f64::from(byte - 1) / BEFORE_STEPS).exp2())
}

/// Reads a count kept in a wider field before (a snapshot's), saturating.
fn saturating_u8<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    let wide = u64::deserialize(d)?;
    Ok(wide.min(u64::from(u8::MAX)) as u8)
}

/// Whether `attempted` cost is about a whole number `n` of operations of
/// `cost` (at least one): within a twentieth of one operation's cost,
/// and a five-hundredth of each operation's. Publishes of 1 001 and
/// 1 003 stated as 1 003 are, however many (two short each); cheap
/// operations summed to a few times the cost rarely are (one report in
/// ten, or a little more), and a report of less than half the cost never.
fn whole_ops(attempted: u64, cost: u32) -> bool {
    let cost = u64::from(cost);
    let n = ((attempted + cost / 2) / cost).max(1);
    attempted.abs_diff(n * cost) * 500 <= cost * (25 + n)
}

impl Spread {
    /// A round closed whole with `demand`, after a whole round of
    /// `previous` (`None`: the round before was not seen).
    pub(super) fn close(&mut self, previous: Option<f64>, demand: f64) {
        let long = f64::from(self.long);
        // A plain mean of the first rounds (the one closing is round
        // `changes + 2` when it follows one), then a moving one.
        let rounds = f64::from(self.changes) + if previous.is_some() { 2.0 } else { 1.0 };
        self.long = if self.long == 0.0 {
            demand
        } else {
            long + LONG_WEIGHT.max(1.0 / rounds) * (demand - long)
        } as f32;
        let Some(previous) = previous else {
            return;
        };
        let noise = f64::from(self.noise);
        let step = (demand - previous).powi(2) / 2.0;
        self.changes = self.changes.saturating_add(1);
        // A change beyond [`CLIP_SIGMAS`] of the noise, and beyond
        // [`NOISE_LEVEL_SHARE`] of the level, is a change of demand (a deluge beginning, an
        // agent's first report covering part of a round), not noise: it
        // enters clipped. A noisier account is still learned within a few
        // rounds, the clip growing with the noise.
        let level = demand.max(previous);
        let cap = (CLIP_SIGMAS.powi(2) * noise).max((NOISE_LEVEL_SHARE * level).powi(2) / 2.0);
        // A plain mean of the first changes, then a moving one.
        let weight = NOISE_WEIGHT.max(1.0 / f64::from(self.changes));
        self.noise = (noise + weight * (step.min(cap) - noise)) as f32;
    }

    /// A report of `attempted` cost came: the rounds' cost step is what
    /// divides it and every report before.
    pub(super) fn note_report(&mut self, attempted: u64) {
        if attempted == 0 {
            return;
        }
        if self.step >> STEP_BITS == STEP_STATED {
            return;
        }
        let refused = self.step & REFUSED;
        let known = u64::from(self.step & DIVISOR_MASK);
        let step = gcd(known, attempted);
        if step > u64::from(DIVISOR_MASK) {
            // A first report too large to keep (only a first: the divisor
            // of a kept one is kept): the step is 1 for good, and a round
            // of so much cost is rarely few operations anyway.
            self.step = refused | 1;
            return;
        }
        let mut more = self.step >> STEP_BITS;
        if known != 0 {
            if known > step {
                // Every report before was a multiple of `known`.
                more = more.max(1);
            }
            if attempted > step {
                more += 1;
            }
        }
        self.step = more.min(STEP_CONFIRMED) << STEP_BITS | refused | step as u16;
    }

    /// A report of `attempted` cost came, whose agent stated that one of
    /// the pair's operations costs `cost` (as far as its scans can tell;
    /// the costliest seen, when costs differ): the step from now on, or
    /// the costliest such statement, while every report is about a whole
    /// number of operations of it. Publishes of 1 001 and 1 003 have no
    /// divisor but 1, so their rounds read as counts of thousands of
    /// operations, and a new account of them at 0.95× of its limit was
    /// refused on a round at 1.5× that 40 publishes a second give by
    /// chance (`varying-fanout` at 0.95×, 6 seeds of 600).
    ///
    /// An agent's scans keep the costliest cost they saw, so a client
    /// that sends one costly operation (a publish to 4 000 subscribers)
    /// and then a flood of cheap ones would have its flood's rounds read
    /// as a few operations of 4 000, within their chance, and never
    /// suppressed. A report that is not [`whole_ops`] of the stated cost
    /// ends the statements for good; one that never was is ignored, and
    /// the reports' divisor decides. Once ended, the divisor of the
    /// statement and that report takes over, as if every report so far had had it, and reports narrow it
    /// as ever (publishes of 51 and 102, stated as 102, keep a step of
    /// 51). Costs past [`DIVISOR_BITS`] are kept at the most it holds.
    pub(super) fn note_op_cost(&mut self, cost: u32, attempted: u64) {
        if cost <= 1 || attempted == 0 || self.step & REFUSED != 0 {
            return;
        }
        let stated = self.step >> STEP_BITS == STEP_STATED;
        let known = if stated { self.step & DIVISOR_MASK } else { 0 };
        if !whole_ops(attempted, cost) {
            if stated {
                let divisor = gcd(u64::from(known), attempted) as u16;
                self.step = REFUSED | divisor;
            }
            return;
        }
        let cost = cost.min(u32::from(DIVISOR_MASK)) as u16;
        self.step = STEP_STATED << STEP_BITS | known.max(cost);
    }

    /// A report of `attempted` cost in `ops` operations came, whose agent
    /// stated that the costliest of them costs `cost`, for the current
    /// round (`slot` 0) or the one before (1), which held `held` cost
    /// before it.
    ///
    /// Once a report's operations show costs that differ (fewer
    /// operations of the costliest cost than its cost would be), a
    /// round's chance scatter is the sum of its costs' squares, not its
    /// cost times the reports' divisor (1 when costs differ, which read
    /// an account of cheap operations and publishes of 51 at 0.95× of its
    /// limit as a few thousand operations of 1, and a round that chance
    /// filled with publishes as over the limit: `mixed-costs`, seed 722).
    /// Each cost `c` between 1 and the costliest `s` has `c² ≤ c(s + 1) −
    /// s`, so a report's sum of squares is at most `attempted × (s + 1) −
    /// ops × s`: exactly, for two costs (1 and `s`). That bound over the
    /// cost is the report's effective cost, and a round's is its reports'
    /// pooled (their mean weighed by cost, cheap reports included; those
    /// before the first that showed a mix as cost 1): a count of
    /// operations of it scatters as the round does. Each round is weighed
    /// by its own: a learnt mean, which a round of lumps that chance
    /// gathered did not move far enough, read such rounds as proof (a
    /// new account at 0.95× of its limit, of rare publishes to 1 000
    /// subscribers, refused so in 2 seeds of 20), and kept a single lump's
    /// weight over the cheap flood that came after it. From then on the
    /// statements and the reports' divisor are set aside ([`REFUSED`]).
    /// Reports that say no operations (agents that predate them) leave it
    /// be, as do reports of operations all of the stated cost until one
    /// differs: the statement then says as much.
    pub(super) fn note_ops(&mut self, cost: u32, ops: u32, attempted: u64, slot: usize, held: f64) {
        if ops == 0 || u64::from(ops) > attempted {
            return;
        }
        let current = self.effective_cost();
        if current.is_none() && (cost <= 1 || u64::from(ops) * u64::from(cost) <= attempted) {
            return;
        }
        let c = attempted as f64;
        let own = effective_cost(c, f64::from(ops), CostBounds::up_to(u64::from(cost.max(1))));
        let held = held.max(0.0);
        let pooled = |was: Option<f64>| (was.unwrap_or(1.0) * held + own * c) / (held + c);
        let (now, before) = if slot == 0 {
            (pooled(current), self.step_before)
        } else {
            (
                current.unwrap_or(1.0),
                step_byte(pooled(byte_step(self.step_before))),
            )
        };
        let most = f64::from(DIVISOR_MASK);
        let kept = (now * EFFECTIVE_SCALE).round().clamp(EFFECTIVE_SCALE, most) as u16;
        self.step = REFUSED | STEP_STATED << STEP_BITS | kept;
        self.step_before = before;
    }

    /// The current round is now the one before (`next`: the next round
    /// began; else a later one, and the one before is empty): its
    /// effective cost is kept as the round before's.
    pub(super) fn next_round(&mut self, next: bool) {
        self.step_before = match self.effective_cost() {
            Some(now) if next => step_byte(now),
            _ => 0,
        };
    }

    /// The current round's effective cost ([`note_ops`](Self::note_ops)),
    /// once a report said its operations of costs that differ.
    fn effective_cost(&self) -> Option<f64> {
        (self.step & REFUSED != 0 && self.step >> STEP_BITS == STEP_STATED)
            .then(|| f64::from(self.step & DIVISOR_MASK) / EFFECTIVE_SCALE)
    }

    /// The rounds' cost step: the greater of the two rounds' effective
    /// costs once known, else their divisor once confirmed
    /// ([`STEP_CONFIRMED`]); else 1.
    #[cfg(test)]
    fn cost_step(&self) -> f64 {
        self.step_for(true)
    }

    /// The rounds' cost step: the greater of the two rounds' effective
    /// costs once known (of the current round alone unless `before`: the
    /// estimate may stand on the round before), else their divisor once
    /// confirmed ([`STEP_CONFIRMED`]); else 1.
    fn step_for(&self, before: bool) -> f64 {
        if let Some(effective) = self.effective_cost() {
            let before = byte_step(self.step_before).filter(|_| before);
            return effective.max(before.unwrap_or(1.0));
        }
        if self.step >> STEP_BITS < STEP_CONFIRMED {
            return 1.0;
        }
        f64::from((self.step & DIVISOR_MASK).max(1))
    }

    /// Whether `demand` (this round's estimate) is over `limit` by more
    /// than chance explains: itself by `sigmas` standard deviations of a
    /// round's noise, or the slow average by as many of its own. Without a
    /// noise estimate yet (fewer than [`MIN_CHANGES`] changes seen), by
    /// `margin` times the limit, and, a round of `round_secs` read as a
    /// count of operations of the rounds' cost step, by more than that
    /// count's chance at `sigmas`. With `sigmas` 0, whenever it is over.
    pub(super) fn confidently_over(
        &self,
        limit: f64,
        demand: f64,
        margin: f64,
        sigmas: f64,
        round_secs: f64,
        before: bool,
    ) -> bool {
        if demand <= limit || sigmas == 0.0 {
            return demand > limit;
        }
        if u16::from(self.changes) < MIN_CHANGES {
            let round = demand > limit * margin
                && self.counted_over(limit, demand, sigmas, round_secs, before);
            // The slow average is still a plain mean of the whole rounds
            // so far: read as their summed count, it proves a steady
            // excess that no single round's count does.
            let rounds = f64::from(self.changes) + 1.0;
            let long = f64::from(self.long);
            let slow = long > limit * margin
                && self.counted_over(limit, long, sigmas, round_secs * rounds, true);
            return round || slow;
        }
        // The measured scatter, but never less than a round's count of
        // operations of the step has by chance: the first changes enter
        // clipped, so a small account's noise is learnt from below, and
        // an account at 0.95× of 10/s on one node (19 operations a round)
        // read 1.15× of its limit as 5σ over after 26 s.
        let measured = f64::from(self.noise).sqrt() * estimate_allowance(u16::from(self.changes));
        let sigma = measured.max(self.count_sigma(demand, round_secs, before));
        let long = f64::from(self.long);
        let long_sigma = measured.max(self.count_sigma(long, round_secs, true))
            * long_noise_share(u16::from(self.changes) + 1);
        demand - sigmas * sigma > limit || long - sigmas * long_sigma > limit
    }

    /// The chance scatter of a round of `demand` over `round_secs`, read
    /// as a Poisson count of operations of the step, cost per second.
    fn count_sigma(&self, demand: f64, round_secs: f64, before: bool) -> f64 {
        if round_secs <= 0.0 || demand <= 0.0 {
            return 0.0;
        }
        (demand * self.step_for(before) / round_secs).sqrt()
    }

    /// Whether a round of `demand`, `round_secs` long, is more operations
    /// of the rounds' cost step than a Poisson count at `limit` gives by
    /// chance at `sigmas`. A margin alone judged a new account of costly
    /// operations by its rate: 17.6 operations of 51 a second against a
    /// limit of 1 000/s (0.9×) read 1.5× its limit in one of its first
    /// eight rounds one time in 300 (62 operations where 35 are expected,
    /// 4σ), and was refused until its rounds fell back under the limit.
    /// A round of 62 operations of 51 is not proof of 1 000/s exceeded; a
    /// deluge's count is, from its first round. An unknown step counts
    /// operations of 1: the margin's rule, as before.
    fn counted_over(
        &self,
        limit: f64,
        demand: f64,
        sigmas: f64,
        round_secs: f64,
        before: bool,
    ) -> bool {
        let step = self.step_for(before);
        let ops = demand * round_secs / step;
        let due = limit * round_secs / step;
        beyond_chance(ops, due, sigmas, normal_tail(sigmas))
    }
}

/// The greatest common divisor of `a` and `b` (`b` when `a` is 0).
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while a != 0 {
        (a, b) = (b % a, a);
    }
    b
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_distr::{Distribution, Poisson};

    /// Rounds of Poisson operations of `cost` at `ops` a second (2-s
    /// rounds), as demand in cost per second.
    fn rounds(ops: f64, cost: f64, n: usize, seed: u64) -> Vec<f64> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let p = Poisson::new(ops * 2.0).unwrap();
        (0..n).map(|_| p.sample(&mut rng) * cost / 2.0).collect()
    }

    /// Counts the rounds, after the first 20, that would be suppressed.
    fn suppressed(demands: &[f64], limit: f64) -> usize {
        let mut spread = Spread::default();
        let mut previous = None;
        let mut count = 0;
        for (i, &d) in demands.iter().enumerate() {
            if i >= 20 && spread.confidently_over(limit, d, 1.15, CONFIDENCE_SIGMAS, 2.0, true) {
                count += 1;
            }
            spread.close(previous, d);
            previous = Some(d);
        }
        count
    }

    /// Accounts at 0.95× their limit, of cheap and of costly operations,
    /// at small and large limits: never suppressed over 2 000 rounds each
    /// (over an hour), where the raw round is over the limit often.
    #[test]
    fn accounts_under_their_limit_are_never_suppressed() {
        for (ops, cost, limit) in [(95.0, 1.0, 100.0), (19.0, 1.0, 20.0), (47.0, 101.0, 5000.0)] {
            for seed in 0..5 {
                let demands = rounds(ops, cost, 2_000, seed);
                let raw = demands.iter().filter(|&&d| d > limit).count();
                assert!(
                    raw > 100,
                    "{ops}×{cost}: over the limit by chance {raw} times"
                );
                assert_eq!(suppressed(&demands, limit), 0, "{ops}×{cost} seed {seed}");
            }
        }
    }

    /// The same accounts from their first round: the noise estimate,
    /// trusted from its eighth change, is a draw of few changes then, and
    /// allowed for, so 1 000 runs of 40 rounds (80 s) each refuse none.
    /// (An account of 19 a second against 20 can still be refused before
    /// eight changes, when a round reads 1.5× its limit: 4 runs of 1 000.)
    #[test]
    fn accounts_under_their_limit_are_not_suppressed_in_their_first_rounds() {
        for (ops, cost, limit) in [(47.0, 101.0, 5000.0), (95.0, 1.0, 100.0)] {
            let refused = (0..1_000)
                .filter(|&seed| {
                    let demands = rounds(ops, cost, 40, 1_000 + seed);
                    let mut spread = Spread::default();
                    let mut previous = None;
                    let mut any = false;
                    for &d in &demands {
                        any |= spread.confidently_over(limit, d, 1.5, CONFIDENCE_SIGMAS, 2.0, true);
                        spread.close(previous, d);
                        previous = Some(d);
                    }
                    any
                })
                .count();
            assert_eq!(refused, 0, "{ops}×{cost} against {limit}");
        }
    }

    #[test]
    fn the_allowance_for_the_estimate_shrinks_as_changes_add_up() {
        assert!((estimate_allowance(8) - 2.37).abs() < 0.02);
        assert!((estimate_allowance(16) - 1.49).abs() < 0.02);
        assert!((estimate_allowance(32) - 1.16).abs() < 0.02);
        assert_eq!(long_noise_share(1), 1.0);
        assert!(
            (long_noise_share(9) - 1.0 / 3.0).abs() < 1e-9,
            "a plain mean of nine"
        );
        assert!((long_noise_share(16) - 0.25).abs() < 1e-9);
        assert!(long_noise_share(17) < 0.25 && long_noise_share(17) > 0.24);
        let steady = (LONG_WEIGHT / (2.0 - LONG_WEIGHT)).sqrt();
        assert!((long_noise_share(u16::MAX) - steady).abs() < 1e-9);
        assert!(estimate_allowance(1) > estimate_allowance(8));
        assert_eq!(estimate_allowance(63), 1.0);
        assert_eq!(estimate_allowance(u16::MAX), 1.0);
    }

    /// A mild overload, 1.1× a small limit, is suppressed in most rounds
    /// once the slow average has seen it; a deluge from its first round.
    #[test]
    fn overloads_are_suppressed() {
        let demands = rounds(110.0, 1.0, 200, 1);
        assert!(
            suppressed(&demands, 100.0) > 150,
            "{}",
            suppressed(&demands, 100.0)
        );
        let mut spread = Spread::default();
        for d in rounds(50.0, 1.0, 30, 2) {
            spread.close(Some(50.0), d);
        }
        // A first round that covered half of itself, then a full one: not
        // taken for noise that would hide a deluge.
        let mut started = Spread::default();
        started.close(None, 4_000.0);
        started.close(Some(4_000.0), 8_000.0);
        for _ in 0..MIN_CHANGES {
            started.close(Some(8_000.0), 8_000.0);
        }
        assert!(started.confidently_over(2_000.0, 8_000.0, 1.15, CONFIDENCE_SIGMAS, 2.0, true));
        assert!(spread.confidently_over(100.0, 1_000.0, 1.15, CONFIDENCE_SIGMAS, 2.0, true));
        // Without enough changes seen, the margin decides, and a round's
        // count must be more than chance (120/s over 2 s of operations of
        // 1 is 240 where 200 are due: 2.8σ).
        assert!(!Spread::default().confidently_over(
            100.0,
            110.0,
            1.15,
            CONFIDENCE_SIGMAS,
            2.0,
            true
        ));
        assert!(!Spread::default().confidently_over(
            100.0,
            120.0,
            1.15,
            CONFIDENCE_SIGMAS,
            2.0,
            true
        ));
        assert!(Spread::default().confidently_over(
            100.0,
            160.0,
            1.15,
            CONFIDENCE_SIGMAS,
            2.0,
            true
        ));
    }

    /// A deluge's step enters the noise clipped: soon after it ends, an
    /// overload of 1.3× is confidently over again.
    #[test]
    fn a_deluge_does_not_blind_the_window() {
        let mut spread = Spread::default();
        let mut previous = None;
        let mut feed = |spread: &mut Spread, d: f64| {
            spread.close(previous, d);
            previous = Some(d);
        };
        for d in rounds(500.0, 1.0, 30, 3) {
            feed(&mut spread, d);
        }
        for _ in 0..20 {
            feed(&mut spread, 10_000.0);
        }
        for d in rounds(500.0, 1.0, 5, 4) {
            feed(&mut spread, d);
        }
        assert!(
            spread.confidently_over(1000.0, 1300.0, 1.15, CONFIDENCE_SIGMAS, 2.0, true),
            "{spread:?}"
        );
    }

    /// A spread that heard `reports`.
    /// The reports of seed 17's first round of the heavy fan-out account
    /// (publishes to 1 000 subscribers among cheap operations at 0.95×
    /// of 3 000/s, over 20 agents), (cost, operations) in the order they
    /// came: seven publishes where 2.85 were due, in four agents'
    /// reports, each publish 1 000 more than its operation.
    pub(in crate::window) fn heavy_first_round() -> Vec<(u64, u32)> {
        let costly = [(1_145, 145), (2_144, 144), (1_138, 138), (3_149, 149)];
        let mut reports: Vec<(u64, u32)> =
            (0..16).map(|i| (140 + i % 5, 140 + i as u32 % 5)).collect();
        for (i, report) in costly.into_iter().enumerate() {
            reports.insert(4 * i + 3, report);
        }
        reports
    }

    fn heard(reports: &[u64]) -> Spread {
        let mut spread = Spread::default();
        for &r in reports {
            spread.note_report(r);
        }
        spread
    }

    /// The step is what divides every report, once two reports of more
    /// than it came: a single report, or two of round numbers, are not
    /// operations of their size; mixed costs leave 1.
    #[test]
    fn the_step_is_the_cost_every_report_is_a_multiple_of() {
        assert_eq!(heard(&[51, 102, 0, 153, 51]).cost_step(), 51.0);
        assert_eq!(heard(&[153, 51, 102]).cost_step(), 51.0, "in any order");
        assert_eq!(heard(&[51, 51, 51]).cost_step(), 1.0, "none of more");
        assert_eq!(heard(&[20_000]).cost_step(), 1.0, "one deluge's report");
        assert_eq!(heard(&[600, 3_600]).cost_step(), 1.0, "two round numbers");
        assert_eq!(
            heard(&[1_001, 2_004, 3_007]).cost_step(),
            1.0,
            "1 001 and 1 003"
        );
        assert_eq!(heard(&[8_000, 16_000, 24_000]).cost_step(), 8_000.0);
        assert_eq!(
            heard(&[10_000, 20_000, 30_000]).cost_step(),
            1.0,
            "too large to keep"
        );
        assert_eq!(
            heard(&[20_400, 102, 51, 153]).cost_step(),
            1.0,
            "nor known later"
        );
        assert_eq!(heard(&[2_010, 51, 102]).cost_step(), 3.0);
    }

    /// An agent's statement of one operation's cost is the step at once,
    /// whatever divides the reports, while the reports are whole numbers
    /// of operations of it: the costliest stated stands, and reports'
    /// divisors change it no more. A statement of 1 (or none) leaves the
    /// divisor's rule.
    #[test]
    fn a_stated_cost_is_the_step() {
        let mut spread = heard(&[1_001, 2_004]);
        assert_eq!(spread.cost_step(), 1.0, "no divisor but 1");
        spread.note_op_cost(1_001, 2_004);
        assert_eq!(spread.cost_step(), 1_001.0);
        spread.note_op_cost(1_003, 1_003);
        spread.note_op_cost(1_001, 3_007);
        spread.note_report(3_007);
        assert_eq!(spread.cost_step(), 1_003.0, "the costliest, kept");
        let mut cheap = heard(&[51, 102, 153]);
        cheap.note_op_cost(1, 153);
        assert_eq!(cheap.cost_step(), 51.0, "a statement of 1 says nothing");
        let mut huge = Spread::default();
        huge.note_op_cost(100_000, 100_000);
        assert_eq!(huge.cost_step(), f64::from(DIVISOR_MASK));
    }

    /// Reports that say their operations, of costs that differ, make the
    /// step their round's effective cost: the bound on their sum of
    /// squares over their cost, exact for two costs, pooled over the
    /// round's reports by their cost (cheap ones too, once a mix showed);
    /// the greater of the current round's and the one before's. Cheap
    /// operations alone read as cost 1, publishes alone as their cost;
    /// reports without operations, or all of the stated cost, change
    /// nothing.
    #[test]
    fn reports_of_mixed_costs_make_the_step_their_rounds_effective_cost() {
        // 1 425 operations of 1 and 28.5 of 51 a second, over 2 s.
        let (n1, n51) = (2_850u64, 57u64);
        let (attempted, ops) = (n1 + 51 * n51, (n1 + n51) as u32);
        let squares = (n1 + 51 * 51 * n51) as f64;
        let effective = squares / attempted as f64;
        let near = |spread: &Spread, want: f64, within: f64| {
            assert!(
                (spread.cost_step() - want).abs() <= within,
                "{} against {want}",
                spread.cost_step()
            );
        };
        let mut spread = heard(&[attempted]);
        spread.note_ops(51, 0, attempted, 0, 0.0);
        spread.note_ops(51, 57, 51 * 57, 0, 0.0);
        assert_eq!(spread.cost_step(), 1.0, "nothing said of a mix yet");
        // A round's first report of the mix: its own, whole.
        spread.note_ops(51, ops, attempted, 0, 0.0);
        near(&spread, effective, 1.0 / 16.0);
        // The statements and divisors no longer move it.
        spread.note_op_cost(51, 51 * 57);
        spread.note_report(3);
        near(&spread, effective, 1.0 / 16.0);
        // Pooled over the round: a cheap report of as much cost (its
        // agent stating 1) halves the way to 1.
        spread.note_ops(1, 5_757, 5_757, 0, attempted as f64);
        let halved = (effective * attempted as f64 + 5_757.0) / (2.0 * 5_757.0);
        near(&spread, halved, 1.0 / 16.0);
        // A late report of the round before pools into that one's.
        spread.note_ops(51, ops, attempted, 1, 0.0);
        near(&spread, effective, 0.045 * effective);
        // The next round, of cheap operations alone: the round before's
        // still stands beside it (rounded up, a byte's step).
        spread.next_round(true);
        spread.note_ops(1, 9_000, 9_000, 0, 0.0);
        near(&spread, halved, 0.045 * halved);
        assert!(spread.cost_step() >= halved);
        // Another: the mix is forgotten.
        spread.next_round(true);
        spread.note_ops(1, 9_000, 9_000, 0, 0.0);
        assert_eq!(spread.cost_step(), 1.0);
        // A gap of a round: nothing before.
        let mut gap = heard(&[attempted]);
        gap.note_ops(51, ops, attempted, 0, 0.0);
        gap.next_round(false);
        gap.note_ops(1, 9_000, 9_000, 0, 0.0);
        assert_eq!(gap.cost_step(), 1.0);
        // One agent's reports, each a whole round, of rare publishes to
        // 1 000 subscribers among cheap operations (3 and 2 850 a round):
        // each round's own, at once.
        let (heavy, heavy_ops) = (3 * 1_001 + 2_850u64, 2_853u32);
        let heavy_effective = (3.0 * 1_001.0f64.powi(2) + 2_850.0) / heavy as f64;
        let mut one_agent = heard(&[heavy]);
        one_agent.note_ops(1_001, heavy_ops, heavy, 0, 0.0);
        near(&one_agent, heavy_effective, 1.0 / 16.0);
        // One publish to 4 000 subscribers, then a flood of cheap
        // operations from agents that never saw it (stating a cost of 1):
        // the lump is its round's scatter, and the flood's rounds are
        // weighed by their own from the second on.
        let mut flood = heard(&[9_551]);
        flood.note_ops(4_000, 5_552, 9_551, 0, 0.0);
        assert!(flood.cost_step() > 1_000.0, "{}", flood.cost_step());
        for round in 0..2 {
            flood.next_round(true);
            for agent in 0..10 {
                flood.note_ops(1, 9_551, 9_551, 0, f64::from(agent) * 9_551.0);
            }
            assert_eq!(
                flood.cost_step() == 1.0,
                round == 1,
                "{}",
                flood.cost_step()
            );
        }
    }

    /// Seed 17 of the heavy fan-out account (publishes to 1 000
    /// subscribers, 1.425 a second, beside 1 425 cheap operations a
    /// second, against 3 000/s: 0.95×, over 20 agents), its first round as
    /// it came: seven publishes where 2.85 were due, in four agents'
    /// reports among sixteen agents' cheap ones; 4 765/s in all. Learnt
    /// report by report, the costly reports only, and rising at most to
    /// twice the step (plus 2) a report, its step was 46 by the round's
    /// end, and the round read as a count of 207 operations where 130 were
    /// due, 6.7σ: a new account at 0.95× of its limit was refused for two
    /// seconds. Pooled over the round, the step is its own scatter, about
    /// 730: 1.6σ.
    #[test]
    fn a_round_of_rare_costly_operations_is_weighed_by_all_its_reports() {
        let mut spread = Spread::default();
        let mut held = 0.0;
        for (attempted, ops) in heavy_first_round() {
            let cost = if u64::from(ops) == attempted {
                1
            } else {
                1_001
            };
            spread.note_report(attempted);
            spread.note_op_cost(cost, attempted);
            spread.note_ops(cost, ops, attempted, 0, held);
            held += attempted as f64;
        }
        assert!(spread.cost_step() > 500.0, "{}", spread.cost_step());
        assert!(!spread.confidently_over(3_000.0, 4_765.0, 1.5, CONFIDENCE_SIGMAS, 2.0, true));
        assert!(
            spread.confidently_over(3_000.0, 30_000.0, 1.5, CONFIDENCE_SIGMAS, 2.0, true),
            "a deluge's round is still proof"
        );
    }

    /// A snapshot's count of changes, kept in two bytes before, reads
    /// back saturated; one without the round before's step, as none.
    #[test]
    fn a_snapshots_spread_reads_back() {
        let spread: Spread =
            serde_json::from_str(r#"{"noise":4.0,"long":2.0,"changes":300,"step":51}"#).unwrap();
        assert_eq!(
            (spread.changes, spread.step_before, spread.step),
            (255, 0, 51)
        );
        let again: Spread = serde_json::from_value(serde_json::to_value(spread).unwrap()).unwrap();
        assert_eq!(again, spread);
    }

    /// Seed 722 of `mixed-costs` at 0.95× (28.5 publishes of 51 and 1 425
    /// cheap operations a second against 3 000/s, over 20 agents), as its
    /// rounds came: nine rounds that chance made steady (2 768–2 887 a
    /// second, where such rounds scatter by 194), so the measured noise
    /// was a fifth of the truth, then a round of 80 publishes where 57
    /// were due, 3 487.5 a second. Read as operations of 1, its floor was
    /// 42 a second and the round was suppressed; with the reports'
    /// operations, the floor is the round's true scatter.
    #[test]
    fn a_round_that_chance_filled_with_publishes_is_not_suppressed_once_reports_say_their_operations()
     {
        let over = |say_ops: bool| {
            let mut spread = Spread::default();
            let mut previous = None;
            let mut any = false;
            // Publishes per round, cheap operations at 2 850 a round less
            // the publishes' share, for steady rounds, then the tenth.
            let rounds = [
                (57, 5_540),
                (55, 5_600),
                (58, 5_660),
                (56, 5_700),
                (57, 5_740),
            ];
            let tenth = [(80u64, 2_895u64)];
            for (i, &(publishes, total)) in rounds.iter().cycle().take(9).chain(&tenth).enumerate()
            {
                let cheap = if i < 9 { total - 51 * publishes } else { total };
                let mut round = 0.0;
                for agent in 0..20u64 {
                    // Each agent's share: the publishes one by one.
                    let n51 = publishes / 20 + u64::from(agent < publishes % 20);
                    let n1 = cheap / 20 + u64::from(agent < cheap % 20);
                    let attempted = n1 + 51 * n51;
                    let ops = if say_ops { (n1 + n51) as u32 } else { 0 };
                    spread.note_report(attempted);
                    spread.note_op_cost(51, attempted);
                    spread.note_ops(51, ops, attempted, 0, round * 2.0);
                    round += attempted as f64 / 2.0;
                }
                any |= spread.confidently_over(3_000.0, round, 1.5, CONFIDENCE_SIGMAS, 2.0, true);
                spread.close(previous, round);
                spread.next_round(true);
                previous = Some(round);
            }
            any
        };
        assert!(over(false), "read as operations of 1, chance suppressed it");
        assert!(!over(true));
    }

    /// The same account's rounds as chance gives them, twenty agents'
    /// reports a round, that say their operations: 2 000 runs of 40
    /// rounds refuse none.
    #[test]
    fn mixed_costs_under_the_limit_are_not_suppressed_when_reports_say_their_operations() {
        use rand_distr::Poisson;
        let refused = (0..2_000u64)
            .filter(|&seed| {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(20_000 + seed);
                let cheap = Poisson::new(1_425.0 * 2.0 / 20.0).unwrap();
                let costly = Poisson::new(28.5 * 2.0 / 20.0).unwrap();
                let mut spread = Spread::default();
                let mut previous = None;
                let mut any = false;
                for _ in 0..40 {
                    let mut round = 0.0;
                    for _ in 0..20 {
                        let (n1, n51) = (cheap.sample(&mut rng), costly.sample(&mut rng));
                        let attempted = (n1 + 51.0 * n51) as u64;
                        spread.note_report(attempted);
                        spread.note_op_cost(51, attempted);
                        spread.note_ops(51, (n1 + n51) as u32, attempted, 0, round * 2.0);
                        round += attempted as f64 / 2.0;
                    }
                    any |=
                        spread.confidently_over(3_000.0, round, 1.5, CONFIDENCE_SIGMAS, 2.0, true);
                    spread.close(previous, round);
                    spread.next_round(true);
                    previous = Some(round);
                }
                any
            })
            .count();
        assert_eq!(refused, 0);
    }

    /// One costly operation, then a flood of cheap ones: the agent states
    /// the costliest cost it saw, 4 000, and the flood's reports (3 001
    /// and 9 500 cost of operations of 1) are no whole number of
    /// operations of it. Taken for the step, 4 000 made the flood's
    /// rounds a few operations each, never beyond chance, and the account
    /// was never suppressed. The statements end for good; a report under
    /// one operation's cost ends them too. A statement that never fitted
    /// is ignored, and the divisor decides.
    #[test]
    fn statements_that_the_reports_belie_are_dropped() {
        let mut spread = Spread::default();
        spread.note_report(4_000);
        spread.note_op_cost(4_000, 4_000);
        assert_eq!(spread.cost_step(), 4_000.0);
        for attempted in [3_001, 9_500] {
            spread.note_report(attempted);
            spread.note_op_cost(4_000, attempted);
        }
        assert_eq!(spread.cost_step(), 1.0);
        spread.note_op_cost(4_000, 8_000);
        assert_eq!(spread.cost_step(), 1.0, "for good");
        let mut small = Spread::default();
        small.note_op_cost(51, 102);
        small.note_op_cost(51, 1);
        assert_eq!(small.cost_step(), 1.0);
        // Costs of 51 and 102, the costliest stated: 153 and 255 are no
        // whole numbers of 102s, and the divisor decides, 51 once two
        // more reports confirm it.
        let mut mixed = Spread::default();
        for attempted in [153, 204, 255, 306, 357] {
            mixed.note_report(attempted);
            mixed.note_op_cost(102, attempted);
        }
        assert_eq!(mixed.cost_step(), 51.0);
        assert!(whole_ops(1_001 * 20 + 1_003 * 5, 1_003));
        assert!(whole_ops(1_001 * 300, 1_003));
        assert!(!whole_ops(30_500, 1_003));
        assert!(!whole_ops(1_500, 1_003));
    }

    /// Before the rounds' noise is known, a round over the margin must
    /// also be a count of operations of the step that chance does not
    /// give: 1 581/s in operations of 51 (62 where 39 are due, the round
    /// of `near-limit` at seed 343 that refused an account at 0.9×) is
    /// not; twice the limit is, and so is 1 581/s of operations of 1, or
    /// of an unknown step.
    #[test]
    fn a_new_account_of_costly_operations_is_suppressed_only_past_their_chance() {
        let costly = heard(&[51, 102, 153, 51, 102]);
        let over = |spread: &Spread, demand: f64| {
            spread.confidently_over(1_000.0, demand, 1.5, CONFIDENCE_SIGMAS, 2.0, true)
        };
        assert!(!over(&costly, 1_581.0));
        assert!(!over(&costly, 1_700.0));
        assert!(over(&costly, 2_000.0), "78 operations where 39 are due");
        assert!(over(&heard(&[1, 2, 3]), 1_581.0));
        assert!(over(&Spread::default(), 1_581.0));
        assert!(!over(&Spread::default(), 1_400.0), "the margin still holds");
        // Once the noise is known, the rounds' scatter decides, as before.
        let mut known = costly;
        for d in rounds(17.6, 51.0, 40, 3) {
            known.close(Some(900.0), d);
        }
        assert!(u16::from(known.changes) >= MIN_CHANGES);
        assert_eq!(
            over(&known, 1_581.0),
            known.confidently_over(1_000.0, 1_581.0, 1.5, CONFIDENCE_SIGMAS, 0.0, true),
            "the round's length no longer matters"
        );
    }

    /// The slow average is a plain mean of a window's first sixteen
    /// rounds, and before their scatter is known it is read as their
    /// summed count: five publishes of 51 a second against 100/s (2.55×,
    /// rounds of 10 where 3.9 are due) are proof within a few rounds,
    /// which no single round's count is (a new account so was suppressed
    /// at 40 s, by the slow average once the scatter was known; now at
    /// 12). Under the margin (1.4×), however many rounds, it is not.
    #[test]
    fn a_new_accounts_first_rounds_are_counted_together() {
        let steady = |demand: f64, closes: usize| {
            let mut spread = Spread::default();
            spread.note_op_cost(51, 510);
            let mut previous = None;
            for _ in 0..closes {
                spread.close(previous, demand);
                previous = Some(demand);
            }
            assert!(u16::from(spread.changes) < MIN_CHANGES);
            assert!((f64::from(spread.long) - demand).abs() < 1e-3);
            spread.confidently_over(100.0, demand, 1.5, CONFIDENCE_SIGMAS, 2.0, true)
        };
        assert!(!steady(255.0, 1), "one round is no proof");
        assert!(!steady(255.0, 2));
        assert!(steady(255.0, 6));
        assert!(!steady(142.8, 8), "within the margin");
    }

    /// Once the noise is known, it is never taken as less than a round's
    /// count of operations of the step has by chance: a small account's
    /// first changes enter clipped, and its measured noise can read far
    /// under its counting noise. 10/s of operations of 1 in 2-s rounds
    /// (20 a round, 2.2/s of noise) whose changes read 0.05/s: 11.5/s is
    /// not proof, 30/s is.
    #[test]
    fn the_noise_is_at_least_the_counts() {
        let mut spread = heard(&[19, 21, 20, 18]);
        for i in 0..12 {
            spread.close(Some(9.5), if i % 2 == 0 { 9.55 } else { 9.45 });
        }
        assert!(u16::from(spread.changes) >= MIN_CHANGES);
        assert!(f64::from(spread.noise).sqrt() < 0.1, "{spread:?}");
        let over =
            |demand: f64| spread.confidently_over(10.0, demand, 1.5, CONFIDENCE_SIGMAS, 2.0, true);
        assert!(!over(11.5));
        assert!(over(30.0));
    }

    /// The tail weighed is the normal law's at the sigmas asked.
    #[test]
    fn the_normal_tail_is_the_laws() {
        for (z, tail) in [
            (0.0, 0.5),
            (1.0, 0.158_655),
            (3.0, 1.349_9e-3),
            (5.0, 2.866_5e-7),
        ] {
            let got = normal_tail(z);
            assert!((got / tail - 1.0).abs() < 1e-4, "{z}: {got}");
        }
        assert!((normal_tail(-1.0) - 0.841_345).abs() < 1e-6);
    }
}
