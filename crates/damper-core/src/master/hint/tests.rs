use super::*;
use crate::config::MasterConfig;
use crate::master::Report;
use crate::wire::SurgeRates;

const L: f64 = 2_000.0;
/// A round instant: a multiple of 2 s since the epoch.
const T0_MS: u64 = 1_699_999_998_000;

fn at(ms: u64) -> Nanos {
    Nanos::from_millis(T0_MS + ms)
}

/// A master pushing, with a limit of 2 000/s, that has heard 40 agents at
/// 25/s each (1 000/s in all, half the limit) for ten rounds, to 20 s.
fn held_at_half() -> MasterState {
    let config = MasterConfig::from_toml(&format!("[limits]\nmessages = {L}\n")).unwrap();
    let mut m = MasterState::new(config);
    m.track_pushes(true);
    rounds(&mut m, 2_000..=20_000, 51, 51);
    m
}

/// 40 agents' reports of `costly` for each 2-s round ending in `ends`
/// (milliseconds), each `attempted` and `admitted` cost.
fn rounds(m: &mut MasterState, ends: std::ops::RangeInclusive<u64>, attempted: u64, admitted: u64) {
    for end in ends.step_by(2_000) {
        for _ in 0..40 {
            let report = Report {
                account: "costly",
                op: "messages",
                start: at(end - 2_000),
                end: at(end),
                attempted,
                admitted,
                op_cost: 0,
                ops: 0,
            };
            m.ingest(at(end + 5), &report).unwrap();
        }
    }
}

fn pair() -> Pair<'static> {
    Pair::new("costly", "messages")
}

/// Agent `agent`'s sparse hint of 510/s (four cost-51 operations in 400
/// ms) at `ms`.
fn hint(m: &mut MasterState, ms: u64, agent: &str) -> Verdict {
    let rates = SurgeRates {
        rate: 510.0,
        baseline: 25.5,
        hint: true,
        ops: 4,
        ..SurgeRates::default()
    };
    m.surge(at(ms), at(ms), agent, pair(), rates)
        .unwrap()
        .unwrap()
}

/// Agent `agent`'s answer to a poll at `ms`: `rate` over `ops` operations.
fn answer(m: &mut MasterState, ms: u64, agent: &str, rate: f32, ops: u32) -> Verdict {
    let rates = SurgeRates {
        rate,
        baseline: 25.5,
        ops,
        ..SurgeRates::default()
    };
    m.surge(at(ms), at(ms), agent, pair(), rates)
        .unwrap()
        .unwrap()
}

fn polls(m: &mut MasterState) -> usize {
    m.take_pushes().iter().filter(|p| p.poll).count()
}

#[test]
fn hints_from_three_agents_poll_and_move_no_estimate() {
    let mut m = held_at_half();
    let before = m.verdict(at(20_100), "costly", "messages").unwrap();
    // One agent, however often: a hint each, no poll (three are needed
    // for 40 agents).
    for ms in [20_100, 20_150, 20_200] {
        let v = hint(&mut m, ms, "agent-1");
        assert_eq!(v.factor, 0.0);
        assert!(v.recheck_at.is_none(), "a hint asks for no recheck");
    }
    assert_eq!(polls(&mut m), 0);
    hint(&mut m, 20_250, "agent-2");
    assert_eq!(polls(&mut m), 0);
    // The third distinct agent within half a second: polled.
    let v = hint(&mut m, 20_300, "agent-3");
    let pushes = m.take_pushes();
    assert_eq!(pushes.len(), 1);
    assert!(pushes[0].poll && pushes[0].account == "costly");
    // The estimate is as it was: hints are evidence, not rates.
    assert_eq!(v.rates, before.rates);
    assert_eq!(v.factor, 0.0);
    // Polled once an interval, however many more hint.
    for (i, ms) in (20_350..20_600).step_by(50).enumerate() {
        hint(&mut m, ms, &format!("agent-{}", 10 + i));
    }
    assert_eq!(polls(&mut m), 0);
    let stats = m.hint_stats();
    assert_eq!((stats.hints, stats.polls, stats.polls_refused), (10, 1, 0));
}

#[test]
fn hints_far_apart_or_under_the_limit_do_not_poll() {
    let mut m = held_at_half();
    // Three agents, but over more than half a second.
    hint(&mut m, 20_000, "agent-1");
    hint(&mut m, 20_400, "agent-2");
    hint(&mut m, 20_900, "agent-3");
    assert_eq!(polls(&mut m), 0);
    // Three agents at once whose rates, were all 40 at them, are under
    // the limit (traffic that moved onto them).
    let mut m = held_at_half();
    for agent in ["agent-1", "agent-2", "agent-3"] {
        let rates = SurgeRates {
            rate: 45.0,
            baseline: 10.0,
            hint: true,
            ops: 9,
            ..SurgeRates::default()
        };
        m.surge(at(20_100), at(20_100), agent, pair(), rates)
            .unwrap();
    }
    assert_eq!(polls(&mut m), 0);
}

