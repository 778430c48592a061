//! The Damper master service: ingests agents' rollups over gRPC and answers
//! with the suppression factor of each limited (account, op).
//!
//! A thin shell over [`damper_core::master::MasterState`]: the service holds
//! several of them as shards (an account always lands in the same shard), so
//! rollups from many agents are ingested on all cores at once, each shard
//! behind its own short lock that is never held across an `await`.
//!
//! # Layout
//! - this file: [`Master`], the sharded state, the clock, and the options.
//! - `ingest`: [`Master::answer`] (and [`Master::rollup`] on the protobuf
//!   messages): a rollup validated, ingested shard by shard and answered
//!   with a compact reply, by the rules of [`damper_core::wire`];
//!   [`Master::factors`] for rechecks and probes; what was ingested.
//! - `push`: the verdicts early reports flipped, broadcast to every agent
//!   watching ([`Master::watch`]).
//! - `ring_view`: [`Master::set_ring`], the master's view of the ring, to
//!   tell agents whose view differs.
//! - `accounts`: [`AccountsQuery`] and [`Master::accounts`]: which
//!   (account, op) pairs are suppressed, and why.
//! - `service`: [`MasterService`], the `damper.v1.Master` gRPC service,
//!   where core errors become `tonic::Status`; [`run`] serves a listener
//!   until a shutdown future completes, [`run_with_tls`] over TLS.
//! - `tls`: [`ServerTls`] (mutual TLS when a client CA is set).
//! - `snapshot`: [`Master::write_snapshot`] and [`Master::load_snapshot`],
//!   so a restart keeps the windows.
//! - [`reload`]: live config changes ([`Master::reload`], the file watcher
//!   [`reload::ConfigWatcher`]) that keep every window.
//! - [`events`]: accounts near their limit and suppression starting and
//!   ending, numbered, logged, kept and sent to subscribers.
//! - [`http`]: the operator's HTTP endpoint: `/v1/accounts`, the events
//!   stream `/v1/events` (`http/events.rs`), the accounts page at `/`,
//!   Prometheus `/metrics`.
//! - [`Allocator`]: the allocator the binary runs with.
//! - `src/main.rs`: the `damper-master` binary (flags, logs, signals).
//!
//! # Example
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use damper_core::config::MasterConfig;
//! use damper_master::{Master, MasterOptions, run};
//!
//! let config = MasterConfig::from_toml("[limits]\nmessages = 1000")?;
//! let master = Master::new(config, MasterOptions::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! run(listener, master, async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod accounts;
pub mod events;
pub mod http;
mod identity;
mod ingest;
mod push;
pub mod reload;
mod ring_accounts;
mod ring_view;
mod service;
mod snapshot;
mod tls;

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use damper_core::config::MasterConfig;
use damper_core::master::MasterState;
use damper_core::time::{Clock, Nanos, SystemClock};

pub use accounts::{AccountsQuery, AccountsSort, ratio};
pub use identity::AllowList;
pub use ingest::Ingested;
use ingest::IngestedCounters;
pub use ring_accounts::{Missing, PEER_TIMEOUT, RingAccounts, RingRow};
use ring_view::RingView;
pub use ring_view::RingViewError;
pub use service::{MasterService, ServeError, run, run_with_tls, status};
pub use snapshot::SnapshotError;
pub use tls::{ServerTls, TlsError};

/// The allocator the `damper-master` binary runs with, and its benchmarks
/// and memory example with it: mimalloc. Ingesting a rollup allocates and
/// frees a few buffers and a name per entry; under glibc's allocator that
/// was 15% of the time of a steady round's ingest (`perf`,
/// docs/performance.md), under mimalloc's per-thread free lists a fifth
/// less time per entry. Declared with `#[global_allocator]` by each
/// program, as a library cannot choose it.
pub use mimalloc::MiMalloc as Allocator;

