//! The agent's state machine: the admission decision on every operation,
//! the counters that rollups drain, and the factors the master sends back.
//!
//! Shared by every thread of a node (`&self` everywhere). For an (account,
//! op) already seen, [`AgentState::check`] takes no lock, allocates nothing
//! and makes no system call: one lock-free hash lookup, a few atomic loads,
//! a random draw only when a factor is in force, and one atomic add.
//!
//! Memory is bounded by the pairs in use: [`AgentState::forget_idle`]
//! removes those idle for [`AgentConfig::forget_after`] that hold nothing
//! (no counts to report, no factor in force), without losing a check that
//! races the removal.
//!
//! ```
//! use std::time::Duration;
//! use damper_core::agent::{AgentConfig, AgentState, Decision};
//! use damper_core::time::Nanos;
//! use rand::SeedableRng;
//!
//! let agent = AgentState::new(AgentConfig::default());
//! let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
//! let now = Nanos::from_secs(1_700_000_000);
//!
//! // Nothing known yet: admitted, and counted for the next rollup.
//! assert!(agent.check(now, "acme", "messages", 1001, &mut rng).is_admit());
//!
//! // The master says: reject everything for 6 s.
//! agent.apply(now, "acme", "messages", 1.0, 1000.0, Duration::from_secs(6));
//! assert!(!agent.check(now, "acme", "messages", 1, &mut rng).is_admit());
//!
//! // The rollup drains what was counted, as deltas.
//! let mut drained = Vec::new();
//! agent.drain(|account, op, delta| drained.push((account.to_owned(), op.to_owned(), delta)));
//! assert_eq!(drained[0].2.attempted, 1002);
//! assert_eq!(drained[0].2.admitted, 1001);
//!
//! // Past the factor's validity the agent fails open.
//! let later = now + Duration::from_secs(7);
//! assert!(agent.check(later, "acme", "messages", 1, &mut rng).is_admit());
//! ```

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
    fence,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use compact_str::CompactString;
use foldhash::fast::RandomState;
use rand::Rng;

use crate::ring::Ring;
use crate::time::{Nanos, duration_nanos};
use crate::wire::Reply;

/// Settings of the agent state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// How often rollups go to the masters. A rejection's retry hint: no
    /// fresher factor can arrive sooner. Default 2 s.
    pub rollup_interval: Duration,
    /// How long the local guard measures this agent's own demand before it
    /// recomputes its factor. Short, so a single-node flood is caught within
    /// a fraction of a second; long enough to hold many operations. Default
    /// 250 ms.
    pub local_window: Duration,
    /// How long an (account, op) stays in the agent's state with nothing
    /// counted, nothing left to report and no factor in force before
    /// [`AgentState::forget_idle`] removes it. Such an entry behaves exactly
    /// like one never created, so forgetting it changes no decision; it only
    /// bounds memory on a node that sees many accounts come and go. Long
    /// enough that an account active now and then keeps its entry rather
    /// than paying an insert each time. Default 60 s.
    pub forget_after: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            rollup_interval: crate::DEFAULT_ROLLUP_INTERVAL,
            local_window: Duration::from_millis(250),
            forget_after: Duration::from_secs(60),
        }
    }
}

/// The outcome of [`AgentState::check`]. A rejection is a value, not an
/// error: the node turns it into an error for the publisher.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decision {
    /// Go ahead.
    Admit,
    /// Refuse the operation now, at publish time.
    Reject(Rejection),
}

impl Decision {
    /// Whether the operation was admitted.
    pub fn is_admit(&self) -> bool {
        matches!(self, Decision::Admit)
    }
}

/// Why an operation was refused, and when to try again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rejection {
    /// The suppression factor that was applied.
    pub factor: f64,
    /// Whose factor it was.
    pub source: RejectSource,
    /// The account-wide limit in force, in cost per second.
    pub limit: f64,
    /// A hint for the publisher: the soonest the factor can change.
    pub retry_after: Duration,
}

