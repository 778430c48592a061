//! Exemptions over real gRPC: a master whose config exempts `vip`, two
//! agents flooding `vip` and `flood` at 10× the op's limit, then a reload
//! that takes the exemption away. 500 ms rollups, so it takes about 15 s.
//!
//! What must hold: the exempt account is never refused while exempt (not
//! by the master, not by the agents' local guard), though its demand shows
//! on the master; the other flood is held meanwhile; once a reload removes
//! the exemption, `vip` is held at the limit within the usual reaction.

use std::sync::Arc;
use std::time::Duration;

use damper_agent::Agent;
use damper_core::config::MasterConfig;
use damper_load::{Traffic, drive_seconds};
use damper_master::{AccountsQuery, Master, MasterOptions};
use damper_tests::quick_config;
use damper_tests::served::ServedMaster;

const LIMIT: f64 = 1_000.0;

fn config(exempt: bool) -> MasterConfig {
    let exempt = if exempt {
        "[exempt]\naccounts = [\"vip\"]\n"
    } else {
        ""
    };
    quick_config(&format!("[limits]\nmessages = {LIMIT}\n{exempt}"))
}

fn item(account: &str, rate: f64) -> Traffic {
    Traffic {
        account: account.into(),
        op: "messages".into(),
        rate,
        cost: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exempt_account_is_never_refused_and_a_reload_that_ends_it_holds_it() {
    let served =
        ServedMaster::start(Master::new(config(true), MasterOptions::default()), None).await;
    let agents: Vec<Arc<Agent>> = (0..2)
        .map(|i| {
            Arc::new(
                Agent::builder()
                    .masters([served.address.to_string()])
                    .agent_id(format!("exempt-{i}"))
                    .rollup_interval(Duration::from_millis(500))
                    .start()
                    .unwrap(),
            )
        })
        .collect();

    // A calm second first, so each agent has heard from the master about
    // `vip` before it floods: until then its local guard knows only the
    // op's default limit.
    drive_seconds(&agents, &[item("vip", 0.5 * LIMIT)], Duration::from_secs(2)).await;
    let exempt = drive_seconds(
        &agents,
        &[item("vip", 10.0 * LIMIT), item("flood", 10.0 * LIMIT)],
        Duration::from_secs(6),
    )
    .await;
    for (t, second) in exempt.iter().enumerate() {
        assert_eq!(
            second[0].admitted, second[0].attempted,
            "vip refused at {t} s: {second:?}"
        );
    }
    let flood: Vec<u64> = exempt.iter().map(|s| s[1].admitted).collect();
    assert!(
        flood[3..flood.len() - 1]
            .iter()
            .all(|&a| (a as f64) < 1.3 * LIMIT),
        "the other flood is held: {flood:?}"
    );
    let query = AccountsQuery {
        account: Some("vip".into()),
        ..AccountsQuery::default()
    };
    let (views, _) = served.master.accounts(&query);
    assert_eq!(views[0].exempt.as_deref(), Some("vip"), "{views:?}");
    assert!(
        views[0].demand > 5.0 * LIMIT,
        "its demand is still seen: {views:?}"
    );

    // The exemption ends by reload: held at the limit, windows kept.
    served.master.reload(config(false)).unwrap();
    let after = drive_seconds(
        &agents,
        &[item("vip", 10.0 * LIMIT)],
        Duration::from_secs(6),
    )
    .await;
    let vip: Vec<u64> = after.iter().map(|s| s[0].admitted).collect();
    eprintln!("vip admitted per second after the reload: {vip:?}");
    assert!(
        vip[3..vip.len() - 1]
            .iter()
            .all(|&a| (a as f64 - LIMIT).abs() < 0.3 * LIMIT),
        "vip held once no longer exempt: {vip:?}"
    );
    for agent in &agents {
        agent.shutdown().await;
    }
    served.stop().await;
}
