//! The events stream, with a real SSE client: `curl -N` follows
//! `GET /v1/events` of a `damper-master` process while two agents ramp one
//! account from 0.5× its limit to 3× and back down to 0.2×. Production
//! timing (2 s rollups), so it takes about 30 s.
//!
//! What must hold: curl receives, in this order, `near_limit`,
//! `suppression_started`, `suppression_ended` and `near_limit_ended` for
//! the account, each with its number, JSON data naming it, and nothing for
//! the calm account it filtered out; reconnecting with `Last-Event-ID`
//! replays what came after; a bad filter is a 400 naming it; and the master
//! stops at once with a stream open.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::MasterProcess;
use damper_agent::Agent;
use damper_load::{Traffic, drive_seconds};

const LIMIT: f64 = 1_000.0;

fn curl_available() -> bool {
    Command::new("curl")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The SSE records in `body`: (id, event, data) for each.
fn records(body: &str) -> Vec<(u64, String, serde_json::Value)> {
    body.split("\n\n")
        .filter_map(|record| {
            let field = |name: &str| {
                record
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}:")))
                    .map(|v| v.trim().to_string())
            };
            Some((
                field("id")?.parse().ok()?,
                field("event")?,
                serde_json::from_str(&field("data")?).ok()?,
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_follows_an_account_near_its_limit_suppressed_and_released_in_order() {
    assert!(
        curl_available(),
        "curl is needed (Debian's curl package): it is the SSE client here"
    );
    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-events-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let config = dir.join("master.toml");
    std::fs::write(&config, format!("[limits]\nmessages = {LIMIT}\n")).unwrap();
    let master = MasterProcess::start("127.0.0.1:0", &["--config".as_ref(), config.as_os_str()]);
    let http = master.http.clone().unwrap();
    let url = format!("http://{http}/v1/events?account=ramp");

    // A bad filter: 400, naming it.
    let (status, body) = master.get("/v1/events?kind=nearly");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("`kind`"), "{body}");

    let follow = Command::new("curl")
        .args(["-sN", "--max-time", "40", &url])
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl runs");

    let agents: Vec<Arc<Agent>> = (0..2)
        .map(|i| {
            Arc::new(
                Agent::builder()
                    .masters([master.address.clone()])
                    .agent_id(format!("events-{i}"))
                    .start()
                    .unwrap(),
            )
        })
        .collect();
    let item = |account: &str, rate: f64| Traffic {
        account: account.into(),
        op: "messages".into(),
        rate,
        cost: 1,
    };
    for (ramp, secs) in [(0.5, 6), (3.0, 10), (0.2, 12)] {
        let traffic = [item("ramp", ramp * LIMIT), item("calm", 0.9 * LIMIT)];
        drive_seconds(&agents, &traffic, Duration::from_secs(secs)).await;
    }
    for agent in &agents {
        agent.shutdown().await;
    }
    // Reconnecting after the first event: the rest again, from the kept
    // ones (curl then waits for more until its --max-time).
    let replay = Command::new("curl")
        .args(["-sN", "--max-time", "2", "-H", "Last-Event-ID: 1", &url])
        .output()
        .unwrap();
    let replayed = records(&String::from_utf8(replay.stdout).unwrap());
    // Stopping the master ends the stream: curl exits well before its
    // --max-time.
    let stopping = tokio::time::Instant::now();
    assert!(
        master.terminate(),
        "the master stops cleanly with a stream open"
    );
    let output = tokio::task::spawn_blocking(move || follow.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(stopping.elapsed() < Duration::from_secs(10));
    let body = String::from_utf8(output.stdout).unwrap();
    let got = records(&body);
    eprintln!("curl received: {got:?}");
    let kinds: Vec<&str> = got.iter().map(|(_, kind, _)| kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "near_limit",
            "suppression_started",
            "suppression_ended",
            "near_limit_ended"
        ],
        "{body}"
    );
    for (id, kind, data) in &got {
        assert_eq!(data["id"], *id);
        assert_eq!(data["kind"], kind.as_str());
        assert_eq!(data["account"], "ramp");
        assert_eq!(data["limit"].as_f64(), Some(LIMIT));
    }
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "numbered in order");
    let after_first: Vec<u64> = got.iter().map(|r| r.0).filter(|&id| id > 1).collect();
    assert_eq!(
        replayed.iter().map(|r| r.0).collect::<Vec<_>>(),
        after_first,
        "Last-Event-ID: 1 replays every kept event after 1 that the filter keeps"
    );
    let started = &got[1].2;
    // Started as soon as the demand estimate passed the limit (the first
    // early reports' estimate may be partial).
    assert!(started["factor"].as_f64().unwrap() > 0.0, "{started}");
    assert!(started["demand"].as_f64().unwrap() > LIMIT, "{started}");
}
