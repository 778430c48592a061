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

use damper_agent::Agent;
use damper_core::config::MasterConfig;
use damper_master::{Master, MasterOptions};

fn main() {
    let keys: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("the number of keys"))
        .unwrap_or(200_000);
    let fast_onset = std::env::args().nth(2).as_deref() != Some("off");
    let keys: Vec<String> = (0..keys).map(|i| format!("account-{i:06}")).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let config = MasterConfig::from_toml("[limits]\ncalm = 1e15\nflood = 1\n").unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a loopback port");
    let address = listener.local_addr().unwrap().to_string();
    let master = Master::new(config, MasterOptions::default());
    runtime.spawn(damper_master::run(
        listener,
        master,
        std::future::pending::<()>(),
    ));
    let agent = {
        let _inside = runtime.enter();
        Agent::builder()
            .masters([address])
            .agent_id("scale")
            .fast_onset(fast_onset)
            .start()
            .expect("an agent")
    };
    let began = Instant::now();
    let ready = |k: &String| {
        agent.factor(k, "calm") == Some(0.0) && agent.factor(k, "flood").is_some_and(|f| f > 0.999)
    };
    let mut held = 0;
    while began.elapsed() < Duration::from_secs(60) {
        for k in &keys {
            agent.check(k, "calm", 1);
            agent.check(k, "flood", 1_000_000);
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