/// The poll's answers, each a few cost-51 operations over a few hundred
/// milliseconds from every agent, sum to the flood's rate, and suppress it
/// at `1 − L / demand`; the flip is pushed to every agent.
#[test]
fn the_answers_to_a_poll_suppress_a_flood_they_prove() {
    let mut m = held_at_half();
    for agent in ["agent-1", "agent-2", "agent-3"] {
        hint(&mut m, 20_300, agent);
    }
    assert_eq!(polls(&mut m), 1);
    let mut last = None;
    for a in 0..40 {
        // 250/s each, two operations in about 400 ms: 10 000/s in all.
        last = Some(answer(&mut m, 20_330, &format!("agent-{a}"), 250.0, 2));
    }
    let v = last.unwrap();
    assert!((v.factor - 0.8).abs() < 0.01, "{v:?}");
    assert!(v.recheck_at.is_some());
    let pushes = m.take_pushes();
    assert!(
        pushes.iter().any(|p| !p.poll && p.verdict.factor > 0.0),
        "{pushes:?}"
    );
}

/// Answers that sum a demand just over the limit from few operations are
/// chance as likely as not: not suppressed (80 operations, ±11%: 1.3×
/// needs 1.34× to suppress). A deluge is.
#[test]
fn answers_of_few_operations_over_the_limit_by_their_noise_do_not_suppress() {
    let mut m = held_at_half();
    for agent in ["agent-1", "agent-2", "agent-3"] {
        hint(&mut m, 20_300, agent);
    }
    let mut v = None;
    for a in 0..40 {
        // 65/s each: 2 600/s in all, 1.3× the limit, two operations each.
        v = Some(answer(&mut m, 20_330, &format!("agent-{a}"), 65.0, 2));
    }
    // Within its margin, the estimate reads as the limit.
    let v = v.unwrap();
    assert_eq!((v.factor, v.rates.demand), (0.0, L), "{v:?}");
    use crate::master::surge_proven;
    assert!(!surge_proven(1.3 * L, L, 80));
    assert!(surge_proven(1.5 * L, L, 80));
    // Uncounted: the fixed margin alone.
    assert!(surge_proven(1.2 * L, L, 0));
    assert!(!surge_proven(1.1 * L, L, 0));
    // A new pair's first report: nine operations where four were due is
    // chance; twenty is not.
    assert!(!surge_proven(2.3 * L, L, 9));
    assert!(surge_proven(5.0 * L, L, 20));
}

#[test]
fn polls_are_bounded_per_interval() {
    let config = MasterConfig::from_toml(&format!("[limits]\nmessages = {L}\n")).unwrap();
    let mut m = MasterState::new(config);
    m.track_pushes(true);
    let accounts: Vec<String> = (0..POLLS_PER_INTERVAL + 10)
        .map(|i| format!("acct-{i}"))
        .collect();
    for end in [2_000, 4_000] {
        for account in &accounts {
            let report = Report {
                account,
                op: "messages",
                start: at(end - 2_000),
                end: at(end),
                attempted: 51,
                admitted: 51,
                op_cost: 0,
                ops: 0,
            };
            m.ingest(at(end + 5), &report).unwrap();
        }
    }
    for account in &accounts {
        for agent in ["a", "b"] {
            let rates = SurgeRates {
                rate: 5_000.0,
                hint: true,
                ops: 4,
                ..SurgeRates::default()
            };
            let pair = Pair::new(account, "messages");
            m.surge(at(4_100), at(4_100), agent, pair, rates).unwrap();
        }
    }
    assert_eq!(polls(&mut m), POLLS_PER_INTERVAL);
    assert_eq!(m.hint_stats().polls_refused, 10);
}

/// A master state whose caller takes no pushes (one without agents to
/// push to) tallies hints and polls nothing.
#[test]
fn a_master_that_does_not_push_polls_nothing() {
    let mut m = held_at_half();
    m.track_pushes(false);
    for agent in ["agent-1", "agent-2", "agent-3", "agent-4"] {
        hint(&mut m, 20_300, agent);
    }
    assert!(m.take_pushes().is_empty());
    assert_eq!((m.hint_stats().hints, m.hint_stats().polls), (4, 0));
}

/// A master holding a flood of 10 000/s from 40 agents at 250/s each, by
/// its rounds, to 30 s.
fn holding_a_flood() -> MasterState {
    let mut m = held_at_half();
    rounds(&mut m, 22_000..=30_000, 500, 100);
    assert!(m.verdict(at(30_100), "costly", "messages").unwrap().factor > 0.75);
    m.take_pushes();
    m
}

