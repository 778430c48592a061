//! The simulation: the core's agent and master state machines, driven in
//! virtual time by a queue of timed events.
//!
//! - Traffic is generated in steps: each step, every traffic item's
//!   operations (a Poisson or uniform count) are spread over its agents and
//!   decided by [`AgentState::check_batch`], the same decision as `check`.
//! - Every rollup interval all agents cut their counts on the shared grid
//!   ([`AgentState::drain_by_owner`]) and send them after their spread
//!   ([`send_spread`]), with network delay, jitter and loss, to the owning
//!   [`MasterState`] on the [`Ring`]; replies come back the same way and are
//!   applied. A lost request or reply, a dead master or a partition shows as
//!   a timeout, and the counts are carried over ([`AgentState::carry_over`]),
//!   exactly as the agent library does.
//! - Scenario events kill and restart masters and partition agents.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use damper_core::agent::{AgentConfig, AgentState, Pending, send_spread};
use damper_core::master::{MasterState, Report};
use damper_core::membership::{HealthConfig, Membership};
use damper_core::time::Nanos;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Poisson};

use crate::scenario::{Action, Arrivals, Scenario, Traffic};

/// The start of simulated time: a multiple of every interval.
pub const EPOCH: Nanos = Nanos::from_secs(1_800_000_000);

/// How long counts that cannot be delivered are carried (as the agent's
/// default).
const MAX_CARRY: Duration = Duration::from_secs(30);

/// One simulated second of one traffic item.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Second {
    /// Cost attempted.
    pub attempted: u64,
    /// Cost admitted.
    pub admitted: u64,
    /// The master's factor in force at the end of the second, averaged over
    /// the item's agents.
    pub factor: f64,
}

/// Everything recorded for one traffic item.
#[derive(Clone, Debug)]
pub struct Series {
    /// The item.
    pub traffic: Traffic,
    /// Its limit, if any.
    pub limit: Option<f64>,
    /// Per simulated second.
    pub seconds: Vec<Second>,
    /// When the largest factor any of its agents applies turned positive
    /// (`true`) or back to zero (`false`), in seconds, at step resolution.
    pub factor_changes: Vec<(f64, bool)>,
}

/// The outcome of a run.
#[derive(Clone, Debug)]
pub struct Run {
    /// Scenario name.
    pub scenario: String,
    /// Policy name.
    pub policy: String,
    /// Estimator name.
    pub estimator: String,
    /// Per traffic item.
    pub series: Vec<Series>,
    /// Rollups sent, and how many failed.
    pub rollups: (u64, u64),
    /// Cost dropped for being carried too long.
    pub dropped_cost: u64,
}

enum Event {
    Step,
    Second,
    Cut,
    Send {
        agent: usize,
        master: usize,
        start: Nanos,
        end: Nanos,
        pending: Vec<Pending>,
    },
    Arrive {
        agent: usize,
        master: usize,
        sent: Nanos,
        start: Nanos,
        end: Nanos,
        pending: Vec<Pending>,
    },
    Reply {
        agent: usize,
        master: usize,
        factors: Vec<Factor>,
        recheck: Option<(Duration, Vec<(String, String)>)>,
    },
    Query {
        agent: usize,
        master: usize,
        keys: Vec<(String, String)>,
    },
    QueryArrive {
        agent: usize,
        master: usize,
        keys: Vec<(String, String)>,
    },
    Fail {
        agent: usize,
        master: usize,
        start: Nanos,
        end: Nanos,
        pending: Vec<Pending>,
    },
    Scenario(Action),
    Probe {
        agent: usize,
        master: usize,
    },
    Health {
        agent: usize,
        master: usize,
        /// The master's start time, when it answered.
        up: Option<Nanos>,
    },
}

/// (account, op, factor, limit, valid for), as a reply carries them.
type Factor = (String, String, f64, f64, Duration);

struct Agent {
    state: AgentState,
    /// Which masters this agent routes to: the agent library's logic.
    membership: Membership,
    spread: Duration,
    partitioned: bool,
}

struct Item {
    traffic: Traffic,
    limit: Option<f64>,
    carry: f64,
    rotate: usize,
    attempted: u64,
    admitted: u64,
    positive: bool,
    seconds: Vec<Second>,
    changes: Vec<(f64, bool)>,
}

