//! Traffic: each step, every item's operations (a Poisson or uniform
//! count) are spread over its agents and decided by
//! [`AgentState::check_batch`](damper_core::agent::AgentState::check_batch),
//! the same decision as `check`; each simulated second is recorded.

use damper_core::agent::{Hold, Publisher};
use damper_core::time::Nanos;
use rand::RngExt;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Poisson};

use super::{Agent, EPOCH, Event, Masters, Second, Sim};
use crate::scenario::{Arrivals, Traffic};

/// One traffic item in progress.
pub(super) struct Item {
    pub(super) traffic: Traffic,
    /// The rank of its (account, op) among the scenario's distinct pairs,
    /// in (account, op) order: batches are grouped and ordered by it, as
    /// by the names, without comparing strings each step.
    pub(super) pair: u32,
    /// Who it is to its agents, when its (account, op) has other items:
    /// publishers sharing an account, each decided on its own lane.
    pub(super) publisher: Option<Publisher>,
    pub(super) limit: Option<f64>,
    /// Fraction of an operation carried to the next step (uniform arrivals).
    pub(super) carry: f64,
    /// Which agent gets the next remainder (uniform arrivals).
    pub(super) rotate: usize,
    /// The Poisson law of the last step's mean, kept while the rate holds
    /// (making one costs an `exp`, a step's draws a few multiplications).
    pub(super) arrivals: Option<(f64, Poisson<f64>)>,
    pub(super) attempted: u64,
    pub(super) admitted: u64,
    /// Whether any of its agents applies a positive factor.
    pub(super) positive: bool,
    pub(super) seconds: Vec<Second>,
    pub(super) changes: Vec<(f64, bool)>,
}

/// One item's operations on one agent in one step.
#[derive(Clone, Copy)]
pub(super) struct Batch {
    agent: usize,
    item: usize,
    count: u64,
    /// Its place in [`Slots`]' order, where its pair's hint is.
    pos: u32,
}

/// Where each (item, agent of the item) stands in the order its batches
/// are decided in: by agent, then (account, op), then item. The order is
/// fixed for a run, so a step files its counts by position instead of
/// sorting them.
pub(super) struct Slots {
    /// Every (item, agent) in decision order, its count 0 between steps.
    order: Vec<Batch>,
    /// For each, where its pair was in the agent's table last (see
    /// `Hold::check_batch_at`): each step and each second's factor
    /// read go to the slot directly, not through the hash and the index.
    near: Vec<u32>,
    /// Item `i`'s agent `j` is at `order[at[first[i] + j]]`.
    at: Vec<u32>,
    first: Vec<usize>,
}

impl Slots {
    pub(super) fn new(items: &[Item]) -> Slots {
        let mut keyed = Vec::new();
        let mut first = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            first.push(keyed.len());
            for (j, &agent) in item.traffic.agents.iter().enumerate() {
                keyed.push(((agent, item.pair, i, j), keyed.len()));
            }
        }
        keyed.sort_unstable();
        let mut at = vec![0; keyed.len()];
        let order: Vec<Batch> = keyed
            .iter()
            .enumerate()
            .map(|(pos, &((agent, _, item, _), flat))| {
                let pos = u32::try_from(pos).expect("fewer than 2^32 (item, agent)s");
                at[flat] = pos;
                Batch {
                    agent,
                    item,
                    count: 0,
                    pos,
                }
            })
            .collect();
        let near = vec![0; order.len()];
        Slots {
            order,
            near,
            at,
            first,
        }
    }

    fn file(&mut self, item: usize, j: usize, count: u64) {
        let pos = self.at[self.first[item] + j] as usize;
        self.order[pos].count = count;
    }

    /// Every (item, agent of the item)'s factor in force at `now` (0 when
    /// none), read in decision order into `into`; item `i`'s, in the order
    /// of its agents, are [`of_item`](Self::of_item).
    fn factors(&mut self, agents: &[Agent], items: &[Item], now: Nanos, into: &mut Vec<f64>) {
        into.clear();
        let mut held: Option<(usize, Hold<'_>)> = None;
        for (slot, near) in self.order.iter().zip(&mut self.near) {
            let hold = match held {
                Some((agent, ref hold)) if agent == slot.agent => hold,
                _ => &held.insert((slot.agent, agents[slot.agent].state.hold())).1,
            };
            let traffic = &items[slot.item].traffic;
            into.push(
                hold.factor_at(now, &traffic.account, &traffic.op, near)
                    .unwrap_or(0.0),
            );
        }
    }

    /// Item `i`'s factors among those [`factors`](Self::factors) read, in
    /// the order of its agents.
    fn of_item<'f>(&'f self, factors: &'f [f64], i: usize) -> impl Iterator<Item = f64> + 'f {
        let end = self.first.get(i + 1).copied().unwrap_or(self.at.len());
        self.at[self.first[i]..end]
            .iter()
            .map(|&pos| factors[pos as usize])
    }

    /// The step's batches in decision order, each slot emptied.
    fn take(&mut self, into: &mut Vec<Batch>) {
        for slot in &mut self.order {
            if slot.count != 0 {
                into.push(*slot);
                slot.count = 0;
            }
        }
    }
}

