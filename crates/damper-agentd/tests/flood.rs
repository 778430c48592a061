//! End to end: two masters and three sidecars on loopback, driven by
//! redis-py as nodes in other languages would drive them. One account
//! floods at 10× its limit through all three sidecars and is held at its
//! limit; a calm account on the same sidecars is never refused; and the
//! masters receive exactly what the sidecars counted, nothing lost or
//! doubled.

mod common;

use std::collections::BTreeMap;

use common::{ServedSidecar, master, run_client};
use damper_testkit::assert_held;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_through_three_sidecars_is_held_and_a_calm_account_never_refused() {
    let masters = [master(500).await, master(500).await];
    let addresses: Vec<String> = masters.iter().map(|m| m.address.to_string()).collect();
    let mut sidecars = Vec::new();
    for id in ["sidecar-a", "sidecar-b", "sidecar-c"] {
        let sidecar = ServedSidecar::start(&addresses, 500, id).await;
        sidecar.until_limit_known().await;
        sidecars.push(sidecar);
    }
    let resp: Vec<String> = sidecars.iter().map(|s| s.resp.to_string()).collect();
    let seconds = 14;
    let output = run_client(
        "flood.py",
        vec![
            seconds.to_string(),
            resp.join(","),
            "flood:10000:5".into(),
            "calm:500:1".into(),
        ],
    )
    .await;

    // (account, second) → (attempted, admitted), as the clients saw them.
    let mut rows = BTreeMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let field = |name: &str| -> u64 {
            let at = line.find(&format!("\"{name}\": ")).unwrap() + name.len() + 4;
            line[at..]
                .split([',', '}'])
                .next()
                .unwrap()
                .trim()
                .trim_matches('"')
                .parse()
                .unwrap_or(0)
        };
        let account = if line.contains("\"flood\"") {
            "flood"
        } else {
            "calm"
        };
        rows.insert(
            (account, field("t")),
            (field("attempted"), field("admitted")),
        );
    }
    let total = |account: &str| {
        rows.iter()
            .filter(|((a, _), _)| *a == account)
            .fold((0, 0), |(t, a), (_, (at, ad))| (t + at, a + ad))
    };
    let (calm_attempted, calm_admitted) = total("calm");
    assert!(
        calm_attempted >= 500 * (seconds - 1),
        "calm sent {calm_attempted}"
    );
    assert_eq!(
        calm_admitted, calm_attempted,
        "the calm account was refused: {rows:?}"
    );
    // Held from the fourth second on (rounds of 500 ms; the first seconds
    // are fast onset's, measured by the simulator and the README).
    let held: Vec<_> = rows
        .iter()
        .filter(|((a, t), _)| *a == "flood" && *t >= 4)
        .collect();
    let attempted: u64 = held.iter().map(|(_, (at, _))| at).sum();
    let admitted: u64 = held.iter().map(|(_, (_, ad))| ad).sum();
    let secs = held.len() as f64;
    assert!(
        attempted as f64 / secs > 9_000.0,
        "the driver kept up: {attempted} in {secs} s"
    );
    assert_held(
        "flood through three sidecars",
        admitted as f64 / secs,
        1000.0,
        0.1,
    );

    // Stopping the sidecars sends their last rollups: the masters then
    // hold exactly what the sidecars counted.
    let (flood_attempted, flood_admitted) = total("flood");
    for sidecar in sidecars {
        sidecar.stop().await;
    }
    let ingested: Vec<_> = masters.iter().map(|m| m.master.ingested()).collect();
    let sum = |f: fn(&damper_master::Ingested) -> u64| ingested.iter().map(f).sum::<u64>();
    assert_eq!(
        sum(|i| i.attempted),
        flood_attempted + calm_attempted,
        "{ingested:?}"
    );
    assert_eq!(
        sum(|i| i.admitted),
        flood_admitted + calm_admitted,
        "{ingested:?}"
    );
    for m in masters {
        m.stop().await;
    }
}
