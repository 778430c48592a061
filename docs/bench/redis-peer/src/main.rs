//! The "Redis peer" benchmark: Damper's in-process [`Agent::check`] side by
//! side, in one run, with the usual shared limiter it replaces, a GCRA
//! limiter in Redis.
//!
//! Cases, all over the same 100 000 accounts (`acct-000000` to
//! `acct-099999`) visited in the same shuffled order:
//!
//! - **Redis GCRA, 1 connection**: one request at a time, each awaited
//!   before the next: decisions per second and the latency of each.
//! - **Redis GCRA, N connections** (default 50): N separate connections, each
//!   driven by its own tokio task making sequential requests: aggregate
//!   decisions per second and per-request latency.
//! - **Damper `check`, 1 thread and 2 threads**: an [`Agent`] whose only
//!   master is an address where nothing listens, so every rollup fails (the
//!   agent fails open) while `check` runs exactly as in production: mean
//!   time per call over many calls, plus, on one thread, each call timed on
//!   its own for p50/p99.
//!
//! Redis runs on the same machine as this harness, over loopback. Start it
//! with `docs/bench/redis-peer.sh`, which passes `--redis`.

// A benchmark measures wall time by definition (the repository's clippy.toml
// bans `Instant` for the library crates, which take time as an argument).
#![allow(clippy::disallowed_types)]

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use clap::Parser;
use damper_agent::Agent;
use damper_core::agent::Decision;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Script};

/// Accounts each limiter holds: enough that a decision misses the CPU
/// cache, as on a node serving many accounts.
const KEYS: usize = 100_000;
/// The op Damper's `check` is called with.
const OP: &str = "messages";
/// The cost of every decision (one operation).
const COST: u64 = 1;

/// The GCRA limiter, run by Redis for each decision (the usual Lua version).
///
/// `KEYS[1]` holds the account's theoretical arrival time (TAT) in µs since
/// the epoch. `now` is Redis's own clock (`TIME`), so clients need no
/// synchronised clocks. Each decision of `cost` moves the TAT forward by
/// `cost` emission intervals (period / limit); it is allowed while the TAT,
/// moved forward, stays within `burst` intervals of now (that is, while the
/// stored TAT is at most (burst - cost) intervals ahead). The key expires
/// once its TAT is in the past (`SET ... PX`, the atomic form of SET plus
/// PEXPIRE), when it would say nothing a missing key does not.
///
/// `ARGV`: limit (decisions per period), period in ms, burst, cost.
/// Returns 1 when allowed, 0 when limited.
const GCRA_LUA: &str = r"
local limit  = tonumber(ARGV[1])
local period = tonumber(ARGV[2]) * 1000
local burst  = tonumber(ARGV[3])
local cost   = tonumber(ARGV[4])

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local interval = period / limit
local burst_offset = interval * burst

local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then
  tat = now
end
local new_tat = tat + interval * cost
if new_tat - now > burst_offset then
  return 0
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat),
           'PX', math.ceil((new_tat - now) / 1000))
return 1
";

/// Damper's `check` against a Redis GCRA limiter (Lua, EVALSHA), in one run.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// The Redis server (the script starts one of its own).
    #[arg(long, default_value = "redis://127.0.0.1:6390")]
    redis: String,
    /// How long each Redis case is measured, after its warm-up.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Warm-up before each Redis case is measured, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    warmup_ms: u64,
    /// Connections in the concurrent Redis case.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Calls of Damper's `check` per thread (the mean is over these).
    #[arg(long, default_value_t = 20_000_000)]
    damper_calls: u64,
    /// Calls of `check` timed one by one, on one thread, for p50/p99.
    #[arg(long, default_value_t = 2_000_000)]
    damper_timed_calls: usize,
    /// GCRA limit: decisions per account per period.
    #[arg(long, default_value_t = 100)]
    limit: u64,
    /// GCRA period, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    period_ms: u64,
    /// GCRA burst: decisions an idle account may make at once.
    #[arg(long, default_value_t = 100)]
    burst: u64,
}

/// The GCRA parameters every Redis decision is made with.
#[derive(Clone, Copy, Debug)]
struct Gcra {
    limit: u64,
    period_ms: u64,
    burst: u64,
}

