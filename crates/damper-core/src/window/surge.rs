//! The window's surge estimate: what early reports say about an account's
//! demand before the round that shows it is whole.
//!
//! Each early report moves one agent's rate: from its `baseline` (what the
//! master last had from that agent) to `rate`. Two bounds follow:
//! - `base + delta`: the estimate when the surge began, moved by every
//!   reported change, with the agents that did not report assumed
//!   unchanged. Right for a flood that stops (every agent reports its
//!   drop), too high when traffic only moves (agents it left may be too
//!   small to report their drop).
//! - `up`: the rates of the agents that reported a jump, alone. Right for a
//!   deluge (the agents it hits report it), a lower bound always, and
//!   never above what those agents really see: movement cannot raise it
//!   past the account's own demand.
//!
//! The estimate is `min(base + delta, max(base, up))`: a jump counts only
//! as far as the agents that saw it prove it, a drop counts in full.
//! Agents whose pair just moved here (*joins*, [`SurgeRates::joined`])
//! add their rates to both bounds: `base` holds none of them, and each is
//! the agent's own measure. Where
//! the rounds say more, they win unless drops were reported, and then
//! they are moved down by the net change. It
//! stands until the first round wholly after the first early report is
//! whole, and then the rounds speak again; an early report of a later
//! round, while it proves no more than the rounds (a chance spike),
//! starts a new one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::DemandWindow;
use super::reporters::Reporters;
use crate::config::WindowConfig;
use crate::time::{Nanos, duration_nanos};
use crate::wire::SurgeRates;

/// What a standing surge estimate says of the demand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct SurgeDemand {
    /// The demand, cost per second.
    pub(super) demand: f64,
    /// For a rise, the operations its first reports counted (0: not said,
    /// or a fall): a rise summed from few operations waits for more
    /// before it suppresses (`master::surge_proven`).
    pub(super) ops: u32,
    /// For a rise, the demand with its counted reports' rates read over
    /// the time they span together ([`Surge::demand_over_span`]); for a
    /// fall, the demand.
    pub(super) over_span: f64,
    /// How many reports those are.
    pub(super) counted: u16,
    /// For a fall, the chance spread of the part of the demand its counted
    /// answers make up ([`Surge::answers_noise`]); 0 for a rise. A fall is
    /// weighed by the part its answers measured alone: weighed by a margin
    /// on the whole estimate, like a rise, a release whose answers arrive
    /// one by one crossed the margin back and forth, since the agents that
    /// had not answered yet still counted at the flood's rate.
    pub(super) fall_noise: f64,
    /// Whether the reports brought the demand down rather than up, the
    /// last of them within [`FALLING_FOR`].
    pub(super) falling: bool,
}

/// A window's surge estimate while it stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Surge {
    /// The window's demand estimate when the first early report came.
    base: f32,
    /// The sum of the reported changes, `rate − baseline`.
    delta: f32,
    /// The sum of the reported rates of the agents that jumped (less their
    /// own earlier early reports, which `up` already holds).
    up: f32,
    /// The sum of the joined agents' rates: demand this master's rounds
    /// have not seen, as it went to the pair's previous master.
    joined: f32,
    /// The round the first early report was measured in: the estimate
    /// stands until the round after it is whole, however many more come
    /// (so chance spikes of a sparse account cannot pile up in it for
    /// ever); a surge that outlasts it is in the rounds by then.
    round: u64,
    /// How many operations the reports counted that said (a rise's early
    /// reports, a poll's answers), each agent's first report only: later
    /// ones measure the same operations again over longer spans.
    #[serde(default)]
    ops: u32,
    /// How many reports `ops` sums (saturating): one is a single agent's
    /// sub-window, tested against chance by the master more strictly than
    /// several (see `master::surge_proven_by`).
    #[serde(default)]
    counted: u16,
    /// The rates of those counted reports, summed, and their squares each
    /// over its count of operations, summed: the chance variance of that
    /// sum, a Poisson count's for each (see [`Surge::weighed_ops`]).
    #[serde(default)]
    counted_rate: f32,
    #[serde(default)]
    counted_var: f32,
    /// The share kept (`1 − factor`) of the last verdict pushed for this
    /// estimate to every agent, and when (nanoseconds); 0 for none. See
    /// [`DemandWindow::surge_repush`].
    #[serde(default)]
    pushed_keep: f32,
    #[serde(default)]
    pushed_at: u64,
    /// When the last early report moved it (nanoseconds): a fall whose
    /// reports are still coming in may release the account any moment
    /// ([`FALLING_FOR`]).
    #[serde(default)]
    moved_at: u64,
    /// The agents it holds an early report of: a follow-up from any other
    /// is its first report here (see [`Surge::as_held`]).
    #[serde(default)]
    reporters: Reporters,
    /// What each of the first [`SHARES`] agents counted added to `ops`,
    /// `counted_rate` and `counted_var`, so that an agent that takes its
    /// rise back takes its count back too (see [`Surge::take_back`]).
    #[serde(skip)]
    shares: [CountedShare; SHARES],
}

/// The most counted reports not known to have ended (by a fall, or taken
/// back) a rise may stand on and still be weighed over the time they span
/// together ([`Surge::demand_over_span`]). Lumps of sparse costly operations under
/// the limit coincide two, three or four at a time; more agents than
/// that rising together, none falling, is a flood's onset, and read over
/// the time their reports span before their falls could have come,
/// `mixed-costs` at 2× of its limit was held half a second later (over
/// its limit by 6% more, seeds 1–200).
const SPREAD_REPORTS: usize = 4;

/// How many agents' counted shares an estimate keeps ([`Surge::shares`]):
/// past them, a share taken back stays counted, as before.
const SHARES: usize = 16;

/// How far over its last rollup's rate a follow-up of a counted rise
/// may be and still have taken the rise back ([`Surge::take_back`]): a
/// lump of one publish to 1 000 (5 075/s) is followed by the agent's own
/// share of the rest (70–85/s, its rollup 67–73/s).
const TAKEN_BACK: f32 = 1.5;

/// One agent's part of an estimate's count.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct CountedShare {
    /// The agent's id hashed (`crate::agent::agent_seed`), low half, and
    /// never 0 (0: a free place).
    agent: u32,
    ops: u32,
    rate: f32,
    /// The rate it was counted against: a share counted at about it (a
    /// poll's answer, say) measured the level, not a rise, and is not
    /// taken back.
    from: f32,
    /// Taken back: the agent's next rise is counted again as its first.
    back: bool,
    /// Taken back while it was the only share, so still in the count (a
    /// count of none would read as not said) until another is counted
    /// ([`Surge::count`]).
    lingers: bool,
    /// The agent's rate over time since its rise, as its reports said it
    /// ([`Surge::demand_over_span`]): from `start` to `end`
    /// (nanoseconds; `start` 0: the report did not say its span), `cost`
    /// in all, at `now_rate` last (a follow-up's, or the rise's).
    start: u64,
    end: u64,
    cost: f32,
    now_rate: f32,
}

