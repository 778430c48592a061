//! The agent's state machine: the admission decision on every operation,
//! the counters that rollups drain, and the factors the master sends back.
//!
//! Shared by every thread of a node (`&self` everywhere). For an (account,
//! op) already seen, [`AgentState::check`] takes no lock, allocates nothing
//! and makes no system call: one lock-free lookup in the agent's own
//! table (an index word, then the pair's slot: three cache lines in all),
//! a few atomic loads,
//! and one atomic add; while a factor is in force, also a random draw and
//! one more atomic add to the pair's admission credit (see `admission`).
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
//! agent.drain(now, |account, op, delta| drained.push((account.to_owned(), op.to_owned(), delta)));
//! assert_eq!(drained[0].2.attempted, 1002);
//! assert_eq!(drained[0].2.admitted, 1001);
//!
//! // Past the factor's validity the agent fails open.
//! let later = now + Duration::from_secs(7);
//! assert!(agent.check(later, "acme", "messages", 1, &mut rng).is_admit());
//! ```
//!
//! # Layout
//! - this file: the settings, the decision, and [`AgentState`]'s `check`
//!   and `apply`.
//! - `admission`: the low-noise rule that turns a factor into decisions,
//!   with a per-pair credit.
//! - `batch`: deciding operations in bulk, and applying a reply's
//!   verdicts, under one [`Hold`] on the table.
//! - `counter`: a pair's counter word, its cost and its operations in one
//!   atomic.
//! - `entry`: one (account, op)'s state, and finding or making it.
//! - `table`: the table of pairs: slots in chunks that never move, an
//!   open-addressing index, and the grace a forgotten pair's slot waits
//!   out before it is made over.
//! - `drain`: taking counts for a rollup, and putting back what failed.
//! - `forget`: forgetting idle pairs.
//! - `frozen`: a sparse paced pair's admission probability, set for a
//!   whole sub-window from its credit.
//! - `guard`: when the local guard's window proves the account over its
//!   limit: confidently, by the window's counting noise.
//! - `hint`: sparse hints, what one agent can say of a flood of costly
//!   operations too thin on it to call ([`HINT_ALPHA`]).
//! - `join`: telling a pair's new master, when the ring moved it between
//!   rollups, what its previous master had ([`AgentState::offer_joins`]).
//! - `owned`: fields one writer owns, replaced without a locked swap.
//! - `pace`: the credit of a deeply suppressed pair following the share
//!   of the rate its agent told the master, at each sub-window's end.
//! - `peek`: what a pair stands at, counting nothing ([`AgentState::peek`]).
//! - `publisher`: publisher lanes, a credit per (pair, publisher) so that
//!   publishers sharing an account each keep their share
//!   ([`AgentState::check_from`]).
//! - `poll`: answering a master's poll of a pair whose sparse traffic
//!   several agents hinted at ([`AgentState::answer_polls`],
//!   [`AgentState::report_polls`]).
//! - `surge`: finding the pairs whose demand jumped or fell since they
//!   were last reported ([`AgentState::scan_surges`] at each sub-window's
//!   end, [`AgentState::peek_surges`] halfway through it), against their
//!   own noise and the cost of one of their operations.
//! - `young`: pairs `check` just created, measured from their birth and
//!   reported as soon as they prove a surge ([`AgentState::peek_young`]).

mod admission;
mod batch;
mod counter;
mod drain;
mod entry;
mod forget;
mod frozen;
mod guard;
mod hint;
mod join;
mod owned;
mod pace;
mod peek;
mod poll;
mod publisher;
mod surge;
mod table;
mod young;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{
    AtomicBool,
    Ordering::{Acquire, Relaxed, Release},
    fence,
};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rand::Rng;

