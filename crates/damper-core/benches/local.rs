//! The local token buckets (`damper_core::local`), next to the account-wide
//! `check` and `governor`'s keyed limiter, over the same 100 000 `String`
//! keys in the same shuffled order. A publish runs a connection bucket, a
//! channel bucket and `check`, so the three costs add up.
//!
//! Groups:
//! - `local_take`: tokens are there (`reduce` takes one; `check` admits;
//!   governor allows).
//! - `local_deny`: the bucket is empty (`reduce` denies; `check` rejects at
//!   factor 1; governor denies).
//!
//! Run: `cargo bench -p damper-core --bench local`.

#![allow(missing_docs)]
// A benchmark measures wall time by definition.
#![allow(clippy::disallowed_types)]

use std::hint::black_box;
use std::time::Duration;

mod common;

use common::{KEYS, NOW, bench_check, bench_governor, damper, governor, keys, order};
use criterion::{Criterion, criterion_group, criterion_main};
use damper_core::local::{BucketConfig, TokenBuckets};

fn group(c: &mut Criterion, name: &str, take: bool) {
    let keys = keys("conn");
    let order = order(1);
    // Taking: a bucket that never runs dry within the run. Denying: one
    // token an hour, spent below.
    let config = if take {
        BucketConfig::new(u64::MAX / 2, 1, Duration::from_secs(1)).unwrap()
    } else {
        BucketConfig::new(1, 1, Duration::from_secs(3600)).unwrap()
    };
    let buckets: TokenBuckets<String> = TokenBuckets::new(config);
    for k in &keys {
        let _ = buckets.reduce(k.as_str(), 1, NOW);
    }
    let agent = damper(&keys, if take { 0.0 } else { 1.0 });
    let gov = governor(&keys, take);
    let mut g = c.benchmark_group(name);
    g.bench_function("token_buckets", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(buckets.reduce(keys[order[i]].as_str(), 1, NOW).is_taken())
        })
    });
    bench_check(&mut g, "check", &agent, &keys, &order);
    bench_governor(&mut g, &gov, &keys, &order);
    g.finish();
}

fn benches(c: &mut Criterion) {
    group(c, "local_take", true);
    group(c, "local_deny", false);
}

criterion_group! {
    name = local;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = benches
}
criterion_main!(local);
