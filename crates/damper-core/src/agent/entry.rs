//! One (account, op)'s state, [`Entry`], laid out for `check`, and how
//! the agent finds or makes it in its table of pairs (see `table`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU8, AtomicU16, AtomicU32, AtomicU64,
    Ordering::{Acquire, Relaxed},
};

use rand::Rng;

use super::counter::{self, RETIRED, cost_of, ops_between};
use super::frozen::{word_factor, word_frozen};
use super::guard::{self, CostBounds};
use super::owned::Owned;
use super::publisher::{self, ByPublisher, Sender, Share};
use super::table::{PairTable, Pinned};
use super::{
    Admitted, AgentConfig, AgentState, Decision, RejectSource, Rejection, admission, implied_demand,
};
use crate::time::{Nanos, duration_nanos};

/// How much above an op's default limit the local guard lets a pair go
/// before any master has answered for it (its own limit may be higher).
pub(super) const UNCONFIRMED_ROOM: f64 = 2.0;

/// A factor as stored: `f32` bits, clamped to `[0, 1]`, NaN as 0.
pub(super) fn factor_bits(factor: f64) -> u32 {
    if factor.is_nan() {
        return 0;
    }
    (factor.clamp(0.0, 1.0) as f32).to_bits()
}

/// A stored factor.
#[inline]
pub(super) fn factor_of(bits: u32) -> f64 {
    f64::from(f32::from_bits(bits))
}

/// A limit as an entry stores it: `f32` bits (24 bits of precision are
/// plenty for a limit; an exempt account's `f64::MAX` becomes `f32::MAX`,
/// still finite), negated when the limit is in shadow, so the flag costs
/// no room in the check's cache line. 0.0 is no limit known, never in
/// shadow.
pub(super) fn limit_bits(limit: f64, shadow: bool) -> u32 {
    let limit = (limit.min(f64::from(f32::MAX))) as f32;
    if shadow && limit > 0.0 {
        (-limit).to_bits()
    } else {
        limit.to_bits()
    }
}

/// A stored limit and whether it is in shadow.
#[inline]
pub(super) fn limit_of(bits: u32) -> (f64, bool) {
    let stored = f32::from_bits(bits);
    (f64::from(stored.abs()), stored < 0.0)
}

/// Whether a stored limit is an exempt account's: no limit at all.
pub(super) fn is_unlimited(limit: f64) -> bool {
    limit >= f64::from(f32::MAX)
}

/// What the agent knows of an op: its interned name, its default limit
/// once a reply has said it, and the accounts whose limit is not it.
#[derive(Debug)]
pub(super) struct OpInfo {
    /// Shared by every pair of the op.
    pub(super) name: Arc<str>,
    /// Its number in the table of pairs; `None` past
    /// [`MAX_OPS`](super::table::MAX_OPS): its pairs are not tracked.
    pub(super) number: Option<u16>,
    /// The limit of the op's accounts that no override names, cost per
    /// second, as a master last said (`unlisted_limit`); `Some(0.0)` when
    /// the op has none; `None` until a reply mentions the op.
    pub(super) default_limit: Option<f64>,
    /// Whether that limit is in shadow.
    pub(super) default_shadow: bool,
    /// The accounts (each with every account under it) whose limit is
    /// not the default, as stored ([`limit_bits`]), from the last hello's
    /// reply: the local guard of a new pair applies its account's.
    pub(super) overrides: HashMap<Box<str>, u32>,
}

impl OpInfo {
    pub(super) fn new(op: &str, pairs: &PairTable) -> OpInfo {
        let name: Arc<str> = op.into();
        OpInfo {
            number: pairs.number_op(name.clone()),
            name,
            default_limit: None,
            default_shadow: false,
            overrides: HashMap::new(),
        }
    }

    /// The limit a new pair of `account` starts with, as stored: its
    /// most specific override (`org/team`, then `org`), else the default.
    pub(super) fn limit_for(&self, account: &str) -> u32 {
        let default = || limit_bits(self.default_limit.unwrap_or(0.0), self.default_shadow);
        if self.overrides.is_empty() {
            return default();
        }
        let mut path = account;
        loop {
            if let Some(bits) = self.overrides.get(path) {
                return *bits;
            }
            match path.rfind('/') {
                Some(slash) => path = &path[..slash],
                None => return default(),
            }
        }
    }
}

/// What [`Entry::in_force`] finds.
#[derive(Clone, Copy, Debug)]
pub(super) struct InForce {
    /// The master's factor, as the local guard's is stored (`f32` bits; 0
    /// once expired).
    pub(super) master: u32,
    /// The master's word it came in, with any frozen admission
    /// probability (see [`frozen`](super::frozen)); 0 once expired.
    pub(super) word: u32,
    /// The local guard's factor, as stored.
    pub(super) local: u32,
    /// The limit the local guard enforces, cost per second (0: none).
    pub(super) limit: f64,
    /// Whether the limit is in shadow.
    pub(super) shadow: bool,
    /// Demand over limit, as the master said it while its factor holds.
    pub(super) utilisation: Option<f32>,
}

