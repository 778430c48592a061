use super::*;
use crate::MAX_NAME_LEN;
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::sync::Arc;

/// `ms` milliseconds into a test's virtual time.
pub(super) fn t(ms: u64) -> Nanos {
    Nanos::from_millis(1_700_000_000_000 + ms)
}

/// Drains at an instant past every factor's validity.
fn drained(agent: &AgentState) -> Vec<(String, String, Delta)> {
    drained_at(agent, t(1_000_000_000))
}

fn drained_at(agent: &AgentState, now: Nanos) -> Vec<(String, String, Delta)> {
    let mut out = Vec::new();
    agent.drain(now, |a, o, d| out.push((a.to_owned(), o.to_owned(), d)));
    out.sort_by(|x, y| (&x.0, &x.1).cmp(&(&y.0, &y.1)));
    out
}

/// An agent whose master answered for `acme` on `messages` with no
/// suppression under a limit of 1 000/s, valid for `valid_for`: its local
/// guard knows the limit.
fn answered_under_1000(valid_for: Duration) -> AgentState {
    let agent = AgentState::new(AgentConfig::default());
    agent.apply(t(0), "acme", "messages", 0.0, 1_000.0, valid_for);
    agent
}

#[test]
fn unknown_pairs_are_admitted_and_counted() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    for _ in 0..10 {
        assert_eq!(
            agent.check(t(0), "acme", "messages", 1001, &mut rng),
            Decision::Admit(Admitted::PLAIN)
        );
    }
    assert!(
        agent
            .check(t(0), "acme", "presence", 1, &mut rng)
            .is_admit()
    );
    let d = drained(&agent);
    assert_eq!(d.len(), 2);
    assert_eq!(d[0].1, "messages");
    assert_eq!(
        (d[0].2.attempted, d[0].2.admitted, d[0].2.since),
        (10_010, 10_010, None)
    );
    assert_eq!((d[1].2.attempted, d[1].2.admitted), (1, 1));
    // Each tells what one of its operations costs, as its first showed;
    // a cost of 1 goes unsaid.
    assert_eq!((d[0].2.op_cost, d[1].2.op_cost), (1001, 0));
    // And how many operations each counted.
    assert_eq!((d[0].2.ops, d[1].2.ops), (10, 1));
}

/// A pair whose scans know of no cost above 1 (its first operations were
/// cheap, and its youth is over) tells, of a delta whose cost is more than
/// its operations, the most one of them can cost: a rare publish to 4 000
/// subscribers among cheap operations is not told as nothing, which the
/// master read as a count of operations of 1. A delta of cheap ones alone
/// tells nothing still.
#[test]
fn a_delta_dearer_than_its_operations_tells_the_most_one_can_cost() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    let at = |ms: u64| Nanos::from_millis(1_000_000 + ms);
    agent.check(at(0), "acme", "messages", 1, &mut rng);
    // Past its youth (no limit known: by the time its windows would take).
    agent.check(at(5_000), "acme", "messages", 1, &mut rng);
    agent.check(at(5_001), "acme", "messages", 4_001, &mut rng);
    for _ in 0..9 {
        agent.check(at(5_002), "acme", "messages", 1, &mut rng);
    }
    let d = drained_at(&agent, at(6_000));
    assert_eq!((d[0].2.attempted, d[0].2.ops), (4_012, 12));
    assert_eq!(d[0].2.op_cost, 4_001);
    for _ in 0..5 {
        agent.check(at(6_500), "acme", "messages", 1, &mut rng);
    }
    let d = drained_at(&agent, at(7_000));
    assert_eq!((d[0].2.attempted, d[0].2.op_cost), (5, 0));
}

#[test]
fn zero_cost_and_unreportable_names_are_admitted_uncounted() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    let long = "a".repeat(MAX_NAME_LEN + 1);
    agent.apply(t(0), "acme", "messages", 1.0, 10.0, Duration::from_secs(60));
    assert!(
        agent
            .check(t(0), "acme", "messages", 0, &mut rng)
            .is_admit()
    );
    assert!(agent.check(t(0), "", "messages", 5, &mut rng).is_admit());
    assert!(agent.check(t(0), "acme", "", 5, &mut rng).is_admit());
    assert!(agent.check(t(0), &long, "messages", 5, &mut rng).is_admit());
    agent.apply(t(0), "", "messages", 1.0, 10.0, Duration::from_secs(60));
    assert_eq!(agent.len(), 1, "only the valid pair the master named");
    assert!(drained(&agent).is_empty());
}

/// An agent numbers at most `MAX_OPS` ops: the pairs of ops past them are
/// admitted and not counted, as unreportable names are, and the ops it
/// knows are tracked as before. Long accounts (past the slot's inline
/// bytes) are tracked like short ones.
#[test]
fn ops_past_the_most_are_admitted_uncounted() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    for i in 0..super::table::MAX_OPS {
        assert!(
            agent
                .check(t(0), "acme", &format!("op-{i}"), 1, &mut rng)
                .is_admit()
        );
    }
    assert_eq!(agent.len(), super::table::MAX_OPS);
    assert!(
        agent
            .check(t(0), "acme", "one-more", 5, &mut rng)
            .is_admit()
    );
    agent.apply(t(0), "acme", "one-more", 1.0, 10.0, Duration::from_secs(60));
    assert!(
        agent
            .check(t(0), "acme", "one-more", 5, &mut rng)
            .is_admit()
    );
    assert_eq!(agent.len(), super::table::MAX_OPS);
    let long = "a".repeat(MAX_NAME_LEN);
    agent.check(t(0), &long, "op-7", 3, &mut rng);
    let drained = drained(&agent);
    assert_eq!(drained.len(), super::table::MAX_OPS + 1);
    assert!(drained.iter().all(|(_, op, _)| op != "one-more"));
    assert!(
        drained
            .iter()
            .any(|(a, op, d)| *a == long && op == "op-7" && d.attempted == 3)
    );
}

#[test]
fn rejects_with_the_masters_probability() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(42);
    let valid = Duration::from_secs(6);
    for factor in [0.0, 0.1, 0.5, 0.9, 1.0] {
        agent.apply(t(0), "acme", "messages", factor, 1e12, valid);
        let n = 100_000;
        let rejected = (0..n)
            .filter(|_| {
                !agent
                    .check(t(1), "acme", "messages", 1, &mut rng)
                    .is_admit()
            })
            .count();
        let share = rejected as f64 / n as f64;
        // 100 000 draws: the standard error is at most 0.0016.
        assert!(
            (share - factor).abs() < 0.01,
            "factor {factor}: rejected {share}"
        );
        if factor == 0.0 || factor == 1.0 {
            assert_eq!(share, factor, "0 and 1 are exact");
        }
    }
}

