//! The metrics an agent and a master record through the `metrics` facade,
//! read back in Prometheus' text format as a host application that installs
//! `metrics-exporter-prometheus` would expose them. One test in this binary:
//! a recorder is process-wide.

use std::sync::Arc;
use std::time::Duration;

use damper_agent::Agent;
use damper_load::Paced;
use damper_master::{Master, MasterOptions};
use damper_tests::proxy::{Fault, FaultProxy};
use damper_tests::quick_config;
use damper_tests::served::ServedMaster;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The value of the series named exactly `series` (name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

async fn wait_for(
    handle: &PrometheusHandle,
    what: &str,
    mut holds: impl FnMut(&str) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = handle.render();
        if holds(&text) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {what}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_and_master_record_the_documented_series() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder in this binary");

    let config = quick_config("[limits]\nmessages = 1000\n");
    let served = ServedMaster::start(Master::new(config, MasterOptions::default()), None).await;
    let proxy = FaultProxy::start(served.address).await.unwrap();
    let agent = Arc::new(
        Agent::builder()
            .masters([proxy.address().to_string()])
            .rollup_interval(Duration::from_millis(500))
            .start()
            .unwrap(),
    );
    // 5000 cost/s against 1000/s, from a plain thread.
    let flood = Paced::start(Duration::from_millis(10), {
        let agent = agent.clone();
        move || {
            for _ in 0..10 {
                agent.check("acme", "messages", 5);
            }
        }
    });

    let text = wait_for(&handle, "suppressed", |t| {
        value(t, "damper_agent_rejected_cost_total{op=\"messages\"}").unwrap_or(0.0) > 0.0
    })
    .await;
    assert!(value(&text, "damper_agent_admitted_cost_total{op=\"messages\"}").unwrap() > 0.0);
    assert!(value(&text, "damper_agent_rollups_total{result=\"ok\"}").unwrap() >= 1.0);
    assert!(value(&text, "damper_agent_rollup_duration_seconds_count").unwrap() >= 1.0);
    assert_eq!(value(&text, "damper_agent_pending_bytes"), Some(0.0));
    // The master's side, recorded in the same process. The agent's own
    // local guard may refuse before the master's verdict comes (a single
    // node's deluge is its to catch), so the master's is waited for.
    // Gauges are recorded on demand: each look records them for the next.
    served.master.record_gauges();
    let text = wait_for(&handle, "suppressed by the master", |t| {
        served.master.record_gauges();
        value(t, "damper_master_accounts_suppressed{op=\"messages\"}") == Some(1.0)
    })
    .await;
    assert_eq!(value(&text, "damper_master_accounts_tracked"), Some(1.0));
    assert!(value(&text, "damper_master_rollups_total").unwrap() >= 1.0);
    assert!(value(&text, "damper_master_entries_total").unwrap() >= 1.0);
    assert!(value(&text, "damper_master_factors_sent_total").unwrap() >= 1.0);

    // The link drops everything: rollups fail, counts wait, the factor
    // lapses and the agent fails open, each of which shows.
    proxy.set(Fault::Drop);
    let text = wait_for(&handle, "failed open", |t| {
        value(t, "damper_agent_factors_expired_total").unwrap_or(0.0) >= 1.0
            && value(t, "damper_agent_pending_bytes").unwrap_or(0.0) > 0.0
    })
    .await;
    assert!(value(&text, "damper_agent_rollups_total{result=\"error\"}").unwrap() >= 1.0);

    flood.stop();
    drop(agent);
    drop(proxy);
    served.stop().await;

    // A limit in shadow: nothing refused, what would be is counted apart.
    let config = quick_config("[limits]\nmessages = 1000\n[shadow]\nops = [\"messages\"]\n");
    let served = ServedMaster::start(Master::new(config, MasterOptions::default()), None).await;
    let agent = Arc::new(
        Agent::builder()
            .masters([served.address.to_string()])
            .rollup_interval(Duration::from_millis(500))
            .start()
            .unwrap(),
    );
    let rejected_before = value(
        &handle.render(),
        "damper_agent_rejected_cost_total{op=\"messages\"}",
    )
    .unwrap();
    let flood = Paced::start(Duration::from_millis(10), {
        let agent = agent.clone();
        move || {
            for _ in 0..10 {
                agent.check("shadowed", "messages", 5);
            }
        }
    });
    let text = wait_for(&handle, "would reject", |t| {
        value(t, "damper_agent_would_reject_cost_total").unwrap_or(0.0) > 1_000.0
    })
    .await;
    assert_eq!(
        value(&text, "damper_agent_rejected_cost_total{op=\"messages\"}").unwrap(),
        rejected_before,
        "nothing refused under a limit in shadow"
    );
    assert!(
        value(
            &text,
            "damper_master_events_total{kind=\"shadow_suppression_started\"}"
        )
        .unwrap()
            >= 1.0
    );
    served.master.record_gauges();
    let text = handle.render();
    assert_eq!(
        value(
            &text,
            "damper_master_accounts_shadow_suppressed{op=\"messages\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "damper_master_accounts_suppressed{op=\"messages\"}"),
        Some(0.0)
    );
    flood.stop();
    drop(agent);
    served.stop().await;
}
