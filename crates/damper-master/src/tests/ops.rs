//! Operating the master: live reloads, the accounts query and the HTTP
//! endpoint (through the router, no socket).

use super::*;
use crate::reload::{Cause, ConfigWatcher, ReloadError};
use axum::body::Body;
use axum::http::{Request as HttpRequest, StatusCode};
use damper_core::master::KeyView;
use tower::ServiceExt;

/// A master under `messages = 1000` that has seen `flood` at 4000/s,
/// `calm` at 50/s and `acme-1`, `acme-2` at 2000/s and 1600/s on messages,
/// plus `flood` on the unlimited `presence`. (All over 1.5× the limit: a
/// window new to the master suppresses only above that, see
/// `UNKNOWN_NOISE_MARGIN`.)
fn busy(clock: Arc<ManualClock>) -> Master {
    let m = master(clock);
    // Two rollups: this test master takes at most 4 entries per call.
    m.rollup(&request(vec![(
        "messages",
        vec![
            counts("flood", 8_000, 8_000),
            counts("calm", 100, 100),
            counts("acme-1", 4_000, 4_000),
            counts("acme-2", 3_200, 3_200),
        ],
    )]))
    .unwrap();
    m.rollup(&request(vec![(
        "presence",
        vec![counts("flood", 500, 500)],
    )]))
    .unwrap();
    m
}

fn config(text: &str) -> MasterConfig {
    MasterConfig::from_toml(text).unwrap()
}

#[test]
fn a_reload_changes_factors_at_once_and_keeps_every_window() {
    let m = busy(clock());
    assert_eq!(m.factor("flood", "messages"), Some(0.75));
    let summary = m
        .reload(config(
            "[limits]\nmessages = 1000\n\"messages/flood\" = 2000\n",
        ))
        .unwrap();
    assert_eq!(summary.changed, ["messages/flood: - -> 2000"]);
    assert_eq!(summary.limits, 2);
    // Same window (4000/s), new limit: no report needed to see it.
    assert_eq!(m.factor("flood", "messages"), Some(0.5));
    assert_eq!(m.factor("acme-1", "messages"), Some(0.5));
    assert_eq!(m.len(), 5);
    // And the next rollup's reply carries it.
    let reply = m
        .rollup(&request(vec![("messages", vec![counts("flood", 0, 0)])]))
        .unwrap();
    assert_eq!(reply.ops[0].accounts[0].limit, 2000.0);
}