impl InForce {
    /// The frozen admission probability the master's word holds, when
    /// `bits`, the factor deciding, is the master's (see
    /// [`frozen`](super::frozen)).
    #[inline]
    fn frozen(&self, bits: u32) -> Option<f64> {
        word_frozen(self.word).filter(|_| bits == self.master)
    }
}

// Two cache lines: the check's, and the drains' and scans'.
const _: () = assert!(std::mem::size_of::<Entry>() == 128);
const _: () = assert!(std::mem::offset_of!(Entry, drained_admitted) == 64);

/// The state of one (account, op). Counters only grow; drains remember how
/// far they have read, so a check never races a drain into losing or
/// double-counting cost.
///
/// Layout: a check reads and writes only the first ten fields, which
/// fill one 64-byte cache line (`align(64)`); the fields only drains and
/// scans touch come after. A check's counter add is a locked instruction that
/// waits for its line, so every extra line a check touches is paid in full.
#[repr(C, align(64))]
#[derive(Default)]
pub(super) struct Entry {
    /// The master's factor (`f32` bits: 24 bits of precision are plenty
    /// for a share, and two factors fit where one `u64` did); while a
    /// sparse paced pair is frozen, with its admission probability in the
    /// bits a factor in `[0.5, 1)` does not need, which the factor's every
    /// store clears (see [`frozen`](super::frozen)).
    pub(super) master_factor: AtomicU32,
    /// The local guard's factor (`f32` bits).
    pub(super) local_factor: AtomicU32,
    /// When the master's factor expires (nanoseconds since the epoch).
    pub(super) master_expires: AtomicU64,
    /// The account-wide limit from the master ([`limit_bits`]: `f32`
    /// bits, negative when in shadow; 0.0 = unknown).
    pub(super) limit: AtomicU32,
    /// The account's demand over its limit as the master last said it
    /// (`f32` bits), for pairs at or above the near share of their limit;
    /// 0.0 when it said nothing. Valid while the master's factor is.
    pub(super) utilisation: AtomicU32,
    /// Start of the local guard's current measurement, in its bits above
    /// [`YOUTH`]; in those, how many more windows a new pair's checks show
    /// the scans their costs (see [`Entry::seed_quantum`]): the check
    /// reads this word anyway, so a pair past its youth pays one mask.
    pub(super) local_start: AtomicU64,
    /// The admission credit: cost this pair should have admitted under the
    /// factors in force minus what it did, in fixed point (see
    /// [`admission`]). Moves only while a factor is in
    /// force.
    pub(super) credit: AtomicI64,
    /// The cost admitted since the entry was created, and the
    /// operations (a counter word: see [`counter`]).
    pub(super) admitted: AtomicU64,
    /// The cost rejected since the entry was created, and the operations.
    pub(super) rejected: AtomicU64,
    /// The attempted cost's field ([`Entry::attempted_total`]) when the
    /// current local measurement began.
    pub(super) local_base: AtomicU32,
    /// The attempted operations ([`Entry::attempted_ops`]) when the
    /// current local measurement began: its window's effective cost (see
    /// [`guard::effective_cost`]). Read and written only when a window
    /// closes, by the check that closes it; here, it fills the check's
    /// line, so the drains' fields begin the next.
    pub(super) local_ops_base: AtomicU32,
    /// The admitted cost's field when the drains last took it (drainer
    /// only).
    pub(super) drained_admitted: AtomicU32,
    /// The rejected cost's field when the drains last took it (drainer
    /// only).
    pub(super) drained_rejected: AtomicU32,
    /// The attempted operations ([`Entry::attempted_ops`]) when the drains
    /// last took them (drainer only).
    pub(super) drained_ops: AtomicU32,
    /// The attempted operations at the last surge scan (as
    /// `surge_total` is their cost): a sub-window's count of operations,
    /// which an early report weighs its rise by
    /// ([`counted_ops`](super::surge::counted_ops); scanner only).
    pub(super) surge_ops: AtomicU32,
    /// Start of the oldest interval of counts put back by `undrain`, or 0.
    pub(super) carried_since: AtomicU64,
    /// The `master_expires` whose expiry [`AgentState::expired_factors`]
    /// already counted, so each lapse is counted once: its low 32 bits
    /// (two expiries 4.3 s apart to the nanosecond never meet).
    pub(super) expiry_counted: AtomicU32,
    /// A moving mean of the sub-window rates (`f32` bits; 0: none yet),
    /// over about a second: what a suppressed pair's fall is also judged
    /// on, with the noise of a second's count rather than a sub-window's
    /// (scanner only).
    pub(super) slow_rate: AtomicU32,
    /// The attempted total at the last surge scan, its low 32 bits: a
    /// sub-window's cost is the wrapping difference, right below 2^32 cost
    /// per sub-window (scanner only).
    pub(super) surge_total: AtomicU32,
    /// The attempted rate the last drain reported, cost per second (`f32`
    /// bits): what the master holds for this agent after a round, the
    /// baseline a surge is measured against (drainer only).
    pub(super) reported_rate: AtomicU32,
    /// The attempted rate the last early report said (`f32` bits), the
    /// baseline while the master's surge estimate lasts; its sign bit,
    /// whether that report was of a chance lump (see
    /// [`CHANCE_OPS`](super::surge::CHANCE_OPS); scanner only).
    pub(super) surge_rate: AtomicU32,
    /// The rate over the last sub-window scanned (`f32` bits) (scanner
    /// only).
    pub(super) window_rate: AtomicU32,
    /// The higher of the rates over the two sub-windows before the last
    /// scan's end (`f32` bits): the previous value of the series whose
    /// noise is measured (scanner only).
    pub(super) held_rate: AtomicU32,
    /// How much the rate (the higher of two sub-windows' rates) moves from
    /// one sub-window to the next when nothing happens: a moving mean of
    /// the squared step (`f32` bits), so
    /// only a change that stands out from the pair's own noise is a surge
    /// (scanner only).
    pub(super) surge_noise: AtomicU32,
    /// Drains in a row that took nothing from this entry (drainer only):
    /// how long it has been idle, for [`AgentState::forget_idle`].
    /// Saturates, far above any `forget_after`.
    pub(super) idle_drains: AtomicU16,
    /// The grid round (index of its end, modulo 2^16, never 0) the last
    /// early report was sent in; 0 for none (scanner only).
    pub(super) surge_round: AtomicU16,
    /// The cost of one operation as far as the scans can tell, packed by
    /// [`Quantum`](super::surge::Quantum): the greatest common divisor of
    /// the costs of sub-windows that followed an empty one, and how many
    /// there were. An account whose operations all cost 51 moves in steps
    /// of 51, so a sub-window's count of operations, and its chance
    /// noise, are known (scanner only).
    pub(super) quantum: AtomicU16,
    /// Whether the last drain took anything: the next one reports a zero
    /// once, so the master knows this agent went quiet.
    pub(super) active_last_drain: AtomicBool,
    /// What the scans remember between passes ([`CONFIRM_ASKED`],
    /// [`PACED`]), one byte (scanner only).
    pub(super) scan_flags: AtomicU8,
}

