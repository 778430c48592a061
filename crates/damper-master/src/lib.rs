//! The Damper master service: ingests agents' rollups over gRPC and answers
//! with the suppression factor of each limited (account, op).
//!
//! A thin shell over [`damper_core::master::MasterState`]: the service holds
//! several of them as shards (an account always lands in the same shard), so
//! rollups from many agents are ingested on all cores at once, each shard
//! behind its own short lock that is never held across an `await`.
//!
//! # Layout
//! - [`Master`]: the sharded state, the clock, and the options.
//! - [`MasterService`]: the `damper.v1.Master` gRPC service over a [`Master`].
//! - [`run`]: serves a listener until a shutdown future completes;
//!   [`run_with_tls`] with [`ServerTls`] (mutual TLS when a client CA is set).
//! - `snapshot`: [`Master::write_snapshot`] and [`Master::load_snapshot`],
//!   so a restart keeps the windows.
//! - [`reload`]: live config changes ([`Master::reload`], the file watcher
//!   [`reload::ConfigWatcher`]) that keep every window.
//! - [`http`]: the operator's HTTP endpoint: `/v1/accounts`, the accounts
//!   page at `/`, Prometheus `/metrics`.
//! - [`AccountsQuery`] and [`Master::accounts`]: which (account, op) pairs
//!   are suppressed, and why.
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

use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use damper_core::config::MasterConfig;
use damper_core::limits::Rate;
use damper_core::master::{KeyView, Transition, TransitionKind, Verdict, validate_name};
use damper_core::master::{MasterState, Report};
use damper_core::ring::Ring;
use damper_core::time::{Clock, Nanos, SystemClock};
use damper_proto::v1::master_server::MasterServer;
use damper_proto::v1::{AccountFactor, FactorsRequest, OpFactors, RollupReply, RollupRequest};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// The embedded default configuration (`crates/damper-master/default.toml`).
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Limits that protect the master from oversized requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// forgotten. Default: three windows.
    pub idle_after: Option<Duration>,
}

impl Default for MasterOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        MasterOptions {
            shards: cores * 4,
            max_entries: 100_000,
            max_message_bytes: 16 << 20,
            idle_after: None,
        }
    }
}

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
    rollup_interval_ms: u32,
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
}

struct RingView {
    ring: Ring,
    me: String,
}

/// Why a ring view was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RingViewError {
    /// This master is not among the members.
    #[error("this master's address {me:?} is not one of the ring's members {members:?}")]
    NotAMember {
        /// The address given for this master.
        me: String,
        /// The members given.
        members: Vec<String>,
    },
    /// A view was set already.
    #[error("the ring view is already set")]
    AlreadySet,
}

#[derive(Default)]
struct IngestedCounters {
    foreign: AtomicU64,
    rollups: AtomicU64,
    entries: AtomicU64,
    attempted: AtomicU64,
    admitted: AtomicU64,
}

