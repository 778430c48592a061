use std::collections::BTreeMap;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::*;
use crate::Pair;
use crate::agent::{AgentConfig, AgentState, Pending, send_spread};
use crate::config::MasterConfig;
use crate::master::MasterState;
use crate::wire::{Reply, ReplyHeader, Rollup, SurgeRates};

const T0: Nanos = Nanos::from_secs(1_800_000_000);

fn at(ms: u64) -> Nanos {
    T0 + Duration::from_millis(ms)
}

fn master() -> MasterState {
    MasterState::new(MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap())
}

/// A round without fast onset: rollups alone (see `surge_tests` for the rest).
fn round(id: &str, members: &[&str]) -> AgentRound {
    let mut config = RoundConfig::new(id);
    config.fast_onset = None;
    AgentRound::new(config, members.iter().copied(), at(10))
}

/// Answers every transmit at once from `master` (probes say it started at
/// T0); returns what was sent.
fn answer_all(
    round: &mut AgentRound,
    state: &AgentState,
    master: &mut MasterState,
    now: Nanos,
) -> Vec<Transmit> {
    answer_all_but(round, state, master, now, "")
}

/// [`answer_all`], but every request to `down` fails.
fn answer_all_but(
    round: &mut AgentRound,
    state: &AgentState,
    master: &mut MasterState,
    now: Nanos,
    down: &str,
) -> Vec<Transmit> {
    let mut sent = Vec::new();
    while let Some(t) = round.poll_transmit() {
        if t.master == down {
            round.on_failure(now, t.id, state);
            sent.push(t);
            continue;
        }
        let reply = reply_to(master, now, &t, T0);
        round.on_reply(now, t.id, &reply, state);
        sent.push(t);
    }
    sent
}

/// `master`'s answer at `now` to transmit `t`, saying it started at
/// `started`.
fn reply_to(master: &mut MasterState, now: Nanos, t: &Transmit, started: Nanos) -> Reply {
    let header = ReplyHeader {
        rollup_interval: Duration::from_secs(2),
        started,
        ..ReplyHeader::default()
    };
    match &t.message {
        Message::Rollup(r) => master.answer_rollup(now, r, 100, header).unwrap(),
        Message::Recheck(q) | Message::Probe(q) => {
            master.answer_factors(now, q, 100, header).unwrap()
        }
        // A budget with no memory: never refuses, never a repeat.
        Message::Surge(q) => {
            let mut budget = crate::master::SurgeBudget::default();
            master
                .answer_surge(now, q, &mut budget, 100, header)
                .unwrap()
        }
    }
}

fn flood(state: &AgentState, from_ms: u64, rate_per_s: u64) {
    let mut rng = SmallRng::seed_from_u64(1);
    for i in 0..rate_per_s * 2 {
        state.check(
            at(from_ms + i * 1000 / rate_per_s),
            "flood",
            "messages",
            1,
            &mut rng,
        );
    }
}

fn events(round: &mut AgentRound) -> Vec<RoundEvent> {
    std::iter::from_fn(|| round.poll_event()).collect()
}

#[test]
fn a_round_is_cut_on_the_grid_sent_after_the_spread_and_its_reply_applied() {
    let state = AgentState::new(AgentConfig::default());
    let mut m = master();
    let mut r = round("edge-7", &["m1"]);
    let spread = send_spread("edge-7", Duration::from_secs(2));
    assert!(spread > Duration::ZERO);
    // Counted from the grid interval containing `now`, cut at its end.
    assert_eq!(r.poll_timeout(), Some(at(2_000)));
    flood(&state, 10, 5_000);
    r.handle_timeout(at(2_000), &state);
    assert!(r.poll_transmit().is_none(), "not before the spread");
    assert_eq!(r.poll_timeout(), Some(at(2_000) + spread));
    let now = at(2_000) + spread;
    r.handle_timeout(now, &state);
    let sent = answer_all(&mut r, &state, &mut m, now);
    let [
        Transmit {
            master,
            message: Message::Rollup(rollup),
            ..
        },
    ] = &sent[..]
    else {
        panic!("one rollup: {sent:?}")
    };
    assert_eq!(master, "m1");
    assert_eq!((rollup.start, rollup.end), (T0, at(2_000)));
    assert_eq!(rollup.ops[0].accounts[0].attempted, 10_000);
    // 5 000/s against 1 000/s: factor 0.8, in force at the agent.
    let factor = state.factor(now, "flood", "messages").unwrap();
    assert!((factor - 0.8).abs() < 1e-6, "{factor}"); // stored as f32
    assert!(matches!(
        events(&mut r)[..],
        [RoundEvent::Settled { end, lapsed: 0, forgotten: 0, pairs: 1 }] if end == at(2_000)
    ));
    // The first round at a master is rechecked once it is whole, before
    // the next cut.
    let recheck = r.poll_timeout().unwrap();
    assert!(recheck > now && recheck < at(4_000), "{recheck:?}");
}

