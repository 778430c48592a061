//! Finding surges: the (account, op) pairs whose attempted rate over the
//! last sub-window jumped to many times, or fell to a fraction of, what
//! this agent last told their master. The round sends those early, so a
//! deluge is seen within a sub-window rather than a round (fast onset, see
//! `docs/design.md`).

use std::cell::OnceCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::Duration;

use super::AgentState;
use super::counter::ops_between;
use super::entry::{CONFIRM_ASKED, Entry, HINTED, YOUNG_REPORTED};
use super::guard::CostBounds;
use super::hint::HintSpan;
use super::owned::Owned;
use crate::Pair;
use crate::time::{Nanos, duration_nanos};
use crate::wire::SurgeRates;

/// How many standard deviations of a pair's own sub-window noise a change
/// must exceed to be a surge. An account of costly operations spread over
/// many agents sees a few operations per sub-window, so single sub-windows
/// jump several-fold by chance; a deluge stands far out.
pub const NOISE_SIGMAS: f64 = 4.0;

/// How far a suppressed pair's rate must rise above what this agent's
/// last early report said to be reported again (see
/// [`SurgeRule::is_surge`]): a deluge that begins a quarter of the way
/// into a sub-window fills three quarters of it, and is reported at that
/// first; its full size is 1.33× that.
pub const FOLLOW_UP_RISE: f64 = 1.2;

/// How far a suppressed pair's rate must fall below what this agent last
/// told its master to be reported (see [`SurgeRule::is_surge`]).
pub const FOLLOW_UP_JUMP: f64 = 1.5;

/// The most noise a further fall of a pair reported early this round is
/// judged by, as a share of what was reported (see
/// `Entry::noise_after_report`).
const REPORTED_NOISE_SHARE: f64 = 0.25;

/// The same for a further rise, which must stand [`NOISE_SIGMAS`] of it
/// above what was reported: 4 × 0.05, so a rise of a fifth shows.
const RISE_NOISE_SHARE: f64 = 0.05;

/// The weight of each sub-window in the moving mean of the noise.
const NOISE_WEIGHT: f64 = 0.1;

/// What counts as a surge. Valid by construction ([`SurgeRule::new`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SurgeRule {
    window: Duration,
    jump: f64,
    floor: f64,
}

/// Why a [`SurgeRule`] cannot be made, naming the setting.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SurgeRuleError {
    /// The sub-window is zero or does not divide the rollup interval.
    #[error(
        "surge window must be positive and divide the rollup interval ({interval:?}), got {window:?}"
    )]
    Window {
        /// The window asked for.
        window: Duration,
        /// The rollup interval.
        interval: Duration,
    },
    /// The jump is not a finite number above 1.
    #[error("surge jump must be a finite number above 1, got {0}")]
    Jump(f64),
    /// The floor is not in (0, 1].
    #[error("surge floor must be in (0, 1], got {0}")]
    Floor(f64),
}

impl SurgeRule {
    /// The default rule for `interval`: sub-windows of 200 ms (or the
    /// nearest length above that divides the interval), a jump of 4×
    /// either way, a floor of 1/8 of the limit.
    pub fn default_for(interval: Duration) -> SurgeRule {
        let i = duration_nanos(interval).max(1);
        let target = duration_nanos(Duration::from_millis(200));
        let parts = (i / target).max(1);
        let parts = (1..=parts)
            .rev()
            .find(|n| i.is_multiple_of(*n))
            .unwrap_or(1);
        SurgeRule {
            window: Duration::from_nanos(i / parts),
            jump: 4.0,
            floor: 0.125,
        }
    }

    /// A rule that scans every `window` (which divides `interval`, so the
    /// scans of every agent fall on one grid), and calls a pair's rate a
    /// surge when it is `jump` times its baseline or more, or `1 / jump`
    /// of it or less, by a change of at least `floor` times its limit.
    pub fn new(
        window: Duration,
        jump: f64,
        floor: f64,
        interval: Duration,
    ) -> Result<SurgeRule, SurgeRuleError> {
        let (w, i) = (duration_nanos(window), duration_nanos(interval));
        if w == 0 || i % w != 0 {
            return Err(SurgeRuleError::Window { window, interval });
        }
        if !(jump.is_finite() && jump > 1.0) {
            return Err(SurgeRuleError::Jump(jump));
        }
        if !(floor > 0.0 && floor <= 1.0) {
            return Err(SurgeRuleError::Floor(floor));
        }
        Ok(SurgeRule {
            window,
            jump,
            floor,
        })
    }

    /// The sub-window: how often pairs are scanned.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The factor a rate must move by.
    pub fn jump(&self) -> f64 {
        self.jump
    }

    /// The least change, as a share of the limit.
    pub fn floor(&self) -> f64 {
        self.floor
    }

    /// Whether `rate` against `baseline` is a surge for a pair limited to
    /// `limit` (`None`: its limit is not known yet, so any jump counts)
    /// whose sub-window rates move by `noise` (a standard deviation) when
    /// nothing happens. Either way the change must be a jump of the rule's
    /// factor and at least its floor; a rise must also stand
    /// [`NOISE_SIGMAS`] times the noise above the baseline, since a chance
    /// spike would make the master suppress; a fall, twice the noise: a
    /// chance dip of bursty traffic would release a flood, but the release
    /// of a flood that stops must not wait. (The caller passes as a fall's
    /// `rate` the higher of the last two sub-windows, so a fall must hold
    /// for two: traffic that comes in bursts a little longer apart than a
    /// sub-window leaves single sub-windows empty.)
    ///
    /// A `follow_up` rise (from what this agent's last early report said,
    /// of a pair its master now suppresses) needs only a
    /// [`FOLLOW_UP_RISE`] (and the caller judges it by the noise at the
    /// reported level, not by the step the report made): the sub-window
    /// that saw a deluge begin often
    /// held only its start, and the master should hear its full size
    /// before the round. Only for suppressed pairs: an account under its
    /// limit, reported at start (every new pair jumps from nothing), would
    /// otherwise ratchet its estimate up on chance rises, since only
    /// 4× falls bring it down.
    ///
    /// A `follow_up` fall (of a pair its master suppresses, or from this
    /// agent's own early report of this round of a chance lump: a rise of
    /// at most four operations) likewise needs only a [`FOLLOW_UP_JUMP`]: an
    /// overload that falls back to 0.8× its limit from 1.8× is let go
    /// within a sub-window or two, not at the round, and with no floor,
    /// since each of many agents sees only its share of the fall. A chance
    /// dip (two sub-windows 2σ down) moves the master's estimate by this
    /// agent's share only, until the round.
    pub fn is_surge(
        &self,
        rate: f64,
        baseline: f64,
        follow_up: bool,
        limit: Option<f64>,
        noise: f64,
    ) -> bool {
        self.is_surge_with(rate, baseline, follow_up, limit, || noise)
    }

    /// [`is_surge`](Self::is_surge) with the noise computed only when the
    /// rest of the test passes: most pairs of a scan move by less than a
    /// jump, and their noise (two square roots and two divisions) would be
    /// computed for nothing.
    pub(super) fn is_surge_with(
        &self,
        rate: f64,
        baseline: f64,
        follow_up: bool,
        limit: Option<f64>,
        noise: impl FnOnce() -> f64,
    ) -> bool {
        let floor = limit.map_or(0.0, |l| l * self.floor);
        let change = (rate - baseline).abs();
        if rate > baseline {
            let jump = if follow_up { FOLLOW_UP_RISE } else { self.jump };
            rate >= jump * baseline && change >= floor && change > NOISE_SIGMAS * noise()
        } else if rate < baseline {
            let fall = if follow_up { FOLLOW_UP_JUMP } else { self.jump };
            // A suppressed pair's fall needs no floor: spread over many
            // agents, each one's share of it is small, and together they
            // release.
            rate * fall <= baseline && (follow_up || change >= floor) && change > 2.0 * noise()
        } else {
            false
        }
    }
}

/// The weight of each sub-window in the slow rate (a moving mean over
/// about five sub-windows, a second by default).
const SLOW_WEIGHT: f64 = 1.0 / 3.0;

/// How many of its standard deviations the slow rate must fall by.
const SLOW_FALL_SIGMAS: f64 = 3.0;

/// The least noise of a sub-window's rate, cost per second, for a pair
/// whose operations cost `quantum` each and come at `baseline` cost per
/// second, over sub-windows of `secs`: operations arrive one by one, so a
/// sub-window expecting `m` of them sees about `m ± √m` (Poisson), plus
/// one operation, since few of them have a far longer tail than the
/// normal law (at `m` = 1, [`NOISE_SIGMAS`] of this is 8 operations, which
/// chance reaches once in 10^5 sub-windows). Sparse costly operations
/// (cost 51, under one per sub-window) jump from nothing to 255/s by
/// chance all the time; the noise measured over a few sub-windows often
/// misses that, this never does.
pub fn counting_noise(quantum: u32, baseline: f64, secs: f64) -> f64 {
    if quantum == 0 || secs <= 0.0 {
        return 0.0;
    }
    let per_op = f64::from(quantum) / secs;
    per_op * ((baseline / per_op).max(1.0).sqrt() + 1.0)
}

/// What the scans know of a pair's cost per operation, packed in 16 bits:
/// the greatest common divisor of the costs of sub-windows that followed
/// an empty one (12 bits; a lower bound beyond), whether its operations
/// were seen to cost differently (1 bit, see [`sample`](Self::sample)),
/// whether the divisor is one operation's own cost, as a pair's first
/// check shows it (1 bit, see [`seeded`](Self::seeded)), and how many
/// such sub-windows there were (2 bits, saturating).
///
/// Only sub-windows after an empty one teach it: those of sparse traffic
/// hold one or a few operations, so their divisor is soon the cost of one;
/// dense traffic is never empty and teaches nothing (a steady publisher
/// sending exactly 20 operations per sub-window would read as one
/// operation of cost 20). It is trusted from the second such sub-window,
/// since the first may be a deluge's first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Quantum(pub(super) u16);

