//! The Damper agent, linked into every pub/sub node.
//!
//! [`Agent::check`] decides each operation in-process: synchronous, never
//! waiting on the network, no lock, allocation or clock read for an (account,
//! op) already seen, callable from any number of threads. A background task
//! sends the counts to each account's master every rollup interval and
//! applies the factors in the replies. When a master is slow or gone, checks
//! go on unaffected; its factors expire and the agent admits (fails open).
//!
//! # Layout
//! - [`Agent`], [`AgentBuilder`]: the handle the node holds, and its settings.
//! - `rollup`: the background task (cutting intervals, routing by ring,
//!   batching, retries by carrying counts over, applying replies).
//! - `clock`: the coarse clock `check` reads.
//! - The decision itself is [`damper_core::agent`]'s, re-exported here as
//!   [`Decision`] and [`Rejection`].
//! - [`local`]: keyed token buckets for the node's own per-connection and
//!   per-channel limits (re-exported from [`damper_core::local`]), fed with
//!   [`Agent::now`].
//!
//! # Example
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use damper_agent::{Agent, Decision};
//!
//! let agent = Agent::builder()
//!     .masters(["10.0.0.1:7070", "10.0.0.2:7070"])
//!     .agent_id("edge-eu-1")
//!     .start()?;
//!
//! // On every publish: cost = 1 + subscribers.
//! match agent.check("acme", "messages", 1 + 1000) {
//!     Decision::Admit => { /* deliver */ }
//!     Decision::Reject(r) => {
//!         // Tell the publisher now: rate limited, retry after r.retry_after.
//!         eprintln!("rejected: factor {}, retry in {:?}", r.factor, r.retry_after);
//!     }
//! }
//! agent.shutdown().await; // sends the last counts
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod clock;
mod rollup;

use std::cell::RefCell;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use damper_core::agent::{AgentConfig, AgentState};
use damper_core::time::Clock;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use damper_core::agent::{Decision, RejectSource, Rejection};
pub use rollup::{apply_reply, rollup_request};

/// Keyed token buckets for the limits a node enforces on its own (per
/// connection, per channel), next to the account-wide [`Agent::check`]:
/// capacity, refill amount and time, strict mode, caller-supplied time,
/// sweeping of full buckets. See [`damper_core::local`].
pub mod local {
    pub use damper_core::local::{BucketConfig, BucketConfigError, Reduced, TokenBuckets};
}

use crate::clock::CoarseClock;

/// Where the masters are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Masters {
    /// A fixed list of `host:port` addresses.
    Static(Vec<String>),
    /// A DNS name resolved to every address it has, re-resolved
    /// periodically: a Kubernetes headless service, for instance.
    Dns {
        /// The name to resolve.
        host: String,
        /// The masters' gRPC port.
        port: u16,
        /// How often to resolve again.
        every: Duration,
    },
}

/// Why an agent could not start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AgentError {
    /// No master was given.
    #[error("no masters: give at least one address or a DNS name")]
    NoMasters,
    /// A master address is not `host:port`.
    #[error("master address {address:?}: {reason}")]
    BadAddress {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A setting is out of range.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// The builder method.
        field: &'static str,
        /// What is allowed.
        reason: &'static str,
    },
    /// `start` was called outside a tokio runtime.
    #[error("Agent::start must be called from within a tokio runtime")]
    NoRuntime,
    /// The clock thread could not be started.
    #[error("cannot start the agent's clock thread: {0}")]
    Clock(String),
}

/// Settings for an [`Agent`]; see [`Agent::builder`].
#[derive(Clone, Debug)]
pub struct AgentBuilder {
    masters: Option<Masters>,
    agent_id: Option<String>,
    rollup_interval: Duration,
    local_window: Duration,
    forget_after: Duration,
    request_timeout: Option<Duration>,
    max_entries_per_request: usize,
    max_carry: Duration,
    fail_after: u32,
    fail_static: Vec<(String, Duration)>,
    tls: Option<AgentTls>,
}

