//! End-to-end tests of the Damper loop.
//!
//! Two harnesses. `tests/grpc.rs` runs the real thing: `damper-master`
//! servers on loopback, `damper-agent` agents, traffic from `damper-load`,
//! at the production time scale. [`WireLoop`] drives the core state machines
//! through the `damper.v1` messages, encoded and decoded with prost exactly
//! as gRPC would carry them, routed by the master [`Ring`], in virtual time:
//! fast, deterministic, and able to run for simulated minutes.
//!
//! # Layout
//! - `tests/grpc.rs`: the loop over real gRPC on loopback.
//! - [`WireLoop`]: the virtual-time harness.
//! - `tests/wire_loop.rs`: the proto carries the loop; the calm account is
//!   never touched while a deluge is held at its limit.
//! - `tests/policies.rs`: the demand policy holds a deluge steadily; Ably's
//!   linear ramp on the admitted rate oscillates.
//! - [`proxy`]: a fault-injecting TCP proxy (delay, drop, cut);
//!   `tests/faults.rs` puts it between agents and a master.
//! - [`served::ServedMaster`]: a master served in-process on loopback.

pub mod proxy;
pub mod served;

use std::collections::BTreeMap;
use std::time::Duration;

use std::sync::Arc;

use damper_agent::{apply_reply, rollup_request};
use damper_core::agent::{AgentConfig, AgentState};
use damper_core::config::MasterConfig;
use damper_core::ring::Ring;
use damper_core::time::{ManualClock, Nanos};
use damper_master::{Master, MasterOptions};
use damper_proto::v1::{RollupReply, RollupRequest};
use prost::Message;
use rand::SeedableRng;
use rand::rngs::SmallRng;

/// Traffic of one (account, op) across the whole cluster.
#[derive(Clone, Debug)]
pub struct Load {
    /// Account id.
    pub account: &'static str,
    /// Operation.
    pub op: &'static str,
    /// Cost of each operation (1 + subscribers, for a publish).
    pub cost: u64,
    /// Operations per second attempted, over all agents together.
    pub ops_per_sec: u64,
}

/// What one account did in one rollup interval, over all agents.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    /// Cost attempted.
    pub attempted: u64,
    /// Cost admitted.
    pub admitted: u64,
    /// Largest factor any agent had in force for it at the end.
    pub factor: f64,
    /// Smallest factor any agent had in force for it at the end.
    pub min_factor: f64,
}

/// The spread of admitted cost per round that probabilistic suppression
/// itself causes: each of `ops` operations of cost `cost` is admitted with
/// probability `1 − factor`, so the admitted cost has this standard
/// deviation even when the factor is exactly right.
pub fn sampling_sd(ops: f64, cost: f64, factor: f64) -> f64 {
    cost * (ops * factor * (1.0 - factor)).sqrt()
}

/// Agents and masters exchanging real `damper.v1` messages in virtual time.
pub struct WireLoop {
    masters: BTreeMap<String, Master>,
    clock: Arc<ManualClock>,
    ring: Ring,
    agents: Vec<AgentState>,
    rng: SmallRng,
    now: Nanos,
    rollup: Duration,
    /// One-way network delay.
    pub latency: Duration,
    /// Bytes of requests and replies carried so far.
    pub wire_bytes: usize,
}

impl WireLoop {
    /// `masters` masters on `config`, `agents` agents, seeded randomness.
    pub fn new(config: &str, masters: usize, agents: usize, seed: u64) -> WireLoop {
        let config = MasterConfig::from_toml(config).expect("valid config");
        let names: Vec<String> = (0..masters)
            .map(|i| format!("127.0.0.1:{}", 7000 + i))
            .collect();
        let rollup = config.window.rollup_interval;
        // A multiple of every rollup interval the tests use.
        let start = Nanos::from_secs(1_800_000_000);
        let clock = Arc::new(ManualClock::new(start));
        WireLoop {
            ring: Ring::new(&names),
            masters: names
                .into_iter()
                .map(|n| {
                    let options = MasterOptions::default();
                    (
                        n,
                        Master::with_clock(config.clone(), options, clock.clone()),
                    )
                })
                .collect(),
            clock,
            agents: (0..agents)
                .map(|_| {
                    AgentState::new(AgentConfig {
                        rollup_interval: rollup,
                        ..AgentConfig::default()
                    })
                })
                .collect(),
            rng: SmallRng::seed_from_u64(seed),
            now: start,
            rollup,
            latency: Duration::from_millis(5),
            wire_bytes: 0,
        }
    }