/// Agent `agent`'s fall hint at `ms`: a run of empty sub-windows its
/// 250/s makes unlikely.
fn fall(m: &mut MasterState, ms: u64, agent: &str) {
    let rates = SurgeRates {
        rate: 0.0,
        baseline: 250.0,
        hint: true,
        ..SurgeRates::default()
    };
    m.surge(at(ms), at(ms), agent, pair(), rates).unwrap();
}

/// The flood stops: twelve agents' fall hints within half a second poll
/// the pair (under a deep factor, whose agents hint more by chance); the answers, one by one, bring the estimate down past the
/// limit once, and that release is pushed once. A suppressed pair's fall
/// hints alone (fewer agents, or the pair not suppressed) poll nothing.
#[test]
fn fall_hints_poll_a_suppressed_flood_and_the_answers_release_it_once() {
    let mut m = holding_a_flood();
    for a in 0..11 {
        fall(&mut m, 30_300 + a * 20, &format!("agent-{a}"));
    }
    assert_eq!(polls(&mut m), 0, "eleven of forty may be chance");
    fall(&mut m, 30_440, "agent-11");
    assert_eq!(polls(&mut m), 1);
    let mut factors = Vec::new();
    for a in 0..40 {
        // Nothing since the flood stopped, but one operation on every
        // twelfth, the first among them (a straggler, or the account's
        // calm traffic): weighed as a rise's would be, these few counted
        // operations would move the margin to suppress under the estimate
        // as it falls, and release, suppress and release again.
        let (rate, ops) = if a % 12 == 0 { (200.0, 1) } else { (0.0, 0) };
        let rates = SurgeRates {
            rate,
            baseline: 250.0,
            ops,
            ..SurgeRates::default()
        };
        let v = m
            .surge(at(30_450), at(30_450), &format!("agent-{a}"), pair(), rates)
            .unwrap()
            .unwrap();
        factors.push(v.factor);
    }
    assert_eq!(*factors.last().unwrap(), 0.0, "{factors:?}");
    let flips = factors
        .windows(2)
        .filter(|w| (w[0] > 0.0) != (w[1] > 0.0))
        .count();
    assert_eq!(flips, 1, "{factors:?}");
    let pushes = m.take_pushes();
    assert_eq!(pushes.len(), 1, "{pushes:?}");
    assert!(!pushes[0].poll && pushes[0].verdict.factor == 0.0);
}

#[test]
fn fall_hints_of_a_pair_not_suppressed_poll_nothing() {
    let mut m = held_at_half();
    for a in 0..12 {
        fall(&mut m, 20_300 + a * 10, &format!("agent-{a}"));
    }
    assert_eq!(polls(&mut m), 0);
}

/// After a poll of a fall, every agent's answer in: the flood, 10 000/s
/// from 40 agents, reads `per_agent` from each of `counted` of them (one
/// operation each, so their sum is known to about one over its square
/// root) and nothing from the rest. The factor then.
fn after_fall_answers(counted: usize, per_agent: f32, ops_each: u32) -> f64 {
    let mut m = holding_a_flood();
    for a in 0..12 {
        fall(&mut m, 30_300 + a * 20, &format!("agent-{a}"));
    }
    assert_eq!(polls(&mut m), 1);
    let mut factor = 1.0;
    for a in 0..40 {
        let (rate, ops) = if a < counted {
            (per_agent, ops_each)
        } else {
            (0.0, 0)
        };
        let rates = SurgeRates {
            rate,
            baseline: 250.0,
            ops,
            ..SurgeRates::default()
        };
        factor = m
            .surge(at(30_450), at(30_450), &format!("agent-{a}"), pair(), rates)
            .unwrap()
            .unwrap()
            .factor;
    }
    factor
}

/// A fall is weighed by what its answers counted: twelve operations
/// reading the rate left after the flood at 2 400/s (over the limit of
/// 2 000/s) are one standard deviation of chance from under it, so the
/// account is released rather than held at 0.17 until the answers' next
/// reports. The same reading from 1 200 operations is no chance: held.
/// And a chance poll of a flood still going (its answers read it whole,
/// from 200 operations, a little under it) releases nothing.
#[test]
fn a_fall_is_released_when_its_answers_may_be_under_the_limit() {
    assert_eq!(after_fall_answers(12, 200.0, 1), 0.0);
    let held = after_fall_answers(12, 200.0, 100);
    assert!((held - (1.0 - L / 2_400.0)).abs() < 0.01, "{held}");
    let flood = after_fall_answers(40, 240.0, 5);
    assert!(flood > 0.75, "{flood}");
}
