//! Master loss, for real: three `damper-master` processes, agents in this
//! process, a 10× flood on an account, and `kill -9` of the master that owns
//! it. Production timing (2 s rollups, 4 × 6 s window).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::MasterProcess;
use damper_agent::Agent;
use damper_core::ring::Ring;
use damper_load::{Tally, Traffic, drive_seconds};

const LIMIT: u64 = 2_000;

/// Starts a master on `listen` and waits until it serves.
fn start_master(listen: &str, config: &std::path::Path) -> MasterProcess {
    MasterProcess::start(listen, &["--config".as_ref(), config.as_os_str()])
}

fn six_second_rates(seconds: &[Vec<Tally>], item: usize) -> Vec<f64> {
    seconds
        .windows(6)
        .map(|w| w.iter().map(|s| s[item].admitted).sum::<u64>() as f64 / 6.0)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_s_accounts_are_held_again_within_seconds_and_move_back_within_seconds_without_a_burst()
 {
    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-failover-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let config = dir.join("master.toml");
    std::fs::write(&config, format!("[limits]\nmessages = {LIMIT}\n")).unwrap();

    let mut masters: Vec<MasterProcess> = (0..3)
        .map(|_| start_master("127.0.0.1:0", &config))
        .collect();
    let addresses: Vec<String> = masters.iter().map(|m| m.address.clone()).collect();
    let owner = Ring::new(&addresses).owner("flood").unwrap().to_string();
    let victim = addresses.iter().position(|a| *a == owner).unwrap();
    let calm_owner = Ring::new(&addresses).owner("calm").unwrap().to_string();
    eprintln!("masters {addresses:?}; flood on {owner}; calm on {calm_owner}");

    let agents: Vec<Arc<Agent>> = (0..4)
        .map(|i| {
            Arc::new(
                Agent::builder()
                    .masters(addresses.iter().cloned())
                    .agent_id(format!("failover-{i}"))
                    .start()
                    .unwrap(),
            )
        })
        .collect();
    let traffic = vec![
        Traffic {
            account: "flood".into(),
            op: "messages".into(),
            rate: 10.0 * LIMIT as f64,
            cost: 1,
        },
        Traffic {
            account: "calm".into(),
            op: "messages".into(),
            rate: LIMIT as f64 / 2.0,
            cost: 1,
        },
    ];

    // Held before the fault.
    let before = drive_seconds(&agents, &traffic, Duration::from_secs(14)).await;
    let held = six_second_rates(&before[8..], 0);
    assert!(
        held.iter()
            .all(|r| (*r - LIMIT as f64).abs() <= 0.1 * LIMIT as f64),
        "before: {held:?}"
    );

    // kill -9 the flood's master.
    masters[victim].child.kill().unwrap();
    masters[victim].child.wait().unwrap();
    let after_kill = drive_seconds(&agents, &traffic, Duration::from_secs(24)).await;
    let per_sec: Vec<u64> = after_kill.iter().map(|s| s[0].admitted).collect();
    eprintln!("after kill -9, admitted per second: {per_sec:?}");
    // The agents' connections are refused: the master leaves their rings
    // at once and the counts go to the next owner in the same round. What
    // some agents delivered to it just before it died is lost with it, so
    // the next owner's first round may see part of the demand: up to two
    // rounds above the limit (4 s; 1 s in most runs), hence 6 s here.
    assert!(
        per_sec[6..]
            .iter()
            .all(|&a| (a as f64 - LIMIT as f64).abs() <= 0.15 * LIMIT as f64),
        "not held again within 6 s of the kill: {per_sec:?}"
    );

    // Restart it on the same address: its accounts move back, every agent
    // at the same instant, 1.5 s after it started on the 200-ms grid, and
    // each agent's join tells it the flood's rate then.
    let restarted = start_master(&owner, &config);
    let restarted_at = tokio::time::Instant::now();
    masters[victim] = restarted;
    let driving = {
        let (agents, traffic) = (agents.clone(), traffic.clone());
        tokio::spawn(async move { drive_seconds(&agents, &traffic, Duration::from_secs(30)).await })
    };
    let moved_back = loop {
        let (_, accounts) = masters[victim].get("/v1/accounts");
        if accounts.contains("\"flood\"") {
            break restarted_at.elapsed();
        }
        assert!(
            restarted_at.elapsed() < Duration::from_secs(20),
            "the flood never moved back: {accounts}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("the flood's counts reached the restarted master {moved_back:?} after its start");
    assert!(
        moved_back < Duration::from_secs(8),
        "moved back only after {moved_back:?}"
    );
    let after_restart = driving.await.unwrap();
    let per_sec: Vec<u64> = after_restart.iter().map(|s| s[0].admitted).collect();
    eprintln!("after restart, admitted per second: {per_sec:?}");
    let peak = six_second_rates(&after_restart, 0)
        .into_iter()
        .fold(0.0, f64::max);
    assert!(
        peak <= 1.25 * LIMIT as f64,
        "a burst through when accounts moved back: {peak}/s over 6 s"
    );

    // No check ever blocked: the driver kept its pace, every second, and the
    // well-behaved account was never rejected.
    for (phase, seconds) in [
        ("before", &before),
        ("kill", &after_kill),
        ("restart", &after_restart),
    ] {
        for (t, s) in seconds.iter().enumerate() {
            let attempted = s[0].attempted as f64;
            assert!(
                attempted >= 0.9 * 10.0 * LIMIT as f64,
                "{phase} {t} s: only {attempted} attempted"
            );
            assert_eq!(
                s[1].admitted, s[1].attempted,
                "{phase} {t} s: calm rejected"
            );
        }
    }
    for agent in &agents {
        agent.shutdown().await;
    }
    drop(masters);
}
