//! What a broken or hostile client gets from the Redis-protocol door: a
//! precise error, the connection closed only where the protocol has lost
//! its place, limits on connections, command size and idling, and a
//! sidecar that stays up for everyone else.

mod common;

use std::time::Duration;

use common::{ServedSidecar, master};
use damper_agentd::{EnvoyConfig, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `bytes`, then reads until the server closes or `wait` passes.
async fn exchange(stream: &mut TcpStream, bytes: &[u8], wait: Duration) -> (String, bool) {
    stream.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match tokio::time::timeout(wait, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

async fn sidecar(limits: Limits) -> (damper_testkit::ServedMaster, ServedSidecar) {
    let master = master(500).await;
    let sidecar = ServedSidecar::start_with(
        &[master.address.to_string()],
        500,
        "bad-input",
        EnvoyConfig::default(),
        limits,
    )
    .await;
    (master, sidecar)
}

const SHORT: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_errors_keep_the_connection_and_protocol_errors_close_it() {
    let mut limits = Limits::default();
    limits.max_frame_bytes = 1024;
    let (master, s) = sidecar(limits).await;

    let mut c = TcpStream::connect(s.resp).await.unwrap();
    let (said, closed) = exchange(
        &mut c,
        b"DAMPER.CHECK acme\r\nDAMPER.CHECK acme messages x\r\nPING\r\n",
        SHORT,
    )
    .await;
    assert_eq!(
        said,
        "-ERR wrong number of arguments for 'damper.check' command\r\n\
         -ERR cost: not a non-negative integer (or over 2^64 - 1)\r\n+PONG\r\n"
    );
    assert!(!closed);

    for (bytes, says) in [
        (
            &b"*1\r\n*1\r\n*1\r\n$4\r\nPING\r\n"[..],
            "-ERR Protocol error: expected '$', got '*'\r\n",
        ),
        (
            b"*2\r\n$4\r\nECHO\r\n$5000\r\n",
            "-ERR Protocol error: invalid bulk length\r\n",
        ),
        (
            b"*1\r\n$4\r\nPINGxx",
            "-ERR Protocol error: expected CRLF after a bulk string\r\n",
        ),
    ] {
        let mut c = TcpStream::connect(s.resp).await.unwrap();
        let (said, closed) = exchange(&mut c, bytes, Duration::from_secs(5)).await;
        assert_eq!(said, says);
        assert!(closed, "the connection is closed after a protocol error");
    }
    // An inline line past the frame limit, sent without a newline.
    let mut c = TcpStream::connect(s.resp).await.unwrap();
    let (said, closed) = exchange(&mut c, &[b'A'; 2000], Duration::from_secs(5)).await;
    assert_eq!(said, "-ERR Protocol error: too big inline request\r\n");
    assert!(closed);

    // Nothing malformed was counted, and the sidecar still serves.
    assert!(!s.sidecar.agent().peek("acme", "messages").tracked);
    let mut c = TcpStream::connect(s.resp).await.unwrap();
    let (said, _) = exchange(&mut c, b"PING\r\n", SHORT).await;
    assert_eq!(said, "+PONG\r\n");
    s.stop().await;
    master.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused_and_idle_ones_closed() {
    let mut limits = Limits::default();
    limits.max_connections = 2;
    limits.idle_timeout = Duration::from_secs(3);
    let (master, s) = sidecar(limits).await;

    let mut first = TcpStream::connect(s.resp).await.unwrap();
    let mut second = TcpStream::connect(s.resp).await.unwrap();
    assert_eq!(
        exchange(&mut first, b"PING\r\n", SHORT).await.0,
        "+PONG\r\n"
    );
    assert_eq!(
        exchange(&mut second, b"PING\r\n", SHORT).await.0,
        "+PONG\r\n"
    );
    let mut third = TcpStream::connect(s.resp).await.unwrap();
    let (said, closed) = exchange(&mut third, b"PING\r\n", Duration::from_secs(5)).await;
    assert_eq!(said, "-ERR max number of clients reached\r\n");
    assert!(closed);

    // Idle past the timeout: closed by the sidecar (bounded generously).
    let (said, closed) = exchange(&mut first, b"", Duration::from_secs(10)).await;
    assert_eq!((said.as_str(), closed), ("", true));
    let (_, closed) = exchange(&mut second, b"", Duration::from_secs(10)).await;
    assert!(closed);
    // Their places are free again.
    let mut fourth = TcpStream::connect(s.resp).await.unwrap();
    assert_eq!(
        exchange(&mut fourth, b"PING\r\n", SHORT).await.0,
        "+PONG\r\n"
    );
    s.stop().await;
    master.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_what_was_read_and_closes_idle_connections() {
    let (master, s) = sidecar(Limits::default()).await;
    let mut c = TcpStream::connect(s.resp).await.unwrap();
    let pipelined = b"DAMPER.CHECK acme messages 3\r\n".repeat(100);
    let (said, _) = exchange(&mut c, &pipelined, SHORT).await;
    assert_eq!(said.matches("*4\r\n:1\r\n").count(), 100);
    // An idle client does not hold the shutdown up (idle_timeout is 5 min).
    tokio::time::timeout(Duration::from_secs(10), s.stop())
        .await
        .expect("the sidecar stops promptly with an idle client connected");
    let (_, closed) = exchange(&mut c, b"", Duration::from_secs(5)).await;
    assert!(closed);
    // The last rollup carried the 300 cost.
    assert_eq!(master.master.ingested().attempted, 300);
    master.stop().await;
}
