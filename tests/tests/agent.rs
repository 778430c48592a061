//! The agent library against a real master over gRPC on loopback, at a
//! tenth of the production time scale.

use std::time::Duration;

use damper_agent::Agent;
use damper_core::config::MasterConfig;
use damper_master::{Master, MasterOptions};
use damper_tests::served::ServedMaster;

/// A master on loopback with 200 ms rollups (time scaled down ten times).
async fn master(limits: &str) -> ServedMaster {
    let config = MasterConfig::from_toml(&format!(
        "[window]\nsub_interval_ms = 600\nrollup_interval_ms = 200\ngrace_ms = 100\n[limits]\n{limits}"
    ))
    .unwrap();
    ServedMaster::start(Master::new(config, MasterOptions::default()), None).await
}

fn agent(master: &str) -> Agent {
    Agent::builder()
        .masters([master])
        .rollup_interval(Duration::from_millis(200))
        .request_timeout(Duration::from_millis(150))
        .agent_id("test-agent")
        .start()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_gets_a_factor_over_grpc_and_shutdown_flushes() {
    let served = master("messages = 1000").await;
    let agent = agent(&served.address.to_string());
    // 10 000 cost/s for up to 5 s, in 10 ms steps, until the master's
    // factor reaches the agent.
    let mut factor = 0.0;
    for _ in 0..500 {
        for _ in 0..100 {
            agent.check("flood", "messages", 1);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        factor = agent.factor("flood", "messages").unwrap_or(0.0);
        if factor > 0.8 {
            break;
        }
    }
    assert!(factor > 0.8, "factor {factor}");
    // A count made just before shutdown reaches the master.
    agent.check("last-words", "messages", 7);
    agent.shutdown().await;
    assert_eq!(served.master.factor("last-words", "messages"), Some(0.0));
    assert!(served.master.len() >= 2);
    served.stop().await;
}
