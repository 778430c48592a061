//! The demand window of one (account, op) at the master, and the estimators
//! that turn it into rates.
//!
//! Two views of the same reports, because the two estimators need different
//! resolutions. The rounds are always kept, inline; the sub-intervals only
//! when the estimator reads them (`ably-mma`), as a master holds millions of
//! windows:
//!
//! - **Sub-intervals** (default 4 × 6 s): a ring of attempted and admitted
//!   cost per sub-interval, aligned to the epoch. Each report's counts are
//!   spread over the sub-intervals its interval overlaps, pro rata to the
//!   overlap (splitting integers so the parts add up exactly), so a 2 s
//!   report that straddles a boundary puts each part where it happened and a
//!   steady demand fills every sub-interval with exactly its rate. Late
//!   reports land in the sub-interval they describe, not the one they arrive
//!   in; a sub-interval counts as completed only once every agent has had time
//!   to report it (the *settle* time: one rollup interval plus a grace).
//! - **Rounds**: every agent sends one report per (account, op) per rollup
//!   interval, cut on the same grid, so the reports ending at the same grid
//!   point form a round. A round's rate is the sum of its reports' rates
//!   (each report's cost over its own duration). The current round and the
//!   one before are kept, with how many reports each received.
//!
//! [`EstimatorKind::AblyMma`] reads the sub-intervals;
//! [`EstimatorKind::LatestRound`] reads the rounds. See `docs/design.md` for
//! why the default is the latter. Either way, early reports of a surge
//! override the estimate until a round shows it whole.
//!
//! # Layout
//! - this file: the window, its rounds and sub-intervals, the estimators.
//! - `surge`: the surge estimate from early reports.
//! - `reporters`: which agents a surge estimate holds a report of.
//! - `hint`: the tally of agents' sparse hints, and when it polls.
//! - `spread`: how much whole rounds scatter, and a slower average of
//!   them: whether a demand over the limit is more than chance.

mod admitted;
mod hint;
mod reporters;
mod spread;
mod surge;

pub use hint::{HINT_SPAN, HintFrom, hints_needed};

pub use spread::CONFIDENCE_SIGMAS;
pub use surge::FALLING_FOR;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{EstimatorKind, WindowConfig};
use crate::time::{Nanos, duration_nanos};

use admitted::AdmittedShare;

/// Rates of one (account, op), in cost per second.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Attempted cost per second: what would have been used had nothing
    /// been suppressed.
    pub demand: f64,
    /// Admitted cost per second.
    pub admitted: f64,
}

impl Rates {
    fn max(self, other: Rates) -> Rates {
        Rates {
            demand: self.demand.max(other.demand),
            admitted: self.admitted.max(other.admitted),
        }
    }
}

/// Attempted and admitted cost of one sub-interval. Saturating: counts
/// never wrap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Counts {
    attempted: u64,
    admitted: u64,
}

/// An estimate, and how final it is.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// The estimated rates.
    pub rates: Rates,
    /// When the round the estimate comes from is still being reported: the
    /// time by which it should be whole.
    pub whole_by: Option<Nanos>,
    /// Whether the estimate comes from the first round this window has seen
    /// reports for (after a quiet spell, or for an account new to this
    /// master): early reporters then see only part of the demand.
    pub first_round: bool,
    /// Whether the demand comes from early reports (a surge) rather than
    /// whole rounds: measured over short sub-windows, so noisier.
    pub surge: bool,
    /// With `surge`: how many operations the reports that first moved it
    /// counted, when they said (a poll's answers, `SurgeRates::ops`); 0
    /// when not known. A rate summed from `n` operations is off by
    /// `1 / √n` by chance.
    pub surge_ops: u32,
    /// With `surge_ops`: how many reports counted them. One is a single
    /// agent's sub-window, of the many each agent measures.
    pub surge_reports: u16,
    /// With `surge_ops`: the demand with the counted reports' rates read
    /// over the time they span together, not each over its own (lumps
    /// that agents saw one after another were not there at once); the
    /// demand when they were measured over the same time or did not say
    /// (`SurgeRates::span`); 0 when not a surge. What chance is weighed
    /// against before the count proves a rise (`master::surge_proven_by`).
    pub surge_demand_over_span: f64,
    /// With `surge`: the demand the rounds alone say, cost per second (0
    /// when they say none: see [`surge_from_nothing`](Self::surge_from_nothing)).
    pub surge_rounds: f64,
    /// With `surge` and a fall some of whose reports counted their
    /// operations (a poll's answers): the chance spread of the demand
    /// those answers make up (their summed rate over the square root of
    /// the operations they counted), cost per second; 0 otherwise. A few
    /// operations in a few hundred milliseconds read the rate left after
    /// a flood of costly operations at twice what it is one time in
    /// twenty.
    pub surge_fall_noise: f64,
    /// With `surge`: whether early reports are bringing the demand down
    /// (a flood ending), the last of them within [`FALLING_FOR`]. An agent
    /// still suppressed by such an estimate is told to ask again soon: the
    /// release may come with the next reports, and a push of it can be
    /// missed.
    pub surge_falling: bool,
}

impl Estimate {
    /// Whether it is a surge over rounds that say no demand at all (an
    /// account new to this master, or back from quiet), so that it is the
    /// early reports' alone, each an agent's sub-window read as a rate
    /// (see `master::FIRST_SURGE_MARGIN`).
    pub fn surge_from_nothing(&self) -> bool {
        self.surge && self.surge_rounds <= 0.0
    }

