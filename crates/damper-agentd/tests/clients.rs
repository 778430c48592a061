//! The sidecar driven by clients no one on this project wrote: redis-py
//! (RESP2 and RESP3, TCP and Unix, pipelined), Debian's `redis-cli` and
//! `redis-benchmark`, Python grpcio with stubs grpcio-tools generates from
//! `check.proto`, and envoy-data-plane's stubs of Envoy's rate limit
//! service. Each test serves a master and a sidecar in-process on
//! loopback; `tests/clients/setup.sh` installs the clients.

mod common;

use common::{ServedSidecar, master, run_client, run_tool};

async fn served(id: &str) -> (damper_testkit::ServedMaster, ServedSidecar) {
    let master = master(500).await;
    let sidecar = ServedSidecar::start(&[master.address.to_string()], 500, id).await;
    sidecar.until_limit_known().await;
    (master, sidecar)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_checks_over_resp2_resp3_tcp_and_unix() {
    let (master, sidecar) = served("redis-py").await;
    run_client(
        "resp_clients.py",
        vec![sidecar.resp.to_string(), sidecar.unix.display().to_string()],
    )
    .await;
    // The bad commands counted nothing: every name the agent tracks is
    // one the script checked properly.
    assert!(sidecar.sidecar.agent().peek("calm", "messages").tracked);
    assert!(!sidecar.sidecar.agent().peek("", "messages").tracked);
    sidecar.stop().await;
    master.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_and_redis_benchmark_speak_to_it() {
    let (master, sidecar) = served("redis-cli").await;
    let port = sidecar.resp.port().to_string();
    let cli = |args: &[&str]| {
        let mut all = vec!["-p".to_owned(), port.clone()];
        all.extend(args.iter().map(|a| a.to_string()));
        all
    };

    let out = run_tool(
        "redis-cli",
        cli(&["DAMPER.CHECK", "acme", "messages", "5"]),
        None,
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n0\n0\n1000\n");
    let out = run_tool(
        "redis-cli",
        cli(&["-3", "--no-raw", "DAMPER.CHECK", "acme", "messages"]),
        None,
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1) (integer) 1\n2) (double) 0\n3) (integer) 0\n4) (double) 1000\n"
    );
    let out = run_tool(
        "redis-cli",
        cli(&["DAMPER.CHECK", "acme", "messages", "-2"]),
        None,
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ERR cost: not a non-negative integer"),
        "{out:?}"
    );

    // --pipe: raw protocol in bulk, every reply counted, no error.
    let mut bulk = Vec::new();
    for i in 0..10_000 {
        let account = format!("pipe-{}", i % 10);
        bulk.extend_from_slice(
            format!(
                "*4\r\n$12\r\nDAMPER.CHECK\r\n${}\r\n{account}\r\n$8\r\nmessages\r\n$1\r\n1\r\n",
                account.len()
            )
            .as_bytes(),
        );
    }
    let out = run_tool("redis-cli", cli(&["--pipe"]), Some(bulk)).await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("errors: 0, replies: 10000"), "{said}");

    // redis-benchmark with the custom command, pipelined, over 4 connections.
    let out = run_tool(
        "redis-benchmark",
        cli(&[
            "-n",
            "20000",
            "-c",
            "4",
            "-P",
            "16",
            "-q",
            "DAMPER.CHECK",
            "bench",
            "messages",
            "1",
        ]),
        None,
    )
    .await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("requests per second"),
        "{said}"
    );
    let peek = sidecar.sidecar.agent().peek("bench", "messages");
    assert!(
        peek.tracked && peek.factor > 0.0,
        "20 000 checks at once are a flood: {peek:?}"
    );
    sidecar.stop().await;
    master.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_checks_over_damper_v1() {
    let (master, sidecar) = served("grpcio").await;
    let proto = common::crate_dir().join("../../proto");
    run_client(
        "grpc_check.py",
        vec![sidecar.grpc.to_string(), proto.display().to_string()],
    )
    .await;
    sidecar.stop().await;
    master.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_rate_limit_service_protocol_from_its_published_stubs() {
    let (master, sidecar) = served("envoy").await;
    run_client("envoy_rls.py", vec![sidecar.envoy.to_string()]).await;
    sidecar.stop().await;
    master.stop().await;
}