use crate::Pair;
use crate::time::Nanos;
use crate::wire::{Factor, Reply};
pub use admission::{ADMISSION_BAND, admits, credit_bound};
pub use batch::Hold;
use counter::{RETIRED, tally};
use entry::{Entry, OpInfo, factor_bits, factor_of, limit_bits};
pub use frozen::FROZEN_MAX_OPS;
pub use guard::{CostBounds, effective_cost};
pub use hint::{
    DEEP_FALL_ALPHA, DEEP_FALL_FROM, FALL_ALPHA, HINT_ALPHA, HINT_MIN_OPS, HINT_NEW_SHARE,
    SPARSE_OPS, beyond_chance, fall_alpha, normal_tail, poisson_tail,
};
pub use pace::{DENSE_MARGIN, DENSE_PACE_FROM, PACE_FROM, PACE_SLACK, paced_under};
pub use peek::Standing;
pub use poll::{MAX_POLLED, POLL_SPAN};
pub use publisher::{MAX_PUBLISHER_LANES, PUBLISHER_BAND, Publisher, publisher_bound};
pub use surge::{
    FOLLOW_UP_JUMP, FOLLOW_UP_RISE, NOISE_SIGMAS, SurgeRule, SurgeRuleError, counting_noise,
};
use table::{PairTable, Pinned};
pub use young::{MAX_YOUNG, YOUNG_PEEK_AFTER, YOUNG_SPAN};

/// Settings of the agent state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Whether the local guard applies an op's default limit, learned from
    /// any master's reply, to pairs no master has answered for yet: an
    /// account never seen is guarded from its first check rather than from
    /// its first reply. Part of fast onset (see `docs/design.md`); off, the
    /// local guard waits for the pair's own reply. Default on.
    pub fast_onset: bool,
    /// Whether a factor is applied by the low-noise rule (a per-pair
    /// credit that keeps the admitted cost within a few operations of
    /// `1 − factor` of the attempted, see `docs/design.md`) rather than by
    /// an independent draw per operation, whose error grows with the
    /// square root of the count. Off only to measure the difference.
    /// Default on.
    pub low_noise: bool,
    /// Whether a pair its master suppresses by a fifth or more is paced: it
    /// admits `1 − factor` of the rate this agent told the master rather
    /// than of what it attempts now, so that the agents together admit the
    /// limit itself rather than the limit times the chance swing of the
    /// account's demand from one round to the next (see `docs/design.md`).
    /// Needs `low_noise`, and fast onset's scans, which do it. Off only to
    /// measure the difference. Default on.
    pub pace: bool,
    /// Whether a paced pair that expects at most
    /// [`FROZEN_MAX_OPS`] operations a sub-window decides them all by one
    /// probability, set at the sub-window's start from its credit, rather
    /// than moving its probability after each: a costly account spread
    /// thin over many agents then swings by a third less from one 6-s
    /// bucket to the next (see `frozen` and `docs/design.md`). Needs
    /// `pace`. Off only to measure the difference. Default on.
    pub freeze_sparse: bool,
    /// Whether a pair `check` creates is young: measured on its own from
    /// the moment the round sees it and reported as soon as it proves a
    /// surge, between the sub-window grid's scans (see
    /// [`AgentState::peek_young`]), so a new account that arrives as a
    /// deluge is suppressed within some tens of milliseconds. Needs
    /// `fast_onset`, and a round with a surge rule, which peeks. Off in
    /// the simulator when its traffic steps are too coarse to measure 20
    /// ms. Default on.
    pub young_peeks: bool,
    /// Whether the scans offer *sparse hints*: a pair of sparse costly
    /// operations that saw more of them over its last few hundred
    /// milliseconds than chance allows, too few for one agent to call a
    /// surge, is hinted to its master, which polls every agent for the pair
    /// when several hint at once (see `hint` and `docs/design.md`). Needs
    /// `fast_onset`. Off only to measure the difference. Default on.
    pub sparse_hints: bool,
    /// How many publisher lanes [`AgentState::check_from`] keeps, rounded
    /// up to a power of two: one credit per (pair, publisher) in use under
    /// a factor, so that publishers sharing an account each keep their
    /// share (see `publisher` and `docs/design.md`). A fixed table of 16
    /// bytes a lane, made at the first `check_from`; lanes past it are
    /// shared, which costs fairness, not the pair's precision. Default
    /// 4 096 (64 KiB).
    pub publisher_lanes: usize,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            rollup_interval: crate::DEFAULT_ROLLUP_INTERVAL,
            local_window: Duration::from_millis(250),
            forget_after: Duration::from_secs(60),
            fast_onset: true,
            low_noise: true,
            pace: true,
            freeze_sparse: true,
            young_peeks: true,
            sparse_hints: true,
            publisher_lanes: 4096,
        }
    }
}

