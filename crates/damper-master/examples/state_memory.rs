//! How much memory a master's state takes per (account, op): fills one
//! master with `--accounts N` accounts on one op, each reported over a whole
//! window (12 rounds of 2 s, so every window is full), and measures
//! the process's resident memory before and after.
//!
//! Run: `cargo run --release -p damper-master --example state_memory -- --accounts 1000000`.
//! The last line is `bytes_per_entry=N`. Linux only (reads /proc/self/statm).
//! `--estimator ably-mma` fills it under that estimator (whose every
//! window keeps its sub-intervals beside the entry) rather than the
//! default. `--name-len N` pads every account's name to `N` bytes (at
//! least the 15 of `account-0000000`): a master keeps names of up to 15
//! bytes inline in the pair's entry, of longer ones the first 10 bytes
//! there and the rest beside the entries.

// It reports wall time for the fill, by definition.
#![allow(clippy::disallowed_types)]

use std::sync::Arc;
use std::time::Duration;

use damper_core::config::MasterConfig;
use damper_core::time::{ManualClock, Nanos};
use damper_master::{Master, MasterOptions};
use damper_proto::v1::{AccountCounts, OpCounts, RollupRequest};

// The binary's allocator, so the memory is the binary's.
#[global_allocator]
static ALLOCATOR: damper_master::Allocator = damper_master::Allocator;

const PER_ROLLUP: usize = 10_000;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut accounts = 1_000_000usize;
    let mut name_len = 0usize;
    let mut estimator = "latest-round".to_string();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--accounts" => {
                accounts = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .unwrap_or_else(|| {
                        eprintln!("state_memory: --accounts takes a positive whole number");
                        std::process::exit(2)
                    })
            }
            "--name-len" => {
                name_len = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| (1..=damper_core::MAX_NAME_LEN).contains(n))
                    .unwrap_or_else(|| {
                        eprintln!(
                            "state_memory: --name-len takes a whole number from 1 to {}",
                            damper_core::MAX_NAME_LEN
                        );
                        std::process::exit(2)
                    })
            }
            "--estimator" => {
                estimator = args
                    .next()
                    .filter(|e| ["latest-round", "ably-mma"].contains(&e.as_str()))
                    .unwrap_or_else(|| {
                        eprintln!("state_memory: --estimator takes latest-round or ably-mma");
                        std::process::exit(2)
                    })
            }
            other => {
                eprintln!(
                    "state_memory: unknown argument {other:?}; usage: --accounts N [--name-len N] [--estimator latest-round|ably-mma]"
                );
                std::process::exit(2)
            }
        }
    }
    let names: Vec<String> = (0..accounts)
        .map(|i| {
            format!(
                "account-{i:0>width$}",
                width = name_len.saturating_sub(8).max(7)
            )
        })
        .collect();
    let config = MasterConfig::from_toml(&format!(
        "[window]\nestimator = \"{estimator}\"\n[limits]\nmessages = 1000"
    ))
    .unwrap();
    let t0 = 1_800_000_000_000u64;
    let clock = Arc::new(ManualClock::new(Nanos::from_millis(t0)));
    let mut options = MasterOptions::default();
    options.shards = 4;
    options.max_entries = PER_ROLLUP;
    options.idle_after = Some(Duration::from_secs(3600));
    // One agent brings every pair: past the defaults' caps (8 000 000
    // pairs, shared out by shard, and 250 000 new ones per agent and
    // round) the rest would not be tracked. Twice the pairs: the shards
    // do not get exactly a quarter each.
    options.max_pairs = options.max_pairs.max(2 * accounts);
    options.max_new_pairs_per_agent = accounts;
    let before = resident_bytes();
    let master = Master::with_clock(config.clone(), options, clock.clone());
    let began = std::time::Instant::now();
    for round in 1..=12u64 {
        let end = t0 + round * 2_000;
        clock.set(Nanos::from_millis(end + 5));
        for chunk in names.chunks(PER_ROLLUP) {
            let request = RollupRequest {
                agent_id: "memory".into(),
                interval_start_unix_ms: end - 2_000,
                interval_end_unix_ms: end,
                ring_version: 0,
                ops: vec![OpCounts {
                    op_costs: Vec::new(),
                    op_counts: Vec::new(),
                    attempted: Vec::new(),
                    ids: Vec::new(),
                    rejected: Vec::new(),
                    op: "messages".into(),
                    accounts: chunk
                        .iter()
                        .map(|a| AccountCounts {
                            op_cost: 0,
                            ops: 0,
                            id: 0,
                            account: a.clone(),
                            attempted: 100,
                            admitted: 100,
                            start_unix_ms: 0,
                        })
                        .collect(),
                }],
                ..Default::default()
            };
            master.rollup(&request).expect("a valid rollup");
        }
    }
    let after = resident_bytes();
    assert_eq!(master.len(), accounts);
    // A reload marks every pair's limit to be looked up again: one pass
    // over the entries, with ingest held shard by shard meanwhile.
    let reload = std::time::Instant::now();
    master.reload(config).expect("the same config reloads");
    eprintln!(
        "a reload took {:.1} ms",
        reload.elapsed().as_secs_f64() * 1e3
    );
    let entries = 12 * accounts as u64;
    eprintln!(
        "{accounts} (account, op) pairs, {entries} entries ingested in {:.1} s ({:.2} M entries/s, 4 shards, one thread); resident {:.1} MiB before, {:.1} MiB after",
        began.elapsed().as_secs_f64(),
        entries as f64 / began.elapsed().as_secs_f64() / 1e6,
        before as f64 / (1 << 20) as f64,
        after as f64 / (1 << 20) as f64,
    );
    println!(
        "bytes_per_entry={}",
        after.saturating_sub(before) / accounts as u64
    );
}
