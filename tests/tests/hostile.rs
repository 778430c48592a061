//! A hostile client on the master's gRPC port while a real agent floods an
//! account: rollups naming hundreds of thousands of made-up pairs, and
//! rollups and early reports claiming impossible deluges for an account
//! that is under its limit. The master's tracked pairs stay under
//! `max_pairs`, the flood stays held, the lies are refused with the field
//! named, and the victim is never suppressed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use damper_agent::Agent;
use damper_core::time::Clock;
use damper_load::Paced;
use damper_master::{Master, MasterOptions};
use damper_proto::v1::master_client::MasterClient;
use damper_proto::v1::{AccountCounts, FactorsRequest, OpAccounts, OpCounts, RollupRequest};
use damper_tests::quick_config;
use damper_tests::served::ServedMaster;

fn now_ms() -> u64 {
    damper_core::time::SystemClock.now().as_millis()
}

fn rollup(agent: &str, accounts: Vec<AccountCounts>) -> RollupRequest {
    let end = now_ms();
    RollupRequest {
        agent_id: agent.into(),
        interval_start_unix_ms: end - 500,
        interval_end_unix_ms: end,
        ops: vec![OpCounts {
            op_costs: Vec::new(),
            op_counts: Vec::new(),
            attempted: Vec::new(),
            ids: Vec::new(),
            rejected: Vec::new(),
            op: "messages".into(),
            accounts,
        }],
        ring_version: 0,
        ..Default::default()
    }
}

fn counts(account: String, attempted: u64) -> AccountCounts {
    AccountCounts {
        op_cost: 0,
        ops: 0,
        id: 0,
        account,
        attempted,
        admitted: attempted,
        start_unix_ms: 0,
    }
}

/// That `status` is a refusal with `code` whose message names `names`.
fn assert_refused(status: &tonic::Status, code: tonic::Code, names: &str) {
    assert_eq!(status.code(), code, "{}", status.message());
    assert!(status.message().contains(names), "{}", status.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_pairs_and_lies_neither_exhaust_the_master_nor_free_or_suppress_anyone() {
    let config = quick_config("[limits]\nmessages = 1000\n");
    let mut options = MasterOptions::default();
    options.max_pairs = 5_000;
    let served = ServedMaster::start(Master::new(config, options), None).await;
    let agent = Arc::new(
        Agent::builder()
            .masters([served.address.to_string()])
            .agent_id("honest")
            .rollup_interval(Duration::from_millis(500))
            .start()
            .unwrap(),
    );
    // 5 000 cost/s against 1 000/s, and a victim at a tenth of its limit.
    let admitted = Arc::new(AtomicU64::new(0));
    let victim_refused = Arc::new(AtomicU64::new(0));
    let traffic = Paced::start(Duration::from_millis(10), {
        let (agent, admitted, refused) = (agent.clone(), admitted.clone(), victim_refused.clone());
        move || {
            for _ in 0..10 {
                if agent.check("flood", "messages", 5).is_admit() {
                    admitted.fetch_add(5, Relaxed);
                }
            }
            if !agent.check("victim", "messages", 1).is_admit() {
                refused.fetch_add(1, Relaxed);
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(4)).await;

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", served.address))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut hostile = MasterClient::new(channel);
    let before = admitted.load(Relaxed);
    let attack_started = tokio::time::Instant::now();
    let mut lies_refused = 0;
    for batch in 0..200 {
        let names = (0..1_000)
            .map(|i| counts(format!("made-up-{batch}-{i}"), 1))
            .collect();
        hostile
            .rollup(rollup("hostile", names))
            .await
            .expect("made-up names are accepted, not tracked");
        let lie = hostile
            .rollup(rollup("hostile", vec![counts("victim".into(), u64::MAX)]))
            .await
            .unwrap_err();
        assert_eq!(lie.code(), tonic::Code::InvalidArgument);
        assert!(
            lie.message().contains("ops[0].accounts[0]")
                && lie.message().contains("max_claimed_rate")
        );
        let early = hostile
            .factors(FactorsRequest {
                agent_id: format!("hostile-{batch}"),
                ops: vec![OpAccounts {
                    op: "messages".into(),
                    accounts: vec!["victim".into()],
                    rates: vec![1e13],
                    baselines: vec![0.0],
                    surged: vec![true],
                    joined: vec![],
                    ..OpAccounts::default()
                }],
                surge_at_unix_ms: now_ms(),
            })
            .await
            .unwrap_err();
        assert_eq!(early.code(), tonic::Code::InvalidArgument);
        lies_refused += 2;
        // Account numbers the master never held, under a new agent run
        // each time: refused whole, nothing counted, nothing kept.
        let mut unknown = rollup("hostile", Vec::new());
        unknown.incarnation = batch;
        unknown.dictionary = 1;
        unknown.ops[0].ids = vec![7];
        unknown.ops[0].attempted = vec![1_000_000];
        unknown.ops[0].rejected = vec![0];
        assert_refused(
            &hostile.rollup(unknown.clone()).await.unwrap_err(),
            tonic::Code::FailedPrecondition,
            "ops[0].ids",
        );
        // Lists that do not line up, and a rejected cost above the attempted.
        unknown.ops[0].rejected = vec![];
        assert_refused(
            &hostile.rollup(unknown.clone()).await.unwrap_err(),
            tonic::Code::InvalidArgument,
            "rejected (0)",
        );
        unknown.ops[0].rejected = vec![2_000_000];
        assert_refused(
            &hostile.rollup(unknown).await.unwrap_err(),
            tonic::Code::InvalidArgument,
            "ops[0].rejected[0]",
        );
        lies_refused += 3;
    }
    let secs = attack_started.elapsed().as_secs_f64().max(1.0);
    // Let a few more rounds pass under the attack's aftermath.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let secs = secs + 2.0;
    let rate = (admitted.load(Relaxed) - before) as f64 / secs;
    traffic.stop();

    let tracked = served.master.len();
    eprintln!(
        "during the attack ({secs:.1} s): flood admitted {rate:.0}/s; {tracked} pairs tracked"
    );
    assert!(tracked <= 5_000, "tracked {tracked} pairs, max_pairs 5 000");
    assert_eq!(lies_refused, 1_000);
    // The honest agent's one dictionary: 16 of room for itself, numbers 0
    // to 2. The attack's 200 agent runs would hold 16 each.
    assert!(
        served.master.dictionary_ids() < 100,
        "the attack's numbers were kept: {}",
        served.master.dictionary_ids()
    );
    damper_testkit::assert_held("the flood during the attack", rate, 1_000.0, 0.15);
    assert_eq!(victim_refused.load(Relaxed), 0, "the victim was refused");
    assert_eq!(agent.peek("victim", "messages").factor, 0.0);
    drop(hostile);
    agent.shutdown().await;
    served.stop().await;
}
