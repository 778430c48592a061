//! Old and new side by side: agents that predate fast onset against
//! today's masters, and today's agents against masters that predate it.
//! Each runs the agents' own round (the simulator's, which is the agent
//! library's) against the product's master service, every message through
//! `damper.v1` bytes; the old masters see only the fields they knew
//! ([`WireMasters::predating_fast_onset`]). The same for sparse hints and
//! polls ([`WireMasters::predating_hints`]).

use damper_core::wire::FactorsQuery;
use damper_proto::v1::FactorsRequest;
use damper_sim::engine::{Run, Sim};
use damper_tests::masters::{FactorsRequestV0, OpAccountsV0, WireMasters, as_seen_before_hints};
use damper_tests::{assert_held, scenario, series};
use prost::Message as _;

const LIMITS: &str = "[limits]\nmessages = 1000\n";
const LIMITS_SPARSE: &str = "[limits]\nmessages = 2000\n";

/// 8 agents, 3 masters, 1% loss; `flood` at 10× its limit from 10 s to
/// 30 s, `calm` at half of it throughout.
fn cluster() -> String {
    format!(
        "name = \"compat\"\nduration_s = 40\nseed = 21\n\
         [cluster]\nagents = 8\nmasters = 3\nlatency_ms = 5\njitter_ms = 2\nloss = 0.01\n\
         {LIMITS}\n\
         [[traffic]]\naccount = \"flood\"\nop = \"messages\"\n\
         profile = [ {{ at_s = 0, rate = 100 }}, {{ at_s = 10, rate = 10000 }}, {{ at_s = 30, rate = 100 }} ]\n\
         [[traffic]]\naccount = \"calm\"\nop = \"messages\"\nprofile = [ {{ at_s = 0, rate = 500 }} ]\n"
    )
}

/// Cost admitted above the limit while the flood lasts.
fn over_admitted(run: &Run) -> u64 {
    series(run, "flood", "messages").seconds[10..30]
        .iter()
        .map(|s| s.admitted.saturating_sub(1_000))
        .sum()
}

/// What every run must show, whoever is old: the flood held at its limit
/// once the rounds know it, released when it stops, `calm` never touched,
/// no count lost (rollups lost on the network are carried over).
fn assert_the_loop_works(run: &Run) {
    let flood = series(run, "flood", "messages");
    let held = &flood.seconds[16..30];
    let admitted = held.iter().map(|s| s.admitted).sum::<u64>() as f64 / held.len() as f64;
    assert_held("flood from 16 s", admitted, 1_000.0, 0.1);
    for (t, s) in flood.seconds.iter().enumerate().skip(34) {
        assert_eq!(s.admitted, s.attempted, "flood released, second {t}");
    }
    for (t, s) in series(run, "calm", "messages").seconds.iter().enumerate() {
        assert_eq!(s.admitted, s.attempted, "calm, second {t}");
    }
    assert_eq!(run.dropped_cost, 0, "cost dropped");
}

/// An old agent's request is today's with the new fields unset, byte for
/// byte: so running today's round with fast onset off (no hello, no early
/// report) is running an old agent.
#[test]
fn an_old_agents_requests_are_todays_with_the_new_fields_unset() {
    let query = FactorsQuery::new("edge-1", [damper_core::Pair::new("acme", "messages")]);
    let today = FactorsRequest::from(query).encode_to_vec();
    let old = FactorsRequestV0 {
        agent_id: "edge-1".into(),
        ops: vec![OpAccountsV0 {
            op: "messages".into(),
            accounts: vec!["acme".into()],
        }],
    }
    .encode_to_vec();
    assert_eq!(today, old);
}

#[test]
fn agents_that_predate_fast_onset_work_with_todays_masters() {
    let mut masters = WireMasters::new(LIMITS, 3);
    let old_agents = scenario(&cluster())
        .with_fast_onset(false)
        .with_account_numbers(false);
    let run = Sim::with_masters(old_agents, &mut masters).run(|_| {});
    assert_eq!((run.control.surges, run.control.probes), (0, 0));
    assert_eq!(masters.numbered_rollups, 0);
    assert_the_loop_works(&run);
}

/// Agents that give accounts by number (a rollup's names sent once per
/// master): today's masters take them, and the loop works as with names;
/// masters that predate numbers never say they take them, and get names.
#[test]
fn accounts_go_by_number_to_todays_masters_and_by_name_to_older_ones() {
    let mut masters = WireMasters::new(LIMITS, 3);
    let run = Sim::with_masters(scenario(&cluster()), &mut masters).run(|_| {});
    assert!(masters.numbered_rollups > 0);
    assert_the_loop_works(&run);
    let mut old = WireMasters::predating_fast_onset(LIMITS, 3);
    let run = Sim::with_masters(scenario(&cluster()), &mut old).run(|_| {});
    assert_eq!(old.numbered_rollups, 0);
    assert_the_loop_works(&run);
}

#[test]
fn todays_agents_work_with_masters_that_predate_fast_onset() {
    let mut masters = WireMasters::predating_fast_onset(LIMITS, 3);
    let run = Sim::with_masters(scenario(&cluster()), &mut masters).run(|_| {});
    // The agents said hello and reported the flood early; the old masters
    // answered both as plain queries, without an error.
    assert!(
        run.control.probes > 0 && run.control.surges > 0,
        "{:?}",
        run.control
    );
    assert_the_loop_works(&run);
    // No worse than old agents against the same old masters: the early
    // reports, read as queries, change nothing.
    let mut masters = WireMasters::predating_fast_onset(LIMITS, 3);
    let rollups_alone = scenario(&cluster()).with_fast_onset(false);
    let before = Sim::with_masters(rollups_alone, &mut masters).run(|_| {});
    let (now, then) = (over_admitted(&run), over_admitted(&before));
    assert!(
        now as f64 <= then as f64 * 1.1,
        "over-admitted {now} with fast onset against old masters, {then} without"
    );
    // And against today's masters the same agents do far better.
    let mut masters = WireMasters::new(LIMITS, 3);
    let today = Sim::with_masters(scenario(&cluster()), &mut masters).run(|_| {});
    println!(
        "over-admitted: {now} against old masters, {then} by old agents against them, {} against today's",
        over_admitted(&today)
    );
    assert!(
        over_admitted(&today) * 3 < then,
        "{} with today's masters, {then} with old ones",
        over_admitted(&today)
    );
}

