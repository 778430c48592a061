//! What the `check` and `local` benchmarks share: the keys, the order they
//! are visited in, the instant they run at, the two limiters compared and
//! the single-thread loops over them.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::BenchmarkGroup;
use criterion::measurement::WallTime;
use damper_core::agent::{AgentConfig, AgentState};
use damper_core::time::Nanos;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Keys each limiter holds: enough that every call misses cache, as on a
/// node with many accounts.
pub const KEYS: usize = 100_000;
/// The op `check` is called with.
pub const OP: &str = "messages";
/// The `now` every call is given.
pub const NOW: Nanos = Nanos::from_secs(1_800_000_000);

/// `KEYS` distinct `String` keys, `{prefix}-NNNNNN`.
pub fn keys(prefix: &str) -> Vec<String> {
    (0..KEYS).map(|i| format!("{prefix}-{i:06}")).collect()
}

/// A shuffled visiting order, the same for every limiter compared.
pub fn order(seed: u64) -> Vec<usize> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..KEYS).collect();
    for i in (1..order.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// Damper's agent state with every key known and `factor` in force.
pub fn damper(keys: &[String], factor: f64) -> AgentState {
    let agent = AgentState::new(AgentConfig::default());
    for k in keys {
        // No local guard: the limit is far above anything the bench sends.
        agent.apply(NOW, k, OP, factor, 1e15, Duration::from_secs(3600));
    }
    agent
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

/// Adds `name`: `check` on one key after another, in `order`.
pub fn bench_check(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    agent: &AgentState,
    keys: &[String],
    order: &[usize],
) {
    g.bench_function(name, |b| {
        let mut rng = SmallRng::seed_from_u64(2);
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(agent.check(NOW, &keys[order[i]], OP, 1, &mut rng))
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
            i = (i + 1) % KEYS;
            black_box(gov.check_key(&keys[order[i]]).is_ok())
        })
    });
}