    /// The ring the agents route by.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Runs one rollup interval of `loads`, spreading each load's operations
    /// evenly over time and round-robin over the agents, then sends every
    /// agent's rollup and applies the replies. Returns each account's tally.
    pub fn step(&mut self, loads: &[Load]) -> BTreeMap<&'static str, Tally> {
        let start = self.now;
        let interval = self.rollup.as_nanos() as u64;
        let mut tallies: BTreeMap<&'static str, Tally> = BTreeMap::new();
        // Interleave all loads' operations in time order.
        let mut ops: Vec<(u64, usize)> = Vec::new();
        for (l, load) in loads.iter().enumerate() {
            let n = load.ops_per_sec * interval / 1_000_000_000;
            ops.extend((0..n).map(|i| (i * interval / n.max(1), l)));
        }
        ops.sort_unstable();
        for (k, (offset, l)) in ops.into_iter().enumerate() {
            let load = &loads[l];
            let now = Nanos::from_nanos(start.as_nanos() + offset);
            let agent = &self.agents[k % self.agents.len()];
            let tally = tallies.entry(load.account).or_default();
            tally.attempted += load.cost;
            if agent
                .check(now, load.account, load.op, load.cost, &mut self.rng)
                .is_admit()
            {
                tally.admitted += load.cost;
            }
        }
        self.now = Nanos::from_nanos(start.as_nanos() + interval);
        for a in 0..self.agents.len() {
            self.rollup_from(a, start);
        }
        for load in loads {
            let factors: Vec<f64> = self
                .agents
                .iter()
                .filter_map(|agent| {
                    agent.factor(self.now + self.latency * 2, load.account, load.op)
                })
                .collect();
            let tally = tallies.entry(load.account).or_default();
            tally.factor = factors.iter().cloned().fold(0.0, f64::max);
            tally.min_factor = factors.iter().cloned().fold(1.0, f64::min);
        }
        tallies
    }

    /// Drains agent `a`, sends one encoded request per owning master, and
    /// applies the decoded replies.
    fn rollup_from(&mut self, a: usize, start: Nanos) {
        let agent = &self.agents[a];
        let routed = agent.drain_by_owner(&self.ring);
        assert!(routed.unroutable.is_empty(), "every account has a master");
        for (owner, pending) in routed.by_master {
            let request = rollup_request(&format!("agent-{a}"), start, self.now, &pending);
            let bytes = request.encode_to_vec();
            self.wire_bytes += bytes.len();
            let arrival = self.now + self.latency;
            let master = self.masters.get(&owner).expect("owner is a master");
            let reply = serve(master, &self.clock, arrival, &bytes);
            self.wire_bytes += reply.len();
            let reply = RollupReply::decode(reply.as_slice()).expect("valid reply");
            let received = arrival + self.latency;
            let asked = pending.iter().map(|p| (p.op.as_str(), p.account.as_str()));
            apply_reply(agent, received, &reply, asked);
        }
        agent.forget_idle(self.now);
    }
}

/// What the master service does with one request's bytes: decode, hand to
/// [`Master::rollup`] at `now`, encode the reply.
fn serve(master: &Master, clock: &ManualClock, now: Nanos, request: &[u8]) -> Vec<u8> {
    clock.set(now);
    let request = RollupRequest::decode(request).expect("valid request");
    master
        .rollup(&request)
        .expect("valid rollup")
        .encode_to_vec()
}