#[test]
fn failed_rollups_are_resent_take_the_master_down_are_kept_for_it_and_probes_bring_it_back() {
    let state = AgentState::new(AgentConfig::default());
    let mut m = master();
    let mut r = round("edge-1", &["m1", "m2"]);
    let owner = r.membership().live().owner("flood").unwrap().to_owned();
    let other = if owner == "m1" { "m2" } else { "m1" };
    let mut now;
    let mut in_doubt = None;
    // Two rounds fail: counts carried, then the owner goes down.
    for round_end in [2_000, 4_000] {
        flood(&state, round_end - 2_000, 100);
        r.handle_timeout(at(round_end), &state);
        now = r.poll_timeout().unwrap();
        r.handle_timeout(now, &state);
        let t = r.poll_transmit().unwrap();
        assert_eq!(t.master, owner);
        let Message::Rollup(rollup) = &t.message else {
            panic!("{t:?}")
        };
        let counts = &rollup.ops[0].accounts[0];
        if round_end == 4_000 {
            // Both rounds' counts, from the start of the first.
            assert_eq!((counts.attempted, counts.since), (400, Some(T0)));
        }
        let sent = rollup.clone();
        r.on_failure(now, t.id, &state);
        // Sent again at once, as it was, with its number, up to
        // ROLLUP_RESENDS times while its master is up: its master may have
        // counted it and only the reply was lost. The second round's
        // failure takes the master down at once, so it gets none.
        let mut resends = 0;
        while let Some(again) = r.poll_transmit() {
            let Message::Rollup(resent) = &again.message else {
                panic!("{again:?}")
            };
            assert_eq!(again.master, owner);
            assert_eq!(resent, &sent);
            assert!(resent.sequence > 0 && resent.incarnation > 0);
            r.on_failure(now, again.id, &state);
            resends += 1;
        }
        let expected = if round_end == 2_000 {
            super::machine::ROLLUP_RESENDS
        } else {
            0
        };
        assert_eq!(resends, expected, "round ending at {round_end}");
        in_doubt = Some(sent);
    }
    let ev = events(&mut r);
    assert!(
        ev.contains(&RoundEvent::RingChanged {
            master: owner.clone(),
            up: false
        }),
        "{ev:?}"
    );
    assert_eq!(r.membership().live().owner("flood"), Some(other));
    // The next round goes to the other master with only its own counts:
    // the failed one's may have been counted by the owner (a lost reply),
    // so they are kept for it. The down master's probe is due by then (1 s
    // ± 25% after it went down).
    flood(&state, 4_000, 50);
    r.handle_timeout(at(6_000), &state);
    now = r.poll_timeout().unwrap();
    r.handle_timeout(now, &state);
    let sent = answer_all(&mut r, &state, &mut m, now);
    let masters: Vec<(&str, bool)> = sent
        .iter()
        .map(|t| (t.master.as_str(), matches!(t.message, Message::Probe(_))))
        .collect();
    assert_eq!(masters, [(owner.as_str(), true), (other, false)]);
    let Message::Rollup(rollup) = &sent[1].message else {
        panic!("{sent:?}")
    };
    assert_eq!(rollup.ops[0].accounts[0].attempted, 100);
    // It answered the probe, saying it started at T0: it never restarted
    // (a partition healed), its warm-up is long past, so it is back at once.
    assert!(r.membership().is_up(&owner));
    assert!(events(&mut r).contains(&RoundEvent::RingChanged {
        master: owner.clone(),
        up: true
    }));
    // At the next cut it gets the rollup kept for it, as it was, with its
    // number: counted only if it had not been.
    r.handle_timeout(at(8_000), &state);
    let t = r.poll_transmit().unwrap();
    assert_eq!(t.master, owner);
    let Message::Rollup(resent) = &t.message else {
        panic!("{t:?}")
    };
    assert_eq!(Some(resent), in_doubt.as_ref());
    assert_eq!(resent.ops[0].accounts[0].attempted, 400);
    assert!(
        !events(&mut r)
            .iter()
            .any(|e| matches!(e, RoundEvent::Dropped { .. }))
    );
}

#[test]
fn rollups_kept_in_doubt_are_given_up_and_reported_dropped_if_their_master_stays_away() {
    let state = AgentState::new(AgentConfig::default());
    let mut m = master();
    let mut r = round("edge-1", &["m1", "m2"]);
    let owner = r.membership().live().owner("flood").unwrap().to_owned();
    // Every request to the owner fails: two rounds, then its probes.
    let mut kept = 0;
    let mut end = 2_000;
    while end <= 2_000 + super::machine::IN_DOUBT_FOR.as_millis() as u64 + 4_000 {
        flood(&state, end - 2_000, 100);
        r.handle_timeout(at(end), &state);
        let now = r.poll_timeout().unwrap();
        r.handle_timeout(now, &state);
        for t in answer_all_but(&mut r, &state, &mut m, now, &owner) {
            if let (true, Message::Rollup(rollup)) = (t.master == owner, &t.message) {
                kept = kept.max(rollup.attempted());
            }
        }
        end += 2_000;
    }
    let dropped: u64 = events(&mut r)
        .iter()
        .map(|e| match e {
            RoundEvent::Dropped { cost } => *cost,
            _ => 0,
        })
        .sum();
    assert_eq!((kept, dropped), (400, 400));
}

/// An agent of `id` on master `m1` whose first round floods at 5 000/s
/// against 1 000/s, answered by `m`: returns it and when its rollup went.
fn first_round_flooded(id: &str, m: &mut MasterState) -> (AgentState, AgentRound, Nanos) {
    let state = AgentState::new(AgentConfig::default());
    let mut r = round(id, &["m1"]);
    flood(&state, 0, 5_000);
    r.handle_timeout(at(2_000), &state);
    let now = r.poll_timeout().unwrap();
    r.handle_timeout(now, &state);
    answer_all(&mut r, &state, m, now);
    (state, r, now)
}