impl Quantum {
    const COST_BITS: u32 = 12;
    const MAX_COST: u32 = (1 << Self::COST_BITS) - 1;
    const MIXED: u16 = 1 << Self::COST_BITS;
    const SINGLE: u16 = 1 << (Self::COST_BITS + 1);
    const SEEN_SHIFT: u32 = Self::COST_BITS + 2;

    /// What one operation of `cost` proves: the cost of one operation
    /// divides it. Trusted at once: a new pair's first sub-window is its
    /// only evidence, and a sparse account of costly operations (one or two
    /// of cost 51 in it, 255/s or more from nothing) must not read as a
    /// surge on its first agents. One operation's own cost, not a sum's
    /// divisor (unless past the 12 bits, a lower bound then): a
    /// sub-window whose cost it does not divide shows that the pair's
    /// operations cost differently (see [`learn`](Self::learn)).
    pub(super) fn seeded(cost: u64) -> Quantum {
        let divisor = cost.clamp(1, u64::from(Self::MAX_COST)) as u16;
        let single = if u64::from(divisor) == cost {
            Self::SINGLE
        } else {
            0
        };
        Quantum((2 << Self::SEEN_SHIFT) | single | divisor)
    }

    /// Learns from a sub-window of `cost` (non-zero) that followed an
    /// empty one.
    ///
    /// When the divisor is one operation's own cost ([`seeded`](Self::seeded))
    /// and the sub-window's cost is not a multiple of it, the operations
    /// cost differently: that cost stands for one operation, as a
    /// [`sample`](Self::sample) of another cost would make it, rather than
    /// the divisor of the two. Publishes of 1 001 and 1 003 had a divisor
    /// of 1 until a guard window showed one of them, and early reports of
    /// single publishes meanwhile counted thousands of operations each:
    /// a chance spike from three agents read as proven, and an account at
    /// 0.95× of its limit was refused (`varying-fanout` at 0.95×, 4 seeds
    /// of 40).
    pub(super) fn learn(self, cost: u32) -> Quantum {
        let seen = (self.0 >> Self::SEEN_SHIFT).saturating_add(1).min(3);
        let known = u32::from(self.0) & Self::MAX_COST;
        let keep = self.0 & (Self::MIXED | Self::SINGLE);
        if !self.is_mixed()
            && self.0 & Self::SINGLE != 0
            && known != 0
            && !cost.is_multiple_of(known)
        {
            return Quantum((seen << Self::SEEN_SHIFT) | Self::MIXED | known as u16);
        }
        // Saturated: a cost beyond 12 bits stays the lower bound. Mixed:
        // the largest cost seen stands (see `sample`).
        let divisor = if self.is_mixed() || (known == Self::MAX_COST && cost >= known) {
            known
        } else {
            gcd(known, cost).min(Self::MAX_COST)
        };
        Quantum((seen << Self::SEEN_SHIFT) | keep | divisor as u16)
    }

    /// Learns from one operation's own `cost` (the one that closed a local
    /// guard's window, about one per window): once one costs other than
    /// the divisor, the pair's operations cost differently, and its
    /// divisor (1 for costs of 1 and 51) says nothing of how its count
    /// swings. A sub-window's cost varies as the sum of its operations'
    /// squared costs, which no scan sees; the largest cost seen stands for
    /// one operation from then on, so such a pair's chance swings (two
    /// operations of 51 in a sub-window that expected one) are weighed as
    /// chance, not as a surge of dozens of operations of 1. A lower bound
    /// of what a cautious count needs, reached within some seconds of
    /// samples. A pair whose operations all cost the same never changes.
    pub(super) fn sample(self, cost: u64) -> Quantum {
        let known = u32::from(self.0) & Self::MAX_COST;
        let cost = cost.clamp(1, u64::from(Self::MAX_COST)) as u32;
        if self.cost() == 0 || cost == known {
            return self;
        }
        let seen = self.0 & !(Self::MIXED | Self::MAX_COST as u16);
        if !self.is_mixed() && self.0 & Self::SINGLE == 0 && cost < known && known % cost == 0 {
            // The sparse sub-windows held two or more each: one
            // operation costs this, as far as anything shows yet.
            return Quantum(seen | cost as u16);
        }
        if self.is_mixed() {
            return Quantum(seen | Self::MIXED | known.max(cost) as u16);
        }
        // Becoming mixed: whether the first operations cost far less than
        // this one (see `cheap_first`).
        let cheap_first = if cost >= CHEAP_FIRST * known {
            Self::SINGLE
        } else {
            0
        };
        let seen = seen & !Self::SINGLE;
        Quantum(seen | Self::MIXED | cheap_first | known.max(cost) as u16)
    }

    /// What it says of the costs of the pair's operations, once it has
    /// learnt from `cost`, an operation's own (0: none; see
    /// [`sample`](Self::sample)): while they look alike, each costs at
    /// least the divisor, and the costliest is not known (an agent that
    /// never saw the rare costly one has a divisor of 1); once they
    /// differ, at least 1 and at most the costliest seen. Knowing nothing
    /// yet (a pair a master's answer made, which no check seeded), `cost`
    /// stands for the costliest.
    pub(super) fn bounds(self, cost: u64) -> CostBounds {
        let learnt = if cost > 0 { self.sample(cost) } else { self };
        let known = u64::from(learnt.cost());
        if learnt.is_mixed() || known == 0 {
            CostBounds::up_to(known.max(cost))
        } else {
            CostBounds {
                least: known,
                costliest: None,
            }
        }
    }

    /// Whether operations of different costs were seen.
    pub(super) fn is_mixed(self) -> bool {
        self.0 & Self::MIXED != 0
    }

    /// Whether the pair's operations cost differently and its first ones
    /// cost far less ([`CHEAP_FIRST`] times) than the costliest seen since:
    /// cost 1 beside cost 51, not publishes of 1 001 beside 1 003. (The
    /// bit that says, before costs differ, that the divisor is one
    /// operation's cost, says this once they do.)
    pub(super) fn cheap_first(self) -> bool {
        self.is_mixed() && self.0 & Self::SINGLE != 0
    }

    /// The cost of one operation, once two sub-windows have taught it; 0
    /// before.
    pub(super) fn cost(self) -> u32 {
        if self.0 >> Self::SEEN_SHIFT >= 2 {
            u32::from(self.0) & Self::MAX_COST
        } else {
            0
        }
    }
}

/// How many times the first operations' cost the costliest must be for
/// [`Quantum::cheap_first`].
const CHEAP_FIRST: u32 = 4;

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// What one pass over the pairs does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// At a sub-window's end: measures it, learns its noise, finds rises
    /// and falls.
    Close,
    /// Halfway through a sub-window: finds rises in its first half only,
    /// learning nothing, so a deluge is reported half a sub-window sooner.
    Peek,
}