impl<M: Masters> Sim<M> {
    /// One traffic step: every item's operations, decided by its agents.
    pub(super) fn step(&mut self) {
        let dt = self.scenario.step.as_secs_f64();
        let t = self.now.since(EPOCH).as_secs_f64();
        for i in 0..self.items.len() {
            let item = &mut self.items[i];
            let mean = item.traffic.rate_at(t) * dt;
            let n = match item.traffic.arrivals {
                Arrivals::Uniform => {
                    item.carry += mean;
                    let n = item.carry.floor();
                    item.carry -= n;
                    n as u64
                }
                Arrivals::Poisson if mean > 0.0 => match &item.arrivals {
                    Some((kept, law)) if *kept == mean => law.sample(&mut self.rng) as u64,
                    _ => match Poisson::new(mean) {
                        Ok(law) => {
                            item.arrivals = Some((mean, law));
                            law.sample(&mut self.rng) as u64
                        }
                        Err(_) => 0,
                    },
                },
                Arrivals::Poisson => 0,
            };
            if n == 0 {
                continue;
            }
            let k = item.traffic.agents.len();
            self.scratch.clear();
            self.scratch.resize(k, n / k as u64);
            let rest = (n % k as u64) as usize;
            match item.traffic.arrivals {
                // Evenly, the remainder to the next agents in turn.
                Arrivals::Uniform => {
                    for j in 0..rest {
                        self.scratch[(item.rotate + j) % k] += 1;
                    }
                    item.rotate = (item.rotate + rest) % k;
                }
                // The remainder to agents at random.
                Arrivals::Poisson => {
                    for _ in 0..rest {
                        let j = self.rng.random_range(0..k);
                        self.scratch[j] += 1;
                    }
                }
            }
            for (j, &count) in self.scratch.iter().enumerate() {
                if count != 0 {
                    self.slots.file(i, j, count);
                }
            }
        }
        self.decide_batches();
        self.wake_young();
        // Items being suppressed: note, at step resolution, when the last
        // agent lets go.
        for item in self.items.iter_mut().filter(|i| i.positive) {
            if max_factor(&self.agents, item, self.now) == 0.0 {
                item.positive = false;
                item.changes
                    .push((self.now.since(EPOCH).as_secs_f64(), false));
            }
        }
        let next = self.now + self.scenario.step;
        self.schedule(next, Event::Step);
    }

    /// Closes one simulated second for every item.
    pub(super) fn second(&mut self) {
        let t = self.now.since(EPOCH).as_secs_f64();
        // Agent by agent, in the order the steps decide in: item by item,
        // each lookup would land in another agent's table (a fleet's are
        // far larger than the caches).
        let mut factors = std::mem::take(&mut self.factors);
        self.slots
            .factors(&self.agents, &self.items, self.now, &mut factors);
        for (i, item) in self.items.iter_mut().enumerate() {
            let mut sum = 0.0;
            let mut max: f64 = 0.0;
            for f in self.slots.of_item(&factors, i) {
                sum += f;
                max = max.max(f);
            }
            item.seconds.push(Second {
                attempted: item.attempted,
                admitted: item.admitted,
                factor: sum / item.traffic.agents.len() as f64,
            });
            item.attempted = 0;
            item.admitted = 0;
            if !item.positive && max > 0.0 {
                item.positive = true;
                item.changes.push((t, true));
            }
        }
        self.factors = factors;
    }
}