#[test]
fn a_recheck_asked_for_is_sent_when_the_round_is_whole_and_applied() {
    let mut m = master();
    let (state, mut r, now) = first_round_flooded("edge-2", &mut m);
    // The first round at a master asks for a recheck once it is whole.
    let due = r.poll_timeout().unwrap();
    assert!(due > now && due < at(4_000), "{due:?}");
    r.handle_timeout(due, &state);
    let t = r.poll_transmit().unwrap();
    let Message::Recheck(query) = &t.message else {
        panic!("{t:?}")
    };
    assert_eq!(
        query.pairs().collect::<Vec<_>>(),
        [Pair::new("flood", "messages")]
    );
    // The master's verdict changed meanwhile (another agent's report).
    let other = Rollup::from_pending(
        "edge-other",
        T0,
        at(2_000),
        0,
        &[Pending {
            account: "flood".into(),
            op: "messages".into(),
            delta: crate::agent::Delta {
                attempted: 10_000,
                admitted: 10_000,
                since: None,
                op_cost: 0,
                ops: 0,
            },
            at: 0,
        }],
    );
    m.answer_rollup(due, &other, 100, ReplyHeader::default())
        .unwrap();
    let reply = m
        .answer_factors(due, query, 100, ReplyHeader::default())
        .unwrap();
    r.on_reply(due, t.id, &reply, &state);
    let factor = state.factor(due, "flood", "messages").unwrap();
    assert!((factor - 0.9).abs() < 1e-6, "{factor}");
}

#[test]
fn large_rollups_are_split_and_stop_sends_everything_at_once() {
    let state = AgentState::new(AgentConfig::default());
    let mut m = master();
    let mut config = RoundConfig::new("edge-3");
    config.max_entries_per_request = 40;
    config.fast_onset = None;
    let mut r = AgentRound::new(config, ["m1"], at(0));
    let mut rng = SmallRng::seed_from_u64(3);
    for i in 0..100 {
        state.check(at(5), &format!("acct-{i}"), "messages", 1, &mut rng);
    }
    r.handle_timeout(at(2_000), &state);
    // Stopped during the spread: this round and what came since go at once.
    state.check(at(2_001), "late", "messages", 3, &mut rng);
    r.stop(at(2_001), &state);
    assert!(!r.is_finished());
    let sent = answer_all(&mut r, &state, &mut m, at(2_001));
    let sizes: Vec<usize> = sent
        .iter()
        .map(|t| match &t.message {
            Message::Rollup(r) => r.entries(),
            other => panic!("{other:?}"),
        })
        .collect();
    // The first round's 100 accounts in three requests, then the last cut:
    // `late`, and a zero report for each of the 100 gone quiet.
    assert_eq!(sizes, [40, 40, 20, 40, 40, 21]);
    assert!(r.is_finished());
    assert_eq!(r.poll_timeout(), None);
    assert_eq!(
        m.verdict(at(2_001), "late", "messages").unwrap().factor,
        0.0
    );
    assert_eq!(m.len(), 101);
}

/// Fast onset: the hello teaches the op's limit, a jump goes out as an
/// early report within a sub-window, its reply applies at once and asks
/// for a recheck; a sudden drop is reported the same way and releases.
#[test]
fn a_surge_is_reported_early_and_its_drop_releases() {
    let state = AgentState::new(AgentConfig::default());
    let mut m = master();
    let mut r = AgentRound::new(RoundConfig::new("edge-9"), ["m1"], at(10));
    // The hello: the op's default limit, before any rollup.
    let hello = answer_all(&mut r, &state, &mut m, at(10));
    assert!(
        matches!(&hello[..], [Transmit { message: Message::Probe(q), .. }] if q.ops.is_empty())
    );
    assert_eq!(state.op_limit("messages"), Some(1000.0));
    // Quiet for a round at 100/s, reported.
    let mut now = at(10);
    let mut step = |state: &AgentState, r: &mut AgentRound, m: &mut MasterState, to, rate| {
        drive(state, r, m, &mut now, to, rate)
    };
    let sent = step(&state, &mut r, &mut m, 2_600, 100);
    assert!(
        sent.iter().all(|t| !matches!(t.message, Message::Surge(_))),
        "{sent:?}"
    );
    // A 50× jump: reported within a sub-window (200 ms), and suppressed
    // at once.
    let sent = step(&state, &mut r, &mut m, 2_800, 5_000);
    let surge = sent
        .iter()
        .find_map(|t| match &t.message {
            Message::Surge(q) => Some(q.clone()),
            _ => None,
        })
        .expect("an early report");
    let (pair, rates) = surge.surges().next().unwrap();
    assert_eq!(pair, Pair::new("flood", "messages"));
    assert!(rates.rate > 4_000.0 && rates.baseline < 200.0, "{rates:?}");
    let factor = state.factor(at(2_800), "flood", "messages").unwrap();
    assert!(factor > 0.7, "{factor}");
    assert!(
        events(&mut r)
            .iter()
            .any(|e| matches!(e, RoundEvent::SurgeReported { pairs: 1, .. }))
    );
    // The flood stops: the drop goes out early too and the factor is 0
    // within a sub-window or two, not a round.
    let _ = step(&state, &mut r, &mut m, 3_200, 5_000);
    let sent = step(&state, &mut r, &mut m, 3_700, 100);
    assert!(sent.iter().any(|t| matches!(t.message, Message::Surge(_))));
    assert_eq!(state.factor(at(3_700), "flood", "messages"), Some(0.0));
}

/// Checks `rate` per second of `flood` at 10 ms steps from `now` to `to`
/// ms, waking the round and answering it; returns what it sent.
fn drive(
    state: &AgentState,
    r: &mut AgentRound,
    m: &mut MasterState,
    now: &mut Nanos,
    to: u64,
    rate: u64,
) -> Vec<Transmit> {
    let mut rng = SmallRng::seed_from_u64(now.as_nanos());
    let mut sent = Vec::new();
    while *now < at(to) {
        let next = r
            .poll_timeout()
            .unwrap()
            .min(*now + Duration::from_millis(10));
        for _ in 0..rate / 100 {
            state.check(*now, "flood", "messages", 1, &mut rng);
        }
        *now = next;
        r.handle_timeout(*now, state);
        sent.extend(answer_all(r, state, m, *now));
    }
    sent
}