/// Which part of the limiter rejected an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectSource {
    /// The factor the account's master computed from the demand on every agent.
    Master,
    /// The local guard: this agent's own demand alone exceeds the
    /// account-wide limit.
    LocalGuard,
}

/// What a rollup takes from one (account, op): the counts since the last
/// drain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// Cost attempted: admitted plus what rejected operations would have cost.
    pub attempted: u64,
    /// Cost admitted.
    pub admitted: u64,
    /// When the counts include some put back by [`AgentState::undrain`]
    /// (a rollup that failed), the start of the oldest interval they cover;
    /// otherwise `None`, and they cover the interval since the last drain.
    pub since: Option<Nanos>,
}

/// One (account, op)'s counts taken by a drain, on their way to a master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// Account id.
    pub account: String,
    /// Operation.
    pub op: String,
    /// The counts.
    pub delta: Delta,
}

/// A drain's counts, routed to masters by [`AgentState::drain_by_owner`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routed {
    /// Per master address, its accounts' counts, sorted by op then account.
    pub by_master: BTreeMap<String, Vec<Pending>>,
    /// Counts for which the ring had no master (an empty ring).
    pub unroutable: Vec<Pending>,
}

/// How long after each interval's cut an agent sends its rollup: a fixed
/// share of the first fifth of the interval, by agent id, so masters see
/// agents spread out rather than all at once.
pub fn send_spread(agent_id: &str, interval: Duration) -> Duration {
    let window = (interval / 5).as_millis() as u64;
    if window == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(agent_seed(agent_id) % window)
}

/// A number derived from an agent id, the same in every build (FNV-1a):
/// scatters agents' send times and probe jitter.
pub fn agent_seed(agent_id: &str) -> u64 {
    agent_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A factor of 1.0 as a threshold: a draw of 32 random bits is always below it.
const ONE: u64 = 1 << 32;

/// What [`AgentState::forget_idle`] swaps into a forgotten entry's counters,
/// after taking it out of the map. A check that found the entry just before
/// holds a reference to it still; its counter add returns the old value,
/// and the top bit set there says the add came too late to be taken by the
/// forget (a single atomic's operations are totally ordered), so the check
/// counts the cost again in the pair's current entry. A live counter never
/// gets that bit in practice (2^63 cost); if one did, the check finds its
/// entry still in the map and keeps the count where it is.
const RETIRED: u64 = 1 << 63;

fn threshold(factor: f64) -> u64 {
    if factor.is_nan() {
        return 0;
    }
    (factor.clamp(0.0, 1.0) * ONE as f64).round() as u64
}

/// An (account, op) key, owned. Laid out so that confirming a lookup's
/// match touches no memory outside the entry for the common case: the op
/// is interned (every key of an op shares one allocation, which stays in
/// cache) and the account is stored inline up to 24 bytes.
#[derive(PartialEq, Eq)]
struct Key {
    op: Arc<str>,
    account: CompactString,
}

/// An (account, op) key, borrowed: hashes exactly as [`Key`] does, so the
/// hot path looks up without building an owned key.
#[derive(Hash)]
struct KeyRef<'a> {
    op: &'a str,
    account: &'a str,
}

impl papaya::Equivalent<Key> for KeyRef<'_> {
    #[inline]
    fn equivalent(&self, key: &Key) -> bool {
        key.account.as_str() == self.account && *key.op == *self.op
    }
}