/// What one case measured.
#[derive(Debug)]
struct Measured {
    /// The row's name.
    case: String,
    /// Decisions made in the measured window, over all connections or
    /// threads.
    decisions: u64,
    /// How many of them were admitted.
    admitted: u64,
    /// The measured window (wall time).
    window: Duration,
    /// Mean time one decision took its caller, in ns.
    mean_ns: f64,
    /// Per-decision p50 and p99 in ns, where each decision was timed.
    quantiles: Option<(f64, f64)>,
}

impl Measured {
    fn per_second(&self) -> f64 {
        self.decisions as f64 / self.window.as_secs_f64()
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        args.limit > 0 && args.period_ms > 0,
        "--limit and --period-ms must be positive"
    );
    ensure!(args.connections > 0, "--connections must be positive");
    let gcra = Gcra {
        limit: args.limit,
        period_ms: args.period_ms,
        burst: args.burst,
    };
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("acct-{i:06}")).collect());
    let order: Arc<Vec<usize>> = Arc::new(shuffled(KEYS, 1));

    print_machine();
    println!(
        "Redis runs on this same machine, over loopback: with {} connections, the harness (the \
         client) and redis-server compete for the same cores.",
        args.connections
    );
    println!();

    // Redis first, then Damper: the agent's background task (rollups to a
    // master that is not there) then never runs during a Redis case.
    let client = Client::open(args.redis.as_str()).context("--redis")?;
    let script = Arc::new(Script::new(GCRA_LUA));
    self_check(&client, &script).await?;
    let warmup = Duration::from_millis(args.warmup_ms);
    let measure = Duration::from_secs(args.seconds);

    let mut rows = Vec::new();
    for connections in [1, args.connections] {
        let name = if connections == 1 {
            "Redis GCRA, 1 connection, sequential".to_string()
        } else {
            format!("Redis GCRA, {connections} connections")
        };
        eprintln!(
            "running: {name} ({} s + {} ms warm-up)",
            args.seconds, args.warmup_ms
        );
        let m = redis_case(
            &client,
            &script,
            &keys,
            &order,
            connections,
            gcra,
            (warmup, measure),
        )
        .await
        .with_context(|| name.clone())?;
        rows.push(Measured { case: name, ..m });
    }

    let agent = Arc::new(
        Agent::builder()
            // Nothing listens there: every rollup fails and the agent fails
            // open, which leaves `check` itself unchanged.
            .masters(["127.0.0.1:1"])
            .agent_id("redis-peer-bench")
            .start()
            .context("starting the agent")?,
    );
    for threads in [1, 2] {
        eprintln!(
            "running: Damper check, {threads} thread(s), {} calls each",
            args.damper_calls
        );
        let (agent, keys, order) = (agent.clone(), keys.clone(), order.clone());
        let calls = args.damper_calls;
        let m =
            tokio::task::spawn_blocking(move || damper_case(&agent, &keys, &order, threads, calls))
                .await?;
        rows.push(m);
    }
    eprintln!("running: Damper check, each call timed");
    let timed = {
        let (agent, keys, order) = (agent.clone(), keys.clone(), order.clone());
        let calls = args.damper_timed_calls;
        tokio::task::spawn_blocking(move || damper_timed(&agent, &keys, &order, calls)).await?
    };
    let stats = agent.stats();
    drop(agent);

    print_table(&rows, &timed);
    println!();
    println!(
        "Agent rollups during the Damper cases: {} answered, {} failed (nothing listens at the \
         master's address, so the agent fails open).",
        stats.rollups_sent, stats.rollups_failed
    );
    Ok(())
}

/// A permutation of `0..n`, the same for a given seed (Fisher-Yates over
/// SplitMix64).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// Prints the core count, the CPU model and the Redis version.
fn print_machine() {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, model)| model.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let redis = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown (redis-server not on PATH)".into());
    println!("Machine: {cores} cores (nproc), CPU: {cpu}");
    println!("Redis: {redis}");
}

/// A connection of its own (never shared), with no response timeout: on a
/// saturated machine a slow reply is a measurement, not an error.
async fn connect(client: &Client) -> Result<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .context("connecting to Redis")
}

/// One GCRA decision for `key`: `true` when allowed.
async fn decide(
    script: &Script,
    connection: &mut MultiplexedConnection,
    key: &str,
    gcra: Gcra,
) -> Result<bool> {
    let allowed: i64 = script
        .key(key)
        .arg(gcra.limit)
        .arg(gcra.period_ms)
        .arg(gcra.burst)
        .arg(COST)
        .invoke_async(connection)
        .await?;
    Ok(allowed == 1)
}

