//! How much memory an agent takes per active (account, op): makes
//! `--accounts N` accounts active on one op in an agent's state (a `check`
//! each, a factor from the master applied to each, one rollup drained), and
//! measures the process's resident memory before and after. Then lets them
//! go idle, times `forget_idle` removing them all, and makes as many new
//! accounts active: resident memory follows the pairs in use, not every
//! pair ever seen. Last, the memory one master's dictionary of account
//! numbers takes for as many accounts (from its table's capacity).
//!
//! Run: `cargo run --release -p damper-agent --example agent_memory -- --accounts 1000000`.
//! The last line is `bytes_per_entry=N`. Linux only (reads /proc/self/statm).

use std::time::Duration;

use damper_core::agent::{AgentConfig, AgentState};
use damper_core::time::{Clock, Nanos, SystemClock};
use rand::SeedableRng;
use rand::rngs::SmallRng;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut accounts = 1_000_000usize;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--accounts" => {
                accounts = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .unwrap_or_else(|| {
                        eprintln!("agent_memory: --accounts takes a positive whole number");
                        std::process::exit(2)
                    });
            }
            other => {
                eprintln!("agent_memory: unknown argument {other:?}; usage: --accounts N");
                std::process::exit(2)
            }
        }
    }
    // The names exist before the measurement: a node holds them anyway.
    let names: Vec<String> = (0..accounts).map(|i| format!("account-{i:07}")).collect();
    let newcomers: Vec<String> = (0..accounts).map(|i| format!("another-{i:07}")).collect();
    let now = Nanos::from_secs(1_800_000_000);
    let mut rng = SmallRng::seed_from_u64(1);
    let before = resident_bytes();
    let agent = AgentState::new(AgentConfig::default());
    for name in &names {
        let _ = agent.check(now, name, "messages", 1, &mut rng);
        agent.apply(now, name, "messages", 0.0, 1000.0, Duration::from_secs(6));
    }
    let mut drained = 0usize;
    agent.drain(Nanos::ZERO, |_, _, _| drained += 1);
    let after = resident_bytes();
    assert_eq!(drained, accounts);
    eprintln!(
        "{accounts} active (account, op) pairs in an agent; resident {:.1} MiB before, {:.1} MiB after",
        before as f64 / (1 << 20) as f64,
        after as f64 / (1 << 20) as f64,
    );
    // What the rollup task pays every interval when nothing is to be
    // forgotten: one walk over the pairs.
    let started = SystemClock.now();
    assert_eq!(agent.forget_idle(now), 0);
    eprintln!(
        "a forget walk with nothing to forget: {:.0} ms",
        SystemClock.now().since(started).as_secs_f64() * 1e3
    );
    // Then every pair goes idle: its zero report, then `forget_after` of
    // quiet drains, and its factor lapses. The agent forgets them all.
    let config = AgentConfig::default();
    let quiet = config.forget_after.as_nanos() / config.rollup_interval.as_nanos();
    for _ in 0..=quiet {
        agent.drain(Nanos::ZERO, |_, _, _| {});
    }
    let started = SystemClock.now();
    let forgotten = agent.forget_idle(now + config.forget_after);
    let took = SystemClock.now().since(started);
    eprintln!(
        "idle for {:?}: {forgotten} pairs forgotten in {:.0} ms, {} left; resident {:.1} MiB",
        config.forget_after,
        took.as_secs_f64() * 1e3,
        agent.len(),
        resident_bytes() as f64 / (1 << 20) as f64,
    );
    assert_eq!(forgotten, accounts);
    // As many new accounts arrive: they reuse the forgotten pairs' memory.
    let later = now + config.forget_after;
    for name in &newcomers {
        let _ = agent.check(later, name, "messages", 1, &mut rng);
        agent.apply(later, name, "messages", 0.0, 1000.0, Duration::from_secs(6));
    }
    agent.drain(Nanos::ZERO, |_, _, _| {});
    eprintln!(
        "then {} new accounts active: {} pairs, resident {:.1} MiB",
        newcomers.len(),
        agent.len(),
        resident_bytes() as f64 / (1 << 20) as f64,
    );
    // What the round keeps beside the pairs for one master that takes
    // account numbers: each reported account's name and number.
    let mut dictionary = damper_core::wire::dictionary::AgentDictionary::default();
    let takes = damper_core::wire::Reply {
        takes_ids: true,
        ..Default::default()
    };
    dictionary.confirm(&takes, &Default::default());
    let accounts_counted = newcomers
        .iter()
        .map(|name| damper_core::wire::AccountCounts {
            account: name.clone(),
            attempted: 1,
            admitted: 1,
            ..Default::default()
        })
        .collect();
    let rollup = damper_core::wire::Rollup {
        ops: vec![damper_core::wire::OpCounts {
            op: "messages".into(),
            accounts: accounts_counted,
            ..Default::default()
        }],
        ..Default::default()
    };
    drop(dictionary.compact(&rollup));
    eprintln!(
        "account numbers for one master: {} accounts, {} bytes each (the table's capacity: names of up to 24 bytes inline)",
        dictionary.len(),
        dictionary.heap_bytes() / dictionary.len().max(1)
    );
    println!(
        "bytes_per_entry={}",
        after.saturating_sub(before) / accounts as u64
    );
}