/// What a master has counted since it started, over all shards: rollups
/// accepted and the entries and cost they carried. Refused rollups are not
/// in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ingested {
    /// Rollups accepted.
    pub rollups: u64,
    /// (account, op) entries they carried.
    pub entries: u64,
    /// Attempted cost they reported (saturating).
    pub attempted: u64,
    /// Admitted cost they reported (saturating).
    pub admitted: u64,
    /// Entries for accounts this master does not own under its view of the
    /// ring (counted all the same).
    pub foreign: u64,
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
        let w = &config.window;
        let window = w.sub_interval * w.sub_intervals.get() as u32 + w.settle();
        let rollup_interval_ms = millis_u32(w.rollup_interval);
        Master {
            shared: Arc::new(Shared {
                shards: (0..shards)
                    .map(|_| {
                        let mut state = MasterState::new(config.clone());
                        state.track_transitions(true);
                        Mutex::new(state)
                    })
                    .collect(),
                shard_hasher: foldhash::fast::FixedState::with_seed(0x6461_6d70),
                clock: clock.clone(),
                options,
                idle_after: options.idle_after.unwrap_or(window * 3),
                rollup_interval_ms,
                started: clock.now(),
                ingested: IngestedCounters::default(),
                ring: std::sync::OnceLock::new(),
                suppressed_ops: Mutex::default(),
            }),
        }
    }

    /// Tells this master the ring the masters form (every configured master,
    /// as agents address them) and its own address in it. It then counts the
    /// entries of rollups for accounts it does not own and says so in the
    /// reply, with its ring version, so agents whose view differs heal it.
    pub fn set_ring(&self, members: &[String], me: &str) -> Result<(), RingViewError> {
        if !members.iter().any(|m| m == me) {
            return Err(RingViewError::NotAMember {
                me: me.to_string(),
                members: members.to_vec(),
            });
        }
        self.shared
            .ring
            .set(RingView {
                ring: Ring::new(members),
                me: me.to_string(),
            })
            .map_err(|_| RingViewError::AlreadySet)
    }

    fn shard(&self, account: &str) -> usize {
        (self.shared.shard_hasher.hash_one(account) % self.shared.shards.len() as u64) as usize
    }

    fn lock(&self, shard: usize) -> std::sync::MutexGuard<'_, MasterState> {
        // A panic while holding a shard cannot leave it half-updated in a way
        // that matters more than losing the master: keep serving.
        self.shared.shards[shard]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Ingests one rollup and builds the reply. The whole request is
    /// validated first: a bad one is refused with a status naming the field
    /// and nothing of it is counted.
    ///
    /// Copies the request; the service calls
    /// [`rollup_taking_names`](Self::rollup_taking_names) on the one it owns.
    pub fn rollup(&self, request: &RollupRequest) -> Result<RollupReply, Status> {
        self.rollup_taking_names(&mut request.clone())
    }

    /// [`rollup`](Self::rollup), moving the account names of the limited
    /// pairs from the request into the reply rather than copying them: the
    /// request is left with those names empty.
    pub fn rollup_taking_names(&self, request: &mut RollupRequest) -> Result<RollupReply, Status> {
        let now = self.shared.clock.now();
        validate(request, self.shared.options.max_entries, now)?;

        // Group entries by shard so each shard is locked once per request.
        // The same pass totals what the rollup carries, for `ingested`.
        let mut by_shard: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.shared.shards.len()];
        let (mut entries, mut attempted, mut admitted) = (0u64, 0u64, 0u64);
        for (i, op) in request.ops.iter().enumerate() {
            for (j, counts) in op.accounts.iter().enumerate() {
                by_shard[self.shard(&counts.account)].push((i, j));
                entries += 1;
                attempted = attempted.saturating_add(counts.attempted);
                admitted = admitted.saturating_add(counts.admitted);
            }
        }
        // Before the names move into the reply.
        let foreign = self.foreign_entries(request);
        let mut factors: Vec<Vec<AccountFactor>> = vec![Vec::new(); request.ops.len()];
        // What the reply implies for the accounts it does not list, per op:
        // from the first shard's config (during a reload shards may differ
        // for a moment; a verdict is left unlisted only if it matches).
        let mut unlisted: Option<Vec<Option<Unlisted>>> = None;
        let mut recheck_at: Option<Nanos> = None;
        for (shard, entries) in by_shard.iter().enumerate().filter(|(_, e)| !e.is_empty()) {
            let mut state = self.lock(shard);
            let unlisted = unlisted.get_or_insert_with(|| {
                Unlisted::per_op(state.config(), request.ops.iter().map(|op| &op.op))
            });
            // Bring every pair's state into cache at once (the misses
            // overlap), rather than one miss after another below.
            state.warm(entries.iter().map(|&(i, j)| {
                (
                    request.ops[i].op.as_str(),
                    request.ops[i].accounts[j].account.as_str(),
                )
            }));
            for &(i, j) in entries {
                let verdict = state.ingest(now, &report(request, i, j)).map_err(|e| {
                    Status::invalid_argument(format!("ops[{i}].accounts[{j}]: {e}"))
                })?;
                if let Some(v) = verdict {
                    recheck_at = recheck_at.max(v.recheck_at);
                    if !Unlisted::implies(unlisted[i], &v) {
                        let account = std::mem::take(&mut request.ops[i].accounts[j].account);
                        factors[i].push(account_factor(account, &v));
                    }
                }
            }
            // Logged once the shard is free for other rollups.
            let transitions = state.take_transitions();
            drop(state);
            log_transitions(transitions);
        }
        let counted = &self.shared.ingested;
        counted.rollups.fetch_add(1, Relaxed);
        counted.entries.fetch_add(entries, Relaxed);
        let add = |total: &AtomicU64, v: u64| {
            let _ = total.fetch_update(Relaxed, Relaxed, |t| Some(t.saturating_add(v)));
        };
        add(&counted.attempted, attempted);
        add(&counted.admitted, admitted);
        metrics::counter!("damper_master_rollups_total").increment(1);
        metrics::counter!("damper_master_entries_total").increment(entries);
        metrics::counter!("damper_master_factors_sent_total")
            .increment(factors.iter().map(Vec::len).sum::<usize>() as u64);
        let ops = request.ops.iter().map(|op| &op.op);
        let unlisted = unlisted.unwrap_or_default();
        let mut reply = self.reply(ops, factors, &unlisted);
        if let Some(foreign) = foreign {
            if foreign > 0 {
                counted.foreign.fetch_add(foreign as u64, Relaxed);
                metrics::counter!("damper_master_foreign_entries_total").increment(foreign as u64);
                tracing::debug!(agent = %request.agent_id, foreign, "rollup carries accounts this master does not own: the agent's ring differs");
            }
            reply.foreign_entries = u32::try_from(foreign).unwrap_or(u32::MAX);
        }
        if let Some(at) = recheck_at {
            reply.recheck_after_ms = millis_u32(at.since(now)).max(1);
        }
        Ok(reply)
    }

    /// How many of the request's entries are for accounts this master does
    /// not own, when the agent's ring differs from this master's (`None`
    /// when it is the same, or no ring is set).
    fn foreign_entries(&self, request: &RollupRequest) -> Option<usize> {
        let view = self.shared.ring.get()?;
        (request.ring_version != view.ring.version()).then(|| {
            request
                .ops
                .iter()
                .flat_map(|op| &op.accounts)
                .filter(|c| view.ring.owner(&c.account) != Some(view.me.as_str()))
                .count()
        })
    }

    /// [`rollup`](Self::rollup) on an encoded `RollupRequest`, as it comes
    /// off the wire: bytes that do not decode are INVALID_ARGUMENT. The
    /// entry point of the fuzz target and of the malformed-input corpus.
    pub fn rollup_bytes(&self, bytes: &[u8]) -> Result<RollupReply, Status> {
        let mut request = <RollupRequest as prost::Message>::decode(bytes)
            .map_err(|e| Status::invalid_argument(format!("not a RollupRequest: {e}")))?;
        self.rollup_taking_names(&mut request)
    }

    /// The factors in force for the requested pairs, counting nothing.
    pub fn factors(&self, request: &FactorsRequest) -> Result<RollupReply, Status> {
        let entries: usize = request.ops.iter().map(|op| op.accounts.len()).sum();
        if entries > self.shared.options.max_entries {
            return Err(Status::resource_exhausted(format!(
                "request names {entries} (account, op) pairs; this master accepts at most {} per call",
                self.shared.options.max_entries
            )));
        }
        for (i, op) in request.ops.iter().enumerate() {
            for (j, account) in op.accounts.iter().enumerate() {
                validate_name("op", &op.op)
                    .and_then(|()| validate_name("account", account))
                    .map_err(|e| {
                        Status::invalid_argument(format!("ops[{i}].accounts[{j}]: {e}"))
                    })?;
            }
        }
        let now = self.shared.clock.now();
        let unlisted = Unlisted::per_op(self.lock(0).config(), request.ops.iter().map(|op| &op.op));
        let factors = request
            .ops
            .iter()
            .zip(&unlisted)
            .map(|(op, &unlisted)| {
                op.accounts
                    .iter()
                    .filter_map(|account| {
                        let v = self
                            .lock(self.shard(account))
                            .verdict(now, account, &op.op)?;
                        (!Unlisted::implies(unlisted, &v))
                            .then(|| account_factor(account.clone(), &v))
                    })
                    .collect()
            })
            .collect();
        Ok(self.reply(request.ops.iter().map(|op| &op.op), factors, &unlisted))
    }

    /// The reply: per op, the listed factors and what the unlisted accounts
    /// get. An op with neither (no limit applies to it) is left out.
    fn reply<'a>(
        &self,
        ops: impl Iterator<Item = &'a String>,
        factors: Vec<Vec<AccountFactor>>,
        unlisted: &[Option<Unlisted>],
    ) -> RollupReply {
        RollupReply {
            ops: ops
                .zip(factors)
                .enumerate()
                .filter_map(|(i, (op, accounts))| {
                    let unlisted = unlisted.get(i).copied().flatten();
                    (!accounts.is_empty() || unlisted.is_some()).then(|| OpFactors {
                        op: op.clone(),
                        accounts,
                        unlisted_limit: unlisted.map_or(0.0, |u| u.limit.get()),
                        unlisted_valid_for_ms: unlisted.map_or(0, |u| millis_u32(u.valid_for)),
                    })
                })
                .collect(),
            rollup_interval_ms: self.shared.rollup_interval_ms,
            recheck_after_ms: 0,
            started_unix_ms: self.shared.started.as_millis(),
            ring_version: self.shared.ring.get().map_or(0, |v| v.ring.version()),
            foreign_entries: 0,
        }
    }

    /// Forgets every (account, op) idle for longer than the idle time.
    /// Returns how many went.
    pub fn evict_idle(&self) -> usize {
        let now = self.shared.clock.now();
        (0..self.shared.shards.len())
            .map(|s| {
                let (evicted, transitions) = {
                    let mut state = self.lock(s);
                    let evicted = state.evict_idle(now, self.shared.idle_after);
                    (evicted, state.take_transitions())
                };
                log_transitions(transitions);
                evicted
            })
            .sum()
    }

    /// The tracked (account, op) pairs that `query` selects, sorted and cut
    /// to its limit, and how many matched before the cut. What the HTTP
    /// endpoint and the accounts page show.
    pub fn accounts(&self, query: &AccountsQuery) -> (Vec<KeyView>, usize) {
        let now = self.shared.clock.now();
        let keep = |op: &str, account: &str| {
            query.op.as_deref().is_none_or(|o| o == op)
                && query
                    .prefix
                    .as_deref()
                    .is_none_or(|p| account.starts_with(p))
                && query.account.as_deref().is_none_or(|a| a == account)
        };
        let mut views: Vec<KeyView> = match &query.account {
            // One account lives in one shard.
            Some(account) => self.lock(self.shard(account)).views(now, keep),
            None => (0..self.shared.shards.len())
                .flat_map(|s| self.lock(s).views(now, keep))
                .collect(),
        };
        views.retain(|v| v.factor >= query.min_factor);
        let matched = views.len();
        let key = |v: &KeyView| match query.sort {
            AccountsSort::Factor => v.factor,
            AccountsSort::Demand => v.demand,
            AccountsSort::Ratio => ratio(v),
            AccountsSort::Account => 0.0,
        };
        views.sort_by(|a, b| {
            key(b)
                .total_cmp(&key(a))
                .then_with(|| (&a.account, &a.op).cmp(&(&b.account, &b.op)))
        });
        views.truncate(query.limit);
        (views, matched)
    }

    /// Sets the gauges that describe the whole state (pairs tracked, pairs
    /// suppressed per op) on the `metrics` recorder. Called before each
    /// scrape: a walk over every pair, so not per rollup.
    pub fn record_gauges(&self) {
        let mut tracked = 0usize;
        let mut suppressed: std::collections::BTreeMap<String, usize> = Default::default();
        for s in 0..self.shared.shards.len() {
            let state = self.lock(s);
            tracked += state.len();
            for (op, n) in state.suppressed_by_op() {
                *suppressed.entry(op.to_owned()).or_default() += n;
            }
        }
        metrics::gauge!("damper_master_accounts_tracked").set(tracked as f64);
        let mut seen = self
            .shared
            .suppressed_ops
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // An op that had suppressed accounts and has none now reads 0, not
        // its last value.
        for op in seen.iter() {
            if !suppressed.contains_key(op) {
                metrics::gauge!("damper_master_accounts_suppressed", "op" => op.clone()).set(0.0);
            }
        }
        for (op, n) in suppressed {
            metrics::gauge!("damper_master_accounts_suppressed", "op" => op.clone()).set(n as f64);
            seen.insert(op);
        }
    }

    /// Number of (account, op) pairs tracked, over all shards.
    pub fn len(&self) -> usize {
        (0..self.shared.shards.len())
            .map(|s| self.lock(s).len())
            .sum()
    }

    /// What this master has counted since it started.
    pub fn ingested(&self) -> Ingested {
        let c = &self.shared.ingested;
        Ingested {
            rollups: c.rollups.load(Relaxed),
            entries: c.entries.load(Relaxed),
            attempted: c.attempted.load(Relaxed),
            admitted: c.admitted.load(Relaxed),
            foreign: c.foreign.load(Relaxed),
        }
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

/// Demand over limit: how far over its limit a pair is (0 when unlimited).
pub fn ratio(v: &KeyView) -> f64 {
    match v.limit {
        Some(limit) if limit > 0.0 => v.demand / limit,
        _ => 0.0,
    }
}

/// One log line per (account, op) that starts or stops being suppressed.
fn log_transitions(transitions: Vec<Transition>) {
    for t in transitions {
        match t.kind {
            TransitionKind::Started => tracing::info!(
                account = %t.account, op = %t.op, factor = t.factor, demand = t.demand, limit = t.limit,
                "suppression started"
            ),
            TransitionKind::Stopped => tracing::info!(
                account = %t.account, op = %t.op, demand = t.demand, "suppression stopped"
            ),
        }
    }
}

/// Which (account, op) pairs [`Master::accounts`] returns, and in what
/// order. The HTTP endpoint parses it from the query string.
#[derive(Clone, Debug, PartialEq)]
pub struct AccountsQuery {
    /// Only this op.
    pub op: Option<String>,
    /// Only accounts that start with this.
    pub prefix: Option<String>,
    /// Only this account.
    pub account: Option<String>,
    /// Only pairs whose factor is at least this (0: all).
    pub min_factor: f64,
    /// The order, largest first.
    pub sort: AccountsSort,
    /// Most rows returned.
    pub limit: usize,
}

impl Default for AccountsQuery {
    fn default() -> Self {
        AccountsQuery {
            op: None,
            prefix: None,
            account: None,
            min_factor: 0.0,
            sort: AccountsSort::Factor,
            limit: 100,
        }
    }
}

/// The order of [`Master::accounts`]: largest first, ties by account then
/// op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccountsSort {
    /// By suppression factor.
    Factor,
    /// By demand rate.
    Demand,
    /// By demand over limit.
    Ratio,
    /// By account name only (ascending).
    Account,
}

