//! The admission decision, side by side with `governor`'s keyed limiter.
//!
//! Both hold the same 100 000 `String` keys and are called in the same
//! shuffled key order. Damper is `Agent::check`, with its factors from a
//! master on loopback and its rollup task running (see `common`); it reads
//! the agent's coarse clock, a load. governor reads its own clock (quanta)
//! on each call, which is part of what it costs to use.
//!
//! Groups:
//! - `check_admit`: the allow path (factor 0 in force / quota left).
//! - `check_reject`: the deny path (factor ≈ 1 / quota exhausted).
//! - `check_admit_2_threads`, `check_reject_2_threads`: two threads on the
//!   same limiter; reported time is wall time per call across both threads.
//! - `check_hot_key_2_threads`: two threads on one single account.
//! - `check_hot_key`: one thread on one single account.
//! - `check_shared_factor`: 100 000 keys under a factor of 0.5, the
//!   state machine as in the 1 000 000-key cases: `check` (the admission
//!   credit's draw and add) against `check_from` (four publishers an
//!   account, each on its lane: one more line and add). No governor case:
//!   it has no partial factor.
//! - `check_admit_1m`, `check_reject_1m`: 1 000 000 keys, one thread. The
//!   agent's state machine itself (`AgentState::check`, which `Agent::check`
//!   wraps with its clock and random source), its factors applied as a
//!   master's reply would: one agent cannot roll up two million busy pairs
//!   every 2 s on this 2-core machine (docs/performance.md, "One agent with
//!   very many pairs"), so no live loop runs beside it.
//!
//! Run: `cargo bench -p damper-tests --bench check`. `BENCH_FAST_ONSET=off`
//! runs the live agent without fast onset's scans, `BENCH_ROLLUP_MS` sets
//! its rollup interval (2 000 by default; at 20 000 no round runs beside
//! most of a group's measurement).

#![allow(missing_docs)]
// A benchmark measures wall time by definition.
#![allow(clippy::disallowed_types)]

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

mod common;

use common::{CALM, Damper, KEYS, bench_check, bench_governor, governor, order, order_n};
use criterion::{Criterion, criterion_group, criterion_main};
use damper_core::agent::{AgentConfig, AgentState, Publisher};
use damper_core::time::Nanos;
use rand::SeedableRng;
use rand::rngs::SmallRng;

fn single_thread(c: &mut Criterion, damper: &Damper, keys: &[String], group: &str, allow: bool) {
    let order = order(1);
    if !allow {
        damper.flood(keys);
    }
    let gov = governor(keys, allow);
    let mut g = c.benchmark_group(group);
    bench_check(&mut g, "damper", &damper.agent, allow, keys, &order);
    bench_governor(&mut g, &gov, keys, &order);
    g.finish();
}

