//! The agent's rollup round as a sans-IO state machine: told the time and
//! what happened, it answers with what to send to whom and when it next
//! wants to be woken. It does no I/O and reads no clock, so the agent
//! library's rollup task, the simulator and the test harnesses drive this
//! one machine, and what the simulator shows is what the product does.
//!
//! # A round
//! 1. **Cut.** At each multiple of the rollup interval since the epoch (the
//!    shared grid, the same for every agent, so a master can tell which
//!    reports belong to one round) the machine brings back masters whose
//!    warm-up is over, asks for probes of down masters that are due, drains
//!    the [`AgentState`](crate::agent::AgentState)'s counts and routes each account to its master on
//!    the live ring, in requests of at most `max_entries_per_request`.
//!    Counts with no master to go to are carried over.
//! 2. **Send**, after the agent's spread ([`send_spread`](crate::agent::send_spread)): one
//!    [`Transmit`] per request.
//! 3. **Replies.** Each reply is applied (its listed factors, and factor 0
//!    under the op's limit for the pairs it implies, [`Reply::expand`](crate::wire::Reply::expand)).
//!    A recheck it asks for is sent `recheck_after` later. A failed or
//!    timed-out request has its counts carried over to the next round,
//!    unless they are older than `max_carry`.
//! 4. **Surges** (fast onset), between cuts: every sub-window the machine
//!    scans the pairs ([`AgentState::scan_surges`](crate::agent::AgentState::scan_surges);
//!    halfway through it, a peek for rises,
//!    [`AgentState::peek_surges`](crate::agent::AgentState::peek_surges))
//!    and sends those whose rate jumped or fell at once, one early report
//!    per master (none to a master still answering the last one; one
//!    unanswered for two sub-windows is sent once more, then given up);
//!    the reply's factors apply at once, and its recheck a moment later
//!    brings the estimate with every agent's early report in.
//! 5. **Settle**, once every request of the round is answered or failed:
//!    masters that failed are counted towards going down ([`Membership`](crate::membership::Membership)),
//!    a master that said the agent's ring differs brings the down masters'
//!    probes forward, lapsed factors are counted, and idle pairs are
//!    forgotten.
//!
//! # Driving it
//! ```text
//! loop {
//!     while let Some(t) = round.poll_transmit() { send t, remember t.id }
//!     while let Some(e) = round.poll_event() { log, count }
//!     wait until round.poll_timeout(), or an answer, or stop:
//!         timeout   => round.handle_timeout(now, &state)
//!         answer    => round.on_reply(now, id, reply, &state)
//!         error     => round.on_failure(now, id, &state)
//!         stop      => round.stop(now, &state); then until round.is_finished()
//! }
//! ```
//! The [`AgentState`](crate::agent::AgentState) is passed to every call
//! rather than owned: `check` shares it with every thread of the node.
//!
//! # Layout
//! - this file: what goes in and out ([`RoundConfig`], [`Transmit`],
//!   [`Message`], [`RoundEvent`]).
//! - `machine`: [`AgentRound`], the state machine.
//! - `fence`: which pairs a reply older than a push must not undo.

mod fence;
mod machine;

use std::sync::Arc;
use std::time::Duration;

use crate::agent::SurgeRule;
use crate::membership::HealthConfig;
use crate::time::Nanos;
use crate::wire::{FactorsQuery, Rollup};

pub use machine::AgentRound;

/// How a round is run. Built with [`RoundConfig::new`], then adjusted.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RoundConfig {
    /// This agent's identity in rollups: it also seeds the send spread and
    /// the probe jitter, so a fleet of agents spreads out.
    pub agent_id: String,
    /// How often a round is cut. Must be the masters' too.
    pub rollup_interval: Duration,
    /// Most (account, op) entries in one request; a larger rollup is split,
    /// since masters refuse requests above their own `max_entries`.
    pub max_entries_per_request: usize,
    /// How long undelivered counts are carried over before they are
    /// dropped: older ones fall outside any window a master keeps.
    pub max_carry: Duration,
    /// When a master counts as down, and how it is probed.
    pub health: HealthConfig,
    /// Fast onset: what counts as a surge, found by a scan every
    /// sub-window and sent at once as an early report (see `docs/design.md`);
    /// with it, a new round also says hello to every master to learn the
    /// ops' default limits. `None` turns it off: rollups alone, every
    /// interval.
    pub fast_onset: Option<SurgeRule>,
    /// This run of the agent, so the masters' exactly-once log tells its
    /// numbered rollups from another run's with the same `agent_id`.
    /// `None`: the round's start in milliseconds, which keeps the
    /// simulator deterministic. A service sets a random one: two agents of
    /// one process may share an id and start in the same millisecond, and
    /// then a master would take one's rollups for resends of the other's.
    pub incarnation: Option<u64>,
    /// Whether rollups give accounts by number to masters that take them
    /// (see [`crate::wire::dictionary`]): each account's name goes to a
    /// master once rather than every round. Off, every account is named,
    /// as before numbers existed. Default on.
    pub account_numbers: bool,
}

