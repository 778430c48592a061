//! Operating a real `damper-master` process: a config change reaches the
//! agents on the next rollup, a bad one leaves the limits in force, and the
//! HTTP endpoint and `/metrics` show what happened. Real gRPC and HTTP on
//! loopback; a real `damper-agent`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::MasterProcess;
use damper_agent::Agent;
use damper_load::Paced;

const WINDOW: &str = "[window]\nrollup_interval_ms = 500\nsub_interval_ms = 1500\ngrace_ms = 200\n";

/// Polls `condition` every 50 ms for up to `within`; returns whether it held.
fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    for _ in 0..within.as_millis() / 50 {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    condition()
}

/// The value of the series named exactly `series` in a `/metrics` body.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[test]
fn reloads_reach_agents_bad_ones_change_nothing_and_it_all_shows() {
    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-operate-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let path = dir.join("master.toml");
    let write =
        |limits: &str| std::fs::write(&path, format!("{WINDOW}[limits]\n{limits}")).unwrap();
    write("messages = 1000\n");
    // SIGHUP only, so each reload below is the one this test asks for.
    let master = MasterProcess::start(
        "127.0.0.1:0",
        &[
            "--config".as_ref(),
            path.as_os_str(),
            "--config-poll".as_ref(),
            "0s".as_ref(),
        ],
    );

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();
    let agent = Arc::new(
        Agent::builder()
            .masters([master.address.clone()])
            .rollup_interval(Duration::from_millis(500))
            .start()
            .unwrap(),
    );
    // About 5000 cost/s on acme's messages, from a plain thread.
    let flood = Paced::start(Duration::from_millis(10), {
        let agent = agent.clone();
        move || {
            for _ in 0..10 {
                agent.check("acme", "messages", 5);
            }
        }
    });
    let factor = || agent.factor("acme", "messages").unwrap_or(-1.0);

    assert!(
        eventually(Duration::from_secs(30), || factor() > 0.5),
        "never suppressed: {}",
        factor()
    );
    let (status, body) = master.get("/v1/accounts?min_factor=0.1");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("\"account\":\"acme\"") && body.contains("\"limit_key\":\"messages\""),
        "{body}"
    );

    // acme is granted far more: the agent's factor goes to 0.
    write("messages = 1000\n\"messages/acme\" = 1000000\n");
    master.signal("HUP");
    assert!(
        eventually(Duration::from_secs(20), || factor() == 0.0),
        "reload not applied: {}",
        factor()
    );
    let (_, body) = master.get("/v1/accounts/acme");
    assert!(body.contains("\"limit_key\":\"messages/acme\""), "{body}");

    // A bad file: were any of it applied, `messages = 1` would suppress acme.
    write("messages = 1\n\"messages/acme\" = -5\n");
    master.signal("HUP");
    let mut logs = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            logs.extend(master.logs.try_iter());
            logs.iter().any(|l| l.contains("config reload refused"))
        }),
        "no error logged: {logs:?}"
    );
    let refused = logs
        .iter()
        .find(|l| l.contains("config reload refused"))
        .unwrap();
    assert!(
        refused.contains("limits.\\\"messages/acme\\\"") || refused.contains("messages/acme"),
        "{refused}"
    );
    assert!(refused.contains("line 7"), "{refused}");
    // Several rollups later the generous limit still holds.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(factor(), 0.0);

    let (status, metrics) = master.get("/metrics");
    assert_eq!(status, 200);
    assert_eq!(
        value(
            &metrics,
            "damper_master_config_reloads_total{result=\"ok\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        value(
            &metrics,
            "damper_master_config_reloads_total{result=\"error\"}"
        ),
        Some(1.0)
    );
    assert!(value(&metrics, "damper_master_rollups_total").unwrap() >= 4.0);
    assert!(value(&metrics, "damper_master_factors_sent_total").unwrap() >= 4.0);
    assert!(value(&metrics, "damper_master_ingest_duration_seconds_count").unwrap() >= 4.0);
    assert!(metrics.contains("damper_master_ingest_duration_seconds_bucket{le=\"0.001\"}"));
    assert_eq!(value(&metrics, "damper_master_accounts_tracked"), Some(1.0));
    // The standard process metrics: memory is what an attack would grow.
    let resident = value(&metrics, "process_resident_memory_bytes").unwrap_or(0.0);
    assert!(resident > 1e6, "process_resident_memory_bytes: {resident}");
    // acme stopped being suppressed with the first reload, and the log said so.
    assert_eq!(
        value(
            &metrics,
            "damper_master_accounts_suppressed{op=\"messages\"}"
        ),
        Some(0.0)
    );
    let all: Vec<String> = logs.iter().cloned().chain(master.logs.try_iter()).collect();
    let started = all
        .iter()
        .filter(|l| l.contains("suppression started"))
        .count();
    let stopped = all
        .iter()
        .filter(|l| l.contains("suppression stopped"))
        .count();
    assert_eq!((started, stopped), (1, 1), "{all:?}");

    flood.stop();
    drop(agent);
    assert!(master.terminate());
}

/// The HTTP endpoint beyond loopback needs a bearer token: without one the
/// master refuses to start, naming the flag; with one, every route but
/// `/healthz` asks for it.
#[test]
fn the_http_endpoint_beyond_loopback_requires_a_bearer_token() {
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_damper-master"))
        .args(["--listen", "127.0.0.1:0", "--http", "0.0.0.0:0"])
        .env_remove("DAMPER_HTTP_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--http-token-file") && stderr.contains("DAMPER_HTTP_TOKEN"),
        "{stderr}"
    );

    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-token-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_damper-master"))
        .args(["--listen", "127.0.0.1:0", "--http-token-file"])
        .arg(&empty)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("the token is empty"));

    let file = dir.join("token");
    std::fs::write(&file, "s3cret\n").unwrap();
    let master = MasterProcess::start(
        "127.0.0.1:0",
        &["--http-token-file".as_ref(), file.as_os_str()],
    );
    let http = master.http.clone().unwrap();
    assert_eq!(master.get("/v1/accounts").0, 401);
    assert_eq!(master.get("/metrics").0, 401);
    assert_eq!(master.get("/healthz").0, 200);
    let (status, body) =
        common::http_get_with(&http, "/v1/accounts", "Authorization: Bearer s3cret\r\n");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"accounts\""), "{body}");
    assert!(master.terminate());
}