/// A simulation in progress.
pub struct Sim {
    scenario: Scenario,
    now: Nanos,
    seq: u64,
    queue: BinaryHeap<Reverse<(Nanos, u64, usize)>>,
    events: Vec<Option<Event>>,
    free: Vec<usize>,
    masters: Vec<Option<MasterState>>,
    /// When each master (last) started.
    started: Vec<Nanos>,
    names: Vec<String>,
    agents: Vec<Agent>,
    items: Vec<Item>,
    rng: SmallRng,
    scratch: Vec<u64>,
    timeout: Duration,
    rollups: (u64, u64),
    dropped: u64,
}

impl Sim {
    /// A simulation of `scenario`, ready to run.
    pub fn new(scenario: Scenario) -> Sim {
        let c = &scenario.cluster;
        let interval = Duration::from_millis(c.rollup_interval_ms);
        let names: Vec<String> = (0..c.masters).map(|m| format!("m{m}")).collect();
        let agents = (0..c.agents)
            .map(|a| Agent {
                membership: Membership::new(&names, HealthConfig::default(), u64::from(a)),
                state: AgentState::new(AgentConfig {
                    rollup_interval: interval,
                    ..AgentConfig::default()
                }),
                spread: send_spread(&format!("agent-{a}"), interval),
                partitioned: false,
            })
            .collect();
        let items = scenario
            .traffic
            .iter()
            .map(|t| Item {
                limit: scenario
                    .master
                    .limits
                    .lookup(&t.account, &t.op)
                    .map(|m| m.rate.get()),
                traffic: t.clone(),
                carry: 0.0,
                rotate: 0,
                attempted: 0,
                admitted: 0,
                positive: false,
                seconds: Vec::with_capacity(scenario.duration_s as usize),
                changes: Vec::new(),
            })
            .collect();
        let mut sim = Sim {
            masters: names
                .iter()
                .map(|_| Some(MasterState::new(scenario.master.clone())))
                .collect(),
            started: names
                .iter()
                .map(|_| EPOCH - Duration::from_secs(3600))
                .collect(),
            names,
            agents,
            items,
            rng: SmallRng::seed_from_u64(scenario.seed),
            now: EPOCH,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            free: Vec::new(),
            scratch: Vec::new(),
            timeout: (interval / 2).min(Duration::from_secs(1)),
            rollups: (0, 0),
            dropped: 0,
            scenario,
        };
        sim.schedule(EPOCH, Event::Step);
        sim.schedule(EPOCH + Duration::from_secs(1), Event::Second);
        sim.schedule(EPOCH + interval, Event::Cut);
        for (at, action) in sim.scenario.events.clone() {
            sim.schedule(EPOCH + Duration::from_secs_f64(at), Event::Scenario(action));
        }
        sim
    }