/// TLS to the masters: the CA their certificates chain to and, for mutual
/// TLS, this agent's own certificate and key. PEM throughout.
#[derive(Clone)]
pub struct AgentTls {
    pub(crate) ca_pem: Vec<u8>,
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
    pub(crate) domain: Option<String>,
}

impl std::fmt::Debug for AgentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("AgentTls")
            .field("client_certificate", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl AgentTls {
    /// Trust masters whose certificates chain to this CA.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> AgentTls {
        AgentTls {
            ca_pem: ca_pem.into(),
            identity: None,
            domain: None,
        }
    }

    /// Present this client certificate and key (mutual TLS).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Verify the masters' certificates against this name instead of the
    /// host in each master's address.
    pub fn domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }
}

impl Default for AgentBuilder {
    fn default() -> Self {
        AgentBuilder {
            masters: None,
            agent_id: None,
            rollup_interval: Duration::from_secs(2),
            local_window: Duration::from_millis(250),
            forget_after: AgentConfig::default().forget_after,
            request_timeout: None,
            max_entries_per_request: 10_000,
            max_carry: Duration::from_secs(30),
            fail_after: 2,
            fail_static: Vec::new(),
            tls: None,
        }
    }
}

impl AgentBuilder {
    /// A fixed list of master addresses (`host:port`).
    pub fn masters<S: Into<String>>(mut self, addresses: impl IntoIterator<Item = S>) -> Self {
        self.masters = Some(Masters::Static(
            addresses.into_iter().map(Into::into).collect(),
        ));
        self
    }

    /// Masters found by resolving `host` (every address it has, on `port`),
    /// again every `every`.
    pub fn masters_dns(mut self, host: impl Into<String>, port: u16, every: Duration) -> Self {
        self.masters = Some(Masters::Dns {
            host: host.into(),
            port,
            every,
        });
        self
    }

    /// This agent's identity in rollups and logs. Default: host name and
    /// process id.
    pub fn agent_id(mut self, id: impl Into<String>) -> Self {
        self.agent_id = Some(id.into());
        self
    }

    /// How often counts go to the masters (default 2 s). Must match the
    /// masters' `rollup_interval_ms`.
    pub fn rollup_interval(mut self, interval: Duration) -> Self {
        self.rollup_interval = interval;
        self
    }

    /// How long an (account, op) with nothing counted and no factor in force
    /// stays in memory (default 60 s, at least the rollup interval). A
    /// forgotten pair behaves exactly as one never seen, so this only trades
    /// memory for the cost of an insert when the account comes back.
    pub fn forget_after(mut self, idle: Duration) -> Self {
        self.forget_after = idle;
        self
    }

    /// The local guard's measurement window (default 250 ms).
    pub fn local_window(mut self, window: Duration) -> Self {
        self.local_window = window;
        self
    }

    /// How long to wait for a master's reply (default: half the rollup
    /// interval, at most 1 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Most (account, op) entries in one request; a larger rollup is split
    /// (default 10 000).
    pub fn max_entries_per_request(mut self, n: usize) -> Self {
        self.max_entries_per_request = n;
        self
    }

    /// How long counts that could not be delivered are kept and resent
    /// before they are dropped, counted in
    /// `damper_agent_rollup_dropped_cost_total` (default 30 s: older counts
    /// fall outside any window the master keeps).
    pub fn max_carry(mut self, max: Duration) -> Self {
        self.max_carry = max;
        self
    }

    /// Failed rollups in a row that take a master off this agent's ring, so
    /// its accounts go to their next owners (default 2). It is probed, with
    /// backoff, and rejoined when it answers.
    pub fn fail_after(mut self, failures: u32) -> Self {
        self.fail_after = failures;
        self
    }

    /// Makes `op` fail static: when no fresh factor arrives (its master is
    /// unreachable), keep applying the last one for `hold` past its validity
    /// before failing open. Default for every op: fail open as soon as the
    /// factor's validity (3 rollup intervals) passes. `hold` is at most
    /// 10 minutes: a stale factor no longer follows the demand.
    pub fn fail_static(mut self, op: impl Into<String>, hold: Duration) -> Self {
        self.fail_static.push((op.into(), hold));
        self
    }

