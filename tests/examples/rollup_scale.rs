//! One agent holding many busy pairs, against one master on loopback, as
//! the `check` benchmark sets them up: how long until the master's factors
//! are in force for every pair, and how the rollups fared.
//!
//! Every key is checked on two ops (one limited far above its demand, one
//! flooded) once a second, until every pair has its factor (0 and about 1)
//! or a minute has passed. The master and the agent's rollup task share one
//! runtime thread, as in the benchmark.
//!
//! Run: `cargo run --release -p damper-tests --example rollup_scale -- 200000`
//! (the number of keys; pairs are twice that). A second argument `off`
//! turns fast onset off (no surge scans: rollups alone).

#![allow(clippy::disallowed_types)] // wall time, by definition

use std::time::{Duration, Instant};

// The benchmarks' set-up: the same master, agent and ops.
#[path = "../benches/common/mod.rs"]
mod common;

use common::{CALM, Damper, FLOOD};

fn main() {
    let keys: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("the number of keys"))
        .unwrap_or(200_000);
    let fast_onset = std::env::args().nth(2).as_deref() != Some("off");
    let keys = common::keys_n("account", keys);
    let damper = Damper::start(fast_onset, None);
    let agent = &damper.agent;
    let began = Instant::now();
    let ready = |k: &String| {
        agent.factor(k, CALM) == Some(0.0) && agent.factor(k, FLOOD).is_some_and(|f| f > 0.999)
    };
    let mut held = 0;
    while began.elapsed() < Duration::from_secs(60) {
        for k in &keys {
            agent.check(k, CALM, 1);
            agent.check(k, FLOOD, 1_000_000);
        }
        std::thread::sleep(Duration::from_secs(1));
        held = keys.iter().filter(|k| ready(k)).count();
        let s = agent.stats();
        println!(
            "{:5.1} s: {held} of {} keys with both factors; rollups {} answered, {} failed; latency p50 {:?}, p99 {:?}",
            began.elapsed().as_secs_f64(),
            keys.len(),
            s.rollups_sent,
            s.rollups_failed,
            s.rollup_latency.quantile(0.5),
            s.rollup_latency.quantile(0.99),
        );
        if held == keys.len() {
            break;
        }
    }
    println!(
        "{} keys: {} with both factors after {:.1} s",
        keys.len(),
        held,
        began.elapsed().as_secs_f64()
    );
}
