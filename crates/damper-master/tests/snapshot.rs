//! Restart without amnesia, for real: a `damper-master` process with
//! `--snapshot` holds a flood, is stopped with SIGTERM, restarts, and answers
//! the flood's factor at once; a corrupt snapshot is ignored with a warning.
//!
//! The config uses the `ably-mma` estimator, which averages the settled
//! sub-intervals of a 24 s window: it is the estimator that a restart hurts
//! most (without the snapshot the window takes 24 s to fill again), and its
//! slow release gives the test seconds of margin on a loaded machine.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::MasterProcess;
use damper_agent::Agent;
use damper_load::{Traffic, drive_seconds};
use damper_proto::v1::master_client::MasterClient;
use damper_proto::v1::{FactorsRequest, OpAccounts};

const LIMIT: u64 = 1_000;

/// The factor the master at `address` has for the flood now, asked over
/// gRPC without reporting anything.
async fn factor(address: &str) -> f64 {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .expect("the master serves");
    let mut client = MasterClient::new(channel);
    let reply = client
        .factors(FactorsRequest {
            agent_id: "snapshot-test".into(),
            ops: vec![OpAccounts {
                op: "messages".into(),
                accounts: vec!["flood".into()],
                ..OpAccounts::default()
            }],
            ..FactorsRequest::default()
        })
        .await
        .expect("factors answers")
        .into_inner();
    // Listed when it differs from the op's default verdict (factor 0 under
    // `unlisted_limit`); implied otherwise.
    let messages = &reply.ops[0];
    match messages.accounts.iter().find(|f| f.account == "flood") {
        Some(f) => f.factor,
        None => {
            assert!(messages.unlisted_limit > 0.0, "{reply:?}");
            0.0
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_with_its_snapshot_holds_the_flood_at_once() {
    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-snapshot-e2e-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let config = dir.join("master.toml");
    std::fs::write(
        &config,
        format!("[window]\nestimator = \"ably-mma\"\n[limits]\nmessages = {LIMIT}\n"),
    )
    .unwrap();
    let snapshot = dir.join("windows.json");
    let args = [
        "--config".as_ref(),
        config.as_os_str(),
        "--snapshot".as_ref(),
        snapshot.as_os_str(),
    ];
    let master = MasterProcess::start("127.0.0.1:0", &args);
    let address = master.address.clone();

    // A 10× flood for 14 s.
    let agent = Arc::new(
        Agent::builder()
            .masters([address.clone()])
            .agent_id("snapshot-e2e")
            .start()
            .unwrap(),
    );
    let flood = Traffic {
        account: "flood".into(),
        op: "messages".into(),
        rate: 10.0 * LIMIT as f64,
        cost: 1,
    };
    drive_seconds(
        std::slice::from_ref(&agent),
        &[flood],
        Duration::from_secs(14),
    )
    .await;
    agent.shutdown().await;
    let before = factor(&address).await;
    assert!(
        before > 0.5,
        "the flood is suppressed before the restart: {before}"
    );

    // SIGTERM: the master writes its windows and exits cleanly.
    assert!(master.terminate(), "exits successfully on SIGTERM");
    assert!(snapshot.exists());
    eprintln!("factor before the restart: {before}");

    // Restarted on the same address: it answers from the snapshot.
    let restarted = MasterProcess::start(&address, &args);
    let after = factor(&address).await;
    eprintln!("factor right after the restart: {after}");
    let logged = restarted.logged().join("\n");
    assert!(logged.contains("windows restored"), "{logged}");
    assert!(
        after > 0.5 && (after - before).abs() < 0.15,
        "after the restart: {after}, before: {before}"
    );
    assert!(restarted.terminate());

    // A corrupt snapshot: a warning, an empty start, no crash.
    std::fs::write(&snapshot, b"{\"format\":1,\"keys\":[").unwrap();
    let fresh = MasterProcess::start(&address, &args);
    assert_eq!(factor(&address).await, 0.0, "nothing loaded from garbage");
    let logged = fresh.logged().join("\n");
    assert!(logged.contains("ignoring the snapshot"), "{logged}");
    assert!(fresh.terminate());
}