fn account_factor(account: String, v: &Verdict) -> AccountFactor {
    AccountFactor {
        account,
        factor: v.factor,
        limit: v.limit.get(),
        valid_for_ms: millis_u32(v.valid_for),
        recheck: v.recheck_at.is_some(),
    }
}

/// A duration in whole milliseconds as the wire carries it (`u32`,
/// saturating).
fn millis_u32(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// The verdict a reply gives the accounts of an op that it does not list
/// (`OpFactors.unlisted_limit`): factor 0 under the op's own limit. Most
/// limited pairs are at factor 0 under it, so most need no bytes at all.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Unlisted {
    limit: Rate,
    valid_for: Duration,
}

impl Unlisted {
    /// For `op` under `config`: `None` when the op has no limit of its own.
    fn of(config: &MasterConfig, op: &str) -> Option<Unlisted> {
        config.limits.op_limit(op).map(|limit| Unlisted {
            limit,
            valid_for: config.policy.factor_validity,
        })
    }

    /// For each of a request's ops, in order.
    fn per_op<'a>(
        config: &MasterConfig,
        ops: impl Iterator<Item = &'a String>,
    ) -> Vec<Option<Unlisted>> {
        ops.map(|op| Unlisted::of(config, op)).collect()
    }

    /// Whether `verdict` is exactly what leaving its account unlisted says,
    /// as it reaches the agent (validity in whole milliseconds).
    fn implies(unlisted: Option<Unlisted>, verdict: &Verdict) -> bool {
        unlisted.is_some_and(|u| {
            verdict.factor == 0.0
                && verdict.recheck_at.is_none()
                && verdict.limit == u.limit
                && millis_u32(verdict.valid_for) == millis_u32(u.valid_for)
        })
    }
}