/// 20 agents, 3 masters, 1% loss; `costly` (operations of cost 51, a
/// limit of 2 000/s) at half its limit, then at 5× from 10 s to 30 s: one
/// operation or none per sub-window on each agent, a flood only sparse
/// hints see within a second.
fn sparse_cluster() -> String {
    "name = \"compat sparse\"\nduration_s = 40\nseed = 23\n\
     [cluster]\nagents = 20\nmasters = 3\nlatency_ms = 5\njitter_ms = 2\nloss = 0.01\n\
     [limits]\nmessages = 2000\n\
     [[traffic]]\naccount = \"costly\"\nop = \"messages\"\ncost = 51\n\
     profile = [ { at_s = 0, rate = 20 }, { at_s = 10, rate = 196 }, { at_s = 30, rate = 20 } ]\n"
        .to_owned()
}

/// Cost `costly` admitted above its limit in the flood's first six
/// seconds.
fn onset_over(run: &Run) -> u64 {
    series(run, "costly", "messages").seconds[10..16]
        .iter()
        .map(|s| s.admitted.saturating_sub(2_000))
        .sum()
}

/// The sparse flood held at its limit once the rounds know it, released
/// when it stops, nothing lost.
fn assert_the_sparse_flood_is_held(run: &Run) {
    let costly = series(run, "costly", "messages");
    let held = &costly.seconds[16..30];
    let admitted = held.iter().map(|s| s.admitted).sum::<u64>() as f64 / held.len() as f64;
    assert_held("costly from 16 s", admitted, 2_000.0, 0.1);
    for (t, s) in costly.seconds.iter().enumerate().skip(35) {
        assert_eq!(s.admitted, s.attempted, "costly released, second {t}");
    }
    assert_eq!(run.dropped_cost, 0, "cost dropped");
}

/// Why agents send hints only to masters that say they take them: a
/// master that predates hints reads one as an early report of a jump,
/// whose rate it would add to the account's estimate.
#[test]
fn a_hint_read_by_a_master_that_predates_hints_is_a_jump() {
    let hint = damper_core::wire::SurgeRates {
        rate: 510.0,
        baseline: 25.5,
        hint: true,
        ops: 4,
        ..Default::default()
    };
    let pair = damper_core::Pair::new("costly", "messages");
    let query = FactorsQuery::surge(
        "edge-1",
        damper_core::time::Nanos::from_secs(1 << 30),
        [(pair, hint)],
    );
    let bytes = FactorsRequest::from(query).encode_to_vec();
    let seen = FactorsQuery::from(as_seen_before_hints(&bytes));
    let (_, read) = seen.surges().next().unwrap();
    assert!(
        !read.hint && read.ops == 0 && read.rate == 510.0,
        "{read:?}"
    );
}

#[test]
fn todays_agents_send_no_hints_to_masters_that_predate_them() {
    let mut old = WireMasters::predating_hints(LIMITS_SPARSE, 3);
    let run = Sim::with_masters(scenario(&sparse_cluster()), &mut old).run(|_| {});
    assert_eq!(run.control.hints, 0, "{:?}", run.control);
    assert_the_sparse_flood_is_held(&run);
    // Today's masters are sent hints, poll, and hold the onset far better.
    let mut today = WireMasters::new(LIMITS_SPARSE, 3);
    let now = Sim::with_masters(scenario(&sparse_cluster()), &mut today).run(|_| {});
    assert!(
        now.control.hints > 0 && now.control.poll_pushes > 0,
        "{:?}",
        now.control
    );
    assert_the_sparse_flood_is_held(&now);
    let (now, then) = (onset_over(&now), onset_over(&run));
    println!(
        "over the limit in the onset's 6 s: {now} with today's masters, {then} with older ones"
    );
    assert!(now * 2 < then, "{now} against {then}");
}

/// Agents that predate polls drop them from pushes: today's masters poll
/// (their newer agents hinted) and nothing answers; the flood is held by
/// its rounds, as with hints off.
#[test]
fn agents_that_predate_polls_are_held_by_their_rounds() {
    let mut masters = WireMasters::new(LIMITS_SPARSE, 3);
    masters.agents_ignore_polls = true;
    let run = Sim::with_masters(scenario(&sparse_cluster()), &mut masters).run(|_| {});
    assert!(
        masters.polls_dropped > 0 && run.control.hints > 0,
        "{:?}",
        run.control
    );
    assert_eq!(run.control.poll_pushes, 0);
    assert_the_sparse_flood_is_held(&run);
    let mut masters = WireMasters::new(LIMITS_SPARSE, 3);
    let no_hints = scenario(&sparse_cluster()).with_sparse_hints(false);
    let before = Sim::with_masters(no_hints, &mut masters).run(|_| {});
    let (now, then) = (onset_over(&run), onset_over(&before));
    assert!(
        now as f64 <= then as f64 * 1.1,
        "{now} ignoring polls, {then} without hints"
    );
}