    /// An estimate from whole or partial rounds (or sub-intervals), no
    /// early reports in it: every `surge` field says none.
    fn of_rounds(rates: Rates, whole_by: Option<Nanos>, first_round: bool) -> Estimate {
        Estimate {
            rates,
            whole_by,
            first_round,
            ..Estimate::default()
        }
    }
}

/// Cost that arrived too late to fit in the window, so was not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Attempted cost dropped.
    pub attempted: u64,
    /// Admitted cost dropped.
    pub admitted: u64,
}

/// The demand window of one (account, op). Sans-IO: time is an argument.
///
/// Holds the rounds always, and the sub-intervals only when the configured
/// estimator reads them ([`EstimatorKind::AblyMma`]): a master keeps one
/// window per (account, op) it tracks, millions of them, so the default
/// window is 40 bytes with no allocation of its own, and a master's table
/// keeps 32 of them in each entry (`WindowCore`) and the rest beside,
/// for the few windows that hold more.
///
/// Serializable, so a master can snapshot its windows across a restart; a
/// window only fits the [`WindowConfig`] shape it was made for
/// ([`fits`](Self::fits)).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(from = "WindowSnapshot", into = "WindowSnapshot")]
pub struct DemandWindow {
    /// What every window holds.
    core: WindowCore,
    /// What only some windows hold, in one box (one pointer in every
    /// window rather than one for each): the `ably-mma` estimator's
    /// sub-intervals, and the estimate of early reports once a surge came.
    extras: Option<Box<Extras>>,
}

/// What every window holds: all of it but its
/// [`extras`](DemandWindow::split). As a master's table keeps a window:
/// 32 bytes and no pointer, so an entry need not be aligned or padded for
/// one; the few windows with extras keep them beside the table.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WindowCore {
    /// Grid index of the current round, its low 32 bits: the one whose
    /// reports end at `round × rollup_interval`. The previous round is
    /// `round − 1`. Read back by
    /// [`round_near`](DemandWindow::round_near), as the index within 2^31
    /// rounds of the time asked about: 24 days of the shortest rounds
    /// (1 ms), longer than a master keeps an idle window. Four bytes
    /// rather than eight.
    round: u32,
    /// The summed attempted rates of the reports of the current round
    /// (`[0]`) and of the round before (`[1]`), as `f32`: 7 significant
    /// digits are plenty for a probability, and halve what millions of
    /// windows hold.
    demand: [f32; 2],
    /// Their summed admitted rates, as shares of `demand` (views, metrics
    /// and the `linear-ramp` policy read them; see [`AdmittedShare`]).
    admitted: [AdmittedShare; 2],
    /// How many reports arrived for those two rounds (one per agent with
    /// activity): a round is whole once it has as many as the one before.
    /// Saturating at 65 535 agents, where a round is whole at the cap.
    reports: [u16; 2],
    /// The scatter of whole rounds and their slow average, for
    /// [`confidently_over`](DemandWindow::confidently_over).
    spread: spread::Spread,
}

/// What only some windows hold (see [`DemandWindow::split`]).
#[derive(Clone, Debug)]
pub(crate) struct WindowExtras(Box<Extras>);

/// What a window holds only some of the time.
#[derive(Clone, Debug, Default)]
struct Extras {
    /// The sub-interval counts, for the `ably-mma` estimator only.
    sub_intervals: Option<SubIntervals>,
    /// What early reports say, while it stands (`surge`): few windows
    /// surge at once. Not kept across a restart.
    surge: Option<surge::Surge>,
    /// The agents' sparse hints lately (`hint`): only windows of sparse
    /// costly traffic get any, so the tally (400 bytes) is a box of its
    /// own. Not kept across a restart.
    hints: Option<Box<hint::Hints>>,
}

/// A window as snapshots hold it: the layout from before the extras were
/// boxed together, so snapshots taken by earlier masters still load.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct WindowSnapshot {
    round: u64,
    rates: [RoundRates; 2],
    reports: [u16; 2],
    sub_intervals: Option<Box<SubIntervals>>,
    /// Absent from snapshots taken before it existed: learned afresh.
    #[serde(default)]
    spread: spread::Spread,
}

impl From<WindowSnapshot> for DemandWindow {
    fn from(s: WindowSnapshot) -> DemandWindow {
        DemandWindow {
            core: WindowCore {
                // Truncated: read back near the present (`round_near`).
                // At the default 2-s round every index until 2106 fits
                // whole.
                round: s.round as u32,
                demand: s.rates.map(|r| r.demand),
                admitted: s.rates.map(|r| AdmittedShare::of(r.admitted, r.demand)),
                reports: s.reports,
                spread: s.spread,
            },
            extras: s.sub_intervals.map(|sub| {
                Box::new(Extras {
                    sub_intervals: Some(*sub),
                    surge: None,
                    hints: None,
                })
            }),
        }
    }
}

impl From<DemandWindow> for WindowSnapshot {
    fn from(w: DemandWindow) -> WindowSnapshot {
        WindowSnapshot {
            round: u64::from(w.core.round),
            rates: [0, 1].map(|slot| {
                let demand = w.core.demand[slot];
                RoundRates {
                    demand,
                    admitted: w.core.admitted[slot].rate(demand),
                }
            }),
            reports: w.core.reports,
            sub_intervals: w.extras.and_then(|e| e.sub_intervals).map(Box::new),
            spread: w.core.spread,
        }
    }
}