impl CountedShare {
    /// A report of `ops` operations at `rate` from the agent whose id
    /// hashes to `agent`, counted against `from`, its rate over `span`
    /// (0: not said) to `end`.
    fn new(agent: u64, (ops, rate, from): (u32, f32, f32), end: Nanos, span: Duration) -> Self {
        let end = end.as_nanos();
        let start = if span.is_zero() {
            0
        } else {
            end.saturating_sub(duration_nanos(span)).max(1)
        };
        CountedShare {
            agent: share_id(agent),
            ops,
            rate,
            from,
            back: false,
            lingers: false,
            start,
            end,
            cost: rate * span.as_secs_f32(),
            now_rate: rate,
        }
    }

    /// Its agent's rate moved to `rate` by a report measured over `span`
    /// (0: not said) to `at`: the rate it says held over its span, and
    /// since the last report before it. A span that reaches back into
    /// what the share holds measures that time again (a close's rate
    /// over the sub-window whose first half a peek reported), and
    /// replaces its part of the cost.
    fn moved(&mut self, rate: f32, at: Nanos, span: Duration) {
        self.now_rate = rate;
        let at = at.as_nanos();
        if self.start == 0 || at <= self.end {
            return;
        }
        let from = at
            .saturating_sub(duration_nanos(span))
            .clamp(self.start, self.end);
        let kept = (from - self.start) as f32 / (self.end - self.start).max(1) as f32;
        self.cost = self.cost * kept + rate * (at - from) as f32 / 1e9;
        self.end = at;
    }

    /// Whether its agent's rate has fallen well below its rise (a lump's
    /// fall that took nothing back: a new account's agent has no rollup
    /// to come back to).
    fn fell(&self) -> bool {
        self.now_rate * TAKEN_BACK < self.rate
    }

    /// Its end, held on to `held_to` when that is later: had its rate
    /// fallen since, its agent would have said so.
    fn held_end(&self, held_to: u64) -> u64 {
        self.end.max(held_to)
    }

    /// Its cost from its start to [`held_end`](Self::held_end).
    fn held_cost(&self, held_to: u64) -> f64 {
        let more = self.held_end(held_to) - self.end;
        f64::from(self.cost) + f64::from(self.now_rate) * more as f64 / 1e9
    }

    /// Whether it stands in the count.
    fn stands(&self) -> bool {
        self.agent != 0 && (!self.back || self.lingers)
    }
}

/// An agent's place in [`Surge::shares`].
fn share_id(agent: u64) -> u32 {
    (agent as u32).max(1)
}

/// How many of the agents' sub-windows after a counted rise's end its
/// fall would have been reported by, were it a lump: a chance lump's fall
/// is followed up at the second sub-window's close after the lump's (a
/// fall is judged over two), and half a sub-window more allows for the
/// report's way and a peek's rise, measured half a sub-window early. Past
/// it, a rise with no fall reported goes on ([`Surge::demand_over_span`]).
const FALL_SAID_WITHIN: f64 = 2.5;

/// [`FALL_SAID_WITHIN`] in nanoseconds, of the sub-window a default
/// agent's surge rule cuts the round into
/// ([`SurgeRule::default_for`](crate::agent::SurgeRule::default_for)). Agents
/// of a longer sub-window report a lump's fall later, and a lump may then
/// read as going on: weighed as before spans were said.
fn fall_said_within(cfg: &WindowConfig) -> u64 {
    let window = crate::agent::SurgeRule::default_for(cfg.rollup_interval).window();
    (window.as_secs_f64() * FALL_SAID_WITHIN * 1e9) as u64
}

/// How long after its last early report a fall counts as still coming in
/// (`SurgeDemand::falling`): the agents report a flood's end within a
/// sub-window or two of each other (200–400 ms), so its answers come
/// close together; once they stop, the estimate stands until its round.
pub const FALLING_FOR: Duration = Duration::from_millis(300);

impl Surge {
    /// The demand it estimates, cost per second, given the rounds' estimate
    /// `rounds` now: its own when above the rounds' (a jump); below them,
    /// the rounds' moved by the net change reported, so only reported drops
    /// bring the estimate down (not a base taken before this master had
    /// heard of the account, say).
    fn demand(&self, rounds: f64) -> f64 {
        let (base, own) = (f64::from(self.base), self.own());
        let demand = if own >= base {
            // A jump: it counts until the rounds show more.
            own.max(rounds)
        } else {
            // A fall: the rounds moved down by it, or the rounds alone once
            // they show less (the agents that have not reported their drop
            // yet will by then have sent a round that says it).
            own.min(rounds).max(rounds + f64::from(self.delta))
        };
        demand.max(0.0)
    }

    /// What the reports alone say: the base moved by every change, a jump
    /// only as far as its reporters prove it, joins in full.
    fn own(&self) -> f64 {
        let (base, delta, up, joined) = (
            f64::from(self.base),
            f64::from(self.delta),
            f64::from(self.up),
            f64::from(self.joined),
        );
        (base + delta).min(base.max(up)) + joined
    }

    /// The chance spread of the rates its counted reports summed (`up`):
    /// their sum over the square root of the operations they counted (a
    /// Poisson count's), cost per second; 0 when none counted.
    fn answers_noise(&self) -> f64 {
        if self.ops == 0 {
            return 0.0;
        }
        f64::from(self.up).max(0.0) / f64::from(self.ops).sqrt()
    }

    /// The operations its counted reports weigh as: their count, but no
    /// more than the sum of their rates over its own chance spread makes
    /// it, `(Σ r)² ÷ Σ (r² ÷ n)`. Reports that each counted one publish
    /// of 51 and one that counted 14 operations of 1 are not 15
    /// operations of a kind: the sum they make is as uncertain as about
    /// one publish more than the single ones.
    fn weighed_ops(&self) -> u32 {
        let var = f64::from(self.counted_var);
        if var <= 0.0 {
            return self.ops;
        }
        let weighed = f64::from(self.counted_rate).powi(2) / var;
        (weighed.round().max(1.0) as u32).min(self.ops)
    }

    /// A report from the agent whose id hashes to `agent`, as this
    /// estimate holds it: a follow-up (`surged`) from an agent it holds no
    /// report of is that agent's first report here, against its last
    /// rollup ([`SurgeRates::rollup_baseline`]; its early report went to
    /// an estimate this one replaced). Notes the agent as held.
    fn as_held(&mut self, agent: u64, rates: SurgeRates) -> SurgeRates {
        let held = self.reporters.may_hold(agent);
        self.reporters.insert(agent);
        match rates.rollup_baseline {
            Some(baseline) if rates.surged && !held => SurgeRates {
                baseline,
                surged: false,
                ..rates
            },
            // A follow-up's fall from a rise this estimate holds counts
            // nothing here; it says its operations only in case it was
            // not held (`agent::Entry::rise_report`).
            _ if rates.surged && rates.rate < rates.baseline => SurgeRates { ops: 0, ..rates },
            _ => rates,
        }
    }

