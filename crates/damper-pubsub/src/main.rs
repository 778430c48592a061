//! `damper-pubsub`: an example WebSocket pub/sub node linking the Damper
//! agent. Connect with any WebSocket client to `ws://ADDR/ws?account=ID`.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use damper_agent::Agent;
use damper_agent::local::BucketConfig;
use damper_core::time::parse_duration_in;
use damper_pubsub::{Node, NodeConfig, serve};

/// An example pub/sub node: clients connect with an account id, subscribe
/// to channels and publish; each publish passes the connection's and the
/// channel's token buckets, then Damper's account-wide check (cost 1 +
/// subscribers). See docs/agent.md for the protocol.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Address to serve WebSockets on (`/ws?account=ID`) and `/stats`.
    #[arg(long, default_value = "127.0.0.1:8090", value_name = "ADDR")]
    listen: SocketAddr,

    /// The Damper masters, comma-separated host:port (an http:// in front
    /// is dropped).
    #[arg(
        long,
        value_delimiter = ',',
        required = true,
        value_name = "ADDR[,ADDR...]",
        value_parser = damper_core::ring::parse_member
    )]
    masters: Vec<String>,

    /// Publishes per second each connection may make.
    #[arg(long, default_value_t = 50, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    connection_limit: u64,

    /// Publishes per second each channel may take on this node.
    #[arg(long, default_value_t = 50, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    channel_limit: u64,

    /// Strict local limits: a refused publish restarts the bucket's refill,
    /// so a client that keeps hammering stays refused until it pauses.
    #[arg(long)]
    strict: bool,

    /// The agent's rollup interval (`2s`, `500ms`); must match the masters'.
    #[arg(long, default_value = "2s", value_name = "DURATION",
          value_parser = |s: &str| parse_duration_in(s, Duration::from_millis(10), Duration::from_secs(3600)))]
    rollup_interval: Duration,

    /// Log format: `text` or `json`. The level comes from RUST_LOG (default
    /// `info`).
    #[arg(long, value_name = "FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    log_format: String,
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("damper-pubsub: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let stop = damper_agent::stop_signal();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if args.log_format == "json" {
        tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let config = NodeConfig::new(
        BucketConfig::per_second(args.connection_limit)
            .context("--connection-limit")?
            .strict(args.strict),
        BucketConfig::per_second(args.channel_limit)
            .context("--channel-limit")?
            .strict(args.strict),
    );
    let agent = Agent::builder()
        .masters(args.masters.iter().cloned())
        .rollup_interval(args.rollup_interval)
        .start()
        .context("--masters")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen: cannot bind {}", args.listen))?;
    tracing::info!(
        listen = %listener.local_addr()?,
        masters = ?args.masters,
        connection_limit = args.connection_limit,
        channel_limit = args.channel_limit,
        strict = args.strict,
        "damper-pubsub serving"
    );
    let node = Node::new(agent, config);
    serve(listener, node.clone(), async {
        stop.await;
        tracing::info!("shutting down: closing connections, flushing the agent");
    })
    .await?;
    tracing::info!(stats = ?node.stats(), "damper-pubsub stopped");
    Ok(())
}