/// The outcome of [`AgentState::check`]. A rejection is a value, not an
/// error: the node turns it into an error for the publisher.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Decision {
    /// Go ahead; what comes with it says whether a limit in shadow would
    /// have refused it.
    Admit(Admitted),
    /// Refuse the operation now, at publish time.
    Reject(Rejection),
}

impl Decision {
    /// Whether the operation was admitted (a would-be rejection under a
    /// limit in shadow included).
    pub fn is_admit(&self) -> bool {
        matches!(self, Decision::Admit(_))
    }

    /// The refusal this decision is or, under a limit in shadow, would
    /// have been: what to log or count when trying a limit out.
    pub fn would_reject(&self) -> Option<&Rejection> {
        match self {
            Decision::Admit(admitted) => admitted.would_reject.as_ref(),
            Decision::Reject(rejection) => Some(rejection),
        }
    }

    /// The refusal an admitted decision would have been under a limit in
    /// shadow; `None` for a plain admit and for a real refusal.
    pub fn shadow_refusal(&self) -> Option<&Rejection> {
        match self {
            Decision::Admit(admitted) => admitted.would_reject.as_ref(),
            Decision::Reject(_) => None,
        }
    }

    /// An admitted decision's [`Admitted::utilisation`]; `None` for a
    /// refusal.
    pub fn utilisation(&self) -> Option<f32> {
        match self {
            Decision::Admit(admitted) => admitted.utilisation,
            Decision::Reject(_) => None,
        }
    }
}

/// What comes with an admitted operation.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Admitted {
    /// Set when the account's limit is in shadow (the master's `[shadow]`
    /// table) and the operation would have been refused: what the refusal
    /// would have said. The operation is admitted and counted as admitted;
    /// the limit is being tried out.
    pub would_reject: Option<Rejection>,
    /// The account's demand over its limit as its master estimates it,
    /// over every node (1.0: at the limit), when the master said it: for
    /// accounts at or above `policy.near_limit_share` of their limit (0.8
    /// by default) and those suppressed. `None` below that share, with no
    /// limit, or when no master's verdict is in force. For warning a
    /// customer before anything is refused.
    pub utilisation: Option<f32>,
}

impl Admitted {
    /// Admitted, with nothing to say.
    pub const PLAIN: Admitted = Admitted {
        would_reject: None,
        utilisation: None,
    };
}

/// Why an operation was refused, and when to try again.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Rejection {
    /// The suppression factor that was applied.
    pub factor: f64,
    /// Whose factor it was.
    pub source: RejectSource,
    /// The account-wide limit in force, in cost per second.
    pub limit: f64,
    /// The demand the factor was computed from, in cost per second: the
    /// account's attempted rate over every agent as its master estimates
    /// it (for the local guard, this agent's own rate), so a refusal can
    /// say how far over its limit the account is. Under the default
    /// `demand` policy the factor is `1 − limit / demand`, and this is
    /// `limit / (1 − factor)`: at most 1 000 × the limit.
    pub demand: f64,
    /// A hint for the publisher: the soonest the factor can change.
    pub retry_after: Duration,
}

/// The demand a factor of `factor` under `limit` was computed from, cost
/// per second: `limit / (1 − factor)` (the `demand` policy's factor is
/// `1 − limit / demand`); a factor of 1 (everything refused) reads as
/// 1 000 × the limit, finite for any JSON. 0 when the factor is 0.
pub fn implied_demand(limit: f64, factor: f64) -> f64 {
    if factor > 0.0 {
        limit / (1.0 - factor.min(0.999))
    } else {
        0.0
    }
}

/// Which part of the limiter rejected an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
    /// What one of the pair's operations costs, as the scans tell it (the
    /// costliest seen, when costs differ); 0 when they do not know yet, or
    /// when it is 1.
    /// Told to the master, whose rounds are then counts of operations of
    /// this cost: their chance scatter is known from the first round.
    pub op_cost: u32,
    /// How many operations `attempted` counts. With `op_cost`, the
    /// costliest, it bounds the sum of their costs' squares, which is
    /// what a round of mixed costs scatters by: `attempted × (op_cost + 1)
    /// − ops × op_cost` (each cost `c` between 1 and `op_cost` has
    /// `c² ≤ c·(op_cost + 1) − op_cost`). 0 when not known: an agent
    /// that predates it.
    pub ops: u32,
}

