//! Mutual TLS between agents and a master, over real gRPC on loopback, with
//! the test-only certificates in `tests/tls/` (see `gen.sh` there).
//!
//! The master requires client certificates issued by `ca.pem`. An agent
//! that presents one is served and its flood is suppressed; agents without
//! a certificate, with one from another CA, or speaking plain TCP are
//! refused: every rollup fails and the master counts nothing from them.
//! With an allow-list of identities (`--tls-allow`), a certificate from the
//! CA is not enough: its subject alternative name must match. Masters ask
//! each other for the ring's accounts over the same mutual TLS.

use std::sync::Arc;
use std::time::Duration;

use damper_agent::{Agent, AgentTls};
use damper_master::{Master, MasterOptions, ServerTls};
use damper_tests::quick_config;
use damper_tests::served::ServedMaster;

fn pem(name: &str) -> Vec<u8> {
    let path = format!("{}/tls/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn agent(master: &str, id: &str, tls: Option<AgentTls>) -> Arc<Agent> {
    let mut builder = Agent::builder()
        .masters([master])
        .agent_id(id)
        .rollup_interval(Duration::from_millis(500));
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    Arc::new(builder.start().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_agents_with_a_client_certificate_from_the_ca_are_served() {
    let config = quick_config("[limits]\nmessages = 100\n");
    let tls = ServerTls::new(pem("master.pem"), pem("master.key")).require_client_ca(pem("ca.pem"));
    let server =
        ServedMaster::start(Master::new(config, MasterOptions::default()), Some(tls)).await;
    let (master, address) = (server.master.clone(), server.address.to_string());

    let trusted = agent(
        &address,
        "trusted",
        Some(AgentTls::new(pem("ca.pem")).identity(pem("agent.pem"), pem("agent.key"))),
    );
    let refused = [
        (
            "no-client-cert",
            agent(
                &address,
                "no-client-cert",
                Some(AgentTls::new(pem("ca.pem"))),
            ),
        ),
        (
            "other-ca",
            agent(
                &address,
                "other-ca",
                Some(
                    AgentTls::new(pem("ca.pem"))
                        .identity(pem("rogue-agent.pem"), pem("rogue-agent.key")),
                ),
            ),
        ),
        ("plain-tcp", agent(&address, "plain-tcp", None)),
    ];

    // Each agent floods its own account at 10× the limit for 3 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline {
        for _ in 0..10 {
            trusted.check("trusted", "messages", 1);
            for (account, agent) in &refused {
                agent.check(account, "messages", 1);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let served = trusted.stats();
    assert!(
        served.rollups_sent >= 3 && served.rollups_failed == 0,
        "trusted: {served:?}"
    );
    let factor = trusted.factor("trusted", "messages").unwrap_or(0.0);
    assert!(
        factor > 0.5,
        "the trusted agent's flood is suppressed: {factor}"
    );
    for (account, agent) in &refused {
        let stats = agent.stats();
        assert_eq!(stats.rollups_sent, 0, "{account} was served: {stats:?}");
        assert!(stats.rollups_failed >= 2, "{account}: {stats:?}");
        assert_eq!(
            master.factor(account, "messages"),
            Some(0.0),
            "{account} counted"
        );
    }
    assert_eq!(
        master.len(),
        1,
        "only the trusted agent's account is tracked"
    );

    trusted.shutdown().await;
    for (_, agent) in refused {
        agent.shutdown().await;
    }
    server.stop().await;
}

/// With an allow-list of identities, a certificate from the CA is not
/// enough: only an agent whose SAN matches may report. The agent's
/// certificate names `agent.damper.test`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_identities_may_report() {
    let config = quick_config("[limits]\nmessages = 100\n");
    let mut outcomes = Vec::new();
    for (patterns, allowed) in [
        (vec!["*.damper.test".to_owned()], true),
        (
            vec![
                "edge-*.damper.test".to_owned(),
                "spiffe://prod/*".to_owned(),
            ],
            false,
        ),
    ] {
        let tls = ServerTls::new(pem("master.pem"), pem("master.key"))
            .require_client_ca(pem("ca.pem"))
            .allow_identities(patterns.clone());
        let server = ServedMaster::start(
            Master::new(config.clone(), MasterOptions::default()),
            Some(tls),
        )
        .await;
        let agent = agent(
            &server.address.to_string(),
            "from-the-ca",
            Some(AgentTls::new(pem("ca.pem")).identity(pem("agent.pem"), pem("agent.key"))),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while tokio::time::Instant::now() < deadline {
            for _ in 0..10 {
                agent.check("acme", "messages", 1);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stats = agent.stats();
        if allowed {
            assert!(
                stats.rollups_sent >= 2 && stats.rollups_failed == 0,
                "{patterns:?}: {stats:?}"
            );
            assert_eq!(server.master.len(), 1);
        } else {
            assert_eq!(stats.rollups_sent, 0, "{patterns:?}: {stats:?}");
            assert!(stats.rollups_failed >= 2, "{patterns:?}: {stats:?}");
            assert_eq!(
                server.master.len(),
                0,
                "nothing of a refused agent is counted"
            );
        }
        outcomes.push((patterns, stats.rollups_sent));
        agent.shutdown().await;
        server.stop().await;
    }
    eprintln!("{outcomes:?}");
}

/// The ring-wide accounts view over mutual TLS with an allow-list: each
/// master asks its peer presenting its own certificate (`serverAuth` and
/// `clientAuth`, from the CA the agents' come from, its name allowed), and
/// gets the peer's rows; a client certificate the peer does not allow
/// leaves that peer missing, named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_show_the_whole_ring_to_each_other_over_mutual_tls() {
    let config = quick_config("[limits]\nmessages = 100\n");
    let tls = |allowed: &str| {
        ServerTls::new(pem("ring-master.pem"), pem("ring-master.key"))
            .require_client_ca(pem("ring-ca.pem"))
            .allow_identities([allowed.to_string()])
    };
    // `a` allows masters; `b` allows only an identity no master has, so
    // `a`'s questions to it are refused while `b`'s to `a` are answered.
    let a = ServedMaster::start(
        Master::new(config.clone(), MasterOptions::default()),
        Some(tls("master.damper.test")),
    )
    .await;
    let b = ServedMaster::start(
        Master::new(config, MasterOptions::default()),
        Some(tls("someone-else.damper.test")),
    )
    .await;
    let ring = [a.address.to_string(), b.address.to_string()];
    a.master.set_ring(&ring, &ring[0]).unwrap();
    b.master.set_ring(&ring, &ring[1]).unwrap();
    // An agent with an identity `a` allows reports 20 accounts to `a`: the
    // view from `b` must show them, named `a`.
    let agent = agent(
        &ring[0],
        "ring-agent",
        Some(
            AgentTls::new(pem("ring-ca.pem"))
                .identity(pem("ring-master.pem"), pem("ring-master.key")),
        ),
    );
    for i in 0..20 {
        agent.check(&format!("acct-{i}"), "messages", 10);
    }
    agent.shutdown().await;
    assert!(a.master.len() >= 20, "{}", a.master.len());

    let query = damper_master::AccountsQuery {
        limit: 1_000,
        ..Default::default()
    };
    // Generous: the servers' tasks have long started; a loaded machine
    // gets a few tries.
    let mut from_b = b.master.ring_accounts(&query).await.unwrap();
    for _ in 0..20 {
        if from_b.missing.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        from_b = b.master.ring_accounts(&query).await.unwrap();
    }
    assert!(from_b.missing.is_empty(), "{:?}", from_b.missing);
    assert_eq!(from_b.answered, [ring[1].clone(), ring[0].clone()]);
    assert_eq!(from_b.rows.len(), 20);
    assert!(from_b.rows.iter().all(|r| r.master == ring[0]));

    let from_a = a.master.ring_accounts(&query).await.unwrap();
    assert_eq!(from_a.rows.len(), 20, "its own rows");
    assert_eq!(from_a.missing.len(), 1, "{from_a:?}");
    assert_eq!(from_a.missing[0].master, ring[1]);
    assert!(
        from_a.missing[0].error.contains("PermissionDenied"),
        "{:?}",
        from_a.missing
    );
    a.stop().await;
    b.stop().await;
}
