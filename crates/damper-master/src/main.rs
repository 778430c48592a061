//! `damper-master`: the Damper master service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use damper_core::config::MasterConfig;
use damper_master::{
    DEFAULT_CONFIG, Master, MasterOptions, ServerTls, SnapshotError, run_with_tls,
};

/// The Damper master: receives agents' rollups of attempted and admitted
/// cost per (account, op) and answers with the suppression factor that
/// brings each account's admitted demand to its limit.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Validate this config file and exit: 0 if it is valid, 2 with the
    /// error (naming the field, or the line) if not. Serves nothing. For CI
    /// pipelines that change limits.
    #[arg(long, value_name = "FILE")]
    check_config: Option<PathBuf>,

    /// Address to serve gRPC on.
    #[arg(long, default_value = "127.0.0.1:7070", value_name = "ADDR")]
    listen: SocketAddr,

    /// TOML config with the [window], [policy] and [limits] tables (see
    /// docs/config.md). Without it, the embedded default (messages = 1000
    /// per account) applies.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Number of state shards; more than cores keeps concurrent rollups
    /// from waiting on each other. Default: 4 per core.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    shards: Option<u32>,

    /// Most (account, op) entries accepted in one rollup.
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_entries: u32,

    /// Snapshot file for the demand windows: written on SIGTERM or SIGINT,
    /// loaded at start if recent, so a restart keeps enforcing. A corrupt,
    /// old or mismatched snapshot is ignored with a warning.
    #[arg(long, value_name = "FILE")]
    snapshot: Option<PathBuf>,

    /// Oldest snapshot, in seconds, that is loaded at start. Older counts are
    /// outside the window anyway.
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    snapshot_max_age: u64,

    /// Every master of the ring, comma-separated, as agents address them
    /// (host:port). With it, this master tells agents that send it accounts
    /// it does not own that their ring differs, so they probe the masters
    /// they have down and heal the split.
    #[arg(long, value_delimiter = ',', value_name = "ADDR[,ADDR...]")]
    ring: Vec<String>,

    /// This master's own address in --ring. Default: --listen.
    #[arg(long, value_name = "ADDR", requires = "ring")]
    advertise: Option<String>,

    /// Serve gRPC over TLS with this certificate chain (PEM). Needs
    /// --tls-key. Without it, plain TCP: keep that to loopback or a trusted
    /// network.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Mutual TLS: refuse agents without a client certificate issued by this
    /// CA (PEM). Needs --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    match serve() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line with the cause chain, no backtrace: what an operator needs.
            eprintln!("damper-master: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

#[tokio::main]
async fn serve() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    if let Some(path) = &args.check_config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--check-config: cannot read {}", path.display()))?;
        let config = MasterConfig::from_toml(&text)
            .with_context(|| format!("--check-config: {}", path.display()))?;
        println!("{}: valid ({} limits)", path.display(), config.limits.len());
        return Ok(());
    }

    let (text, source) = match &args.config {
        Some(path) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("--config: cannot read {}", path.display()))?,
            path.display().to_string(),
        ),
        None => (
            DEFAULT_CONFIG.to_string(),
            "the embedded default".to_string(),
        ),
    };
    let config = MasterConfig::from_toml(&text).with_context(|| format!("--config: {source}"))?;

    let mut options = MasterOptions {
        max_entries: args.max_entries as usize,
        ..MasterOptions::default()
    };
    if let Some(shards) = args.shards {
        options.shards = shards as usize;
    }
    if let Some(path) = &args.snapshot {
        check_snapshot_path(path)?;
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(ServerTls::from_files(
            cert,
            key,
            args.tls_client_ca.as_deref(),
        )?),
        _ => None,
    };
    let limits = config.limits.len();
    let master = Master::new(config, options);
    if let Some(path) = &args.snapshot {
        let max_age = Duration::from_secs(args.snapshot_max_age);
        match master.load_snapshot(path, max_age) {
            Ok(windows) => {
                tracing::info!(snapshot = %path.display(), windows, "windows restored from the snapshot")
            }
            Err(SnapshotError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                tracing::info!(snapshot = %path.display(), "no snapshot to restore; starting empty")
            }
            Err(e) => tracing::warn!(error = %e, "ignoring the snapshot; starting empty"),
        }
    }
    if !args.ring.is_empty() {
        let me = args
            .advertise
            .clone()
            .unwrap_or_else(|| args.listen.to_string());
        master
            .set_ring(&args.ring, &me)
            .context(if args.advertise.is_some() {
                "--advertise"
            } else {
                "--ring (give --advertise when --listen is not the address agents use)"
            })?;
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen: cannot bind {}", args.listen))?;
    tracing::info!(
        listen = %listener.local_addr()?,
        config = %source,
        shards = options.shards,
        limits,
        tls = match &tls {
            None => "off",
            Some(_) if args.tls_client_ca.is_some() => "mutual",
            Some(_) => "server",
        },
        "damper-master serving"
    );
    run_with_tls(listener, master.clone(), tls, shutdown_signal()).await?;
    if let Some(path) = &args.snapshot {
        match master.write_snapshot(path) {
            Ok(windows) => {
                tracing::info!(snapshot = %path.display(), windows, "windows written to the snapshot")
            }
            Err(e) => tracing::error!(error = %e, "cannot write the snapshot"),
        }
    }
    tracing::info!("damper-master stopped");
    Ok(())
}

/// Fails at start, naming the flag, when the snapshot could never be
/// written: better than finding out at shutdown.
fn check_snapshot_path(path: &std::path::Path) -> anyhow::Result<()> {
    if path.is_dir() {
        anyhow::bail!(
            "--snapshot: {} is a directory; give a file path",
            path.display()
        );
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let probe = dir.join(format!(".damper-snapshot-probe-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .with_context(|| format!("--snapshot: cannot write in {}", dir.display()))?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => tracing::info!("SIGINT: shutting down"),
        () = terminate => tracing::info!("SIGTERM: shutting down"),
    }
}