/// Checks a whole request before any of it is counted.
fn validate(request: &RollupRequest, max_entries: usize, now: Nanos) -> Result<(), Status> {
    let entries: usize = request.ops.iter().map(|op| op.accounts.len()).sum();
    if entries > max_entries {
        return Err(Status::resource_exhausted(format!(
            "rollup carries {entries} entries; this master accepts at most {max_entries} per call: split it"
        )));
    }
    if request.interval_end_unix_ms < request.interval_start_unix_ms {
        return Err(Status::invalid_argument(format!(
            "interval_end_unix_ms ({}) is before interval_start_unix_ms ({})",
            request.interval_end_unix_ms, request.interval_start_unix_ms
        )));
    }
    for (i, op) in request.ops.iter().enumerate() {
        for j in 0..op.accounts.len() {
            report(request, i, j)
                .validate(now)
                .map_err(|e| Status::invalid_argument(format!("ops[{i}].accounts[{j}]: {e}")))?;
        }
    }
    Ok(())
}

/// Entry `j` of op `i` as the core's [`Report`]: an entry's own start, when
/// it has one, overrides the request's.
fn report(request: &RollupRequest, i: usize, j: usize) -> Report<'_> {
    let op = &request.ops[i];
    let counts = &op.accounts[j];
    let start = match counts.start_unix_ms {
        0 => request.interval_start_unix_ms,
        ms => ms,
    };
    Report {
        account: &counts.account,
        op: &op.op,
        start: Nanos::from_millis(start),
        end: Nanos::from_millis(request.interval_end_unix_ms),
        attempted: counts.attempted,
        admitted: counts.admitted,
    }
}

