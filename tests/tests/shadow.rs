//! Shadow mode over real gRPC: a master whose `[shadow]` table puts the
//! `messages` op in shadow, two agents flooding an account at 10× its
//! limit, then a reload that takes the shadow away. 500 ms rollups, so it
//! takes about 15 s.
//!
//! What must hold: in shadow nothing is refused, by the master's factor or
//! the agents' local guard, yet the factor is computed as usual and the
//! would-be refusals are marked, in the share the factor says; the master
//! shows the pair as in shadow and emits the shadow event, not the real
//! one; once a reload ends the shadow, the flood is held at the limit
//! within the usual reaction, its window kept.

use std::sync::Arc;
use std::time::Duration;

use damper_agent::{Agent, AgentStats};
use damper_core::config::MasterConfig;
use damper_load::{Traffic, drive_seconds};
use damper_master::{AccountsQuery, Master, MasterOptions};
use damper_tests::quick_config;
use damper_tests::served::ServedMaster;

const LIMIT: f64 = 1_000.0;

fn config(shadow: bool) -> MasterConfig {
    let shadow = if shadow {
        "[shadow]\nops = [\"messages\"]\n"
    } else {
        ""
    };
    quick_config(&format!("[limits]\nmessages = {LIMIT}\n{shadow}"))
}

fn flood() -> Traffic {
    Traffic {
        account: "flood".into(),
        op: "messages".into(),
        rate: 10.0 * LIMIT,
        cost: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_in_shadow_refuses_nothing_marks_what_it_would_and_a_reload_enforces_it() {
    let served =
        ServedMaster::start(Master::new(config(true), MasterOptions::default()), None).await;
    let mut events = served.master.events().subscribe(Some(0));
    let agents: Vec<Arc<Agent>> = (0..2)
        .map(|i| {
            Arc::new(
                Agent::builder()
                    .masters([served.address.to_string()])
                    .agent_id(format!("shadow-{i}"))
                    .rollup_interval(Duration::from_millis(500))
                    .start()
                    .unwrap(),
            )
        })
        .collect();
    let would_reject = |agents: &[Arc<Agent>]| -> u64 {
        agents
            .iter()
            .map(|a| a.stats())
            .sum::<AgentStats>()
            .would_reject_cost
    };

    let shadowed = drive_seconds(&agents, &[flood()], Duration::from_secs(6)).await;
    for (t, second) in shadowed.iter().enumerate() {
        assert_eq!(
            second[0].admitted, second[0].attempted,
            "refused at {t} s under a limit in shadow: {second:?}"
        );
    }
    let attempted: u64 = shadowed.iter().map(|s| s[0].attempted).sum();
    let marked = would_reject(&agents);
    eprintln!("in shadow: {attempted} attempted, all admitted, {marked} marked would-reject");
    // Held from within about a second, at a factor near 0.9: 0.9 of the
    // last five seconds is three quarters of the whole, and never more
    // than 0.9 of it.
    assert!(
        marked as f64 > 0.6 * attempted as f64 && (marked as f64) < 0.95 * attempted as f64,
        "{marked} of {attempted} marked"
    );
    let query = AccountsQuery {
        account: Some("flood".into()),
        ..AccountsQuery::default()
    };
    let (views, _) = served.master.accounts(&query);
    assert!(
        views[0].shadow && views[0].factor > 0.8,
        "computed as usual, marked: {views:?}"
    );
    let kinds: Vec<&str> = std::iter::from_fn(|| events.live.try_recv().ok())
        .chain(events.missed.drain(..))
        .filter(|e| e.account == "flood")
        .map(|e| e.kind)
        .collect();
    assert!(
        kinds.contains(&"shadow_suppression_started") && !kinds.contains(&"suppression_started"),
        "{kinds:?}"
    );

    // The shadow ends by reload: held at the limit, window kept.
    served.master.reload(config(false)).unwrap();
    let before = would_reject(&agents);
    let enforced = drive_seconds(&agents, &[flood()], Duration::from_secs(6)).await;
    let admitted: Vec<u64> = enforced.iter().map(|s| s[0].admitted).collect();
    eprintln!("admitted per second after the reload: {admitted:?}");
    assert!(
        admitted[3..admitted.len() - 1]
            .iter()
            .all(|&a| (a as f64 - LIMIT).abs() < 0.3 * LIMIT),
        "held once out of shadow: {admitted:?}"
    );
    // A reply or two may still say shadow; from then on what the factor
    // takes is refused, not marked.
    let after_first_second = would_reject(&agents) - before;
    assert!(
        (after_first_second as f64) < 2.0 * 10.0 * LIMIT,
        "{after_first_second} marked after the reload"
    );
    for agent in &agents {
        agent.shutdown().await;
    }
    served.stop().await;
}
