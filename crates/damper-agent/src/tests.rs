use super::*;
use std::time::Duration;

fn agent(masters: &[&str]) -> Agent {
    Agent::builder()
        .masters(masters.iter().copied())
        .rollup_interval(Duration::from_millis(200))
        .request_timeout(Duration::from_millis(150))
        .agent_id("test-agent")
        .start()
        .unwrap()
}

#[test]
fn bad_settings_are_refused_with_the_reason() {
    assert_eq!(Agent::builder().start().unwrap_err(), AgentError::NoMasters);
    assert_eq!(
        Agent::builder()
            .masters(Vec::<String>::new())
            .start()
            .unwrap_err(),
        AgentError::NoMasters
    );
    for (address, reason) in [
        ("localhost", "expected host:port"),
        (":7070", "the host is empty"),
        ("https://m:7070", "without a scheme"),
        ("m:99999", "the port"),
    ] {
        let err = Agent::builder()
            .masters([address])
            .start()
            .unwrap_err()
            .to_string();
        assert!(err.contains(address) && err.contains(reason), "{err}");
    }
    let err = Agent::builder()
        .masters(["m:1"])
        .rollup_interval(Duration::ZERO)
        .start()
        .unwrap_err();
    assert!(err.to_string().contains("rollup_interval"), "{err}");
    let err = Agent::builder()
        .masters(["m:1"])
        .forget_after(Duration::from_secs(1))
        .start()
        .unwrap_err();
    assert!(
        err.to_string().contains("forget_after") && err.to_string().contains("rollup interval"),
        "{err}"
    );
    for lanes in [0, (1 << 20) + 1] {
        let err = Agent::builder()
            .masters(["m:1"])
            .publisher_lanes(lanes)
            .start()
            .unwrap_err();
        assert!(err.to_string().contains("publisher_lanes"), "{err}");
    }
    // Valid settings, but no runtime to run the rollup task on.
    assert_eq!(
        Agent::builder().masters(["m:1"]).start().unwrap_err(),
        AgentError::NoRuntime
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_never_slows_or_fails_checks() {
    // Nothing listens here: every rollup fails.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    let agent = agent(&[&address]);
    let began = tokio::time::Instant::now();
    let (mut checks, mut admitted) = (0u32, 0u32);
    while began.elapsed() < Duration::from_millis(800) {
        for _ in 0..1_000 {
            checks += 1;
            admitted += u32::from(agent.check("acme", "messages", 1).is_admit());
        }
        tokio::task::yield_now().await;
    }
    // Publishers named, the same.
    for publisher in 0..1_000 {
        checks += 1;
        admitted += u32::from(
            agent
                .check_from("acme", "messages", 1, Publisher::new(publisher))
                .is_admit(),
        );
    }
    // Fail open: four rollup intervals of failures, nothing rejected.
    assert!(checks > 10_000);
    assert_eq!(admitted, checks);
    assert_eq!(agent.factor("acme", "messages"), Some(0.0));
    agent.shutdown().await;
}

#[test]
fn latency_quantiles_come_from_buckets_a_fifth_of_a_doubling_wide() {
    let stats = crate::Stats::default();
    for ms in 1..=100u64 {
        stats.answered(1, 10, 10, Duration::from_millis(ms));
    }
    let h = stats.snapshot().rollup_latency;
    assert_eq!(h.count(), 100);
    let p50 = h.quantile(0.5).unwrap().as_secs_f64() * 1e3;
    let p99 = h.quantile(0.99).unwrap().as_secs_f64() * 1e3;
    assert!((50.0..=50.0 * 1.19).contains(&p50), "{p50}");
    assert!((99.0..=99.0 * 1.19).contains(&p99), "{p99}");
    assert_eq!(crate::LatencyHistogram::default().quantile(0.5), None);
}

#[test]
fn a_reply_lists_what_differs_and_implies_factor_0_under_the_ops_limit_for_the_rest() {
    use damper_core::Pair;
    use damper_core::agent::{AgentConfig, AgentState, RejectSource};
    use damper_core::time::Nanos;
    use damper_proto::v1::{AccountFactor, OpFactors, RollupReply};
    use rand::SeedableRng;

    let state = AgentState::new(AgentConfig::default());
    let now = Nanos::from_secs(1_800_000_000);
    let reply = |flood: Option<f64>| RollupReply {
        ops: vec![
            OpFactors {
                op: "messages".into(),
                accounts: flood
                    .map(|factor| AccountFactor {
                        account: "flood".into(),
                        factor,
                        limit: 1000.0,
                        valid_for_ms: 6_000,
                        recheck: false,
                        shadow: false,
                        utilisation: 0.0,
                    })
                    .into_iter()
                    .collect(),
                unlisted_limit: 1000.0,
                unlisted_valid_for_ms: 6_000,
                unlisted_shadow: false,
                overrides: vec![],
            },
            // An op with no limit of its own: its unlisted accounts are
            // unlimited, so nothing is applied to them.
            OpFactors {
                op: "presence".into(),
                accounts: vec![AccountFactor {
                    account: "vip".into(),
                    factor: 0.0,
                    limit: 10.0,
                    valid_for_ms: 6_000,
                    recheck: false,
                    shadow: false,
                    utilisation: 0.0,
                }],
                unlisted_limit: 0.0,
                unlisted_valid_for_ms: 0,
                unlisted_shadow: false,
                overrides: vec![],
            },
        ],
        ..RollupReply::default()
    };
    let asked = [
        Pair::new("calm", "messages"),
        Pair::new("flood", "messages"),
        Pair::new("vip", "presence"),
        Pair::new("other", "presence"),
    ];
    state.apply_reply(
        now,
        &damper_core::wire::Reply::from(reply(Some(0.9))),
        asked,
    );
    let flood = state.factor(now, "flood", "messages").unwrap();
    assert!((flood - 0.9).abs() < 1e-6, "{flood}");
    assert_eq!(state.factor(now, "calm", "messages"), Some(0.0));
    assert_eq!(state.factor(now, "vip", "presence"), Some(0.0));
    assert_eq!(state.factor(now, "other", "presence"), None);
    // The implied verdict carries the limit: this agent's local guard
    // catches a flood of its own on `calm` before any master hears of it.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let mut local = None;
    for i in 0..5_000u64 {
        let at = now + Duration::from_micros(100 * i);
        if let Decision::Reject(r) = state.check(at, "calm", "messages", 1, &mut rng) {
            local = Some(r);
            break;
        }
    }
    let local = local.expect("the local guard knows calm's limit");
    assert_eq!(
        (local.source, local.limit),
        (RejectSource::LocalGuard, 1000.0)
    );
    // The flood stops: no longer listed, so released to factor 0.
    state.apply_reply(now, &damper_core::wire::Reply::from(reply(None)), asked);
    assert_eq!(state.factor(now, "flood", "messages"), Some(0.0));
    // Valid for the implied validity, then failing open as ever.
    let later = now + Duration::from_millis(6_001);
    assert_eq!(state.factor(later, "calm", "messages"), Some(0.0));
    assert!(
        state
            .check(later, "calm", "messages", 1_000_000, &mut rng)
            .is_admit()
    );
}
