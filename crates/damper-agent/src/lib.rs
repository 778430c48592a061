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
//! - this file: [`Agent`], the handle the node holds.
//! - `builder`: [`AgentBuilder`], its settings, checked at start.
//! - `rollup`: the background task, a thin driver of the core's sans-IO
//!   round ([`damper_core::round::AgentRound`]): timers, gRPC calls,
//!   logs and metrics. The round decides everything else (cutting,
//!   routing, splitting, carrying over, rechecks, probes), the same code
//!   the simulator runs.
//! - `stats`: [`AgentStats`] and the rollup latency histogram.
//! - `clock`: the coarse clock `check` reads.
//! - `signal`: [`stop_signal`], when a node should stop and shut its agent
//!   down.
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
//! if let Decision::Reject(r) = agent.check("acme", "messages", 1 + 1000) {
//!     // Tell the publisher now: rate limited, retry after r.retry_after.
//!     eprintln!("rejected: factor {}, retry in {:?}", r.factor, r.retry_after);
//! } else {
//!     /* deliver */
//! }
//! agent.shutdown().await; // sends the last counts
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod builder;
mod clock;
mod rollup;
mod signal;
mod stats;

use std::cell::RefCell;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};

use damper_core::agent::AgentState;
use damper_core::time::Clock;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use builder::{AgentBuilder, AgentError, AgentTls, Masters};
pub use damper_core::agent::{
    Admitted, Decision, Publisher, RejectSource, Rejection, Standing, implied_demand,
};
pub use signal::stop_signal;
use stats::Stats;
pub use stats::{AgentStats, LatencyHistogram};

/// Keyed token buckets for the limits a node enforces on its own (per
/// connection, per channel), next to the account-wide [`Agent::check`]:
/// capacity, refill amount and time, strict mode, caller-supplied time,
/// sweeping of full buckets. See [`damper_core::local`].
pub mod local {
    pub use damper_core::local::{BucketConfig, BucketConfigError, Reduced, TokenBuckets};
}

use crate::clock::CoarseClock;

/// State shared by the handle and the rollup task.
pub(crate) struct Shared {
    pub(crate) state: AgentState,
    pub(crate) clock: CoarseClock,
    pub(crate) agent_id: String,
    pub(crate) stats: Stats,
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
    static RNG: RefCell<SmallRng> = RefCell::new(SmallRng::seed_from_u64(os_seeded_u64()));
}

/// This thread's [`RNG`], reached only when a decision draws: a check
/// with no factor in force, most of them, never touches the thread-local.
struct ThreadRng;

impl rand::TryRng for ThreadRng {
    type Error = std::convert::Infallible;

    #[inline]
    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(RNG.with_borrow_mut(rand::Rng::next_u32))
    }

    #[inline]
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(RNG.with_borrow_mut(rand::Rng::next_u64))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        RNG.with_borrow_mut(|rng| rand::Rng::fill_bytes(rng, dst));
        Ok(())
    }
}

/// 64 bits from the OS-seeded keys of std's `RandomState`, different on
/// every call.
pub(crate) fn os_seeded_u64() -> u64 {
    let mut h = std::hash::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
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
    ///
    /// Under a limit in shadow (the master's `[shadow]` table) what would
    /// be refused is admitted, the refusal it would have been in
    /// [`Admitted::would_reject`], and its cost counted in
    /// [`AgentStats::would_reject_cost`].
    #[inline]
    pub fn check(&self, account: &str, op: &str, cost: u64) -> Decision {
        let now = self.shared.clock.now();
        let decision = self
            .shared
            .state
            .check(now, account, op, cost, &mut ThreadRng);
        self.count_shadow(&decision, cost);
        decision
    }

    /// [`check`](Self::check) for an operation `publisher` sent (the
    /// connection or client, as the node knows it): publishers sharing
    /// an account each keep their share of what it admits, however their
    /// operations interleave, a costly publisher beside cheap ones
    /// included (see [`AgentState::check_from`]). What the account admits
    /// in all is what `check` would admit.
    #[inline]
    pub fn check_from(&self, account: &str, op: &str, cost: u64, publisher: Publisher) -> Decision {
        let now = self.shared.clock.now();
        let decision =
            self.shared
                .state
                .check_from(now, account, op, cost, publisher, &mut ThreadRng);
        self.count_shadow(&decision, cost);
        decision
    }

    /// Counts what a limit in shadow would have refused.
    #[inline]
    fn count_shadow(&self, decision: &Decision, cost: u64) {
        if decision.shadow_refusal().is_some() {
            self.shared
                .stats
                .would_reject_cost
                .fetch_add(cost, std::sync::atomic::Ordering::Relaxed);
        }
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

    /// What an (account, op) stands at now: the factor `check` would apply
    /// and the limit in force. Counts nothing and creates no state: for
    /// showing a customer how close it is to its limit before anything is
    /// refused. See [`AgentState::peek`](damper_core::agent::AgentState::peek).
    pub fn peek(&self, account: &str, op: &str) -> Standing {
        self.shared.state.peek(self.shared.clock.now(), account, op)
    }

    /// What the rollup task has done since start.
    pub fn stats(&self) -> AgentStats {
        self.shared.stats.snapshot()
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