/// Loads the script and checks that it limits: with a limit of 2 per
/// minute and a burst of 2, a fresh key gets two decisions, not three.
async fn self_check(client: &Client, script: &Script) -> Result<()> {
    let mut connection = connect(client).await?;
    script
        .load_async(&mut connection)
        .await
        .context("SCRIPT LOAD")?;
    let key = "redis-peer-self-check";
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut connection)
        .await?;
    let gcra = Gcra {
        limit: 2,
        period_ms: 60_000,
        burst: 2,
    };
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(decide(script, &mut connection, key, gcra).await?);
    }
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut connection)
        .await?;
    ensure!(
        got == [true, true, false],
        "GCRA self-check: expected [allow, allow, limit], got {got:?}"
    );
    println!("GCRA script self-check: allow, allow, limit (ok)");
    Ok(())
}

/// Runs `connections` tasks, each on its own connection making one request
/// at a time over the key order (task `c` starting at its own offset), for
/// `warmup` then `measure`. Only requests started within the measured
/// window count.
async fn redis_case(
    client: &Client,
    script: &Arc<Script>,
    keys: &Arc<Vec<String>>,
    order: &Arc<Vec<usize>>,
    connections: usize,
    gcra: Gcra,
    (warmup, measure): (Duration, Duration),
) -> Result<Measured> {
    let mut opened = Vec::with_capacity(connections);
    for _ in 0..connections {
        opened.push(connect(client).await?);
    }
    let begin = Instant::now() + Duration::from_millis(10);
    let (from, until) = (begin + warmup, begin + warmup + measure);
    let tasks: Vec<_> = opened
        .into_iter()
        .enumerate()
        .map(|(c, mut connection)| {
            let (script, keys, order) = (script.clone(), keys.clone(), order.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(begin.into()).await;
                let mut latencies = Vec::new();
                let mut admitted = 0u64;
                let mut i = c * KEYS / connections;
                loop {
                    let started = Instant::now();
                    if started >= until {
                        break;
                    }
                    let allowed = decide(&script, &mut connection, &keys[order[i]], gcra).await?;
                    let took = started.elapsed();
                    if started >= from {
                        latencies.push(took.as_nanos() as u64);
                        admitted += u64::from(allowed);
                    }
                    i = (i + 1) % KEYS;
                }
                anyhow::Ok((latencies, admitted))
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut admitted = 0;
    for task in tasks {
        let (l, a) = task.await??;
        latencies.extend(l);
        admitted += a;
    }
    latencies.sort_unstable();
    let decisions = latencies.len() as u64;
    ensure!(decisions > 0, "no decision made in the measured window");
    let mean_ns = latencies.iter().map(|&n| n as f64).sum::<f64>() / decisions as f64;
    Ok(Measured {
        case: String::new(),
        decisions,
        admitted,
        window: measure,
        mean_ns,
        quantiles: Some((quantile(&latencies, 0.50), quantile(&latencies, 0.99))),
    })
}

/// The value that a fraction `q` of the sorted `values` are at most.
fn quantile(sorted: &[u64], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

/// Damper's `check` on `threads` threads, `calls` each, over the key order
/// (thread `t` starting at its own offset), after one untimed pass that
/// makes every key known. The mean is the time one call takes its thread:
/// wall time × threads ÷ calls.
fn damper_case(
    agent: &Agent,
    keys: &[String],
    order: &[usize],
    threads: usize,
    calls: u64,
) -> Measured {
    for &k in order {
        black_box(agent.check(&keys[k], OP, COST));
    }
    let start = Barrier::new(threads + 1);
    let (admitted, window) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let start = &start;
                s.spawn(move || {
                    let mut i = t * KEYS / threads;
                    let mut admitted = 0u64;
                    start.wait();
                    for _ in 0..calls {
                        let decision: Decision = agent.check(&keys[order[i]], OP, COST);
                        admitted += u64::from(black_box(decision).is_admit());
                        i += 1;
                        if i == KEYS {
                            i = 0;
                        }
                    }
                    admitted
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        let admitted: u64 = workers
            .into_iter()
            .map(|w| w.join().expect("bench thread"))
            .sum();
        (admitted, began.elapsed())
    });
    let decisions = calls * threads as u64;
    Measured {
        case: format!(
            "Damper check, {threads} thread{}",
            if threads == 1 { "" } else { "s" }
        ),
        decisions,
        admitted,
        window,
        mean_ns: window.as_nanos() as f64 * threads as f64 / decisions as f64,
        quantiles: None,
    }
}

/// Per-call quantiles of `check` on one thread, each call timed on its own,
/// and what the two clock reads around an empty body cost (the floor of
/// these figures).
struct Timed {
    calls: usize,
    p50_ns: f64,
    p99_ns: f64,
    p999_ns: f64,
    clock_p50_ns: f64,
}

/// Times `calls` calls of `check` one by one, on one thread.
fn damper_timed(agent: &Agent, keys: &[String], order: &[usize], calls: usize) -> Timed {
    let mut empty: Vec<u64> = (0..calls.min(1_000_000))
        .map(|_| {
            let t = Instant::now();
            black_box(());
            t.elapsed().as_nanos() as u64
        })
        .collect();
    empty.sort_unstable();
    let mut latencies = Vec::with_capacity(calls);
    let mut i = 0;
    for _ in 0..calls {
        let key = &keys[order[i]];
        let t = Instant::now();
        let decision = agent.check(key, OP, COST);
        let took = t.elapsed();
        black_box(decision);
        latencies.push(took.as_nanos() as u64);
        i = (i + 1) % KEYS;
    }
    latencies.sort_unstable();
    Timed {
        calls,
        p50_ns: quantile(&latencies, 0.50),
        p99_ns: quantile(&latencies, 0.99),
        p999_ns: quantile(&latencies, 0.999),
        clock_p50_ns: quantile(&empty, 0.50),
    }
}

/// `ns` as ns, µs or ms, with three significant figures or so.
fn duration(ns: f64) -> String {
    if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}

/// A rate with a k or M suffix.
fn rate(per_second: f64) -> String {
    if per_second >= 1e6 {
        format!("{:.1} M", per_second / 1e6)
    } else if per_second >= 1e3 {
        format!("{:.1} k", per_second / 1e3)
    } else {
        format!("{per_second:.0}")
    }
}

/// Prints the results as a Markdown table, then the ratios.
fn print_table(rows: &[Measured], timed: &Timed) {
    println!("| case | decisions/s | mean per decision | p50 | p99 | admitted |");
    println!("|---|---:|---:|---:|---:|---:|");
    for m in rows {
        let (p50, p99) = m.quantiles.map_or(("–".into(), "–".into()), |(a, b)| {
            (duration(a), duration(b))
        });
        println!(
            "| {} | {} | {} | {} | {} | {:.1}% |",
            m.case,
            rate(m.per_second()),
            duration(m.mean_ns),
            p50,
            p99,
            100.0 * m.admitted as f64 / m.decisions as f64,
        );
    }
    println!(
        "| Damper check, 1 thread, each call timed ({} calls) | – | – | {} | {} | – |",
        timed.calls,
        duration(timed.p50_ns),
        duration(timed.p99_ns),
    );
    println!();
    println!(
        "Each call timed on its own is serialised by the clock reads around it (their cost, \
         timing an empty body: {} at p50), so its cache misses no longer overlap the next \
         call's as in the untimed loops: a single call's latency, not its share of throughput. \
         Its p99.9: {}.",
        duration(timed.clock_p50_ns),
        duration(timed.p999_ns)
    );
    println!(
        "Redis latencies are per request, as its caller waits for it (with many connections, \
         mostly queueing); Damper's mean is the time one call takes its thread (wall time x \
         threads / calls)."
    );
    println!();

    let find = |prefix: &str| rows.iter().find(|m| m.case.starts_with(prefix));
    let one = (
        find("Damper check, 1 thread"),
        find("Redis GCRA, 1 connection"),
    );
    let many = (
        find("Damper check, 2 threads"),
        rows.iter().rfind(|m| m.case.starts_with("Redis GCRA")),
    );
    println!("| Damper ÷ Redis | decisions/s | time per decision, Redis mean ÷ Damper mean |");
    println!("|---|---:|---:|");
    if let (Some(d), Some(r)) = one {
        println!(
            "| 1 thread vs 1 connection | {:.0}× | {:.0}× |",
            d.per_second() / r.per_second(),
            r.mean_ns / d.mean_ns,
        );
    }
    if let (Some(d), Some(r)) = many {
        println!(
            "| 2 threads vs {} | {:.0}× | – |",
            r.case.trim_start_matches("Redis GCRA, "),
            d.per_second() / r.per_second(),
        );
    }
}
