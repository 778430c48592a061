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
//! operations of cost `c` over `t` seconds read `n·c/t ± √n·c/t`. Costs
//! that differ scatter as the sum of their squares: `c` is the window's
//! effective cost ([`effective_cost`]), from its operations, counted
//! beside its cost, and what is known of the pair's costs ([`CostBounds`]:
//! read when a window closes over its limit, not on every check); a
//! window of fewer than 50 operations
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

/// What is known of the costs of a pair's operations: each costs at least
/// `least`, and at most `costliest` when that is known. The scans learn
/// them (the quantum's divisor while costs look alike; the costliest seen
/// once they differ), and a rollup states the costliest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostBounds {
    /// The least an operation costs (at least 1).
    pub least: u64,
    /// The most one costs, when known.
    pub costliest: Option<u64>,
}

impl CostBounds {
    /// Costs of at least 1 and at most `costliest`.
    pub fn up_to(costliest: u64) -> CostBounds {
        CostBounds {
            least: 1,
            costliest: Some(costliest.max(1)),
        }
    }
}

/// What one operation of a window of `used` cost in `ops` operations
/// weighs for its chance scatter: a bound on their sum of squares over
/// `used`.
///
/// Each cost `c` between `q` (the least) and `s` (the costliest) has `c² ≤
/// c·(s + q) − s·q`, so the squares are at most `used × (s + q) − ops × s
/// × q`, exactly for two costs; and, whatever the costliest, at most those
/// of one operation holding all the cost the others leave, `(used − (ops −
/// 1)·q)² + (ops − 1)·q²`, which is all there is to go on while the
/// costliest is not known. The smaller bound stands: operations all of
/// one cost weigh that cost. When the count says nothing (none, or more
/// operations than cost), the costliest (or the least, not knowing it).
///
/// An account of publishes of 51 and cheap operations at 0.95× of its
/// limit from one node, weighed by the cost of the cheap operation that
/// closed its window, was a count of a few hundred operations of 1 that
/// chance does not move, and was refused in every other second, 4% of its
/// cost (`mixed-costs` on one agent, all of 200 seeds); its windows weigh
/// 26 each. One publish to 1 000 subscribers among cheap operations, on
/// an agent that had not seen one before, weighs as itself. The master
/// weighs a report's operations by the same bound (`Spread::note_ops`).
pub fn effective_cost(used: f64, ops: f64, bounds: CostBounds) -> f64 {
    let q = bounds.least.max(1) as f64;
    let fallback = bounds.costliest.map_or(q, |s| s.max(1) as f64);
    if ops < 1.0 || ops > used {
        return fallback;
    }
    // A least the count belies (its operations cost less on average)
    // bounds nothing.
    let q = q.min(used / ops).max(1.0);
    let rest = used - (ops - 1.0) * q;
    let mut squares = rest * rest + (ops - 1.0) * q * q;
    if let Some(s) = bounds.costliest.map(|s| s as f64)
        && s >= q
        && used <= ops * s
    {
        squares = squares.min(used * (s + q) - ops * s * q);
    }
    (squares / used).clamp(1.0, used)
}