/// The low bits of [`Entry::local_start`] that count the windows left of
/// a new pair's youth (see [`Entry::seed_quantum`]); the window's start
/// is the rest, to 16 ns.
const YOUTH: u64 = 0xf;
/// The windows of a new pair's youth: fifteen, about four seconds of
/// 250 ms with traffic. At eight (two seconds), an agent of an account of
/// 28.5 publishes of 51 and 1 425 of 1 a second over 20 agents missed
/// every 51 of its youth one time in seventeen, and counted its later
/// rises in operations of 1 (`mixed-costs` at 0.95×, seed 34 of 90
/// refused 76 cost); at fifteen, one time in 200.
const YOUTH_WINDOWS: u64 = 15;
const _: () = assert!(YOUTH_WINDOWS <= YOUTH);

/// The local guard's window start held in `word` ([`Entry::local_start`]).
#[inline(always)]
pub(super) fn window_start(word: u64) -> u64 {
    word & !YOUTH
}

/// Whether `word` ([`Entry::local_start`]) says its pair is in its youth.
#[inline(always)]
pub(super) fn young(word: u64) -> bool {
    word & YOUTH != 0
}

/// The first windows of a pair's youth, during which a cheap-first pair's
/// rises are judged as counts of 1 (see `Entry::rise_cost`): two seconds,
/// as before the youth was lengthened. Judged so for the whole of it, an
/// account of mixed costs at 2× its limit was held a second or more later
/// in five seeds of twelve (`reaction_s` 3 → 4 median, worst 7 → 11).
const RISE_YOUTH_WINDOWS: u64 = 8;
const _: () = assert!(RISE_YOUTH_WINDOWS <= YOUTH_WINDOWS);

/// Whether `word` ([`Entry::local_start`]) says its pair is in the first
/// [`RISE_YOUTH_WINDOWS`] of its youth.
#[inline]
pub(super) fn young_for_rises(word: u64) -> bool {
    word & YOUTH > YOUTH_WINDOWS - RISE_YOUTH_WINDOWS
}

/// Whether a scan already asked the master for this pair's verdict
/// because the local guard refused under the op's default limit before
/// any master answered ([`Entry::guarded_unconfirmed`]).
pub(super) const CONFIRM_ASKED: u8 = 1;
/// Whether the last scan paced the pair (see `pace`): the first sub-window
/// under a factor is not, as the factor held for only part of it.
pub(super) const PACED: u8 = 2;
/// Whether a young peek reported the pair in the sub-window the next
/// scan closes (see `young`): that sub-window began before the pair, so
/// its rate reads low, and its close judges no fall.
pub(super) const YOUNG_REPORTED: u8 = 4;
/// Whether the pair's last sparse hint still stands: its evidence has not
/// gone since (see `hint`), so the same burst does not hint twice.
pub(super) const HINTED: u8 = 8;
/// The flags' high four bits: how many sub-windows in a row the scans
/// closed empty, up to 15 (see [`Entry::note_empty`]).
const EMPTY_SHIFT: u32 = 4;

