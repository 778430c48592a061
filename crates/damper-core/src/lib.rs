//! Sans-IO core of Damper, the distributed account-wide rate limiter with
//! probabilistic suppression.
//!
//! Agents, linked into every pub/sub node, decide each operation in-process
//! ([`agent::AgentState::check`]) and count, per (account, op), the cost
//! admitted and the cost *attempted*. Every rollup interval they send the
//! counts to each account's master, chosen on the [`ring::Ring`]. The master
//! ([`master::MasterState`]) keeps each (account, op)'s demand over
//! sub-intervals ([`window::DemandWindow`]), estimates its rate, and replies
//! with a suppression factor from the [`config::PolicyKind`]: the probability
//! of rejecting an operation, `1 − limit / demand` by default, so admitted
//! demand lands at the limit.
//!
//! Nothing here does I/O, spawns, or reads a clock on its own: time is an
//! argument ([`time::Nanos`]), read by callers from a [`time::Clock`]. The
//! agent library, the master service and the simulator run this same code.
//!
//! # Layout
//! - [`time`]: points in time, the [`time::Clock`] trait, a manual clock.
//! - [`config`]: the `[window]`, `[policy]` and `[limits]` tables, validated.
//! - [`limits`]: limits per op with hierarchical per-account overrides.
//! - [`window`]: one (account, op)'s demand window and the estimators.
//! - [`policy`]: rates and limit to suppression factor.
//! - [`master`]: the master's per-shard state machine.
//! - [`agent`]: the agent's admission decision, counters and factors.
//! - [`local`]: keyed token buckets for per-connection and per-channel limits.
//! - [`ring`]: consistent hashing of accounts over masters.
//! - [`membership`]: which masters are up, with failure counting and probes.
//! - [`Pair`]: one (account, op), the key of everything, account first.
//! - [`wire`]: the messages of a round (rollup, query, reply), their
//!   validation, and the reply's compaction and expansion.
//! - [`round`]: the agent's rollup round as a sans-IO state machine, which
//!   the agent library, the simulator and the test harnesses all drive.
//!
//! # Example
//! One agent and one master, in virtual time, through a deluge:
//! ```
//! use std::time::Duration;
//! use damper_core::agent::{AgentConfig, AgentState};
//! use damper_core::config::MasterConfig;
//! use damper_core::master::{MasterState, Report};
//! use damper_core::time::Nanos;
//! use rand::SeedableRng;
//!
//! let mut master = MasterState::new(MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap());
//! let agent = AgentState::new(AgentConfig::default());
//! let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
//!
//! let mut now = Nanos::from_secs(1_800_000_000);
//! let (mut admitted, mut attempted) = (0u64, 0u64);
//! for round in 0..30 {
//!     let start = now;
//!     // 10 000 operations per second, for 2 s, at one per 100 µs.
//!     for _ in 0..20_000 {
//!         now = now + Duration::from_micros(100);
//!         let admit = agent.check(now, "acme", "messages", 1, &mut rng).is_admit();
//!         if round >= 10 {
//!             attempted += 1;
//!             admitted += admit as u64;
//!         }
//!     }
//!     // The rollup, and the reply.
//!     let mut reports = Vec::new();
//!     agent.drain(now, |account, op, d| reports.push((account.to_owned(), op.to_owned(), d)));
//!     for (account, op, d) in reports {
//!         let report = Report { account: &account, op: &op, start, end: now,
//!                               attempted: d.attempted, admitted: d.admitted,
//!                               op_cost: d.op_cost, ops: d.ops };
//!         if let Some(v) = master.ingest(now, &report).unwrap() {
//!             agent.apply(now, &account, &op, v.factor, v.limit.get(), v.valid_for);
//!         }
//!     }
//! }
//! // Held at the limit: about 1000 of the 10 000 per second get through.
//! let admitted_rate = admitted as f64 / (attempted as f64 / 10_000.0);
//! assert!((admitted_rate - 1000.0).abs() < 100.0, "{admitted_rate}");
//! ```
#![forbid(unsafe_code)]

pub mod agent;
pub mod config;
pub mod exempt;
pub mod limits;
pub mod local;
pub mod master;
pub mod membership;
mod pair;
pub mod policy;
pub mod ring;
pub mod round;
pub mod shadow;
pub mod time;
pub mod window;
pub mod wire;

pub use pair::{OwnedPair, Pair};

/// How often agents send rollups unless configured otherwise, and the
/// masters' default `rollup_interval_ms`: the one place it is written.
pub const DEFAULT_ROLLUP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest account or op name, in bytes, that agents report and masters
/// accept.
pub const MAX_NAME_LEN: usize = 256;
