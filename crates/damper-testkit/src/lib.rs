//! What Damper's tests share, so each is written once: a master served on
//! loopback, and what "held at its limit" means.
//!
//! A normal dependency of the crates whose tests use it and that
//! `damper-master` does not depend on (the end-to-end `damper-tests`), so
//! no crate reaches itself through its dev-dependencies.
//!
//! # Layout
//! - [`served`]: [`ServedMaster`], a `damper-master` service on
//!   `127.0.0.1:0`, started and stopped in one call each.
//! - [`config`]: [`quick_config`], the master config end-to-end tests run
//!   at.
//! - this file: [`sampling_sd`] and [`assert_held`].
#![forbid(unsafe_code)]

pub mod config;
pub mod served;

pub use config::{QUICK_WINDOW, quick_config};
pub use served::ServedMaster;

/// The spread of admitted cost that probabilistic suppression itself
/// causes: each of `ops` operations of cost `cost` is admitted with
/// probability `1 − factor`, so the admitted cost has this standard
/// deviation even when the factor is exactly right.
pub fn sampling_sd(ops: f64, cost: f64, factor: f64) -> f64 {
    cost * (ops * factor * (1.0 - factor)).sqrt()
}

/// Panics, naming `what`, unless `admitted` (cost per second) is within
/// `tolerance` (a share, 0.1 for ±10%) of `limit`.
#[track_caller]
pub fn assert_held(what: &str, admitted: f64, limit: f64, tolerance: f64) {
    let ratio = admitted / limit;
    assert!(
        (ratio - 1.0).abs() <= tolerance,
        "{what}: admitted {admitted:.0}/s against a limit of {limit:.0}/s ({ratio:.3} ×, allowed 1 ± {tolerance})"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_means_within_the_tolerance_either_side() {
        assert_held("on the limit", 1_000.0, 1_000.0, 0.0);
        assert_held("just over", 1_099.0, 1_000.0, 0.1);
        assert_held("just under", 901.0, 1_000.0, 0.1);
        let over = std::panic::catch_unwind(|| assert_held("flood", 1_200.0, 1_000.0, 0.1));
        assert!(over.is_err());
        // 10 000 operations of cost 1 at factor 0.5: σ = 50.
        assert_eq!(sampling_sd(10_000.0, 1.0, 0.5), 50.0);
    }
}