/// The state of one (account, op). Counters only grow; drains remember how
/// far they have read, so a check never races a drain into losing or
/// double-counting cost.
///
/// Layout: a check reads and writes only the first eight fields, which
/// fill exactly one 64-byte cache line (`align(64)`); the fields only drains
/// touch come after. A check's counter add is a locked instruction that
/// waits for its line, so every extra line a check touches is paid in full.
#[repr(C, align(64))]
struct Entry {
    /// The master's factor as a threshold out of 2^32.
    master_threshold: AtomicU64,
    /// When the master's factor expires (nanoseconds since the epoch).
    master_expires: AtomicU64,
    /// The account-wide limit from the master (`f64` bits; 0.0 = unknown).
    limit: AtomicU64,
    /// Start of the local guard's current measurement.
    local_start: AtomicU64,
    /// The local guard's factor as a threshold out of 2^32.
    local_threshold: AtomicU64,
    /// Total cost admitted since the entry was created.
    admitted: AtomicU64,
    /// Total cost rejected since the entry was created.
    rejected: AtomicU64,
    /// Total attempted cost when the current local measurement began.
    local_base: AtomicU64,
    /// How much of `admitted` the drains have taken (drainer only).
    drained_admitted: AtomicU64,
    /// How much of `rejected` the drains have taken (drainer only).
    drained_rejected: AtomicU64,
    /// Start of the oldest interval of counts put back by `undrain`, or 0.
    carried_since: AtomicU64,
    /// Whether the last drain took anything: the next one reports a zero
    /// once, so the master knows this agent went quiet.
    active_last_drain: AtomicBool,
    /// The `master_expires` whose expiry [`AgentState::expired_factors`]
    /// already counted, so each lapse is counted once.
    expiry_counted: AtomicU64,
    /// Drains in a row that took nothing from this entry (drainer only):
    /// how long it has been idle, for [`AgentState::forget_idle`].
    idle_drains: AtomicU32,
}

impl Entry {
    fn new(now: Nanos) -> Entry {
        Entry {
            admitted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            drained_admitted: AtomicU64::new(0),
            drained_rejected: AtomicU64::new(0),
            carried_since: AtomicU64::new(0),
            active_last_drain: AtomicBool::new(false),
            master_threshold: AtomicU64::new(0),
            master_expires: AtomicU64::new(0),
            limit: AtomicU64::new(0),
            local_threshold: AtomicU64::new(0),
            local_start: AtomicU64::new(now.as_nanos()),
            local_base: AtomicU64::new(0),
            expiry_counted: AtomicU64::new(0),
            idle_drains: AtomicU32::new(0),
        }
    }

    /// Total attempted cost. Wraps like the counters it adds, so the
    /// difference of two readings (`wrapping_sub`) stays exact.
    fn attempted_total(&self) -> u64 {
        self.admitted
            .load(Relaxed)
            .wrapping_add(self.rejected.load(Relaxed))
    }

    /// The master's and the local guard's thresholds in force at `now`, and
    /// the limit.
    #[inline]
    fn thresholds(&self, now: u64, config: &AgentConfig) -> (u64, u64, f64) {
        // Acquire pairs with `apply`'s Release: a valid expiry comes with the
        // threshold stored before it, never an older one.
        let (master, limit) = if now < self.master_expires.load(Acquire) {
            (
                self.master_threshold.load(Relaxed),
                f64::from_bits(self.limit.load(Relaxed)),
            )
        } else {
            // Expired or never set: fail open, the local guard included,
            // since the limit it enforces is only known while the master is.
            (0, 0.0)
        };
        let local = if limit > 0.0 {
            self.local_guard(now, limit, config)
        } else {
            0
        };
        (master, local, limit)
    }

    /// The decision for one operation; the caller counts it.
    #[inline]
    fn decide<R: Rng + ?Sized>(&self, now: Nanos, rng: &mut R, config: &AgentConfig) -> Decision {
        let (master, local, limit) = self.thresholds(now.as_nanos(), config);
        let threshold = master.max(local);
        if threshold != 0 && u64::from(rng.next_u32()) < threshold {
            let (source, retry_after) = if local > master {
                (RejectSource::LocalGuard, config.local_window)
            } else {
                (RejectSource::Master, config.rollup_interval)
            };
            Decision::Reject(Rejection {
                factor: threshold as f64 / ONE as f64,
                source,
                limit,
                retry_after,
            })
        } else {
            Decision::Admit
        }
    }

