//! `damper-load`: drives traffic through in-process agents against real
//! masters and prints, as JSON lines, what was attempted and admitted.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use damper_agent::Agent;
use damper_core::time::parse_duration_in;
use damper_load::{Traffic, drive_spread, expand};
use serde_json::json;

/// Load generator for Damper, in the spirit of redis-benchmark: starts N
/// agents in this process (as N edge nodes would be), spreads each traffic
/// item's attempts evenly over them, and prints one JSON line per item per
/// second: {"t":SECONDS,"account":..,"op":..,"attempted":COST,"admitted":COST,
/// "slowest_check_us":MICROSECONDS}, then one line per item with "summary":true and the totals, and one
/// "agents_summary" line: rollups, entries and bytes sent and received
/// (bytes per entry, replies as a share of requests) and the rollup latency
/// p50/p99. Counts are in cost units.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    /// Master addresses, comma-separated: host:port (an http:// in front is
    /// dropped).
    #[arg(
        long,
        value_delimiter = ',',
        required = true,
        value_name = "ADDR[,ADDR...]",
        value_parser = damper_core::ring::parse_member
    )]
    masters: Vec<String>,

    /// Number of in-process agents (edge nodes).
    #[arg(long, default_value_t = 4, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    agents: u32,

    /// A traffic item, ACCOUNT:OP:RATE[:COST]: RATE attempts per second over
    /// all agents, each costing COST (default 1). Repeat for more items.
    #[arg(long, required = true, value_name = "ACCOUNT:OP:RATE[:COST]")]
    traffic: Vec<Traffic>,

    /// How long to run: `30s`, `10m`, from 1 s to 1 day.
    #[arg(long, default_value = "30s", value_name = "DURATION",
          value_parser = |s: &str| parse_duration_in(s, Duration::from_secs(1), Duration::from_secs(86_400)))]
    duration: Duration,

    /// Expand every traffic item whose ACCOUNT contains `{i}` into this many
    /// accounts, `{i}` replaced by 0..N.
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    accounts: u32,

    /// Send each traffic item through this many agents only (an account's
    /// connections land on a few edge nodes). Default: all of them.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    spread: Option<u32>,

    /// Print only the summary lines, not one line per item per second
    /// (for many accounts).
    #[arg(long)]
    quiet: bool,

    /// The agents' rollup interval (`2s`, `500ms`); must match the masters'.
    #[arg(long, default_value = "2s", value_name = "DURATION",
          value_parser = |s: &str| parse_duration_in(s, Duration::from_millis(10), Duration::from_secs(3600)))]
    rollup_interval: Duration,

    /// Log format for the agents' logs on stderr: `text` or `json` (one
    /// object per line). The level comes from RUST_LOG (default `warn`).
    #[arg(long, value_name = "FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    log_format: String,
}

fn main() -> std::process::ExitCode {
    match load() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("damper-load: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn load() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logs(&args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let agents = runtime.block_on(async { start_agents(&args) })?;
    // Each item expanded on its own, so --quiet knows which came from a
    // `{i}` template (and leaves them out of the summary).
    let (traffic, templated): (Vec<Traffic>, Vec<bool>) = args
        .traffic
        .iter()
        .flat_map(|t| {
            let many = t.account.contains("{i}");
            expand(std::slice::from_ref(t), args.accounts as usize)
                .into_iter()
                .map(move |e| (e, many))
        })
        .unzip();
    let spread = args.spread.map_or(agents.len(), |k| k as usize);
    let quiet = args.quiet;
    let totals = drive_spread(&agents, &traffic, spread, args.duration, |t, tallies| {
        if quiet {
            return;
        }
        for (item, tally) in traffic.iter().zip(tallies) {
            println!(
                "{}",
                json!({"t": t, "account": item.account, "op": item.op,
                       "attempted": tally.attempted, "admitted": tally.admitted,
                       "slowest_check_us": tally.slowest_check_ns / 1_000})
            );
        }
    });
    runtime.block_on(async {
        for agent in &agents {
            agent.shutdown().await;
        }
    });
    print_agents_summary(&agents, traffic.len(), &totals);
    for ((item, total), templated) in traffic.iter().zip(totals).zip(templated) {
        if quiet && templated {
            continue;
        }
        let secs = args.duration.as_secs_f64();
        println!(
            "{}",
            json!({"summary": true, "account": item.account, "op": item.op,
                   "seconds": secs, "attempted": total.attempted, "admitted": total.admitted,
                   "attempted_per_sec": total.attempted as f64 / secs,
                   "admitted_per_sec": total.admitted as f64 / secs,
                   "slowest_check_us": total.slowest_check_ns / 1_000})
        );
    }
    Ok(())
}

/// The agents' logs on stderr, as text or JSON lines; `RUST_LOG` filters
/// (default `warn`).
fn init_logs(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    if format == "json" {
        logs.json().flatten_event(true).init();
    } else {
        logs.init();
    }
}

/// `--agents` agents reporting to `--masters`; called within the runtime.
fn start_agents(args: &Args) -> anyhow::Result<Vec<Arc<Agent>>> {
    (0..args.agents)
        .map(|i| {
            Agent::builder()
                .masters(args.masters.iter().cloned())
                .agent_id(format!("damper-load-{}-{i}", std::process::id()))
                .rollup_interval(args.rollup_interval)
                .start()
                .map(Arc::new)
                .context("--masters")
        })
        .collect()
}

/// One JSON line with what the agents sent and how it went.
fn print_agents_summary(agents: &[Arc<Agent>], items: usize, totals: &[damper_load::Tally]) {
    let stats: damper_agent::AgentStats = agents.iter().map(|a| a.stats()).sum();
    let (attempted, admitted) = totals
        .iter()
        .fold((0u64, 0u64), |(a, b), t| (a + t.attempted, b + t.admitted));
    println!(
        "{}",
        json!({"agents_summary": true, "agents": agents.len(), "items": items,
               "attempted": attempted, "admitted": admitted,
               "rollups_sent": stats.rollups_sent, "rollups_failed": stats.rollups_failed,
               "factors_expired": stats.factors_expired, "dropped_cost": stats.dropped_cost,
               "entries_sent": stats.entries_sent, "bytes_sent": stats.bytes_sent,
               "bytes_received": stats.bytes_received,
               "early_reports": stats.early_reports,
               "early_reports_failed": stats.early_reports_failed,
               "bytes_per_entry": stats.bytes_sent as f64 / stats.entries_sent.max(1) as f64,
               "control_share": stats.bytes_received as f64 / stats.bytes_sent.max(1) as f64,
               "rollup_p50_ms": ms(stats.rollup_latency.quantile(0.5)),
               "rollup_p99_ms": ms(stats.rollup_latency.quantile(0.99))})
    );
}

/// A latency in milliseconds for the JSON summary (`null` when none).
fn ms(d: Option<Duration>) -> Option<f64> {
    d.map(|d| (d.as_secs_f64() * 1e6).round() / 1e3)
}