    /// Counts an agent's report into the estimate's count, and notes its
    /// share.
    fn count(&mut self, share: CountedShare) {
        self.let_go_of_lingering();
        let (ops, rate) = (share.ops, share.rate);
        self.ops = self.ops.saturating_add(ops);
        self.counted = self.counted.saturating_add(1);
        self.counted_rate += rate;
        self.counted_var += rate * rate / ops as f32;
        let place = self
            .shares
            .iter()
            .position(|s| s.agent == share.agent)
            .or_else(|| self.shares.iter().position(|s| s.agent == 0));
        if let Some(i) = place {
            self.shares[i] = share;
        }
    }

    /// The demand `demand` (the estimate's) with its counted reports'
    /// agents' rates read over the time they span together, as of
    /// `held_to`: what chance is weighed against before the count proves
    /// a rise. The estimate sums each agent's rate now, as if each had
    /// held over the same sub-window; here they are read as the cost
    /// their reports say came from the earliest start to the latest end
    /// (`U`), `Σ cost ÷ U`, where less. Each agent's rate holds over the
    /// span its rise was measured over, then as its follow-ups said, and
    /// on to `held_to` once that is past its last report: its agent would
    /// have reported a fall by then (see [`FALL_SAID_WITHIN`]), so its
    /// rate goes on. The demand as it is for reports measured over the
    /// same time (a deluge's, or a poll's answers), for one alone, when a
    /// standing report did not say its span (or is past the [`SHARES`]
    /// noted), and while more than [`SPREAD_REPORTS`] have not fallen.
    fn demand_over_span(&self, demand: f64, held_to: u64) -> f64 {
        let standing = || self.shares.iter().filter(|s| s.stands());
        let noted = standing().count();
        let going_on = standing().filter(|s| !s.back && !s.fell()).count();
        if noted < 2
            || noted < usize::from(self.counted)
            || going_on > SPREAD_REPORTS
            || standing().any(|s| s.start == 0)
        {
            return demand;
        }
        let first = standing().map(|s| s.start).min().unwrap_or(0);
        let last = standing().map(|s| s.held_end(held_to)).max().unwrap_or(0);
        let span = last.saturating_sub(first) as f64 / 1e9;
        if span <= 0.0 {
            return demand;
        }
        let now: f64 = standing().map(|s| f64::from(s.now_rate)).sum();
        let over_span: f64 = standing().map(|s| s.held_cost(held_to)).sum::<f64>() / span;
        (demand - (now - over_span).max(0.0)).max(0.0)
    }

    /// Takes a share that [`take_back`](Self::take_back) left lingering out
    /// of the count, now that another is counted: a rise taken back, kept
    /// only so the count said something, is no more behind the rate than
    /// any other taken back. Kept, one publish to 4 000 that an agent saw
    /// and took back stayed counted beside two that came 700 ms later on
    /// two other agents, in one sub-window, and their three operations,
    /// where two were all the rate stood on, proved 27× the limit of an
    /// account at 0.95× of it.
    fn let_go_of_lingering(&mut self) {
        let Some(share) = self.shares.iter_mut().find(|s| s.lingers) else {
            return;
        };
        share.lingers = false;
        let share = *share;
        self.subtract(share);
    }

    /// Notes a follow-up at `rate` from the agent whose id hashes to
    /// `agent`, its sub-window ending at `at`, where it took nothing back:
    /// its agent's rate since its rise ([`demand_over_span`](Self::demand_over_span)).
    /// A young pair's follow-ups measure the same rise over a longer span,
    /// a flood's agents say theirs goes on, and a new account's lump
    /// falls (its agent has no rollup to come back to).
    fn followed_up(&mut self, agent: u64, rate: f32, at: Nanos, span: Duration) {
        let id = share_id(agent);
        if let Some(share) = self.shares.iter_mut().find(|s| s.agent == id && s.stands()) {
            share.moved(rate, at, span);
        }
    }

    /// Takes a counted share's part out of the sums.
    fn subtract(&mut self, share: CountedShare) {
        self.ops = self.ops.saturating_sub(share.ops);
        self.counted = self.counted.saturating_sub(1);
        self.counted_rate = (self.counted_rate - share.rate).max(0.0);
        self.counted_var = (self.counted_var - share.rate * share.rate / share.ops as f32).max(0.0);
    }

    /// Replaces the count with an agent's report alone (see [`count`](Self::count)).
    fn count_alone(&mut self, share: CountedShare) {
        self.ops = 0;
        self.counted = 0;
        self.counted_rate = 0.0;
        self.counted_var = 0.0;
        self.shares = Default::default();
        self.count(share);
    }

    /// Whether the agent's next counted report would be its first counted
    /// here: it has no share standing in the count, whether it never
    /// counted (its first report here was a fall, which counts nothing) or
    /// took its rise back. Not known past [`SHARES`] agents: `None`.
    fn counts_first(&self, agent: u64) -> Option<bool> {
        let id = share_id(agent);
        match self.shares.iter().find(|s| s.agent == id) {
            Some(share) => Some(share.back),
            None if self.shares.iter().any(|s| s.agent == 0) => Some(true),
            None => None,
        }
    }

    /// Takes an agent's share out of the count, its follow-up having come
    /// back to about its last rollup's rate: what its rise counted no
    /// longer stands behind the estimate's rate. Only a rise's share (its
    /// rate past [`TAKEN_BACK`] times what it was counted against): a
    /// poll's answers measure the level of a flood already held, and taken
    /// back as their follow-ups read the same level, they released a 5×
    /// flood for two seconds. Kept, a chance lump's count stayed after its
    /// rate went, and the lumps of agents one after another over two
    /// seconds, each taken back, were counted as if they had come
    /// together: two single publishes to 1 000 standing, with six
    /// counted, proved 5.2× the limit of an account at 0.95× of it. The
    /// last share stays, a count of none reading as not said, and
    /// lingers until another is counted.
    fn take_back(&mut self, agent: u64, rate: f32, at: Nanos, span: Duration) {
        let id = share_id(agent);
        let last = self.counted <= 1;
        let Some(share) = self
            .shares
            .iter_mut()
            .find(|s| s.agent == id && !s.back && s.rate > TAKEN_BACK * s.from)
        else {
            return;
        };
        share.moved(rate, at, span);
        share.back = true;
        share.lingers = last;
        let share = *share;
        if !last {
            self.subtract(share);
        }
    }

    /// Whether it reports a fall: less than when it began.
    fn is_fall(&self) -> bool {
        self.own() < f64::from(self.base)
    }
}

