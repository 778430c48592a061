//! What the sidecar's end-to-end tests share: masters and sidecars served
//! in-process on loopback, and the external clients' paths.
#![allow(dead_code)] // Each test file uses its own part.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use damper_agent::Agent;
use damper_agentd::resp::RespListener;
use damper_agentd::{EnvoyConfig, Limits, Listeners, ServeError, Sidecar, run};
use damper_core::config::MasterConfig;
use damper_master::{Master, MasterOptions};
use damper_testkit::ServedMaster;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A master config: `messages` limited to 1000 cost/s, and `trial` too but
/// in shadow (nothing refused, would-be refusals marked), with rounds of
/// `rollup_ms`.
pub fn master_config(rollup_ms: u64) -> MasterConfig {
    let sub = rollup_ms * 3;
    let grace = rollup_ms * 2 / 5;
    MasterConfig::from_toml(&format!(
        "[window]\nrollup_interval_ms = {rollup_ms}\nsub_interval_ms = {sub}\ngrace_ms = {grace}\n\
         [limits]\nmessages = 1000\ntrial = 1000\n[shadow]\nops = [\"trial\"]\n"
    ))
    .expect("a valid master config")
}

/// A master on a fresh loopback port.
pub async fn master(rollup_ms: u64) -> ServedMaster {
    ServedMaster::start(
        Master::new(master_config(rollup_ms), MasterOptions::default()),
        None,
    )
    .await
}

/// A sidecar served in-process on fresh loopback ports, every door open.
pub struct ServedSidecar {
    /// Its state.
    pub sidecar: Sidecar,
    /// `damper.v1.Check`.
    pub grpc: SocketAddr,
    /// Envoy's rate limit service.
    pub envoy: SocketAddr,
    /// The Redis protocol over TCP.
    pub resp: SocketAddr,
    /// The Redis protocol over a Unix socket.
    pub unix: PathBuf,
    /// `/healthz`, `/metrics`.
    pub http: SocketAddr,
    stop: oneshot::Sender<()>,
    server: JoinHandle<Result<(), ServeError>>,
}

async fn loopback() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port")
}

impl ServedSidecar {
    /// A sidecar rolling up to `masters` every `rollup_ms`, its Envoy door
    /// checking descriptors under `messages`, their `client` entry naming
    /// the publisher.
    pub async fn start(masters: &[String], rollup_ms: u64, id: &str) -> ServedSidecar {
        let mut envoy = EnvoyConfig::default();
        envoy.op = Some("messages".into());
        envoy.publisher_key = Some("client".into());
        Self::start_with(masters, rollup_ms, id, envoy, Limits::default()).await
    }

    /// [`start`](Self::start) with its Envoy mapping and limits given.
    pub async fn start_with(
        masters: &[String],
        rollup_ms: u64,
        id: &str,
        envoy: EnvoyConfig,
        limits: Limits,
    ) -> ServedSidecar {
        let agent = Agent::builder()
            .masters(masters.iter().cloned())
            .agent_id(id)
            .rollup_interval(Duration::from_millis(rollup_ms))
            .start()
            .expect("the agent starts");
        let sidecar = Sidecar::new(agent, limits);
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let unix = std::env::temp_dir().join(format!(
            "damper-agentd-{}-{id}-{n}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&unix);
        let mut listeners = Listeners::default();
        listeners.grpc = Some(loopback().await);
        listeners.envoy = Some(loopback().await);
        listeners.http = Some(loopback().await);
        let resp = loopback().await;
        let addr = |l: &Option<TcpListener>| l.as_ref().unwrap().local_addr().unwrap();
        let (grpc, envoy_addr, http) = (
            addr(&listeners.grpc),
            addr(&listeners.envoy),
            addr(&listeners.http),
        );
        let resp_addr = resp.local_addr().unwrap();
        listeners.resp = vec![
            RespListener::Tcp(resp),
            RespListener::Unix(
                UnixListener::bind(&unix).expect("a unix socket"),
                unix.clone(),
            ),
        ];
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(run(sidecar.clone(), listeners, envoy, None, async {
            let _ = stopped.await;
        }));
        ServedSidecar {
            sidecar,
            grpc,
            envoy: envoy_addr,
            resp: resp_addr,
            unix,
            http,
            stop,
            server,
        }
    }

    /// Waits until the agent has learnt `messages`' default limit from a
    /// master (its hello), so clients see the limit from their first call.
    pub async fn until_limit_known(&self) {
        for _ in 0..200 {
            if self.sidecar.agent().peek("probe", "messages").limit > 0.0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the sidecar never learnt the op's limit from its master");
    }

    /// Shuts it down, waits for it (the agent's last rollup included), and
    /// panics if serving failed.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.server
            .await
            .expect("the server task does not panic")
            .expect("the sidecar serves without error");
        assert!(
            !self.unix.exists(),
            "the unix socket is removed at shutdown"
        );
    }
}

/// This crate's directory.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python of the clients' virtualenv, which `tests/clients/setup.sh`
/// makes (`.ci/run` runs it).
pub fn python() -> PathBuf {
    let python = crate_dir().join("tests/clients/.venv/bin/python");
    assert!(
        python.exists(),
        "the sidecar's client tests need redis-py, grpcio and envoy-data-plane: \
         run crates/damper-agentd/tests/clients/setup.sh (.ci/run does)"
    );
    python
}

/// Runs a client script from `tests/clients` with `args`, off the async
/// runtime's threads, and panics with its output unless it succeeds.
pub async fn run_client(script: &str, args: Vec<String>) -> Output {
    let python = python();
    let path = crate_dir().join("tests/clients").join(script);
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(path)
            .args(args)
            .output()
            .expect("python runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{script}:\n{stdout}{stderr}");
    assert!(
        output.status.success(),
        "{script} failed:\n{stdout}{stderr}"
    );
    output
}

/// Runs a command (redis-cli, redis-benchmark) off the runtime's threads.
pub async fn run_tool(program: &'static str, args: Vec<String>, stdin: Option<Vec<u8>>) -> Output {
    assert!(
        Command::new("which")
            .arg(program)
            .output()
            .is_ok_and(|o| o.status.success()),
        "{program} is missing: run crates/damper-agentd/tests/clients/setup.sh (.ci/run does)"
    );
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        use std::process::Stdio;
        let mut child = Command::new(program)
            .args(&args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the tool runs");
        if let Some(bytes) = stdin {
            child.stdin.take().unwrap().write_all(&bytes).unwrap();
        }
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}