    /// Talk to the masters over TLS (default: plain TCP, for loopback or a
    /// trusted network).
    pub fn tls(mut self, tls: AgentTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Starts the agent: its clock and its rollup task. Call from within a
    /// tokio runtime.
    pub fn start(self) -> Result<Agent, AgentError> {
        let masters = self.masters.ok_or(AgentError::NoMasters)?;
        if let Masters::Static(list) = &masters {
            if list.is_empty() {
                return Err(AgentError::NoMasters);
            }
            for address in list {
                validate_address(address)?;
            }
        }
        if let Masters::Dns { host, every, .. } = &masters {
            if host.is_empty() {
                return Err(AgentError::NoMasters);
            }
            if every.is_zero() {
                return Err(AgentError::Invalid {
                    field: "masters_dns",
                    reason: "the re-resolve period must be greater than zero",
                });
            }
        }
        if self.rollup_interval < Duration::from_millis(10) {
            return Err(AgentError::Invalid {
                field: "rollup_interval",
                reason: "must be at least 10 ms",
            });
        }
        if self.forget_after < self.rollup_interval {
            return Err(AgentError::Invalid {
                field: "forget_after",
                reason: "must be at least the rollup interval",
            });
        }
        if self.fail_after == 0 {
            return Err(AgentError::Invalid {
                field: "fail_after",
                reason: "must be at least 1",
            });
        }
        if self.max_entries_per_request == 0 {
            return Err(AgentError::Invalid {
                field: "max_entries_per_request",
                reason: "must be at least 1",
            });
        }
        for (op, hold) in &self.fail_static {
            if damper_core::wire::validate_name("op", op).is_err() {
                return Err(AgentError::Invalid {
                    field: "fail_static",
                    reason: "the op must be 1 to 256 bytes long",
                });
            }
            if *hold > Duration::from_secs(600) {
                return Err(AgentError::Invalid {
                    field: "fail_static",
                    reason: "the hold must be at most 10 minutes",
                });
            }
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| AgentError::NoRuntime)?;
        let agent_id = self.agent_id.unwrap_or_else(default_agent_id);
        let clock = CoarseClock::shared().map_err(|e| AgentError::Clock(e.to_string()))?;
        let state = self.fail_static.iter().fold(
            AgentState::new(AgentConfig {
                rollup_interval: self.rollup_interval,
                local_window: self.local_window,
                forget_after: self.forget_after,
            }),
            |state, (op, hold)| state.with_fail_static(op, *hold),
        );
        let shared = Arc::new(Shared {
            state,
            clock,
            agent_id,
            stats: Stats::default(),
        });
        let settings = rollup::Settings {
            masters,
            rollup_interval: self.rollup_interval,
            request_timeout: self
                .request_timeout
                .unwrap_or((self.rollup_interval / 2).min(Duration::from_secs(1))),
            max_entries_per_request: self.max_entries_per_request,
            max_carry: self.max_carry,
            tls: self.tls,
            health: damper_core::membership::HealthConfig {
                fail_after: self.fail_after,
                rollup_interval: self.rollup_interval,
                ..Default::default()
            },
        };
        let (stop, stopped) = watch::channel(false);
        let task = runtime.spawn(rollup::run(shared.clone(), settings, stopped));
        Ok(Agent {
            shared,
            stop,
            task: Mutex::new(Some(task)),
        })
    }
}

fn validate_address(address: &str) -> Result<(), AgentError> {
    let bad = |reason| AgentError::BadAddress {
        address: address.to_string(),
        reason,
    };
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| bad("expected host:port"))?;
    if host.is_empty() {
        return Err(bad("the host is empty"));
    }
    if host.contains("://") || host.contains('/') {
        return Err(bad("give host:port, without a scheme or path"));
    }
    port.parse::<u16>()
        .map_err(|_| bad("the port is not a number from 0 to 65535"))?;
    Ok(())
}