/// Without fast onset, the same jump waits for the round.
#[test]
fn without_fast_onset_a_jump_waits_for_the_round() {
    let state = AgentState::new(AgentConfig::default());
    let mut m = master();
    let mut r = round("edge-9", &["m1"]);
    let mut rng = SmallRng::seed_from_u64(5);
    let mut now = at(10);
    while now < at(1_900) {
        for _ in 0..50 {
            state.check(now, "flood", "messages", 1, &mut rng);
        }
        now = now + Duration::from_millis(10);
        r.handle_timeout(now, &state);
        let sent = answer_all(&mut r, &state, &mut m, now);
        assert!(sent.is_empty(), "{sent:?}");
    }
    assert_eq!(state.factor(now, "flood", "messages"), Some(0.0));
}

/// A flood's early reports, some of whose answers are lost: an agent at
/// 100/s until 2.6 s, then `per_10ms(now)` operations every 10 ms until
/// `until_ms`, everything answered at once by one master, but the answers
/// of the early reports `lost` picks (by how many reports were sent, this
/// one included). `each` sees the state after every step, with that
/// count. Returns each early report with when it was sent.
fn flood_losing_answers(
    until_ms: u64,
    per_10ms: impl Fn(Nanos) -> usize,
    lost: impl Fn(usize) -> bool,
    mut each: impl FnMut(Nanos, &AgentState, usize),
) -> (AgentState, Nanos, Vec<(Nanos, crate::wire::FactorsQuery)>) {
    let state = AgentState::new(AgentConfig::default());
    let mut m = master();
    let mut budget = crate::master::SurgeBudget::default();
    let mut r = AgentRound::new(RoundConfig::new("edge-9"), ["m1"], at(10));
    let mut now = at(10);
    answer_all(&mut r, &state, &mut m, now);
    drive(&state, &mut r, &mut m, &mut now, 2_600, 100);
    let mut rng = SmallRng::seed_from_u64(3);
    let header = ReplyHeader {
        rollup_interval: Duration::from_secs(2),
        started: T0,
        ..ReplyHeader::default()
    };
    let mut reports = Vec::new();
    while now < at(until_ms) {
        for _ in 0..per_10ms(now) {
            state.check(now, "flood", "messages", 1, &mut rng);
        }
        now = now + Duration::from_millis(10);
        r.handle_timeout(now, &state);
        while let Some(t) = r.poll_transmit() {
            let reply = match &t.message {
                Message::Surge(q) => {
                    reports.push((now, q.clone()));
                    m.answer_surge(now, q, &mut budget, 100, header).unwrap()
                }
                Message::Rollup(x) => m.answer_rollup(now, x, 100, header).unwrap(),
                Message::Recheck(q) | Message::Probe(q) => {
                    m.answer_factors(now, q, 100, header).unwrap()
                }
            };
            if matches!(t.message, Message::Surge(_)) && lost(reports.len()) {
                continue;
            }
            r.on_reply(now, t.id, &reply, &state);
        }
        each(now, &state, reports.len());
    }
    (state, now, reports)
}

/// An early report that gets no answer (lost on the way, or its answer is)
/// is sent again, unchanged, two sub-windows or so later; the master knows it
/// by its sub-window and does not count it twice.
#[test]
fn an_unanswered_early_report_is_sent_once_more_and_counted_once() {
    // The jump: the master counts the early report, but its answer is lost.
    let (state, now, reports) = flood_losing_answers(
        3_400,
        |_| 50,
        |sent| sent == 1,
        |now, state, sent| {
            if sent == 1 {
                assert_eq!(state.factor(now, "flood", "messages"), Some(0.0));
            }
        },
    );
    let [(first_at, first), (again_at, again), ..] = &reports[..] else {
        panic!("sent once more: {reports:?}");
    };
    assert_eq!(first, again);
    // Given up on at the first sub-window's end two sub-windows on (the
    // first went out at a half-window peek).
    let waited = again_at.since(*first_at);
    assert!(
        (Duration::from_millis(400)..=Duration::from_millis(500)).contains(&waited),
        "{waited:?}"
    );
    // Counted once: 5 000/s against the 1 000/s limit, not twice that.
    let factor = state.factor(now, "flood", "messages").unwrap();
    assert!((0.7..0.85).contains(&factor), "{factor}");
}

/// An early report sent twice whose answers are both lost was most likely
/// counted (the master counts it once however often it comes): the
/// agent's next report of the pair moves the master's estimate from its
/// rate (`surged`), not from the rollup's. Moved from the rollup's, as
/// when it was taken back, the master counted the jump twice: one node's
/// account at 0.95× of 100/s read 195/s and was refused.
#[test]
fn an_early_report_sent_twice_and_unanswered_stays_the_baseline() {
    // 5 000/s, then 20 000/s; both answers of the first report are lost.
    let per_10ms = |now| if now < at(3_300) { 50 } else { 200 };
    let (_, _, reports) = flood_losing_answers(3_900, per_10ms, |sent| sent <= 2, |_, _, _| {});
    let rates: Vec<SurgeRates> = reports
        .iter()
        .flat_map(|(_, q)| q.surges().map(|(_, s)| s))
        .collect();
    let [first, again, next, ..] = &rates[..] else {
        panic!("a report, its resend and a later one: {rates:?}");
    };
    assert_eq!(first, again);
    assert!(first.rate > 2_000.0 && !first.surged, "{first:?}");
    assert!(next.rate > first.rate, "{next:?}");
    assert!(next.surged && next.baseline == first.rate, "{next:?}");
    // A follow-up also says its last rollup's rate, in case the master's
    // estimate that held the first report has given way to a fresh one.
    assert_eq!(first.rollup_baseline, None);
    assert_eq!(next.rollup_baseline, Some(first.baseline), "{next:?}");
}