#[test]
fn a_rejection_says_why_and_when_to_retry() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    agent.apply(t(0), "acme", "messages", 1.0, 500.0, Duration::from_secs(6));
    match agent.check(t(10), "acme", "messages", 3, &mut rng) {
        Decision::Reject(r) => {
            assert_eq!(r.factor, 1.0);
            assert_eq!(r.source, RejectSource::Master);
            assert_eq!(r.limit, 500.0);
            assert_eq!(r.retry_after, Duration::from_secs(2));
            assert!((r.demand - 500_000.0).abs() < 1e-3, "{}", r.demand);
        }
        other => panic!("{other:?}"),
    }
    // Rejected cost is attempted, not admitted.
    let d = drained(&agent);
    assert_eq!((d[0].2.attempted, d[0].2.admitted), (3, 0));
    // A factor of 0.75 under a limit of 500 says 2 000 attempted a second.
    agent.apply(
        t(20),
        "acme",
        "messages",
        0.75,
        500.0,
        Duration::from_secs(6),
    );
    let demand = (0..200)
        .find_map(
            |_| match agent.check(t(30), "acme", "messages", 1, &mut rng) {
                Decision::Reject(r) => Some(r.demand),
                _ => None,
            },
        )
        .unwrap();
    assert!((demand - 2_000.0).abs() < 1e-6, "{demand}");
}

#[test]
fn expired_factors_fail_open() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    agent.apply(t(0), "acme", "messages", 1.0, 1e12, Duration::from_secs(6));
    assert!(
        !agent
            .check(t(5_999), "acme", "messages", 1, &mut rng)
            .is_admit()
    );
    assert_eq!(agent.factor(t(5_999), "acme", "messages"), Some(1.0));
    assert!(
        agent
            .check(t(6_000), "acme", "messages", 1, &mut rng)
            .is_admit()
    );
    assert_eq!(agent.factor(t(6_000), "acme", "messages"), Some(0.0));
    // A fresh reply takes over again.
    agent.apply(
        t(7_000),
        "acme",
        "messages",
        1.0,
        1e12,
        Duration::from_secs(6),
    );
    assert!(
        !agent
            .check(t(7_001), "acme", "messages", 1, &mut rng)
            .is_admit()
    );
}

#[test]
fn lapsed_factors_are_counted_once_each() {
    let agent = AgentState::new(AgentConfig::default());
    let six = Duration::from_secs(6);
    agent.apply(t(0), "acme", "messages", 0.5, 1e3, six);
    agent.apply(t(0), "calm", "messages", 0.0, 1e3, six);
    assert_eq!(agent.expired_factors(t(5_999)), 0);
    // Only the positive factor lapsing changes a decision: one event.
    assert_eq!(agent.expired_factors(t(6_000)), 1);
    assert_eq!(agent.expired_factors(t(9_000)), 0, "counted once");
    // Refreshed, then lapsed again: a new event.
    agent.apply(t(10_000), "acme", "messages", 0.5, 1e3, six);
    assert_eq!(agent.expired_factors(t(12_000)), 0);
    assert_eq!(agent.expired_factors(t(16_000)), 1);
}

#[test]
fn fail_static_ops_hold_the_last_factor_for_a_bounded_time() {
    let agent = AgentState::new(AgentConfig::default())
        .with_fail_static("messages", Duration::from_secs(30));
    let mut rng = SmallRng::seed_from_u64(3);
    let six = Duration::from_secs(6);
    agent.apply(t(0), "acme", "messages", 1.0, 1e12, six);
    agent.apply(t(0), "acme", "presence", 1.0, 1e12, six);
    // Past the validity: `presence` fails open, `messages` holds.
    assert!(
        agent
            .check(t(10_000), "acme", "presence", 1, &mut rng)
            .is_admit()
    );
    assert!(
        !agent
            .check(t(10_000), "acme", "messages", 1, &mut rng)
            .is_admit()
    );
    assert_eq!(agent.factor(t(35_999), "acme", "messages"), Some(1.0));
    assert_eq!(agent.expired_factors(t(35_999)), 1, "presence only");
    // The hold is bounded: then it fails open too.
    assert!(
        agent
            .check(t(36_000), "acme", "messages", 1, &mut rng)
            .is_admit()
    );
    assert_eq!(agent.expired_factors(t(36_000)), 1);
}

#[test]
fn bad_factors_from_a_reply_are_clamped() {
    let agent = AgentState::new(AgentConfig::default());
    let v = Duration::from_secs(6);
    agent.apply(t(0), "a", "m", f64::NAN, f64::NAN, v);
    assert_eq!(agent.factor(t(1), "a", "m"), Some(0.0));
    agent.apply(t(0), "a", "m", 7.0, -1.0, v);
    assert_eq!(agent.factor(t(1), "a", "m"), Some(1.0));
    agent.apply(t(0), "a", "m", -7.0, f64::INFINITY, v);
    assert_eq!(agent.factor(t(1), "a", "m"), Some(0.0));
}

#[test]
fn local_guard_catches_a_single_node_flood_within_a_fraction_of_a_second() {
    // The master knows the limit (1000/s) but has not seen the flood yet.
    let agent = answered_under_1000(Duration::from_secs(60));
    let mut rng = SmallRng::seed_from_u64(9);
    // 10 000 ops/s, one every 100 µs, for 2 s.
    let mut per_window = [(0u32, 0u32); 8];
    for i in 0..20_000u64 {
        let now = Nanos::from_nanos(t(0).as_nanos() + i * 100_000);
        let admit = agent.check(now, "acme", "messages", 1, &mut rng);
        let w = (i / 2_500) as usize; // 250 ms windows
        per_window[w].0 += 1;
        if let Decision::Reject(r) = admit {
            assert_eq!(r.source, RejectSource::LocalGuard);
            assert!((r.factor - 0.9).abs() < 0.01, "{r:?}");
            per_window[w].1 += 1;
        }
    }
    // The first window closes early, once this agent alone has attempted
    // the 250 the limit allows in a whole window: 25 ms in, not 250.
    let first = f64::from(per_window[0].1) / f64::from(per_window[0].0);
    assert!((0.78..0.84).contains(&first), "first window: {first}");
    for (w, (n, rejected)) in per_window.iter().enumerate().skip(1) {
        let share = f64::from(*rejected) / f64::from(*n);
        assert!((share - 0.9).abs() < 0.03, "window {w}: {share}");
    }
}

#[test]
fn local_guard_stays_out_of_the_way_under_the_limit() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(9);
    agent.apply(
        t(0),
        "acme",
        "messages",
        0.0,
        1_000.0,
        Duration::from_secs(60),
    );
    // 900 cost per second, as 9 ops of cost 100 per second.
    for i in 0..90u64 {
        let now = Nanos::from_nanos(t(0).as_nanos() + i * 111_111_111);
        assert!(
            agent
                .check(now, "acme", "messages", 100, &mut rng)
                .is_admit(),
            "op {i}"
        );
    }
}