    /// How many of `n` operations at the same instant are admitted: the
    /// same as `n` calls of `decide`, each with its own random draw.
    fn decide_batch<R: Rng + ?Sized>(
        &self,
        now: Nanos,
        n: u64,
        rng: &mut R,
        config: &AgentConfig,
    ) -> u64 {
        let (master, local, _) = self.thresholds(now.as_nanos(), config);
        let threshold = master.max(local);
        if threshold == 0 {
            n
        } else {
            (0..n)
                .filter(|_| u64::from(rng.next_u32()) >= threshold)
                .count() as u64
        }
    }

    /// The counter a decision adds to.
    #[inline]
    fn counter(&self, admitted: bool) -> &AtomicU64 {
        if admitted {
            &self.admitted
        } else {
            &self.rejected
        }
    }

    /// Whether [`AgentState::forget_idle`] may remove this entry at `now`:
    /// idle for `idle_drains` drains, its zero report sent, nothing carried
    /// or counted since the last drain, and no factor in force (fail-static
    /// hold included). Then it is the same as no entry at all.
    fn forgettable(&self, now: Nanos, idle_drains: u32) -> bool {
        let admitted = self.admitted.load(Relaxed);
        let rejected = self.rejected.load(Relaxed);
        self.idle_drains.load(Relaxed) >= idle_drains
            && !self.active_last_drain.load(Relaxed)
            && self.carried_since.load(Relaxed) == 0
            && now.as_nanos() >= self.master_expires.load(Acquire)
            && admitted == self.drained_admitted.load(Relaxed)
            && rejected == self.drained_rejected.load(Relaxed)
            && (admitted | rejected) & RETIRED == 0
    }

    /// The local guard's threshold. Once per `local_window` one caller wins
    /// the right to measure this agent's demand over the window that ended
    /// and to set the factor that brings that demand down to the limit.
    #[inline]
    fn local_guard(&self, now: u64, limit: f64, config: &AgentConfig) -> u64 {
        let start = self.local_start.load(Relaxed);
        let elapsed = now.saturating_sub(start);
        // `elapsed == 0`: nothing to measure over (a zero local window, or a
        // clock that did not move), and no rate to divide by.
        if elapsed == 0
            || elapsed < duration_nanos(config.local_window)
            || self
                .local_start
                .compare_exchange(start, now, Relaxed, Relaxed)
                .is_err()
        {
            return self.local_threshold.load(Relaxed);
        }
        let total = self.attempted_total();
        let base = self.local_base.swap(total, Relaxed);
        let rate = total.wrapping_sub(base) as f64 / (elapsed as f64 / 1e9);
        let t = if rate > limit {
            threshold(1.0 - limit / rate)
        } else {
            0
        };
        self.local_threshold.store(t, Relaxed);
        t
    }
}

/// The agent's state: see the module docs.
pub struct AgentState {
    config: AgentConfig,
    entries: papaya::HashMap<Key, Entry, RandomState>,
    /// One shared allocation per op name, for the keys. Taken only when a
    /// new (account, op) is inserted, never on a known key's check.
    ops: Mutex<HashMap<Box<str>, Arc<str>>>,
    /// Drains and undrains take this, so there is one drainer at a time.
    /// Never taken by `check`.
    drain_lock: Mutex<()>,
    /// Ops whose factors are held past their validity (fail-static), and for
    /// how long. Read when a factor is applied, never by `check`.
    fail_static: Vec<(Box<str>, Duration)>,
}

impl std::fmt::Debug for AgentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentState")
            .field("config", &self.config)
            .field("entries", &self.entries.len())
            .finish()
    }
}