/// Runs `call(thread, iteration)` `iters` times over two threads and
/// returns the wall time, so criterion reports time per call at two threads.
fn two_threads(iters: u64, call: Arc<dyn Fn(usize, u64) + Send + Sync>) -> Duration {
    let start = Arc::new(Barrier::new(3));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (start, call) = (start.clone(), call.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..iters / 2 {
                    call(t, i);
                }
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for t in threads {
        t.join().unwrap();
    }
    began.elapsed()
}

fn threaded(
    c: &mut Criterion,
    damper: &Arc<Damper>,
    keys: &Arc<Vec<String>>,
    group: &str,
    allow: bool,
    hot_key: bool,
) {
    let orders = Arc::new([order(1), order(3)]);
    if !allow {
        damper.flood(keys);
    }
    let gov = Arc::new(governor(keys, allow));
    let (op, cost) = common::op_and_cost(allow);
    let pick = move |orders: &[Vec<usize>; 2], t: usize, i: u64| {
        if hot_key {
            0
        } else {
            orders[t][(i % KEYS as u64) as usize]
        }
    };
    let mut g = c.benchmark_group(group);
    g.bench_function("damper", |b| {
        b.iter_custom(|iters| {
            let (keys, orders, damper) = (keys.clone(), orders.clone(), damper.clone());
            two_threads(
                iters,
                Arc::new(move |t, i| {
                    black_box(damper.agent.check(&keys[pick(&orders, t, i)], op, cost));
                }),
            )
        })
    });
    g.bench_function("governor", |b| {
        b.iter_custom(|iters| {
            let (keys, orders, gov) = (keys.clone(), orders.clone(), gov.clone());
            two_threads(
                iters,
                Arc::new(move |t, i| {
                    black_box(gov.check_key(&keys[pick(&orders, t, i)]).is_ok());
                }),
            )
        })
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    let keys = Arc::new(common::keys("account"));
    let damper = Arc::new(common::damper(&keys));
    single_thread(c, &damper, &keys, "check_admit", true);
    single_thread(c, &damper, &keys, "check_reject", false);
    threaded(c, &damper, &keys, "check_admit_2_threads", true, false);
    threaded(c, &damper, &keys, "check_reject_2_threads", false, false);
    threaded(c, &damper, &keys, "check_hot_key_2_threads", true, true);
    hot_key(c, &damper, &keys);
    drop(damper);
    shared_factor(c);
    million_keys(c);
}

/// `check_shared_factor`: [`KEYS`] accounts under a factor of 0.5, decided
/// by `check` and by `check_from` with four publishers an account.
fn shared_factor(c: &mut Criterion) {
    let keys = common::keys_n("account", KEYS);
    let order = order_n(3, KEYS);
    let now = Nanos::from_secs(1_700_000_000);
    let state = AgentState::new(AgentConfig::default());
    for key in &keys {
        state.apply(now, key, CALM, 0.5, 1e12, Duration::from_secs(24 * 3600));
    }
    let mut g = c.benchmark_group("check_shared_factor");
    g.bench_function("check", |b| {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % order.len();
            black_box(
                state
                    .check(now, &keys[order[i]], CALM, 1, &mut rng)
                    .is_admit(),
            )
        })
    });
    g.bench_function("check_from", |b| {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % order.len();
            let publisher = Publisher::new((i % 4) as u64);
            let decision = state.check_from(now, &keys[order[i]], CALM, 1, publisher, &mut rng);
            black_box(decision.is_admit())
        })
    });
    g.finish();
}

/// Keys of the 1 000 000-key cases.
const MILLION: usize = 1_000_000;

/// `check_admit_1m` and `check_reject_1m`: the state machine over a
/// million keys on each op, factor 0 on [`CALM`] and 1 on [`FLOOD`], valid
/// for the whole run, beside governor over the same keys.
fn million_keys(c: &mut Criterion) {
    let keys = common::keys_n("account", MILLION);
    let order = order_n(2, MILLION);
    let now = common::STATE_NOW;
    let state = common::state_machine(&keys);
    for (group, allow) in [("check_admit_1m", true), ("check_reject_1m", false)] {
        let (op, cost) = common::op_and_cost(allow);
        let gov = governor(&keys, allow);
        let mut g = c.benchmark_group(group);
        g.bench_function("damper", |b| {
            let mut rng = SmallRng::seed_from_u64(7);
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % order.len();
                let decision = state.check(now, &keys[order[i]], op, cost, &mut rng);
                black_box(decision.is_admit())
            })
        });
        bench_governor(&mut g, &gov, &keys, &order);
        g.finish();
    }
}

/// One thread, one account, over and over: the cost of the decision itself,
/// with every line it touches in cache.
fn hot_key(c: &mut Criterion, damper: &Damper, keys: &[String]) {
    let gov = governor(&keys[..1], true);
    let mut g = c.benchmark_group("check_hot_key");
    g.bench_function("damper", |b| {
        b.iter(|| black_box(damper.agent.check(&keys[0], CALM, 1)))
    });
    g.bench_function("governor", |b| {
        b.iter(|| black_box(gov.check_key(&keys[0]).is_ok()))
    });
    g.finish();
}

criterion_group! {
    name = check;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = benches
}
criterion_main!(check);