/// One (account, op)'s counts taken by a drain, on their way to a master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// Account id.
    pub account: String,
    /// Operation: shared by every pair of the op a drain takes (the agent's
    /// interned name), so a drain copies no op name per pair.
    pub op: Arc<str>,
    /// The counts.
    pub delta: Delta,
    /// Where the pair was in the agent's table (its position plus one; 0
    /// for unknown): the reply's verdict looks there first.
    pub at: u32,
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

/// The agent's state: see the module docs.
pub struct AgentState {
    config: AgentConfig,
    /// Every (account, op) this agent tracks.
    pairs: PairTable,
    /// Per op name: one shared allocation for the keys, and the op's
    /// default limit once learned. Taken only when a new (account, op) is
    /// inserted or a reply teaches limits, never on a known key's check.
    ops: Mutex<HashMap<Box<str>, OpInfo>>,
    /// Drains and undrains take this, so there is one drainer at a time.
    /// Never taken by `check`.
    drain_lock: Mutex<()>,
    /// Ops whose factors are held past their validity (fail-static), and for
    /// how long. Read when a factor is applied, never by `check`.
    fail_static: Vec<(Box<str>, Duration)>,
    /// Pairs `check` created within the last sub-window, for
    /// [`peek_young`](Self::peek_young). Taken when a pair is created,
    /// never on a known key's check.
    young: Mutex<Vec<young::YoungPair>>,
    /// Pairs a master polled, being reported (see `poll`). Taken by the
    /// round only, never by `check`.
    polled: Mutex<Vec<poll::Polled>>,
    /// Told when the first young pair arrives (see
    /// [`with_young_hook`](Self::with_young_hook)).
    young_hook: Option<Box<dyn Fn() + Send + Sync>>,
    /// Publisher lanes, made at the first [`check_from`](Self::check_from):
    /// a node that never names publishers pays nothing for them.
    lanes: OnceLock<publisher::Lanes>,
    /// Whether anything was counted since the last sub-window's close
    /// began (see [`count`](Self::count)): a peek halfway through a
    /// sub-window into which nothing was counted would find every pair's
    /// cost 0 and change nothing, so it skips the pass. `check` reads it
    /// (a line every check shares, written only by the first check after
    /// each close); a check racing the close may be left to the next close,
    /// as one racing a pass's read of its pair always was.
    counted: AtomicBool,
}

