//! The admission decision, side by side with `governor`'s keyed limiter.
//!
//! Both hold the same 100 000 `String` keys and are called in the same
//! shuffled key order. Damper's `check` takes `now` as an argument (the agent
//! reads a coarse clock); governor reads its own clock (quanta) on each call,
//! which is part of what it costs to use.
//!
//! Groups:
//! - `check_admit`: the allow path (no factor in force / quota left).
//! - `check_reject`: the deny path (factor 1.0 / quota exhausted).
//! - `check_admit_2_threads`, `check_reject_2_threads`: two threads on the
//!   same limiter; reported time is wall time per call across both threads.
//! - `check_hot_key_2_threads`: two threads on one single account.
//!
//! Run: `cargo bench -p damper-core --bench check`.

#![allow(missing_docs)]
// A benchmark measures wall time by definition.
#![allow(clippy::disallowed_types)]

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

mod common;

use common::{KEYS, NOW, OP, bench_check, bench_governor, damper, governor, keys, order};
use criterion::{Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand::rngs::SmallRng;

fn single_thread(c: &mut Criterion, group: &str, factor: f64, allow: bool) {
    let keys = keys("account");
    let order = order(1);
    let agent = damper(&keys, factor);
    let gov = governor(&keys, allow);
    let mut g = c.benchmark_group(group);
    bench_check(&mut g, "damper", &agent, &keys, &order);
    bench_governor(&mut g, &gov, &keys, &order);
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

fn threaded(c: &mut Criterion, group: &str, factor: f64, allow: bool, hot_key: bool) {
    let keys = Arc::new(keys("account"));
    let orders = Arc::new([order(1), order(3)]);
    let agent = Arc::new(damper(&keys, factor));
    let gov = Arc::new(governor(&keys, allow));
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
            let (keys, orders, agent) = (keys.clone(), orders.clone(), agent.clone());
            two_threads(
                iters,
                Arc::new(move |t, i| {
                    thread_local! {
                        static RNG: std::cell::RefCell<SmallRng> =
                            std::cell::RefCell::new(SmallRng::seed_from_u64(7));
                    }
                    let key = &keys[pick(&orders, t, i)];
                    RNG.with_borrow_mut(|rng| black_box(agent.check(NOW, key, OP, 1, rng)));
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
    single_thread(c, "check_admit", 0.0, true);
    single_thread(c, "check_reject", 1.0, false);
    threaded(c, "check_admit_2_threads", 0.0, true, false);
    threaded(c, "check_reject_2_threads", 1.0, false, false);
    threaded(c, "check_hot_key_2_threads", 0.0, true, true);
}

criterion_group! {
    name = check;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = benches
}
criterion_main!(check);
