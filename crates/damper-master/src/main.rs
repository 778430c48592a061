//! `damper-master`: the Damper master service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use damper_core::config::MasterConfig;
use damper_core::master::MAX_SHARD_PAIRS;
use damper_core::time::parse_duration_in;
use damper_master::reload::ConfigWatcher;
use damper_master::{
    DEFAULT_CONFIG, Master, MasterOptions, ServerTls, SnapshotError, run_with_tls,
};

/// See [`damper_master::Allocator`]: why the master runs on mimalloc.
#[global_allocator]
static ALLOCATOR: damper_master::Allocator = damper_master::Allocator;

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

    /// Address of the operator's HTTP endpoint: the accounts page at `/`,
    /// `/v1/accounts`, Prometheus `/metrics`, `/healthz`. Read-only;
    /// loopback by default. Beyond loopback it requires a bearer token
    /// (--http-token-file or DAMPER_HTTP_TOKEN).
    #[arg(long, default_value = "127.0.0.1:7080", value_name = "ADDR")]
    http: SocketAddr,

    /// A file holding the bearer token the HTTP endpoint requires (every
    /// route but /healthz); the environment variable DAMPER_HTTP_TOKEN
    /// works too. Required when --http is beyond loopback.
    #[arg(long, value_name = "FILE", conflicts_with = "no_http")]
    http_token_file: Option<PathBuf>,

    /// Serve no HTTP endpoint (and record no metrics).
    #[arg(long, conflicts_with = "http")]
    no_http: bool,

    /// How often to look at --config for changes (`1s`; `0s`: only on
    /// SIGHUP). A changed valid file takes effect on the next rollup,
    /// windows kept; an invalid one is refused with a logged error and the
    /// config in force stays.
    #[arg(long, value_name = "DURATION", default_value = "1s",
          value_parser = parse_poll)]
    config_poll: Duration,

    /// Log format: `text` for people, `json` (one object per line) for log
    /// pipelines. The level comes from RUST_LOG (default `info`).
    #[arg(long, value_name = "FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    log_format: String,

    /// Number of state shards; more than cores keeps concurrent rollups
    /// from waiting on each other. Default: 4 per core.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    shards: Option<u32>,

    /// Most (account, op) entries accepted in one rollup.
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_entries: u32,

    /// Most (account, op) pairs tracked at once; reports of new pairs past
    /// it are not tracked (they fail open) and are counted, while every
    /// pair tracked, every flood held, keeps its state. About 63–69 bytes
    /// each (names of up to 15 bytes): the default holds about 0.55 GB.
    /// Shared out over the shards, each of which tracks at most 16 777 215.
    #[arg(long, value_name = "N", default_value_t = 8_000_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    max_pairs: u64,

    /// The most cost per second one agent may claim for one (account, op);
    /// a rollup or early report claiming more is refused (INVALID_ARGUMENT
    /// naming the entry) and counted.
    #[arg(long, value_name = "COST_PER_SEC", default_value_t = 10_000_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_claimed_rate: u64,

    /// The most new (account, op) pairs one agent may add per rollup
    /// interval; past it that agent's new pairs are not tracked (they fail
    /// open) and are counted, so one node cannot take all of --max-pairs.
    /// Keep it above the accounts one node serves.
    #[arg(long, value_name = "N", default_value_t = 250_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    max_new_pairs_per_agent: u64,

    /// The most account numbers the master holds for agents (4 bytes each,
    /// each distinct name once): agents name each account once and give
    /// its number after, so rollups take about 4 bytes an entry rather
    /// than 17-25. Past it, agents name their accounts in every rollup.
    /// 0 turns numbers off.
    #[arg(long, value_name = "N", default_value_t = 8_000_000,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000_000))]
    max_account_numbers: u64,

    /// Snapshot file for the demand windows: written on SIGTERM or SIGINT,
    /// loaded at start if recent, so a restart keeps enforcing. A corrupt,
    /// old or mismatched snapshot is ignored with a warning.
    #[arg(long, value_name = "FILE")]
    snapshot: Option<PathBuf>,

    /// Oldest snapshot that is loaded at start (`60s`, at most `1h`). Older
    /// counts are outside the window anyway.
    #[arg(long, value_name = "DURATION", default_value = "60s",
          value_parser = |s: &str| parse_duration_in(s, Duration::from_secs(1), Duration::from_secs(3600)))]
    snapshot_max_age: Duration,

    /// Every master of the ring, comma-separated, as agents address them
    /// (host:port). With it, this master tells agents that send it accounts
    /// it does not own that their ring differs, so they probe the masters
    /// they have down and heal the split.
    #[arg(long, value_delimiter = ',', value_name = "ADDR[,ADDR...]",
          value_parser = damper_core::ring::parse_member)]
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

    /// With --tls-client-ca: only agents whose certificate carries a
    /// subject alternative name (DNS name or URI, such as a SPIFFE ID)
    /// matching one of these patterns may report (`*` matches any run of
    /// characters); others get PERMISSION_DENIED. Comma-separated.
    #[arg(long, value_name = "PATTERN[,PATTERN...]", value_delimiter = ',',
          requires = "tls_client_ca", value_parser = allow_pattern)]
    tls_allow: Vec<String>,
}