/// The `damper.v1.Master` gRPC service.
#[derive(Clone)]
pub struct MasterService {
    master: Master,
}

impl MasterService {
    /// The service over `master`.
    pub fn new(master: Master) -> MasterService {
        MasterService { master }
    }
}

#[tonic::async_trait]
impl damper_proto::v1::master_server::Master for MasterService {
    async fn rollup(
        &self,
        request: Request<RollupRequest>,
    ) -> Result<Response<RollupReply>, Status> {
        let mut request = request.into_inner();
        let began = tokio::time::Instant::now();
        let result = self.master.rollup_taking_names(&mut request);
        metrics::histogram!("damper_master_ingest_duration_seconds")
            .record(began.elapsed().as_secs_f64());
        match result {
            Ok(reply) => Ok(Response::new(reply)),
            Err(status) => {
                metrics::counter!("damper_master_rollups_rejected_total").increment(1);
                tracing::warn!(agent = %request.agent_id, code = ?status.code(), message = status.message(), "rollup refused");
                Err(status)
            }
        }
    }

    async fn factors(
        &self,
        request: Request<FactorsRequest>,
    ) -> Result<Response<RollupReply>, Status> {
        let request = request.into_inner();
        self.master.factors(&request).map(Response::new).inspect_err(|status| {
            tracing::warn!(agent = %request.agent_id, code = ?status.code(), message = status.message(), "factors request refused");
        })
    }
}