impl DemandWindow {
    /// Takes one early report from `agent` at `now`: its rate over the
    /// sub-window that ended at `at`. Returns `false` when it describes a
    /// round already reported (it came too late to matter).
    pub fn surge(
        &mut self,
        cfg: &WindowConfig,
        now: Nanos,
        at: Nanos,
        agent: &str,
        rates: SurgeRates,
    ) -> bool {
        let r = duration_nanos(cfg.rollup_interval).max(1);
        let round = at.as_nanos().saturating_sub(1) / r + 1;
        if round < self.round_near(round) {
            return false;
        }
        let rounds = self.round_estimate(cfg, now).rates.demand;
        // A standing estimate of an earlier round that says no more than
        // the rounds (a chance spike) gives way to a new one: otherwise a
        // deluge reported in the next round would lapse with it, when the
        // round before the deluge is whole. One that says more stands (its
        // round, once whole, shows the jump), and a new one starts from the
        // rounds, so chance spikes never pile up from round to round. A
        // reported fall stands too: the round that holds a flood's end
        // reads high once whole, and a new estimate started from it would
        // suppress the account again at the flood's level until the next
        // round is whole.
        let fresh = match self.surge_at(cfg, now) {
            None => true,
            Some(s) => s.round < round && !s.is_fall() && s.demand(rounds) <= rounds,
        };
        if fresh {
            let base = rounds as f32;
            self.extras.get_or_insert_default().surge = Some(Surge {
                base,
                round,
                ..Surge::default()
            });
        }
        let surge = self
            .extras
            .as_deref_mut()
            .and_then(|e| e.surge.as_mut())
            .expect("made above");
        surge.moved_at = now.as_nanos();
        let agent = crate::agent::agent_seed(agent);
        let rates = surge.as_held(agent, rates);
        let (rate, baseline) = (rates.rate.max(0.0), rates.baseline.max(0.0));
        // No longer than a round: a longer span says nothing more of where
        // the report lies, and no agent measures one.
        let span = rates
            .span
            .map_or(Duration::ZERO, |s| s.min(cfg.rollup_interval));
        let share = || CountedShare::new(agent, (rates.ops, rate, baseline), at, span);
        if rates.joined {
            surge.joined += rate;
            return true;
        }
        surge.delta += rate - baseline;
        surge.up += rate - if rates.surged { baseline } else { 0.0 };
        // An agent's first report in this estimate: one that follows up
        // its own report of an estimate since lapsed (`surged`) is the
        // first here all the same. Not counted, a chance lump of 10
        // publishes of 51 where 4 were due, an agent's follow-up of its
        // lump of the round before, stood as a new estimate with no count
        // (`master::surge_proven` takes none for proof): an account at
        // 0.95× on one node was refused for a second.
        // And so is the first counted rise of an agent with no share
        // standing in the count (its first report here a fall, or its
        // rise taken back): not counted, a single publish's rise from an
        // agent whose first report here was a fall stood with no count,
        // which the master takes for not said, and suppressed an account
        // at 0.95× of its limit.
        if rates.surged
            && rates
                .rollup_baseline
                .is_some_and(|r| rate <= TAKEN_BACK * r)
        {
            surge.take_back(agent, rate, at, span);
        } else if rates.ops > 0
            && (!rates.surged || fresh || surge.counts_first(agent).unwrap_or(false))
        {
            surge.count(share());
        } else if surge.counted == 1
            && rates.ops > 0
            && (rates.ops > surge.ops || rate > surge.counted_rate)
        {
            // A single agent's later sub-window, more than its first
            // counted: its count is the larger. A young pair's first peek
            // of a single node's deluge may hold ten operations, too few
            // alone (see `master::surge_proven_by`), and its follow-ups
            // would otherwise wait for the round. And one that reads
            // higher: the estimate stands on it now, and its count is what
            // that rate rests on. (Kept, the first count of 146 cheap
            // operations at 730/s stood beside a follow-up's rate of
            // 6 400/s, one publish of 1 001 among them, and proved it: an
            // account at 0.95× of its limit on one node was refused.)
            surge.count_alone(share());
        } else if rates.surged {
            surge.followed_up(agent, rate, at, span);
        }
        true
    }

    /// The surge estimate while it stands at `now`, given the rounds'
    /// estimate of the demand (see [`SurgeDemand`]).
    pub(super) fn surge_demand(
        &self,
        cfg: &WindowConfig,
        now: Nanos,
        rounds: f64,
    ) -> Option<SurgeDemand> {
        self.surge_at(cfg, now).map(|s| {
            let fall = s.is_fall();
            let demand = s.demand(rounds);
            SurgeDemand {
                demand,
                ops: if fall { 0 } else { s.weighed_ops() },
                over_span: if fall {
                    demand
                } else {
                    let grace = fall_said_within(cfg);
                    s.demand_over_span(demand, now.as_nanos().saturating_sub(grace))
                },
                counted: if fall { 0 } else { s.counted },
                fall_noise: if fall { s.answers_noise() } else { 0.0 },
                falling: fall
                    && now.as_nanos() <= s.moved_at.saturating_add(duration_nanos(FALLING_FOR)),
            }
        })
    }

    /// Notes that a verdict keeping `keep` (`1 − factor`) of the demand
    /// was pushed to every agent at `now`, while the surge estimate
    /// stands.
    pub fn surge_pushed(&mut self, cfg: &WindowConfig, now: Nanos, keep: f64) {
        if self.surge_at(cfg, now).is_none() {
            return;
        }
        if let Some(surge) = self.extras.as_deref_mut().and_then(|e| e.surge.as_mut()) {
            surge.pushed_keep = keep as f32;
            surge.pushed_at = now.as_nanos();
        }
    }

    /// Whether the standing surge estimate's verdict, keeping `keep`
    /// (`1 − factor`) of the demand, should be pushed again at `now`: a
    /// verdict was pushed for it (the flip), at least `spacing` ago, and
    /// the share kept has moved from it by more than `moved` of it since.
    ///
    /// The flip is pushed when the first answers carry the estimate over
    /// the limit, a few of them in: in `sim/scenarios/costly-flood.toml`
    /// (a 5× flood) it read 1.8× the limit and was pushed as 0.43 where
    /// 0.8 is right, and the agents that heard nothing more (no early
    /// report of their own answered after the rest came in) kept
    /// admitting nearly three times their share until their round.
    pub fn surge_repush(
        &self,
        cfg: &WindowConfig,
        now: Nanos,
        keep: f64,
        spacing: Duration,
        moved: f64,
    ) -> bool {
        let Some(surge) = self.surge_at(cfg, now) else {
            return false;
        };
        let pushed = f64::from(surge.pushed_keep);
        pushed > 0.0
            && now.as_nanos() >= surge.pushed_at.saturating_add(duration_nanos(spacing))
            && (keep - pushed).abs() > moved * pushed
    }

    /// Whether the last verdict pushed for its surge estimate, standing or
    /// lapsed but not yet let go of, suppressed the pair (see
    /// `MasterState::queue_release_push`).
    pub fn surge_pushed_suppression(&self) -> bool {
        self.extras
            .as_deref()
            .and_then(|e| e.surge.as_ref())
            .is_some_and(|s| s.pushed_keep > 0.0 && s.pushed_keep < 1.0)
    }