/// A `--tls-allow` pattern: not empty, no spaces or control characters.
fn allow_pattern(text: &str) -> Result<String, String> {
    if text.is_empty() || text.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{text:?}: a pattern is a DNS name or URI, with `*` for any run"
        ));
    }
    Ok(text.to_owned())
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

fn parse_poll(s: &str) -> Result<Duration, String> {
    let every = parse_duration_in(s, Duration::ZERO, Duration::from_secs(3600))?;
    if !every.is_zero() && every < Duration::from_millis(100) {
        return Err("must be 0s (only on SIGHUP) or from 100ms to 1h".into());
    }
    Ok(every)
}

#[tokio::main]
async fn serve() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logs(&args.log_format);
    if let Some(path) = &args.check_config {
        return check_config(path);
    }
    // Listening from here on: a signal during the rest of the start (a
    // snapshot being read, say) stops the master once it serves, rather
    // than killing it with the default action.
    let signal = shutdown_signal();
    let (config, source, config_text) = load_config(args.config.as_deref())?;
    let options = master_options(&args)?;
    let tls = server_tls(&args)?;
    let token = http_token(&args)?;
    let limits = config.limits.len();
    // The recorder goes in before anything records, so no early count is
    // lost. The agent library never installs one: this binary does.
    let metrics = if args.no_http {
        None
    } else {
        Some(install_metrics()?)
    };
    let master = Master::new(config, options);
    if let Some(path) = &args.snapshot {
        restore_snapshot(&master, path, args.snapshot_max_age);
    }
    set_ring(&master, &args)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen: cannot bind {}", args.listen))?;
    let http = match args.no_http {
        true => None,
        false => Some(
            tokio::net::TcpListener::bind(args.http)
                .await
                .with_context(|| format!("--http: cannot bind {}", args.http))?,
        ),
    };

    // Shutdown fans out to every task through one watch channel: SIGINT or
    // SIGTERM flips it, and each server drains and returns.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut stopping = stopping.clone();
        async move {
            let _ = stopping.wait_for(|s| *s).await;
        }
    };
    let mut tasks = tokio::task::JoinSet::new();
    let http_addr = match http {
        Some(listener) => Some(spawn_http(
            &mut tasks,
            listener,
            &master,
            metrics.clone(),
            token,
            stopped(),
        )?),
        None => None,
    };
    if let Some(handle) = metrics {
        tasks.spawn(metrics_upkeep(handle, stopped()));
    }
    let hup = sighup()?;
    match (&args.config, config_text) {
        (Some(path), Some(text)) => {
            let watcher = ConfigWatcher::new(master.clone(), path, &text);
            let every = (!args.config_poll.is_zero()).then_some(args.config_poll);
            tasks.spawn(watcher.run(every, hup, stopped()));
        }
        _ => {
            tasks.spawn(warn_on_hup(hup, stopped()));
        }
    }
    tracing::info!(
        listen = %listener.local_addr()?,
        http = %http_addr.map_or("off".to_string(), |a| a.to_string()),
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
    warn_if_exposed(&args, tls.is_some());
    let grpc = run_with_tls(listener, master.clone(), tls, {
        let stopped = stopped();
        async move {
            signal.await;
            let _ = stop.send(true);
            stopped.await
        }
    })
    .await;
    while tasks.join_next().await.is_some() {}
    grpc?;
    if let Some(path) = &args.snapshot {
        write_snapshot(&master, path);
    }
    // What this run counted, for reconciling with the agents' own counts
    // after an incident (the chaos test does it).
    let counted = master.ingested();
    tracing::info!(
        rollups = counted.rollups,
        attempted = counted.attempted,
        admitted = counted.admitted,
        "damper-master stopped"
    );
    Ok(())
}

