//! The cost of fast onset's passes over an agent's pairs: a sub-window's
//! scan (`AgentState::scan_surges`, every 200 ms) and its peek
//! (`AgentState::peek_surges`, halfway), beside the rollup's drain
//! (`AgentState::drain`, every 2 s), which every agent already pays. Over
//! 100 000 pairs, as on a node serving many accounts; nothing surges, so
//! nothing is reported.
//!
//! - `scan_surges_active`: every pair had a check since the last pass (the
//!   checks are set up outside the timing).
//! - `drain_by_owner_active`: a rollup's drain when every pair had a
//!   check, its counts routed to three masters and sorted for sending.
//! - `scan_surges`, `peek_surges`, `drain`: the pairs went quiet (a pass
//!   skips a pair with nothing in its last sub-windows and no noise left,
//!   and a peek into a sub-window nothing was counted in skips its pass).
//! - `peek_surges_active`: a peek after every pair had a check since the
//!   sub-window's close.
//!
//! Run: `cargo bench -p damper-tests --bench scan`. Reported time is per
//! pass; divide by 100 000 for a pair.

#![allow(missing_docs)]

use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use damper_core::agent::{AgentConfig, AgentState, SurgeRule};
use damper_core::ring::Ring;
use damper_core::time::Nanos;
use rand::SeedableRng;
use rand::rngs::SmallRng;

const PAIRS: usize = 100_000;

fn benches(c: &mut Criterion) {
    let state = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    let t0 = Nanos::from_secs(1_800_000_000);
    let accounts: Vec<String> = (0..PAIRS).map(|i| format!("account-{i}")).collect();
    for a in &accounts {
        state.check(t0, a, "messages", 1, &mut rng);
    }
    let rule = SurgeRule::default_for(Duration::from_secs(2));
    let window = Duration::from_millis(200);
    let mut g = c.benchmark_group("pass_100k_pairs");
    g.sample_size(20);
    let mut now = t0 + window;
    g.bench_function("scan_surges_active", |b| {
        b.iter_batched(
            || {
                for a in &accounts {
                    state.check(now, a, "messages", 1, &mut rng);
                }
                let since = now;
                now = now + window;
                (since, now)
            },
            |(since, now)| state.scan_surges(since, now, &rule, |_, _| false),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("scan_surges", |b| {
        b.iter(|| {
            let since = now;
            now = now + window;
            state.scan_surges(since, now, &rule, |_, _| false)
        })
    });
    g.bench_function("peek_surges", |b| {
        b.iter(|| state.peek_surges(now, now + window / 2, &rule, |_, _| false))
    });
    g.bench_function("peek_surges_active", |b| {
        b.iter_batched(
            || {
                for a in &accounts {
                    state.check(now, a, "messages", 1, &mut rng);
                }
            },
            |()| state.peek_surges(now, now + window / 2, &rule, |_, _| false),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("drain", |b| {
        b.iter(|| state.drain(Nanos::ZERO, |_, _, _| {}))
    });
    let ring = Ring::new(["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"]);
    g.bench_function("drain_by_owner_active", |b| {
        b.iter_batched(
            || {
                for a in &accounts {
                    state.check(now, a, "messages", 1, &mut rng);
                }
            },
            |()| state.drain_by_owner(Nanos::ZERO, &ring),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(scan, benches);
criterion_main!(scan);