impl RoundConfig {
    /// The defaults: a [`DEFAULT_ROLLUP_INTERVAL`](crate::DEFAULT_ROLLUP_INTERVAL),
    /// 10 000 entries a request, 30 s of carry-over.
    pub fn new(agent_id: impl Into<String>) -> RoundConfig {
        RoundConfig {
            agent_id: agent_id.into(),
            rollup_interval: crate::DEFAULT_ROLLUP_INTERVAL,
            max_entries_per_request: 10_000,
            max_carry: Duration::from_secs(30),
            health: HealthConfig::default(),
            fast_onset: Some(SurgeRule::default_for(crate::DEFAULT_ROLLUP_INTERVAL)),
            incarnation: None,
            account_numbers: true,
        }
    }
}

/// Names one request, so its answer can be matched to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(u64);

/// Something to send to a master.
#[derive(Clone, Debug, PartialEq)]
pub struct Transmit {
    /// Give it back with the answer ([`AgentRound::on_reply`]) or the
    /// failure ([`AgentRound::on_failure`]).
    pub id: RequestId,
    /// The master's address.
    pub master: String,
    /// What to send.
    pub message: Message,
}

/// The request a [`Transmit`] carries.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Message {
    /// A round's counts (`Rollup`). Shared with the round, which keeps it
    /// until it is answered, to carry its counts over if it fails.
    Rollup(Arc<Rollup>),
    /// A recheck of factors a reply marked (`Factors`).
    Recheck(FactorsQuery),
    /// Whether a down master answers again (`Factors` naming nothing);
    /// also a new round's hello, to learn the ops' default limits.
    Probe(FactorsQuery),
    /// An early report of surges (`Factors` with rates).
    Surge(FactorsQuery),
}

/// What the round did that a driver logs or counts.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum RoundEvent {
    /// A master went off the live ring (`up: false`: failed rollups in a
    /// row) or back on it; its accounts moved.
    RingChanged {
        /// The master.
        master: String,
        /// Whether it is now on the ring.
        up: bool,
    },
    /// A down master answered a probe; it rejoins after its warm-up.
    Rejoining {
        /// The master.
        master: String,
    },
    /// A master reported entries it does not own: this agent's ring
    /// differs, so its down masters are probed now.
    ProbesHastened {
        /// The master that said so.
        master: String,
        /// Entries it does not own.
        foreign: u32,
        /// Probes brought forward.
        hastened: usize,
    },
    /// A master's rollup interval differs from this agent's: rounds will
    /// not line up.
    IntervalMismatch {
        /// The master.
        master: String,
        /// Its interval.
        master_interval: Duration,
    },
    /// Counts no master could take (every master down): carried over. The
    /// request that would have carried them, for its size.
    Unroutable(Rollup),
    /// An early report of surges went to a master.
    SurgeReported {
        /// The master.
        master: String,
        /// The (account, op) pairs it carries.
        pairs: usize,
        /// How many of them are joins: pairs the ring just moved to this
        /// master, with the rate this agent last told their previous one
        /// (`AgentState::offer_joins`).
        joined: usize,
        /// How many are young pairs, reported by their own peek between
        /// the grid's scans (`AgentState::peek_young`): new accounts that
        /// arrived as floods.
        young: usize,
        /// How many are sparse hints (`damper_core::agent::HINT_ALPHA`):
        /// a few costly operations more than chance, for the master to
        /// weigh with other agents' hints.
        hints: usize,
    },
    /// A master's push polled pairs (their sparse traffic rose on several
    /// agents at once): those this agent holds are reported early.
    Polled {
        /// The master.
        master: String,
        /// How many of the polled pairs this agent holds, to report.
        pairs: usize,
    },
    /// A master's push arrived ([`AgentRound::on_push`]).
    Pushed {
        /// The master.
        master: String,
        /// The pairs it listed.
        pairs: usize,
        /// How many of them this agent holds, and applied.
        applied: usize,
    },
    /// Undelivered cost older than `max_carry`, dropped.
    Dropped {
        /// Attempted cost dropped.
        cost: u64,
    },
    /// A round is settled: all its requests answered or failed.
    Settled {
        /// The end of the round's interval.
        end: Nanos,
        /// Positive factors that lapsed since the last settle with no
        /// fresher one from their master: those pairs now fail open.
        lapsed: usize,
        /// Idle pairs forgotten.
        forgotten: usize,
        /// Pairs tracked after forgetting.
        pairs: usize,
    },
}

/// The start of the grid interval that contains `now`.
pub fn grid_floor(now: Nanos, interval: Duration) -> Nanos {
    let i = u64::try_from(interval.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1);
    Nanos::from_nanos(now.as_nanos() / i * i)
}

#[cfg(test)]
mod poll_tests;
#[cfg(test)]
mod tests;