/// Why serving stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The reflection service could not be built from the descriptors.
    #[error("gRPC reflection: {0}")]
    Reflection(String),
}

/// TLS for the master's gRPC server: its certificate and key, and, for
/// mutual authentication, the CA that agents' client certificates must chain
/// to. PEM throughout.
#[derive(Clone)]
pub struct ServerTls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("ServerTls")
            .field("mutual", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

/// Why TLS settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{field}: cannot read {path}: {source}")]
    Read {
        /// Which setting.
        field: &'static str,
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file does not hold what the setting needs.
    #[error("{field}: {path} holds no PEM {what}")]
    NotPem {
        /// Which setting.
        field: &'static str,
        /// The file.
        path: String,
        /// What was expected.
        what: &'static str,
    },
}

impl ServerTls {
    /// TLS with this certificate chain and key (PEM). Agents are not asked
    /// for certificates unless [`require_client_ca`](Self::require_client_ca)
    /// is set too.
    pub fn new(cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> ServerTls {
        ServerTls {
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
            client_ca_pem: None,
        }
    }

    /// Mutual TLS: refuse agents without a client certificate that chains to
    /// this CA (PEM).
    pub fn require_client_ca(mut self, ca_pem: impl Into<Vec<u8>>) -> ServerTls {
        self.client_ca_pem = Some(ca_pem.into());
        self
    }

    /// Reads the files, checking each holds what it should; errors name
    /// the flag (`--tls-cert`, `--tls-key`, `--tls-client-ca`).
    pub fn from_files(
        cert: &std::path::Path,
        key: &std::path::Path,
        client_ca: Option<&std::path::Path>,
    ) -> Result<ServerTls, TlsError> {
        let read = |field, path: &std::path::Path, marker: &str, what| {
            let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
                field,
                path: path.display().to_string(),
                source,
            })?;
            let text = String::from_utf8_lossy(&bytes);
            if !(text.contains("-----BEGIN ") && text.contains(marker)) {
                return Err(TlsError::NotPem {
                    field,
                    path: path.display().to_string(),
                    what,
                });
            }
            Ok(bytes)
        };
        let mut tls = ServerTls::new(
            read("--tls-cert", cert, "CERTIFICATE-----", "certificate")?,
            read("--tls-key", key, "PRIVATE KEY-----", "private key")?,
        );
        if let Some(ca) = client_ca {
            tls = tls.require_client_ca(read(
                "--tls-client-ca",
                ca,
                "CERTIFICATE-----",
                "certificate",
            )?);
        }
        Ok(tls)
    }

    fn config(&self) -> tonic::transport::ServerTlsConfig {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let config =
            ServerTlsConfig::new().identity(Identity::from_pem(&self.cert_pem, &self.key_pem));
        match &self.client_ca_pem {
            Some(ca) => config.client_ca_root(Certificate::from_pem(ca)),
            None => config,
        }
    }
}