    pub(super) fn surge_at(&self, cfg: &WindowConfig, now: Nanos) -> Option<&Surge> {
        let surge = self.extras.as_deref()?.surge.as_ref()?;
        let r = duration_nanos(cfg.rollup_interval).max(1);
        let after = surge.round + 1;
        let round = self.round_near(after);
        let whole = round > after
            || (round == after
                && self.core.reports[1] > 0
                && self.core.reports[0] >= self.core.reports[1]);
        // Reports lost or agents gone: the estimate lapses all the same
        // once the round after it should have been whole.
        let lapsed = now >= Nanos::from_nanos(after.saturating_mul(r)) + cfg.settle();
        (!whole && !lapsed).then_some(surge)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{WindowConfig, WindowSection};

    const R: u64 = 2_000;

    fn cfg() -> WindowConfig {
        WindowConfig::try_from(WindowSection::default()).unwrap()
    }

    fn ms(t: u64) -> Nanos {
        Nanos::from_secs(1_800_000_000) + Duration::from_millis(t)
    }

    fn rates(rate: f32, baseline: f32, surged: bool) -> SurgeRates {
        SurgeRates {
            rate,
            baseline,
            surged,
            ..SurgeRates::default()
        }
    }

    fn join(rate: f32) -> SurgeRates {
        SurgeRates {
            rate,
            joined: true,
            ..SurgeRates::default()
        }
    }

    /// 20 agents at `per_agent` each, reported for the round ending at `end`.
    fn round(w: &mut DemandWindow, end: u64, per_agent: u64) {
        for _ in 0..20 {
            w.record(&cfg(), ms(end - R), ms(end), per_agent * 2, per_agent * 2);
        }
    }

    /// A surge estimate is let go of, with the extras that held it, when
    /// a round begins after it lapsed: the window then holds no more than
    /// one that never surged, and says the same.
    #[test]
    fn a_lapsed_surge_is_let_go_of_as_the_next_round_begins() {
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        round(&mut w, 2_000, 25);
        assert!(w.surge(&c, ms(2_800), ms(2_800), "a", rates(500.0, 25.0, false)));
        round(&mut w, 4_000, 25);
        // Its round after (to 6 s) is whole, but the round that begins
        // then cannot know it yet: kept.
        round(&mut w, 6_000, 25);
        assert!(w.extras.is_some());
        assert!(!w.estimate(&c, ms(6_100)).surge);
        round(&mut w, 8_000, 25);
        assert!(w.extras.is_none());
        assert_eq!(w.estimate(&c, ms(8_100)).rates.demand, 500.0);
    }

    #[test]
    fn a_deluge_counts_as_its_reporters_prove_it() {
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        round(&mut w, 2_000, 25);
        assert_eq!(w.estimate(&c, ms(2_400)).rates.demand, 500.0);
        for _ in 0..20 {
            assert!(w.surge(&c, ms(2_800), ms(2_800), "a", rates(500.0, 25.0, false)));
        }
        let e = w.estimate(&c, ms(2_810));
        assert!(e.surge);
        assert_eq!(e.rates.demand, 10_000.0);
        // The round that holds the onset reads low; the surge stands.
        round(&mut w, 4_000, 350);
        assert_eq!(w.estimate(&c, ms(4_400)).rates.demand, 10_000.0);
        // The first round wholly after it, once whole, speaks again.
        round(&mut w, 6_000, 500);
        let e = w.estimate(&c, ms(6_400));
        assert!(!e.surge);
        assert_eq!(e.rates.demand, 10_000.0);
    }

    /// A chance spike reported just before a deluge, in the round before
    /// the deluge's reports, does not take them with it when it lapses
    /// (once the deluge's own round is whole): the deluge's estimate
    /// stands until the round after its own is whole.
    #[test]
    fn a_chance_spike_gives_way_to_a_deluge_in_the_next_round() {
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        round(&mut w, 2_000, 25);
        // One agent's chance spike, in the round ending at 2 000: it
        // proves less than the rounds.
        assert!(w.surge(&c, ms(2_100), ms(1_900), "a", rates(100.0, 25.0, false)));
        assert_eq!(w.estimate(&c, ms(2_110)).rates.demand, 500.0);
        // A deluge, in the round ending at 4 000.
        for _ in 0..20 {
            w.surge(&c, ms(2_300), ms(2_200), "a", rates(500.0, 25.0, false));
        }
        assert_eq!(w.estimate(&c, ms(2_310)).rates.demand, 10_000.0);
        // The round ending at 4 000, whole, holds only part of it: the
        // spike's estimate would lapse now; the deluge's stands until the
        // round ending at 6 000 is whole.
        round(&mut w, 4_000, 350);
        let e = w.estimate(&c, ms(4_400));
        assert!(e.surge);
        assert_eq!(e.rates.demand, 10_000.0);
    }

    /// An agent that takes its counted rise back (its follow-up back to
    /// about its last rollup's rate) takes its count back too, and its
    /// next rise counts as its first; the last share stays, since a count
    /// of none reads as not said, until another is counted.
    #[test]
    fn a_rise_taken_back_takes_its_count_back() {
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        let report = |rate: f32, baseline: f32, surged: bool, ops: u32| SurgeRates {
            ops,
            rollup_baseline: surged.then_some(25.0),
            ..rates(rate, baseline, surged)
        };
        let count = |w: &DemandWindow, ms_at: u64| {
            let s = w.surge_at(&c, ms(ms_at)).expect("standing");
            (s.ops, s.counted)
        };
        let send = |w: &mut DemandWindow, now: u64, at: u64, agent: &str, rates: SurgeRates| {
            assert!(w.surge(&c, ms(now), ms(at), agent, rates));
        };
        round(&mut w, 2_000, 25);
        send(&mut w, 2_100, 2_100, "a", report(2_550.0, 25.0, false, 1));
        send(&mut w, 2_110, 2_100, "b", report(2_550.0, 25.0, false, 2));
        assert_eq!(count(&w, 2_120), (3, 2));
        // a's lump is taken back: its count goes.
        send(&mut w, 2_200, 2_200, "a", report(30.0, 2_550.0, true, 0));
        assert_eq!(count(&w, 2_210), (2, 1));
        // It rises again: counted as its first.
        send(&mut w, 2_300, 2_300, "a", report(2_550.0, 30.0, true, 1));
        assert_eq!(count(&w, 2_310), (3, 2));
        // b's is taken back; then a's again, the last share: it stays.
        send(&mut w, 2_400, 2_400, "b", report(25.0, 2_550.0, true, 0));
        assert_eq!(count(&w, 2_410), (1, 1));
        send(&mut w, 2_500, 2_500, "a", report(30.0, 2_550.0, true, 0));
        assert_eq!(count(&w, 2_510), (1, 1));
        // Another is counted: a's lingering share goes. A share counted
        // at about its agent's level (a poll's answer measures the level
        // of a flood already held) is not a rise, and its follow-up at
        // that level takes nothing back.
        send(&mut w, 2_520, 2_500, "c", report(30.0, 25.0, false, 3));
        assert_eq!(count(&w, 2_530), (3, 1));
        send(&mut w, 2_620, 2_600, "c", report(28.0, 30.0, true, 0));
        assert_eq!(count(&w, 2_630), (3, 1));
    }

    /// A lump taken back while it was the estimate's only count lingers
    /// only until another agent's report is counted: the lumps of two
    /// agents that follow it are counted as two, not three. Kept, one
    /// publish to 4 000 an agent saw and took back stood beside two that
    /// came on two other agents 700 ms later, and the three operations
    /// proved 27× the limit of an account at 0.95× of it (seed 19 of
    /// `heavy-fanout`'s `rare-4000-95`, 20 agents).
    #[test]
    fn a_lump_taken_back_alone_is_not_counted_beside_later_ones() {
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        let lump = |rate: f32| SurgeRates {
            ops: 1,
            ..rates(rate, 70.0, false)
        };
        round(&mut w, 2_000, 70);
        assert!(w.surge(&c, ms(2_400), ms(2_400), "a", lump(20_075.0)));
        let back = SurgeRates {
            rollup_baseline: Some(66.0),
            ..rates(75.0, 20_075.0, true)
        };
        assert!(w.surge(&c, ms(2_800), ms(2_800), "a", back));
        assert!(w.surge(&c, ms(3_100), ms(3_100), "b", lump(40_070.0)));
        assert!(w.surge(&c, ms(3_100), ms(3_100), "c", lump(40_080.0)));
        let e = w.estimate(&c, ms(3_110));
        assert!(e.surge);
        assert_eq!((e.surge_ops, e.surge_reports), (2, 2), "{e:?}");
        // Two publishes where 0.075 were due at a limit of 3 000/s are
        // chance one time in 370; three would have been proof.
        let proven =
            |ops, reports| crate::master::surge_proven_by(e.rates.demand, 3_000.0, ops, reports);
        assert!(!proven(2, 2));
        assert!(proven(3, 3));
    }

    /// Lumps that agents saw one after another are weighed over the time
    /// they span together: three publishes to 4 000 subscribers on three
    /// agents, each read over its own 200 ms, sum to 20× a limit of
    /// 3 000/s, but over the 400 ms they span they are 10×, and three
    /// operations where 0.3 were due at the limit are chance one time in
    /// 280 (seed 18 of `heavy-fanout`'s `rare-4000-95`, at 0.95× of its
    /// limit, was refused on them). The same three measured over the same
    /// 200 ms are proof; so are a deluge's reports, spread or not.
    #[test]
    fn lumps_one_after_another_are_weighed_over_the_time_they_span() {
        let c = cfg();
        let lump = |rate: f32| {
            SurgeRates {
                ops: 1,
                ..rates(rate, 70.0, false)
            }
            .with_span(Duration::from_millis(200))
        };
        let proven = |ends: [u64; 3], rate: f32, ops: u32| {
            let mut w = DemandWindow::new(&c);
            round(&mut w, 2_000, 70);
            for (agent, end) in ["a", "b", "c"].into_iter().zip(ends) {
                let report = SurgeRates { ops, ..lump(rate) };
                assert!(w.surge(&c, ms(end + 5), ms(end), agent, report));
            }
            let e = w.estimate(&c, ms(2_810));
            assert!(e.surge);
            assert_eq!(e.rates.demand, 3.0 * f64::from(rate), "{e:?}");
            let proof = e.surge_demand_over_span;
            (
                proof,
                crate::master::surge_proven_by(proof, 3_000.0, e.surge_ops, e.surge_reports),
            )
        };
        let (spread, chance) = proven([2_600, 2_800, 2_800], 20_075.0, 1);
        assert!((spread - 30_112.5).abs() < 1.0, "{spread}");
        assert!(!chance);
        let (together, proof) = proven([2_800, 2_800, 2_800], 20_075.0, 1);
        assert_eq!(together, 60_225.0);
        assert!(proof);
        // A deluge: 60 operations each, as spread.
        assert!(proven([2_600, 2_800, 2_800], 20_000.0, 60).1);
    }

    /// A counted rise its agent has not followed up with a fall holds on
    /// once its fall would have been said ([`FALL_SAID_WITHIN`] of a
    /// 200-ms sub-window: 500 ms), and a flood's rises are read as the
    /// flood's again; one whose fall came held until its fall only (an
    /// account new to this master has no rollup for it to take its rise
    /// back to: `heavy-fanout`'s `heavy-95` at seed 7, seven lumps over
    /// 1.5 s, four of them fallen, was refused on them). A follow-up
    /// measured over time its share already holds replaces that part.
    #[test]
    fn a_rise_holds_on_until_its_agent_says_it_fell() {
        let c = cfg();
        let lump = SurgeRates {
            ops: 1,
            ..rates(10_000.0, 0.0, false)
        }
        .with_span(Duration::from_millis(100));
        let fall = SurgeRates {
            ops: 14,
            rollup_baseline: Some(0.0),
            ..rates(70.0, 10_000.0, true)
        };
        let over_span = |w: &DemandWindow, now: u64| {
            let e = w.estimate(&c, ms(now));
            assert_eq!(e.rates.demand, 20_000.0, "{e:?}");
            e.surge_demand_over_span
        };
        let two_lumps = || {
            let mut w = DemandWindow::new(&c);
            assert!(w.surge(&c, ms(2_105), ms(2_100), "a", lump));
            assert!(w.surge(&c, ms(2_305), ms(2_300), "b", lump));
            w
        };
        let w = two_lumps();
        // 2 000 cost over the 300 ms from 2.0 to 2.3 s: 6 667/s.
        assert!((over_span(&w, 2_310) - 20_000.0 / 3.0).abs() < 1.0);
        // By 2.9 s neither fell: both held on to 2.4 s, 6 000 over 400 ms.
        assert!((over_span(&w, 2_900) - 15_000.0).abs() < 1.0);
        // a's fall came at 2.5 s: 70/s since 2.1 s. By 2.9 s: a 1 028 to
        // 2.5 s, b 2 000 to 2.4 s, 3 028 over 500 ms.
        let mut w = two_lumps();
        assert!(w.surge(&c, ms(2_505), ms(2_500), "a", fall));
        let e = w.estimate(&c, ms(2_900));
        assert_eq!(e.rates.demand, 10_070.0, "{e:?}");
        assert!((e.surge_demand_over_span - 6_056.0).abs() < 1.0, "{e:?}");
        // b's follow-up of 9 000/s at 2.5 s: 2 800 to there, with a's
        // 1 000, 3 800 over 500 ms (the demand 19 000 now).
        let mut w = two_lumps();
        let on = SurgeRates {
            rollup_baseline: Some(0.0),
            ..rates(9_000.0, 10_000.0, true)
        };
        assert!(w.surge(&c, ms(2_505), ms(2_500), "b", on));
        let e = w.estimate(&c, ms(2_510));
        assert_eq!(e.rates.demand, 19_000.0, "{e:?}");
        assert!((e.surge_demand_over_span - 7_600.0).abs() < 1.0, "{e:?}");
        // A peek's lump (20 000/s over 100 ms to 2.1 s), then the close of
        // its sub-window (10 000/s over 200 ms to 2.2 s): the same 2 000
        // measured again, not 3 000. With b's lump: 3 000 over 300 ms.
        let mut w = DemandWindow::new(&c);
        let peeked = SurgeRates {
            ops: 1,
            ..rates(20_000.0, 0.0, false)
        }
        .with_span(Duration::from_millis(100));
        assert!(w.surge(&c, ms(2_105), ms(2_100), "a", peeked));
        let close = SurgeRates {
            ops: 1,
            rollup_baseline: Some(0.0),
            ..rates(10_000.0, 20_000.0, true)
        }
        .with_span(Duration::from_millis(200));
        assert!(w.surge(&c, ms(2_205), ms(2_200), "a", close));
        assert!(w.surge(&c, ms(2_305), ms(2_300), "b", lump));
        assert!((over_span(&w, 2_310) - 10_000.0).abs() < 1.0);
        // Five agents rising, none fallen: a flood's onset, read as it is.
        let mut w = DemandWindow::new(&c);
        for (i, agent) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            let end = 2_100 + 100 * i as u64;
            assert!(w.surge(&c, ms(end + 5), ms(end), agent, lump));
        }
        let e = w.estimate(&c, ms(2_510));
        assert_eq!(e.surge_demand_over_span, e.rates.demand);
    }