impl Entry {
    /// Makes this entry new at `now` (a slot made over for a new pair, no
    /// reader able to reach it); `limit` is the op's default limit when
    /// known (0.0 otherwise; [`limit_bits`]), which the local guard
    /// applies until a master answers for the pair. Every field is named,
    /// so a field added later cannot be left out.
    pub(super) fn reset(&self, now: Nanos, limit: u32) {
        let Entry {
            master_factor,
            local_factor,
            master_expires,
            limit: stored_limit,
            utilisation,
            local_start,
            credit,
            admitted,
            rejected,
            local_base,
            local_ops_base,
            drained_admitted,
            drained_rejected,
            drained_ops,
            surge_ops,
            carried_since,
            expiry_counted,
            slow_rate,
            surge_total,
            reported_rate,
            surge_rate,
            window_rate,
            held_rate,
            surge_noise,
            idle_drains,
            surge_round,
            quantum,
            active_last_drain,
            scan_flags,
        } = self;
        for word in [
            master_factor,
            local_factor,
            utilisation,
            expiry_counted,
            local_base,
            local_ops_base,
            drained_admitted,
            drained_rejected,
            drained_ops,
            surge_ops,
            slow_rate,
            surge_total,
            reported_rate,
            surge_rate,
            window_rate,
            held_rate,
            surge_noise,
        ] {
            word.store(0, Relaxed);
        }
        for word in [master_expires, admitted, rejected, carried_since] {
            word.store(0, Relaxed);
        }
        for half in [idle_drains, surge_round, quantum] {
            half.store(0, Relaxed);
        }
        credit.store(0, Relaxed);
        active_last_drain.store(false, Relaxed);
        scan_flags.store(0, Relaxed);
        stored_limit.store(limit, Relaxed);
        local_start.store(window_start(now.as_nanos()), Relaxed);
    }

    /// Total attempted cost, modulo 2^32. Wraps like the counters' cost
    /// fields it adds, so the difference of two readings (`wrapping_sub`)
    /// stays exact.
    #[inline]
    pub(super) fn attempted_total(&self) -> u32 {
        cost_of(self.admitted.load(Relaxed)).wrapping_add(cost_of(self.rejected.load(Relaxed)))
    }

    /// Total attempted cost and operations, as [`attempted_total`] and
    /// [`attempted_ops`] give them, from one reading of each counter.
    ///
    /// [`attempted_total`]: Self::attempted_total
    /// [`attempted_ops`]: Self::attempted_ops
    pub(super) fn attempted(&self) -> (u32, u32) {
        let (admitted, rejected) = (self.admitted.load(Relaxed), self.rejected.load(Relaxed));
        (
            cost_of(admitted).wrapping_add(cost_of(rejected)),
            counter::attempted_ops(admitted, rejected),
        )
    }

    /// Total attempted operations, modulo 2^30 ([`ops_between`] takes
    /// the difference of two readings).
    ///
    /// [`ops_between`]: super::counter::ops_between
    pub(super) fn attempted_ops(&self) -> u32 {
        counter::attempted_ops(self.admitted.load(Relaxed), self.rejected.load(Relaxed))
    }

    /// What is in force for this pair at `now`: the factors, the limit,
    /// whether it is in shadow, and the utilisation the master said.
    // Always inlined: out of line, as the compiler chose once the frozen
    // word came with the factor, `check_reject` measured 20–40% slower.
    #[inline(always)]
    pub(super) fn in_force(&self, now: u64, cost: u64, config: &AgentConfig) -> InForce {
        // Acquire pairs with `apply`'s Release: a valid expiry comes with the
        // factor stored before it, never an older one.
        let expires = self.master_expires.load(Acquire);
        let (limit, shadow) = limit_of(self.limit.load(Relaxed));
        let (word, limit, utilisation) = if now < expires {
            (
                self.master_factor.load(Relaxed),
                limit,
                self.said_utilisation(),
            )
        } else if expires == 0 {
            // No master has answered for this pair yet: the local guard
            // applies its op's default limit, if the entry was made knowing
            // it (0.0 otherwise: unknown), with room to spare, since the
            // account may have an override above it: a flood is caught,
            // a busy account is not refused before its master speaks.
            (0, limit * UNCONFIRMED_ROOM, None)
        } else {
            // Expired: fail open, the local guard included, since the limit
            // it enforces is only known while the master is.
            (0, 0.0, None)
        };
        let master = word_factor(word);
        let local = if limit > 0.0 {
            self.local_guard(now, limit, master == 0, cost, config)
        } else {
            // No limit known (no answer yet, or an expired one): no guard,
            // but a young pair's checks still show the scans their costs.
            // Before its first answer a new pair's every check came here,
            // and its early reports counted a publish of 51 among cheap
            // ones as 51 operations of 1.
            self.sample_if_young(now, cost, config);
            0
        };
        InForce {
            master,
            word,
            local,
            limit,
            shadow,
            utilisation,
        }
    }

    /// The utilisation the master last said, if any; valid while its
    /// factor is (the caller checks the expiry).
    #[inline]
    pub(super) fn said_utilisation(&self) -> Option<f32> {
        Some(f32::from_bits(self.utilisation.load(Relaxed))).filter(|u| *u > 0.0)
    }