/// A rollup lost in the round that shows a deluge's end must not keep its
/// factor in force until the next round: the suppressed pairs of a failed
/// rollup ask their master again at once, and a lost recheck is sent once
/// more (then no more: a master that is down fails them all, and the
/// factor lapses as it would have).
#[test]
fn a_failed_rollup_rechecks_its_suppressed_pairs_once_more_at_most() {
    let mut m = master();
    // A first round suppresses the flood.
    let (state, mut r, _) = first_round_flooded("edge-3", &mut m);
    let due = r.poll_timeout().unwrap();
    r.handle_timeout(due, &state);
    answer_all(&mut r, &state, &mut m, due);
    assert!(state.factor(due, "flood", "messages").unwrap() > 0.7);
    // The flood stops; the next round's rollup is lost.
    r.handle_timeout(at(4_000), &state);
    let now = r.poll_timeout().unwrap();
    r.handle_timeout(now, &state);
    let lost = r.poll_transmit().unwrap();
    assert!(matches!(lost.message, Message::Rollup(_)), "{lost:?}");
    let failed_at = now + Duration::from_secs(1);
    r.on_failure(failed_at, lost.id, &state);
    // Sent again, and lost every time.
    for _ in 0..super::machine::ROLLUP_RESENDS {
        let resent = r.poll_transmit().unwrap();
        assert!(matches!(resent.message, Message::Rollup(_)), "{resent:?}");
        r.on_failure(failed_at, resent.id, &state);
    }
    // At once: a recheck of the suppressed pair, to the same master.
    assert_eq!(r.poll_timeout(), Some(failed_at));
    r.handle_timeout(failed_at, &state);
    let recheck = r.poll_transmit().unwrap();
    let Message::Recheck(query) = &recheck.message else {
        panic!("{recheck:?}")
    };
    assert_eq!(recheck.master, "m1");
    assert_eq!(
        query.pairs().collect::<Vec<_>>(),
        [Pair::new("flood", "messages")]
    );
    // Lost too: sent once more, at once.
    let again_at = failed_at + Duration::from_millis(20);
    r.on_failure(again_at, recheck.id, &state);
    r.handle_timeout(again_at, &state);
    let second = r.poll_transmit().unwrap();
    assert!(matches!(second.message, Message::Recheck(_)), "{second:?}");
    // Lost again: no third try before the next round.
    r.on_failure(again_at, second.id, &state);
    r.handle_timeout(again_at, &state);
    assert!(r.poll_transmit().is_none());
    assert!(r.poll_timeout().unwrap() >= at(6_000));
}

/// An account whose own limit, made after the hello, is far above its
/// op's default is refused by the local guard under the default only until
/// its master says its limit: the scan that sees the guard refuse a pair no
/// master has answered for asks at once, with a query that counts nothing.
/// (A pair the guard can tell is over its default with confidence is
/// dense enough to be reported as a surge too, which its master answers;
/// the ask is the scan's, for whatever that answer missed. Until the guard
/// weighed its windows' noise, sparse costly traffic at 1.5× the default's
/// room was refused too, and asked without a surge.)
#[test]
fn a_pair_guarded_under_its_ops_default_asks_its_master_for_its_own_limit() {
    let state = AgentState::new(AgentConfig::default());
    let mut m = MasterState::new(MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap());
    let mut r = AgentRound::new(RoundConfig::new("edge-5"), ["m1"], at(10));
    answer_all(&mut r, &state, &mut m, at(10));
    assert_eq!(state.op_limit("messages"), Some(1000.0));
    // The account's override comes after the hello (a reload), so the
    // hello's reply could not name it.
    let config = "[limits]\nmessages = 1000\n\"messages/flood\" = 100000";
    m.set_config(MasterConfig::from_toml(config).unwrap());
    // 4 000 operations a second on this agent: twice the default with its
    // room of 2×, far under its own limit.
    let mut rng = SmallRng::seed_from_u64(1);
    let mut now = at(10);
    let mut sent = Vec::new();
    let mut next_check = now;
    while now < at(900) {
        if now >= next_check {
            state.check(now, "flood", "messages", 1, &mut rng);
            next_check = next_check + Duration::from_micros(250);
        }
        now = r.poll_timeout().unwrap().min(next_check);
        r.handle_timeout(now, &state);
        sent.extend(answer_all(&mut r, &state, &mut m, now));
    }
    let asked = sent.iter().any(|t| match &t.message {
        Message::Recheck(q) => q.pairs().any(|p| p == Pair::new("flood", "messages")),
        _ => false,
    });
    assert!(asked, "{sent:?}");
    // Its own limit is known now: nothing more is refused.
    let mut rng = SmallRng::seed_from_u64(2);
    let refused = (0..3_000)
        .filter(|i| {
            let at = now + Duration::from_micros(300 * i);
            !state.check(at, "flood", "messages", 1, &mut rng).is_admit()
        })
        .count();
    assert_eq!(refused, 0);
}

