//! The short soak (the long one is `tests/soak.sh`): 200 agents against 3
//! masters on loopback for 30 s, 2 000 accounts each sent through 4 agents,
//! plus one account flooding at 10× its limit. Production timing (2 s
//! rollups).
//!
//! What must hold: no rollup fails and no count is dropped; every unit of
//! cost the agents counted reaches a master exactly once; state stays
//! proportional to the accounts (no growth over time); the flood is held.

use std::sync::Arc;
use std::time::Duration;

use damper_agent::{Agent, AgentStats};
use damper_core::config::MasterConfig;
use damper_load::{Traffic, drive_spread, expand};
use damper_master::{Master, MasterOptions};
use damper_tests::assert_held;
use damper_tests::served::ServedMaster;

const AGENTS: usize = 200;
const ACCOUNTS: usize = 2_000;
const LIMIT: f64 = 1_000.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_agents_three_masters_thirty_seconds() {
    let config = MasterConfig::from_toml(&format!("[limits]\nmessages = {LIMIT}\n")).unwrap();
    let mut served = Vec::new();
    for _ in 0..3 {
        let master = Master::new(config.clone(), MasterOptions::default());
        served.push(ServedMaster::start(master, None).await);
    }
    let addresses: Vec<String> = served.iter().map(|m| m.address.to_string()).collect();
    let masters: Vec<Master> = served.iter().map(|m| m.master.clone()).collect();
    let agents: Vec<Arc<Agent>> = (0..AGENTS)
        .map(|i| {
            Arc::new(
                Agent::builder()
                    .masters(addresses.iter().cloned())
                    .agent_id(format!("soak-{i}"))
                    .start()
                    .unwrap(),
            )
        })
        .collect();
    let items: Vec<Traffic> = ["acct-{i}:messages:1", "flood:messages:10000"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let traffic = expand(&items, ACCOUNTS);

    let tracked = |masters: &[Master]| masters.iter().map(Master::len).sum::<usize>();
    let run = |secs| {
        let (agents, traffic) = (agents.clone(), traffic.clone());
        tokio::task::spawn_blocking(move || {
            let mut flood_admitted = Vec::new();
            let totals = drive_spread(&agents, &traffic, 4, Duration::from_secs(secs), |_, t| {
                flood_admitted.push(t.last().unwrap().admitted)
            });
            (totals, flood_admitted)
        })
    };
    let (first, _) = run(15).await.unwrap();
    let tracked_mid = tracked(&masters);
    let (second, flood) = run(15).await.unwrap();
    let tracked_end = tracked(&masters);
    for agent in &agents {
        agent.shutdown().await;
    }

    let stats: AgentStats = agents.iter().map(|a| a.stats()).sum();
    eprintln!("agents: {stats:?}; tracked at 15 s: {tracked_mid}, at 30 s: {tracked_end}");
    assert_eq!(stats.rollups_failed, 0, "{stats:?}");
    assert_eq!(stats.dropped_cost, 0, "{stats:?}");
    assert!(stats.rollups_sent >= (AGENTS * 10) as u64, "{stats:?}");

    // Every unit counted reached a master exactly once.
    let attempted: u64 = first.iter().chain(&second).map(|t| t.attempted).sum();
    let admitted: u64 = first.iter().chain(&second).map(|t| t.admitted).sum();
    let ingested = masters
        .iter()
        .map(Master::ingested)
        .fold((0, 0), |(a, b), i| (a + i.attempted, b + i.admitted));
    assert_eq!(ingested, (attempted, admitted));
    // And the agents' own tally of what they sent is the masters' of what
    // they took.
    let (rollups, entries) = masters
        .iter()
        .map(Master::ingested)
        .fold((0, 0), |(r, e), i| (r + i.rollups, e + i.entries));
    assert_eq!((stats.rollups_sent, stats.entries_sent), (rollups, entries));
    assert_eq!(stats.rollup_latency.count(), stats.rollups_sent);
    assert!(stats.bytes_sent > 0 && stats.bytes_received > 0);

    // State is per active (account, op), not growing with time.
    assert!(
        tracked_mid >= ACCOUNTS && tracked_end <= ACCOUNTS + 1,
        "{tracked_mid} {tracked_end}"
    );

    // The flood is held near its limit over the last 10 s; every other
    // account, under its limit, was never suppressed.
    let held = flood[flood.len() - 10..].iter().sum::<u64>() as f64 / 10.0;
    assert_held("the flood over the last 10 s", held, LIMIT, 0.2);
    for (t, total) in traffic.iter().zip(first.iter().zip(&second)) {
        if t.account != "flood" {
            assert_eq!(
                total.0.admitted, total.0.attempted,
                "{} suppressed",
                t.account
            );
            assert_eq!(
                total.1.admitted, total.1.attempted,
                "{} suppressed",
                t.account
            );
        }
    }
    for master in served {
        master.stop().await;
    }
}