/// An account that keeps to 0.95× of its limit from one node, Poisson, in
/// bursts of 95 every 100 ms, or in operations of cost 1 001: its 250-ms
/// windows read over the limit by chance one time in five, by a burst's
/// timing, or by one operation spending a window's allowance, and the
/// guard refused 0.8%, 11% and a third of it; weighed by their counting noise,
/// and closing early only for a deluge, they refuse nothing. A 1.5×
/// overload from the same node is still refused, over whole windows.
#[test]
fn local_guard_refuses_nothing_of_an_account_just_under_its_limit() {
    let refused_of = |arrivals: &dyn Fn(u64) -> u64, seconds: u64, cost: u64| {
        let agent = answered_under_1000(Duration::from_secs(3_600));
        let mut rng = SmallRng::seed_from_u64(11);
        let mut refused = 0;
        for ms in 0..seconds * 1_000 {
            for _ in 0..arrivals(ms) {
                if !agent
                    .check(t(ms), "acme", "messages", cost, &mut rng)
                    .is_admit()
                {
                    refused += 1;
                }
            }
        }
        refused
    };
    let refused = |arrivals: &dyn Fn(u64) -> u64, seconds: u64| refused_of(arrivals, seconds, 1);
    // Poisson at 950/s, 1-ms steps: draws from a fixed sequence.
    let mut draws = SmallRng::seed_from_u64(3);
    let poisson: Vec<u64> = (0..60_000)
        .map(|_| {
            let (limit, mut k, mut p) = ((-0.95f64).exp(), 0, draws.random::<f64>());
            while p > limit {
                k += 1;
                p *= draws.random::<f64>();
            }
            k
        })
        .collect();
    assert_eq!(
        refused(&|ms| poisson[ms as usize], 60),
        0,
        "Poisson at 0.95×"
    );
    assert_eq!(
        refused(&|ms| u64::from(ms % 100 == 0) * 95, 60),
        0,
        "bursts at 0.95×"
    );
    // Publishes to 1 000 subscribers (cost 1 001), 0.95 a second: a window
    // holds one or none, and one alone spent the window's allowance; the
    // guard refused a third of them (94 of these 275).
    let costly: Vec<u64> = (0..300_000)
        .map(|_| u64::from(draws.random::<f64>() < 0.95e-3))
        .collect();
    let sent: u64 = costly.iter().sum();
    let refused_costly = refused_of(&|ms| costly[ms as usize], 300, 1_001);
    assert_eq!(
        refused_costly, 0,
        "cost 1 001 at 0.95×: {refused_costly} of {sent}"
    );
    // The same in threes a microsecond apart, one three every 3.16 s (a
    // client that publishes three at once): weighed over those
    // microseconds, three read as a deluge.
    let agent = answered_under_1000(Duration::from_secs(3_600));
    let mut rng = SmallRng::seed_from_u64(12);
    let mut threes_refused = 0;
    for ms in (0..300_000u64).step_by(3_160) {
        for us in 0..3 {
            let at = t(ms) + Duration::from_micros(us);
            if !agent
                .check(at, "acme", "messages", 1_001, &mut rng)
                .is_admit()
            {
                threes_refused += 1;
            }
        }
    }
    assert_eq!(threes_refused, 0, "cost 1 001 at 0.95×, in threes");
    let over = refused(&|ms| u64::from(ms % 2 == 0) * 3, 20);
    assert!(
        (8_000..12_000).contains(&over),
        "1.5×: a third refused: {over}"
    );
}

/// An agent that saw the last of a deluge and then nothing keeps telling
/// its master so, with zero reports, while the factor is in force: the
/// reply that lifts it comes a round later, not when it expires.
#[test]
fn quiet_pairs_under_a_factor_report_zeros_until_it_is_lifted() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    agent.check(t(0), "acme", "messages", 5, &mut rng);
    agent.apply(
        t(0),
        "acme",
        "messages",
        0.8,
        1000.0,
        Duration::from_secs(6),
    );
    assert_eq!(drained_at(&agent, t(1_000))[0].2.attempted, 5);
    for now in [t(2_000), t(3_000), t(4_000)] {
        let d = drained_at(&agent, now);
        assert_eq!(d.len(), 1, "a zero report while suppressed");
        assert_eq!((d[0].2.attempted, d[0].2.admitted), (0, 0));
    }
    agent.apply(
        t(4_000),
        "acme",
        "messages",
        0.0,
        1000.0,
        Duration::from_secs(6),
    );
    assert!(drained_at(&agent, t(5_000)).is_empty());
    // A factor that lapsed (its master gone) is not reported for.
    agent.apply(
        t(5_000),
        "acme",
        "messages",
        0.8,
        1000.0,
        Duration::from_secs(6),
    );
    assert_eq!(drained_at(&agent, t(6_000)).len(), 1);
    assert!(drained_at(&agent, t(12_000)).is_empty());
}

#[test]
fn quiet_pairs_report_one_zero_then_nothing() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    agent.check(t(0), "acme", "messages", 5, &mut rng);
    assert_eq!(drained(&agent)[0].2.attempted, 5);
    let d = drained(&agent);
    assert_eq!(d.len(), 1, "one zero report");
    assert_eq!((d[0].2.attempted, d[0].2.admitted), (0, 0));
    assert!(drained(&agent).is_empty());
}

#[test]
fn undrained_counts_come_back_with_their_start() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    agent.check(t(0), "acme", "messages", 5, &mut rng);
    let first = drained(&agent);
    // The rollup covering [t(0), t(2000)) failed: put it back.
    agent.undrain("acme", "messages", first[0].2, t(0));
    agent.check(t(2_500), "acme", "messages", 7, &mut rng);
    let second = drained(&agent);
    assert_eq!((second[0].2.attempted, second[0].2.ops), (12, 2));
    assert_eq!(second[0].2.since, Some(t(0)));
    // Delivered: the next drain starts afresh.
    agent.check(t(4_500), "acme", "messages", 1, &mut rng);
    let third = drained(&agent);
    assert_eq!((third[0].2.attempted, third[0].2.since), (1, None));
    assert_eq!(third[0].2.ops, 1);
}

#[test]
fn counts_carried_over_failed_rollups_stop_at_two_to_the_31_cost() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    agent.check(t(0), "acme", "messages", 5, &mut rng);
    let first = drained(&agent);
    // Failed rollups put back far more than the cost fields can tell
    // from a wrap: what fits is kept, the rest lost, not all of it.
    let huge = Delta {
        attempted: 3 << 30,
        admitted: 1 << 30,
        ops: 7,
        ..first[0].2
    };
    agent.undrain("acme", "messages", huge, t(0));
    agent.undrain("acme", "messages", huge, t(0));
    agent.check(t(2_500), "acme", "messages", 3, &mut rng);
    let second = drained(&agent);
    let d = second[0].2;
    assert_eq!(
        d.admitted,
        (1 << 31) + 3,
        "two of 2^30 kept whole, then the new 3"
    );
    assert_eq!(
        d.attempted - d.admitted,
        1 << 31,
        "two of 2^31 rejected: the first kept"
    );
    assert_eq!((d.ops, d.since), (15, Some(t(0))));
    // Delivered: the next drain starts afresh.
    agent.check(t(4_500), "acme", "messages", 1, &mut rng);
    assert_eq!(drained(&agent)[0].2.attempted, 1);
}