/// Logs to stderr, as text or JSON lines; `RUST_LOG` filters.
fn init_logs(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if format == "json" {
        tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
}

/// `--check-config FILE`: validates and says so, or names what is wrong.
fn check_config(path: &std::path::Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--check-config: cannot read {}", path.display()))?;
    let config = MasterConfig::from_toml(&text)
        .with_context(|| format!("--check-config: {}", path.display()))?;
    println!("{}: valid ({} limits)", path.display(), config.limits.len());
    Ok(())
}

/// The config in force: `--config FILE` or the embedded default. Returns it,
/// where it came from, and the file's text (to watch for changes).
fn load_config(
    path: Option<&std::path::Path>,
) -> anyhow::Result<(MasterConfig, String, Option<String>)> {
    let (text, source) = match path {
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
    Ok((config, source, path.map(|_| text)))
}

/// The service's limits from the flags, and a snapshot path that can be
/// written.
fn master_options(args: &Args) -> anyhow::Result<MasterOptions> {
    let mut options = MasterOptions::default();
    options.max_entries = args.max_entries as usize;
    options.max_pairs = args.max_pairs as usize;
    options.max_claimed_rate = args.max_claimed_rate;
    options.max_new_pairs_per_agent = args.max_new_pairs_per_agent as usize;
    options.max_account_numbers = args.max_account_numbers as usize;
    if let Some(shards) = args.shards {
        options.shards = shards as usize;
    }
    check_pairs_per_shard(options.max_pairs, options.shards)?;
    if let Some(path) = &args.snapshot {
        check_snapshot_path(path)?;
    }
    Ok(options)
}

/// `--max-pairs` is shared out over the shards, and one shard numbers at
/// most [`MAX_SHARD_PAIRS`] pairs: past it the rest would be refused
/// without a word, so the master does not start.
fn check_pairs_per_shard(max_pairs: usize, shards: usize) -> anyhow::Result<()> {
    let per_shard = max_pairs.div_ceil(shards.max(1));
    if per_shard > MAX_SHARD_PAIRS {
        anyhow::bail!(
            "--max-pairs: {max_pairs} over {shards} shards is {per_shard} a shard, past the {MAX_SHARD_PAIRS} one shard tracks; give --shards {} or more",
            max_pairs.div_ceil(MAX_SHARD_PAIRS)
        );
    }
    Ok(())
}

/// TLS from `--tls-cert`, `--tls-key` and `--tls-client-ca`, if given.
fn server_tls(args: &Args) -> anyhow::Result<Option<ServerTls>> {
    Ok(match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let tls = ServerTls::from_files(cert, key, args.tls_client_ca.as_deref())?;
            Some(match args.tls_allow.is_empty() {
                true => tls,
                false => tls.allow_identities(args.tls_allow.clone()),
            })
        }
        _ => None,
    })
}

/// Loads the windows a previous run wrote, when recent enough; starts
/// empty otherwise, saying why.
fn restore_snapshot(master: &Master, path: &std::path::Path, max_age: Duration) {
    match master.load_snapshot(path, max_age) {
        Ok(windows) => {
            tracing::info!(snapshot = %path.display(), windows, "windows restored from the snapshot")
        }
        Err(SnapshotError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(snapshot = %path.display(), "no snapshot to restore; starting empty")
        }
        Err(e) => tracing::warn!(error = %e, "ignoring the snapshot; starting empty"),
    }
}

/// Writes the windows for the next start; a failure is logged, not fatal.
fn write_snapshot(master: &Master, path: &std::path::Path) {
    match master.write_snapshot(path) {
        Ok(windows) => {
            tracing::info!(snapshot = %path.display(), windows, "windows written to the snapshot")
        }
        Err(e) => tracing::error!(error = %e, "cannot write the snapshot"),
    }
}

/// `--ring` and `--advertise`: this master's view of the ring.
fn set_ring(master: &Master, args: &Args) -> anyhow::Result<()> {
    if args.ring.is_empty() {
        return Ok(());
    }
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
    Ok(())
}

