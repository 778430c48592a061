//! What the `check` and `local` benchmarks share: the keys, the order they
//! are visited in, the two limiters compared and the single-thread loops
//! over them.
//!
//! Damper is measured through the product: an [`Agent`] whose factors come
//! from a real master on loopback, with its rollup task running while the
//! benchmark does (as on a node). governor's keyed limiter is given the same
//! `String` keys.

#![allow(dead_code)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::BenchmarkGroup;
use criterion::measurement::WallTime;
use damper_agent::Agent;
use damper_core::agent::{AgentConfig, AgentState};
use damper_core::config::MasterConfig;
use damper_core::time::Nanos;
use damper_master::{Master, MasterOptions};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::SmallRng;

/// Keys each limiter holds: enough that every call misses cache, as on a
/// node with many accounts.
pub const KEYS: usize = 100_000;
/// The op the admit path is measured on: limited far above any demand, so
/// its factor is 0.
pub const CALM: &str = "messages";
/// The op the reject path is measured on: limited to 1 cost/s against the
/// warm-up's 10⁶ per key, so its factor is within 10⁻⁶ of 1.
pub const FLOOD: &str = "flood";
/// The cost of each `check` on [`FLOOD`] (a publish to 999 subscribers):
/// enough demand to hold the factor near 1 while the benchmark runs.
pub const FLOOD_COST: u64 = 1_000;

/// The op and cost a check on the admit path (`admit`) or the reject path
/// is made with: [`CALM`] at 1, or [`FLOOD`] at [`FLOOD_COST`].
pub fn op_and_cost(admit: bool) -> (&'static str, u64) {
    if admit {
        (CALM, 1)
    } else {
        (FLOOD, FLOOD_COST)
    }
}

/// The instant the state-machine cases run at.
pub const STATE_NOW: Nanos = Nanos::from_secs(1_700_000_000);

/// An agent's state machine (no live loop, no master) that knows every
/// key on both ops, its factors applied as a master's reply would, valid
/// for a day from [`STATE_NOW`]: 0 on [`CALM`], 1 on [`FLOOD`].
pub fn state_machine(keys: &[String]) -> AgentState {
    let state = AgentState::new(AgentConfig::default());
    let valid_for = Duration::from_secs(24 * 3600);
    for key in keys {
        state.apply(STATE_NOW, key, CALM, 0.0, 1e12, valid_for);
        state.apply(STATE_NOW, key, FLOOD, 1.0, 1.0, valid_for);
    }
    state
}

/// `KEYS` distinct `String` keys, `{prefix}-NNNNNN`.
pub fn keys(prefix: &str) -> Vec<String> {
    keys_n(prefix, KEYS)
}

/// `n` distinct `String` keys, `{prefix}-NNNNNN`.
pub fn keys_n(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:06}")).collect()
}

/// A shuffled visiting order of `KEYS` keys, the same for every limiter
/// compared.
pub fn order(seed: u64) -> Vec<usize> {
    order_n(seed, KEYS)
}

/// A shuffled visiting order of `n` keys.
pub fn order_n(seed: u64, n: usize) -> Vec<usize> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..order.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// A master on loopback and an agent reporting to it, on one runtime
/// thread of their own.
pub struct Damper {
    pub agent: Agent,
    // Dropping it stops the master and the rollup task.
    _runtime: tokio::runtime::Runtime,
}

/// An agent that knows every key on both ops, with the master's factors in
/// force: 0 on [`CALM`], about 1 on [`FLOOD`]. Panics if the factors have
/// not arrived within a minute.
pub fn damper(keys: &[String]) -> Damper {
    // `BENCH_FAST_ONSET=off`: without fast onset's scans beside the
    // benchmark, to tell their share.
    let damper = Damper::start(
        std::env::var("BENCH_FAST_ONSET").as_deref() != Ok("off"),
        rollup_interval(),
    );
    damper.flood(keys);
    damper.age(keys);
    damper
}

/// The agent's rollup interval when `BENCH_ROLLUP_MS` sets one; `None`
/// for the agent's own default (2 s). At 20 000 no round falls within
/// most of a group's measurement, which tells what the round beside
/// `check` costs it (docs/performance.md, "What the round beside `check`
/// costs").
fn rollup_interval() -> Option<Duration> {
    let ms = std::env::var("BENCH_ROLLUP_MS").ok()?;
    match ms.parse::<u64>() {
        Ok(ms) if ms > 0 => Some(Duration::from_millis(ms)),
        _ => panic!("BENCH_ROLLUP_MS: {ms:?} is not a whole number of milliseconds above 0"),
    }
}