/// An agent that forgets a pair after three idle drains of 2 s.
fn forgetful() -> AgentState {
    AgentState::new(AgentConfig {
        forget_after: Duration::from_secs(6),
        ..AgentConfig::default()
    })
}

#[test]
fn idle_pairs_are_forgotten_and_come_back_as_new() {
    let agent = forgetful();
    let mut rng = SmallRng::seed_from_u64(1);
    agent.check(t(0), "acme", "messages", 5, &mut rng);
    agent.check(t(0), "busy", "messages", 5, &mut rng);
    assert_eq!(drained(&agent).len(), 2);
    // acme goes quiet; busy does not.
    for round in 1..=3 {
        agent.check(t(round * 2_000), "busy", "messages", 1, &mut rng);
        drained(&agent);
        let forgotten = agent.forget_idle(t(round * 2_000));
        assert_eq!(forgotten, usize::from(round == 3), "round {round}");
    }
    assert_eq!(agent.len(), 1);
    assert_eq!(agent.factor(t(6_000), "acme", "messages"), None);
    // Back: a new entry, counted from scratch and reported as usual.
    agent.check(t(8_000), "acme", "messages", 9, &mut rng);
    let d = drained(&agent);
    assert_eq!(d[0].0, "acme");
    assert_eq!(
        (d[0].2.attempted, d[0].2.admitted, d[0].2.since),
        (9, 9, None)
    );
}

#[test]
fn pairs_holding_a_factor_or_counts_are_kept() {
    let agent = forgetful();
    let mut rng = SmallRng::seed_from_u64(1);
    agent.apply(
        t(0),
        "suppressed",
        "messages",
        0.5,
        10.0,
        Duration::from_secs(20),
    );
    for account in ["suppressed", "counted", "carried"] {
        agent.check(t(0), account, "messages", 5, &mut rng);
    }
    let first = drained(&agent);
    let carried = first.iter().find(|d| d.0 == "carried").unwrap().2;
    for _ in 0..4 {
        drained(&agent);
    }
    // A failed rollup put back, and a check after the last drain.
    agent.undrain("carried", "messages", carried, t(0));
    agent.check(t(8_000), "counted", "messages", 1, &mut rng);
    assert_eq!(agent.forget_idle(t(8_000)), 0);
    assert_eq!(agent.len(), 3);
    // The factor lapses and the counts go: then all three are forgotten.
    let d = drained(&agent);
    assert_eq!(d.len(), 2, "{d:?}");
    for _ in 0..4 {
        drained(&agent);
    }
    assert_eq!(agent.forget_idle(t(20_000)), 3);
    assert!(agent.is_empty());
}

#[test]
fn a_check_that_lands_in_a_forgotten_entry_is_counted_in_the_new_one() {
    let agent = forgetful();
    let mut rng = SmallRng::seed_from_u64(1);
    agent.check(t(0), "acme", "messages", 5, &mut rng);
    for _ in 0..4 {
        drained(&agent);
    }
    // A check found the entry, then the forget ran before it counted.
    let pinned = agent.pairs.pin();
    let stale = pinned.find("acme", "messages").unwrap();
    assert_eq!(agent.forget_idle(t(8_000)), 1);
    agent.count(
        t(8_000),
        "acme",
        "messages",
        stale,
        true,
        tally(7, 1),
        &pinned,
    );
    agent.count(
        t(8_000),
        "acme",
        "messages",
        stale,
        false,
        tally(3, 1),
        &pinned,
    );
    drop(pinned);
    let d = drained(&agent);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].2.attempted, d[0].2.admitted, d[0].2.ops), (10, 7, 2));
}

#[test]
fn operations_that_wrap_their_field_are_drained_exactly_and_never_mark_the_counter_retired() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    agent.check(t(0), "acme", "messages", 3, &mut rng);
    assert_eq!(drained(&agent)[0].2.ops, 1);
    // As many operations as the field holds (2^30 − 1), on top of the one
    // drained: it wraps into its overflow bit.
    let pinned = agent.pairs.pin();
    let entry = pinned.find("acme", "messages").unwrap();
    let most = u64::from(counter::OPS_MASK);
    agent.count(
        t(1),
        "acme",
        "messages",
        entry,
        true,
        tally(most - 2, most - 2),
        &pinned,
    );
    agent.count(t(1), "acme", "messages", entry, true, tally(2, 2), &pinned);
    assert_ne!(entry.admitted.load(Relaxed) & counter::OVERFLOW, 0);
    let d = drained(&agent);
    assert_eq!((d[0].2.attempted, u64::from(d[0].2.ops)), (most, most));
    // The drain cleared the carry: 2^30 more cannot reach the retired mark.
    assert_eq!(entry.admitted.load(Relaxed) & counter::OVERFLOW, 0);
    agent.count(
        t(1),
        "acme",
        "messages",
        entry,
        true,
        tally(most, most),
        &pinned,
    );
    agent.count(t(1), "acme", "messages", entry, true, tally(1, 1), &pinned);
    assert_eq!(entry.admitted.load(Relaxed) & RETIRED, 0);
    drop(pinned);
    // 2^30 operations between two drains are past what the field tells
    // apart from none (the documented bound).
    let d = drained(&agent);
    assert_eq!((d[0].2.attempted, d[0].2.ops), (most + 1, 0));
}