/// A round's summed rates as a window stores them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
struct RoundRates {
    demand: f32,
    admitted: f32,
}

impl WindowCore {
    /// Reads fields at both ends of the window, changing nothing: lets a
    /// batch's cache misses on its windows overlap (`MasterState::warm`).
    pub(crate) fn touch(&self) -> u64 {
        u64::from(self.round) ^ u64::from(self.reports[0]) ^ u64::from(self.spread.noise.to_bits())
    }

    /// The summed rates of round `slot` (0: the current one, 1: the one
    /// before).
    fn rates(&self, slot: usize) -> Rates {
        let demand = self.demand[slot];
        Rates {
            demand: demand.into(),
            admitted: self.admitted[slot].rate(demand).into(),
        }
    }

    /// Adds one report's `rates` to round `slot`.
    fn add(&mut self, slot: usize, rates: Rates) {
        let before = self.demand[slot];
        self.demand[slot] += rates.demand as f32;
        self.admitted[slot] =
            self.admitted[slot].add(before, rates.demand, rates.admitted, self.demand[slot]);
        self.reports[slot] = self.reports[slot].saturating_add(1);
    }

    /// Moves to round `id`, after `round`: the current round becomes the
    /// one before when `id` follows it, else the round before is empty.
    fn advance(&mut self, round: u64, id: u64) {
        self.spread.next_round(id == round + 1);
        if id == round + 1 {
            self.demand[1] = self.demand[0];
            self.admitted[1] = self.admitted[0];
            self.reports[1] = self.reports[0];
        } else {
            self.demand[1] = 0.0;
            self.admitted[1] = AdmittedShare::default();
            self.reports[1] = 0;
        }
        self.demand[0] = 0.0;
        self.admitted[0] = AdmittedShare::default();
        self.reports[0] = 0;
        self.round = id as u32;
    }
}

/// The ring of sub-interval counts `ably-mma` averages over.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SubIntervals {
    /// Sub-interval index (since the epoch) of the newest bucket.
    head: u64,
    /// Ring of sub-interval counts; index `i` lives at `i % len`.
    buckets: Box<[Counts]>,
}

/// Number of buckets the ring needs: the completed sub-intervals the
/// estimator averages, plus those not yet settled, plus the current one.
fn ring_len(cfg: &WindowConfig) -> usize {
    let unsettled = duration_nanos(cfg.settle()).div_ceil(duration_nanos(cfg.sub_interval));
    cfg.sub_intervals.get() + usize::try_from(unsettled).unwrap_or(usize::MAX / 2) + 1
}

/// Where round `id` is kept while `round` is the current one: 0, the
/// current round; 1, the one before; `None`, neither (older, or later).
fn slot_of(round: u64, id: u64) -> Option<usize> {
    match round.checked_sub(id) {
        Some(0) => Some(0),
        Some(1) => Some(1),
        _ => None,
    }
}

/// The round a report that ended at `end` belongs to: the grid point
/// nearest its end (one ending up to half a round after it counts in it).
fn report_round(cfg: &WindowConfig, end: Nanos) -> u64 {
    let r = duration_nanos(cfg.rollup_interval);
    end.as_nanos().saturating_add(r / 2) / r
}

impl DemandWindow {
    /// The window as a master's table keeps it: the part every window
    /// has, and what only some hold.
    pub(crate) fn split(self) -> (WindowCore, Option<WindowExtras>) {
        (self.core, self.extras.map(WindowExtras))
    }

    /// The window [`split`](Self::split) gave.
    pub(crate) fn join(core: WindowCore, extras: Option<WindowExtras>) -> DemandWindow {
        DemandWindow {
            core,
            extras: extras.map(|e| e.0),
        }
    }

    /// An empty window for `cfg`.
    pub fn new(cfg: &WindowConfig) -> DemandWindow {
        DemandWindow {
            core: WindowCore::default(),
            extras: (cfg.estimator == EstimatorKind::AblyMma).then(|| {
                Box::new(Extras {
                    sub_intervals: Some(SubIntervals {
                        head: 0,
                        buckets: vec![Counts::default(); ring_len(cfg)].into_boxed_slice(),
                    }),
                    ..Extras::default()
                })
            }),
        }
    }

    /// The sub-interval counts, if this window keeps them.
    fn sub_intervals(&self) -> Option<&SubIntervals> {
        self.extras.as_deref()?.sub_intervals.as_ref()
    }

    /// Whether this window was made for a config of `cfg`'s shape and
    /// estimator (a deserialized one may not be).
    pub fn fits(&self, cfg: &WindowConfig) -> bool {
        match (self.sub_intervals(), cfg.estimator) {
            (Some(s), EstimatorKind::AblyMma) => s.buckets.len() == ring_len(cfg),
            (None, EstimatorKind::LatestRound) => true,
            _ => false,
        }
    }

    /// Adds a report of `attempted` and `admitted` cost over `[start, end)`.
    ///
    /// The caller has validated the report (`admitted <= attempted`,
    /// `start <= end`) and moved it so it does not end in the future. Cost
    /// too old for what the estimator reads (a sub-interval older than the
    /// window, or a round before the previous one) is dropped and returned.
    pub fn record(
        &mut self,
        cfg: &WindowConfig,
        start: Nanos,
        end: Nanos,
        attempted: u64,
        admitted: u64,
    ) -> Dropped {
        let counted = self.record_round(cfg, start, end, attempted, admitted);
        match self
            .extras
            .as_deref_mut()
            .and_then(|e| e.sub_intervals.as_mut())
        {
            Some(s) => s.record(cfg, start, end, attempted, admitted),
            None if counted => Dropped::default(),
            None => Dropped {
                attempted,
                admitted,
            },
        }
    }