impl std::fmt::Debug for AgentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentState")
            .field("config", &self.config)
            .field("pairs", &self.pairs.len())
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
            pairs: PairTable::new(),
            ops: Mutex::default(),
            drain_lock: Mutex::new(()),
            fail_static: Vec::new(),
            young: Mutex::default(),
            polled: Mutex::default(),
            young_hook: None,
            lanes: OnceLock::new(),
            counted: AtomicBool::new(false),
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

    /// The settings.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Decides one operation of `cost` by `account` on `op` at `now`, and
    /// counts it.
    ///
    /// Rejects a share of the pair's attempted cost equal to the larger of
    /// the master's factor (while it is valid; expired factors count as 0,
    /// so a lost master fails open) and the local guard's, operation by
    /// operation by the low-noise rule of [`admits`]: the admitted cost
    /// follows `1 − factor` of the attempted to within
    /// [`credit_bound`] of one operation's cost, with no publisher or
    /// periodic pattern favoured. Edge cases, by design: a `cost` of
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
        self.check_by(now, account, op, cost, rng, None)
    }

    /// [`check`](Self::check) for an operation that `publisher` sent. On a
    /// pair several publishers share (connections publishing to one
    /// account), each keeps its share of what the pair admits, within
    /// [`publisher_bound`] of one operation's cost, however their
    /// operations interleave: a costly publisher beside cheap ones, or
    /// publishers taking turns, are neither favoured nor starved. The
    /// pair's admitted cost is what `check` would admit. Costs a lookup in
    /// a fixed table of lanes and one more atomic add, only while a factor
    /// is in force (see `docs/design.md`, "Publisher lanes").
    #[inline]
    pub fn check_from<R: Rng + ?Sized>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        cost: u64,
        publisher: Publisher,
        rng: &mut R,
    ) -> Decision {
        let sender = self.sender(account, op, publisher);
        self.check_by(now, account, op, cost, rng, Some(sender))
    }

    /// `publisher` of (`account`, `op`), and this agent's lanes (made at
    /// the first call) to find its own in.
    fn sender<'a>(
        &'a self,
        account: &'a str,
        op: &'a str,
        publisher: Publisher,
    ) -> publisher::Sender<'a> {
        let lanes = self
            .lanes
            .get_or_init(|| publisher::Lanes::new(self.config.publisher_lanes));
        publisher::Sender::new(lanes, account, op, publisher)
    }

    #[inline(always)]
    fn check_by<R: Rng + ?Sized>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        cost: u64,
        rng: &mut R,
        publisher: publisher::ByPublisher<'_>,
    ) -> Decision {
        if cost == 0 {
            return Decision::Admit(Admitted::PLAIN);
        }
        let pinned = self.pairs.pin();
        let entry = match pinned.find(account, op) {
            Some(entry) => entry,
            None => match self.new_entry(now, account, op, cost, &pinned) {
                Some(entry) => entry,
                None => return Decision::Admit(Admitted::PLAIN),
            },
        };
        let decision = entry.decide(now, cost, rng, &self.config, publisher);
        self.count(
            now,
            account,
            op,
            entry,
            decision.is_admit(),
            tally(cost, 1),
            &pinned,
        );
        decision
    }

    /// The entry [`check`](Self::check) makes for a pair not found (a
    /// young pair, see `young`); `None` when its names cannot be reported.
    /// Cold: a known key's `check` should carry as little of it as it can.
    #[cold]
    fn new_entry<'g>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        cost: u64,
        pinned: &'g Pinned<'_>,
    ) -> Option<&'g entry::Entry> {
        if !reportable(account) || !reportable(op) {
            return None;
        }
        let entry = self.traffic_entry(now, account, op, pinned)?;
        entry.seed_quantum(cost);
        Some(entry)
    }

    /// Adds `tally` (a counter word's cost and operations, see `counter`)
    /// to an entry's admitted or rejected counter: one atomic add, unless
    /// the entry was forgotten under the caller's feet.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn count(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        entry: &Entry,
        admitted: bool,
        tally: u64,
        pinned: &Pinned<'_>,
    ) {
        if entry.counter(admitted).fetch_add(tally, Relaxed) & RETIRED != 0 {
            self.recount(now, account, op, entry, admitted, tally, pinned);
        }
        if !self.counted.load(Relaxed) {
            self.counted.store(true, Relaxed);
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
        tally: u64,
        pinned: &'g Pinned<'_>,
    ) {
        loop {
            // Pairs with the forget's swap: having read the retired counter,
            // this thread sees the entry's removal from the table as well.
            fence(Acquire);
            let Some(current) = self.entry(now, account, op, pinned) else {
                // The table cannot hold the pair again (full): the cost
                // goes uncounted, as a new pair's would.
                return;
            };
            if std::ptr::eq(current, stale) {
                // Still in the map, so never retired: a live counter whose
                // operations carried that far (no drains), and the add
                // stands where it is.
                return;
            }
            if current.counter(admitted).fetch_add(tally, Relaxed) & RETIRED == 0 {
                return;
            }
            stale = current;
        }
    }

    /// Decides `n` operations of `cost` each by `account` on `op`, all at
    /// `now`, and counts them: exactly as `n` calls of [`check`](Self::check)
    /// at the same instant would, one after another, with the counters
    /// touched once for each stretch decided under the same state (one,
    /// unless the local guard's window closes early within the batch).
    /// Returns how many were admitted. For replaying
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
        self.hold()
            .check_batch_at(now, account, op, cost, n, rng, &mut 0)
    }

    /// Applies a factor from the master's reply: reject that share of the
    /// attempted cost until `now + valid_for`, under an account-wide `limit` in
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
        self.apply_factor(
            now,
            Pair::new(account, op),
            &Factor {
                factor,
                limit,
                valid_for,
                shadow: false,
                utilisation: 0.0,
            },
        );
    }

    /// [`apply`](Self::apply) for a verdict as a reply carries it, a limit
    /// in shadow included: its refusals become admitted decisions that say
    /// they would have been refused.
    pub fn apply_factor(&self, now: Nanos, pair: Pair<'_>, verdict: &Factor) {
        self.hold().apply_factor_at(now, pair, verdict, &mut 0);
    }

    /// Stores a master's `verdict` in `entry`, a pair of `op`.
    fn set_verdict(&self, now: Nanos, op: &str, entry: &Entry, verdict: &Factor) {
        let limit = if verdict.limit.is_finite() && verdict.limit > 0.0 {
            verdict.limit
        } else {
            0.0
        };
        let hold = self
            .fail_static
            .iter()
            .find(|(o, _)| &**o == op)
            .map_or(Duration::ZERO, |(_, hold)| *hold);
        entry
            .limit
            .store(entry::limit_bits(limit, verdict.shadow), Relaxed);
        let utilisation = if verdict.utilisation.is_finite() {
            verdict.utilisation.max(0.0)
        } else {
            0.0
        };
        entry.utilisation.store(utilisation.to_bits(), Relaxed);
        entry
            .master_factor
            .store(factor_bits(verdict.factor), Relaxed);
        entry.unpace(verdict.factor);
        // Release: a check that sees this expiry sees the values above.
        // (Replies are applied by one task, so stores do not interleave.)
        entry
            .master_expires
            .store((now + verdict.valid_for + hold).as_nanos(), Release);
    }

    /// Applies a master's reply at `now`: every verdict it lists, and
    /// factor 0 under their op's limit for the pairs of `asked` (those the
    /// request named) that its op's default covers (see
    /// [`Reply::expand`]).
    pub fn apply_reply<'a>(
        &self,
        now: Nanos,
        reply: &Reply,
        asked: impl IntoIterator<Item = Pair<'a>>,
    ) {
        self.apply_reply_but(now, reply, asked, |_, _| false);
    }

    /// [`apply_reply`](Self::apply_reply), but for the verdicts `skip`
    /// says, given the pair and the factor the reply gives it (listed, or
    /// its op's default): those are not applied (a push that may be newer
    /// than the reply said otherwise: `round::fence`).
    pub fn apply_reply_but<'a>(
        &self,
        now: Nanos,
        reply: &Reply,
        asked: impl IntoIterator<Item = Pair<'a>>,
        skip: impl Fn(Pair<'_>, &Factor) -> bool,
    ) {
        self.apply_reply_at(now, reply, asked.into_iter().map(|pair| (pair, 0)), skip);
    }

    /// [`apply_reply_but`](Self::apply_reply_but), each asked pair with
    /// where it was in the table (its position plus one, as the drain gave
    /// it: [`Pending::at`]; 0 for unknown), under one hold for the whole
    /// reply: a pair still there is found by its slot alone, not by the
    /// hash of its name and the index (an agent of many pairs asks about
    /// every one of them each round).
    pub fn apply_reply_at<'a>(
        &self,
        now: Nanos,
        reply: &Reply,
        asked: impl IntoIterator<Item = (Pair<'a>, u32)>,
        skip: impl Fn(Pair<'_>, &Factor) -> bool,
    ) {
        self.learn_op_limits(reply);
        let mut unmentioned: Vec<&str> = Vec::new();
        let asked = asked.into_iter().inspect(|(pair, _)| {
            if unmentioned.last() != Some(&pair.op) && !reply.ops.iter().any(|o| o.op == pair.op) {
                unmentioned.push(pair.op);
            }
        });
        let hold = self.hold();
        reply.expand(asked, |pair, f, mut at| {
            if !skip(pair, &f) {
                hold.apply_factor_at(now, pair, &f, &mut at);
            }
        });
        if !unmentioned.is_empty() {
            // The master answered for these ops and had nothing to say:
            // they have no default limit.
            let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
            for op in unmentioned {
                if let Some(known) = ops.get_mut(op) {
                    known.default_limit = Some(0.0);
                }
            }
        }
    }

    /// Applies a master's push (see [`crate::master::Push`]): each listed
    /// verdict, to the pairs this agent holds only (a pair it never saw,
    /// or forgot, stays as it is: it has nothing to hold). Learns nothing
    /// else from it. Returns how many pairs it applied to.
    pub fn apply_pushed(&self, now: Nanos, reply: &Reply) -> usize {
        let pinned = self.pairs.pin();
        let mut applied = 0;
        for op in &reply.ops {
            for listed in &op.listed {
                if let Some(entry) = pinned.find(&listed.account, &op.op) {
                    self.set_verdict(now, &op.op, entry, &listed.factor);
                    applied += 1;
                }
            }
        }
        applied
    }

    /// Forgets that `pair` was reported early (the report failed): its
    /// baseline is its last rollup's again.
    pub fn unmark_surge(&self, pair: Pair<'_>) {
        let pinned = self.pairs.pin();
        if let Some(entry) = pinned.find(pair.account, pair.op) {
            entry.surge_round.store(0, Relaxed);
        }
    }

    /// Learns each op's default limit from a reply (its `unlisted` verdict;
    /// none: the op has no default), for the local guard of pairs not yet
    /// answered for. Ops the reply does not mention keep what is known.
    pub fn learn_op_limits(&self, reply: &Reply) {
        self.learn_ops(reply, false);
    }

    /// Learns what a reply to a query naming nothing (a hello, a probe)
    /// says: each op's default limit, and the accounts whose limit is not
    /// it (replacing what an earlier such reply said of the op), so the
    /// local guard of a new pair applies its own account's limit.
    pub fn learn_hello(&self, reply: &Reply) {
        self.learn_ops(reply, true);
    }

    /// Both of the above under one lock; an op already known costs no
    /// allocation (every rollup's reply comes through here).
    fn learn_ops(&self, reply: &Reply, overrides: bool) {
        if reply.ops.is_empty() {
            return;
        }
        let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        for op in &reply.ops {
            if !reportable(&op.op) {
                continue;
            }
            if !ops.contains_key(op.op.as_str()) {
                ops.insert(op.op.as_str().into(), OpInfo::new(&op.op, &self.pairs));
            }
            let known = ops.get_mut(op.op.as_str()).expect("just made sure");
            let limit = op.unlisted.map_or(0.0, |u| u.limit);
            known.default_limit = Some(if limit.is_finite() && limit > 0.0 {
                limit
            } else {
                0.0
            });
            known.default_shadow = op.unlisted.is_some_and(|u| u.shadow);
            if overrides {
                known.overrides = op
                    .overrides
                    .iter()
                    .filter(|o| o.limit.is_finite() && o.limit > 0.0)
                    .map(|o| (o.account.as_str().into(), limit_bits(o.limit, o.shadow)))
                    .collect();
            }
        }
    }

    /// The default limit of `op` as learned from replies: `None` until a
    /// reply mentions the op, `Some(0.0)` when it has none.
    pub fn op_limit(&self, op: &str) -> Option<f64> {
        let ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        ops.get(op).and_then(|known| known.default_limit)
    }

    /// Counts the positive factors that lapsed (their validity, and any
    /// fail-static hold, passed with no fresher factor from the master) since
    /// the last call: each is an (account, op) that now fails open. Off the
    /// hot path: the rollup task calls it once per interval to log and count
    /// fail-open events.
    pub fn expired_factors(&self, now: Nanos) -> usize {
        let pinned = self.pairs.pin();
        let mut lapsed = 0;
        for entry in pinned.pairs().map(|pair| pair.entry()) {
            let expires = entry.master_expires.load(Acquire);
            if expires != 0
                && now.as_nanos() >= expires
                && entry.master_suppressed()
                && entry.expiry_counted.swap(expires as u32, Relaxed) != expires as u32
            {
                lapsed += 1;
            }
        }
        lapsed
    }

    /// The master's factor in force for an (account, op) at `now` (0 when
    /// expired), or `None` if the pair was never seen.
    pub fn factor(&self, now: Nanos, account: &str, op: &str) -> Option<f64> {
        self.hold().factor_at(now, account, op, &mut 0)
    }

    /// Number of (account, op) pairs tracked.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether no (account, op) is tracked.
    pub fn is_empty(&self) -> bool {
        self.pairs.len() == 0
    }
}

#[cfg(test)]
mod tests;