#[test]
fn a_reload_that_cuts_windows_differently_is_refused_and_changes_nothing() {
    let m = busy(clock());
    for (text, field) in [
        (
            "[window]\nsub_intervals = 3\n[limits]\nmessages = 9",
            "sub_intervals",
        ),
        (
            "[window]\nrollup_interval_ms = 1000\n[limits]\nmessages = 9",
            "rollup_interval_ms",
        ),
        (
            "[window]\nsub_interval_ms = 5000\n[limits]\nmessages = 9",
            "sub_interval_ms",
        ),
        (
            // Latest-round windows keep no sub-intervals for ably-mma to read.
            "[window]\nestimator = \"ably-mma\"\n[limits]\nmessages = 1000",
            "estimator",
        ),
    ] {
        match m.reload(config(text)) {
            Err(ReloadError::ShapeChanged { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{text:?}: {other:?}"),
        }
    }
    assert_eq!(m.factor("flood", "messages"), Some(0.75));
    // The policy may change: it reads the same estimate.
    let summary = m
        .reload(config(
            "[policy]\nkind = \"linear-ramp\"\n[limits]\nmessages = 1000",
        ))
        .unwrap();
    assert!(summary.policy_changed && summary.changed.is_empty());
}

#[test]
fn the_watcher_reloads_changed_files_refuses_bad_ones_and_reports_each_once() {
    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-watch-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let path = dir.join("master.toml");
    let first = "[limits]\nmessages = 1000\n";
    std::fs::write(&path, first).unwrap();
    let m = busy(clock());
    let mut watcher = ConfigWatcher::new(m.clone(), &path, first);
    assert!(watcher.check(Cause::Changed).is_none(), "unchanged");

    std::fs::write(
        &path,
        "[limits]\nmessages = 1000\n\"messages/flood\" = 2000\n",
    )
    .unwrap();
    let summary = watcher.check(Cause::Changed).unwrap().unwrap();
    assert_eq!(summary.changed, ["messages/flood: - -> 2000"]);
    assert_eq!(m.factor("flood", "messages"), Some(0.5));
    assert!(watcher.check(Cause::Changed).is_none());

    // A bad file: refused, naming field and line; the limits in force stay.
    std::fs::write(
        &path,
        "[limits]\nmessages = 1000\n\"messages/flood\" = -1\n",
    )
    .unwrap();
    let e = watcher
        .check(Cause::Changed)
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("limits.\"messages/flood\"") && e.contains("line 3"),
        "{e}"
    );
    assert_eq!(m.factor("flood", "messages"), Some(0.5));
    assert!(watcher.check(Cause::Changed).is_none(), "reported once");
    // SIGHUP tries again, and says so again.
    assert!(watcher.check(Cause::Signal).unwrap().is_err());
    // Not TOML at all.
    std::fs::write(&path, "[limits\nmessages = 1000\n").unwrap();
    let e = watcher
        .check(Cause::Changed)
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 1"), "{e}");

    // A missing file (a deploy swapping it): reported once, nothing changes.
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        watcher.check(Cause::Changed),
        Some(Err(ReloadError::Read { .. }))
    ));
    assert!(watcher.check(Cause::Changed).is_none());
    assert_eq!(m.factor("flood", "messages"), Some(0.5));

    // Fixed: in force again.
    std::fs::write(&path, "[limits]\nmessages = 4000\n").unwrap();
    watcher.check(Cause::Changed).unwrap().unwrap();
    assert_eq!(m.factor("flood", "messages"), Some(0.0));
}

fn names(views: &[KeyView]) -> Vec<String> {
    views
        .iter()
        .map(|v| format!("{}/{}", v.op, v.account))
        .collect()
}

#[test]
fn the_accounts_query_filters_sorts_and_cuts() {
    let m = busy(clock());
    let all = |q: AccountsQuery| m.accounts(&q);

    let (views, matched) = all(AccountsQuery::default());
    assert_eq!(matched, 5);
    // By factor, largest first; ties (all zero) by account then op.
    assert_eq!(
        names(&views),
        [
            "messages/flood",
            "messages/acme-1",
            "messages/acme-2",
            "messages/calm",
            "presence/flood"
        ]
    );
    let (views, _) = all(AccountsQuery {
        min_factor: 0.1,
        ..AccountsQuery::default()
    });
    assert_eq!(
        names(&views),
        ["messages/flood", "messages/acme-1", "messages/acme-2"]
    );
    let (views, _) = all(AccountsQuery {
        prefix: Some("acme".into()),
        sort: AccountsSort::Account,
        ..AccountsQuery::default()
    });
    assert_eq!(names(&views), ["messages/acme-1", "messages/acme-2"]);
    let (views, matched) = all(AccountsQuery {
        op: Some("presence".into()),
        ..AccountsQuery::default()
    });
    assert_eq!(
        (names(&views), matched),
        (vec!["presence/flood".to_string()], 1)
    );
    // Unlimited: ratio 0, so last by ratio; demand still sorts it.
    let (views, matched) = all(AccountsQuery {
        sort: AccountsSort::Ratio,
        limit: 2,
        ..AccountsQuery::default()
    });
    assert_eq!(
        (names(&views), matched),
        (vec!["messages/flood".into(), "messages/acme-1".into()], 5)
    );
    let (views, _) = all(AccountsQuery {
        sort: AccountsSort::Demand,
        ..AccountsQuery::default()
    });
    assert_eq!(
        views.iter().map(|v| v.demand).collect::<Vec<_>>(),
        [4000.0, 2000.0, 1600.0, 250.0, 50.0]
    );
    let (views, _) = all(AccountsQuery {
        account: Some("flood".into()),
        ..AccountsQuery::default()
    });
    assert_eq!(names(&views), ["messages/flood", "presence/flood"]);
}

