//! Whether forgetting many idle pairs stalls ingest: fills a master with
//! `N` pairs (default 1 000 000), lets them all go idle, then evicts them
//! while another thread ingests small rollups of live accounts as fast as
//! it can, and reports the slowest of those rollups and how long the
//! eviction took.
//!
//! Run: `cargo run --release -p damper-master --example evict_stall -- [N]`.
//! The last line is `max_ingest_stall_ms=… evict_ms=… evicted=…`.

// It reports wall time, by definition.
#![allow(clippy::disallowed_types)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use damper_core::config::MasterConfig;
use damper_core::time::{ManualClock, Nanos};
use damper_master::{Master, MasterOptions};
use damper_proto::v1::{AccountCounts, OpCounts, RollupRequest};

const T0_MS: u64 = 1_800_000_000_000;

fn rollup(end_ms: u64, accounts: impl Iterator<Item = String>) -> RollupRequest {
    RollupRequest {
        agent_id: "evict-stall".into(),
        interval_start_unix_ms: end_ms - 2_000,
        interval_end_unix_ms: end_ms,
        ops: vec![OpCounts {
            op_costs: Vec::new(),
            op_counts: Vec::new(),
            attempted: Vec::new(),
            ids: Vec::new(),
            rejected: Vec::new(),
            op: "messages".into(),
            accounts: accounts
                .map(|account| AccountCounts {
                    op_cost: 0,
                    ops: 0,
                    id: 0,
                    account,
                    attempted: 10,
                    admitted: 10,
                    start_unix_ms: 0,
                })
                .collect(),
        }],
        ring_version: 0,
        ..Default::default()
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |s| s.parse().expect("N"));
    let clock = Arc::new(ManualClock::new(Nanos::from_millis(T0_MS + 5)));
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let master = Master::with_clock(config, MasterOptions::default(), clock.clone());
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        master
            .rollup(&rollup(T0_MS, chunk.iter().map(|i| format!("idle-{i:07}"))))
            .unwrap();
    }
    assert_eq!(master.len(), n);
    // Every pair idle: past the default idle time (three windows, 72 s).
    clock.advance(Duration::from_secs(100));
    let now_ms = T0_MS + 100_000;
    let live = master.rollup(&rollup(now_ms, (0..100).map(|i| format!("live-{i}"))));
    assert!(live.is_ok());

    let done = Arc::new(AtomicBool::new(false));
    let ingest = std::thread::spawn({
        let (master, done) = (master.clone(), done.clone());
        move || {
            // When each rollup started, and how long it took.
            let mut times = Vec::new();
            while !done.load(Relaxed) {
                let started = Instant::now();
                master
                    .rollup(&rollup(now_ms, (0..100).map(|i| format!("live-{i}"))))
                    .unwrap();
                times.push((started, started.elapsed()));
            }
            times
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let evicted = master.evict_idle();
    let evict = started.elapsed();
    let ended = Instant::now();
    std::thread::sleep(Duration::from_millis(50));
    done.store(true, Relaxed);
    let times = ingest.join().unwrap();
    let worst = |during: bool| {
        times
            .iter()
            .filter(|(at, took)| (*at + *took >= started && *at <= ended) == during)
            .map(|(_, took)| *took)
            .max()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3
    };
    println!(
        "pairs={n} shards={} rollups={} (without eviction: slowest {:.2} ms)",
        MasterOptions::default().shards,
        times.len(),
        worst(false)
    );
    println!(
        "max_ingest_stall_ms={:.2} evict_ms={:.1} evicted={evicted}",
        worst(true),
        evict.as_secs_f64() * 1e3
    );
}