impl Damper {
    /// A master on loopback limiting [`CALM`] far above any demand and
    /// [`FLOOD`] to 1, and an agent reporting to it every `rollup` (`None`:
    /// the agent's default, 2 s; the rollup task's work while the
    /// benchmark runs is what a node with this many active keys pays, and
    /// the master's, on the same thread, what it does not), both on one
    /// runtime thread of their own. Knows no key yet.
    pub fn start(fast_onset: bool, rollup: Option<Duration>) -> Damper {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let config =
            MasterConfig::from_toml(&format!("[limits]\n{CALM} = 1e15\n{FLOOD} = 1\n")).unwrap();
        let master = Master::new(config, MasterOptions::default());
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a loopback port");
        let address = listener.local_addr().unwrap().to_string();
        runtime.spawn(damper_master::run(
            listener,
            master,
            std::future::pending::<()>(),
        ));
        let agent = {
            let _inside = runtime.enter();
            let builder = Agent::builder()
                .masters([address])
                .agent_id("bench")
                .fast_onset(fast_onset);
            match rollup {
                Some(interval) => builder.rollup_interval(interval),
                None => builder,
            }
            .start()
            .expect("an agent")
        };
        Damper {
            agent,
            _runtime: runtime,
        }
    }

    /// Checks every key on both ops once every local guard window (250 ms)
    /// for sixteen of them, so the benchmarks measure keys past a new
    /// pair's youth (its first 15 windows with traffic, during which every
    /// check also shows the scans its cost: `damper_core::agent`'s
    /// `Entry::seed_quantum`), as a node's known keys are. Before 27
    /// November (thirteenth session) the first seconds of a run measured
    /// young keys.
    pub fn age(&self, keys: &[String]) {
        for _ in 0..16 {
            self.touch(keys);
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Checks every key once on [`CALM`] and once, flooding, on [`FLOOD`].
    fn touch(&self, keys: &[String]) {
        for k in keys {
            self.agent.check(k, CALM, 1);
            self.agent.check(k, FLOOD, 1_000_000);
        }
    }

    /// Floods every key on [`FLOOD`] (and touches it on [`CALM`]) and waits
    /// for the master's factors: about 1 and 0. Called before each group
    /// that needs them, as a flood's factor is released a round after the
    /// flood stops.
    pub fn flood(&self, keys: &[String]) {
        let agent = &self.agent;
        self.touch(keys);
        let ready = |k: &String| {
            agent.factor(k, CALM) == Some(0.0) && agent.factor(k, FLOOD).is_some_and(|f| f > 0.999)
        };
        for tick in 1..=600 {
            if keys.iter().all(ready) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
            // Once a second, every key is flooded again: a single burst is
            // let go a round after it stops, and keys whose factor arrived
            // late would miss it (the runs that printed nothing). Every
            // key, not only those still waiting: a key left alone once
            // ready lets its factors lapse, and with 100 000 keys on a
            // busy machine the early ones lapsed before the late ones were
            // ready (a run that waited a minute with half of them ready,
            // 25 November).
            if tick % 10 == 0 {
                self.touch(keys);
            }
        }
        panic!(
            "the master's factors did not arrive within a minute: {} of {} keys ready",
            keys.iter().filter(|k| ready(k)).count(),
            keys.len()
        );
    }
}

/// governor's keyed limiter with every key known: a quota that never runs
/// out (allow) or one already spent (deny).
pub fn governor(keys: &[String], allow: bool) -> DefaultKeyedRateLimiter<String> {
    let quota = if allow {
        Quota::per_second(NonZeroU32::MAX)
    } else {
        Quota::per_hour(NonZeroU32::MIN)
    };
    let limiter = RateLimiter::keyed(quota);
    for k in keys {
        let _ = limiter.check_key(k);
    }
    limiter
}

/// Adds `name`: `Agent::check` on one key after another, in `order`, on
/// [`CALM`] (`admit`) or [`FLOOD`].
pub fn bench_check(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    agent: &Agent,
    admit: bool,
    keys: &[String],
    order: &[usize],
) {
    let (op, cost) = op_and_cost(admit);
    g.bench_function(name, |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % order.len();
            black_box(agent.check(&keys[order[i]], op, cost))
        })
    });
}

/// Adds `governor`: its keyed check on one key after another, in `order`.
pub fn bench_governor(
    g: &mut BenchmarkGroup<'_, WallTime>,
    gov: &DefaultKeyedRateLimiter<String>,
    keys: &[String],
    order: &[usize],
) {
    g.bench_function("governor", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % order.len();
            black_box(gov.check_key(&keys[order[i]]).is_ok())
        })
    });
}