    /// An agent whose first report in an estimate was a fall (which
    /// counts nothing) counts its next rise as its first: left uncounted,
    /// that rise stood with no count, which the master takes for not
    /// said, and a single publish to 1 000 suppressed an account at 0.95×
    /// of its limit.
    #[test]
    fn a_rise_after_a_first_report_that_fell_is_counted() {
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        round(&mut w, 2_000, 25);
        let fall = SurgeRates {
            rollup_baseline: Some(25.0),
            ..rates(5.0, 2_550.0, true)
        };
        // Its lump went to an estimate this one replaced: its fall, the
        // first report here, against its rollup.
        assert!(w.surge(&c, ms(2_100), ms(2_100), "a", fall));
        let rise = SurgeRates {
            ops: 1,
            rollup_baseline: Some(25.0),
            ..rates(2_550.0, 5.0, true)
        };
        assert!(w.surge(&c, ms(2_200), ms(2_200), "a", rise));
        let s = w.surge_at(&c, ms(2_210)).expect("standing");
        assert_eq!((s.ops, s.counted), (1, 1));
    }

    /// An agent's fall from a chance lump, reported after the lump's
    /// estimate gave way to a fresh one, is its first report in the fresh
    /// one: taken against its last rollup, it moves nothing. Taken as a
    /// change from the lump the fresh estimate never held, it took the
    /// lump off the rounds, and released a publish-to-1 000 account at 2×
    /// its limit within a second, again and again.
    #[test]
    fn a_fall_from_a_lump_a_replaced_estimate_held_moves_nothing() {
        let demand_after_fall = |rollup_baseline: Option<f32>| {
            let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
            round(&mut w, 2_000, 250);
            // Agent a's chance lump, in the round ending at 2 000: no more
            // than the rounds say.
            assert!(w.surge(&c, ms(2_100), ms(1_900), "a", rates(1_500.0, 250.0, false)));
            assert_eq!(w.estimate(&c, ms(2_110)).rates.demand, 5_000.0);
            // Its fall, in the next round's first sub-window: a fresh
            // estimate.
            let fall = SurgeRates {
                rollup_baseline,
                ..rates(250.0, 1_500.0, true)
            };
            assert!(w.surge(&c, ms(2_300), ms(2_200), "a", fall));
            w.estimate(&c, ms(2_310)).rates.demand
        };
        assert_eq!(demand_after_fall(Some(250.0)), 5_000.0);
        // An agent that predates `rollup_baseline`: taken as before.
        assert_eq!(demand_after_fall(None), 3_750.0);
    }