#[test]
fn a_zero_report_put_back_after_its_pair_was_forgotten_is_sent_again() {
    let agent = forgetful();
    let mut rng = SmallRng::seed_from_u64(1);
    agent.check(t(0), "acme", "messages", 5, &mut rng);
    drained(&agent);
    let zero = drained(&agent);
    drained(&agent);
    drained(&agent);
    assert_eq!(agent.forget_idle(t(8_000)), 1);
    // The zero report's rollup failed, and is put back.
    agent.undrain("acme", "messages", zero[0].2, t(2_000));
    let again = drained(&agent);
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].2.attempted, again[0].2.since), (0, None));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Checks on two threads race drains on a third, with some drains
    /// failing and put back: every unit of cost, and every operation, is
    /// drained exactly once, and as its own account's (a forgotten pair's slot is made over for
    /// another pair, never under a check that still holds it).
    #[test]
    fn concurrent_checks_and_drains_lose_and_double_nothing(
        costs in proptest::collection::vec(1u64..5_000, 200..2_000),
        factor in 0.0f64..=1.0,
        fail_every in 2usize..6,
    ) {
        // Pairs are forgotten after one idle drain, while checks come back
        // to them: a check may race the forget of its pair.
        let agent = Arc::new(AgentState::new(AgentConfig {
            forget_after: Duration::from_millis(1),
            ..AgentConfig::default()
        }));
        agent.apply(t(0), "acct-0", "messages", factor, 1e12, Duration::from_secs(3600));
        let costs = Arc::new(costs);
        let workers: Vec<_> = (0..2u64)
            .map(|w| {
                let (agent, costs) = (agent.clone(), costs.clone());
                std::thread::spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(w);
                    let mut sums = [(0u64, 0u64, 0u32); 7];
                    for (i, &cost) in costs.iter().enumerate() {
                        // Runs of 8 on one account, so the others go idle.
                        let n = (i / 8) % 7;
                        let account = format!("acct-{n}");
                        sums[n].0 += cost;
                        sums[n].2 += 1;
                        if agent.check(t(1), &account, "messages", cost, &mut rng).is_admit() {
                            sums[n].1 += cost;
                        }
                    }
                    sums
                })
            })
            .collect();
        let mut got = [(0u64, 0u64, 0u32); 7];
        let mut drains = 0usize;
        let mut drain_once = |agent: &AgentState, may_fail: bool| {
            drains += 1;
            let mut batch = Vec::new();
            agent.drain(t(0), |a, o, d| batch.push((a.to_owned(), o.to_owned(), d)));
            for (a, o, d) in batch {
                if may_fail && drains.is_multiple_of(fail_every) {
                    agent.undrain(&a, &o, d, t(0));
                } else {
                    let n: usize = a["acct-".len()..].parse().unwrap();
                    got[n].0 += d.attempted;
                    got[n].1 += d.admitted;
                    got[n].2 += d.ops;
                }
            }
        };
        while workers.iter().any(|w| !w.is_finished()) {
            drain_once(&agent, true);
            agent.forget_idle(t(1));
        }
        let mut want = [(0u64, 0u64, 0u32); 7];
        for w in workers {
            for (n, (a, b, c)) in w.join().unwrap().into_iter().enumerate() {
                want[n].0 += a;
                want[n].1 += b;
                want[n].2 += c;
            }
        }
        // The node stops: a last drain that delivers.
        drain_once(&agent, false);
        // Once quiet, every pair but the one with a factor in force goes.
        drain_once(&agent, false);
        agent.forget_idle(t(1));
        prop_assert_eq!(got, want);
        prop_assert_eq!(agent.len(), 1);
    }
}

#[test]
fn a_zero_local_window_never_divides_by_zero() {
    let agent = AgentState::new(AgentConfig {
        local_window: Duration::ZERO,
        ..AgentConfig::default()
    });
    let mut rng = SmallRng::seed_from_u64(1);
    agent.apply(
        t(0),
        "acme",
        "messages",
        0.0,
        1_000.0,
        Duration::from_secs(60),
    );
    // Many checks at the same instant: no interval to measure a rate over.
    for _ in 0..1_000 {
        assert!(
            agent
                .check(t(0), "acme", "messages", u64::MAX / 4, &mut rng)
                .is_admit()
        );
    }
}

#[test]
fn a_lost_zero_report_is_sent_again_without_a_stale_start() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    agent.check(t(0), "acme", "messages", 5, &mut rng);
    assert_eq!(drained(&agent)[0].2.attempted, 5);
    // The zero report's rollup fails and is put back.
    let zero = drained(&agent);
    assert_eq!(zero[0].2.attempted, 0);
    agent.undrain("acme", "messages", zero[0].2, t(2_000));
    // It is sent again, still without a start of its own.
    let again = drained(&agent);
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].2.attempted, again[0].2.since), (0, None));
    assert!(drained(&agent).is_empty());
    // Much later, a burst reports the interval since the last drain,
    // not since the lost zero.
    agent.check(t(3_600_000), "acme", "messages", 9, &mut rng);
    let burst = drained(&agent);
    assert_eq!((burst[0].2.attempted, burst[0].2.since), (9, None));
}

#[test]
fn the_local_guard_fails_open_with_the_masters_factor() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(3);
    agent.apply(
        t(0),
        "acme",
        "messages",
        0.0,
        1_000.0,
        Duration::from_secs(1),
    );
    let mut rejected_before = 0;
    let mut rejected_after = 0;
    // 10 000 ops/s for 3 s; the master's reply is valid for the first second.
    for i in 0..30_000u64 {
        let now = Nanos::from_nanos(t(0).as_nanos() + i * 100_000);
        let admitted = agent.check(now, "acme", "messages", 1, &mut rng).is_admit();
        if i < 10_000 {
            rejected_before += u32::from(!admitted);
        } else {
            rejected_after += u32::from(!admitted);
        }
    }
    assert!(
        rejected_before > 5_000,
        "the guard works while the master is there"
    );
    assert_eq!(rejected_after, 0, "no master, no limit: fail open");
}

#[test]
fn a_batch_decides_like_single_checks() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(5);
    agent.apply(
        t(0),
        "acme",
        "messages",
        0.75,
        1e12,
        Duration::from_secs(60),
    );
    let admitted = agent.check_batch(t(1), "acme", "messages", 3, 100_000, &mut rng);
    let share = admitted as f64 / 100_000.0;
    assert!((share - 0.25).abs() < 0.01, "{share}");
    let d = drained(&agent);
    assert_eq!((d[0].2.attempted, d[0].2.admitted), (300_000, 3 * admitted));
    assert_eq!(
        d[0].2.ops, 100_000,
        "each of the batch's operations, counted"
    );
    // Same edge cases as check.
    assert_eq!(agent.check_batch(t(1), "", "messages", 3, 10, &mut rng), 10);
    assert_eq!(
        agent.check_batch(t(1), "acme", "messages", 0, 10, &mut rng),
        10
    );
    // Expired: all admitted.
    assert_eq!(
        agent.check_batch(t(61_000), "acme", "messages", 1, 50, &mut rng),
        50
    );
}

/// An agent whose account `acme` is under `factor` for a minute, and a
/// random source seeded with `seed`: two of them decide alike.
fn twin(seed: u64, factor: f64) -> (AgentState, SmallRng) {
    let agent = AgentState::new(AgentConfig::default());
    agent.apply(
        t(0),
        "acme",
        "messages",
        factor,
        1e12,
        Duration::from_secs(60),
    );
    (agent, SmallRng::seed_from_u64(seed))
}

/// A batch given where its pair was (`Hold::check_batch_at`) decides as one
/// given nothing, whatever the hint, and learns where the pair is: from
/// none at first, then from wrong ones.
#[test]
fn a_batch_with_a_hint_decides_like_one_without() {
    let ((plain, mut r1), (hinted, mut r2)) = (twin(9, 0.6), twin(9, 0.6));
    for agent in [&plain, &hinted] {
        agent.apply(
            t(0),
            "other",
            "messages",
            0.2,
            1e12,
            Duration::from_secs(60),
        );
    }
    let mut at = 0;
    for (i, hint) in [0, 0, 0, 2, 1_000_000, 0, 0].into_iter().enumerate() {
        if hint != 0 {
            at = hint;
        }
        let now = t(1 + i as u64);
        let a = plain.check_batch(now, "acme", "messages", 3, 1_000, &mut r1);
        let b = hinted
            .hold()
            .check_batch_at(now, "acme", "messages", 3, 1_000, &mut r2, &mut at);
        assert_eq!(a, b, "step {i}");
        assert_ne!(at, 0, "step {i}: the pair's place is learnt");
        let f = hinted.hold().factor_at(now, "acme", "messages", &mut at);
        assert_eq!(f, plain.factor(now, "acme", "messages"));
    }
    assert_eq!(drained(&plain), drained(&hinted));
}

