//! The `damper-agentd` binary: flags and config validated at start with
//! the field named, and a real process that serves, answers health and
//! metrics, and on SIGTERM stops after its last rollup.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

fn agentd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_damper-agentd"))
        .args(args)
        .output()
        .expect("damper-agentd runs")
}

#[test]
fn bad_flags_and_config_are_refused_naming_the_field() {
    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-agentd-binary-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let typo = dir.join("typo.toml");
    std::fs::write(&typo, "[masters]\naddresses = [\"m:7070\"]\n[resp]\nlisten = \"127.0.0.1:0\"\n[limits]\nmax_conections = 5\n").unwrap();
    let zero = dir.join("zero.toml");
    std::fs::write(&zero, "[masters]\naddresses = [\"m:7070\"]\n[resp]\nlisten = \"127.0.0.1:0\"\n[limits]\nmax_batch = 0\n").unwrap();
    let valid = dir.join("valid.toml");
    std::fs::write(&valid, "[masters]\naddresses = [\"m:7070\"]\n[envoy]\nlisten = \"127.0.0.1:0\"\naccount_key = \"customer\"\n").unwrap();
    let path = |p: &std::path::Path| p.display().to_string();
    for (args, says) in [
        (vec!["--resp", "127.0.0.1:0"], "masters.addresses"),
        (vec!["--masters", "127.0.0.1:1"], "no front door"),
        (
            vec!["--masters", "no-port", "--resp", "127.0.0.1:0"],
            "--masters",
        ),
        (
            vec![
                "--masters",
                "m:1",
                "--resp",
                "127.0.0.1:0",
                "--rollup-interval",
                "1ms",
            ],
            "--rollup-interval",
        ),
        (vec!["--config", &path(&typo)], "max_conections"),
        (vec!["--config", &path(&zero)], "limits.max_batch"),
        (vec!["--config", "/nonexistent/agentd.toml"], "--config"),
    ] {
        let out = agentd(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(says),
            "{args:?}: {stderr:?} does not name {says}"
        );
    }
    let out = agentd(&["--config", &path(&valid), "--check-config"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "config is valid\n");
}

fn http_get(address: &str, path: &str) -> String {
    let mut s = TcpStream::connect(address).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

#[test]
fn the_process_serves_and_stops_on_sigterm_after_its_last_rollup() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let master = runtime.block_on(common::master(500));
    let mut child = Command::new(env!("CARGO_BIN_EXE_damper-agentd"))
        .args([
            "--masters",
            &master.address.to_string(),
            "--rollup-interval",
            "500ms",
        ])
        .args([
            "--resp",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("damper-agentd starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut resp, mut http) = (None, None);
    for line in lines.by_ref() {
        let line = line.unwrap();
        let address = line
            .split("address=")
            .nth(1)
            .map(|a| a.trim().trim_matches('"').to_string());
        if line.contains("door=\"resp\"") || line.contains("door=resp") {
            resp = address;
        } else if line.contains("door=\"http\"") || line.contains("door=http") {
            http = address;
        } else if line.contains("damper-agentd serving") {
            break;
        }
    }
    let (resp, http) = (
        resp.expect("resp's address logged"),
        http.expect("http's address logged"),
    );

    let mut c = TcpStream::connect(&resp).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"DAMPER.CHECK acme messages 7\r\n").unwrap();
    let mut reply = [0u8; 64];
    let n = c.read(&mut reply).unwrap();
    assert!(String::from_utf8_lossy(&reply[..n]).starts_with("*4\r\n:1\r\n"));
    assert!(http_get(&http, "/healthz").ends_with("ok\n"));
    let metrics = http_get(&http, "/metrics");
    assert!(
        metrics.contains("damper_agentd_decisions_total{result=\"admitted\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("damper_agentd_requests_total{door=\"resp\",result=\"ok\"} 1"),
        "{metrics}"
    );
    drop(c);

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = (0..100)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            child.try_wait().unwrap()
        })
        .unwrap_or_else(|| {
            let _ = child.kill();
            panic!("damper-agentd did not stop within 10 s of SIGTERM")
        });
    assert!(status.success(), "{status:?}");
    assert_eq!(
        master.master.ingested().attempted,
        7,
        "the last rollup carried the check"
    );
    runtime.block_on(master.stop());
}