async fn get(m: &Master, uri: &str) -> (StatusCode, String) {
    let response = crate::http::router(m.clone(), None)
        .oneshot(HttpRequest::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test]
async fn the_http_accounts_endpoint_filters_sorts_and_refuses_bad_parameters() {
    let m = busy(clock());
    let (status, body) = get(
        &m,
        "/v1/accounts?op=messages&min_factor=0.3&sort=demand&limit=2",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let reply = json(&body);
    assert_eq!(reply["matched"], 3);
    assert_eq!(reply["now_unix_ms"], T0_MS + 5);
    let rows = reply["accounts"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["account"], "flood");
    assert_eq!(rows[0]["op"], "messages");
    assert_eq!(rows[0]["limit"], 1000.0);
    assert_eq!(rows[0]["limit_key"], "messages");
    assert_eq!(rows[0]["demand"], 4000.0);
    assert_eq!(rows[0]["factor"], 0.75);
    assert_eq!(rows[0]["ratio"], 4.0);
    // Kept to the second.
    assert_eq!(rows[0]["last_report_unix_ms"], T0_MS);
    assert_eq!(rows[1]["account"], "acme-1");

    let (_, body) = get(&m, "/v1/accounts?prefix=acme&sort=account").await;
    let accounts: Vec<_> = json(&body)["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["account"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(accounts, ["acme-1", "acme-2"]);

    for (query, names) in [
        ("min_factor=2", "`min_factor`"),
        ("min_factor=lots", "`min_factor`"),
        ("sort=size", "`sort`"),
        ("limit=0", "`limit`"),
        ("limit=10001", "`limit`"),
        ("opp=messages", "`opp`"),
    ] {
        let (status, body) = get(&m, &format!("/v1/accounts?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        let error = json(&body)["error"].as_str().unwrap().to_string();
        assert!(error.contains(names), "{query}: {error}");
    }
}

#[tokio::test]
async fn the_http_endpoint_shows_one_account_the_page_and_health() {
    let m = busy(clock());
    let (status, body) = get(&m, "/v1/accounts/flood").await;
    assert_eq!(status, StatusCode::OK);
    let reply = json(&body);
    assert_eq!(reply["account"], "flood");
    let ops: Vec<_> = reply["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].clone())
        .collect();
    assert_eq!(ops, ["messages", "presence"]);
    let (status, body) = get(&m, "/v1/accounts/nobody").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(json(&body)["error"].as_str().unwrap().contains("nobody"));
    let long = "a".repeat(300);
    let (status, _) = get(&m, &format!("/v1/accounts/{long}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let (status, page) = get(&m, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("<table id=\"accounts\">") && page.contains("v1/accounts?"));
    assert_eq!(
        get(&m, "/healthz").await,
        (StatusCode::OK, "ok\n".to_string())
    );
    // No recorder handle given: no metrics, said plainly.
    assert_eq!(get(&m, "/metrics").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test(start_paused = true)]
async fn the_watcher_task_polls_answers_signals_and_stops_on_shutdown() {
    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-watch-task-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let (polled, signalled) = (dir.join("polled.toml"), dir.join("signalled.toml"));
    let first = "[limits]\nmessages = 1000\n";
    let granted = "[limits]\nmessages = 1000\n\"messages/flood\" = 2000\n";
    let (a, b) = (busy(clock()), busy(clock()));
    let mut tasks = Vec::new();
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut hups = Vec::new();
    for (m, path, every) in [
        (&a, &polled, Some(Duration::from_secs(1))),
        (&b, &signalled, None),
    ] {
        std::fs::write(path, first).unwrap();
        let (hup, signals) = tokio::sync::mpsc::channel(1);
        hups.push(hup);
        let mut stopping = stopping.clone();
        tasks.push(tokio::spawn(
            ConfigWatcher::new(m.clone(), path, first).run(every, signals, async move {
                let _ = stopping.wait_for(|s| *s).await;
            }),
        ));
    }
    std::fs::write(&polled, granted).unwrap();
    std::fs::write(&signalled, granted).unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        a.factor("flood", "messages"),
        Some(0.5),
        "polled within a second"
    );
    assert_eq!(
        b.factor("flood", "messages"),
        Some(0.75),
        "no polling: waits for a signal"
    );
    hups[1].send(()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(b.factor("flood", "messages"), Some(0.5));

    stop.send(true).unwrap();
    for task in tasks {
        task.await.unwrap();
    }
}

/// With a token, every route but `/healthz` needs `Authorization: Bearer
/// TOKEN`; a missing or wrong one is a 401 that says what is needed.
#[tokio::test]
async fn a_token_guards_every_route_but_healthz() {
    let m = busy(clock());
    let routes =
        crate::http::authenticated(crate::http::router(m.clone(), None), Some("s3cret".into()));
    let ask = |uri: &str, auth: Option<&str>| {
        let mut request = HttpRequest::get(uri);
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        routes.clone().oneshot(request.body(Body::empty()).unwrap())
    };
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer s3cre"),
        Some("s3cret"),
        Some("Basic s3cret"),
    ] {
        let response = ask("/v1/accounts", auth).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
    }
    assert_eq!(
        ask("/v1/accounts", Some("Bearer s3cret"))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        ask("/", Some("Bearer s3cret")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        ask("/healthz", None).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        ask("/", None).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
}

/// Serves `m` over gRPC on a fresh loopback port; the address, and the
/// sender that stops it.
async fn serve_grpc(m: &Master) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(crate::run(listener, m.clone(), async {
        let _ = stopped.await;
    }));
    // Serving has begun once the server has said how its peers are reached
    // (until then the ring's view names them missing).
    while m.shared.peers.transport.get().is_none() {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    (address, stop)
}

/// Any master of a ring answers `/v1/accounts` for the whole ring: its
/// own rows and its peers', merged in the query's order and cut to its
/// limit, each naming its master; a peer that is down, and one that hangs,
/// are named and the view marked partial, the hanging one within the peer
/// timeout; `local=true` keeps to its own. One account's page finds it on
/// whichever master holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_master_shows_the_whole_ring_and_names_the_masters_that_did_not_answer() {
    let a = busy(clock());
    let b = master(clock());
    b.rollup(&request(vec![(
        "messages",
        vec![counts("beta", 6_000, 6_000), counts("quiet", 10, 10)],
    )]))
    .unwrap();
    let c = master(clock());
    c.rollup(&request(vec![(
        "messages",
        vec![counts("gamma", 5_000, 5_000)],
    )]))
    .unwrap();
    let (address_a, stop_a) = serve_grpc(&a).await;
    let (address_b, stop_b) = serve_grpc(&b).await;
    let (address_c, stop_c) = serve_grpc(&c).await;
    // A member nothing listens on: a master that was killed.
    let killed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    // One that accepts connections and never answers: a hung master.
    let hung_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung = hung_listener.local_addr().unwrap().to_string();
    let ring = [
        address_a.clone(),
        address_b.clone(),
        address_c.clone(),
        killed.clone(),
        hung.clone(),
    ];
    a.set_ring(&ring, &address_a).unwrap();
    b.set_ring(&ring, &address_b).unwrap();
    c.set_ring(&ring, &address_c).unwrap();

    let asked = tokio::time::Instant::now();
    let (status, body) = get(&a, "/v1/accounts?op=messages&sort=demand&limit=4").await;
    let took = asked.elapsed();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        took < crate::PEER_TIMEOUT * 3,
        "the hung peer held the view for {took:?}"
    );
    let reply = json(&body);
    let rows: Vec<(String, String, f64)> = reply["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["account"].as_str().unwrap().to_owned(),
                r["master"].as_str().unwrap().to_owned(),
                r["demand"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("flood".into(), address_a.clone(), 4000.0),
            ("beta".into(), address_b.clone(), 3000.0),
            ("gamma".into(), address_c.clone(), 2500.0),
            ("acme-1".into(), address_a.clone(), 2000.0),
        ]
    );
    // a: flood, calm, acme-1, acme-2 on messages; b: beta, quiet; c: gamma.
    assert_eq!(reply["matched"], 7);
    assert_eq!(reply["partial"], true);
    // This master first, then its peers in the ring's order.
    let mut masters: Vec<&str> = reply["masters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(masters[0], address_a);
    masters.sort_unstable();
    let mut live = [address_a.as_str(), &address_b, &address_c];
    live.sort_unstable();
    assert_eq!(masters, live);
    let missing: std::collections::BTreeMap<&str, &str> = reply["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["master"].as_str().unwrap(), m["error"].as_str().unwrap()))
        .collect();
    assert_eq!(missing.len(), 2, "{reply}");
    assert!(
        missing[killed.as_str()].contains("unavailable"),
        "{missing:?}"
    );
    assert!(missing[hung.as_str()].contains("within"), "{missing:?}");

    let (_, body) = get(&a, "/v1/accounts?op=messages&local=true").await;
    let local = json(&body);
    assert_eq!(local["matched"], 4);
    assert_eq!(local["partial"], false);
    assert!(local["accounts"][0].get("master").is_none(), "{local}");

    // From b, a's account; from a, c's.
    let (status, body) = get(&b, "/v1/accounts/flood").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(json(&body)["ops"][0]["master"], address_a.as_str());
    let (status, body) = get(&a, "/v1/accounts/gamma").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = get(&a, "/v1/accounts/gamma?local=true").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = get(&a, "/v1/accounts?local=maybe").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("`local`"), "{body}");

    drop(hung_listener);
    let _ = (stop_a.send(()), stop_b.send(()), stop_c.send(()));
}

/// Before its gRPC server starts (it says how peers are reached: plain or
/// TLS), a master asked for the ring's view names every peer missing
/// rather than asking them the wrong way, and shows its own rows.
#[tokio::test]
async fn before_its_grpc_server_starts_a_master_shows_its_own_rows_and_names_its_peers_missing() {
    let a = busy(clock());
    a.set_ring(&["127.0.0.1:1".into(), "127.0.0.1:2".into()], "127.0.0.1:1")
        .unwrap();
    let (status, body) = get(&a, "/v1/accounts?op=messages").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let reply = json(&body);
    assert_eq!(reply["matched"], 4);
    assert_eq!(reply["partial"], true);
    assert_eq!(reply["missing"][0]["master"], "127.0.0.1:2");
    assert!(
        reply["missing"][0]["error"]
            .as_str()
            .unwrap()
            .contains("not started"),
        "{reply}"
    );
}

/// A peer whose connection hung is dialled anew for the next view: a
/// connection a partition left stuck would otherwise keep the peer missing
/// long after the network healed. The stand-in peer never answers on its
/// first connection and forwards every later one to a real master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_did_not_answer_is_dialled_anew_for_the_next_view() {
    let a = busy(clock());
    let b = master(clock());
    b.rollup(&request(vec![(
        "messages",
        vec![counts("beta", 6_000, 6_000)],
    )]))
    .unwrap();
    let (address_a, _stop_a) = serve_grpc(&a).await;
    let (address_b, _stop_b) = serve_grpc(&b).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let flaky = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut stuck = Vec::new();
        loop {
            let (mut inbound, _) = listener.accept().await.unwrap();
            if stuck.is_empty() {
                stuck.push(inbound);
                continue;
            }
            let to = address_b.clone();
            tokio::spawn(async move {
                let mut outbound = tokio::net::TcpStream::connect(to).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    });
    a.set_ring(&[address_a.clone(), flaky.clone()], &address_a)
        .unwrap();
    let (_, body) = get(&a, "/v1/accounts?op=messages").await;
    let first = json(&body);
    assert_eq!(first["partial"], true, "{body}");
    assert_eq!(first["missing"][0]["master"], flaky.as_str());
    let (_, body) = get(&a, "/v1/accounts?op=messages").await;
    let second = json(&body);
    assert_eq!(second["partial"], false, "{body}");
    let rows: Vec<&str> = second["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["master"] == flaky.as_str())
        .map(|r| r["account"].as_str().unwrap())
        .collect();
    assert_eq!(rows, ["beta"]);
}