/// A rollup whose reply is lost is sent again with its number; the
/// master, which counted it, answers without counting it twice, and the
/// next round carries nothing over.
#[test]
fn a_rollup_whose_reply_is_lost_is_resent_and_counted_once() {
    let state = AgentState::new(AgentConfig::default());
    let mut m = master();
    let mut log = crate::master::RollupLog::default();
    let mut r = round("edge-9", &["m1"]);
    let header = ReplyHeader {
        rollup_interval: Duration::from_secs(2),
        started: T0,
        ..ReplyHeader::default()
    };
    flood(&state, 10, 500);
    r.handle_timeout(at(2_000), &state);
    let now = r.poll_timeout().unwrap();
    r.handle_timeout(now, &state);
    let t = r.poll_transmit().unwrap();
    let Message::Rollup(rollup) = &t.message else {
        panic!("{t:?}")
    };
    // Counted, but the reply never arrives.
    let (_, repeat) = m
        .answer_rollup_once(now, rollup, &mut log, 100, header)
        .unwrap();
    assert!(!repeat);
    r.on_failure(now + Duration::from_secs(1), t.id, &state);
    let again = r.poll_transmit().unwrap();
    let Message::Rollup(resent) = &again.message else {
        panic!("{again:?}")
    };
    assert_eq!(resent.sequence, rollup.sequence);
    let (reply, repeat) = m
        .answer_rollup_once(now, resent, &mut log, 100, header)
        .unwrap();
    assert!(repeat, "counted once");
    r.on_reply(now + Duration::from_secs(1), again.id, &reply, &state);
    // The next round reports only its own counts, numbered afresh.
    flood(&state, 2_010, 500);
    r.handle_timeout(at(4_000), &state);
    let next_at = r.poll_timeout().unwrap();
    r.handle_timeout(next_at, &state);
    // (A recheck the repeat's reply asked for may go first.)
    let next = std::iter::from_fn(|| r.poll_transmit())
        .find(|t| matches!(t.message, Message::Rollup(_)))
        .unwrap();
    let Message::Rollup(next_rollup) = &next.message else {
        unreachable!()
    };
    let counts = &next_rollup.ops[0].accounts[0];
    assert_eq!((counts.attempted, counts.since), (1_000, None));
    assert_eq!(next_rollup.sequence, rollup.sequence + 1);
}

#[test]
fn a_refused_rollup_takes_its_master_down_at_once_and_its_counts_go_to_the_next_owner_in_the_same_round()
 {
    let state = AgentState::new(AgentConfig::default());
    let mut m = master();
    let mut r = round("edge-1", &["m1", "m2"]);
    let owner = r.membership().live().owner("flood").unwrap().to_owned();
    let other = if owner == "m1" { "m2" } else { "m1" };
    flood(&state, 0, 100);
    r.handle_timeout(at(2_000), &state);
    let now = r.poll_timeout().unwrap();
    r.handle_timeout(now, &state);
    let t = r.poll_transmit().unwrap();
    assert_eq!(t.master, owner);
    // Nothing listens at the owner's address: certain, so no resend and
    // nothing kept in doubt; it is down after one failure, not two.
    r.on_refused(now, t.id, &state);
    assert!(!r.membership().is_up(&owner));
    assert!(events(&mut r).contains(&RoundEvent::RingChanged {
        master: owner.clone(),
        up: false
    }));
    let sent = answer_all(&mut r, &state, &mut m, now);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].master, other);
    let Message::Rollup(moved) = &sent[0].message else {
        panic!("{sent:?}")
    };
    assert_eq!(moved.attempted(), 200);
    // Answered: the next owner's limit is in force at once.
    assert!(state.peek(now, "flood", "messages").limit > 0.0);
}

/// Answers every transmit from the master it went to; every request to
/// `cut_off` fails (its replies lost). Returns what was sent.
fn answer_each(
    round: &mut AgentRound,
    state: &AgentState,
    masters: &mut BTreeMap<String, MasterState>,
    now: Nanos,
    cut_off: &str,
) -> Vec<Transmit> {
    let mut sent = Vec::new();
    while let Some(t) = round.poll_transmit() {
        if t.master == cut_off {
            round.on_failure(now, t.id, state);
            sent.push(t);
            continue;
        }
        let m = masters.get_mut(&t.master).expect("a known master");
        let reply = reply_to(m, now, &t, T0);
        round.on_reply(now, t.id, &reply, state);
        sent.push(t);
    }
    sent
}

