//! `damper-agentd`: the Damper agent as a sidecar. See the library docs
//! and docs/sidecar.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use damper_agent::{Agent, AgentTls};
use damper_agentd::{Config, Listeners, Sidecar, run};
use damper_core::time::parse_duration_in;

/// The Damper agent as a sidecar: decides each operation in-process, rolls
/// counts up to the masters like any agent, and answers over gRPC
/// (`damper.v1.Check`), Envoy's rate limit service, and the Redis protocol
/// (`DAMPER.CHECK account op [cost]`). Flags override the config file.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// A TOML config file (docs/sidecar.md); flags given override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Validate the config (file and flags) and exit: 0 if it is valid.
    #[arg(long)]
    check_config: bool,

    /// The Damper masters, comma-separated host:port.
    #[arg(long, value_delimiter = ',', value_name = "ADDR[,ADDR...]",
          value_parser = damper_core::ring::parse_member)]
    masters: Vec<String>,

    /// A host:port whose name resolves to every master (instead of --masters).
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "masters")]
    masters_dns: Option<String>,

    /// This sidecar's identity in rollups and logs (default: host name and pid).
    #[arg(long, value_name = "ID")]
    agent_id: Option<String>,

    /// The rollup interval (`2s`, `500ms`); must match the masters'.
    #[arg(long, value_name = "DURATION",
          value_parser = |s: &str| parse_duration_in(s, Duration::from_millis(10), Duration::from_secs(3600)))]
    rollup_interval: Option<Duration>,

    /// Serve damper.v1.Check (gRPC) here.
    #[arg(long, value_name = "ADDR")]
    grpc: Option<SocketAddr>,

    /// Serve Envoy's rate limit service (gRPC) here.
    #[arg(long, value_name = "ADDR")]
    envoy: Option<SocketAddr>,

    /// Serve the Redis protocol on this TCP address.
    #[arg(long, value_name = "ADDR")]
    resp: Option<SocketAddr>,

    /// Serve the Redis protocol on this Unix socket.
    #[arg(long, value_name = "PATH")]
    resp_unix: Option<PathBuf>,

    /// Serve /healthz and /metrics here.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,

    /// Log format: `text` or `json`. The level comes from RUST_LOG (default `info`).
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

/// mimalloc, as the master: each request over RESP or gRPC allocates and
/// frees its buffers and names (docs/performance.md, "The sidecar").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    match start() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("damper-agentd: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// The config file, with the flags over it, validated.
fn config(args: &Args) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--config: cannot read {}", path.display()))?;
            Config::from_toml(&text).with_context(|| format!("{}", path.display()))?
        }
        None => Config::default(),
    };
    if !args.masters.is_empty() {
        config.masters.addresses = args.masters.clone();
        config.masters.dns = None;
    }
    if let Some(dns) = &args.masters_dns {
        config.masters.dns = Some(dns.clone());
        config.masters.addresses.clear();
    }
    if let Some(id) = &args.agent_id {
        config.agent.id = Some(id.clone());
    }
    if let Some(interval) = args.rollup_interval {
        config.agent.rollup_interval = interval;
    }
    let flags = [
        (args.grpc, &mut config.grpc.listen),
        (args.envoy, &mut config.envoy.listen),
        (args.resp, &mut config.resp.listen),
        (args.http, &mut config.http.listen),
    ];
    for (flag, field) in flags {
        if flag.is_some() {
            *field = flag;
        }
    }
    if args.resp_unix.is_some() {
        config.resp.unix = args.resp_unix.clone();
    }
    config.validate()?;
    Ok(config)
}

fn agent(config: &Config) -> anyhow::Result<Agent> {
    let mut builder = Agent::builder()
        .rollup_interval(config.agent.rollup_interval)
        .publisher_lanes(config.agent.publisher_lanes);
    builder = match &config.masters.dns {
        Some(dns) => {
            let (host, port) = dns
                .rsplit_once(':')
                .context("masters.dns: expected host:port")?;
            let port = port
                .parse()
                .context("masters.dns: the port is not a number")?;
            builder.masters_dns(host, port, config.masters.dns_every)
        }
        None => builder.masters(config.master_addresses()),
    };
    if let Some(id) = &config.agent.id {
        builder = builder.agent_id(id.clone());
    }
    if let Some(tls) = &config.tls {
        let read = |field: &str, path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("{field}: cannot read {}", path.display()))
        };
        let mut agent_tls = AgentTls::new(read("tls.ca", &tls.ca)?);
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            agent_tls = agent_tls.identity(read("tls.cert", cert)?, read("tls.key", key)?);
        }
        if let Some(domain) = &tls.domain {
            agent_tls = agent_tls.domain(domain.clone());
        }
        builder = builder.tls(agent_tls);
    }
    builder.start().context("masters")
}

fn start() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = config(&args)?;
    if args.check_config {
        println!("config is valid");
        return Ok(());
    }
    serve(config, args.log_format == "json")
}

#[tokio::main]
async fn serve(config: Config, json_logs: bool) -> anyhow::Result<()> {
    let stop = damper_agent::stop_signal();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if json_logs {
        tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    let listeners = Listeners::bind(&config).await?;
    let agent = agent(&config)?;
    for (door, address) in listeners.addresses() {
        tracing::info!(door, address, "listening");
    }
    tracing::info!(agent_id = agent.id(), "damper-agentd serving");
    let sidecar = Sidecar::new(agent, config.limits.clone());
    run(
        sidecar,
        listeners,
        config.envoy.clone(),
        Some(metrics),
        async {
            stop.await;
            tracing::info!("shutting down: answering what was read, sending the last rollup");
        },
    )
    .await?;
    tracing::info!("damper-agentd stopped");
    Ok(())
}
