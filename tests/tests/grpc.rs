//! The loop over real gRPC on loopback: two masters served in-process on
//! `127.0.0.1:0`, four agents, traffic from `damper-load`'s driver, at the
//! production time scale (2 s rollups, 4 × 6 s sub-intervals).

use std::sync::Arc;
use std::time::Duration;

use damper_agent::Agent;
use damper_core::config::MasterConfig;
use damper_load::{Traffic, drive_seconds};
use damper_master::{Master, MasterOptions};
use damper_tests::assert_held;
use damper_tests::served::ServedMaster;

const LIMIT: f64 = 2_000.0;

struct Cluster {
    agents: Vec<Arc<Agent>>,
    masters: Vec<ServedMaster>,
}

async fn cluster(masters: usize, agents: usize) -> Cluster {
    let config = MasterConfig::from_toml(&format!(
        "[limits]\nmessages = {LIMIT}\n\"messages/calm\" = {LIMIT}\n"
    ))
    .unwrap();
    let mut served = Vec::new();
    for _ in 0..masters {
        let master = Master::new(config.clone(), MasterOptions::default());
        served.push(ServedMaster::start(master, None).await);
    }
    let addresses: Vec<String> = served.iter().map(|m| m.address.to_string()).collect();
    let agents = (0..agents)
        .map(|i| {
            Arc::new(
                Agent::builder()
                    .masters(addresses.iter().cloned())
                    .agent_id(format!("e2e-{i}"))
                    .start()
                    .unwrap(),
            )
        })
        .collect();
    Cluster {
        agents,
        masters: served,
    }
}

impl Cluster {
    async fn stop(self) {
        for agent in &self.agents {
            agent.shutdown().await;
        }
        for master in self.masters {
            master.stop().await;
        }
    }
}

fn traffic(flood_rate: f64) -> Vec<Traffic> {
    vec![
        // 10 × the limit.
        Traffic {
            account: "flood".into(),
            op: "messages".into(),
            rate: flood_rate,
            cost: 1,
        },
        // Half its limit, on the same agents.
        Traffic {
            account: "calm".into(),
            op: "messages".into(),
            rate: LIMIT / 2.0,
            cost: 1,
        },
        // An op with no limit configured.
        Traffic {
            account: "flood".into(),
            op: "presence".into(),
            rate: 3_000.0,
            cost: 1,
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_is_held_at_its_limit_and_released_when_it_stops() {
    let cluster = cluster(2, 4).await;

    // Phase 1: the flood, 22 s.
    let flood = drive_seconds(
        &cluster.agents,
        &traffic(10.0 * LIMIT),
        Duration::from_secs(22),
    )
    .await;
    let per_sec: Vec<u64> = flood.iter().map(|s| s[0].admitted).collect();
    eprintln!("flood admitted per second: {per_sec:?}");
    // Held at the limit ±10%, over every 6 s window from 10 s on.
    for start in 10..=flood.len() - 6 {
        let admitted: u64 = flood[start..start + 6].iter().map(|s| s[0].admitted).sum();
        let rate = admitted as f64 / 6.0;
        assert_held(&format!("6 s from {start} s"), rate, LIMIT, 0.1);
    }
    for (t, second) in flood.iter().enumerate() {
        assert_eq!(
            second[1].admitted, second[1].attempted,
            "calm rejected at {t} s"
        );
        assert_eq!(
            second[2].admitted, second[2].attempted,
            "unlimited op rejected at {t} s"
        );
    }

    // Phase 2: the flood stops (a quarter of the limit goes on). Its factor
    // must return to 0 on every agent within one window (24 s).
    let quiet = drive_seconds(
        &cluster.agents,
        &traffic(LIMIT / 4.0),
        Duration::from_secs(26),
    )
    .await;
    let released_at = quiet
        .iter()
        .position(|s| s[0].admitted == s[0].attempted)
        .expect("released");
    eprintln!("released after {} s", released_at + 1);
    assert!(
        released_at < 24,
        "still rejecting {released_at} s after the flood stopped"
    );
    // And it stays released: nothing rejected from then on.
    for (t, second) in quiet.iter().enumerate().skip(released_at) {
        assert_eq!(
            second[0].admitted, second[0].attempted,
            "rejected again at {t} s"
        );
    }
    for agent in &cluster.agents {
        assert_eq!(
            agent.factor("flood", "messages"),
            Some(0.0),
            "{}",
            agent.id()
        );
    }
    cluster.stop().await;
}
