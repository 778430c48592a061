//! The simulation: the agents' own state machines, the core's
//! [`AgentState`] and [`AgentRound`] (the very code the agent library
//! drives), talking to [`Masters`] through a simulated network, in virtual
//! time, by a queue of timed events.
//!
//! - [`traffic`](self): each step, every traffic item's operations are
//!   decided by its agents; each second is recorded.
//! - Each agent's round is woken when it asks ([`AgentRound::poll_timeout`]);
//!   what it sends crosses the network with delay, jitter and loss, is
//!   answered by the owning master ([`Masters::answer`]), and comes back
//!   the same way. A lost request or reply, or a partition, shows as a
//!   failure after the agent's request timeout, as it would to the real
//!   agent; a killed master refuses the connection, one delay later; what the round then does (carry over, count the master
//!   down, probe) is the product's own code.
//! - Scenario events kill and restart masters and partition agents.
//!
//! # Layout
//! - this file: the event loop, the agents' rounds and the network.
//! - `masters`: [`Masters`], and [`SimMasters`], the simulated ones.
//! - `control`: [`Control`], the control traffic counted on the way.
//! - `traffic`: traffic steps and per-second records.
//! - `wakes`: the wake-ups due at one instant, handled on every core.

mod control;
mod masters;
mod traffic;
mod wakes;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use damper_core::agent::{AgentConfig, AgentState, Publisher, YOUNG_PEEK_AFTER};
use damper_core::round::{AgentRound, Message, RequestId, RoundConfig, RoundEvent, Transmit};
use damper_core::time::Nanos;
use damper_core::wire::Reply;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use crate::scenario::{Action, Scenario, Traffic};

pub use control::Control;
pub use masters::{Masters, Refusal, SimMasters};
use traffic::{Item, pair_ranks};

/// The start of simulated time: a multiple of every interval.
pub const EPOCH: Nanos = Nanos::from_secs(1_800_000_000);

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
    /// Requests and bytes between agents and masters.
    pub control: Control,
}

enum Event {
    Step,
    Second,
    /// Agent `agent`'s round asked to be woken now.
    Wake {
        agent: usize,
    },
    /// A request reaches master `master`.
    Arrive {
        agent: usize,
        master: usize,
        sent: Nanos,
        transmit: Transmit,
    },
    /// The answer, or the failure, reaches the agent.
    Answer {
        agent: usize,
        id: RequestId,
        rollup: bool,
        outcome: Outcome,
    },
    /// A master's push reaches the agent.
    Push {
        agent: usize,
        master: usize,
        reply: std::sync::Arc<Reply>,
        /// Its encoded size.
        bytes: u64,
    },
    Scenario(Action),
}

/// How a request ended, as the agent hears it.
#[derive(Debug)]
enum Outcome {
    /// Its master's answer.
    Reply(Reply),
    /// Lost, timed out, or refused by a running master: whether it was
    /// counted is unknown.
    Failed,
    /// The master's process is not running: nothing counted, for certain.
    Refused,
    /// A rollup refused for account numbers its master does not hold:
    /// nothing counted, the master up.
    UnknownNumbers,
}

/// One edge node: its agent state and the round that reports it.
struct Agent {
    state: AgentState,
    /// Set by the state's young hook, as the agent library's driver is
    /// notified: the round is woken after the step that created the pair.
    young: Arc<AtomicBool>,
    round: AgentRound,
    /// When a wake-up is queued for the round.
    wake: Option<Nanos>,
    partitioned: bool,
}

/// A simulation in progress, against masters `M`.
pub struct Sim<M: Masters = SimMasters> {
    scenario: Scenario,
    now: Nanos,
    seq: u64,
    queue: BinaryHeap<Reverse<(Nanos, u64, usize)>>,
    events: Vec<Option<Event>>,
    free: Vec<usize>,
    masters: M,
    names: Vec<String>,
    agents: Vec<Agent>,
    items: Vec<Item>,
    rng: SmallRng,
    scratch: Vec<u64>,
    /// Each (item, agent)'s factor at a second's end (see `second`).
    factors: Vec<f64>,
    /// The step's operations per agent and item, filed in decision order.
    slots: traffic::Slots,
    /// The step's batches being decided (kept for its allocation).
    batches: Vec<traffic::Batch>,
    /// The agents woken at one instant (kept for its allocation).
    woken: Vec<usize>,
    /// Whether each agent is in that batch, its wake-up due.
    in_batch: Vec<bool>,
    /// The agents of that batch whose wake-up is due, each once.
    due: Vec<usize>,
    /// See [`Sim::parallel_from`].
    parallel_pairs: usize,
    /// See [`Sim::one_wake_at_a_time`].
    batch_wakes: bool,
    timeout: Duration,
    rollups: (u64, u64),
    dropped: u64,
    control: Control,
}

