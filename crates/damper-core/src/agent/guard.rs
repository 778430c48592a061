//! The local guard's confidence: when this agent's own demand for a pair
//! is proof enough that the account is over its limit.
//!
//! The local guard (`Entry::local_guard`) measures each pair's attempted
//! cost over windows of `local_window` (250 ms) and, when this agent alone
//! attempts more than the account-wide limit, refuses the excess without
//! waiting for a master. Read plainly, a window is a Poisson count: an
//! account that keeps to 0.95× of its limit from one node reads over the
//! limit in one 250-ms window in five, and the guard refused 0.8% of its
//! operations (10% when they came in 100-ms lumps). The guard is for
//! deluges, which stand far above the limit; a moderate excess is the
//! masters' to judge, over whole rounds and with their own confidence.
//!
//! So a window suppresses only when its rate stands [`GUARD_SIGMAS`]
//! standard deviations of its counting noise above the limit: `n`
//! operations of cost `c` over `t` seconds read `n·c/t ± √n·c/t`, and the
//! cost of the operation being decided stands for `c` (no cache line
//! beyond the check's own is read). A deluge of cost-1 operations passes
//! at its first early close; one of costly operations (a publish to 1 000
//! subscribers costs 1 001) waits for about 17 of them.
//!
//! A window closes early (before its `local_window` is up) only for a
//! deluge: past a whole window's allowance, and confidently over
//! [`EARLY_CLOSE_RATIO`] times the limit. A client that publishes in
//! bursts (95 operations at once every 100 ms, 0.95× the limit) spends a
//! window's allowance within 200 ms whenever three bursts fall in it, and
//! its rate read there, 1 330/s, passed the limit by four of its
//! deviations, and the next window refused a quarter: 11% of its
//! operations in all. A moderate overload is measured over whole windows.

/// How many standard deviations of its counting noise a window's rate must
/// stand above the limit for the guard to refuse: at 0.99× of the limit,
/// with about 250 operations a window, one window in 10^5 reads that high
/// by chance (one every seven hours of a node's checks of the pair), where
/// three would be one every seven minutes.
pub(super) const GUARD_SIGMAS: f64 = 4.0;

/// How many times the limit a window must confidently read to close
/// early: a deluge is far above it, bursts of traffic under the limit are
/// not.
pub(super) const EARLY_CLOSE_RATIO: f64 = 2.0;

/// Whether `used` cost attempted over `secs` seconds, by operations of
/// about `cost` each, is over `limit` cost per second by more than
/// [`GUARD_SIGMAS`] standard deviations of its count.
pub(super) fn confidently_over(used: f64, secs: f64, limit: f64, cost: u64) -> bool {
    if secs <= 0.0 {
        return false;
    }
    let noise = (used * cost as f64).sqrt();
    used - GUARD_SIGMAS * noise > limit * secs
}

/// Whether a window `secs` old that has seen `used` cost closes early:
/// past the allowance of a whole window (`window_secs` at `limit`) and
/// confidently over [`EARLY_CLOSE_RATIO`] times the limit.
pub(super) fn closes_early(used: f64, secs: f64, limit: f64, window_secs: f64, cost: u64) -> bool {
    used > limit * window_secs && confidently_over(used, secs, EARLY_CLOSE_RATIO * limit, cost)
}

/// About the least cost at which a window `secs` old closes early
/// ([`closes_early`]): where to start looking for the operation of a batch
/// that closes it. Solves `x² − k·√c·x − limit·secs = 0` for `x = √used`.
pub(super) fn least_closing(secs: f64, limit: f64, window_secs: f64, cost: u64) -> f64 {
    let k = GUARD_SIGMAS * (cost as f64).sqrt();
    let over = EARLY_CLOSE_RATIO * limit * secs.max(0.0);
    let root = (k + (k * k + 4.0 * over).sqrt()) / 2.0;
    (root * root).max(limit * window_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chance_near_the_limit_is_not_confidence() {
        // 0.95× of 1 000/s over 250 ms reads 1 100/s (+2.4σ): no.
        assert!(!confidently_over(275.0, 0.25, 1_000.0, 1));
        // A deluge's first early close: 251 over 100 ms.
        assert!(confidently_over(251.0, 0.1, 1_000.0, 1));
        // Costly operations (1 001 each) at 100 a second: one is nothing,
        // seventeen are proof.
        assert!(!confidently_over(1_001.0, 0.01, 1_000.0, 1_001));
        assert!(confidently_over(17.0 * 1_001.0, 0.17, 1_000.0, 1_001));
        assert!(!confidently_over(1.0, 0.0, 1_000.0, 1));
    }

    #[test]
    fn bursts_under_the_limit_close_no_window_early_and_a_deluge_does() {
        // Three bursts of 95 within 200 ms: past the allowance of 250, and
        // 1 330/s is confidently over 1 000/s, but not over 2 000/s.
        assert!(confidently_over(266.0, 0.2, 1_000.0, 1));
        assert!(!closes_early(266.0, 0.2, 1_000.0, 0.25, 1));
        // A deluge's first 251 within 50 ms.
        assert!(closes_early(251.0, 0.05, 1_000.0, 0.25, 1));
        // Fast, but not past a whole window's allowance yet.
        assert!(!closes_early(249.0, 0.01, 1_000.0, 0.25, 1));
    }

    #[test]
    fn the_least_closing_cost_closes_and_a_little_less_does_not() {
        for (secs, limit, cost) in [(0.1, 1_000.0, 1), (0.2, 1_000.0, 51), (0.01, 50.0, 1_001)] {
            let least = least_closing(secs, limit, 0.25, cost);
            assert!(closes_early(least * 1.001 + 1.0, secs, limit, 0.25, cost));
            assert!(!closes_early(least * 0.999 - 1.0, secs, limit, 0.25, cost));
        }
    }
}