    /// The operations an estimate's reports counted, and how many reports
    /// said: each agent's first report in the estimate, a follow-up of its
    /// own report of an estimate since lapsed (`surged`) too.
    #[test]
    fn an_estimates_count_is_of_each_agents_first_report_in_it() {
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        let counted = |ops: u32, surged: bool| SurgeRates {
            ops,
            ..rates(2_550.0, 255.0, surged)
        };
        round(&mut w, 2_000, 25);
        // A follow-up of a report the master no longer holds, first in a
        // fresh estimate: counted (it used to stand with no count, which
        // the master takes for proof).
        assert!(w.surge(&c, ms(2_800), ms(2_800), "a", counted(10, true)));
        let e = w.estimate(&c, ms(2_810));
        assert_eq!((e.surge_ops, e.surge_reports), (10, 1), "{e:?}");
        // Another agent's first report adds; a follow-up within the same
        // estimate measures the same operations again and does not.
        assert!(w.surge(&c, ms(2_820), ms(2_800), "a", counted(9, false)));
        assert!(w.surge(&c, ms(2_900), ms(2_900), "a", counted(12, true)));
        let e = w.estimate(&c, ms(2_910));
        assert_eq!((e.surge_ops, e.surge_reports), (19, 2));
        assert_eq!(e.surge_rounds, 500.0);
    }

    /// The count an estimate's reports weigh as is their sum's chance
    /// spread read as a Poisson count's: operations of one cost weigh as
    /// their number; a dozen single publishes of 51 beside a report of 14
    /// operations of 1 weigh as 13, not 26 (`mixed-costs` at 0.95×, seed
    /// 420: 28 operations so counted proved a sum at 2.07× of its limit,
    /// and the account was refused).
    #[test]
    fn an_estimates_count_weighs_its_operations_by_their_rates() {
        let weighed = |reports: &[(f32, u32)]| {
            let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
            for (i, &(rate, ops)) in reports.iter().enumerate() {
                let r = SurgeRates {
                    ops,
                    ..rates(rate, 0.0, false)
                };
                assert!(w.surge(&c, ms(100 + i as u64), ms(100), "a", r));
            }
            let e = w.estimate(&c, ms(150));
            (e.surge_ops, e.surge_reports)
        };
        assert_eq!(
            weighed(&[(5_100.0, 10), (10_200.0, 20), (15_300.0, 30)]),
            (60, 3)
        );
        let mut mixed = vec![(510.0, 1); 12];
        mixed.push((140.0, 14));
        assert_eq!(weighed(&mixed), (13, 13));
    }

    /// While a single agent's report is all an estimate counted, that
    /// agent's later sub-window, counting more, stands for it: a young
    /// pair's first peek of a single node's deluge may count too few.
    #[test]
    fn a_single_reporters_larger_count_stands_for_its_first() {
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        let counted = |ops: u32, surged: bool| SurgeRates {
            ops,
            ..rates(4_750.0, if surged { 4_750.0 } else { 25.0 }, surged)
        };
        round(&mut w, 2_000, 25);
        assert!(w.surge(&c, ms(2_100), ms(2_100), "a", counted(10, false)));
        assert!(w.surge(&c, ms(2_200), ms(2_200), "a", counted(83, true)));
        let e = w.estimate(&c, ms(2_210));
        assert_eq!((e.surge_ops, e.surge_reports), (83, 1));
        // A smaller one does not lower it; once two agents counted, a
        // follow-up adds nothing.
        assert!(w.surge(&c, ms(2_300), ms(2_300), "a", counted(40, true)));
        // (Its rate as 9 such operations make it: counted at 4 750/s, 9
        // would weigh as much less.)
        let another = SurgeRates {
            ops: 9,
            ..rates(515.0, 25.0, false)
        };
        assert!(w.surge(&c, ms(2_310), ms(2_300), "a", another));
        assert!(w.surge(&c, ms(2_400), ms(2_400), "a", counted(200, true)));
        let e = w.estimate(&c, ms(2_410));
        assert_eq!((e.surge_ops, e.surge_reports), (92, 2));
    }