    fn schedule(&mut self, at: Nanos, event: Event) {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.events[slot] = Some(event);
                slot
            }
            None => {
                self.events.push(Some(event));
                self.events.len() - 1
            }
        };
        self.queue.push(Reverse((at, self.seq, slot)));
        self.seq += 1;
    }

    fn delay(&mut self) -> Duration {
        let c = &self.scenario.cluster;
        let jitter = if c.jitter_ms > 0.0 {
            self.rng.random_range(-c.jitter_ms..=c.jitter_ms)
        } else {
            0.0
        };
        Duration::from_secs_f64(((c.latency_ms + jitter).max(0.0)) / 1e3)
    }

    fn lost(&mut self) -> bool {
        let loss = self.scenario.cluster.loss;
        loss > 0.0 && self.rng.random_bool(loss)
    }

    /// Runs to the end, calling `progress` with each simulated second.
    pub fn run(mut self, mut progress: impl FnMut(u64)) -> Run {
        let end = EPOCH + Duration::from_secs(self.scenario.duration_s);
        while let Some(Reverse((at, _, slot))) = self.queue.pop() {
            if at > end {
                break;
            }
            self.now = at;
            let event = self.events[slot].take().expect("scheduled once");
            self.free.push(slot);
            match event {
                Event::Step => self.step(),
                Event::Second => {
                    let second = self.now.since(EPOCH).as_secs();
                    self.second();
                    progress(second);
                    if second < self.scenario.duration_s {
                        self.schedule(self.now + Duration::from_secs(1), Event::Second);
                    }
                }
                Event::Cut => self.cut(),
                Event::Send {
                    agent,
                    master,
                    start,
                    end,
                    pending,
                } => self.send(agent, master, start, end, pending),
                Event::Arrive {
                    agent,
                    master,
                    sent,
                    start,
                    end,
                    pending,
                } => self.arrive(agent, master, sent, start, end, pending),
                Event::Reply {
                    agent,
                    master,
                    factors,
                    recheck,
                } => {
                    // Query replies (recheck: None) also show the master is up.
                    self.agents[agent]
                        .membership
                        .succeeded(&self.names[master], self.now);
                    if let Some((after, keys)) = recheck {
                        // As the agent does: ask again, for the marked pairs.
                        self.schedule(
                            self.now + after,
                            Event::Query {
                                agent,
                                master,
                                keys,
                            },
                        );
                    }
                    self.apply(agent, factors);
                }
                Event::Query {
                    agent,
                    master,
                    keys,
                } => {
                    let unreachable =
                        self.agents[agent].partitioned || self.masters[master].is_none();
                    if !unreachable && !self.lost() {
                        let at = self.now + self.delay();
                        self.schedule(
                            at,
                            Event::QueryArrive {
                                agent,
                                master,
                                keys,
                            },
                        );
                    }
                }
                Event::QueryArrive {
                    agent,
                    master,
                    keys,
                } => {
                    if let Some(state) = self.masters[master].as_ref() {
                        let factors: Vec<Factor> = keys
                            .into_iter()
                            .filter_map(|(account, op)| {
                                let v = state.verdict(self.now, &account, &op)?;
                                Some((account, op, v.factor, v.limit.get(), v.valid_for))
                            })
                            .collect();
                        if !self.lost() {
                            let at = self.now + self.delay();
                            self.schedule(
                                at,
                                Event::Reply {
                                    agent,
                                    master,
                                    factors,
                                    recheck: None,
                                },
                            );
                        }
                    }
                }
                Event::Fail {
                    agent,
                    master,
                    start,
                    end,
                    pending,
                } => {
                    self.rollups.1 += 1;
                    self.agents[agent]
                        .membership
                        .failed(&self.names[master], self.now);
                    for p in pending {
                        self.dropped += self.agents[agent]
                            .state
                            .carry_over(p, start, end, MAX_CARRY);
                    }
                }
                Event::Scenario(action) => self.act(action),
                Event::Probe { agent, master } => {
                    let reachable =
                        !self.agents[agent].partitioned && self.masters[master].is_some();
                    if reachable && !self.lost() && !self.lost() {
                        let at = self.now + self.delay() + self.delay();
                        let up = Some(self.started[master]);
                        self.schedule(at, Event::Health { agent, master, up });
                    } else {
                        let at = self.now + self.timeout;
                        self.schedule(
                            at,
                            Event::Health {
                                agent,
                                master,
                                up: None,
                            },
                        );
                    }
                }
                Event::Health { agent, master, up } => {
                    let name = &self.names[master];
                    let membership = &mut self.agents[agent].membership;
                    match up {
                        Some(started) => membership.answered(name, Some(started), self.now),
                        None => membership.failed(name, self.now),
                    };
                }
            }
        }
        Run {
            scenario: self.scenario.name.clone(),
            policy: self.scenario.policy_name().to_string(),
            estimator: match self.scenario.master.window.estimator {
                damper_core::config::EstimatorKind::LatestRound => "latest-round".into(),
                damper_core::config::EstimatorKind::AblyMma => "ably-mma".into(),
            },
            series: self
                .items
                .into_iter()
                .map(|i| Series {
                    traffic: i.traffic,
                    limit: i.limit,
                    seconds: i.seconds,
                    factor_changes: i.changes,
                })
                .collect(),
            rollups: self.rollups,
            dropped_cost: self.dropped,
        }
    }

    /// One traffic step: every item's operations, decided by its agents.
    fn step(&mut self) {
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
            let cost = item.traffic.cost;
            for (j, &count) in self.scratch.iter().enumerate() {
                if count == 0 {
                    continue;
                }
                let agent = &self.agents[item.traffic.agents[j]];
                let admitted = agent.state.check_batch(
                    self.now,
                    &item.traffic.account,
                    &item.traffic.op,
                    cost,
                    count,
                    &mut self.rng,
                );
                item.attempted += count * cost;
                item.admitted += admitted * cost;
            }
        }
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
    fn second(&mut self) {
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

    /// Every agent cuts its interval and schedules its sends.
    fn cut(&mut self) {
        let interval = Duration::from_millis(self.scenario.cluster.rollup_interval_ms);
        let end = self.now;
        let start = end - interval;
        for a in 0..self.agents.len() {
            self.agents[a].membership.tick(end);
            for name in self.agents[a].membership.probes_due(end) {
                let master = self.names.iter().position(|n| *n == name).expect("member");
                self.schedule(end, Event::Probe { agent: a, master });
            }
            let routed = self.agents[a]
                .state
                .drain_by_owner(self.agents[a].membership.live());
            for p in routed.unroutable {
                // Every master down: keep the counts for when one is back.
                self.dropped += self.agents[a].state.carry_over(p, start, end, MAX_CARRY);
            }
            self.agents[a].state.forget_idle(end);
            let spread = self.agents[a].spread;
            for (name, pending) in routed.by_master {
                let master = self
                    .names
                    .iter()
                    .position(|n| *n == name)
                    .expect("ring member");
                self.schedule(
                    end + spread,
                    Event::Send {
                        agent: a,
                        master,
                        start,
                        end,
                        pending,
                    },
                );
            }
        }
        self.schedule(end + interval, Event::Cut);
    }

    fn send(
        &mut self,
        agent: usize,
        master: usize,
        start: Nanos,
        end: Nanos,
        pending: Vec<Pending>,
    ) {
        self.rollups.0 += 1;
        let unreachable = self.agents[agent].partitioned || self.masters[master].is_none();
        if unreachable || self.lost() {
            let at = self.now + self.timeout;
            self.fail_at(at, agent, master, start, end, pending);
            return;
        }
        let at = self.now + self.delay();
        let sent = self.now;
        self.schedule(
            at,
            Event::Arrive {
                agent,
                master,
                sent,
                start,
                end,
                pending,
            },
        );
    }

    fn arrive(
        &mut self,
        agent: usize,
        master: usize,
        sent: Nanos,
        start: Nanos,
        end: Nanos,
        pending: Vec<Pending>,
    ) {
        let now = self.now;
        let Some(state) = self.masters[master].as_mut() else {
            // Died while the request was on its way.
            self.fail_at(sent + self.timeout, agent, master, start, end, pending);
            return;
        };
        let mut factors = Vec::new();
        let mut recheck_at: Option<Nanos> = None;
        let mut marked = Vec::new();
        for p in &pending {
            let report = Report {
                account: &p.account,
                op: &p.op,
                start: p.delta.since.unwrap_or(start),
                end,
                attempted: p.delta.attempted,
                admitted: p.delta.admitted,
            };
            if let Ok(Some(v)) = state.ingest(now, &report) {
                if v.recheck_at.is_some() {
                    recheck_at = recheck_at.max(v.recheck_at);
                    marked.push((p.account.clone(), p.op.clone()));
                }
                factors.push((
                    p.account.clone(),
                    p.op.clone(),
                    v.factor,
                    v.limit.get(),
                    v.valid_for,
                ));
            }
        }
        if self.lost() {
            // The master counted them, but the agent never hears back: it
            // times out and sends them again, as the real agent would.
            self.fail_at(sent + self.timeout, agent, master, start, end, pending);
            return;
        }
        let recheck = recheck_at.map(|at| (at.since(now).max(Duration::from_millis(1)), marked));
        let at = self.now + self.delay();
        self.schedule(
            at,
            Event::Reply {
                agent,
                master,
                factors,
                recheck,
            },
        );
    }

    /// The agent times out on a rollup at `at` and carries its counts over.
    fn fail_at(
        &mut self,
        at: Nanos,
        agent: usize,
        master: usize,
        start: Nanos,
        end: Nanos,
        pending: Vec<Pending>,
    ) {
        let event = Event::Fail {
            agent,
            master,
            start,
            end,
            pending,
        };
        self.schedule(at, event);
    }

    fn apply(&mut self, agent: usize, factors: Vec<Factor>) {
        for (account, op, factor, limit, valid_for) in factors {
            self.agents[agent]
                .state
                .apply(self.now, &account, &op, factor, limit, valid_for);
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::KillMaster(m) => self.masters[m] = None,
            Action::RestartMaster(m) => {
                if self.masters[m].is_none() {
                    self.masters[m] = Some(MasterState::new(self.scenario.master.clone()));
                    self.started[m] = self.now;
                }
            }
            Action::Partition(list) => {
                for a in list {
                    self.agents[a].partitioned = true;
                }
            }
            Action::Heal => {
                for a in &mut self.agents {
                    a.partitioned = false;
                }
            }
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

/// Runs `scenario` to the end.
pub fn run(scenario: Scenario, progress: impl FnMut(u64)) -> Run {
    Sim::new(scenario).run(progress)
}
