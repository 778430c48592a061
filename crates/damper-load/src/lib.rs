//! Drives traffic through in-process [`Agent`]s, as many edge nodes would,
//! and tallies what was attempted and admitted, second by second.
//!
//! # Layout
//! - [`Traffic`]: one `ACCOUNT:OP:RATE[:COST]` item.
//! - [`drive`]: spreads every item's attempts evenly over time and agents.
//! - [`Paced`]: a closure called at a fixed pace on a plain thread, as a
//!   node's publish path calls `check` (the end-to-end tests' traffic).
//! - `src/main.rs`: the `damper-load` binary.
//!
//! # Example
//! ```
//! use damper_load::Traffic;
//! let t: Traffic = "acme:messages:5000:11".parse().unwrap();
//! assert_eq!((t.account.as_str(), t.op.as_str(), t.rate, t.cost), ("acme", "messages", 5000.0, 11));
//! assert!("acme:messages".parse::<Traffic>().is_err());
//! ```
#![forbid(unsafe_code)]

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use damper_agent::Agent;

/// A closure called every `every` on its own thread until stopped: traffic
/// from a plain thread, as a node's publish path would call `check`.
/// Dropping it stops the thread and waits for it.
#[derive(Debug)]
pub struct Paced {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Paced {
    /// Starts calling `tick` every `every` (plus the time `tick` takes).
    pub fn start(every: Duration, mut tick: impl FnMut() + Send + 'static) -> Paced {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                tick();
                std::thread::sleep(every);
            }
        });
        Paced {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the thread and waits for it; panics if `tick` panicked.
    pub fn stop(mut self) {
        self.halt().expect("the paced closure does not panic");
    }

    fn halt(&mut self) -> std::thread::Result<()> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .map_or(Ok(()), std::thread::JoinHandle::join)
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// One stream of operations: `rate` attempts per second of `cost` each, by
/// `account` on `op`, across all agents together.
#[derive(Clone, Debug, PartialEq)]
pub struct Traffic {
    /// Account id.
    pub account: String,
    /// Operation.
    pub op: String,
    /// Attempts per second, over all agents.
    pub rate: f64,
    /// Cost of each attempt (1 + subscribers for a publish). Default 1.
    pub cost: u64,
}

/// Why a traffic item could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("traffic {item:?}: {reason} (expected ACCOUNT:OP:RATE[:COST])")]
pub struct TrafficError {
    item: String,
    reason: &'static str,
}

impl FromStr for Traffic {
    type Err = TrafficError;

    fn from_str(item: &str) -> Result<Traffic, TrafficError> {
        let err = |reason| TrafficError {
            item: item.to_string(),
            reason,
        };
        let parts: Vec<&str> = item.split(':').collect();
        if !(3..=4).contains(&parts.len()) {
            return Err(err("wrong number of fields"));
        }
        if parts[0].is_empty() || parts[1].is_empty() {
            return Err(err("empty account or op"));
        }
        let rate: f64 = parts[2].parse().map_err(|_| err("RATE is not a number"))?;
        if !(rate.is_finite() && rate >= 0.0) {
            return Err(err("RATE must be a finite number, zero or more"));
        }
        let cost = match parts.get(3) {
            Some(c) => c
                .parse::<u64>()
                .map_err(|_| err("COST is not a whole number"))?,
            None => 1,
        };
        if cost == 0 {
            return Err(err("COST must be at least 1"));
        }
        Ok(Traffic {
            account: parts[0].to_string(),
            op: parts[1].to_string(),
            rate,
            cost,
        })
    }
}

/// Copies every item whose account contains `{i}` `accounts` times, with
/// `{i}` replaced by 0, 1, ...: `acct-{i}:messages:1` with 10 000 accounts
/// is 10 000 accounts at 1 operation per second each. Other items are kept
/// once.
pub fn expand(traffic: &[Traffic], accounts: usize) -> Vec<Traffic> {
    traffic
        .iter()
        .flat_map(|t| {
            let copies = if t.account.contains("{i}") {
                accounts
            } else {
                1
            };
            (0..copies).map(move |i| Traffic {
                account: t.account.replace("{i}", &i.to_string()),
                ..t.clone()
            })
        })
        .collect()
}

/// Cost attempted and admitted by one traffic item in one second.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Cost attempted.
    pub attempted: u64,
    /// Cost admitted.
    pub admitted: u64,
    /// The slowest single `check`, in nanoseconds: `check` must never wait
    /// on the network, whatever the link to the masters does (the chaos
    /// test reads it).
    pub slowest_check_ns: u64,
}

/// How often the driver issues the attempts that came due.
const TICK: Duration = Duration::from_millis(2);