/// The embedded default configuration (`crates/damper-master/default.toml`).
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Limits that protect the master from oversized requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MasterOptions {
    /// Number of state shards. More shards than cores keeps two rollups
    /// from waiting on the same lock. Default: 4 per core.
    pub shards: usize,
    /// Most (account, op) entries one rollup may carry; more is answered
    /// with RESOURCE_EXHAUSTED. Agents split larger rollups. Default 100 000.
    pub max_entries: usize,
    /// Largest request, in bytes, the gRPC server decodes. Default 16 MiB.
    pub max_message_bytes: usize,
    /// How long an (account, op) may go without a report before it is
    /// forgotten. Default: three windows. At most
    /// [`MAX_REPORT_AGE`](damper_core::master::MAX_REPORT_AGE) (24 days):
    /// longer is taken as that, since an entry keeps its last report's
    /// time in 32 bits.
    pub idle_after: Option<Duration>,
    /// Most (account, op) pairs tracked at once, over all shards. Past it,
    /// reports of new pairs are not tracked (they fail open) and are
    /// counted; every pair already tracked keeps its state, so a client
    /// sending made-up names cannot exhaust memory nor free a flood being
    /// held. Default 8 000 000: about 0.55 GB of state at ~63–69 bytes a
    /// pair.
    /// Shared out over the shards, each of which tracks at most
    /// [`MAX_SHARD_PAIRS`](damper_core::master::MAX_SHARD_PAIRS) (the
    /// binary refuses to start past it; a library caller's shards stop
    /// there).
    pub max_pairs: usize,
    /// The most cost per second one agent may claim for one (account, op),
    /// in a rollup (over its interval, or one second if shorter) or an
    /// early report; a claim above it is refused with INVALID_ARGUMENT
    /// naming the entry, so whoever reaches the port cannot set an
    /// account's factor with a made-up deluge. Default 10 000 000, far
    /// above what one node attempts.
    pub max_claimed_rate: u64,
    /// The most new (account, op) pairs one agent may make this master
    /// track per rollup interval. Past it, that agent's new pairs are not
    /// tracked (they fail open) and are counted, while other agents' new
    /// pairs are unaffected: one compromised or broken node cannot take
    /// all of `max_pairs`. A node's first round names every account it
    /// serves, so this must be above that. Default 250 000.
    pub max_new_pairs_per_agent: usize,
    /// The most room the agents' dictionaries of account numbers may take
    /// (4 bytes a number, and 16 numbers' worth for each agent run, see
    /// `damper_core::wire::dictionary`): past it, agents are told to name
    /// their accounts in every rollup, as before numbers. 0 turns numbers
    /// off: every reply tells agents to name their accounts. Default
    /// 8 000 000 (32 MB, and each distinct name once).
    pub max_account_numbers: usize,
}

impl Default for MasterOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        MasterOptions {
            shards: cores * 4,
            max_entries: 100_000,
            max_message_bytes: 16 << 20,
            idle_after: None,
            max_pairs: 8_000_000,
            max_claimed_rate: 10_000_000,
            max_new_pairs_per_agent: 250_000,
            max_account_numbers: 8_000_000,
        }
    }
}

/// Pairs an eviction looks at per hold of a shard's lock.
const EVICT_STEP: usize = 2_048;

/// How long an eviction lets go of a shard between steps, so rollups
/// waiting for it get it.
const EVICT_PAUSE: Duration = Duration::from_micros(100);

/// The master's state: sharded per-(account, op) windows. Cheap to clone
/// (shared).
#[derive(Clone)]
pub struct Master {
    shared: Arc<Shared>,
}