/// The HTTP endpoint's bearer token: from `--http-token-file`, else
/// `DAMPER_HTTP_TOKEN`; required when `--http` is beyond loopback, since
/// the endpoint tells anyone who asks which accounts are suppressed.
fn http_token(args: &Args) -> anyhow::Result<Option<String>> {
    let token = match &args.http_token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("--http-token-file: cannot read {}", path.display()))?,
        ),
        None => std::env::var("DAMPER_HTTP_TOKEN").ok(),
    };
    let token = token.map(|t| t.trim().to_owned());
    if token.as_deref() == Some("") {
        anyhow::bail!("--http-token-file / DAMPER_HTTP_TOKEN: the token is empty");
    }
    if token.is_none() && !args.no_http && !args.http.ip().is_loopback() {
        anyhow::bail!(
            "--http {}: the HTTP endpoint is beyond loopback, so it requires a bearer token: \
             give --http-token-file FILE or DAMPER_HTTP_TOKEN, or bind it to 127.0.0.1",
            args.http
        );
    }
    Ok(token)
}

/// Says loudly at start that agents' rollups would cross a network in the
/// clear and that anyone who reaches the port may report for any account.
fn warn_if_exposed(args: &Args, tls: bool) {
    if !tls && !args.listen.ip().is_loopback() {
        tracing::warn!(
            listen = %args.listen,
            "gRPC is served beyond loopback WITHOUT TLS: anyone who reaches this port can report \
             counts for any account; use --tls-cert/--tls-key with --tls-client-ca, or a private network"
        );
    }
}

/// Serves the operator's HTTP endpoint until `stopped`; returns its address.
fn spawn_http(
    tasks: &mut tokio::task::JoinSet<()>,
    listener: tokio::net::TcpListener,
    master: &Master,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    token: Option<String>,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<std::net::SocketAddr> {
    let addr = listener.local_addr()?;
    let master = master.clone();
    tasks.spawn(async move {
        let serving =
            damper_master::http::serve_authenticated(listener, master, metrics, token, stopped);
        if let Err(e) = serving.await {
            tracing::error!(error = %e, "HTTP endpoint failed");
        }
    });
    Ok(addr)
}

/// Histograms keep a bounded window of samples: drains it every 5 s.
async fn metrics_upkeep(
    handle: metrics_exporter_prometheus::PrometheusHandle,
    stopped: impl std::future::Future<Output = ()>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tokio::select! {
        () = stopped => {}
        () = async { loop { tick.tick().await; handle.run_upkeep(); } } => {}
    }
}

/// Without `--config`, a SIGHUP has nothing to reload: says so.
async fn warn_on_hup(
    mut hup: tokio::sync::mpsc::Receiver<()>,
    stopped: impl std::future::Future<Output = ()>,
) {
    tokio::select! {
        () = stopped => {}
        () = async {
            while hup.recv().await.is_some() {
                tracing::warn!("SIGHUP: no --config file to reload; the embedded default stays in force");
            }
        } => {}
    }
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

/// The Prometheus recorder, installed globally; its handle renders
/// `/metrics`. Durations are histograms with buckets from 100 µs to 10 s.
fn install_metrics() -> anyhow::Result<metrics_exporter_prometheus::PrometheusHandle> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_string()),
            &[
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0,
            ],
        )
        .and_then(PrometheusBuilder::install_recorder)
        .context("cannot install the metrics recorder")
}

/// Yields once per SIGHUP: the operator's "reload the config now".
fn sighup() -> anyhow::Result<tokio::sync::mpsc::Receiver<()>> {
    let (send, receive) = tokio::sync::mpsc::channel(1);
    #[cfg(unix)]
    {
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("cannot listen for SIGHUP")?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                // A reload already waiting covers this one too.
                let _ = send.try_send(());
            }
        });
    }
    #[cfg(not(unix))]
    drop(send);
    Ok(receive)
}

/// Listens for SIGINT and SIGTERM from now on, and completes on either.
/// Not an `async fn`: the handlers are installed when it is called, not
/// when the future is first polled (which the server does only once it
/// serves), so a signal right after start is not the default, fatal one
/// that skips the snapshot.
fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    let (interrupt, terminate) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        let (interrupt, terminate) = (
            async move {
                match interrupt {
                    Some(mut s) => s.recv().await.map_or((), |_| ()),
                    None => std::future::pending().await,
                }
            },
            async move {
                match terminate {
                    Some(mut s) => s.recv().await.map_or((), |_| ()),
                    None => std::future::pending().await,
                }
            },
        );
        #[cfg(not(unix))]
        let (interrupt, terminate) = (
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
            std::future::pending::<()>(),
        );
        tokio::select! {
            () = interrupt => tracing::info!("SIGINT: shutting down"),
            () = terminate => tracing::info!("SIGTERM: shutting down"),
        }
    }
}
