//! The local token buckets (`damper_agent::local`), next to the account-wide
//! `Agent::check` and `governor`'s keyed limiter, over the same 100 000 `String`
//! keys in the same shuffled order. A publish runs a connection bucket, a
//! channel bucket and `check`, so the three costs add up.
//!
//! Groups:
//! - `local_take`: tokens are there (`reduce` takes one; `check` admits;
//!   governor allows).
//! - `local_deny`: the bucket is empty (`reduce` denies; `check` rejects at
//!   factor 1; governor denies).
//!
//! Run: `cargo bench -p damper-tests --bench local`.

#![allow(missing_docs)]
// A benchmark measures wall time by definition.
#![allow(clippy::disallowed_types)]

use std::hint::black_box;
use std::time::Duration;

mod common;

use common::{Damper, KEYS, bench_check, bench_governor, governor, order};
use criterion::{Criterion, criterion_group, criterion_main};
use damper_agent::local::{BucketConfig, TokenBuckets};

fn group(c: &mut Criterion, damper: &Damper, keys: &[String], name: &str, take: bool) {
    let order = order(1);
    // The instant the buckets are given, as a node gives the agent's clock.
    let now = damper.agent.now();
    // Taking: a bucket that never runs dry within the run. Denying: one
    // token an hour, spent below.
    let config = if take {
        BucketConfig::new(u64::MAX / 2, 1, Duration::from_secs(1)).unwrap()
    } else {
        BucketConfig::new(1, 1, Duration::from_secs(3600)).unwrap()
    };
    let buckets: TokenBuckets<String> = TokenBuckets::new(config);
    for k in keys {
        let _ = buckets.reduce(k.as_str(), 1, now);
    }
    if !take {
        damper.flood(keys);
    }
    let gov = governor(keys, take);
    let mut g = c.benchmark_group(name);
    g.bench_function("token_buckets", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(buckets.reduce(keys[order[i]].as_str(), 1, now).is_taken())
        })
    });
    bench_check(&mut g, "check", &damper.agent, take, keys, &order);
    bench_governor(&mut g, &gov, keys, &order);
    g.finish();
}

fn benches(c: &mut Criterion) {
    let keys = common::keys("conn");
    let damper = common::damper(&keys);
    group(c, &damper, &keys, "local_take", true);
    group(c, &damper, &keys, "local_deny", false);
}

criterion_group! {
    name = local;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = benches
}
criterion_main!(local);