    /// Adds the report's rates to its round; `false` when that round is
    /// older than the two kept.
    fn record_round(
        &mut self,
        cfg: &WindowConfig,
        start: Nanos,
        end: Nanos,
        attempted: u64,
        admitted: u64,
    ) -> bool {
        let id = report_round(cfg, end);
        // A report shorter than a rollup interval (an agent's first, say)
        // still describes a whole round: its activity before `start` was
        // zero. Dividing by the round keeps a short report from reading as
        // a huge rate.
        let secs = end.since(start).max(cfg.rollup_interval).as_secs_f64();
        let rates = Rates {
            demand: attempted as f64 / secs,
            admitted: admitted as f64 / secs,
        };
        let round = self.round_near(id);
        let slot = if id > round {
            self.close_round();
            self.core.advance(round, id);
            self.tidy_extras(cfg, end);
            Some(0)
        } else {
            slot_of(round, id)
        };
        // Older rounds no longer matter to the estimate.
        let Some(slot) = slot else {
            return false;
        };
        self.core.add(slot, rates);
        self.core.spread.note_report(attempted);
        true
    }

    /// A report of `attempted` cost came whose agent stated that one of
    /// the pair's operations costs `cost` (0: it did not say): the rounds
    /// are counts of operations of that cost, whatever divides the
    /// reports, while the reports fit it (see `Spread::note_op_cost`).
    pub fn note_op_cost(&mut self, cost: u32, attempted: u64) {
        self.core.spread.note_op_cost(cost, attempted);
    }

    /// The same report, which ended at `end`, said it held `ops`
    /// operations (0: it did not say): once its costs differ, its round
    /// scatters by the sum of their squares, which the operations bound
    /// (see `Spread::note_ops`).
    pub fn note_ops(
        &mut self,
        cfg: &WindowConfig,
        end: Nanos,
        cost: u32,
        ops: u32,
        attempted: u64,
    ) {
        let id = report_round(cfg, end);
        let Some(slot) = slot_of(self.round_near(id), id) else {
            return;
        };
        // What the report's round held before it (just recorded), as cost.
        let secs = cfg.rollup_interval.as_secs_f64();
        let held = f64::from(self.core.demand[slot]) * secs - attempted as f64;
        self.core.spread.note_ops(cost, ops, attempted, slot, held);
    }

    /// The full index of the current round: the one within 2^31 rounds of
    /// round `near` whose low 32 bits the window keeps. 0 (before every
    /// round) while nothing was ever recorded, as a new window's was.
    pub(super) fn round_near(&self, near: u64) -> u64 {
        if self.core.reports == [0, 0] {
            return 0;
        }
        let behind = (near as u32).wrapping_sub(self.core.round) as i32;
        near.wrapping_sub(i64::from(behind) as u64)
    }

    /// Lets go, at `now`, of what the extras hold that says nothing any
    /// more (a surge estimate that has lapsed, hints past their span), and
    /// of the extras themselves once they hold nothing: once a round, as
    /// it begins. Otherwise every window that ever surged or was hinted
    /// kept its extras for good, and every report to it followed their
    /// pointer: in `sim/bench/fleet.toml` that miss was 93% of `record`'s
    /// time, a tenth of the run's.
    fn tidy_extras(&mut self, cfg: &WindowConfig, now: Nanos) {
        let Some(extras) = self.extras.as_deref() else {
            return;
        };
        let surge_over = extras.surge.is_some() && self.surge_at(cfg, now).is_none();
        let hints_over = extras.hints.as_ref().is_some_and(|h| h.lapsed(now));
        let extras = self.extras.as_deref_mut().expect("seen above");
        if surge_over {
            extras.surge = None;
        }
        if hints_over {
            extras.hints = None;
        }
        if extras.sub_intervals.is_none() && extras.surge.is_none() && extras.hints.is_none() {
            self.extras = None;
        }
    }

    /// The current round is over (a report of a later one arrived): its
    /// demand, whole by now, goes into the spread, with the round before
    /// it when that one was seen.
    fn close_round(&mut self) {
        if self.core.reports[0] == 0 {
            return;
        }
        let previous = (self.core.reports[1] > 0).then(|| f64::from(self.core.demand[1]));
        self.core
            .spread
            .close(previous, f64::from(self.core.demand[0]));
    }

    /// Whether an estimate of `demand` may stand on the round before the
    /// current one: that round was seen, the current one has fewer
    /// reports (it is still coming in), and the round before's demand is
    /// at least as high. A whole round stands on its own.
    fn may_stand_on_round_before(&self, demand: f64) -> bool {
        let [now, before] = self.core.reports;
        before > 0 && now < before && f64::from(self.core.demand[1]) >= demand * (1.0 - 1e-6)
    }

