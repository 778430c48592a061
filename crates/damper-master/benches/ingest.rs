//! The master's ingest path, in-process: rollups of 1 000 entries into a
//! master already tracking 1 000 000 (account, op) keys, on one shard (so
//! the figure is per core), and the cost of encoding the reply.
//!
//! Groups (criterion reports entries per second):
//! - `ingest/rollup_1000_entries`: `Master::rollup_taking_names` on a
//!   decoded request, as the service calls it: validation, grouping by
//!   shard, window updates, verdicts, the reply.
//! - `ingest/rollup_bytes_1000_entries`: the same from wire bytes
//!   (`Master::rollup_bytes`: protobuf decoding included).
//! - `ingest/rollup_bytes_by_number_1000_entries`: the same rollups with
//!   every account given by its number in the agent's dictionary, as a
//!   steady round sends them (`damper_core::wire::dictionary`).
//! - `ingest/encode_reply`: encoding the reply of such a rollup (the tenth
//!   of its pairs that are over their limit are listed; the others are
//!   implied by the op's `unlisted_limit`).
//!
//! Run: `cargo bench -p damper-master --bench ingest`.

#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use damper_core::config::MasterConfig;
use damper_core::time::{ManualClock, Nanos};
use damper_master::{Master, MasterOptions};
use damper_proto::v1::{AccountCounts, OpCounts, RollupRequest};
use prost::Message;

// The binary's allocator, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: damper_master::Allocator = damper_master::Allocator;

const KEYS: usize = 1_000_000;
const PER_ROLLUP: usize = 1_000;
const T0_MS: u64 = 1_800_000_000_000;

fn rollup(first: usize, end_ms: u64) -> RollupRequest {
    RollupRequest {
        dictionary: 0,
        agent_id: "bench".into(),
        interval_start_unix_ms: end_ms - 2_000,
        interval_end_unix_ms: end_ms,
        ring_version: 0,
        incarnation: 0,
        sequence: 0,
        ops: vec![OpCounts {
            op_costs: Vec::new(),
            op_counts: Vec::new(),
            attempted: Vec::new(),
            ids: Vec::new(),
            rejected: Vec::new(),
            op: "messages".into(),
            accounts: (first..first + PER_ROLLUP)
                .map(|i| AccountCounts {
                    op_cost: 0,
                    ops: 0,
                    id: 0,
                    account: format!("account-{:07}", i % KEYS),
                    // Every tenth account over its limit, so replies carry factors.
                    attempted: if i % 10 == 0 { 8_000 } else { 200 },
                    admitted: if i % 10 == 0 { 8_000 } else { 200 },
                    start_unix_ms: 0,
                })
                .collect(),
        }],
    }
}

/// [`rollup`] with each account given by its number (`i + 1`) in the
/// dictionary of epoch 1 that the setup's rollups defined.
fn by_number(first: usize, end_ms: u64) -> RollupRequest {
    let mut request = rollup(first, end_ms);
    request.dictionary = 1;
    let named = std::mem::take(&mut request.ops[0].accounts);
    let mut entries: Vec<(u32, u64)> = (first..first + PER_ROLLUP)
        .zip(named)
        .map(|(i, c)| ((i % KEYS) as u32 + 1, c.attempted))
        .collect();
    entries.sort_unstable();
    let mut before = 0;
    let op = &mut request.ops[0];
    for (id, attempted) in entries {
        op.ids.push(id - before);
        before = id;
        op.attempted.push(attempted);
        op.rejected.push(0);
    }
    request
}

fn benches(c: &mut Criterion) {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let clock = Arc::new(ManualClock::new(Nanos::from_millis(T0_MS + 5)));
    let mut options = MasterOptions::default();
    options.shards = 1;
    options.max_entries = PER_ROLLUP;
    // One agent brings every pair: its budget of new pairs per round
    // (250 000 by default, against a hostile agent) would cut the setup
    // short.
    options.max_new_pairs_per_agent = KEYS;
    let master = Master::with_clock(config, options, clock.clone());
    // Two rounds before the measured one, so the benchmark sees a master in
    // its steady state rather than every pair's first round (where every
    // verdict is listed in the reply, for a recheck).
    for round_end in [T0_MS - 2_000, T0_MS] {
        clock.set(Nanos::from_millis(round_end + 5));
        for first in (0..KEYS).step_by(PER_ROLLUP) {
            // Naming each account with its number, as an agent's first
            // rounds at a master do.
            let mut defining = rollup(first, round_end);
            defining.dictionary = 1;
            for (i, c) in defining.ops[0].accounts.iter_mut().enumerate() {
                c.id = ((first + i) % KEYS) as u32 + 1;
            }
            master.rollup(&defining).unwrap();
        }
    }
    clock.set(Nanos::from_millis(T0_MS + 2_005));
    assert_eq!(master.len(), KEYS);
    // A pool of requests over all keys, visited in turn.
    let requests: Vec<RollupRequest> = (0..KEYS)
        .step_by(PER_ROLLUP)
        .map(|first| rollup((first * 7919) % KEYS, T0_MS + 2_000))
        .collect();
    let encoded: Vec<Vec<u8>> = requests.iter().map(Message::encode_to_vec).collect();
    let numbered: Vec<Vec<u8>> = (0..KEYS)
        .step_by(PER_ROLLUP)
        .map(|first| by_number((first * 7919) % KEYS, T0_MS + 2_000).encode_to_vec())
        .collect();
    eprintln!("the same by number: {} bytes", numbered[0].len());
    let reply = master.rollup(&requests[0]).unwrap();
    eprintln!(
        "a 1 000-entry rollup: {} bytes; its reply: {} bytes carrying {} factors",
        encoded[0].len(),
        reply.encoded_len(),
        reply.ops.iter().map(|o| o.accounts.len()).sum::<usize>()
    );

    // As the service holds them once decoded.
    let rollups: Vec<damper_core::wire::Rollup> =
        requests.iter().cloned().map(Into::into).collect();
    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements(PER_ROLLUP as u64));
    g.bench_function("rollup_1000_entries", |b| {
        let mut i = 0;
        b.iter_batched_ref(
            || {
                // Copying the request is not part of the measurement.
                i = (i + 1) % rollups.len();
                rollups[i].clone()
            },
            |rollup| black_box(master.answer(rollup).unwrap()),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("rollup_bytes_1000_entries", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % encoded.len();
            black_box(master.rollup_bytes(&encoded[i]).unwrap())
        })
    });
    g.bench_function("rollup_bytes_by_number_1000_entries", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % numbered.len();
            black_box(master.rollup_bytes(&numbered[i]).unwrap())
        })
    });
    g.bench_function("encode_reply", |b| {
        b.iter(|| black_box(reply.encode_to_vec()))
    });
    g.finish();
}

criterion_group! {
    name = ingest;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = benches
}
criterion_main!(ingest);