fn default_agent_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "agent".into());
    format!("{host}-{}", std::process::id())
}

/// State shared by the handle and the rollup task.
pub(crate) struct Shared {
    pub(crate) state: AgentState,
    pub(crate) clock: CoarseClock,
    pub(crate) agent_id: String,
    pub(crate) stats: Stats,
}

/// Running totals behind [`Agent::stats`], kept by the rollup task.
pub(crate) struct Stats {
    pub(crate) rollups_sent: AtomicU64,
    pub(crate) rollups_failed: AtomicU64,
    pub(crate) factors_expired: AtomicU64,
    pub(crate) dropped_cost: AtomicU64,
    pub(crate) forgotten: AtomicU64,
    pub(crate) entries_sent: AtomicU64,
    pub(crate) bytes_sent: AtomicU64,
    pub(crate) bytes_received: AtomicU64,
    pub(crate) latency: [AtomicU64; LATENCY_BUCKETS],
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            rollups_sent: AtomicU64::new(0),
            rollups_failed: AtomicU64::new(0),
            factors_expired: AtomicU64::new(0),
            dropped_cost: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
            entries_sent: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Stats {
    /// Counts one answered rollup: its entries, request and reply sizes,
    /// and round trip.
    pub(crate) fn answered(&self, entries: usize, sent: usize, received: usize, took: Duration) {
        self.rollups_sent.fetch_add(1, Relaxed);
        self.entries_sent.fetch_add(entries as u64, Relaxed);
        self.bytes_sent.fetch_add(sent as u64, Relaxed);
        self.bytes_received.fetch_add(received as u64, Relaxed);
        self.latency[latency_bucket(took)].fetch_add(1, Relaxed);
    }
}

/// Buckets of the rollup latency histogram: four per doubling, from 1 µs.
const LATENCY_BUCKETS: usize = 128;

fn latency_bucket(took: Duration) -> usize {
    let us = took.as_micros().max(1) as f64;
    ((us.log2() * 4.0) as usize).min(LATENCY_BUCKETS - 1)
}

/// Rollup round trips, in buckets four to a doubling (each bucket's upper
/// bound is at most 19% above its lower bound).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: [u64; LATENCY_BUCKETS],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: [0; LATENCY_BUCKETS],
        }
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.count())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .finish()
    }
}

impl LatencyHistogram {
    /// Round trips recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The round trip that a fraction `q` (0 to 1) of them took at most, as
    /// the upper bound of its bucket; `None` with nothing recorded.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(Duration::from_secs_f64(
                    2f64.powf((i + 1) as f64 / 4.0) / 1e6,
                ));
            }
        }
        None
    }
}

/// What the agent's rollup task has done since start: for the host's health
/// checks and tests. The same figures go to the `metrics` facade.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// Rollup requests a master answered.
    pub rollups_sent: u64,
    /// Rollup requests that failed (timeout, refused, error status); their
    /// counts were carried over.
    pub rollups_failed: u64,
    /// Fail-open events: positive factors that lapsed with no fresher one
    /// from their master, so their (account, op) went back to admitting.
    pub factors_expired: u64,
    /// Attempted cost dropped because it could not be delivered within
    /// `max_carry`.
    pub dropped_cost: u64,
    /// Idle (account, op) pairs forgotten to bound memory
    /// ([`AgentBuilder::forget_after`]).
    pub forgotten: u64,
    /// (account, op) entries in the rollups masters answered.
    pub entries_sent: u64,
    /// Encoded size of those rollup requests (protobuf, before HTTP/2 and
    /// TLS framing).
    pub bytes_sent: u64,
    /// Encoded size of the replies: the control traffic.
    pub bytes_received: u64,
    /// Their round trips.
    pub rollup_latency: LatencyHistogram,
}