impl<M: Masters> Sim<M> {
    /// Decides the step's batches, in the order of [`Slots`], under one
    /// hold on each agent's table for all of its batches (`Hold`).
    fn decide_batches(&mut self) {
        let mut batches = std::mem::take(&mut self.batches);
        self.slots.take(&mut batches);
        let mut decider = Decider {
            now: self.now,
            items: &mut self.items,
            rng: &mut self.rng,
            near: &mut self.slots.near,
        };
        let mut rest = &batches[..];
        while let Some(first) = rest.first() {
            let n = rest.iter().take_while(|b| b.agent == first.agent).count();
            let (run, tail) = rest.split_at(n);
            decider.decide_run(&self.agents[first.agent].state.hold(), run);
            rest = tail;
        }
        batches.clear();
        self.batches = batches;
    }
}

/// What deciding a step's batches changes: the items' counts, the draws,
/// the pairs' places.
struct Decider<'s> {
    now: Nanos,
    items: &'s mut [Item],
    rng: &'s mut SmallRng,
    near: &'s mut [u32],
}

impl Decider<'_> {
    /// One agent's batches. An item alone on its (account, op) on the agent
    /// is decided in one `check_batch`; several items of one (account, op)
    /// are publishers sharing the account, and their operations are
    /// interleaved one by one as they would arrive: strictly in turn when
    /// all are uniform, in a random order otherwise.
    fn decide_run(&mut self, hold: &Hold<'_>, run: &[Batch]) {
        let mut rest = run;
        while let Some(first) = rest.first() {
            let pair = self.items[first.item].pair;
            let n = rest
                .iter()
                .take_while(|b| self.items[b.item].pair == pair)
                .count();
            let (group, tail) = rest.split_at(n);
            if let [one] = group {
                self.decide_alone(hold, *one);
            } else {
                self.decide_interleaved(hold, group);
            }
            rest = tail;
        }
    }

    fn decide_alone(&mut self, hold: &Hold<'_>, batch: Batch) {
        let item = &mut self.items[batch.item];
        let cost = item.traffic.cost;
        let (account, op) = (&item.traffic.account, &item.traffic.op);
        let near = &mut self.near[batch.pos as usize];
        let admitted = match item.publisher {
            None => hold.check_batch_at(self.now, account, op, cost, batch.count, self.rng, near),
            Some(publisher) => hold.check_batch_from_at(
                self.now,
                account,
                op,
                cost,
                batch.count,
                publisher,
                self.rng,
                near,
            ),
        };
        item.attempted += batch.count * cost;
        item.admitted += admitted * cost;
    }

    fn decide_interleaved(&mut self, hold: &Hold<'_>, group: &[Batch]) {
        let mut left: Vec<u64> = group.iter().map(|b| b.count).collect();
        let mut total: u64 = left.iter().sum();
        let in_turn = group
            .iter()
            .all(|b| self.items[b.item].traffic.arrivals == Arrivals::Uniform);
        let mut turn = 0;
        while total > 0 {
            let k = if in_turn {
                loop {
                    let k = turn % left.len();
                    turn += 1;
                    if left[k] > 0 {
                        break k;
                    }
                }
            } else {
                let mut pick = self.rng.random_range(0..total);
                left.iter()
                    .position(|&l| {
                        let here = pick < l;
                        pick = pick.saturating_sub(l);
                        here
                    })
                    .expect("pick < total")
            };
            left[k] -= 1;
            total -= 1;
            self.decide_alone(
                hold,
                Batch {
                    count: 1,
                    ..group[k]
                },
            );
        }
    }
}

fn max_factor(agents: &[Agent], item: &Item, now: Nanos) -> f64 {
    item.traffic
        .agents
        .iter()
        .map(|&a| {
            agents[a]
                .state
                .factor(now, &item.traffic.account, &item.traffic.op)
                .unwrap_or(0.0)
        })
        .fold(0.0, f64::max)
}

/// Each item's [`Item::pair`]: the rank of its (account, op) among the
/// distinct pairs of `traffic`, sorted by account then op.
pub(super) fn pair_ranks(traffic: &[Traffic]) -> Vec<u32> {
    let mut pairs: Vec<(&str, &str)> = traffic
        .iter()
        .map(|t| (t.account.as_str(), t.op.as_str()))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    traffic
        .iter()
        .map(|t| {
            let rank = pairs
                .binary_search(&(t.account.as_str(), t.op.as_str()))
                .expect("every item's pair is listed");
            u32::try_from(rank).expect("fewer than 2^32 pairs")
        })
        .collect()
}