/// Whether a name can be counted and reported. The master refuses empty
/// names and names over [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, so the agent never sends
/// them: such checks are admitted and not counted.
fn reportable(name: &str) -> bool {
    crate::wire::validate_name("name", name).is_ok()
}

impl AgentState {
    /// An empty state.
    pub fn new(config: AgentConfig) -> AgentState {
        AgentState {
            config,
            // Blocking resizes: the thread inserting a new key copies the
            // whole table when it grows. Incremental resizing (papaya's
            // default) leaves the copy to later writes, and when none come,
            // every lookup probes the old table before the new one: measured
            // at 775 ns against 239 ns per check over 100 000 keys.
            entries: papaya::HashMap::builder()
                .hasher(RandomState::default())
                .resize_mode(papaya::ResizeMode::Blocking)
                .build(),
            ops: Mutex::default(),
            drain_lock: Mutex::new(()),
            fail_static: Vec::new(),
        }
    }

    /// Makes `op` fail static for `hold`: when its master cannot be reached,
    /// the last factor it sent stays in force for `hold` past its validity
    /// instead of lapsing to 0 (fail open). For ops where letting a deluge
    /// through is worse than suppressing a little too long; bound `hold`,
    /// since a stale factor no longer follows the demand.
    pub fn with_fail_static(mut self, op: &str, hold: Duration) -> AgentState {
        self.fail_static.retain(|(o, _)| &**o != op);
        self.fail_static.push((op.into(), hold));
        self
    }