/// One hold over many batches decides as a hold per batch does: pairs
/// known before it, a pair made while it is held (found through the
/// table's lock, not its generation), and that pair again under the
/// same hold.
#[test]
fn batches_under_one_hold_decide_like_batches_alone() {
    let ((alone, mut r1), (held, mut r2)) = (twin(3, 0.7), twin(3, 0.7));
    let accounts = ["acme", "new-1", "acme", "new-1", "new-2", "acme"];
    let mut at = [0u32; 3];
    let hold = held.hold();
    for (i, account) in accounts.into_iter().enumerate() {
        let now = t(1);
        let slot = match account {
            "acme" => 0,
            "new-1" => 1,
            _ => 2,
        };
        let a = alone.check_batch(now, account, "messages", 2, 500, &mut r1);
        let b = hold.check_batch_at(now, account, "messages", 2, 500, &mut r2, &mut at[slot]);
        assert_eq!(a, b, "batch {i} ({account})");
        assert_eq!(
            hold.factor_at(now, account, "messages", &mut at[slot]),
            alone.factor(now, account, "messages"),
            "batch {i} ({account})"
        );
    }
    drop(hold);
    assert_eq!(held.len(), 3);
    assert_eq!(drained(&alone), drained(&held));
}

/// A deluge's first batch on one agent: one-by-one checks at one instant
/// are admitted until the local guard's window has used its allowance
/// (250 of a 1 000/s limit over 250 ms) and proves a deluge, and the check
/// after that closes the window early; a batch must stop there too, not
/// admit all 1 000.
#[test]
fn a_batch_closes_the_local_guard_early_where_single_checks_do() {
    let run = |batch: bool| {
        // A master answered with no suppression: the guard knows the limit.
        let agent = answered_under_1000(Duration::from_secs(60));
        let mut rng = SmallRng::seed_from_u64(9);
        for ms in [10, 60, 110] {
            agent.check(t(ms), "acme", "messages", 1, &mut rng);
        }
        if batch {
            agent.check_batch(t(150), "acme", "messages", 2, 1_000, &mut rng)
        } else {
            (0..1_000)
                .filter(|_| {
                    agent
                        .check(t(150), "acme", "messages", 2, &mut rng)
                        .is_admit()
                })
                .count() as u64
        }
    };
    let (batch, singles) = (run(true), run(false));
    assert_eq!(batch, singles, "a batch decides as single checks do");
    // 3 of the allowance used before; operations of cost 2 are admitted
    // until the window is past its allowance and confidently over twice
    // the limit (`guard`): 411 over 150 ms, 2 740/s, after 204 of them.
    // The next closes the window, a factor of 1 − 1 000 / 2 740 = 0.64 for
    // the 796 left, about 288 of them admitted. Before, the batch admitted
    // all.
    assert!(
        (450..550).contains(&batch),
        "the early close within the batch: {batch}"
    );
}

proptest! {
    /// Whatever is in force (no master yet and the op's default limit, a
    /// master's factor or none, a window just begun or nearly done), a
    /// batch admits and counts exactly what one-by-one checks at the same
    /// instant do, with the same draws.
    #[test]
    fn a_batch_is_single_checks_at_one_instant(
        factor in prop_oneof![Just(0.0f64), 0.0f64..0.9],
        limit in 10.0f64..5_000.0,
        answered in any::<bool>(),
        before in 0u64..400,
        at_ms in 1u64..600,
        cost in 1u64..60,
        n in 1u64..3_000,
    ) {
        let run = |batch: bool| {
            let agent = AgentState::new(AgentConfig::default());
            let mut reply = Reply::default();
            reply.ops.push(crate::wire::OpVerdicts {
                op: "messages".into(),
                listed: Vec::new(),
                unlisted: Some(crate::wire::Unlisted {
                    limit,
                    valid_for: Duration::from_secs(6),
                    shadow: false,
                }),
                overrides: Vec::new(),
            });
            agent.learn_op_limits(&reply);
            let mut rng = SmallRng::seed_from_u64(3);
            if answered {
                agent.apply(t(0), "acme", "messages", factor, limit, Duration::from_secs(60));
            }
            for _ in 0..before {
                agent.check(t(0), "acme", "messages", 1, &mut rng);
            }
            let admitted = if batch {
                agent.check_batch(t(at_ms), "acme", "messages", cost, n, &mut rng)
            } else {
                (0..n)
                    .filter(|_| agent.check(t(at_ms), "acme", "messages", cost, &mut rng).is_admit())
                    .count() as u64
            };
            (admitted, drained(&agent)[0].2.admitted)
        };
        prop_assert_eq!(run(true), run(false));
    }
}

#[test]
fn drains_route_to_owners_in_a_fixed_order_and_carry_over_is_bounded() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(5);
    for account in ["c", "a", "b", "d", "e"] {
        for op in ["presence", "messages"] {
            agent.check(t(0), account, op, 2, &mut rng);
        }
    }
    let ring = crate::ring::Ring::new(["m1:1", "m2:1"]);
    let routed = agent.drain_by_owner(t(0), &ring);
    assert!(routed.unroutable.is_empty());
    let total: usize = routed.by_master.values().map(Vec::len).sum();
    assert_eq!(total, 10);
    for (master, pending) in &routed.by_master {
        for p in pending {
            assert_eq!(ring.owner(&p.account), Some(master.as_str()));
        }
        let keys: Vec<_> = pending
            .iter()
            .map(|p| (p.op.clone(), p.account.clone()))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }
    // A failed rollup [0, 2 s): carried over when young, dropped when old.
    let mut pending = routed.by_master.into_values().flatten();
    let young = pending.next().unwrap();
    let old = pending.next().unwrap();
    let max = Duration::from_secs(30);
    assert_eq!(agent.carry_over(young.clone(), t(0), t(2_000), max), 0);
    assert_eq!(agent.carry_over(old, t(0), t(31_000), max), 2);
    let again = agent.drain_by_owner(t(0), &crate::ring::Ring::new(Vec::<String>::new()));
    // The others owe one zero report each ("went quiet").
    let with_counts: Vec<_> = again
        .unroutable
        .iter()
        .filter(|p| p.delta.attempted > 0)
        .collect();
    assert_eq!(with_counts.len(), 1, "only the young one came back");
    assert_eq!(
        (&with_counts[0].account, &with_counts[0].op),
        (&young.account, &young.op)
    );
    assert_eq!(with_counts[0].delta.since, Some(t(0)));
}