    /// Whether `demand`, an estimate from this window's rounds, is over
    /// `limit` by more than `sigmas` standard deviations of the rounds' own
    /// scatter (see `spread`); while the scatter is unknown, by `margin` ×
    /// `limit` and by more than a round's count of operations of the
    /// reports' cost step has by chance; with `sigmas` 0, any excess is.
    pub fn confidently_over(
        &self,
        cfg: &WindowConfig,
        limit: f64,
        demand: f64,
        margin: f64,
        sigmas: f64,
    ) -> bool {
        self.core.spread.confidently_over(
            limit,
            demand,
            margin,
            sigmas,
            cfg.rollup_interval.as_secs_f64(),
            self.may_stand_on_round_before(demand),
        )
    }
}

impl SubIntervals {
    fn record(
        &mut self,
        cfg: &WindowConfig,
        start: Nanos,
        end: Nanos,
        attempted: u64,
        admitted: u64,
    ) -> Dropped {
        let sub = duration_nanos(cfg.sub_interval);
        let (s, e) = (start.as_nanos(), end.as_nanos());
        let d = e - s;
        if d == 0 {
            // A point in time: all of it belongs to one sub-interval.
            return self.add_to_bucket(e / sub, attempted, admitted);
        }
        let last = (e - 1) / sub;
        self.advance(last);
        let len = self.buckets.len() as u64;
        let oldest_kept = self.head.saturating_sub(len - 1);
        let first = (s / sub).max(oldest_kept);
        // Split by cumulative share so the parts add up to the whole exactly.
        let share = |cost: u64, upto: u64| ((cost as u128 * (upto - s) as u128) / d as u128) as u64;
        let (mut kept_attempted, mut kept_admitted) = (0u64, 0u64);
        for i in first..=last {
            let lo = (i * sub).max(s);
            let hi = (i.saturating_add(1).saturating_mul(sub)).min(e);
            let a = share(attempted, hi) - share(attempted, lo);
            let b = share(admitted, hi) - share(admitted, lo);
            let bucket = &mut self.buckets[(i % len) as usize];
            bucket.attempted = bucket.attempted.saturating_add(a);
            bucket.admitted = bucket.admitted.saturating_add(b);
            kept_attempted += a;
            kept_admitted += b;
        }
        Dropped {
            attempted: attempted - kept_attempted,
            admitted: admitted - kept_admitted,
        }
    }

    fn add_to_bucket(&mut self, index: u64, attempted: u64, admitted: u64) -> Dropped {
        self.advance(index);
        let len = self.buckets.len() as u64;
        if index + len <= self.head {
            return Dropped {
                attempted,
                admitted,
            };
        }
        let bucket = &mut self.buckets[(index % len) as usize];
        bucket.attempted = bucket.attempted.saturating_add(attempted);
        bucket.admitted = bucket.admitted.saturating_add(admitted);
        Dropped::default()
    }

    /// Moves the ring forward so `index` is its newest bucket, clearing the
    /// buckets it reuses.
    fn advance(&mut self, index: u64) {
        if index <= self.head {
            return;
        }
        let len = self.buckets.len() as u64;
        let from = (self.head + 1).max(index.saturating_sub(len - 1));
        for i in from..=index {
            self.buckets[(i % len) as usize] = Counts::default();
        }
        self.head = index;
    }

    fn bucket(&self, index: u64) -> Counts {
        let len = self.buckets.len() as u64;
        if index > self.head || index + len <= self.head {
            Counts::default()
        } else {
            self.buckets[(index % len) as usize]
        }
    }
}

impl DemandWindow {
    /// The estimated rates at `now`, by the configured estimator.
    pub fn rates(&self, cfg: &WindowConfig, now: Nanos) -> Rates {
        self.estimate(cfg, now).rates
    }

    /// The estimated rates at `now`, and whether the round they come from
    /// is still being reported. While early reports' surge estimate stands
    /// (see `surge`), its demand replaces the rounds'.
    pub fn estimate(&self, cfg: &WindowConfig, now: Nanos) -> Estimate {
        let estimate = self.round_estimate(cfg, now);
        match self.surge_demand(cfg, now, estimate.rates.demand) {
            // Early reports that prove no more than the rounds leave the
            // rounds' estimate as it is, tested for chance as any.
            Some(surge) if surge.demand != estimate.rates.demand => Estimate {
                rates: Rates {
                    demand: surge.demand,
                    admitted: estimate.rates.admitted,
                },
                // The surge estimate leans on the rounds', so it may change
                // when their round is whole: agents ask again then.
                whole_by: estimate.whole_by,
                // Over a first round still coming in, as over the round
                // alone: its early reporters see part of the demand, and
                // ask again when it is whole, whatever the surge says.
                first_round: estimate.first_round,
                surge: true,
                surge_ops: surge.ops,
                surge_reports: surge.counted,
                surge_demand_over_span: surge.over_span,
                surge_rounds: estimate.rates.demand,
                surge_fall_noise: surge.fall_noise,
                surge_falling: surge.falling,
            },
            _ => estimate,
        }
    }

    /// The estimate from the reports alone, early reports aside.
    fn round_estimate(&self, cfg: &WindowConfig, now: Nanos) -> Estimate {
        match cfg.estimator {
            EstimatorKind::LatestRound => self.latest_round(cfg, now),
            // A window without sub-intervals does not fit this config and
            // is never handed one ([`fits`](Self::fits)).
            EstimatorKind::AblyMma => Estimate::of_rounds(
                self.sub_intervals()
                    .map_or_else(Rates::default, |s| s.ably_mma(cfg, now)),
                None,
                false,
            ),
        }
    }