/// Serves `master` on `listener` until `shutdown` completes, then finishes
/// the requests in flight and returns. Evicts idle state in the background
/// meanwhile. Plain TCP: see [`run_with_tls`].
pub async fn run(
    listener: TcpListener,
    master: Master,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    run_with_tls(listener, master, None, shutdown).await
}

/// [`run`], over TLS when `tls` is given.
pub async fn run_with_tls(
    listener: TcpListener,
    master: Master,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let evictor = {
        let master = master.clone();
        let every = master.shared.idle_after / 3;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let evicted = master.evict_idle();
                if evicted > 0 {
                    tracing::debug!(evicted, "evicted idle (account, op) state");
                }
            }
        })
    };
    let max = master.shared.options.max_message_bytes;
    let service = MasterServer::new(MasterService::new(master))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = &tls {
        server = match server.tls_config(tls.config()) {
            Ok(server) => server,
            Err(e) => {
                evictor.abort();
                return Err(e.into());
            }
        };
    }
    // gRPC health checking (grpc.health.v1), so standard probes and tools
    // can ask whether `damper.v1.Master` serves; NOT_SERVING once shutdown
    // begins.
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<MasterServer<MasterService>>().await;
    let shutdown = async move {
        shutdown.await;
        health
            .set_not_serving::<MasterServer<MasterService>>()
            .await;
    };
    let reflection = match tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(damper_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
    {
        Ok(reflection) => reflection,
        Err(e) => {
            evictor.abort();
            return Err(ServeError::Reflection(e.to_string()));
        }
    };
    let result = server
        .add_service(health_service)
        .add_service(reflection)
        .add_service(service)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await;
    evictor.abort();
    result.map_err(ServeError::from)
}

pub mod http;
pub mod reload;
mod snapshot;
pub use snapshot::SnapshotError;

#[cfg(test)]
mod tests;