struct Shared {
    shards: Box<[Mutex<MasterState>]>,
    /// Picks an account's shard: fixed, so an account never moves.
    shard_hasher: foldhash::fast::FixedState,
    clock: Arc<dyn Clock>,
    options: MasterOptions,
    idle_after: Duration,
    rollup_interval: Duration,
    /// When this master started: agents rejoin it relative to this.
    started: Nanos,
    /// Totals of what was ingested, for [`Master::ingested`].
    ingested: IngestedCounters,
    /// This master's view of the ring, when configured: lets it tell agents
    /// whose view differs ([`Master::set_ring`]).
    ring: std::sync::OnceLock<RingView>,
    /// Every op the suppressed-accounts gauge was set for, so it is set
    /// back to 0 when none is suppressed any more.
    suppressed_ops: Mutex<std::collections::BTreeSet<String>>,
    /// When each agent's last early report was taken: at most one per
    /// `policy.surge_min_gap` each.
    surge_budget: Mutex<damper_core::master::SurgeBudget>,
    /// When the refusals of untrusted input were last logged.
    warned: crate::ingest::Warned,
    /// The numbered rollups counted lately, so a resend is counted once.
    rollup_log: Mutex<damper_core::master::RollupLog>,
    /// How many new pairs each agent added this round.
    new_pairs: Mutex<damper_core::master::NewPairBudget>,
    /// Accounts near their limit, suppression started and ended.
    events: events::Events,
    /// Verdicts early reports flipped, for every watching agent.
    pushes: push::Pushes,
    /// The other masters of the ring, for one view of all accounts.
    peers: ring_accounts::Peers,
    /// Each agent run's account numbers, so its rollups name an account
    /// once rather than every round. Taken once per rollup, before any
    /// shard.
    dictionaries: Mutex<damper_core::wire::dictionary::Dictionaries>,
}

impl Master {
    /// A master on the system clock.
    pub fn new(config: MasterConfig, options: MasterOptions) -> Master {
        Master::with_clock(config, options, Arc::new(SystemClock))
    }

    /// A master on the given clock (tests).
    pub fn with_clock(
        config: MasterConfig,
        options: MasterOptions,
        clock: Arc<dyn Clock>,
    ) -> Master {
        let shards = options.shards.max(1);
        let per_shard = options.max_pairs.div_ceil(shards).max(1);
        let w = &config.window;
        let window = w.sub_interval * w.sub_intervals.get() as u32 + w.settle();
        Master {
            shared: Arc::new(Shared {
                shards: (0..shards)
                    .map(|_| {
                        let mut state = MasterState::new(config.clone());
                        state.track_transitions(true);
                        state.track_pushes(true);
                        state.set_max_pairs(per_shard);
                        Mutex::new(state)
                    })
                    .collect(),
                shard_hasher: foldhash::fast::FixedState::with_seed(0x6461_6d70),
                clock: clock.clone(),
                options,
                idle_after: options
                    .idle_after
                    .unwrap_or(window * 3)
                    .min(damper_core::master::MAX_REPORT_AGE),
                rollup_interval: w.rollup_interval,
                started: clock.now(),
                ingested: IngestedCounters::default(),
                surge_budget: Mutex::default(),
                ring: std::sync::OnceLock::new(),
                suppressed_ops: Mutex::default(),
                warned: crate::ingest::Warned::default(),
                rollup_log: Mutex::default(),
                events: events::Events::default(),
                pushes: push::Pushes::default(),
                peers: ring_accounts::Peers::default(),
                dictionaries: Mutex::new(damper_core::wire::dictionary::Dictionaries::new({
                    let mut limits = damper_core::wire::dictionary::DictionaryLimits::default();
                    limits.max_total = options.max_account_numbers;
                    limits
                })),
                new_pairs: Mutex::new(damper_core::master::NewPairBudget::new(
                    options.max_new_pairs_per_agent,
                    w.rollup_interval,
                    100_000,
                )),
            }),
        }
    }

    fn shard(&self, account: &str) -> usize {
        (self.shared.shard_hasher.hash_one(account) % self.shared.shards.len() as u64) as usize
    }

    /// Room held by agents' dictionaries of account numbers, over every
    /// agent run: the numbers, and 16 for each dictionary (see
    /// `damper_core::wire::dictionary`).
    pub fn dictionary_ids(&self) -> usize {
        self.dictionaries().total()
    }

