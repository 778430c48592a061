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
//! beyond the check's own is read); a window of fewer than 50 operations
//! is weighed by its Poisson tail instead (`hint::beyond_chance`), which
//! the normal law misjudges.
//! A deluge of cost-1 operations passes at its first early close; one of
//! costly operations (a publish to 1 000 subscribers costs 1 001, a
//! hundred a second) within about six of them.
//!
//! A window closes early (before its `local_window` is up) only for a
//! deluge: past a whole window's allowance, and confidently over
//! [`EARLY_CLOSE_RATIO`] times the limit. A client that publishes in
//! bursts (95 operations at once every 100 ms, 0.95× the limit) spends a
//! window's allowance within 200 ms whenever three bursts fall in it, and
//! its rate read there, 1 330/s, passed the limit by four of its
//! deviations (4.6), and the next window refused a quarter: 11% of its
//! operations in all. A moderate overload is measured over whole windows.

use super::hint::beyond_chance;

/// How many standard deviations of its counting noise a window's rate must
/// stand above the limit for the guard to refuse: the masters' standard
/// (`policy.confidence_sigmas`). At four, an account at 0.95× of a limit
/// of 100/s on one node, its operations in lumps of a 100-ms step's
/// arrivals (a window of three lumps holds 28.5 where 30 are due), read
/// that high about once in 30 000 windows, two hours of a node's checks
/// of the pair, and was refused a dozen operations each time
/// (`near-limit-one-node`: 14 seeds of 1 000 simulated 2-minute runs; at
/// five, 1). A deluge stands tens of deviations out; a single node's
/// overload of 1.5× is the masters' to judge within a round.
pub(super) const GUARD_SIGMAS: f64 = 5.0;

/// The same, as the chance of a Poisson count at least that high: what a
/// window of few operations is weighed by, where the normal law is far
/// off. The normal law's tail at [`GUARD_SIGMAS`].
const GUARD_ALPHA: f64 = 2.867e-7;

/// How many times the limit a window must confidently read to close
/// early: a deluge is far above it, bursts of traffic under the limit are
/// not.
pub(super) const EARLY_CLOSE_RATIO: f64 = 2.0;

/// Whether `used` cost attempted over `secs` seconds, by operations of
/// about `cost` each, is over `limit` cost per second beyond chance: a
/// count that high, were the rate `limit`, would come less often than
/// [`GUARD_SIGMAS`] standard deviations of the normal law.
///
/// A window begins with the operation whose check opened it, which is no
/// chance arrival within it: it is not counted. (Counted, a costly account
/// at 0.95× of its limit from one node, one operation of 1 001 a second,
/// had a second within a few milliseconds of a window's first now and
/// then, and was refused an operation every few minutes.)
pub(super) fn confidently_over(used: f64, secs: f64, limit: f64, cost: u64) -> bool {
    let cost = cost.max(1) as f64;
    secs > 0.0
        && beyond_chance(
            (used - cost) / cost,
            limit * secs / cost,
            GUARD_SIGMAS,
            GUARD_ALPHA,
        )
}

/// The least share of a window an early close's count is weighed over. A
/// count is a rate only over a span: two operations a microsecond apart
/// are one client's burst, not proof of a rate, yet weighed over that
/// microsecond a burst of two publishes to 1 000 subscribers would read as
/// unlikely as any deluge, and the guard would refuse the account's next
/// window. A deluge of them (a hundred a second) takes about this long to
/// prove anyway.
const EARLY_SPAN_SHARE: f64 = 0.25;

/// Whether a window `secs` old that has seen `used` cost closes early:
/// past the allowance of a whole window (`window_secs` at `limit`) and
/// confidently over [`EARLY_CLOSE_RATIO`] times the limit, the count
/// weighed over at least [`EARLY_SPAN_SHARE`] of the window.
pub(super) fn closes_early(used: f64, secs: f64, limit: f64, window_secs: f64, cost: u64) -> bool {
    let secs = secs.max(EARLY_SPAN_SHARE * window_secs);
    used > limit * window_secs && confidently_over(used, secs, EARLY_CLOSE_RATIO * limit, cost)
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
        // Costly operations (1 001 each) at 100 a second against 2 000/s:
        // three are chance, six are proof (the first opened the window;
        // 0.1 more were due).
        assert!(!confidently_over(3.0 * 1_001.0, 0.03, 2_000.0, 1_001));
        assert!(confidently_over(6.0 * 1_001.0, 0.05, 2_000.0, 1_001));
        // Five operations of 51 in a window where 4.9 were due: chance.
        assert!(!confidently_over(5.0 * 51.0, 0.25, 1_000.0, 51));
        assert!(!confidently_over(1.0, 0.0, 1_000.0, 1));
    }

    #[test]
    fn the_guards_alpha_is_the_normal_laws_tail_at_its_sigmas() {
        let tail = crate::agent::normal_tail(GUARD_SIGMAS);
        assert!((GUARD_ALPHA / tail - 1.0).abs() < 1e-3, "{tail}");
    }

    #[test]
    fn a_burst_of_costly_operations_is_no_deluge() {
        // Two publishes to 1 000 subscribers a microsecond apart.
        assert!(!closes_early(2_002.0, 1e-6, 1_000.0, 0.25, 1_001));
        // A hundred a second for 60 ms: six, a deluge.
        assert!(closes_early(6_006.0, 0.06, 1_000.0, 0.25, 1_001));
    }

    #[test]
    fn bursts_under_the_limit_close_no_window_early_and_a_deluge_does() {
        // Three bursts of 95 within 200 ms: past the allowance of 250, but
        // 1 330/s is 4.6σ over 1 000/s, and far from 2 000/s.
        assert!(!confidently_over(266.0, 0.2, 1_000.0, 1));
        assert!(confidently_over(280.0, 0.2, 1_000.0, 1));
        assert!(!closes_early(266.0, 0.2, 1_000.0, 0.25, 1));
        // A deluge's first 251 within 50 ms.
        assert!(closes_early(251.0, 0.05, 1_000.0, 0.25, 1));
        // Fast, but not past a whole window's allowance yet.
        assert!(!closes_early(249.0, 0.01, 1_000.0, 0.25, 1));
    }

    /// Over counts small and large, more cost over the same span is never
    /// less proof: the batch and the checks one by one agree on where a
    /// window closes.
    #[test]
    fn confidence_grows_with_the_count() {
        for (secs, limit, cost) in [
            (0.1, 1_000.0, 1),
            (0.25, 1_000.0, 51),
            (0.05, 2_000.0, 1_001),
        ] {
            let mut was = false;
            for ops in 1..400u32 {
                let is = confidently_over(f64::from(ops) * cost as f64, secs, limit, cost);
                assert!(is || !was, "{secs} {limit} {cost}: {ops}");
                was = is;
            }
            assert!(was);
        }
    }
}