    /// Whether one operation of `cost` is admitted under the factor (as
    /// stored) `bits`, the greater of those `in_force` found: always with
    /// no factor, never under a factor of 1, and otherwise by the
    /// [`admission`] rule (by the frozen probability while the master's
    /// factor applies with one, see [`frozen`](super::frozen); with
    /// `low_noise` off, by an independent draw).
    /// With a `publisher`, its lane leans the draw towards its own share
    /// (see [`publisher`]).
    #[inline]
    fn admits<R: Rng + ?Sized>(
        &self,
        bits: u32,
        in_force: &InForce,
        cost: u64,
        rng: &mut R,
        low_noise: bool,
        publisher: ByPublisher<'_>,
    ) -> bool {
        if bits == 0 {
            return true;
        }
        let keep = 1.0 - factor_of(bits);
        let draw = rng.next_u32();
        if !low_noise {
            return admission::independent(keep, draw);
        }
        let frozen = in_force.frozen(bits);
        keep > 0.0
            && match publisher {
                None => admission::decide(&self.credit, keep, frozen, cost, draw),
                Some(sender) => {
                    let (lane, share) = self.lane(sender, frozen);
                    publisher::decide_as(&self.credit, lane, share, keep, frozen, cost, draw)
                }
            }
    }

    /// The `sender`'s lane on this pair, and what it holds the publisher
    /// to (see [`publisher`]): the pair's share while its
    /// credit follows the share, what the pair offers while it is paced or
    /// `frozen` (as it offers it to an operation of the pair's costliest
    /// cost, see [`Share::Offered`]).
    fn lane<'l>(&self, sender: Sender<'l>, frozen: Option<f64>) -> (&'l AtomicI64, Share) {
        let lane = sender.lane();
        let share = if frozen.is_some() {
            // The same probability for every cost: no reference to read.
            Share::Offered { reference: 0.0 }
        } else if self.scanned(PACED) {
            Share::Offered {
                reference: f64::from(self.op_cost()),
            }
        } else {
            Share::Kept
        };
        (lane, share)
    }

    /// The decision for one operation of `cost`; the caller counts it.
    #[inline]
    pub(super) fn decide<R: Rng + ?Sized>(
        &self,
        now: Nanos,
        cost: u64,
        rng: &mut R,
        config: &AgentConfig,
        publisher: ByPublisher<'_>,
    ) -> Decision {
        let in_force = self.in_force(now.as_nanos(), cost, config);
        let InForce {
            master,
            local,
            limit,
            shadow,
            utilisation,
            ..
        } = in_force;
        let bits = master.max(local);
        if self.admits(bits, &in_force, cost, rng, config.low_noise, publisher) {
            return Decision::Admit(Admitted {
                would_reject: None,
                utilisation,
            });
        }
        let (source, retry_after) = if local > master {
            (RejectSource::LocalGuard, config.local_window)
        } else {
            (RejectSource::Master, config.rollup_interval)
        };
        let factor = factor_of(bits);
        let rejection = Rejection {
            factor,
            source,
            limit,
            demand: implied_demand(limit, factor),
            retry_after,
        };
        if shadow {
            Decision::Admit(Admitted {
                would_reject: Some(rejection),
                utilisation,
            })
        } else {
            Decision::Reject(rejection)
        }
    }

    /// Decides the first of `n` operations of `cost` at the same instant
    /// and those after it that one-by-one checks would decide under what
    /// it found in force: all of them, unless the local guard's window
    /// would close early within the batch (see
    /// [`ops_in_force`](Self::ops_in_force)). Returns how many it decided
    /// and how many of those were admitted, the same as that many calls of
    /// `decide`, one after another. The caller counts them before deciding
    /// the rest, as the checks would have.
    pub(super) fn decide_batch<R: Rng + ?Sized>(
        &self,
        now: Nanos,
        cost: u64,
        n: u64,
        rng: &mut R,
        config: &AgentConfig,
        publisher: ByPublisher<'_>,
    ) -> (u64, u64) {
        let in_force = self.in_force(now.as_nanos(), cost, config);
        let n = self.ops_in_force(now.as_nanos(), &in_force, cost, n, config);
        let InForce {
            master,
            local,
            shadow,
            ..
        } = in_force;
        let bits = master.max(local);
        if bits == 0 {
            return (n, n);
        }
        if shadow {
            // Drawn all the same, so the admission credit moves as it would.
            (0..n).for_each(|_| {
                self.admits(bits, &in_force, cost, rng, config.low_noise, publisher);
            });
            return (n, n);
        }
        let keep = 1.0 - factor_of(bits);
        if !config.low_noise || keep <= 0.0 {
            let admitted = (0..n)
                .filter(|_| self.admits(bits, &in_force, cost, rng, config.low_noise, publisher))
                .count() as u64;
            return (n, admitted);
        }
        // What `admits` decides one by one, the credit held in a register.
        let frozen = in_force.frozen(bits);
        let admitted = match publisher {
            None => admission::decide_many(&self.credit, keep, frozen, cost, n, || rng.next_u32()),
            Some(sender) => {
                let (lane, share) = self.lane(sender, frozen);
                publisher::decide_many_as(&self.credit, lane, share, keep, frozen, cost, n, || {
                    rng.next_u32()
                })
            }
        };
        (n, admitted)
    }

    /// Of `n` operations of `cost` at `now`, the first of which found
    /// `in_force`, how many one-by-one checks decide under it: up to the
    /// one whose check closes the local guard's window early (`local_guard`),
    /// once the ones before it have used the window's allowance and made
    /// it confidently over the limit. Only with
    /// no master factor, a limit for the guard, and a window that the first
    /// check did not just close (the checks after it, at the same instant,
    /// find no time elapsed and close none). A deluge's first batch on
    /// one agent is then admitted up to the allowance, as a node's checks
    /// would be, not whole.
    fn ops_in_force(
        &self,
        now: u64,
        in_force: &InForce,
        cost: u64,
        n: u64,
        config: &AgentConfig,
    ) -> u64 {
        let start = window_start(self.local_start.load(Relaxed));
        if n <= 1 || in_force.master != 0 || in_force.limit <= 0.0 || start >= now {
            return n;
        }
        let (limit, window) = (
            in_force.limit,
            duration_nanos(config.local_window) as f64 / 1e9,
        );
        let secs = now.saturating_sub(start) as f64 / 1e9;
        let used = u64::from(self.window_used());
        let (ops, bounds) = self.window_mix(cost);
        // The first operation after the first whose check finds the window
        // closing early with `used + j × cost` attempted in it, in `ops + j`
        // operations: none before the allowance is spent, then one by one,
        // as the checks would.
        let closes = |j: u64| {
            let used = used.wrapping_add(j.wrapping_mul(cost));
            let unit = guard::effective_cost(used as f64, ops.saturating_add(j) as f64, bounds);
            guard::closes_early(used as f64, secs, limit, window, cost, unit)
        };
        let spent = ((limit * window - used as f64) / cost as f64).max(0.0);
        let mut j = (spent.floor() as u64).clamp(1, n);
        while j < n && !closes(j) {
            j += 1;
        }
        j
    }

    /// The counter a decision adds to.
    #[inline]
    pub(super) fn counter(&self, admitted: bool) -> &AtomicU64 {
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
    pub(super) fn forgettable(&self, now: Nanos, idle_drains: u16) -> bool {
        let admitted = self.admitted.load(Relaxed);
        let rejected = self.rejected.load(Relaxed);
        self.idle_drains.load(Relaxed) >= idle_drains
            && !self.active_last_drain.load(Relaxed)
            && self.carried_since.load(Relaxed) == 0
            && now.as_nanos() >= self.master_expires.load(Acquire)
            && cost_of(admitted) == self.drained_admitted.load(Relaxed)
            && cost_of(rejected) == self.drained_rejected.load(Relaxed)
            && self.attempted_ops() == self.drained_ops.load(Relaxed)
            && (admitted | rejected) & RETIRED == 0
    }

    /// The local guard's factor (as stored). Once per `local_window` one caller wins
    /// the right to measure this agent's demand over the window that ended
    /// and to set the factor that brings that demand down to the limit,
    /// when that demand is confidently over it (see [`guard`]:
    /// `cost`, the operation being decided, stands for what one costs).
    ///
    /// While the master does not suppress the pair (`early`), a window
    /// closes early once this agent alone has attempted more than the
    /// limit allows over a whole window, confidently over the limit: a
    /// deluge on one agent (100× the account's limit) is then measured
    /// within milliseconds, not at the window's end, and that agent's rate
    /// alone proves the account is over its limit, whatever the others do.
    /// (Under a master's factor the windows run whole: a suppressed pair's
    /// every check would otherwise close one.)
    #[inline]
    pub(super) fn local_guard(
        &self,
        now: u64,
        limit: f64,
        early: bool,
        cost: u64,
        config: &AgentConfig,
    ) -> u32 {
        let word = self.local_start.load(Relaxed);
        if young(word) {
            self.sample_quantum(cost);
        }
        let start = window_start(word);
        let elapsed = now.saturating_sub(start);
        let window = duration_nanos(config.local_window);
        // `elapsed == 0`: nothing to measure over (a zero local window, or a
        // clock that did not move), and no rate to divide by.
        if elapsed == 0
            || (elapsed < window && !(early && self.over_window_allowance(limit, window)))
        {
            return self.local_factor.load(Relaxed);
        }
        self.close_local_window(word, now, limit, cost, window)
    }

    /// The local guard's window that began at `start` is over at `now`, or
    /// past its allowance before its `window` is up: closes it unless an
    /// early close's rate is no deluge ([`guard::closes_early`]), and sets
    /// the factor when its rate is confidently over `limit`. Out of line:
    /// once a window per pair, where every check runs the rest of the
    /// guard.
    #[cold]
    #[inline(never)]
    fn close_local_window(&self, word: u64, now: u64, limit: f64, cost: u64, window: u64) -> u32 {
        let elapsed = now.saturating_sub(window_start(word));
        let secs = elapsed as f64 / 1e9;
        let window_secs = window as f64 / 1e9;
        let next = window_start(now) | (word & YOUTH).saturating_sub(1);
        let early = |used: u32| {
            let unit = self.window_unit(used, cost);
            guard::closes_early(f64::from(used), secs, limit, window_secs, cost, unit)
        };
        if (elapsed < window && !early(self.window_used()))
            || self
                .local_start
                .compare_exchange(word, next, Relaxed, Relaxed)
                .is_err()
        {
            return self.local_factor.load(Relaxed);
        }
        self.sample_quantum(cost);
        let total = self.attempted_total();
        // Only the check that won the window writes the bases (see `owned`).
        let used = total.wrapping_sub(self.local_base.replace(total));
        // Weighed before the operations' base moves on, and only when over
        // the limit at all: most windows of most pairs are under it, and
        // their weighing was 5% of a simulated fleet's time.
        let unit = || self.window_unit(used, cost);
        let used = f64::from(used);
        let over = used > limit * secs && guard::confidently_over(used, secs, limit, cost, unit());
        self.local_ops_base.replace(self.attempted_ops());
        let t = if over {
            factor_bits(1.0 - limit / (used / secs))
        } else {
            0
        };
        self.local_factor.store(t, Relaxed);
        t
    }

    /// The master's factor in force at `now`, as the local guard's is
    /// stored (`f32` bits): 0 once it expired (or before any master
    /// answered).
    pub(super) fn master_factor_at(&self, now: Nanos) -> u32 {
        word_factor(self.master_word_at(now))
    }

    /// The master's word (see [`frozen`](super::frozen)) in force at
    /// `now`: 0 once it expired (or before any master answered).
    pub(super) fn master_word_at(&self, now: Nanos) -> u32 {
        // Acquire pairs with `apply`'s Release, as in `factors`.
        if now.as_nanos() < self.master_expires.load(Acquire) {
            self.master_factor.load(Relaxed)
        } else {
            0
        }
    }

    /// Whether the master's factor, expired or not, is above 0.
    pub(super) fn master_suppressed(&self) -> bool {
        word_factor(self.master_factor.load(Relaxed)) != 0
    }

    /// The master's factor this pair holds, expired or not (for the scans'
    /// tests of a pair they know suppressed).
    pub(super) fn master_factor_held(&self) -> f64 {
        factor_of(word_factor(self.master_factor.load(Relaxed)))
    }

    /// Whether the scans' flag `flag` is set.
    pub(super) fn scanned(&self, flag: u8) -> bool {
        self.scan_flags.load(Relaxed) & flag != 0
    }

    /// Sets or clears the scans' flag `flag` (scanner only: a load and a
    /// store).
    pub(super) fn set_scanned(&self, flag: u8, on: bool) {
        let flags = self.scan_flags.load(Relaxed);
        let new = if on { flags | flag } else { flags & !flag };
        if new != flags {
            self.scan_flags.store(new, Relaxed);
        }
    }

    /// Notes a closed sub-window, `empty` or not, in the run of empty
    /// ones (saturating at 15; scanner only): a suppressed sparse pair's
    /// fall is a run too long for its rate (see `hint`).
    pub(super) fn note_empty(&self, empty: bool) {
        let flags = self.scan_flags.load(Relaxed);
        let run = flags >> EMPTY_SHIFT;
        let run = if empty { (run + 1).min(15) } else { 0 };
        let new = (flags & ((1 << EMPTY_SHIFT) - 1)) | (run << EMPTY_SHIFT);
        if new != flags {
            self.scan_flags.store(new, Relaxed);
        }
    }

    /// How many sub-windows in a row the scans closed empty, up to 15.
    pub(super) fn empty_run(&self) -> u8 {
        self.scan_flags.load(Relaxed) >> EMPTY_SHIFT
    }

    /// Whether the local guard refuses some of this pair's operations
    /// under its op's default limit, no master having answered for it yet.
    pub(super) fn guarded_unconfirmed(&self) -> bool {
        self.master_expires.load(Relaxed) == 0 && self.local_factor.load(Relaxed) != 0
    }

    /// Takes the cost of a first check as what one operation costs, until
    /// the scans learn better ([`Quantum::seeded`](super::surge::Quantum::seeded)); off the hot path (a
    /// new entry's first check, or the simulator's batches).
    ///
    /// And begins the pair's youth: for its first [`YOUTH_WINDOWS`] local
    /// guard windows (about four seconds of 250 ms, when it has traffic),
    /// every check shows the scans its cost ([`Quantum::sample`](super::surge::Quantum::sample)), not only
    /// the one that closes a window. An account whose operations mostly cost 1
    /// and sometimes 51 begins, on most agents, with an operation of 1,
    /// which divides every cost and shows nothing; until an agent saw a 51,
    /// a sub-window with one more of them than due read as a rise of 51
    /// operations of 1, and such early reports refused an account at
    /// 0.95× of its limit in its first seconds (`mixed-costs` at 0.95×,
    /// every seed of 30). A pair made otherwise (a master's factor before
    /// any check) has no youth: it is seeded by no check.
    pub(super) fn seed_quantum(&self, cost: u64) {
        if self.quantum.load(Relaxed) == 0 {
            let seeded = super::surge::Quantum::seeded(cost);
            if self
                .quantum
                .compare_exchange(0, seeded.0, Relaxed, Relaxed)
                .is_ok()
            {
                self.local_start.fetch_or(YOUTH_WINDOWS, Relaxed);
            }
        }
    }

    /// [`sample_quantum`](Self::sample_quantum) for a young pair with no
    /// limit known, at `now`: out of line, off the path of a pair with one.
    /// With no limit the local guard closes no windows, so the youth they
    /// count would never end (a pair of an op with no limit would sample
    /// every check for ever): it ends once as long has passed since the
    /// pair's start as its windows would have taken.
    #[cold]
    #[inline(never)]
    fn sample_if_young(&self, now: u64, cost: u64, config: &AgentConfig) {
        let word = self.local_start.load(Relaxed);
        if !young(word) {
            return;
        }
        let youth = duration_nanos(config.local_window).saturating_mul(YOUTH_WINDOWS);
        if now.saturating_sub(window_start(word)) >= youth {
            // A guard closing its window meanwhile (a limit just came)
            // finds the word changed and leaves the window to this one.
            self.local_start.fetch_and(!YOUTH, Relaxed);
            return;
        }
        self.sample_quantum(cost);
    }

    /// Shows the scans' cost of one operation ([`Quantum::sample`]) the
    /// cost of the operation that closed a local guard's window (once a
    /// window per pair, off `check`'s path for the other operations), or
    /// of every check in the pair's youth (see
    /// [`seed_quantum`](Self::seed_quantum)). One attempt: a scan that
    /// wrote meanwhile wins, and the next sample comes soon.
    ///
    /// [`Quantum::sample`]: super::surge::Quantum::sample
    #[cold]
    #[inline(never)]
    fn sample_quantum(&self, cost: u64) {
        let known = self.quantum.load(Relaxed);
        let sampled = super::surge::Quantum(known).sample(cost).0;
        if sampled != known {
            let _ = self
                .quantum
                .compare_exchange(known, sampled, Relaxed, Relaxed);
        }
    }

    /// Whether the cost attempted in the local guard's current window is
    /// already more than `limit` allows over a whole window of `window`
    /// nanoseconds: then it may close early, if its rate is a deluge's
    /// ([`guard::closes_early`]). Reads only the check's own cache line.
    #[inline]
    fn over_window_allowance(&self, limit: f64, window: u64) -> bool {
        self.window_used() as f64 > limit * (window as f64 / 1e9)
    }

    /// The operations counted in the local guard's current window, and
    /// what is known of their costs with `cost`, the operation being
    /// decided, among them ([`Quantum::bounds`]). Off `check`'s path: read
    /// when a window may close.
    ///
    /// [`Quantum::bounds`]: super::surge::Quantum::bounds
    fn window_mix(&self, cost: u64) -> (u64, CostBounds) {
        let ops = ops_between(self.local_ops_base.load(Relaxed), self.attempted_ops());
        (u64::from(ops), self.quantum().bounds(cost))
    }

    /// What one operation of the local guard's current window, of `used`
    /// cost, weighs for its chance scatter ([`guard::effective_cost`]).
    fn window_unit(&self, used: u32, cost: u64) -> f64 {
        let (ops, bounds) = self.window_mix(cost);
        guard::effective_cost(f64::from(used), ops as f64, bounds)
    }

    /// The cost attempted in the local guard's current window.
    #[inline]
    fn window_used(&self) -> u32 {
        self.attempted_total()
            .wrapping_sub(self.local_base.load(Relaxed))
    }
}

