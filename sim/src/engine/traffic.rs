//! Traffic: each step, every item's operations (a Poisson or uniform
//! count) are spread over its agents and decided by
//! [`AgentState::check_batch`](damper_core::agent::AgentState::check_batch),
//! the same decision as `check`; each simulated second is recorded.

use damper_core::time::Nanos;
use rand::RngExt;
use rand_distr::{Distribution, Poisson};

use super::{Agent, EPOCH, Event, Masters, Second, Sim};
use crate::scenario::{Arrivals, Traffic};

/// One traffic item in progress.
pub(super) struct Item {
    pub(super) traffic: Traffic,
    pub(super) limit: Option<f64>,
    /// Fraction of an operation carried to the next step (uniform arrivals).
    pub(super) carry: f64,
    /// Which agent gets the next remainder (uniform arrivals).
    pub(super) rotate: usize,
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
                Arrivals::Poisson if mean > 0.0 => {
                    Poisson::new(mean).map_or(0.0, |p| p.sample(&mut self.rng)) as u64
                }
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
                    self.batches.push(Batch {
                        agent: item.traffic.agents[j],
                        item: i,
                        count,
                    });
                }
            }
        }
        self.decide_batches();
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
        for item in &mut self.items {
            let mut sum = 0.0;
            let mut max: f64 = 0.0;
            for &a in &item.traffic.agents {
                let f = self.agents[a]
                    .state
                    .factor(self.now, &item.traffic.account, &item.traffic.op)
                    .unwrap_or(0.0);
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
    }
}

impl<M: Masters> Sim<M> {
    /// Decides the step's batches. An item alone on its (account, op) and
    /// agent is decided in one `check_batch`; several items of one
    /// (account, op) on one agent are publishers sharing the account, and
    /// their operations are interleaved one by one as they would arrive:
    /// strictly in turn when all are uniform, in a random order otherwise.
    fn decide_batches(&mut self) {
        let mut batches = std::mem::take(&mut self.batches);
        let items = &self.items;
        batches.sort_by(|a, b| {
            let (ta, tb) = (&items[a.item].traffic, &items[b.item].traffic);
            (a.agent, &ta.account, &ta.op, a.item).cmp(&(b.agent, &tb.account, &tb.op, b.item))
        });
        let mut rest = &batches[..];
        while let Some(first) = rest.first() {
            let t = &self.items[first.item].traffic;
            let n = rest
                .iter()
                .take_while(|b| {
                    let u = &self.items[b.item].traffic;
                    b.agent == first.agent && u.account == t.account && u.op == t.op
                })
                .count();
            let (group, tail) = rest.split_at(n);
            if let [one] = group {
                self.decide_alone(*one);
            } else {
                self.decide_interleaved(group);
            }
            rest = tail;
        }
        batches.clear();
        self.batches = batches;
    }

    fn decide_alone(&mut self, batch: Batch) {
        let item = &mut self.items[batch.item];
        let cost = item.traffic.cost;
        let admitted = self.agents[batch.agent].state.check_batch(
            self.now,
            &item.traffic.account,
            &item.traffic.op,
            cost,
            batch.count,
            &mut self.rng,
        );
        item.attempted += batch.count * cost;
        item.admitted += admitted * cost;
    }

    fn decide_interleaved(&mut self, group: &[Batch]) {
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
            self.decide_alone(Batch {
                count: 1,
                ..group[k]
            });
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