/// The joins among `sent`: (master, rate) per pair.
fn joins(sent: &[Transmit]) -> Vec<(String, f32)> {
    sent.iter()
        .filter_map(|t| match &t.message {
            Message::Surge(q) => Some((t.master.clone(), q)),
            _ => None,
        })
        .flat_map(|(master, q)| {
            q.surges()
                .filter(|(_, s)| s.joined)
                .map(|(_, s)| (master.clone(), s.rate))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn pairs_the_ring_moves_between_cuts_are_joined_to_their_new_master_once() {
    let state = AgentState::new(AgentConfig::default());
    let mut r = AgentRound::new(RoundConfig::new("edge-1"), ["m1", "m2"], at(10));
    let owner = r.membership().live().owner("flood").unwrap().to_owned();
    let other = if owner == "m1" { "m2" } else { "m1" }.to_owned();
    let mut masters: BTreeMap<String, MasterState> =
        [("m1".to_owned(), master()), ("m2".to_owned(), master())].into();
    let mut rng = SmallRng::seed_from_u64(3);
    let mut now = at(10);
    let mut sent = Vec::new();
    let mut demand_after_join = None;
    // 3 000/s against a 1 000/s limit, held by its owner; from 5 s the
    // owner's replies are lost (a one-way partition), and from 12 s they
    // come back.
    while now < at(16_000) {
        for _ in 0..30 {
            state.check(now, "flood", "messages", 1, &mut rng);
        }
        now = r
            .poll_timeout()
            .unwrap()
            .min(now + Duration::from_millis(10));
        r.handle_timeout(now, &state);
        let cut_off = if (5_000..12_000).contains(&(now.since(T0).as_millis() as u64)) {
            owner.as_str()
        } else {
            ""
        };
        let answered = answer_each(&mut r, &state, &mut masters, now, cut_off);
        if let Some((master, _)) = joins(&answered).first() {
            // What the master the pair joined estimates, right after.
            let verdict = masters[master].verdict(now, "flood", "messages").unwrap();
            demand_after_join.get_or_insert(verdict.rates.demand);
        }
        sent.extend(answered.into_iter().map(|t| (now, t)));
    }
    let went_down = sent
        .iter()
        .position(|(_, t)| t.master == other && matches!(t.message, Message::Rollup(_)))
        .expect("the rollups moved to the other master");
    let (down_at, _) = &sent[went_down];
    let transmits: Vec<Transmit> = sent.iter().map(|(_, t)| t.clone()).collect();
    let all = joins(&transmits);
    // One join each way: to the other master when the owner went off the
    // ring (between cuts: its rollups failed after being sent), and back
    // when a probe found it again; each with the agent's rate, about
    // 3 000/s.
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0].0, other);
    assert_eq!(all[1].0, owner);
    for (_, rate) in &all {
        assert!((2_500.0..3_500.0).contains(rate), "{all:?}");
    }
    // The other master, which had never seen the account, suppressed it
    // from the join's reply, before the account's first rollup reached it.
    let first_join = sent
        .iter()
        .position(
            |(_, t)| matches!(&t.message, Message::Surge(q) if q.surges().any(|(_, s)| s.joined)),
        )
        .unwrap();
    assert!(
        first_join < went_down,
        "joined at {:?}, first rollup at {down_at:?}",
        sent[first_join].0
    );
    let demand = demand_after_join.unwrap();
    assert!((2_500.0..3_500.0).contains(&demand), "{demand}");
}

#[test]
fn a_down_master_is_probed_when_its_probe_is_due_not_at_the_next_cut() {
    let state = AgentState::new(AgentConfig::default());
    let mut r = round("edge-1", &["m1", "m2"]);
    let owner = r.membership().live().owner("flood").unwrap().to_owned();
    flood(&state, 0, 100);
    r.handle_timeout(at(2_000), &state);
    let now = r.poll_timeout().unwrap();
    r.handle_timeout(now, &state);
    let t = r.poll_transmit().unwrap();
    r.on_refused(now, t.id, &state);
    while r.poll_transmit().is_some() {}
    // Its first probe is due 500 ms ± 25% after it went down, well before
    // the next cut at 4 s; the round wakes for it and sends it then.
    let due = r.membership().next_probe(&owner).unwrap();
    assert!(due < at(3_000), "{due:?}");
    assert_eq!(r.poll_timeout(), Some(due));
    r.handle_timeout(due, &state);
    let probe = r.poll_transmit().expect("a probe");
    assert_eq!(probe.master, owner);
    assert!(matches!(probe.message, Message::Probe(_)), "{probe:?}");
    assert!(r.poll_transmit().is_none());
}

#[test]
fn a_restarted_master_rejoins_on_the_sub_window_grid_and_is_told_its_pairs_rates() {
    let state = AgentState::new(AgentConfig::default());
    let mut r = AgentRound::new(RoundConfig::new("edge-1"), ["m1", "m2"], at(10));
    let owner = r.membership().live().owner("flood").unwrap().to_owned();
    let mut masters: BTreeMap<String, MasterState> =
        [("m1".to_owned(), master()), ("m2".to_owned(), master())].into();
    let mut rng = SmallRng::seed_from_u64(5);
    // The owner is killed at 3 s (its port refuses) and restarted with
    // nothing at 6.3 s: every agent puts it back at 6.3 + 1.5 s on the
    // 200-ms grid, 7.8 s, mid-round.
    let restarted = at(6_300);
    let (mut now, mut back_at, mut joined) = (at(10), None, Vec::new());
    while now < at(9_000) {
        for _ in 0..30 {
            state.check(now, "flood", "messages", 1, &mut rng);
        }
        let next = r
            .poll_timeout()
            .unwrap()
            .min(now + Duration::from_millis(10));
        if now < restarted && next >= restarted {
            // Restarted empty.
            masters.insert(owner.clone(), master());
        }
        now = next;
        r.handle_timeout(now, &state);
        while let Some(t) = r.poll_transmit() {
            if t.master == owner && (at(3_000)..restarted).contains(&now) {
                r.on_refused(now, t.id, &state);
                continue;
            }
            if let Message::Surge(q) = &t.message {
                let joins = q.surges().filter(|(_, s)| s.joined);
                joined.extend(joins.map(|(_, s)| (t.master.clone(), now, s.rate)));
            }
            let started = if t.master == owner && now >= restarted {
                restarted
            } else {
                T0
            };
            let reply = reply_to(masters.get_mut(&t.master).unwrap(), now, &t, started);
            r.on_reply(now, t.id, &reply, &state);
        }
        for event in events(&mut r) {
            if let RoundEvent::RingChanged { master, up: true } = event {
                assert_eq!(master, owner);
                back_at.get_or_insert(now);
            }
        }
    }
    assert_eq!(
        back_at,
        Some(at(7_800)),
        "back 1.5 s after it started, on the 200-ms grid"
    );
    // Joined at that instant, with the agent's rate, and the restarted
    // master, which had nothing, estimates the whole demand before any
    // rollup reaches it (the next cut is at 8 s).
    let (master, when, rate) = joined.first().cloned().expect("a join");
    assert_eq!((master.as_str(), when), (owner.as_str(), at(7_800)));
    assert!((2_500.0..3_500.0).contains(&rate), "{rate}");
    let demand = masters[&owner]
        .verdict(at(7_800), "flood", "messages")
        .unwrap()
        .rates
        .demand;
    assert!((2_500.0..3_500.0).contains(&demand), "{demand}");
}

/// Account numbers through the round: a master whose replies say it takes
/// them gets each account's name once and its number after; a master that
/// lost them (it restarted) refuses the rollup, and the round sends it
/// again at once, naming the account, with the same number (counted once),
/// counting no failure against the master.
#[test]
fn a_master_that_lost_the_account_numbers_gets_the_names_again_at_once() {
    use crate::wire::dictionary::Dictionaries;
    let state = AgentState::new(AgentConfig::default());
    let mut m = master();
    let mut dictionaries = Dictionaries::default();
    let mut r = round("edge-3", &["m1"]);
    // What each rollup carried: (sequence, by number, named).
    let mut carried = Vec::new();
    let mut refusals = 0;
    for round_end in (2_000..=12_000).step_by(2_000) {
        flood(&state, round_end - 2_000, 100);
        r.handle_timeout(at(round_end), &state);
        let now = r.poll_timeout().unwrap();
        r.handle_timeout(now, &state);
        if round_end == 8_000 {
            // The master restarts: it holds no numbers.
            dictionaries = Dictionaries::default();
        }
        while let Some(t) = r.poll_transmit() {
            let Message::Rollup(rollup) = &t.message else {
                let reply = reply_to(&mut m, now, &t, T0);
                r.on_reply(now, t.id, &reply, &state);
                continue;
            };
            let by_number: usize = rollup.ops.iter().map(|o| o.by_id.len()).sum();
            carried.push((rollup.sequence, by_number, rollup.entries() - by_number));
            let mut named = Rollup::clone(rollup);
            match dictionaries.expand(now, &mut named) {
                Ok(takes_ids) => {
                    let header = ReplyHeader {
                        rollup_interval: Duration::from_secs(2),
                        started: T0,
                        takes_ids,
                        ..ReplyHeader::default()
                    };
                    let reply = m.answer_rollup(now, &named, 100, header).unwrap();
                    r.on_reply(now, t.id, &reply, &state);
                }
                Err(e) => {
                    assert!(e.is_unknown(), "{e}");
                    refusals += 1;
                    r.on_unknown_numbers(now, t.id, &state);
                }
            }
        }
    }
    // Named before any reply said numbers; named with its number; then by
    // number; after the restart refused, resent named under the same
    // sequence, and by number again.
    assert_eq!(
        carried,
        [
            (1, 0, 1),
            (2, 0, 1),
            (3, 1, 0),
            (4, 1, 0),
            (4, 0, 1),
            (5, 1, 0),
            (6, 1, 0)
        ],
    );
    assert_eq!(refusals, 1);
    assert!(r.membership().is_up("m1"), "a refusal is not a failure");
}

/// A new account that arrives as a deluge off the sub-window grid is
/// reported by its young peek 20 ms after the driver, woken by the state's
/// hook, first showed it to the round: before the grid's next peek. The
/// master is then sent no other early report for half a sub-window.
#[test]
fn a_new_accounts_deluge_is_reported_before_the_grid_comes_round() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let woken = Arc::new(AtomicBool::new(false));
    let hook = woken.clone();
    let state = AgentState::new(AgentConfig::default()).with_young_hook(move || {
        hook.store(true, SeqCst);
    });
    let mut m = master();
    let mut r = AgentRound::new(RoundConfig::new("edge-9"), ["m1"], at(10));
    answer_all(&mut r, &state, &mut m, at(10));
    let mut rng = SmallRng::seed_from_u64(3);
    // Up to 1 030 ms the round runs on its own.
    let mut now = at(10);
    while now < at(1_030) {
        now = r.poll_timeout().unwrap().min(at(1_030));
        r.handle_timeout(now, &state);
        answer_all(&mut r, &state, &mut m, now);
    }
    // The deluge's first operation, 70 ms before the grid's next peek.
    state.check(at(1_030), "flood", "messages", 1, &mut rng);
    assert!(woken.swap(false, SeqCst));
    r.handle_timeout(at(1_030), &state);
    assert_eq!(r.poll_timeout(), Some(at(1_050)));
    for ms in 1_030..1_050 {
        for _ in 0..5 {
            state.check(at(ms), "flood", "messages", 1, &mut rng);
        }
    }
    r.handle_timeout(at(1_050), &state);
    let sent = answer_all(&mut r, &state, &mut m, at(1_050));
    let rates: Vec<_> = sent
        .iter()
        .filter_map(|t| match &t.message {
            Message::Surge(q) => q.surges().next().map(|(_, rates)| rates),
            _ => None,
        })
        .collect();
    assert_eq!(rates.len(), 1, "{sent:?}");
    assert_eq!(rates[0].rate, 5_000.0);
    let factor = state.factor(at(1_050), "flood", "messages").unwrap();
    assert!(factor > 0.7, "suppressed at 1 050 ms: {factor}");
    // The flood goes on, tripled: the grid's peek at 1 100 ms sees it,
    // and so does the young peek, but its master had an early report 50
    // ms before.
    let mut surges = Vec::new();
    now = at(1_050);
    while now < at(1_300) {
        let next = r
            .poll_timeout()
            .unwrap()
            .min(now + Duration::from_millis(1));
        while now < next {
            for _ in 0..15 {
                state.check(now, "flood", "messages", 1, &mut rng);
            }
            now = now + Duration::from_millis(1);
        }
        r.handle_timeout(now, &state);
        for t in answer_all(&mut r, &state, &mut m, now) {
            if matches!(t.message, Message::Surge(_)) {
                surges.push(now);
            }
        }
    }
    assert!(!surges.is_empty(), "the rise is told");
    assert!(surges[0] >= at(1_150), "{surges:?}");
}