    /// The latest complete round; while the current round is still being
    /// reported, the higher of it and the round before, per series.
    ///
    /// A round is complete once it has as many reports as the round before
    /// (agents send a zero report when they go quiet, so the count only
    /// shrinks when an agent leaves), or once no report of it can still
    /// come (half a round past its end plus the grace) whatever came.
    /// Partial data is a lower bound on the round's demand, so taking the
    /// higher of the partial round and the previous one shows a spike as
    /// soon as one report carries it, and never releases before the round
    /// that shows the drop is whole.
    fn latest_round(&self, cfg: &WindowConfig, now: Nanos) -> Estimate {
        let r = duration_nanos(cfg.rollup_interval);
        // The newest round every agent must have reported by now.
        let due = (now - cfg.settle()).as_nanos() / r;
        let round = self.round_near(due);
        if self.core.reports[0] == 0 || round < due {
            // Nothing reported for a round that is due: no agent had demand.
            return Estimate::default();
        }
        // Reports of this round still arrive until its end plus the grace.
        let whole_by = Nanos::from_nanos(round.saturating_mul(r)) + cfg.grace;
        // A report ending up to half a round after the grid point counts in
        // this round (`record_round`): past this, none can still come.
        let past_due = whole_by + cfg.rollup_interval / 2;
        if self.core.reports[1] == 0 {
            // No round before this one: how many reports make it whole is
            // unknown, so it counts as whole with each report, and is marked
            // as a first round.
            Estimate::of_rounds(
                self.core.rates(0),
                (now < whole_by).then_some(whole_by),
                true,
            )
        } else if self.core.reports[0] >= self.core.reports[1] || now >= past_due {
            // Whole: as many reports as the round before, or past the time
            // by which any report of it could arrive. A report lost on the
            // way (its counts come with the agent's next one) must not keep
            // the round before, a deluge's say, in force once its drop
            // shows.
            Estimate::of_rounds(self.core.rates(0), None, false)
        } else {
            Estimate::of_rounds(
                self.core.rates(0).max(self.core.rates(1)),
                // Ask again when it should be whole; if it is not by then
                // (a report lost), when it counts as whole regardless.
                Some(if now < whole_by { whole_by } else { past_due }),
                false,
            )
        }
    }

    /// Total attempted and admitted cost held in the sub-intervals (zero
    /// when the window keeps none).
    pub fn total(&self) -> (u64, u64) {
        self.sub_intervals().map_or((0, 0), SubIntervals::total)
    }
}

impl SubIntervals {
    /// Ably's modified moving average over the sub-intervals.
    ///
    /// The data points are the `n − 1` most recent *settled* sub-intervals
    /// and the in-progress one: the time since the oldest unsettled
    /// sub-interval started. The in-progress point is included only when its
    /// rate is at or above the mean of the settled ones, so a spike shows at
    /// once but an incomplete quiet sub-interval never drags the rate down.
    /// Its rate is the higher of the current sub-interval alone (so a spike is
    /// not diluted by the settling one before it) and the whole unsettled
    /// span, each over at least one rollup interval; both are lower bounds,
    /// as reports may still arrive.
    fn ably_mma(&self, cfg: &WindowConfig, now: Nanos) -> Rates {
        let sub = duration_nanos(cfg.sub_interval);
        let completed = cfg.sub_intervals.get() as u64 - 1;
        let first_unsettled = (now - cfg.settle()).as_nanos() / sub;
        let current = now.as_nanos() / sub;

        let mut settled = Counts::default();
        for i in first_unsettled.saturating_sub(completed)..first_unsettled {
            let c = self.bucket(i);
            settled.attempted = settled.attempted.saturating_add(c.attempted);
            settled.admitted = settled.admitted.saturating_add(c.admitted);
        }
        let mut unsettled = Counts::default();
        for i in first_unsettled..=current {
            let c = self.bucket(i);
            unsettled.attempted = unsettled.attempted.saturating_add(c.attempted);
            unsettled.admitted = unsettled.admitted.saturating_add(c.admitted);
        }
        let current_counts = self.bucket(current);
        // Floored at one rollup interval, as a round's reports are: right
        // after a boundary, a sliver of a report must not read as a huge rate.
        let span = |from_index: u64| {
            Duration::from_nanos(now.as_nanos() - from_index * sub)
                .max(cfg.rollup_interval)
                .as_secs_f64()
        };
        let (span_all, span_current) = (span(first_unsettled), span(current));
        let sub_secs = cfg.sub_interval.as_secs_f64();

        let series = |settled: u64, unsettled: u64, current: u64| -> f64 {
            let in_progress = (unsettled as f64 / span_all).max(current as f64 / span_current);
            if completed == 0 {
                return in_progress;
            }
            let sum_of_rates = settled as f64 / sub_secs;
            let mean = sum_of_rates / completed as f64;
            if in_progress >= mean {
                (sum_of_rates + in_progress) / (completed + 1) as f64
            } else {
                mean
            }
        };
        Rates {
            demand: series(
                settled.attempted,
                unsettled.attempted,
                current_counts.attempted,
            ),
            admitted: series(
                settled.admitted,
                unsettled.admitted,
                current_counts.admitted,
            ),
        }
    }

    fn total(&self) -> (u64, u64) {
        self.buckets.iter().fold((0, 0), |(a, b), c| {
            (a.saturating_add(c.attempted), b.saturating_add(c.admitted))
        })
    }
}