#[test]
fn sends_spread_over_the_first_fifth_of_the_interval() {
    let two = Duration::from_secs(2);
    let delays: Vec<Duration> = (0..200)
        .map(|i| send_spread(&format!("edge-{i}"), two))
        .collect();
    assert!(delays.iter().all(|d| *d < Duration::from_millis(400)));
    let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
    assert!(
        distinct.len() > 100,
        "agents bunch up: {} distinct delays",
        distinct.len()
    );
    assert_eq!(send_spread("edge-1", two), send_spread("edge-1", two));
    assert_eq!(send_spread("x", Duration::from_millis(4)), Duration::ZERO);
}

/// Under a limit in shadow every operation is admitted and counted as
/// admitted, and those the factor would refuse say so, in the same share
/// as real refusals: the local guard's too, before any master answered.
#[test]
fn a_limit_in_shadow_admits_everything_and_marks_what_it_would_refuse() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(7);
    let factor = Factor {
        factor: 0.75,
        limit: 500.0,
        valid_for: Duration::from_secs(6),
        shadow: true,
        utilisation: 4.0,
    };
    agent.apply_factor(t(0), Pair::new("acme", "messages"), &factor);
    let decisions: Vec<Decision> = (0..1_000)
        .map(|_| agent.check(t(10), "acme", "messages", 1, &mut rng))
        .collect();
    assert!(decisions.iter().all(Decision::is_admit));
    let would: Vec<&Rejection> = decisions.iter().filter_map(|d| d.would_reject()).collect();
    // Low-noise admission: the share, within one operation (random phase).
    assert!((749..=751).contains(&would.len()), "{}", would.len());
    assert!(would.iter().all(|r| r.source == RejectSource::Master
        && r.limit == 500.0
        && (r.demand - 2_000.0).abs() < 1e-6));
    let d = drained_at(&agent, t(20));
    assert_eq!((d[0].2.attempted, d[0].2.admitted), (1_000, 1_000));

    // The same verdict out of shadow refuses the same share.
    agent.apply_factor(
        t(30),
        Pair::new("acme", "messages"),
        &Factor {
            shadow: false,
            ..factor
        },
    );
    let refused = (0..1_000)
        .filter(|_| {
            !agent
                .check(t(40), "acme", "messages", 1, &mut rng)
                .is_admit()
        })
        .count();
    assert!((745..=755).contains(&refused), "{refused}");

    // An op whose default limit is in shadow: the local guard of a fresh
    // pair flooding this agent marks, and refuses nothing.
    let mut reply = Reply::default();
    reply.ops.push(crate::wire::OpVerdicts {
        op: "presence".into(),
        listed: Vec::new(),
        unlisted: Some(crate::wire::Unlisted {
            limit: 10.0,
            valid_for: Duration::from_secs(6),
            shadow: true,
        }),
        overrides: Vec::new(),
    });
    agent.learn_op_limits(&reply);
    let mut marked = 0;
    for ms in 0..1_000 {
        let d = agent.check(t(100 + ms), "flood", "presence", 1, &mut rng);
        assert!(d.is_admit(), "{d:?}");
        if d.would_reject()
            .is_some_and(|r| r.source == RejectSource::LocalGuard)
        {
            marked += 1;
        }
    }
    assert!(marked > 900, "{marked} of 1 000 at 100× the limit marked");
}

/// An admitted decision carries the utilisation the master said while its
/// verdict is in force, and none once it lapsed or when none was said.
#[test]
fn admitted_decisions_carry_the_utilisation_the_master_said() {
    let agent = AgentState::new(AgentConfig::default());
    let near = Factor {
        factor: 0.0,
        limit: 500.0,
        valid_for: Duration::from_secs(6),
        shadow: false,
        utilisation: 0.9,
    };
    agent.apply_factor(t(0), Pair::new("acme", "messages"), &near);
    let utilisation =
        |at| match agent.check(at, "acme", "messages", 1, &mut SmallRng::seed_from_u64(1)) {
            Decision::Admit(a) => a.utilisation,
            other => panic!("{other:?}"),
        };
    assert_eq!(utilisation(t(10)), Some(0.9));
    assert_eq!(agent.peek(t(10), "acme", "messages").utilisation, Some(0.9));
    assert_eq!(utilisation(t(6_001)), None, "lapsed");
    agent.apply_factor(
        t(7_000),
        Pair::new("acme", "messages"),
        &Factor {
            utilisation: 0.0,
            ..near
        },
    );
    assert_eq!(
        utilisation(t(7_010)),
        None,
        "under the near share: not said"
    );
}

/// A hello's reply names the accounts whose limit is not the op's
/// default: a new pair of one is guarded under its own limit (an exempt
/// one under none) from its first check, before any master answers for it.
#[test]
fn a_new_pair_is_guarded_under_its_accounts_override_from_its_first_check() {
    use crate::wire::{OpVerdicts, Override, Unlisted};
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(9);
    let over = |account: &str, limit: f64| Override {
        account: account.into(),
        limit,
        shadow: false,
    };
    let mut hello = Reply::default();
    hello.ops.push(OpVerdicts {
        op: "messages".into(),
        listed: Vec::new(),
        unlisted: Some(Unlisted {
            limit: 100.0,
            valid_for: Duration::from_secs(6),
            shadow: false,
        }),
        overrides: vec![
            over("big", 5_000.0),
            over("org", 2_000.0),
            over("vip", f64::MAX),
        ],
    });
    agent.learn_hello(&hello);
    // 2 000 cost a second over one second on each, from its first check.
    let mut refused = |account: &str, from: u64| {
        let mut refused = 0;
        for i in 0..400 {
            let d = agent.check(
                t(from + i * 2_500 / 1_000),
                account,
                "messages",
                5,
                &mut rng,
            );
            refused += u64::from(!d.is_admit()) * 5;
        }
        refused
    };
    assert_eq!(refused("big", 0), 0, "under its own 5 000/s");
    assert_eq!(refused("vip", 0), 0, "exempt: no limit at all");
    assert_eq!(refused("org/team", 0), 0, "under org's 2 000/s");
    assert!(refused("small", 0) > 1_000, "under the default, 100/s");
    // A later hello that no longer names `big` takes its override away for
    // pairs made after it.
    hello.ops[0].overrides.clear();
    agent.learn_hello(&hello);
    assert!(refused("big-2", 0) > 1_000);
    assert_eq!(
        refused("big", 2_000),
        0,
        "a pair made before keeps its limit"
    );
}