impl Sim<SimMasters> {
    /// A simulation of `scenario` with its simulated masters, ready to run.
    pub fn new(scenario: Scenario) -> Sim<SimMasters> {
        let masters = SimMasters::new(
            &scenario.master,
            scenario.cluster.masters as usize,
            EPOCH,
            scenario.cluster.push,
        );
        Sim::with_masters(scenario, masters)
    }
}

impl<M: Masters> Sim<M> {
    /// A simulation of `scenario` whose agents talk to `masters`.
    pub fn with_masters(scenario: Scenario, masters: M) -> Sim<M> {
        let interval = Duration::from_millis(scenario.cluster.rollup_interval_ms);
        let names = masters.names();
        let surge_rule = scenario
            .cluster
            .surge_rule()
            .expect("validated with the scenario");
        let agents = (0..scenario.cluster.agents)
            .map(|a| {
                let mut config = RoundConfig::new(format!("agent-{a}"));
                config.rollup_interval = interval;
                config.fast_onset = surge_rule;
                config.account_numbers = scenario.cluster.account_numbers;
                let mut agent_config = AgentConfig::default();
                agent_config.rollup_interval = interval;
                agent_config.fast_onset = scenario.cluster.fast_onset;
                agent_config.low_noise = scenario.cluster.low_noise;
                agent_config.pace = scenario.cluster.pace;
                agent_config.freeze_sparse = scenario.cluster.freeze_sparse;
                agent_config.sparse_hints = scenario.cluster.sparse_hints;
                // Young pairs are measured over 20 ms: only steps that
                // divide it measure them (see `wake_young`).
                agent_config.young_peeks = scenario.cluster.young_peeks
                    && YOUNG_PEEK_AFTER
                        .as_nanos()
                        .is_multiple_of(scenario.step.as_nanos());
                let young = Arc::new(AtomicBool::new(false));
                Agent {
                    state: {
                        let young = young.clone();
                        AgentState::new(agent_config)
                            .with_young_hook(move || young.store(true, Relaxed))
                    },
                    young,
                    round: AgentRound::new(config, &names, EPOCH),
                    wake: None,
                    partitioned: false,
                }
            })
            .collect();
        let pairs = pair_ranks(&scenario.traffic);
        // Items that share their (account, op) are its publishers, and say
        // so to their agents (`check_from`), as a node that knows who
        // publishes does.
        let mut items_of_pair =
            vec![0u32; pairs.iter().map(|&p| p as usize + 1).max().unwrap_or(0)];
        for &pair in &pairs {
            items_of_pair[pair as usize] += 1;
        }
        let items: Vec<Item> = scenario
            .traffic
            .iter()
            .zip(pairs)
            .enumerate()
            .map(|(i, (t, pair))| Item {
                pair,
                publisher: (items_of_pair[pair as usize] > 1).then(|| Publisher::new(i as u64)),
                limit: scenario
                    .master
                    .limits
                    .lookup(&t.account, &t.op)
                    .map(|m| m.rate.get()),
                traffic: t.clone(),
                carry: 0.0,
                rotate: 0,
                arrivals: None,
                attempted: 0,
                admitted: 0,
                positive: false,
                seconds: Vec::with_capacity(scenario.duration_s as usize),
                changes: Vec::new(),
            })
            .collect();
        let slots = traffic::Slots::new(&items);
        let mut sim = Sim {
            masters,
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
            factors: Vec::new(),
            slots,
            batches: Vec::new(),
            woken: Vec::new(),
            in_batch: vec![false; scenario.cluster.agents as usize],
            due: Vec::new(),
            parallel_pairs: wakes::PARALLEL_PAIRS,
            batch_wakes: true,
            // The agent library's default request timeout.
            timeout: (interval / 2).min(Duration::from_secs(1)),
            rollups: (0, 0),
            dropped: 0,
            control: Control::default(),
            scenario,
        };
        // Each step's operations happen at its middle: never at the same
        // instant as the agents' scans and cuts, which fall on the grid, so
        // no sub-window gets a step twice by the order of simultaneous
        // events.
        let first_step = EPOCH + sim.scenario.step / 2;
        sim.schedule(first_step, Event::Step);
        sim.schedule(EPOCH + Duration::from_secs(1), Event::Second);
        for a in 0..sim.agents.len() {
            sim.sync(a);
        }
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
                Event::Wake { agent } => self.wake_batch(agent),
                Event::Arrive {
                    agent,
                    master,
                    sent,
                    transmit,
                } => self.arrive(agent, master, sent, transmit),
                Event::Answer {
                    agent,
                    id,
                    rollup,
                    outcome,
                } => self.answer(agent, id, rollup, outcome),
                Event::Push {
                    agent,
                    master,
                    reply,
                    bytes,
                } => self.pushed(agent, master, &reply, bytes),
                Event::Scenario(action) => self.act(action),
            }
        }
        self.finish()
    }

    fn finish(self) -> Run {
        Run {
            scenario: self.scenario.name.clone(),
            policy: self.scenario.policy_name().to_string(),
            estimator: self.scenario.master.window.estimator.name().to_string(),
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
            control: self.control,
        }
    }

    /// Wakes the rounds whose states were told of a young pair, as the
    /// agent library's driver wakes on its hook's notice: at the end of
    /// this step, when every operation of the step (spread over it, decided
    /// at its middle) is in, so a young pair is measured over whole steps
    /// from there. Young peeks are on only with steps that divide
    /// [`YOUNG_PEEK_AFTER`] (20 ms), so they measure whole steps; coarser
    /// steps (the default 100 ms) would read one step's operations over
    /// a part of it.
    fn wake_young(&mut self) {
        let at = self.now + self.scenario.step / 2;
        for a in 0..self.agents.len() {
            let agent = &mut self.agents[a];
            if agent.young.swap(false, Relaxed) && agent.wake.is_none_or(|w| w > at) {
                agent.wake = Some(at);
                self.schedule(at, Event::Wake { agent: a });
            }
        }
    }

    /// Sends what agent `a`'s round has to send, takes its events, and
    /// queues its next wake-up.
    fn sync(&mut self, a: usize) {
        while let Some(transmit) = self.agents[a].round.poll_transmit() {
            self.send(a, transmit);
        }
        while let Some(event) = self.agents[a].round.poll_event() {
            if let RoundEvent::Dropped { cost } = event {
                self.dropped += cost;
            }
        }
        let next = self.agents[a].round.poll_timeout();
        if next != self.agents[a].wake
            && let Some(at) = next
        {
            self.agents[a].wake = Some(at.max(self.now));
            self.schedule(at.max(self.now), Event::Wake { agent: a });
        }
    }

    /// A request leaves agent `a`: lost or cut off, it fails after the
    /// request timeout; otherwise it reaches its master after the delay.
    fn send(&mut self, a: usize, transmit: Transmit) {
        let rollup = matches!(transmit.message, Message::Rollup(_));
        self.rollups.0 += u64::from(rollup);
        self.control.sent(&transmit.message);
        let master = self
            .names
            .iter()
            .position(|n| *n == transmit.master)
            .expect("rounds route to known masters");
        if self.agents[a].partitioned || self.lost() {
            let at = self.now + self.timeout;
            self.fail_at(at, a, transmit.id, rollup);
            return;
        }
        let at = self.now + self.delay();
        let sent = self.now;
        self.schedule(
            at,
            Event::Arrive {
                agent: a,
                master,
                sent,
                transmit,
            },
        );
    }

    /// A request reaches master `m`, which answers (or is down: the agent
    /// times out).
    fn arrive(&mut self, a: usize, m: usize, sent: Nanos, transmit: Transmit) {
        let rollup = matches!(transmit.message, Message::Rollup(_));
        let deadline = sent + self.timeout;
        if !self.masters.is_up(m) {
            // A killed process on a host still up: the connection is
            // refused, and the agent hears so one delay later.
            return self.status_back(a, transmit.id, rollup, deadline, Outcome::Refused);
        }
        let answered = self.masters.answer(m, self.now, &transmit.message);
        self.push(m);
        match answered {
            // Refused: the status comes back like a reply would.
            Err(Refusal::UnknownNumbers) => {
                self.status_back(a, transmit.id, rollup, deadline, Outcome::UnknownNumbers);
            }
            Err(_) => self.status_back(a, transmit.id, rollup, deadline, Outcome::Failed),
            // The master counted it, but the agent may never hear back: it
            // times out, and carries the counts over as the real agent would.
            Ok(_) if self.lost() => self.fail_at(deadline, a, transmit.id, rollup),
            Ok(reply) => {
                let at = self.now + self.delay();
                if at > deadline {
                    self.fail_at(deadline, a, transmit.id, rollup);
                } else {
                    let answer = Event::Answer {
                        agent: a,
                        id: transmit.id,
                        rollup,
                        outcome: Outcome::Reply(reply),
                    };
                    self.schedule(at, answer);
                }
            }
        }
    }

    /// Sends what master `m` pushes after answering a request to every
    /// agent not cut off, each over its own delay and loss: the one whose
    /// request it answered too, as the service's `Watch` streams do (its
    /// reply may come before the push or after; a poll reaches it only by
    /// the push). Agents watch for pushes only with fast onset on, as the
    /// library's do.
    fn push(&mut self, m: usize) {
        let Some(reply) = self.masters.take_push(m) else {
            return;
        };
        if !self.scenario.cluster.fast_onset {
            return;
        }
        let bytes = Control::push_size(&reply);
        let reply = std::sync::Arc::new(reply);
        for a in 0..self.agents.len() {
            if self.agents[a].partitioned || self.lost() {
                continue;
            }
            let at = self.now + self.delay();
            let push = Event::Push {
                agent: a,
                master: m,
                reply: reply.clone(),
                bytes,
            };
            self.schedule(at, push);
        }
    }

    /// A push from master `m` reaches agent `a`'s round.
    fn pushed(&mut self, a: usize, m: usize, reply: &Reply, bytes: u64) {
        self.control.pushed(bytes, !reply.polls.is_empty());
        let agent = &mut self.agents[a];
        agent
            .round
            .on_push(self.now, &self.names[m], reply, &agent.state);
        self.sync(a);
    }

    /// An error status for agent `a`'s request `id`, back one delay from
    /// now (or at its `deadline`, when the agent has given up by then).
    fn status_back(
        &mut self,
        a: usize,
        id: RequestId,
        rollup: bool,
        deadline: Nanos,
        outcome: Outcome,
    ) {
        let at = self.now + self.delay();
        let event = Event::Answer {
            agent: a,
            id,
            rollup,
            outcome,
        };
        self.schedule(at.min(deadline), event);
    }

    fn fail_at(&mut self, at: Nanos, a: usize, id: RequestId, rollup: bool) {
        let event = Event::Answer {
            agent: a,
            id,
            rollup,
            outcome: Outcome::Failed,
        };
        self.schedule(at, event);
    }

    /// An answer, or a failure, reaches agent `a`'s round.
    fn answer(&mut self, a: usize, id: RequestId, rollup: bool, outcome: Outcome) {
        let agent = &mut self.agents[a];
        match outcome {
            Outcome::Reply(reply) => {
                self.control.answered(&reply);
                agent.round.on_reply(self.now, id, &reply, &agent.state);
            }
            Outcome::Failed => {
                self.rollups.1 += u64::from(rollup);
                agent.round.on_failure(self.now, id, &agent.state);
            }
            Outcome::Refused => {
                self.rollups.1 += u64::from(rollup);
                agent.round.on_refused(self.now, id, &agent.state);
            }
            Outcome::UnknownNumbers => {
                self.rollups.1 += u64::from(rollup);
                agent.round.on_unknown_numbers(self.now, id, &agent.state);
            }
        }
        self.sync(a);
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::KillMaster(m) => self.masters.kill(m),
            Action::RestartMaster(m) => self.masters.restart(m, self.now),
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

/// Runs `scenario` to the end against its simulated masters.
pub fn run(scenario: Scenario, progress: impl FnMut(u64)) -> Run {
    Sim::new(scenario).run(progress)
}