/// Whether `used` cost attempted over `secs` seconds, by operations that
/// weigh `unit` each ([`effective_cost`]; their one cost, when it is one),
/// is over `limit` cost per second beyond chance: a count that high, were
/// the rate `limit`, would come less often than [`GUARD_SIGMAS`] standard
/// deviations of the normal law.
///
/// A window begins with the operation whose check opened it, which is no
/// chance arrival within it: `first`, the cost of the operation being
/// decided, stands for it, and is not counted. (Counted, a costly account
/// at 0.95× of its limit from one node, one operation of 1 001 a second,
/// had a second within a few milliseconds of a window's first now and
/// then, and was refused an operation every few minutes.)
pub(super) fn confidently_over(used: f64, secs: f64, limit: f64, first: u64, unit: f64) -> bool {
    let unit = unit.max(1.0);
    secs > 0.0
        && beyond_chance(
            (used - first.max(1) as f64) / unit,
            limit * secs / unit,
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
/// weighed over at least [`EARLY_SPAN_SHARE`] of the window (`first` and
/// `unit` as for [`confidently_over`]).
pub(super) fn closes_early(
    used: f64,
    secs: f64,
    limit: f64,
    window_secs: f64,
    first: u64,
    unit: f64,
) -> bool {
    let secs = secs.max(EARLY_SPAN_SHARE * window_secs);
    used > limit * window_secs
        && confidently_over(used, secs, EARLY_CLOSE_RATIO * limit, first, unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chance_near_the_limit_is_not_confidence() {
        // 0.95× of 1 000/s over 250 ms reads 1 100/s (+2.4σ): no.
        assert!(!confidently_over(275.0, 0.25, 1_000.0, 1, 1.0));
        // A deluge's first early close: 251 over 100 ms.
        assert!(confidently_over(251.0, 0.1, 1_000.0, 1, 1.0));
        // Costly operations (1 001 each) at 100 a second against 2 000/s:
        // three are chance, six are proof (the first opened the window;
        // 0.1 more were due).
        assert!(!confidently_over(
            3.0 * 1_001.0,
            0.03,
            2_000.0,
            1_001,
            1_001.0
        ));
        assert!(confidently_over(
            6.0 * 1_001.0,
            0.05,
            2_000.0,
            1_001,
            1_001.0
        ));
        // Five operations of 51 in a window where 4.9 were due: chance.
        assert!(!confidently_over(5.0 * 51.0, 0.25, 1_000.0, 51, 51.0));
        assert!(!confidently_over(1.0, 0.0, 1_000.0, 1, 1.0));
    }

    /// Publishes of 51 and cheap operations at 0.95× of 3 000/s over a
    /// 250-ms window (7.1 publishes and 356 cheap ones, 719 cost): weighed
    /// as operations of 1, a window of 900 (+0.25 of them: one time in ten)
    /// was proof; weighed as their mix, only what chance does not give.
    #[test]
    fn a_window_of_mixed_costs_is_weighed_by_its_costs_squares() {
        let unit = effective_cost(719.0, 363.0, CostBounds::up_to(51));
        let squares = 356.0 + 7.0 * 51.0 * 51.0;
        assert!((unit - squares / 713.0).abs() < 1.0, "{unit}");
        assert!(confidently_over(900.0, 0.25, 3_000.0, 1, 1.0));
        assert!(!confidently_over(900.0, 0.25, 3_000.0, 1, unit));
        // A deluge of the same mix still is.
        assert!(confidently_over(4_000.0, 0.25, 3_000.0, 1, unit));
        // One cost: its own; a count that says nothing: the costliest.
        let up_to_51 = CostBounds::up_to(51);
        assert_eq!(effective_cost(510.0, 10.0, up_to_51), 51.0);
        assert_eq!(effective_cost(300.0, 300.0, up_to_51), 1.0);
        assert_eq!(effective_cost(510.0, 0.0, up_to_51), 51.0);
        assert_eq!(effective_cost(5.0, 9.0, up_to_51), 51.0);
    }

    /// A 250-ms window of 300 cheap operations and one publish to 1 000
    /// subscribers (1 300 cost, 5 200/s against 3 000/s), on an agent that
    /// never saw such a publish (costs of at least 1, the costliest not
    /// known): weighed as a count of 1 300 operations of 1 it was a
    /// deluge; one operation may hold 1 000 of its cost, and so weighed
    /// it is chance. Costs all alike still weigh their cost, and a
    /// deluge of cheap operations is still one.
    #[test]
    fn a_window_whose_costliest_is_not_known_is_weighed_by_its_largest_possible_lump() {
        let unknown = CostBounds {
            least: 1,
            costliest: None,
        };
        let unit = effective_cost(1_300.0, 301.0, unknown);
        assert!(
            (unit - (1_000.0f64.powi(2) + 300.0) / 1_300.0).abs() < 1e-6,
            "{unit}"
        );
        assert!(confidently_over(1_300.0, 0.25, 3_000.0, 1, 1.0));
        assert!(!confidently_over(1_300.0, 0.25, 3_000.0, 1, unit));
        assert_eq!(effective_cost(300.0, 300.0, unknown), 1.0);
        let alike = CostBounds {
            least: 51,
            costliest: None,
        };
        assert_eq!(effective_cost(510.0, 10.0, alike), 51.0);
        let deluge = effective_cost(4_000.0, 4_000.0, unknown);
        assert!(confidently_over(4_000.0, 0.25, 3_000.0, 1, deluge));
        // Known, the costliest bounds it as before; and the smaller bound
        // stands (90 operations of 100 cost hold no 51).
        let up_to_51 = CostBounds::up_to(51);
        assert!((effective_cost(100.0, 90.0, up_to_51) - 2.1).abs() < 1e-9);
    }

    #[test]
    fn the_guards_alpha_is_the_normal_laws_tail_at_its_sigmas() {
        let tail = crate::agent::normal_tail(GUARD_SIGMAS);
        assert!((GUARD_ALPHA / tail - 1.0).abs() < 1e-3, "{tail}");
    }

    #[test]
    fn a_burst_of_costly_operations_is_no_deluge() {
        // Two publishes to 1 000 subscribers a microsecond apart.
        assert!(!closes_early(2_002.0, 1e-6, 1_000.0, 0.25, 1_001, 1_001.0));
        // A hundred a second for 60 ms: six, a deluge.
        assert!(closes_early(6_006.0, 0.06, 1_000.0, 0.25, 1_001, 1_001.0));
    }

    #[test]
    fn bursts_under_the_limit_close_no_window_early_and_a_deluge_does() {
        // Three bursts of 95 within 200 ms: past the allowance of 250, but
        // 1 330/s is 4.6σ over 1 000/s, and far from 2 000/s.
        assert!(!confidently_over(266.0, 0.2, 1_000.0, 1, 1.0));
        assert!(confidently_over(280.0, 0.2, 1_000.0, 1, 1.0));
        assert!(!closes_early(266.0, 0.2, 1_000.0, 0.25, 1, 1.0));
        // A deluge's first 251 within 50 ms.
        assert!(closes_early(251.0, 0.05, 1_000.0, 0.25, 1, 1.0));
        // Fast, but not past a whole window's allowance yet.
        assert!(!closes_early(249.0, 0.01, 1_000.0, 0.25, 1, 1.0));
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
                let is =
                    confidently_over(f64::from(ops) * cost as f64, secs, limit, cost, cost as f64);
                assert!(is || !was, "{secs} {limit} {cost}: {ops}");
                was = is;
            }
            assert!(was);
        }
    }
}