impl AgentState {
    /// Measures every pair's attempted rate over `[since, now)` and offers
    /// each surge (by `rule`) to `report`, with the baseline it is measured
    /// against: the rate this agent's last early report said, while the
    /// master may still be counting it (that round or the next), or else
    /// the rate of the last rollup. When `report` takes it (returns
    /// `true`), that rate becomes the pair's baseline. Pairs of ops known
    /// to have no limit are skipped. Returns how many were taken.
    ///
    /// Off the hot path: one pass over the pairs per sub-window, by the
    /// round; it reads the counters `check` adds to and never writes them.
    pub fn scan_surges(
        &self,
        since: Nanos,
        now: Nanos,
        rule: &SurgeRule,
        report: impl FnMut(Pair<'_>, SurgeRates) -> bool,
    ) -> usize {
        self.scan_surges_confirming(since, now, rule, report, |_| {})
    }

    /// [`scan_surges`](Self::scan_surges), and hands `confirm` each pair
    /// that the local guard refuses under its op's default limit while no
    /// master has answered for it, once: its own limit may be far above the
    /// default (an account with an override), and a query to its master
    /// (which counts nothing) brings it one round trip later rather than
    /// with the first rollup's reply, a round later. An early report would
    /// not do: its rate is a sub-window's, which for a few costly
    /// operations reads far above the account's.
    pub fn scan_surges_confirming(
        &self,
        since: Nanos,
        now: Nanos,
        rule: &SurgeRule,
        report: impl FnMut(Pair<'_>, SurgeRates) -> bool,
        mut confirm: impl FnMut(Pair<'_>),
    ) -> usize {
        self.pass(Pass::Close, since, now, rule, report, &mut confirm)
    }

    /// Halfway through the sub-window that began at `since` (the last
    /// [`scan_surges`](Self::scan_surges)), offers the pairs whose rate
    /// over its first half already rose to a surge, against that half's
    /// larger noise; changes nothing else, so the sub-window's own scan
    /// measures it whole. Falls wait for the whole sub-windows, and so do
    /// follow-ups of pairs reported early this round: traffic that comes
    /// in lumps (every 250 ms, say) reads twice its rate or nothing over
    /// half a sub-window, and a peek's follow-up of it would be reported
    /// back down at the close, and up again at the next peek, every scan.
    pub fn peek_surges(
        &self,
        since: Nanos,
        now: Nanos,
        rule: &SurgeRule,
        report: impl FnMut(Pair<'_>, SurgeRates) -> bool,
    ) -> usize {
        self.pass(Pass::Peek, since, now, rule, report, &mut |_| {})
    }

    fn pass(
        &self,
        pass: Pass,
        since: Nanos,
        now: Nanos,
        rule: &SurgeRule,
        mut report: impl FnMut(Pair<'_>, SurgeRates) -> bool,
        confirm: &mut dyn FnMut(Pair<'_>),
    ) -> usize {
        let secs = now.since(since).as_secs_f64();
        if secs <= 0.0 {
            return 0;
        }
        // A close takes the mark down before it reads any pair, so what is
        // counted after its read of a pair marks the sub-window again; a
        // peek into a sub-window nothing was counted in has nothing to see
        // (every pair's cost 0, and a peek writes nothing), and a busy
        // agent's memory need not stream by for it.
        match pass {
            Pass::Close => self.counted.store(false, SeqCst),
            Pass::Peek if !self.counted.load(SeqCst) => return 0,
            Pass::Peek => {}
        }
        // A half sub-window's rate moves √2 times as much by chance.
        let scale = (rule.window().as_secs_f64() / secs).max(1.0).sqrt();
        let round = self.report_round(now);
        let op_limits = self.op_default_limits();
        let pinned = self.pairs.pin();
        let window = rule.window().as_secs_f64();
        let interval = self.config.rollup_interval.as_secs_f64();
        let mut taken = 0;
        for found in pinned.pairs() {
            let entry = found.entry();
            let (total, ops_now) = entry.attempted();
            let (before, ops_before) = match pass {
                Pass::Close => (
                    entry.surge_total.replace(total),
                    entry.surge_ops.replace(ops_now),
                ),
                Pass::Peek => (
                    entry.surge_total.load(Relaxed),
                    entry.surge_ops.load(Relaxed),
                ),
            };
            let cost = total.wrapping_sub(before);
            let rate = f64::from(cost) / secs;
            let (baseline, surged) = entry.told_rate(round);
            // A young peek reported it within this sub-window, which
            // began before it: its rate here reads low, and is no fall.
            let young = pass == Pass::Close && entry.scanned(YOUNG_REPORTED);
            if young {
                entry.set_scanned(YOUNG_REPORTED, false);
            }
            if pass == Pass::Close && self.config.low_noise && self.config.pace {
                entry.pace(
                    now,
                    (!surged).then_some(baseline),
                    secs,
                    interval,
                    cost,
                    self.config.freeze_sparse,
                );
            }
            // Nothing in this sub-window nor the last two, and no noise left
            // to decay: nothing can change, and nothing can surge (a fall
            // needs a rate before it). Most pairs of a busy node, most of
            // the time.
            if cost == 0 && (pass == Pass::Peek || entry.is_quiet()) {
                continue;
            }
            // The run of empty sub-windows a suppressed pair's fall hint is
            // judged on (a pair whose flood just stopped is not quiet for
            // many sub-windows yet, its noise decaying slowly).
            if pass == Pass::Close {
                entry.note_empty(cost == 0);
            }
            if pass == Pass::Close && entry.guarded_unconfirmed() && !entry.scanned(CONFIRM_ASKED) {
                entry.set_scanned(CONFIRM_ASKED, true);
                confirm(Pair::new(found.account().as_str(), found.op()));
            }
            let Some(limit) = entry.scan_limit(|| found.op(), &op_limits) else {
                continue;
            };
            // The noise as it stood before this sub-window closed,
            // computed when a test needs it (see `SurgeRule::is_surge_with`).
            // The last whole sub-window's rate, before a close replaces
            // it: a sparse hint's span reaches back over it.
            let (rate, steps, scale, last_window) = match pass {
                Pass::Close => {
                    let (rate, steps, last) =
                        entry.close_sub_window(rate, cost, f64::from(baseline));
                    (rate, steps, 1.0, last)
                }
                // See `peek_surges`: no follow-up on half a sub-window.
                Pass::Peek if rate <= f64::from(baseline) || surged => continue,
                Pass::Peek => (
                    rate,
                    entry.surge_noise.load(Relaxed),
                    scale,
                    entry.last_window_rate(),
                ),
            };
            if young {
                continue;
            }
            // Rises follow up this round's early report, and falls any
            // report, of a pair its master suppresses; falls also follow
            // up this round's early report of a chance lump, whatever the
            // master said (see `CHANCE_OPS`).
            let suppressed = entry.master_suppressed();
            let fell = rate < f64::from(baseline);
            let follow_up = suppressed && (surged || fell) || surged && fell && entry.told_chance();
            let noise = OnceCell::new();
            let noise = || {
                *noise.get_or_init(|| {
                    let noise = entry.noise(steps, scale, f64::from(baseline), secs);
                    if follow_up && surged {
                        let share = if rate < f64::from(baseline) {
                            REPORTED_NOISE_SHARE
                        } else {
                            RISE_NOISE_SHARE
                        };
                        entry.noise_after_report(noise, f64::from(baseline), secs, share)
                    } else {
                        noise
                    }
                })
            };
            let rate = if rule.is_surge_with(rate, f64::from(baseline), follow_up, limit, noise) {
                rate
            } else if pass == Pass::Close
                && suppressed
                && let Some(slow) = entry.slow_fall(f64::from(baseline), noise())
            {
                slow
            } else {
                let hint = if !self.config.sparse_hints {
                    None
                } else if suppressed && pass == Pass::Close {
                    // Perhaps a hint of a flood's end spread over many.
                    entry.sparse_fall_hint(f64::from(baseline), window)
                } else if !suppressed && !surged && (cost > 0 || entry.scanned(HINTED)) {
                    // Not a surge on this agent: perhaps a hint of one
                    // spread over many (see `hint`). Tested only when
                    // something came since the last scan, whose span held
                    // every operation this one's does (a close's over the
                    // same length, a peek's over half a sub-window more),
                    // or when a hint that stands may let go.
                    let span = HintSpan {
                        cost: f64::from(cost) + last_window * window,
                        secs: secs + window,
                        window,
                        interval,
                        close: pass == Pass::Close,
                        steps,
                        limit,
                        covered: last_window > 0.0,
                    };
                    entry.sparse_hint(f64::from(baseline), span)
                } else {
                    None
                };
                if let Some(hint) = hint
                    && report(Pair::new(found.account().as_str(), found.op()), hint)
                {
                    entry.set_scanned(HINTED, true);
                    taken += 1;
                }
                continue;
            };
            let ops = ops_between(ops_before, ops_now);
            let rates = entry.rise_report(
                rate,
                (baseline, surged),
                (u64::from(cost), ops),
                now.since(since),
            );
            if report(Pair::new(found.account().as_str(), found.op()), rates) {
                entry.told_early(rates.rate, round, Some(rise_counted(&rates)));
                taken += 1;
            }
        }
        taken
    }
}

/// The most operations an early report of a rise may count and still be
/// taken back, when it passes, by a pair its master does not suppress
/// (and the falls that follow it, down to the next rise): a lump this
/// small is as likely chance as the start of a surge. The master holds
/// each agent's last early report until the round, so the chance lumps of
/// an account of sparse costly operations under its limit (one publish of
/// 51 in half a sub-window reads 580/s on an agent whose share is 140/s),
/// each reported as it came and none taken back, added up to twice its
/// limit within half a second (`mixed-costs` at 0.95×: 21 seeds of 90
/// refused, 71–2 764 cost each; 3 after, 76–388). A rise of many
/// operations is not taken back: a flood that comes in lumps a second
/// apart (the `fleet` bench) reads as falls between them, and following
/// those up released one such flood at 10× its limit to 1.4×.
pub(super) const CHANCE_OPS: u32 = 4;

/// [`Entry::surge_rate`]'s sign bit (rates are never negative): whether
/// the early report counted a chance lump (see [`CHANCE_OPS`]).
const TOLD_CHANCE: u32 = 1 << 31;

/// How many operations of `quantum` each (0: not known) a measured `cost`
/// holds: 0 when unknown.
pub(super) fn ops_in(cost: u64, quantum: u32) -> u32 {
    cost.checked_div(u64::from(quantum))
        .map_or(0, |n| n.min(u64::from(u32::MAX)) as u32)
}

/// What an early report counted of a rise from the rate it was sent
/// against (`baseline`): a chance lump, or not ([`CHANCE_OPS`]), as
/// [`Entry::told_early`] judges it; 0 for a fall, even one that counts its
/// operations in case the master takes it against the agent's last rollup
/// ([`Entry::rise_report`]).
pub(super) fn rise_counted(rates: &SurgeRates) -> u32 {
    if rates.rate > rates.baseline {
        rates.ops
    } else {
        0
    }
}

/// How many operations a sub-window of `cost` in `ops` operations weighs
/// as for its chance scatter: `cost² ÷ Σc²`, the squares bounded by what
/// the scans know of its costs ([`Quantum::bounds`],
/// [`guard::effective_cost`](super::guard::effective_cost)); 0 (not said)
/// while they know nothing, as before operations were counted.
///
/// A sub-window's cost over the quantum counted one publish to 1 000
/// subscribers, among cheap operations on an agent that had seen none
/// before (a divisor of 1), as 1 008 operations: a certain rise, and an
/// account at 0.95× of its limit (1.4 such publishes and 1 425 cheap
/// operations a second over 20 agents) was refused 14% of its cost in
/// every seed. Bounded, it counts as one.
pub(super) fn counted_ops(cost: u64, ops: u32, quantum: Quantum) -> u32 {
    if quantum.cost() == 0 || ops == 0 || u64::from(ops) > cost {
        // The count is unknown (or wrapped): as before counts were kept.
        return ops_in(cost, quantum.cost());
    }
    let unit = super::guard::effective_cost(cost as f64, f64::from(ops), quantum.bounds(0));
    (cost as f64 / unit).round().clamp(1.0, f64::from(ops)) as u32
}

impl AgentState {
    /// The round whose reports will carry the sub-window that ends at
    /// `now`, as an entry keeps it (`surge_round`: the grid index of its
    /// end modulo 2^16, never 0, which means none).
    pub(super) fn report_round(&self, now: Nanos) -> u16 {
        let r = duration_nanos(self.config.rollup_interval).max(1);
        ((now.as_nanos().saturating_sub(1) / r + 1) as u16).max(1)
    }

    /// Each known op's default limit, as replies said it (see
    /// [`OpInfo::default_limit`](super::entry::OpInfo)), taken once per pass.
    pub(super) fn op_default_limits(&self) -> HashMap<Box<str>, Option<f64>> {
        let ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        ops.iter()
            .map(|(k, v)| (k.clone(), v.default_limit))
            .collect()
    }
}

impl Entry {
    /// The limit a scan judges this pair by: the master's (or its
    /// account's override) when known, else its op's default; `None` when
    /// it has none at all (unlimited: an op with no default, and no limit
    /// from a master). `Some(None)`: not known yet.
    /// `op` gives the pair's op name only when needed: most pairs a scan
    /// reaches have their master's limit, and the name's lookup (two
    /// lazily made cells) was 6% of the scans' time.
    pub(super) fn scan_limit<'o>(
        &self,
        op: impl FnOnce() -> &'o str,
        op_limits: &HashMap<Box<str>, Option<f64>>,
    ) -> Option<Option<f64>> {
        let (own, _) = super::entry::limit_of(self.limit.load(Relaxed));
        if own > 0.0 {
            return Some(Some(own));
        }
        match op_limits.get(op()).copied().flatten() {
            Some(0.0) => None,
            known => Some(known),
        }
    }

    /// Notes that an early report told the pair's master `rate` in
    /// `round` (see [`told_rate`](Self::told_rate)): a change the scans
    /// judged, counting `judged` operations (`Some(0)`: a fall, or not
    /// known), or (`None`) a poll's answer or a join, which the master
    /// asked for or the ring moved. A rise of a chance lump, or a fall
    /// from one, is marked so (see [`CHANCE_OPS`]); a poll's answer or a
    /// join never is.
    pub(super) fn told_early(&self, rate: f32, round: u16, judged: Option<u32>) {
        let before = self.surge_rate.load(Relaxed);
        let chance = match judged {
            None => false,
            Some(0) => before & TOLD_CHANCE != 0 && rate < f32::from_bits(before & !TOLD_CHANCE),
            Some(ops) => ops <= CHANCE_OPS,
        };
        let word = rate.abs().to_bits() | if chance { TOLD_CHANCE } else { 0 };
        self.surge_rate.store(word, Relaxed);
        self.surge_round.store(round, Relaxed);
    }

    /// The rate over the last sub-window the scans closed, cost per
    /// second (0 before the first).
    pub(super) fn last_window_rate(&self) -> f64 {
        f64::from(f32::from_bits(self.window_rate.load(Relaxed)))
    }

    /// What the scans know of the pair's cost per operation.
    pub(super) fn quantum(&self) -> Quantum {
        Quantum(self.quantum.load(Relaxed))
    }

    /// The cost of one operation as the scans learnt it (see [`Quantum`]):
    /// 0 until they trust it.
    pub(super) fn op_cost(&self) -> u32 {
        self.quantum().cost()
    }

    /// The cost of one operation for the noise a rise is judged by: the
    /// learnt one ([`op_cost`](Self::op_cost)), but 1 for a pair in the
    /// first two seconds of its youth (`young_for_rises`) whose first
    /// operations cost far less than its costliest
    /// ([`Quantum::cheap_first`]; see [`Entry::seed_quantum`]). Its checks
    /// show the scans every cost, so it soon knows its costliest, and
    /// judged by that from its start, each agent's share of a deluge
    /// spread over many agents (20 agents, 150 a sub-window each, half
    /// the cost in operations of 51) stood within the noise of counting
    /// three such operations, and no agent reported it: a 10× deluge was
    /// held in its third second rather than its first. Judged as counts
    /// of 1, as before the costs were seen, every agent reports it, and
    /// the master weighs the sum by the operations the costliest cost
    /// counts ([`Entry::rise_report`]): a deluge is proven by twenty such reports,
    /// and an account at 0.95× of its limit, whose rises are chance, is
    /// not. Publishes of 1 001 and 1 003 are judged by their own cost:
    /// judged as counts of 1, every publish read as a rise, and the
    /// master, weighing hundreds of them, was refused one by chance.
    pub(super) fn rise_cost(&self) -> u32 {
        let quantum = self.quantum();
        if quantum.cheap_first() && super::entry::young_for_rises(self.local_start.load(Relaxed)) {
            quantum.cost().min(1)
        } else {
            quantum.cost()
        }
    }

    /// The rate this agent last told the pair's master, and whether it was
    /// an early report's (still in the master's surge estimate in `round`,
    /// the round it was sent in or the next) rather than a rollup's.
    pub(super) fn told_rate(&self, round: u16) -> (f32, bool) {
        let surge_round = self.surge_round.load(Relaxed);
        if surge_round != 0 && round.wrapping_sub(surge_round) <= 1 {
            (self.told_early_rate(), true)
        } else {
            (f32::from_bits(self.reported_rate.load(Relaxed)), false)
        }
    }

    /// An early report of `rate` over `ops` operations against `baseline`,
    /// what this agent last told the master ([`told_rate`](Self::told_rate));
    /// a follow-up (`surged`) also says what its last rollup said (see
    /// [`SurgeRates::rollup_baseline`]).
    pub(super) fn early_report(
        &self,
        rate: f32,
        (baseline, surged): (f32, bool),
        ops: u32,
    ) -> SurgeRates {
        SurgeRates {
            rate,
            baseline,
            surged,
            ops,
            rollup_baseline: surged.then(|| f32::from_bits(self.reported_rate.load(Relaxed))),
            ..SurgeRates::default()
        }
    }

    /// An early report of a scan's or a young peek's `rate`, over a `span`
    /// of `cost` in `ops` operations, against `told` (what this agent last
    /// told the master, [`told_rate`](Self::told_rate)). A rise says what
    /// it counted ([`counted_ops`]) and over how long
    /// ([`SurgeRates::span`]), so the master weighs a jump summed
    /// from a few sub-windows by their Poisson noise before it suppresses
    /// on it (two agents that a 0.95× account moved onto read 19% high
    /// over their first peek one time in forty, and the jump stood until
    /// its round after next); a fall says 0, the master weighing it
    /// otherwise. A rise from the least rate the master may hold for this
    /// agent: a follow-up may be taken against its last rollup's rate
    /// ([`SurgeRates::rollup_baseline`]), and a fall from a lump is then a
    /// rise (uncounted, a single publish of 1 001 that followed up its own
    /// lump in a fresh estimate stood as an unproven 5 075/s, and
    /// suppressed an account at 0.95× of its limit).
    pub(super) fn rise_report(
        &self,
        rate: f64,
        told: (f32, bool),
        (cost, ops): (u64, u32),
        span: Duration,
    ) -> SurgeRates {
        let mut rates = self.early_report(rate as f32, told, 0);
        let from = rates
            .rollup_baseline
            .map_or(told.0, |rollup| told.0.min(rollup));
        if rate > f64::from(from) {
            rates.ops = counted_ops(cost, ops, self.quantum());
        }
        rates.with_span(span)
    }

    /// The rate the last early report said, of whichever round.
    pub(super) fn told_early_rate(&self) -> f32 {
        f32::from_bits(self.surge_rate.load(Relaxed) & !TOLD_CHANCE)
    }

    /// Whether the last early report was of a chance lump, or a fall from
    /// one (see [`CHANCE_OPS`]).
    fn told_chance(&self) -> bool {
        self.surge_rate.load(Relaxed) & TOLD_CHANCE != 0
    }

    /// Whether the last two sub-windows were empty and the noise has
    /// decayed to nothing.
    fn is_quiet(&self) -> bool {
        self.window_rate.load(Relaxed) == 0
            && self.held_rate.load(Relaxed) == 0
            && self.surge_noise.load(Relaxed) == 0
    }

    /// The noise a rate over `secs` is judged by against `baseline`, from
    /// `steps` (the bits of a value `surge_noise` held): the measured
    /// sub-window noise (a standard deviation, cost per second), times
    /// `scale` for a shorter span, and never below the noise of counting
    /// operations of the learnt cost ([`counting_noise`]).
    fn noise(&self, steps: u32, scale: f64, baseline: f64, secs: f64) -> f64 {
        // The mean squared step between sub-windows is twice their
        // variance.
        let steps = f64::from(f32::from_bits(steps));
        let quantum = self.rise_cost();
        ((steps / 2.0).sqrt() * scale).max(counting_noise(quantum, baseline, secs))
    }

    /// The noise a further change is judged by, after an early report of
    /// `baseline` this round: the measured noise holds the step the
    /// reported change made (a flood of 5 000/s that stopped early in a
    /// sub-window is reported at 875/s, one step of 4 000), and it would
    /// take seconds to decay, while the rest of the change (875 to the
    /// 125/s left) waited for the round. So no more than `share` of what
    /// was reported ([`REPORTED_NOISE_SHARE`] for a fall,
    /// [`RISE_NOISE_SHARE`] for a rise), and never under the noise of
    /// counting.
    fn noise_after_report(&self, noise: f64, baseline: f64, secs: f64, share: f64) -> f64 {
        let quantum = self.rise_cost();
        let floor = counting_noise(quantum, baseline, secs);
        noise.min((share * baseline).max(floor))
    }

    /// Closes a sub-window of `cost` (`rate` per second over `secs`):
    /// learns its noise and cost per operation, and returns the rate to
    /// judge against `baseline` (for a fall, the higher of the last two
    /// sub-windows') with the noise to judge it by, as the bits of
    /// `surge_noise` before this sub-window ([`noise`](Self::noise)
    /// makes it a standard deviation), and the rate of the sub-window
    /// before this one.
    fn close_sub_window(&self, rate: f64, cost: u32, baseline: f64) -> (f64, u32, f64) {
        let previous = f64::from(f32::from_bits(
            self.window_rate.replace((rate as f32).to_bits()),
        ));
        if previous == 0.0 && cost > 0 {
            let quantum = Quantum(self.quantum.load(Relaxed)).learn(cost);
            self.quantum.store(quantum.0, Relaxed);
        }
        // The noise is measured on the higher of each two sub-windows'
        // rates, the series a fall is judged on: traffic in bursts a
        // little longer apart than a sub-window (a client that publishes
        // every 250 ms) leaves single sub-windows empty, and measured on
        // them alone it would read as noise so large that a flood that
        // really stops is not seen until its round.
        let held = rate.max(previous);
        let held_before = f64::from(f32::from_bits(
            self.held_rate.replace((held as f32).to_bits()),
        ));
        let steps_before = self.surge_noise.load(Relaxed);
        // Every step counts, surges too: a rate that keeps jumping back
        // and forth is noise however large, and one real jump raises the
        // bar only for a second or two.
        let step = held - held_before;
        let steps = f64::from(f32::from_bits(steps_before));
        let steps = (1.0 - NOISE_WEIGHT) * steps + NOISE_WEIGHT * step * step;
        // Below a millionth of a unit of cost per second, it is nothing (and
        // the pair can be skipped while it stays quiet).
        let steps = if steps < 1e-12 { 0.0 } else { steps };
        self.surge_noise.store((steps as f32).to_bits(), Relaxed);
        let slow = f64::from(f32::from_bits(self.slow_rate.load(Relaxed)));
        let slow = if slow == 0.0 {
            rate
        } else {
            slow + SLOW_WEIGHT * (rate - slow)
        };
        self.slow_rate.store((slow as f32).to_bits(), Relaxed);
        // A fall must hold for two sub-windows (see `is_surge`).
        let rate = if rate < baseline { held } else { rate };
        (rate, steps_before, previous)
    }

    /// The slow rate, when it has fallen from `baseline` by a
    /// [`FOLLOW_UP_JUMP`] and by [`SLOW_FALL_SIGMAS`] of its own noise
    /// (`noise`, a sub-window's, scaled to the moving mean's): a fall of
    /// a suppressed pair too small to see in two sub-windows, seen in
    /// about a second.
    fn slow_fall(&self, baseline: f64, noise: f64) -> Option<f64> {
        let slow = f64::from(f32::from_bits(self.slow_rate.load(Relaxed)));
        let held = f64::from(f32::from_bits(self.held_rate.load(Relaxed)));
        let noise = noise * (SLOW_WEIGHT / (2.0 - SLOW_WEIGHT)).sqrt();
        // The last two sub-windows at or below the mean: falling, not a
        // mean still catching up with a rise.
        let falling = held <= slow;
        (falling
            && slow > 0.0
            && slow * FOLLOW_UP_JUMP <= baseline
            && baseline - slow > SLOW_FALL_SIGMAS * noise)
            .then_some(slow)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;
    use crate::agent::AgentConfig;

    const T0: Nanos = Nanos::from_secs(1_800_000_000);

    fn at(ms: u64) -> Nanos {
        T0 + Duration::from_millis(ms)
    }

    /// Scans every 200 ms from `from` to `to` ms, calling `traffic(ms)` at
    /// each 10-ms step before; returns the rates taken as surges.
    fn scan(
        state: &AgentState,
        from: u64,
        to: u64,
        mut traffic: impl FnMut(u64) -> u64,
    ) -> Vec<(u64, SurgeRates)> {
        let rule = SurgeRule::default_for(Duration::from_secs(2));
        let mut rng = SmallRng::seed_from_u64(from);
        let mut taken = Vec::new();
        for ms in (from..to).step_by(10) {
            for _ in 0..traffic(ms) {
                state.check(at(ms), "acme", "messages", 1, &mut rng);
            }
            if (ms + 10) % 200 == 0 {
                let end = ms + 10;
                state.scan_surges(at(end - 200), at(end), &rule, |_, rates| {
                    taken.push((end, rates));
                    true
                });
            }
        }
        taken
    }

    /// A client that sends a burst every 250 ms leaves every fifth
    /// 200-ms sub-window empty: no fall is reported for it, but when the
    /// bursts stop the fall is, two sub-windows later.
    #[test]
    fn a_fall_must_hold_for_two_sub_windows() {
        let state = AgentState::new(AgentConfig::default());
        // Bursts of 500 or so: of single operations (bursts all of one
        // size would look like sparse operations of that cost).
        let bursts = |ms: u64| {
            if ms.is_multiple_of(250) {
                497 + ms / 250 % 7
            } else {
                0
            }
        };
        // The onset is a jump (no limit is known yet, so any jump counts).
        assert_eq!(scan(&state, 0, 2_000, bursts).len(), 1);
        // The round's rollup: 2 000/s, the baseline.
        state.drain(Nanos::ZERO, |_, _, _| {});
        assert_eq!(scan(&state, 2_000, 10_000, bursts), vec![]);
        let taken = scan(&state, 10_000, 10_600, |_| 0);
        let [(end, rates)] = &taken[..] else {
            panic!("{taken:?}")
        };
        // The last burst was at 9 750: the sub-windows ending at 10 000 and
        // 10 200 are empty.
        assert_eq!(*end, 10_200);
        assert_eq!(rates.rate, 0.0);
        assert!((1_990.0..2_030.0).contains(&rates.baseline), "{rates:?}");
        assert_eq!(rates.ops, 0, "a fall counts nothing");
        assert_eq!(rates.span, None, "nor says its span");
    }

    /// A suppressed flood that stops 40 ms into a sub-window leaves it a
    /// fifth of the flood: the fall is reported in two steps (a fall holds
    /// for two sub-windows, so the first at 4 400 ms reads the part), the
    /// rest of it one sub-window later, not at the round (the step the
    /// first report made is not the pair's noise at its new level).
    #[test]
    fn a_fall_reported_in_part_is_followed_up_within_the_round() {
        let state = AgentState::new(AgentConfig::default());
        let flood = |ms: u64| if ms.is_multiple_of(20) { 100 } else { 0 };
        scan(&state, 0, 2_000, flood);
        state.drain(Nanos::ZERO, |_, _, _| {});
        let valid = Duration::from_secs(10);
        state.apply(at(2_000), "acme", "messages", 0.9, 500.0, valid);
        assert_eq!(scan(&state, 2_000, 4_000, flood), vec![]);
        // Stops at 4 040 ms; 100/s goes on.
        let stopped = |ms: u64| match ms {
            ..4_040 => flood(ms),
            _ => u64::from(ms.is_multiple_of(100)),
        };
        let taken = scan(&state, 4_000, 6_000, stopped);
        let ends: Vec<u64> = taken.iter().map(|(end, _)| *end).collect();
        assert_eq!(ends, [4_400, 4_600], "{taken:?}");
        // A fifth of the flood and the rest, then what is left.
        let (first, second) = (taken[0].1, taken[1].1);
        assert!((1_000.0..1_100.0).contains(&first.rate), "{first:?}");
        assert_eq!(second.baseline, first.rate);
        assert!(second.rate <= 20.0, "{second:?}");
    }

    /// A deluge that starts 50 ms into a sub-window fills three quarters
    /// of it: reported at that, and once suppressed, at its full size from
    /// the next sub-window (a rise of 1.32×, under the step the first
    /// report made in the pair's noise), not only at the round.
    #[test]
    fn a_rise_reported_in_part_is_followed_up_to_its_full_size() {
        let state = AgentState::new(AgentConfig::default());
        let calm = |ms: u64| u64::from(ms.is_multiple_of(100));
        scan(&state, 0, 4_000, calm);
        state.drain(Nanos::ZERO, |_, _, _| {});
        let flood = |ms: u64| if ms >= 4_050 { 50 } else { calm(ms) };
        let first = scan(&state, 4_000, 4_200, flood);
        let [(4_200, first)] = first[..] else {
            panic!("{first:?}")
        };
        assert!((3_700.0..3_800.0).contains(&first.rate), "{first:?}");
        let valid = Duration::from_secs(10);
        state.apply(at(4_200), "acme", "messages", 0.8, 1_000.0, valid);
        let taken = scan(&state, 4_200, 6_000, flood);
        let [(4_400, full)] = taken[..] else {
            panic!("{taken:?}")
        };
        assert_eq!(full.baseline, first.rate);
        assert_eq!(full.rate, 5_000.0);
    }

    /// A suppressed flood that comes in lumps every 250 ms (a batching
    /// publisher, or the simulator's steps) reads twice its rate or
    /// nothing over a 100-ms half sub-window. A peek's follow-up of it
    /// would report the double, the sub-window's close the fall back, and
    /// so on at every scan: ten early reports a second to its master, and
    /// an estimate that swings. Follow-ups wait for whole sub-windows.
    #[test]
    fn a_lumpy_suppressed_flood_is_not_reported_at_every_scan() {
        let state = AgentState::new(AgentConfig::default());
        let rule = SurgeRule::default_for(Duration::from_secs(2));
        let mut rng = SmallRng::seed_from_u64(4);
        let calm = |ms: u64| u64::from(ms.is_multiple_of(100));
        let lumps = |ms: u64| if ms.is_multiple_of(250) { 200 } else { 0 };
        let mut reports = Vec::new();
        let mut last_close = at(0);
        for ms in (0..10_000u64).step_by(10) {
            let ops = if ms < 4_000 { calm(ms) } else { lumps(ms) };
            for _ in 0..ops {
                state.check(at(ms), "acme", "messages", 1, &mut rng);
            }
            let end = ms + 10;
            // The rounds' rollups (what a pair's baseline falls back to).
            if end.is_multiple_of(2_000) {
                state.drain(Nanos::ZERO, |_, _, _| {});
            }
            if !end.is_multiple_of(100) {
                continue;
            }
            let mut taken = |_: Pair<'_>, rates: SurgeRates| {
                reports.push((end, rates));
                true
            };
            if end.is_multiple_of(200) {
                state.scan_surges(last_close, at(end), &rule, &mut taken);
                last_close = at(end);
            } else {
                state.peek_surges(last_close, at(end), &rule, &mut taken);
            }
            // The master suppresses it from its first early report on.
            if reports.len() == 1 && reports[0].0 == end {
                state.apply(
                    at(end),
                    "acme",
                    "messages",
                    0.8,
                    160.0,
                    Duration::from_secs(60),
                );
            }
        }
        let later: Vec<_> = reports.iter().filter(|(end, _)| *end >= 5_000).collect();
        assert!(later.len() <= 1, "{later:?}");
    }

    /// Sparse operations of cost 51 (under one per sub-window) jump from
    /// nothing to 255/s by chance; once the scans have learnt that the
    /// account moves in steps of 51, such a jump is not a surge, while a
    /// deluge of the same operations is.
    #[test]
    fn sparse_costly_operations_are_counted_not_measured() {
        let state = AgentState::new(AgentConfig::default());
        let rule = SurgeRule::default_for(Duration::from_secs(2));
        let mut rng = SmallRng::seed_from_u64(9);
        // Quantum learnt from single operations after empty sub-windows.
        let mut taken = 0;
        for window in 0..40u64 {
            if window % 4 == 1 {
                state.check(at(window * 200 + 50), "acme", "messages", 51, &mut rng);
            }
            let end = at(window * 200 + 200);
            taken += state.scan_surges(end - Duration::from_millis(200), end, &rule, |_, _| true);
        }
        // A quiet minute: the measured noise fades, the quantum stays.
        for window in 40..340u64 {
            let end = at(window * 200 + 200);
            state.scan_surges(end - Duration::from_millis(200), end, &rule, |_, _| true);
        }
        // Two operations in a sub-window: 510/s against a baseline of 0.
        state.check(at(68_050), "acme", "messages", 51, &mut rng);
        state.check(at(68_060), "acme", "messages", 51, &mut rng);
        let two = state.scan_surges(at(68_000), at(68_200), &rule, |_, _| true);
        assert_eq!(two, 0, "two operations of 51 are chance");
        // Forty: a deluge.
        for i in 0..40 {
            state.check(at(68_210 + i), "acme", "messages", 51, &mut rng);
        }
        let deluge = state.scan_surges(at(68_200), at(68_400), &rule, |_, _| true);
        assert_eq!(deluge, 1);
        // Without the learnt quantum the first chance single operation
        // after the first onset would have been a surge too.
        assert!(taken <= 2, "{taken}");
    }

    #[test]
    fn the_quantum_is_trusted_from_the_second_sub_window_after_an_empty_one() {
        let q = Quantum::default().learn(75);
        assert_eq!(q.cost(), 0, "the first may be a deluge's first");
        assert_eq!(q.learn(51).cost(), 3);
        assert_eq!(q.learn(150).cost(), 75);
        assert_eq!(
            Quantum::default().learn(1 << 20).learn(1 << 20).cost(),
            (1 << 12) - 1
        );
    }

    #[test]
    fn an_operation_of_another_cost_makes_the_largest_stand_for_one() {
        // All of one cost: samples change nothing, the divisor stands.
        let single = Quantum::seeded(51).learn(102);
        assert_eq!(single.sample(51), single);
        assert_eq!(single.cost(), 51);
        // Costs of 1 and 51: the divisor 1 says nothing of the swings;
        // once a 51 is seen it stands, and sparse sub-windows (52, 1) no
        // longer bring it down.
        let mixed = Quantum::seeded(1).sample(51);
        assert_eq!(mixed.cost(), 51);
        assert_eq!(mixed.learn(52).learn(1).cost(), 51);
        assert_eq!(mixed.sample(1).cost(), 51);
        assert_eq!(mixed.sample(1_001).cost(), 1_001);
        // Not trusted yet: nothing to correct.
        assert_eq!(Quantum::default().sample(51), Quantum::default());
        // Learnt from sparse sub-windows that each held two: one operation
        // of half shows the divisor was coarse, not that costs differ.
        let coarse = Quantum::default().learn(102).learn(102);
        assert_eq!(coarse.cost(), 102);
        assert_eq!(coarse.sample(51).cost(), 51);
        assert_eq!(coarse.sample(51).sample(51), coarse.sample(51));
        // Costs of 51 then 1: the first check showed one operation of 51,
        // so one of 1 shows the costs differ, and the 51 stands.
        assert_eq!(Quantum::seeded(51).sample(1).cost(), 51);
        assert_eq!(Quantum::seeded(51).sample(1).sample(51).cost(), 51);
    }

    #[test]
    fn a_sub_window_the_first_cost_does_not_divide_shows_mixed_costs() {
        // Publishes of 1 001 and 1 003: the divisor of the two is 1, but
        // the first check showed one operation of 1 001, so a sub-window
        // of 2 004 (one of each) shows the costs differ; 1 001 stands.
        let q = Quantum::seeded(1_001).learn(2_004);
        assert_eq!(q.cost(), 1_001);
        assert_eq!(q.learn(1_003).learn(3_007).cost(), 1_001);
        // One cost: its multiples change nothing.
        let one = Quantum::seeded(51).learn(153).learn(102);
        assert_eq!(one.cost(), 51);
        assert_eq!(one, Quantum::seeded(51).learn(51).learn(51));
        // Costs of 1 and 51, the first a 1: 1 divides everything, so the
        // sub-windows show nothing (the guard windows' samples will).
        assert_eq!(Quantum::seeded(1).learn(53).cost(), 1);
        // A first cost past 12 bits is a lower bound, not one operation's
        // cost: a sub-window it does not divide shows nothing.
        assert!(!Quantum::seeded(10_000).learn(5_000).is_mixed());
        assert!(Quantum::seeded(4_000).learn(5_000).is_mixed());
    }

    /// What an early report's sub-window counts: its operations when
    /// they all cost alike, and what their costs' squares allow when they
    /// differ, whether the costliest is known or not.
    #[test]
    fn a_sub_window_counts_what_its_costs_squares_allow() {
        let ones = Quantum::seeded(1);
        let fifty_ones = Quantum::seeded(51);
        let mixed = Quantum::seeded(1).sample(51);
        // One publish to 1 000 subscribers among 7 cheap operations, on an
        // agent that never saw one: one operation, not 1 008.
        assert_eq!(counted_ops(1_008, 8, ones), 1);
        assert_eq!(ones.bounds(0).costliest, None);
        // The same once the costliest is known.
        assert_eq!(counted_ops(1_008, 8, Quantum::seeded(1).sample(1_001)), 1);
        // Costs all alike count as themselves.
        assert_eq!(counted_ops(15, 15, ones), 15);
        assert_eq!(counted_ops(510, 10, fifty_ones), 10);
        assert_eq!(counted_ops(15, 15, mixed), 15);
        // Two publishes of 51 and 15 cheap operations: Σc² is 5 217
        // exactly for two costs, 117² ÷ 5 217 = 2.6.
        assert_eq!(counted_ops(117, 17, mixed), 3);
        // Not knowing the costliest, one operation may hold all but 16.
        assert_eq!(counted_ops(117, 17, ones), 1);
        // Nothing learnt yet: not said, as before counts were kept; a
        // count that says nothing: the cost over the quantum.
        assert_eq!(counted_ops(1_008, 8, Quantum::default()), 0);
        assert_eq!(counted_ops(510, 0, fifty_ones), 10);
        assert_eq!(counted_ops(5, 9, ones), 5);
    }

    /// A pair whose operations are mostly cheap and now and then a
    /// publish to 1 000 subscribers, on an agent whose first operations
    /// cost 1: a sub-window holding one publish among the cheap ones is
    /// reported, as the rise it is, counting one operation (its cost over
    /// the divisor of 1 counted 1 008, and the master took it for a
    /// certain deluge).
    #[test]
    fn a_single_costly_operation_among_cheap_ones_counts_as_one() {
        let state = AgentState::new(AgentConfig::default());
        let rule = SurgeRule::default_for(Duration::from_secs(2));
        let mut rng = SmallRng::seed_from_u64(4);
        let mut reports = Vec::new();
        for window in 0..50u64 {
            for i in 0..7 {
                state.check(
                    at(window * 200 + 20 * i + 5),
                    "acme",
                    "messages",
                    1,
                    &mut rng,
                );
            }
            if window == 40 {
                state.check(at(window * 200 + 150), "acme", "messages", 1_001, &mut rng);
            }
            let end = at(window * 200 + 200);
            state.scan_surges(end - Duration::from_millis(200), end, &rule, |_, rates| {
                reports.push((window, rates));
                true
            });
            if window % 10 == 9 {
                state.drain(end, |_, _, _| {});
            }
        }
        let rise = reports.iter().find(|(window, _)| *window == 40);
        let Some((_, rates)) = rise else {
            panic!("{reports:?}")
        };
        assert!(rates.rate > 5_000.0, "{rates:?}");
        assert_eq!(rates.ops, 1, "{rates:?}");
    }

    #[test]
    fn a_pair_of_mixed_costs_learns_the_largest_from_its_guard_windows() {
        // Cost 1 at 1 000/s with a cost of 51 every 0.2 s, for 5 s: the
        // windows' closing operations show a 51 now and then.
        let state = AgentState::new(AgentConfig::default());
        let mut rng = SmallRng::seed_from_u64(1);
        // Made by its first check (cost 1, which seeds the divisor), then
        // answered: the local guard knows a limit and closes windows.
        state.check(at(0), "acme", "messages", 1, &mut rng);
        state.apply(
            at(0),
            "acme",
            "messages",
            0.0,
            1e6,
            Duration::from_secs(600),
        );
        // Past its youth (eight windows of cost 1), only the windows'
        // closing operations show their cost.
        for ms in 1..2_600 {
            state.check(at(ms), "acme", "messages", 1, &mut rng);
        }
        let op_cost = || {
            let pinned = state.pairs.pin();
            pinned.find("acme", "messages").unwrap().op_cost()
        };
        assert_eq!(op_cost(), 1);
        for ms in 2_600..7_600 {
            let cost = if ms % 200 == 0 { 51 } else { 1 };
            state.check(at(ms), "acme", "messages", cost, &mut rng);
        }
        assert_eq!(op_cost(), 51);
    }

    /// A new pair's checks show the scans every cost for its first fifteen
    /// windows: one operation of 51 among operations of 1, in its first
    /// window, is seen at once, and the pair is one of cheap operations
    /// first, whose rises are judged as counts of 1 for its first eight
    /// windows. In its ninth to fifteenth windows a 51 is still seen, and
    /// its rises are judged by the costliest cost. Past its youth, one
    /// that closes no window is not seen.
    #[test]
    fn a_new_pair_shows_every_cost_in_its_youth() {
        let state = AgentState::new(AgentConfig::default());
        let mut rng = SmallRng::seed_from_u64(1);
        // What a pair's scans know of its costs, and the cost its rises
        // are judged by.
        let learnt = |account: &str| {
            let pinned = state.pairs.pin();
            let entry = pinned.find(account, "messages").unwrap();
            (Quantum(entry.quantum.load(Relaxed)), entry.rise_cost())
        };
        let quantum = |account: &str| learnt(account).0;
        let rise_cost = |account: &str| learnt(account).1;
        for account in ["young", "older", "grown"] {
            state.check(at(0), account, "messages", 1, &mut rng);
            state.apply(
                at(0),
                account,
                "messages",
                0.0,
                1e6,
                Duration::from_secs(600),
            );
        }
        state.check(at(10), "young", "messages", 51, &mut rng);
        assert_eq!(quantum("young").cost(), 51);
        assert!(quantum("young").cheap_first());
        assert_eq!(rise_cost("young"), 1);
        // Ten windows of cost 1, then a 51 in the middle of a window.
        for ms in (1..2_500).step_by(5) {
            for account in ["older", "grown"] {
                state.check(at(ms), account, "messages", 1, &mut rng);
            }
        }
        // Its last window began at 2 251 ms: 2 498 closes none.
        state.check(at(2_498), "older", "messages", 51, &mut rng);
        assert_eq!(quantum("older").cost(), 51);
        assert!(quantum("older").cheap_first());
        assert_eq!(rise_cost("older"), 51);
        // Seventeen windows of cost 1, then a 51 in the middle of one.
        for ms in (2_501..4_250).step_by(5) {
            state.check(at(ms), "grown", "messages", 1, &mut rng);
        }
        state.check(at(4_248), "grown", "messages", 51, &mut rng);
        assert_eq!(quantum("grown").cost(), 1);
        assert!(!quantum("grown").is_mixed());
    }

    /// A young pair shows the scans its costs before any master has
    /// answered for it too, when no limit is known and the local guard
    /// does not run: its early reports went out then, and one that held a
    /// publish of 51 among operations of 1 counted it as 65 operations of
    /// 1 (`mixed-costs` at 0.95×: 12 seeds of 180 refused; 1 after).
    #[test]
    fn a_new_pair_shows_its_costs_before_its_first_answer() {
        let state = AgentState::new(AgentConfig::default());
        let mut rng = SmallRng::seed_from_u64(1);
        state.check(at(0), "acme", "messages", 1, &mut rng);
        state.check(at(20), "acme", "messages", 51, &mut rng);
        let pinned = state.pairs.pin();
        let entry = pinned.find("acme", "messages").unwrap();
        assert_eq!(entry.limit.load(Relaxed), 0, "no limit known");
        let quantum = Quantum(entry.quantum.load(Relaxed));
        assert_eq!(quantum.cost(), 51);
        assert!(quantum.cheap_first());
        // With no limit no guard window closes, so the youth ends with
        // time: as long as its fifteen windows take, 3.75 s. A pair of an
        // op with no limit would otherwise sample its every check for
        // ever.
        for ms in [0, 3_700] {
            state.check(at(ms), "quiet", "messages", 1, &mut rng);
        }
        let pinned = state.pairs.pin();
        let quiet = pinned.find("quiet", "messages").unwrap();
        let young = || super::super::entry::young(quiet.local_start.load(Relaxed));
        assert!(young());
        state.check(at(3_800), "quiet", "messages", 1, &mut rng);
        assert!(!young());
        state.check(at(3_900), "quiet", "messages", 51, &mut rng);
        let quantum = Quantum(quiet.quantum.load(Relaxed));
        assert_eq!(quantum.cost(), 1);
        assert!(!quantum.is_mixed());
    }

    #[test]
    fn costs_far_apart_are_cheap_first_and_close_ones_are_not() {
        // Costs of 1 and 51, the 1 first: cheap first.
        assert!(Quantum::seeded(1).sample(51).cheap_first());
        // Publishes of 1 001 and 1 003, either way: mixed, not cheap first.
        assert!(!Quantum::seeded(1_001).sample(1_003).cheap_first());
        assert!(Quantum::seeded(1_001).sample(1_003).is_mixed());
        assert!(!Quantum::seeded(1_001).learn(2_004).cheap_first());
        // The costly one first: its sub-windows show the costs differ,
        // and the costly one stands, not cheap first.
        let costly_first = Quantum::seeded(51).learn(16);
        assert!(costly_first.is_mixed() && !costly_first.cheap_first());
        assert_eq!(costly_first.cost(), 51);
        // Once mixed, more samples keep what the first said.
        assert!(
            Quantum::seeded(1)
                .sample(51)
                .sample(1)
                .sample(101)
                .cheap_first()
        );
    }

    /// 5 000/s of cost 1 on `acme` over `ms`, in 10-ms steps.
    fn flood(state: &AgentState, ms: std::ops::Range<u64>, rng: &mut SmallRng) {
        for ms in ms.step_by(10) {
            for _ in 0..50 {
                state.check(at(ms), "acme", "messages", 1, rng);
            }
        }
    }

    /// The rates a pass offers, all taken.
    fn taken(
        pass: impl FnOnce(&mut dyn FnMut(Pair<'_>, SurgeRates) -> bool) -> usize,
    ) -> Vec<SurgeRates> {
        let mut rates = Vec::new();
        pass(&mut |_, r| {
            rates.push(r);
            true
        });
        rates
    }

    /// Halfway through a sub-window, a deluge that began in it is found
    /// and reported; the sub-window's own scan then measures it whole and,
    /// having found it larger than the first half said, reports it again
    /// (a follow-up needs only a 1.5x rise), so the master hears its size.
    #[test]
    fn a_peek_finds_a_deluge_half_a_sub_window_sooner_and_a_follow_up_its_size() {
        let state = AgentState::new(AgentConfig::default());
        let rule = SurgeRule::default_for(Duration::from_secs(2));
        // Quiet at 100/s for two rounds, rolled up.
        let quiet = |ms: u64| u64::from(ms.is_multiple_of(100)) * 10;
        scan(&state, 0, 2_000, quiet);
        state.drain(Nanos::ZERO, |_, _, _| {});
        assert_eq!(scan(&state, 2_000, 4_000, quiet), vec![]);
        // 5 000/s from 4 050: the peek at 4 100 sees 50 ms of it.
        let mut rng = SmallRng::seed_from_u64(4);
        flood(&state, 4_050..4_100, &mut rng);
        let peeked = taken(|offer| state.peek_surges(at(4_000), at(4_100), &rule, offer));
        let [first] = &peeked[..] else {
            panic!("{peeked:?}")
        };
        assert_eq!(first.rate, 2_500.0);
        assert!(!first.surged);
        // What it counted: 250 operations of cost 1, whose Poisson noise the
        // master weighs before it suppresses on them, and over how long:
        // the peek's 100 ms, where the master places it among others.
        assert_eq!(first.ops, 250);
        assert_eq!(first.span, Some(Duration::from_millis(100)));
        // The master's answer suppresses it (1 000/s against 2 500/s so far).
        state.apply(
            at(4_105),
            "acme",
            "messages",
            0.6,
            1_000.0,
            Duration::from_secs(6),
        );
        // The rest of the sub-window: the close measures 4 000 to 4 200.
        flood(&state, 4_100..4_200, &mut rng);
        let closed = taken(|offer| state.scan_surges(at(4_000), at(4_200), &rule, offer));
        let [follow_up] = &closed[..] else {
            panic!("{closed:?}")
        };
        assert_eq!(
            (follow_up.rate, follow_up.baseline, follow_up.surged),
            (3_750.0, 2_500.0, true)
        );
    }

    /// A peek into a sub-window nothing was counted in skips its pass (the
    /// mark a close takes down stays down); whatever way an operation is
    /// counted puts it back up, so a deluge that begins after the close is
    /// still found halfway through, as each counting path brings it.
    #[test]
    fn a_peek_skips_only_sub_windows_nothing_was_counted_in() {
        type Count = fn(&AgentState, u64, &mut SmallRng);
        let paths: [(&str, Count); 3] = [
            ("check", |state, ms, rng| {
                for _ in 0..50 {
                    state.check(at(ms), "acme", "messages", 1, rng);
                }
            }),
            ("check_batch", |state, ms, rng| {
                state.check_batch(at(ms), "acme", "messages", 1, 50, rng);
            }),
            ("check_from", |state, ms, rng| {
                for p in 0..50 {
                    let publisher = crate::agent::Publisher::new(p % 3);
                    state.check_from(at(ms), "acme", "messages", 1, publisher, rng);
                }
            }),
        ];
        for (path, count) in paths {
            let state = AgentState::new(AgentConfig::default());
            let rule = SurgeRule::default_for(Duration::from_secs(2));
            let quiet = |ms: u64| u64::from(ms.is_multiple_of(100)) * 10;
            scan(&state, 0, 2_000, quiet);
            state.drain(Nanos::ZERO, |_, _, _| {});
            assert_eq!(scan(&state, 2_000, 4_000, quiet), vec![], "{path}");
            // Nothing counted since the close at 4 000: the peek skips.
            assert!(!state.counted.load(Relaxed), "{path}");
            let peeked = taken(|offer| state.peek_surges(at(4_000), at(4_100), &rule, offer));
            assert_eq!(peeked, vec![], "{path}");
            // 5 000/s from 4 100, counted this path's way: found at 4 150.
            let mut rng = SmallRng::seed_from_u64(4);
            for ms in (4_100..4_150).step_by(10) {
                count(&state, ms, &mut rng);
            }
            assert!(state.counted.load(Relaxed), "{path}");
            let peeked = taken(|offer| state.peek_surges(at(4_000), at(4_150), &rule, offer));
            let [first] = &peeked[..] else {
                panic!("{path}: {peeked:?}")
            };
            assert_eq!(first.ops, 250, "{path}");
            // The close takes the mark down again.
            taken(|offer| state.scan_surges(at(4_000), at(4_200), &rule, offer));
            assert!(!state.counted.load(Relaxed), "{path}");
        }
    }

    /// Poisson arrivals with a mean of `mean` per call (Knuth's method).
    fn poisson(rng: &mut SmallRng, mean: f64) -> u64 {
        use rand::Rng;
        let limit = (-mean).exp();
        let mut uniform = || f64::from(rng.next_u32()) / f64::from(u32::MAX);
        let (mut k, mut p) = (0, uniform());
        while p > limit {
            k += 1;
            p *= uniform();
        }
        k
    }

    /// Scans a suppressed pair of 20 agents' share of an overload
    /// (90 operations a second, Poisson) through a steady stretch and a
    /// fall to 40 a second at 6 s, which two sub-windows cannot tell from
    /// chance: returns the falls reported while steady and when the fall
    /// was first reported (ms).
    fn suppressed_fall(seed: u64) -> (usize, Option<u64>) {
        let state = AgentState::new(AgentConfig::default());
        let rule = SurgeRule::default_for(Duration::from_secs(2));
        let mut rng = SmallRng::seed_from_u64(seed);
        let (mut steady_falls, mut seen) = (0, None);
        for ms in (0..8_000).step_by(10) {
            let mean = if ms < 6_000 { 0.9 } else { 0.4 };
            for _ in 0..poisson(&mut rng, mean) {
                state.check(at(ms), "acme", "messages", 1, &mut rng);
            }
            let end = ms + 10;
            if end % 2_000 == 0 && end <= 4_000 {
                state.drain(at(end), |_, _, _| {});
            }
            if end == 4_000 {
                let valid = Duration::from_secs(10);
                state.apply(at(end), "acme", "messages", 0.44, 1_000.0, valid);
            }
            if end % 200 == 0 {
                let falls = taken(|offer| state.scan_surges(at(end - 200), at(end), &rule, offer))
                    .into_iter()
                    .filter(|r| r.rate < r.baseline)
                    .count();
                if end > 4_000 && end <= 6_000 {
                    steady_falls += falls;
                } else if end > 6_000 && falls > 0 && seen.is_none() {
                    seen = Some(end);
                }
            }
        }
        (steady_falls, seen)
    }

    /// A suppressed pair's fall too small for two sub-windows is seen on
    /// the slow mean within a second (an overload falling back under its
    /// limit over many agents is released before its round: within 1.4 s
    /// in all of 20 runs, 1 s in 16, where two sub-windows alone miss 4),
    /// and chance
    /// alone makes almost no such report.
    #[test]
    fn a_suppressed_pairs_small_fall_is_seen_within_a_second() {
        let runs: Vec<_> = (0..20).map(suppressed_fall).collect();
        let false_falls: usize = runs.iter().map(|r| r.0).sum();
        let within = |ms| {
            runs.iter()
                .filter(|r| r.1.is_some_and(|at| at <= ms))
                .count()
        };
        assert!(false_falls <= 2, "{runs:?}");
        assert!(within(7_000) >= 15 && within(7_500) == 20, "{runs:?}");
    }

    /// A suppressed pair whose rate just rose is not falling while its slow
    /// mean catches up with the rise.
    #[test]
    fn a_slow_mean_catching_up_with_a_rise_is_no_fall() {
        let state = AgentState::new(AgentConfig::default());
        let rate = |ms: u64| if ms < 2_000 { 2 } else { 20 };
        scan(&state, 0, 2_000, rate);
        state.drain(at(2_000), |_, _, _| {});
        state.apply(
            at(2_000),
            "acme",
            "messages",
            0.5,
            1_000.0,
            Duration::from_secs(10),
        );
        let reports = scan(&state, 2_000, 4_000, rate);
        assert!(
            reports.iter().all(|(_, r)| r.rate >= r.baseline),
            "{reports:?}"
        );
    }

    /// An agent whose master answered for acme's messages: not suppressed,
    /// under a limit of 1 000/s.
    fn unsuppressed() -> AgentState {
        let state = AgentState::new(AgentConfig::default());
        state.apply(
            at(0),
            "acme",
            "messages",
            0.0,
            1_000.0,
            Duration::from_secs(6),
        );
        state
    }

    /// An account under its limit, reported at start as every new pair is
    /// (it jumps from nothing), is not followed up on chance rises while
    /// its master does not suppress it: that would ratchet its estimate up.
    #[test]
    fn no_follow_up_for_a_pair_its_master_does_not_suppress() {
        let state = unsuppressed();
        // 300/s, reported as it starts.
        let taken = scan(&state, 0, 200, |ms| u64::from(ms % 100 == 0) * 30);
        assert_eq!(taken.len(), 1);
        // 2.3× that is no follow-up: the master said 0.
        assert_eq!(
            scan(&state, 200, 400, |ms| u64::from(ms % 100 == 0) * 70),
            vec![]
        );
    }

    /// A pair its master does not suppress takes back its own early
    /// report of a chance lump once the lump has passed (a third of the
    /// reported rate is enough), and of nothing larger, nor a poll's
    /// answer: there a fall must be to a quarter, as from a rollup's rate.
    /// The master holds each agent's last early report until the round,
    /// and chance lumps reported on many agents and never taken back added
    /// up past the limit; the falls between a lumpy flood's seconds, taken
    /// back, let the flood go.
    #[test]
    fn only_a_chance_lump_reported_early_is_taken_back_when_it_passes() {
        // A poll's answer (`None`) is no chance lump: the master asked.
        for (ops, taken_back) in [
            (Some(1), true),
            (Some(CHANCE_OPS), true),
            (Some(CHANCE_OPS + 1), false),
            (None, false),
        ] {
            let state = unsuppressed();
            // 100/s throughout.
            let traffic = |ms: u64| u64::from(ms.is_multiple_of(100)) * 10;
            scan(&state, 0, 400, traffic);
            // An early report said 300/s.
            let round = state.report_round(at(400));
            let pinned = state.pairs.pin();
            let entry = pinned.find("acme", "messages").unwrap();
            entry.told_early(300.0, round, ops);
            let taken = scan(&state, 400, 1_000, traffic);
            if !taken_back {
                assert_eq!(taken, [], "{ops:?} operations");
                continue;
            }
            // A fall at the next close (the two sub-windows it is judged
            // on held 100/s); still of the lump.
            let [(600, fall)] = taken[..] else {
                panic!("{ops:?} operations: {taken:?}")
            };
            assert_eq!((fall.baseline, fall.rate, fall.ops), (300.0, 100.0, 0));
            assert!(entry.told_chance());
        }
    }

    /// A new pair's first check teaches the cost of one operation: two
    /// operations of cost 51 on an agent's first sub-window (510/s from
    /// nothing) are chance, as they would be later; forty are a deluge.
    #[test]
    fn a_new_pairs_first_check_teaches_the_cost_of_one_operation() {
        let rule = SurgeRule::default_for(Duration::from_secs(2));
        let mut rng = SmallRng::seed_from_u64(2);
        for (ops, surges) in [(2, 0), (40, 1)] {
            let state = AgentState::new(AgentConfig::default());
            for i in 0..ops {
                state.check(at(10 + i), "acme", "messages", 51, &mut rng);
            }
            let taken = state.scan_surges(at(0), at(200), &rule, |_, _| true);
            assert_eq!(taken, surges, "{ops} operations");
        }
    }
}