    /// And that agent's later sub-window that reads higher stands for it,
    /// whatever it counted: the estimate's rate is that sub-window's now.
    /// An account of cheap operations and rare publishes to 1 000
    /// subscribers on one node: its young pair's first peek counted 146
    /// cheap operations at 730/s, its next sub-window one publish among
    /// 279 cheap ones, 6 400/s, weighing as 2 operations; kept beside that
    /// rate, the 146 proved 2.1× its limit beyond chance, and the account,
    /// at 0.95× of it, was refused.
    #[test]
    fn a_single_agents_higher_sub_window_stands_with_its_own_count() {
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        let first = SurgeRates {
            ops: 146,
            ..rates(730.0, 0.0, false)
        };
        assert!(w.surge(&c, ms(100), ms(100), "a", first));
        let higher = SurgeRates {
            ops: 2,
            ..rates(6_400.0, 730.0, true)
        };
        assert!(w.surge(&c, ms(200), ms(200), "a", higher));
        let e = w.estimate(&c, ms(210));
        assert_eq!(e.rates.demand, 6_400.0);
        assert_eq!((e.surge_ops, e.surge_reports), (2, 1));
    }

    #[test]
    fn traffic_that_only_moves_is_not_a_surge() {
        // 0.8× a 1 000/s limit over 20 agents moves onto 2 of them; the 18
        // it left are too small to report their drop.
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        round(&mut w, 2_000, 40);
        for _ in 0..2 {
            w.surge(&c, ms(2_800), ms(2_800), "a", rates(400.0, 40.0, false));
        }
        let demand = w.estimate(&c, ms(2_810)).rates.demand;
        assert!(demand <= 800.0, "{demand}");
    }

    /// `agents` of the 20 report, at 2 600 ms, a drop from 500/s to 25/s.
    fn drops(w: &mut DemandWindow, agents: usize) {
        for _ in 0..agents {
            w.surge(&cfg(), ms(2_600), ms(2_600), "a", rates(25.0, 500.0, false));
        }
    }

    /// A window whose 20 agents at 500/s each all reported, at 2 600 ms,
    /// their drop to 25/s: released within the round.
    fn released_by_drops() -> (WindowConfig, DemandWindow) {
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        round(&mut w, 2_000, 500);
        drops(&mut w, 20);
        assert_eq!(w.estimate(&c, ms(2_610)).rates.demand, 500.0);
        (c, w)
    }

    #[test]
    fn reported_drops_release_within_the_round() {
        let (c, mut w) = released_by_drops();
        // A late early report, for a round already reported, is refused.
        round(&mut w, 4_000, 25);
        assert!(!w.surge(&c, ms(4_100), ms(1_900), "a", rates(9.0, 1.0, false)));
    }

    #[test]
    fn after_a_drop_rounds_that_say_less_win() {
        // Half the agents report the flood's end early; the round that
        // holds the end shows all of it before the surge estimate lapses.
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        round(&mut w, 2_000, 500);
        drops(&mut w, 10);
        assert_eq!(w.estimate(&c, ms(2_610)).rates.demand, 5_250.0);
        round(&mut w, 4_000, 25);
        // The surge estimate still stands, and says what the round says:
        // the estimate is the round's, tested for chance as any.
        let e = w.estimate(&c, ms(4_400));
        assert!(!e.surge);
        assert_eq!(e.rates.demand, 500.0);
    }

    /// A flood every agent reported the end of is released; the round
    /// that holds its end reads high once whole. An early report of the
    /// next round (one agent's small rise) before that round is whole
    /// must not start afresh from that round, re-suppressing the account
    /// at the flood's level: the reported drop stands until the rounds
    /// show it.
    #[test]
    fn a_reported_drop_stands_when_the_next_round_reports_early() {
        let (c, mut w) = released_by_drops();
        // The round to 4 000 held the flood until 2 600.
        round(&mut w, 4_000, 300);
        assert_eq!(w.estimate(&c, ms(4_300)).rates.demand, 500.0);
        assert!(w.surge(&c, ms(4_300), ms(4_200), "a", rates(40.0, 25.0, true)));
        let demand = w.estimate(&c, ms(4_310)).rates.demand;
        assert!(demand <= 600.0, "{demand}");
    }

    #[test]
    fn the_surge_lapses_when_no_round_comes() {
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        w.surge(&c, ms(2_800), ms(2_800), "a", rates(5_000.0, 0.0, false));
        assert_eq!(w.estimate(&c, ms(2_810)).rates.demand, 5_000.0);
        assert!(w.estimate(&c, ms(9_000)).rates.demand == 0.0);
    }

    #[test]
    fn agents_that_move_here_add_their_rates_in_full() {
        // Two of four agents report a 4 000/s account here; the other two
        // reported it to another master during a partition, and come back.
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        for _ in 0..2 {
            w.record(&c, ms(0), ms(2_000), 4_000, 4_000);
        }
        assert_eq!(w.estimate(&c, ms(2_400)).rates.demand, 4_000.0);
        for _ in 0..2 {
            assert!(w.surge(&c, ms(2_600), ms(2_600), "a", join(2_000.0)));
        }
        let e = w.estimate(&c, ms(2_610));
        assert!(e.surge);
        assert_eq!(e.rates.demand, 8_000.0);
        // The same reports as a jump from nothing (as a master that
        // predates joins reads them) prove only their own rates.
        let mut old = DemandWindow::new(&c);
        for _ in 0..2 {
            old.record(&c, ms(0), ms(2_000), 4_000, 4_000);
        }
        for _ in 0..2 {
            old.surge(&c, ms(2_600), ms(2_600), "a", rates(2_000.0, 0.0, false));
        }
        assert_eq!(old.estimate(&c, ms(2_610)).rates.demand, 4_000.0);
        // The round the move happened in, with all four, confirms it, and
        // the next whole round speaks.
        for _ in 0..4 {
            w.record(&c, ms(2_000), ms(4_000), 4_000, 4_000);
        }
        assert_eq!(w.estimate(&c, ms(4_400)).rates.demand, 8_000.0);
        for _ in 0..4 {
            w.record(&c, ms(4_000), ms(6_000), 4_000, 4_000);
        }
        let e = w.estimate(&c, ms(6_400));
        assert!(!e.surge);
        assert_eq!(e.rates.demand, 8_000.0);
    }

    #[test]
    fn a_join_adds_to_what_a_jump_proves() {
        // 20 agents at 25/s; one jumps to 1 025/s (proving 1 025/s of the
        // account), and one agent moves here with 500/s.
        let (c, mut w) = (cfg(), DemandWindow::new(&cfg()));
        round(&mut w, 2_000, 25);
        w.surge(&c, ms(2_600), ms(2_600), "a", join(500.0));
        w.surge(&c, ms(2_600), ms(2_600), "a", rates(1_025.0, 25.0, false));
        assert_eq!(w.estimate(&c, ms(2_610)).rates.demand, 1_525.0);
    }
}