/// A push applies to the pairs the agent holds, and creates none: a pair
/// it never saw has nothing to hold.
#[test]
fn a_push_applies_to_held_pairs_only() {
    use crate::wire::{Factor, Listed, OpVerdicts, Reply};
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(3);
    agent.check(t(0), "acme", "messages", 1, &mut rng);
    let listed = |account: &str| Listed {
        account: account.into(),
        factor: Factor {
            factor: 1.0,
            limit: 10.0,
            valid_for: Duration::from_secs(6),
            shadow: false,
            utilisation: 0.0,
        },
        recheck: false,
    };
    let push = Reply {
        ops: vec![OpVerdicts {
            op: "messages".into(),
            listed: vec![listed("acme"), listed("globex")],
            unlisted: None,
            overrides: Vec::new(),
        }],
        ..Reply::default()
    };
    assert_eq!(agent.apply_pushed(t(10), &push), 1);
    assert!(
        !agent
            .check(t(20), "acme", "messages", 1, &mut rng)
            .is_admit()
    );
    assert_eq!(agent.len(), 1, "no entry made for globex");
    assert!(
        agent
            .check(t(20), "globex", "messages", 1, &mut rng)
            .is_admit()
    );
    // A push teaches no op default: its `unlisted` is not this agent's
    // question.
    assert_eq!(agent.op_limit("messages"), None);
}

/// A reply applied with each pair's place in the table
/// (`apply_reply_at`) stores what one applied by name does, whatever the
/// places say: right, another pair's slot, past the table, or nothing (a
/// pair the reply makes).
#[test]
fn a_reply_applied_by_place_gives_each_pair_its_own_verdict() {
    use crate::wire::{Factor, Listed, OpVerdicts, Reply, Unlisted};
    let valid = Duration::from_secs(6);
    let reply = Reply {
        ops: vec![OpVerdicts {
            op: "messages".into(),
            listed: vec![Listed {
                account: "a".into(),
                factor: Factor {
                    factor: 0.5,
                    limit: 2_000.0,
                    valid_for: valid,
                    shadow: false,
                    utilisation: 0.0,
                },
                recheck: false,
            }],
            unlisted: Some(Unlisted {
                limit: 2_000.0,
                valid_for: valid,
                shadow: false,
            }),
            overrides: Vec::new(),
        }],
        ..Reply::default()
    };
    let (by_name, by_place) = (
        AgentState::new(AgentConfig::default()),
        AgentState::new(AgentConfig::default()),
    );
    let mut places = [0u32; 3];
    for agent in [&by_name, &by_place] {
        for (account, at) in ["a", "b", "c"].into_iter().zip(&mut places) {
            agent.apply(t(0), account, "messages", 0.9, 1e12, valid);
            agent.hold().factor_at(t(0), account, "messages", at);
        }
    }
    let [a, _, c] = places;
    let asked = [("a", a), ("b", a), ("c", c + 1_000_000), ("d", 0)]
        .map(|(account, at)| (Pair::new(account, "messages"), at));
    by_name.apply_reply(t(1), &reply, asked.iter().map(|(pair, _)| *pair));
    by_place.apply_reply_at(t(1), &reply, asked, |_, _| false);
    for agent in [&by_name, &by_place] {
        let factors = ["a", "b", "c", "d"].map(|account| agent.factor(t(1), account, "messages"));
        assert_eq!(factors, [Some(0.5), Some(0.0), Some(0.0), Some(0.0)]);
    }
    assert_eq!(drained(&by_name), drained(&by_place));
}

#[test]
fn publishers_named_to_check_from_each_keep_their_share() {
    // A costly publisher (cost 51) and a cheap one (cost 1) share `acme`
    // under a factor of 0.8, the cheap one sending 50 times as often: by
    // `check_from` each keeps a fifth of its attempted cost to within its
    // lane's bound, and the pair admits what `check` would (a fifth, within
    // the pair's bound widened by the lanes'). The limit is far above the
    // traffic, so the local guard leaves the master's factor alone.
    let agent = AgentState::new(AgentConfig::default());
    agent.apply(t(0), "acme", "messages", 0.8, 1e9, Duration::from_secs(600));
    let mut rng = SmallRng::seed_from_u64(4);
    let (costly, cheap) = (Publisher::new(7), Publisher::new(8));
    let (mut kept, mut tried) = ([0u64; 2], [0u64; 2]);
    for k in 0..100_000u64 {
        let (who, publisher, cost) = if k % 51 == 0 {
            (0, costly, 51)
        } else {
            (1, cheap, 1)
        };
        tried[who] += cost;
        if agent
            .check_from(t(k / 100), "acme", "messages", cost, publisher, &mut rng)
            .is_admit()
        {
            kept[who] += cost;
        }
    }
    for who in 0..2 {
        let share = 0.2 * tried[who] as f64;
        assert!(
            (kept[who] as f64 - share).abs() <= 2.0 * publisher_bound(51.0),
            "publisher {who} kept {} of {share}",
            kept[who]
        );
    }
    let all = 0.2 * (tried[0] + tried[1]) as f64;
    let widened = credit_bound(51.0) + 2.0 * publisher_bound(51.0);
    assert!(((kept[0] + kept[1]) as f64 - all).abs() <= widened);
}

#[test]
fn check_from_admits_and_counts_as_check_does_with_no_factor() {
    let agent = AgentState::new(AgentConfig::default());
    let mut rng = SmallRng::seed_from_u64(1);
    for publisher in 0..5 {
        let decision = agent.check_from(
            t(0),
            "acme",
            "messages",
            3,
            Publisher::new(publisher),
            &mut rng,
        );
        assert!(decision.is_admit());
    }
    let drained = drained(&agent);
    assert_eq!(drained.len(), 1);
    assert_eq!((drained[0].2.attempted, drained[0].2.admitted), (15, 15));
}

#[test]
fn publishers_on_two_threads_each_keep_their_share() {
    // Two threads, one publisher each (costs 1 and 51), racing on one pair
    // under a factor of 0.5: the lanes and the pair's credit are moved by
    // `fetch_add` only, so nothing is lost, and each keeps half its cost
    // to within a few operations (a race can let two decisions read the
    // same credit, never drop an update).
    let agent = Arc::new(AgentState::new(AgentConfig::default()));
    agent.apply(t(0), "acme", "messages", 0.5, 1e9, Duration::from_secs(600));
    let kept: Vec<(u64, u64)> = std::thread::scope(|scope| {
        let runs: Vec<_> = [(1u64, 1u64), (2, 51)]
            .into_iter()
            .map(|(id, cost)| {
                let agent = agent.clone();
                scope.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(id);
                    let (mut kept, mut tried) = (0, 0);
                    for k in 0..20_000u64 {
                        tried += cost;
                        let publisher = Publisher::new(id);
                        if agent
                            .check_from(t(k / 100), "acme", "messages", cost, publisher, &mut rng)
                            .is_admit()
                        {
                            kept += cost;
                        }
                    }
                    (kept, tried)
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (kept, tried) in &kept {
        let share = 0.5 * *tried as f64;
        assert!(
            (*kept as f64 - share).abs() <= 10.0 * 51.0,
            "kept {kept} of {share}"
        );
    }
    let drained = drained(&agent);
    let (attempted, admitted) = (drained[0].2.attempted, drained[0].2.admitted);
    assert_eq!(attempted, kept.iter().map(|k| k.1).sum::<u64>());
    assert_eq!(admitted, kept.iter().map(|k| k.0).sum::<u64>());
}