    /// The entry of an (account, op), created if it is new.
    fn entry<'g>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        guard: &'g impl papaya::Guard,
    ) -> &'g Entry {
        match self.entries.get(&KeyRef { op, account }, guard) {
            Some(entry) => entry,
            None => self.entries.get_or_insert_with(
                self.new_key(account, op),
                || Entry::new(now),
                guard,
            ),
        }
    }

    /// The owned key for a new (account, op), with the op interned.
    fn new_key(&self, account: &str, op: &str) -> Key {
        let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let op = match ops.get(op) {
            Some(op) => op.clone(),
            None => ops.entry(op.into()).or_insert_with(|| op.into()).clone(),
        };
        Key {
            op,
            account: CompactString::from(account),
        }
    }

    /// The settings.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Decides one operation of `cost` by `account` on `op` at `now`, and
    /// counts it.
    ///
    /// Rejects with probability equal to the larger of the master's factor
    /// (while it is valid; expired factors count as 0, so a lost master
    /// fails open) and the local guard's. Edge cases, by design: a `cost` of
    /// 0 is admitted and not counted (it uses nothing); an empty account or
    /// op, or one longer than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes, is admitted and not
    /// counted (it cannot be reported, so it cannot be limited).
    #[inline]
    pub fn check<R: Rng + ?Sized>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        cost: u64,
        rng: &mut R,
    ) -> Decision {
        if cost == 0 {
            return Decision::Admit;
        }
        let guard = self.entries.guard();
        let entry = match self.entries.get(&KeyRef { op, account }, &guard) {
            Some(entry) => entry,
            None => {
                if !reportable(account) || !reportable(op) {
                    return Decision::Admit;
                }
                self.entry(now, account, op, &guard)
            }
        };
        let decision = entry.decide(now, rng, &self.config);
        self.count(now, account, op, entry, decision.is_admit(), cost, &guard);
        decision
    }

    /// Adds `cost` to an entry's admitted or rejected counter: one atomic
    /// add, unless the entry was forgotten under the caller's feet.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn count(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        entry: &Entry,
        admitted: bool,
        cost: u64,
        guard: &impl papaya::Guard,
    ) {
        if entry.counter(admitted).fetch_add(cost, Relaxed) & RETIRED != 0 {
            self.recount(now, account, op, entry, admitted, cost, guard);
        }
    }

    /// The rare path of [`count`](Self::count): the add landed in an entry
    /// that [`forget_idle`](Self::forget_idle) had already taken out of the
    /// map and emptied, so nobody will drain it. Counts the cost in the
    /// pair's current entry instead (created if need be).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn recount<'g>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        mut stale: &'g Entry,
        admitted: bool,
        cost: u64,
        guard: &'g impl papaya::Guard,
    ) {
        loop {
            // Pairs with the forget's swap: having read the retired counter,
            // this thread sees the entry's removal from the map as well.
            fence(Acquire);
            let current = self.entry(now, account, op, guard);
            if std::ptr::eq(current, stale) {
                // Still in the map, so never retired: a live counter past
                // 2^63, and the add stands where it is.
                return;
            }
            if current.counter(admitted).fetch_add(cost, Relaxed) & RETIRED == 0 {
                return;
            }
            stale = current;
        }
    }

    /// Decides `n` operations of `cost` each by `account` on `op`, all at
    /// `now`, and counts them: exactly as `n` calls of [`check`](Self::check)
    /// at the same instant would (each draws its own random number), with the
    /// counters touched once. Returns how many were admitted. For replaying
    /// traffic in bulk (the simulator); the same edge cases as `check`.
    pub fn check_batch<R: Rng + ?Sized>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        cost: u64,
        n: u64,
        rng: &mut R,
    ) -> u64 {
        if cost == 0 || n == 0 || !reportable(account) || !reportable(op) {
            return n;
        }
        let guard = self.entries.guard();
        let entry = self.entry(now, account, op, &guard);
        let admitted = entry.decide_batch(now, n, rng, &self.config);
        for (yes, count) in [(true, admitted), (false, n - admitted)] {
            if count != 0 {
                self.count(
                    now,
                    account,
                    op,
                    entry,
                    yes,
                    cost.wrapping_mul(count),
                    &guard,
                );
            }
        }
        admitted
    }

    /// Applies a factor from the master's reply: reject with probability
    /// `factor` until `now + valid_for`, under an account-wide `limit` in
    /// cost per second (which the local guard uses). Out-of-range values are
    /// clamped; a NaN factor counts as 0.
    pub fn apply(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        factor: f64,
        limit: f64,
        valid_for: Duration,
    ) {
        if !reportable(account) || !reportable(op) {
            return;
        }
        let guard = self.entries.guard();
        let entry = self.entry(now, account, op, &guard);
        let limit = if limit.is_finite() && limit > 0.0 {
            limit
        } else {
            0.0
        };
        let hold = self
            .fail_static
            .iter()
            .find(|(o, _)| &**o == op)
            .map_or(Duration::ZERO, |(_, hold)| *hold);
        entry.limit.store(limit.to_bits(), Relaxed);
        entry.master_threshold.store(threshold(factor), Relaxed);
        // Release: a check that sees this expiry sees the values above.
        // (Replies are applied by one task, so stores do not interleave.)
        entry
            .master_expires
            .store((now + valid_for + hold).as_nanos(), Release);
    }

    /// Applies a master's reply at `now`: every verdict it lists, and
    /// factor 0 under their op's limit for the pairs of `asked` (`(op,
    /// account)`: those the request named) that its op's default covers
    /// (see [`Reply::expand`]).
    pub fn apply_reply<'a>(
        &self,
        now: Nanos,
        reply: &Reply,
        asked: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) {
        reply.expand(asked, |op, account, f| {
            self.apply(now, account, op, f.factor, f.limit, f.valid_for);
        });
    }

    /// Counts the positive factors that lapsed (their validity, and any
    /// fail-static hold, passed with no fresher factor from the master) since
    /// the last call: each is an (account, op) that now fails open. Off the
    /// hot path: the rollup task calls it once per interval to log and count
    /// fail-open events.
    pub fn expired_factors(&self, now: Nanos) -> usize {
        let guard = self.entries.guard();
        let mut lapsed = 0;
        for (_, entry) in self.entries.iter(&guard) {
            let expires = entry.master_expires.load(Acquire);
            if expires != 0
                && now.as_nanos() >= expires
                && entry.master_threshold.load(Relaxed) != 0
                && entry.expiry_counted.swap(expires, Relaxed) != expires
            {
                lapsed += 1;
            }
        }
        lapsed
    }

    /// The master's factor in force for an (account, op) at `now` (0 when
    /// expired), or `None` if the pair was never seen.
    pub fn factor(&self, now: Nanos, account: &str, op: &str) -> Option<f64> {
        let guard = self.entries.guard();
        let entry = self.entries.get(&KeyRef { op, account }, &guard)?;
        Some(if now.as_nanos() < entry.master_expires.load(Acquire) {
            entry.master_threshold.load(Relaxed) as f64 / ONE as f64
        } else {
            0.0
        })
    }

    /// Takes the counts of every (account, op) with activity since the last
    /// drain and hands them to `visit` as deltas; an (account, op) that had
    /// activity last time and none now is visited once with a zero delta,
    /// so its master sees it go quiet. Returns how many were visited.
    ///
    /// One drain runs at a time (others wait). Concurrent checks are never
    /// lost or counted twice: they land in this drain or the next.
    pub fn drain(&self, mut visit: impl FnMut(&str, &str, Delta)) -> usize {
        let _one_drainer = self.drain_lock.lock().unwrap_or_else(|e| e.into_inner());
        let guard = self.entries.guard();
        let mut visited = 0;
        for (key, entry) in self.entries.iter(&guard) {
            let admitted = entry.admitted.load(Relaxed);
            let rejected = entry.rejected.load(Relaxed);
            let d_admitted = admitted.wrapping_sub(entry.drained_admitted.swap(admitted, Relaxed));
            let d_rejected = rejected.wrapping_sub(entry.drained_rejected.swap(rejected, Relaxed));
            let active = d_admitted != 0 || d_rejected != 0;
            let idle = entry.idle_drains.load(Relaxed);
            entry
                .idle_drains
                .store(if active { 0 } else { idle.saturating_add(1) }, Relaxed);
            let was_active = entry.active_last_drain.swap(active, Relaxed);
            if active || was_active {
                let since = entry.carried_since.swap(0, Relaxed);
                visit(
                    key.account.as_str(),
                    &key.op,
                    Delta {
                        attempted: d_admitted.saturating_add(d_rejected),
                        admitted: d_admitted,
                        since: (since != 0).then(|| Nanos::from_nanos(since)),
                    },
                );
                visited += 1;
            }
        }
        visited
    }

    /// Puts back a delta that a failed rollup could not deliver, so the next
    /// drain includes it. `since` is the start of the interval it covered.
    pub fn undrain(&self, account: &str, op: &str, delta: Delta, since: Nanos) {
        let _one_drainer = self.drain_lock.lock().unwrap_or_else(|e| e.into_inner());
        if !reportable(account) || !reportable(op) {
            return;
        }
        let guard = self.entries.guard();
        // Created again if forgotten meanwhile: the counts must not be lost.
        let entry = self.entry(since, account, op, &guard);
        if delta.attempted == 0 {
            // A zero report ("this agent went quiet") that did not arrive:
            // send it again next time. It carries no counts, so no start.
            entry.active_last_drain.store(true, Relaxed);
            return;
        }
        let rejected = delta.attempted.saturating_sub(delta.admitted);
        entry.drained_admitted.fetch_sub(delta.admitted, Relaxed);
        entry.drained_rejected.fetch_sub(rejected, Relaxed);
        let since = delta.since.unwrap_or(since).as_nanos().max(1);
        let _ = entry.carried_since.fetch_update(Relaxed, Relaxed, |old| {
            Some(if old == 0 { since } else { old.min(since) })
        });
    }

    /// Drains (see [`drain`](Self::drain)) and routes each (account, op)'s
    /// counts to the account's master on `ring`, sorted by op then account
    /// for each master, so replays are deterministic. Counts the ring has no
    /// master for come back in [`Routed::unroutable`].
    pub fn drain_by_owner(&self, ring: &Ring) -> Routed {
        let mut routed = Routed::default();
        self.drain(|account, op, delta| {
            let pending = Pending {
                account: account.to_owned(),
                op: op.to_owned(),
                delta,
            };
            match ring.owner(account) {
                Some(master) => routed
                    .by_master
                    .entry(master.to_owned())
                    .or_default()
                    .push(pending),
                None => routed.unroutable.push(pending),
            }
        });
        for pending in routed.by_master.values_mut() {
            pending.sort_unstable_by(|a, b| (&a.op, &a.account).cmp(&(&b.op, &b.account)));
        }
        routed
    }

    /// Puts back counts that a rollup covering `[start, end)` could not
    /// deliver, so the next drain sends them again, unless the interval they
    /// cover began more than `max_carry` before `end`: such counts fall
    /// outside any window a master keeps, and are dropped. Returns the
    /// attempted cost dropped (0 when carried over).
    pub fn carry_over(
        &self,
        pending: Pending,
        start: Nanos,
        end: Nanos,
        max_carry: Duration,
    ) -> u64 {
        let since = pending.delta.since.unwrap_or(start);
        if end.since(since) > max_carry {
            return pending.delta.attempted;
        }
        self.undrain(&pending.account, &pending.op, pending.delta, start);
        0
    }

    /// Removes every (account, op) idle for [`AgentConfig::forget_after`]
    /// (counted in drains of `rollup_interval`) that holds nothing: no counts
    /// to report, no factor in force. Returns how many were removed. Off the
    /// hot path: the rollup task calls it once per interval, after sending.
    ///
    /// A check racing the removal loses nothing: its cost lands either in
    /// the removed entry before it is emptied (and moves to the pair's new
    /// entry) or after (and the check counts it there itself, see
    /// [`RETIRED`]). Checks for a forgotten pair simply create a new entry.
    pub fn forget_idle(&self, now: Nanos) -> usize {
        let _one_drainer = self.drain_lock.lock().unwrap_or_else(|e| e.into_inner());
        let idle_drains = self
            .config
            .forget_after
            .as_nanos()
            .div_ceil(self.config.rollup_interval.as_nanos().max(1))
            .clamp(1, u128::from(u32::MAX)) as u32;
        let guard = self.entries.guard();
        let mut forgotten = 0;
        for (key, entry) in self.entries.iter(&guard) {
            if !entry.forgettable(now, idle_drains) {
                continue;
            }
            // Out of the map first, so checks from now on make a new entry;
            // then empty it, so late adds to this one are seen as such.
            let removed = self
                .entries
                .remove_if(key, |_, e| std::ptr::eq(e, entry), &guard);
            if !matches!(removed, Ok(Some(_))) {
                continue;
            }
            let admitted = entry.admitted.swap(RETIRED, AcqRel);
            let rejected = entry.rejected.swap(RETIRED, AcqRel);
            let late_admitted = admitted.wrapping_sub(entry.drained_admitted.load(Relaxed));
            let late_rejected = rejected.wrapping_sub(entry.drained_rejected.load(Relaxed));
            if late_admitted != 0 || late_rejected != 0 {
                // Checks that found the entry just before it left the map:
                // their cost goes to the pair's new entry, for the next drain.
                let fresh = self.entry(now, key.account.as_str(), &key.op, &guard);
                fresh.admitted.fetch_add(late_admitted, Relaxed);
                fresh.rejected.fetch_add(late_rejected, Relaxed);
            }
            forgotten += 1;
        }
        forgotten
    }

    /// Number of (account, op) pairs tracked.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no (account, op) is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        KeyRef {
            op: &self.op,
            account: self.account.as_str(),
        }
        .hash(state)
    }
}

#[cfg(test)]
mod tests;
