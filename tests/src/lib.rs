//! End-to-end tests of the Damper loop.
//!
//! Two kinds of harness. `tests/grpc.rs` and its neighbours run the real
//! thing: `damper-master` servers on loopback, `damper-agent` agents,
//! traffic from `damper-load`, at the production time scale. The others
//! run the simulator (`damper-sim`: the agents' own sans-IO round, in
//! virtual time) against the product's master service instead of its
//! simulated masters ([`masters`]): fast, deterministic, and able to run for
//! simulated minutes.
//!
//! # Layout
//! - [`masters`]: [`masters::WireMasters`] (in-process, every message
//!   through `damper.v1` bytes) and [`masters::GrpcMasters`] (real gRPC on
//!   loopback), for the simulator.
//! - `tests/same_round.rs`: one seeded run through the simulator twice,
//!   against its simulated masters and against real masters over gRPC:
//!   the same factors round by round.
//! - `tests/wire_loop.rs`: the proto carries the loop; the calm account is
//!   never touched while a deluge is held at its limit, and a stopped
//!   deluge is released within the round.
//! - `tests/compat.rs`: agents that predate fast onset against today's
//!   masters, and today's agents against masters that predate it
//!   ([`masters::WireMasters::predating_fast_onset`]).
//! - `tests/policies.rs`: the demand policy holds a deluge steadily; Ably's
//!   linear ramp on the admitted rate oscillates.
//! - `tests/grpc.rs`: the loop over real gRPC on loopback, at full scale.
//! - [`proxy`]: a fault-injecting TCP proxy (delay, drop, cut);
//!   `tests/faults.rs` puts it between agents and a master.
//! - `served`, [`sampling_sd`], [`assert_held`], [`quick_config`]: from
//!   `damper-testkit`.

pub mod masters;
pub mod proxy;

pub use damper_testkit::{assert_held, quick_config, sampling_sd, served};

use damper_sim::engine::{Run, Series};
use damper_sim::scenario::Scenario;

/// A scenario from TOML, panicking with the reason if it is invalid.
pub fn scenario(toml: &str) -> Scenario {
    Scenario::from_toml(toml).unwrap_or_else(|e| panic!("{e}"))
}

/// The series of (account, op) in a run.
pub fn series<'a>(run: &'a Run, account: &str, op: &str) -> &'a Series {
    run.series
        .iter()
        .find(|s| s.traffic.account == account && s.traffic.op == op)
        .unwrap_or_else(|| panic!("no traffic for {account}/{op}"))
}

/// Per round of `interval_s` seconds from `from_s`: (admitted cost per
/// second, mean factor at the ends of its seconds).
pub fn rounds(series: &Series, from_s: usize, interval_s: usize) -> Vec<(f64, f64)> {
    series.seconds[from_s..]
        .chunks_exact(interval_s)
        .map(|c| {
            let admitted = c.iter().map(|s| s.admitted).sum::<u64>() as f64 / interval_s as f64;
            let factor = c.iter().map(|s| s.factor).sum::<f64>() / interval_s as f64;
            (admitted, factor)
        })
        .collect()
}