/// Drives `traffic` through `agents` for `duration`, calling `on_second`
/// with each elapsed second's tallies (one per traffic item, in order).
/// Returns the totals. Runs on the calling thread: call it from a blocking
/// context (`spawn_blocking`) or a plain thread.
pub fn drive(
    agents: &[Arc<Agent>],
    traffic: &[Traffic],
    duration: Duration,
    on_second: impl FnMut(u64, &[Tally]),
) -> Vec<Tally> {
    drive_spread(agents, traffic, agents.len(), duration, on_second)
}

/// [`drive`], with each traffic item sent through only `spread` of the
/// agents (consecutive ones, from a start that depends on the item), as an
/// account's connections land on a few edge nodes rather than all of them.
pub fn drive_spread(
    agents: &[Arc<Agent>],
    traffic: &[Traffic],
    spread: usize,
    duration: Duration,
    mut on_second: impl FnMut(u64, &[Tally]),
) -> Vec<Tally> {
    assert!(!agents.is_empty(), "drive needs at least one agent");
    let spread = spread.clamp(1, agents.len());
    // Item i's agents: first[i], first[i] + 1, ... (mod n), `spread` of them.
    let first: Vec<usize> = (0..traffic.len())
        .map(|i| (i.wrapping_mul(0x9E37_79B9) >> 7) % agents.len())
        .collect();
    let clock = tokio::time::Instant::now();
    let mut issued = vec![0u64; traffic.len()];
    let mut next_agent = vec![0usize; traffic.len()];
    let mut second = vec![Tally::default(); traffic.len()];
    let mut totals = vec![Tally::default(); traffic.len()];
    let mut current = 0u64;
    loop {
        let elapsed = clock.elapsed().min(duration);
        for (i, t) in traffic.iter().enumerate() {
            // Attempts due so far: spread evenly over time.
            let due = (t.rate * elapsed.as_secs_f64()) as u64;
            while issued[i] < due {
                let agent = &agents[(first[i] + next_agent[i]) % agents.len()];
                next_agent[i] = (next_agent[i] + 1) % spread;
                issued[i] += 1;
                let before = tokio::time::Instant::now();
                let admitted = agent.check(&t.account, &t.op, t.cost).is_admit();
                let took = u64::try_from(before.elapsed().as_nanos()).unwrap_or(u64::MAX);
                for tally in [&mut second[i], &mut totals[i]] {
                    tally.attempted += t.cost;
                    tally.admitted += if admitted { t.cost } else { 0 };
                    tally.slowest_check_ns = tally.slowest_check_ns.max(took);
                }
            }
        }
        if elapsed.as_secs() > current {
            current += 1;
            on_second(current, &second);
            second.iter_mut().for_each(|t| *t = Tally::default());
        }
        if elapsed >= duration {
            if second.iter().any(|t| t.attempted > 0) {
                on_second(current + 1, &second); // A last, partial second.
            }
            return totals;
        }
        std::thread::sleep(TICK);
    }
}

/// [`drive`] from async code: runs it on a blocking thread and returns
/// every second's tallies.
pub async fn drive_seconds(
    agents: &[Arc<Agent>],
    traffic: &[Traffic],
    duration: Duration,
) -> Vec<Vec<Tally>> {
    let (agents, traffic) = (agents.to_vec(), traffic.to_vec());
    tokio::task::spawn_blocking(move || {
        let mut seconds = Vec::new();
        drive(&agents, &traffic, duration, |_, t| seconds.push(t.to_vec()));
        seconds
    })
    .await
    .expect("the driver does not panic")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templated_accounts_expand_and_others_stay_single() {
        let items: Vec<Traffic> = ["acct-{i}:messages:1", "flood:messages:100"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let expanded = expand(&items, 3);
        let accounts: Vec<&str> = expanded.iter().map(|t| t.account.as_str()).collect();
        assert_eq!(accounts, ["acct-0", "acct-1", "acct-2", "flood"]);
    }

    #[test]
    fn traffic_items_parse_and_bad_ones_say_why() {
        let t: Traffic = "org/team:presence:2.5".parse().unwrap();
        assert_eq!((t.rate, t.cost), (2.5, 1));
        for (item, reason) in [
            ("a:b", "wrong number"),
            ("a:b:1:2:3", "wrong number"),
            (":b:1", "empty"),
            ("a:b:x", "RATE is not"),
            ("a:b:-1", "zero or more"),
            ("a:b:inf", "finite"),
            ("a:b:1:0", "at least 1"),
            ("a:b:1:1.5", "COST is not"),
        ] {
            let e = item.parse::<Traffic>().unwrap_err().to_string();
            assert!(e.contains(reason) && e.contains(item), "{e}");
        }
    }
}