#[cfg(test)]
impl DemandWindow {
    fn bucket(&self, index: u64) -> Counts {
        self.sub_intervals()
            .expect("an ably-mma window")
            .bucket(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WindowSection;
    use proptest::prelude::*;

    fn cfg(estimator: EstimatorKind) -> WindowConfig {
        WindowConfig::try_from(WindowSection {
            estimator,
            ..WindowSection::default()
        })
        .unwrap()
    }

    const T0: u64 = 1_700_000_000_000; // ms, a multiple of 2 s and of 6 s? checked below

    fn at(ms: u64) -> Nanos {
        Nanos::from_millis(T0 + ms)
    }

    /// A round that chance filled with rare publishes to 1 000
    /// subscribers (seven in four agents' reports, where 2.85 were due,
    /// among sixteen agents' cheap operations: 4 765/s against 3 000/s;
    /// the heavy fan-out account's first round at seed 17) is weighed by
    /// its own reports' costs, whole and while it is what the estimate
    /// stands on as the next round's first reports come in: weighed by
    /// those, a cheap first report's, it read as proof (seed 20's round
    /// at 10–12 s).
    #[test]
    fn a_round_is_weighed_by_its_own_reports_costs_while_the_estimate_stands_on_it() {
        let c = cfg(EstimatorKind::LatestRound);
        let mut w = DemandWindow::new(&c);
        let report = |w: &mut DemandWindow, end: u64, (attempted, ops): (u64, u32)| {
            w.record(&c, at(end - 2_000), at(end), attempted, attempted);
            w.note_op_cost(1_001, attempted);
            w.note_ops(&c, at(end), 1_001, ops, attempted);
        };
        for r in spread::tests::heavy_first_round() {
            report(&mut w, 2_000, r);
        }
        let over = |w: &DemandWindow, now: u64| {
            let demand = w.estimate(&c, at(now)).rates.demand;
            assert!(demand > 4_700.0, "{demand}");
            w.confidently_over(&c, 3_000.0, demand, 1.5, 5.0)
        };
        assert!(!over(&w, 2_050));
        report(&mut w, 4_000, (140, 140));
        assert!(!over(&w, 4_050), "standing on the round before");
        assert!(
            w.confidently_over(&c, 3_000.0, 30_000.0, 1.5, 5.0),
            "a deluge's round would still be proof"
        );
    }

    /// A snapshot holds a window in the layout masters have always written
    /// (the surge estimate left out, the sub-intervals of `ably-mma` kept),
    /// and a window read back estimates as the rounds did.
    #[test]
    fn snapshots_keep_the_windows_layout() {
        let surge = crate::wire::SurgeRates {
            rate: 5_000.0,
            baseline: 100.0,
            surged: false,
            joined: false,
            ..crate::wire::SurgeRates::default()
        };
        for estimator in [EstimatorKind::LatestRound, EstimatorKind::AblyMma] {
            let c = cfg(estimator);
            let mut w = DemandWindow::new(&c);
            for _ in 0..3 {
                w.record(&c, at(0), at(2_000), 400, 300);
            }
            let rounds = w.estimate(&c, at(2_400));
            assert!(w.surge(&c, at(2_600), at(2_600), "a", surge));
            let json = serde_json::to_value(&w).unwrap();
            let keys: Vec<&str> = json
                .as_object()
                .unwrap()
                .keys()
                .map(|k| k.as_str())
                .collect();
            assert_eq!(
                keys,
                ["rates", "reports", "round", "spread", "sub_intervals"],
                "{estimator:?}"
            );
            assert_eq!(
                json["sub_intervals"].is_null(),
                estimator == EstimatorKind::LatestRound
            );
            let back: DemandWindow = serde_json::from_value(json.clone()).unwrap();
            assert!(back.fits(&c));
            assert_eq!(back.estimate(&c, at(2_400)), rounds, "{estimator:?}");
            assert_eq!(back.total(), w.total());
            // Snapshots from before the spread was kept still load.
            let mut old = json;
            old.as_object_mut().unwrap().remove("spread");
            let back: DemandWindow = serde_json::from_value(old).unwrap();
            assert_eq!(back.estimate(&c, at(2_400)).rates, rounds.rates);
        }
    }
    #[test]
    fn epoch_offset_is_aligned_for_readable_tests() {
        assert_eq!(T0 % 6_000, 2_000, "T0 sits 2 s into a sub-interval");
        assert_eq!(T0 % 2_000, 0);
    }

    #[test]
    fn straddling_report_is_split_pro_rata_and_exactly() {
        let c = cfg(EstimatorKind::AblyMma);
        let mut w = DemandWindow::new(&c);
        // [T0+3.5 s, T0+5.5 s) straddles the boundary at T0+4 s (a multiple of 6 s).
        let d = w.record(&c, at(3_500), at(5_500), 2_000, 1_001);
        assert_eq!(d, Dropped::default());
        let sub = 6_000_000_000u64;
        let i = at(3_500).as_nanos() / sub;
        assert_eq!(w.bucket(i).attempted, 500);
        assert_eq!(w.bucket(i + 1).attempted, 1_500);
        assert_eq!(w.bucket(i).admitted + w.bucket(i + 1).admitted, 1_001);
        assert_eq!(w.total(), (2_000, 1_001));
    }

    /// A round that lost a report (its counts come with the agent's next
    /// one) reads as the higher of it and the round before only until no
    /// report of it can still come: then it is whole, and a deluge that
    /// ended is let go. Agents asking meanwhile are told when that is.
    #[test]
    fn a_round_missing_a_report_is_whole_once_past_due() {
        let c = cfg(EstimatorKind::LatestRound);
        let mut w = DemandWindow::new(&c);
        // Two agents, a deluge: 2 × 5 000/s.
        w.record(&c, at(0), at(2_000), 10_000, 2_000);
        w.record(&c, at(0), at(2_000), 10_000, 2_000);
        // The deluge ends; one agent's report of the next round is lost.
        w.record(&c, at(2_000), at(4_000), 400, 400);
        let whole_by = at(4_000) + c.grace;
        let past_due = whole_by + c.rollup_interval / 2;
        let e = w.estimate(&c, at(4_100));
        assert_eq!((e.rates.demand, e.whole_by), (10_000.0, Some(whole_by)));
        let e = w.estimate(&c, whole_by);
        assert_eq!((e.rates.demand, e.whole_by), (10_000.0, Some(past_due)));
        let e = w.estimate(&c, past_due);
        assert_eq!((e.rates.demand, e.whole_by), (200.0, None));
    }

    #[test]
    fn reports_older_than_the_window_are_dropped_not_misplaced() {
        let c = cfg(EstimatorKind::AblyMma);
        let mut w = DemandWindow::new(&c);
        w.record(&c, at(100_000), at(102_000), 10, 10);
        let d = w.record(&c, at(0), at(2_000), 7, 3);
        assert_eq!(
            d,
            Dropped {
                attempted: 7,
                admitted: 3
            }
        );
        assert_eq!(w.total(), (10, 10));
    }

    /// Feeds `agents` agents sending steady demand with the given phases and
    /// checks the estimate at many points, boundaries included.
    fn steady(estimator: EstimatorKind, phases_ms: &[u64], delay_ms: u64) {
        let c = cfg(estimator);
        let mut w = DemandWindow::new(&c);
        let per_agent = 700.0; // cost per second per agent
        let total = per_agent * phases_ms.len() as f64;
        let mut events: Vec<(u64, u64, u64)> = Vec::new(); // (arrival, start, end)
        for (a, &phase) in phases_ms.iter().enumerate() {
            let mut start = 0;
            let mut end = phase.max(1);
            while end < 120_000 {
                events.push((end + delay_ms + a as u64, start, end));
                start = end;
                end += 2_000;
            }
        }
        events.sort();
        for (arrival, start, end) in events {
            let secs = (end - start) as f64 / 1000.0;
            let cost = (per_agent * secs).round() as u64;
            w.record(&c, at(start), at(end), cost, cost / 2);
            if arrival > 40_000 {
                let r = w.rates(&c, at(arrival));
                assert!(
                    (r.demand - total).abs() / total < 0.01,
                    "{estimator:?}: at +{arrival} ms read {} for {total}",
                    r.demand
                );
                assert!((r.admitted - total / 2.0).abs() / total < 0.01);
            }
        }
    }

    #[test]
    fn steady_demand_reads_exactly_with_aligned_agents() {
        for e in [EstimatorKind::LatestRound, EstimatorKind::AblyMma] {
            steady(e, &[2_000; 10], 5);
        }
    }

    #[test]
    fn steady_demand_reads_exactly_with_straddling_reports() {
        // Phases that are not on the grid: reports straddle sub-interval
        // boundaries and arrive late.
        for e in [EstimatorKind::LatestRound, EstimatorKind::AblyMma] {
            steady(e, &[300, 700, 1_100, 1_900, 2_000, 500], 40);
        }
    }

    proptest! {
        /// Whatever the interval, the parts add up to the whole unless
        /// they are older than the window; nothing lands outside the
        /// sub-intervals the interval overlaps.
        #[test]
        fn attribution_conserves_cost(
            start_ms in 0u64..60_000,
            len_ms in 0u64..30_000,
            attempted in 0u64..u64::MAX / 2,
            admitted_share in 0.0f64..=1.0,
        ) {
            let c = cfg(EstimatorKind::AblyMma);
            let mut w = DemandWindow::new(&c);
            let admitted = (attempted as f64 * admitted_share) as u64;
            let (s, e) = (at(start_ms), at(start_ms + len_ms));
            let dropped = w.record(&c, s, e, attempted, admitted);
            let (a, b) = w.total();
            prop_assert_eq!(a + dropped.attempted, attempted);
            prop_assert_eq!(b + dropped.admitted, admitted);
            let sub = 6_000_000_000u64;
            let (first, last) = (s.as_nanos() / sub, e.as_nanos().saturating_sub(1).max(s.as_nanos()) / sub);
            for i in first.saturating_sub(10)..last + 10 {
                if i < first || i > last {
                    prop_assert_eq!(w.bucket(i), Counts::default());
                }
            }
        }

        /// Reports in any order never lose cost that is still inside the
        /// window, and never count anything twice.
        #[test]
        fn any_order_of_reports_conserves_cost(
            reports in proptest::collection::vec((0u64..20_000, 1u64..4_000, 0u64..1_000_000), 1..40),
        ) {
            let c = cfg(EstimatorKind::AblyMma);
            let mut w = DemandWindow::new(&c);
            let mut kept = 0u64;
            for (start, len, cost) in reports {
                let d = w.record(&c, at(start), at(start + len), cost, 0);
                kept += cost - d.attempted;
            }
            // Everything spans < 24 s, which the ring holds entirely.
            prop_assert_eq!(w.total().0, kept);
        }
    }
}