    fn dictionaries(
        &self,
    ) -> std::sync::MutexGuard<'_, damper_core::wire::dictionary::Dictionaries> {
        self.shared
            .dictionaries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self, shard: usize) -> std::sync::MutexGuard<'_, MasterState> {
        // A panic while holding a shard cannot leave it half-updated in a way
        // that matters more than losing the master: keep serving.
        self.shared.shards[shard]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets every (account, op) idle for longer than the idle time.
    /// Returns how many went.
    pub fn evict_idle(&self) -> usize {
        let now = self.shared.clock.now();
        self.dictionaries().evict_idle(now);
        let mut evicted = 0;
        for s in 0..self.shared.shards.len() {
            // A shard's pass in steps of EVICT_STEP pairs, the lock let go
            // between them: a rollup waits for a step or two, not for a
            // whole shard's pass. Forgetting a million idle pairs stalled
            // ingest by 33-86 ms in one pass per shard, 2.3-4.6 ms in steps
            // (`examples/evict_stall.rs`).
            let mut cursor = 0;
            loop {
                let (gone, done) = {
                    let mut state = self.lock(s);
                    let (gone, done) =
                        state.evict_idle_from(now, self.shared.idle_after, &mut cursor, EVICT_STEP);
                    // Under the shard's lock, as for rollups (`ingest`).
                    self.shared.events.publish(now, state.take_transitions());
                    (gone, done)
                };
                evicted += gone;
                if done {
                    break;
                }
                // The lock is not fair: re-taken at once, it would go to
                // this thread again before a waiting rollup's thread woke.
                std::thread::sleep(EVICT_PAUSE);
            }
        }
        evicted
    }

    /// Sets the gauges that describe the whole state (pairs tracked, pairs
    /// suppressed per op, and would-be suppressed under limits in shadow)
    /// on the `metrics` recorder. Called before each scrape: a walk over
    /// every pair, so not per rollup.
    pub fn record_gauges(&self) {
        type PerOp = std::collections::BTreeMap<String, usize>;
        let (mut tracked, mut suppressed, mut shadow) = (0usize, PerOp::new(), PerOp::new());
        for s in 0..self.shared.shards.len() {
            let state = self.lock(s);
            tracked += state.len();
            for (op, n) in state.suppressed_by_op() {
                *suppressed.entry(op.to_owned()).or_default() += n;
            }
            for (op, n) in state.shadow_suppressed_by_op() {
                *shadow.entry(op.to_owned()).or_default() += n;
            }
        }
        metrics::gauge!("damper_master_accounts_tracked").set(tracked as f64);
        let dictionaries = self.dictionaries();
        metrics::gauge!("damper_master_dictionary_ids").set(dictionaries.total() as f64);
        metrics::gauge!("damper_master_dictionaries").set(dictionaries.len() as f64);
        metrics::gauge!("damper_master_dictionary_names").set(dictionaries.names() as f64);
        drop(dictionaries);
        let mut seen = self
            .shared
            .suppressed_ops
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // An op that had suppressed accounts and has none now reads 0, not
        // its last value.
        for (name, counts) in [
            ("damper_master_accounts_suppressed", &suppressed),
            ("damper_master_accounts_shadow_suppressed", &shadow),
        ] {
            for op in seen.iter().chain(counts.keys()) {
                let n = counts.get(op).copied().unwrap_or(0);
                metrics::gauge!(name, "op" => op.clone()).set(n as f64);
            }
        }
        seen.extend(suppressed.into_keys().chain(shadow.into_keys()));
    }

    /// Number of (account, op) pairs tracked, over all shards.
    pub fn len(&self) -> usize {
        (0..self.shared.shards.len())
            .map(|s| self.lock(s).len())
            .sum()
    }

    /// The master's clock now.
    pub fn now(&self) -> Nanos {
        self.shared.clock.now()
    }

    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The factor the master would send for an (account, op) now, if it is
    /// limited.
    pub fn factor(&self, account: &str, op: &str) -> Option<f64> {
        let now = self.shared.clock.now();
        self.lock(self.shard(account))
            .verdict(now, account, op)
            .map(|v| v.factor)
    }
}

#[cfg(test)]
mod tests;