/// The totals over several agents (a process that runs many, like
/// `damper-load`).
impl std::iter::Sum for AgentStats {
    fn sum<I: Iterator<Item = AgentStats>>(stats: I) -> AgentStats {
        stats.fold(AgentStats::default(), |s, a| AgentStats {
            rollups_sent: s.rollups_sent + a.rollups_sent,
            rollups_failed: s.rollups_failed + a.rollups_failed,
            factors_expired: s.factors_expired + a.factors_expired,
            dropped_cost: s.dropped_cost + a.dropped_cost,
            forgotten: s.forgotten + a.forgotten,
            entries_sent: s.entries_sent + a.entries_sent,
            bytes_sent: s.bytes_sent + a.bytes_sent,
            bytes_received: s.bytes_received + a.bytes_received,
            rollup_latency: LatencyHistogram {
                counts: std::array::from_fn(|i| {
                    s.rollup_latency.counts[i] + a.rollup_latency.counts[i]
                }),
            },
        })
    }
}

/// The agent a node holds. Cheap to share: wrap it in an `Arc`.
pub struct Agent {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("agent_id", &self.shared.agent_id)
            .field("state", &self.shared.state)
            .finish()
    }
}

thread_local! {
    /// Per-thread randomness for the probabilistic decision, seeded from the
    /// OS-seeded keys of std's `RandomState`: no shared state, no lock.
    static RNG: RefCell<SmallRng> = RefCell::new(SmallRng::seed_from_u64({
        let mut h = std::hash::RandomState::new().build_hasher();
        h.write_u64(0);
        h.finish()
    }));
}

impl Agent {
    /// Settings for a new agent.
    pub fn builder() -> AgentBuilder {
        AgentBuilder::default()
    }

    /// Decides one operation of `cost` (a publish to N subscribers costs
    /// 1 + N) by `account` on `op`, and counts it for the next rollup.
    ///
    /// Never blocks, never fails because a master is slow or down. See
    /// [`AgentState::check`] for the edge cases (cost 0, empty or over-long
    /// names: admitted and not counted).
    #[inline]
    pub fn check(&self, account: &str, op: &str, cost: u64) -> Decision {
        let now = self.shared.clock.now();
        RNG.with_borrow_mut(|rng| self.shared.state.check(now, account, op, cost, rng))
    }

    /// The agent's coarse clock (updated every millisecond by a shared
    /// thread, so reading it is a load, not a syscall): the `now` to give
    /// the node's [`local`] limiters, so they cost no clock read either.
    #[inline]
    pub fn now(&self) -> damper_core::time::Nanos {
        self.shared.clock.now()
    }

    /// The master's factor in force for an (account, op), or `None` if this
    /// agent never saw it.
    pub fn factor(&self, account: &str, op: &str) -> Option<f64> {
        self.shared
            .state
            .factor(self.shared.clock.now(), account, op)
    }

    /// What the rollup task has done since start.
    pub fn stats(&self) -> AgentStats {
        Agent::stats_of(&self.shared.stats)
    }

    fn stats_of(s: &Stats) -> AgentStats {
        AgentStats {
            rollups_sent: s.rollups_sent.load(Relaxed),
            rollups_failed: s.rollups_failed.load(Relaxed),
            factors_expired: s.factors_expired.load(Relaxed),
            dropped_cost: s.dropped_cost.load(Relaxed),
            forgotten: s.forgotten.load(Relaxed),
            entries_sent: s.entries_sent.load(Relaxed),
            bytes_sent: s.bytes_sent.load(Relaxed),
            bytes_received: s.bytes_received.load(Relaxed),
            rollup_latency: LatencyHistogram {
                counts: std::array::from_fn(|i| s.latency[i].load(Relaxed)),
            },
        }
    }

    /// This agent's identity.
    pub fn id(&self) -> &str {
        &self.shared.agent_id
    }

    /// Stops the rollup task after it sends a last rollup of everything
    /// counted so far, and waits for that. Checks made afterwards are still
    /// decided (on the factors in force) but no longer reported.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Without shutdown(): stop the task, without a last flush. The clock
        // thread ends once no agent holds it.
        let _ = self.stop.send(true);
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests;