impl AgentState {
    /// The entry of an (account, op), created if it is new; `None` when
    /// the table cannot track it (its op past [`MAX_OPS`](super::table::MAX_OPS), or
    /// the table full).
    pub(super) fn entry<'g>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        pinned: &'g Pinned<'_>,
    ) -> Option<&'g Entry> {
        Some(self.entry_made(now, account, op, pinned)?.0)
    }

    /// [`entry`](Self::entry) for a `check`: a pair it creates is young
    /// (see `young`).
    pub(super) fn traffic_entry<'g>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        pinned: &'g Pinned<'_>,
    ) -> Option<&'g Entry> {
        let (entry, made) = self.entry_made(now, account, op, pinned)?;
        if let Some(op) = made {
            self.note_young(now, &op, account);
        }
        Some(entry)
    }

    /// [`entry`](Self::entry), and the op's interned name when this call
    /// made it (not a racing one).
    fn entry_made<'g>(
        &self,
        now: Nanos,
        account: &str,
        op: &str,
        pinned: &'g Pinned<'_>,
    ) -> Option<(&'g Entry, Option<Arc<str>>)> {
        let name = self.pairs.name(account, op);
        if let Some(entry) = pinned.get(&name) {
            return Some((entry, None));
        }
        let (number, op, limit) = self.new_pair(account, op);
        let (entry, made) = pinned.get_or_insert(&name, number, |e| e.reset(now, limit))?;
        Some((entry, made.then_some(op)))
    }

    /// For a new (account, op): its op's number and interned name, and the
    /// limit for its local guard, as stored ([`limit_bits`]): its
    /// account's override, else the op's default (0.0: unknown, none, or
    /// fast onset off).
    fn new_pair(&self, account: &str, op: &str) -> (Option<u16>, Arc<str>, u32) {
        let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let known = match ops.get(op) {
            Some(known) => known,
            None => ops
                .entry(op.into())
                .or_insert_with(|| OpInfo::new(op, &self.pairs)),
        };
        let limit = if self.config.fast_onset {
            known.limit_for(account)
        } else {
            0
        };
        (known.number, known.name.clone(), limit)
    }
}
