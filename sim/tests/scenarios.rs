//! The simulator's claims, on the shipped scenarios.

use damper_core::config::EstimatorKind;
use damper_sim::engine::{self, Run};
use damper_sim::scenario::Scenario;
use damper_sim::summary::{AccountSummary, Summary, summarize};
use damper_sim::timeseries_csv;

fn scenario(name: &str) -> Scenario {
    Scenario::from_toml(&scenario_toml(name)).unwrap()
}

/// The shipped scenario `name`'s file.
fn scenario_toml(name: &str) -> String {
    let path = format!("{}/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap()
}

/// Scenario `name` at `seed`, every traffic rate multiplied by `by`.
fn scaled(name: &str, seed: u64, by: f64) -> Scenario {
    rescaled(scenario(name), seed, by)
}

/// Scenario `s` at `seed`, every traffic rate multiplied by `by`.
fn rescaled(mut s: Scenario, seed: u64, by: f64) -> Scenario {
    s.seed = seed;
    for point in s.traffic.iter_mut().flat_map(|t| t.profile.iter_mut()) {
        point.rate *= by;
    }
    s
}

fn simulate(s: Scenario) -> (Run, Summary) {
    let run = engine::run(s, |_| {});
    let summary = summarize(&run);
    (run, summary)
}

fn account<'a>(summary: &'a Summary, name: &str) -> &'a AccountSummary {
    summary.accounts.iter().find(|a| a.account == name).unwrap()
}

#[test]
fn same_seed_same_output_byte_for_byte() {
    let (a, sa) = simulate(scenario("deluge"));
    let (b, sb) = simulate(scenario("deluge"));
    assert_eq!(timeseries_csv(&a), timeseries_csv(&b));
    assert_eq!(
        serde_json::to_string(&sa).unwrap(),
        serde_json::to_string(&sb).unwrap()
    );
    let mut other = scenario("deluge");
    other.seed += 1;
    let (c, _) = simulate(other);
    assert_ne!(
        timeseries_csv(&a),
        timeseries_csv(&c),
        "the seed changes the arrivals"
    );
}

#[test]
fn wake_ups_handled_together_or_on_two_cores_give_the_same_output_byte_for_byte() {
    let mut many = scenario("many-accounts");
    many.duration_s = 40;
    // The network's draws are taken as each round's sends are: in the
    // order of the wake-ups.
    many.cluster.latency_ms = 10.0;
    many.cluster.jitter_ms = 3.0;
    many.cluster.loss = 0.01;
    // A master down: agents probing it are woken twice at one instant.
    let killed = scenario("master-kill");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for s in [many, killed] {
        let one_by_one =
            pool.install(|| engine::Sim::new(s.clone()).one_wake_at_a_time().run(|_| {}));
        let together = engine::Sim::new(s.clone())
            .parallel_from(usize::MAX)
            .run(|_| {});
        let shared = pool.install(|| engine::Sim::new(s.clone()).parallel_from(0).run(|_| {}));
        assert!(
            one_by_one
                .series
                .iter()
                .any(|i| !i.factor_changes.is_empty()),
            "something was suppressed"
        );
        for run in [&together, &shared] {
            assert_eq!(
                timeseries_csv(&one_by_one),
                timeseries_csv(run),
                "{}",
                s.name
            );
            assert_eq!(
                serde_json::to_string(&summarize(&one_by_one)).unwrap(),
                serde_json::to_string(&summarize(run)).unwrap()
            );
            assert_eq!(
                format!("{:?}", one_by_one.control),
                format!("{:?}", run.control)
            );
        }
    }
}

#[test]
fn the_demand_policy_holds_the_deluge_steadily() {
    let (_, s) = simulate(scenario("deluge"));
    let acme = account(&s, "acme");
    let steady = acme.steady_admitted_ratio.unwrap();
    assert!((0.95..=1.05).contains(&steady), "{steady}");
    let p2p = acme.oscillation_p2p.unwrap();
    assert!(p2p <= 0.1, "{p2p}");
    let calm = account(&s, "calm");
    assert_eq!(calm.false_rejections, 0);
    assert_eq!(
        calm.admitted, calm.attempted,
        "the well-behaved account is never touched"
    );
}

/// Ably's first approach, faithfully: the linear ramp on the admitted rate,
/// with Ably's modified moving average. Full swings, with a period near the
/// 24 s window.
#[test]
fn the_linear_ramp_oscillates_with_the_windows_period() {
    let s = scenario("deluge")
        .with_policy("linear-ramp")
        .unwrap()
        .with_estimator(EstimatorKind::AblyMma);
    let (run, summary) = simulate(s);
    let p2p = account(&summary, "acme").oscillation_p2p.unwrap();
    assert!(p2p >= 0.8, "{p2p}");
    // The period: upward crossings of the limit by the admitted rate during
    // the deluge (30 s to 180 s), after it settled into its cycle.
    let admitted: Vec<u64> = run.series[0].seconds[45..180]
        .iter()
        .map(|s| s.admitted)
        .collect();
    let ups: Vec<usize> = (1..admitted.len())
        .filter(|&i| admitted[i - 1] <= 1000 && admitted[i] > 1000)
        .collect();
    assert!(ups.len() >= 3, "{ups:?}");
    let period = (ups[ups.len() - 1] - ups[0]) as f64 / (ups.len() - 1) as f64;
    assert!(
        (18.0..=36.0).contains(&period),
        "period {period} s: {ups:?}"
    );
}

#[test]
fn the_default_estimator_releases_within_3_s_and_ablys_takes_most_of_a_window() {
    let (_, fast) = simulate(scenario("deluge"));
    let release = account(&fast, "acme").release_s.unwrap();
    assert!(release <= 3.0, "default estimator: {release} s");
    // The estimator alone: fast onset would release it early too.
    let (_, ably) = simulate(
        scenario("deluge")
            .with_estimator(EstimatorKind::AblyMma)
            .with_fast_onset(false),
    );
    let release = account(&ably, "acme").release_s.unwrap();
    assert!(release >= 12.0, "Ably's average: {release} s");
}

#[test]
fn steady_traffic_under_the_limit_is_never_suppressed() {
    for policy in ["demand", "linear-ramp"] {
        let (_, s) = simulate(scenario("steady").with_policy(policy).unwrap());
        for a in &s.accounts {
            assert_eq!(a.admitted, a.attempted, "{policy}: {}", a.account);
        }
    }
}

#[test]
fn a_single_node_flood_is_caught_by_the_local_guard_within_a_second() {
    let (_, s) = simulate(scenario("single-agent"));
    let solo = account(&s, "solo");
    assert!(solo.reaction_s.unwrap() <= 1.0, "{solo:?}");
    // Each 10-ms step's thousand operations are decided as a node's
    // checks would be: the guard's window closes early within the first
    // step of the deluge (607 over; 1 141 when a batch was decided whole).
    assert!(solo.onset_over_admitted.unwrap() < 900, "{solo:?}");
    assert!((0.95..=1.05).contains(&solo.steady_admitted_ratio.unwrap()));
    assert_eq!(account(&s, "calm").false_rejections, 0);
}

#[test]
fn every_shipped_scenario_parses_and_runs() {
    let dir = format!("{}/scenarios", env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            e.unwrap()
                .path()
                .file_stem()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    assert!(names.len() >= 7, "{names:?}");
    for name in names {
        let s = scenario(&name);
        let seconds = s.duration_s as usize;
        let (run, summary) = simulate(s);
        assert!(
            run.series.iter().all(|x| x.seconds.len() == seconds),
            "{name}"
        );
        assert!(!summary.accounts.is_empty(), "{name}");
    }
}

#[test]
fn the_killed_master_owns_the_flooding_account() {
    // The scenario's comment names m2; the ring must agree.
    let ring = damper_core::ring::Ring::new(["m0", "m1", "m2"]);
    assert_eq!(ring.owner("acme"), Some("m2"));
}

/// Precision at the limit (`docs/simulation.md`): Poisson accounts at
/// 0.9–0.95× of small limits are never refused, while one at 1.1× is held
/// (the costly account with a large override is refused only in its first
/// second, under its op's default: see the docs); publishers sharing an
/// account, at 1×, 2× and 5× of one another or taking strict turns, each
/// keep their share within 1% in every steady 10-s bucket, and costly
/// ones, or a costly one beside a cheap one, within about 5%.
#[test]
fn accounts_under_their_limits_are_not_refused_and_publishers_keep_their_shares() {
    let (_, near) = simulate(scenario("near-limit-small"));
    for name in ["small-90", "small-95", "tiny-90"] {
        let a = account(&near, name);
        assert_eq!((a.false_rejections, a.admitted), (0, a.attempted), "{name}");
    }
    let over = account(&near, "over-110");
    let kept = over.admitted as f64 / over.attempted as f64;
    assert!(kept < 0.97, "over-110 kept {kept}");
    let costly = account(&near, "costly-95");
    assert!(
        costly.false_rejections < 5_000,
        "{}",
        costly.false_rejections
    );

    // Publishers named to their agents (`check_from`), each on its own
    // lane.
    let (_, publishers) = simulate(scenario("publishers"));
    for name in ["shared", "turns", "four-turns"] {
        let fairness = account(&publishers, name).fairness_10s.unwrap();
        assert!(fairness < 0.01, "{name}: {fairness}");
    }
    // Costly publishers are paced, which sets what the pair may admit
    // sub-window by sub-window, whoever sends: a publisher's 10 s hold
    // more of some sub-windows than of others (0.036 median over seeds
    // 1–12, 0.043 at worst, this seed 0.053; 0.10 and more on the pair's
    // rule alone).
    let costly = account(&publishers, "costly-shared").fairness_10s.unwrap();
    assert!(costly < 0.06, "costly-shared: {costly}");
    // A costly publisher beside a cheap one: the pair's rule alone kept it
    // 8% off its share; its lane holds it to `1 − f` of its own cost.
    let (_, mixed) = simulate(scenario("mixed-costs"));
    let costs = account(&mixed, "mixed-costs");
    assert!(costs.fairness_10s.unwrap() < 0.05, "{costs:?}");
    // And the account is held at its limit: its agents learn that one
    // operation may cost 51 (1.30× when the scans took the costs'
    // divisor, 1, for it).
    assert!(costs.steady_admitted_ratio.unwrap() < 1.05, "{costs:?}");
    // Publishes to channels of 1 000 and 1 002 subscribers: held at 1.49×
    // when their divisor, 1, stood for one operation.
    let (_, fanout) = simulate(scenario("varying-fanout"));
    let fanout = account(&fanout, "fanout");
    assert!(fanout.steady_admitted_ratio.unwrap() < 1.05, "{fanout:?}");
}

/// With 5% of messages lost, replies included, a rollup its master counted
/// but whose reply was lost is sent again with its number and counted
/// once: the masters count no more than the agents attempted (a little
/// less: the last round's counts are still on their way when the run
/// ends). Before rollups were numbered, each lost reply's counts were
/// counted twice.
#[test]
fn lost_replies_are_not_counted_twice() {
    let mut s = scenario("deluge");
    s.cluster.loss = 0.05;
    let mut masters = damper_sim::engine::SimMasters::new(
        &s.master,
        s.cluster.masters as usize,
        engine::EPOCH,
        s.cluster.push,
    );
    let run = engine::Sim::with_masters(s, &mut masters).run(|_| {});
    let summary = summarize(&run);
    let attempted: u64 = summary.accounts.iter().map(|a| a.attempted).sum();
    let (counted, repeats) = masters.counted();
    eprintln!("attempted {attempted}, counted {counted}, repeats {repeats}");
    assert!(repeats > 10, "the resends happened: {repeats}");
    assert!(
        counted <= attempted,
        "counted {counted} of {attempted} attempted"
    );
    assert!(
        counted as f64 >= 0.97 * attempted as f64,
        "counted {counted} of {attempted}"
    );
}

/// An overload that falls back under its limit over 20 agents, each one's
/// share too small to report in two sub-windows, is released within a
/// second of the fall: the agents see it on their pairs' slow means, and
/// the master pushes the release to those that have not reported yet.
/// Medians over seeds 1–5, and every seed within two seconds: an agent
/// that misses the release's push (0.5% are lost) is still asking again
/// every 100 ms while the fall holds it within twice the limit
/// (`master::recheck_at`), where before it waited for its round (2.15 s
/// in seeds 1 and 5). Without pushes, the agents that reported the fall
/// hear the release soon, and since a suppression in force holds while
/// the demand is over the limit, so do most of the rest, asking again
/// while the fall holds them (released after 1.05, 0.95, 0.95, 0.95 and
/// 1.95 s; before, 1.95 s in three seeds of five, waiting for their
/// round): pushes are never slower.
#[test]
fn a_fall_spread_thin_over_many_agents_is_released_within_a_second() {
    let release = |push: bool| {
        let mut releases: Vec<f64> = (1..=5)
            .map(|seed| {
                let mut s = scenario("creeping-loss").with_push(push);
                s.seed = seed;
                let (_, summary) = simulate(s);
                let pushes = summary.control.by_kind.pushes;
                assert_eq!(pushes > 0, push, "{:?}", summary.control);
                account(&summary, "creeper").release_s.unwrap()
            })
            .collect();
        releases.sort_by(f64::total_cmp);
        (releases[2], releases)
    };
    let (with, all) = release(true);
    assert!(with <= 1.0, "{all:?}");
    assert!(all.iter().all(|&r| r <= 2.0), "{all:?}");
    let (without, all) = release(false);
    assert!(with <= without, "{all:?}");
    assert!(all.iter().all(|&r| r <= 2.0), "{all:?}");
}

/// Pacing (`docs/design.md`): with the agents admitting their share of
/// what they told the master, a costly flood over 40 agents swings less
/// from one 6-s bucket to the next than with each keeping its share of
/// what comes, and sits at its limit all the same. Measured as the
/// standard deviation of the steady 6-s buckets over six seeds: one
/// seed's swings are themselves a draw (over seeds 1–60, pacing is lower
/// on 45 of them, and on every group of six by 1–24%).
#[test]
fn paced_agents_hold_a_costly_flood_more_steadily() {
    let (paced_sd, unpaced_sd) = costly_flood_bucket_sds(|s| s.with_pace(false), 0.02);
    assert!(
        paced_sd < unpaced_sd,
        "6-s buckets' deviation {paced_sd} paced, {unpaced_sd} not (sums over six seeds)"
    );
}

/// Sparse paced pairs decide a sub-window by one frozen probability
/// (`AgentConfig::freeze_sparse`): `costly-flood`'s 40 agents each see
/// about one operation a sub-window, and the admitted cost's 6-s buckets
/// swing by less than with the probability moved after every operation,
/// still at the limit. Over six seeds, as above (over seeds 1–60 the p2p
/// went from 0.136 to 0.098, median).
#[test]
fn frozen_sparse_pairs_hold_a_costly_flood_more_steadily() {
    let (frozen_sd, moving_sd) = costly_flood_bucket_sds(|s| s.with_freeze_sparse(false), 0.01);
    assert!(
        frozen_sd < 0.9 * moving_sd,
        "6-s buckets' deviation {frozen_sd} frozen, {moving_sd} not (sums over six seeds)"
    );
}

/// `costly-flood` over seeds 1–6, as shipped and as `without` makes it:
/// the sums of [`steady_bucket_sd`] of each. As shipped, each seed's
/// steady ratio is within `tolerance` of 1.
fn costly_flood_bucket_sds(without: impl Fn(&Scenario) -> Scenario, tolerance: f64) -> (f64, f64) {
    let (mut with_sd, mut without_sd) = (0.0, 0.0);
    for seed in 1..=6 {
        let mut s = scenario("costly-flood");
        s.seed = seed;
        let (run, summary) = simulate(s.clone());
        with_sd += steady_bucket_sd(&run, "costly");
        let steady = account(&summary, "costly").steady_admitted_ratio.unwrap();
        assert!((steady - 1.0).abs() <= tolerance, "seed {seed}: {steady}");
        let (run, _) = simulate(without(&s));
        without_sd += steady_bucket_sd(&run, "costly");
    }
    (with_sd, without_sd)
}

/// The standard deviation of `account`'s admitted cost over the 6-s
/// buckets of its steady flood (30 s to 168 s of `costly-flood`), as a
/// share of its limit of 2 000/s.
fn steady_bucket_sd(run: &Run, account: &str) -> f64 {
    let series = run
        .series
        .iter()
        .find(|x| x.traffic.account == account)
        .unwrap();
    let buckets: Vec<f64> = series.seconds[30..168]
        .chunks_exact(6)
        .map(|c| c.iter().map(|s| s.admitted as f64).sum::<f64>() / 6.0 / 2_000.0)
        .collect();
    let mean = buckets.iter().sum::<f64>() / buckets.len() as f64;
    (buckets.iter().map(|b| (b - mean).powi(2)).sum::<f64>() / buckets.len() as f64).sqrt()
}

/// Floods that start and stop inside sub-windows (`mid-stop`): each is
/// held from the second after its onset and released within a second of
/// its stop, as those on the grid are, and only the seconds a flood stops
/// in see the quiet traffic refused (while the release travels: about 300
/// a stop).
#[test]
fn a_flood_that_starts_and_stops_inside_a_sub_window_is_held_and_released_within_a_second() {
    let (_, s) = simulate(scenario("mid-stop"));
    let acme = account(&s, "acme");
    assert_eq!(acme.reaction_s, Some(1.0));
    let release = acme.release_s.unwrap();
    assert!(release <= 1.0, "{release}");
    assert!(acme.false_rejections <= 2_000, "{}", acme.false_rejections);
    let steady = acme.steady_admitted_ratio.unwrap();
    assert!((0.98..=1.02).contains(&steady), "{steady}");
}

/// The README's quickstart (`quickstart`): a new account at 10× its limit
/// from its first operation over four agents. Young peeks report it within
/// its first tens of operations: its first second admits well under the
/// issue's 2× (about 2× without them, the grid's first peek 100 ms in),
/// and every second from the second on is within ±10% of the limit, the
/// calm account never refused.
#[test]
fn a_new_account_at_ten_times_its_limit_is_held_within_its_first_tens_of_milliseconds() {
    let (run, s) = simulate(scenario("quickstart"));
    let flood = account(&s, "flood");
    let onset = flood.onset_1s_ratio.unwrap();
    assert!(onset < 1.6, "{flood:?}");
    let series = &run
        .series
        .iter()
        .find(|x| x.traffic.account == "flood")
        .unwrap()
        .seconds;
    for (t, second) in series.iter().enumerate().skip(1) {
        assert!(
            (900..=1_100).contains(&second.admitted),
            "second {t}: {second:?}"
        );
    }
    assert_eq!(account(&s, "calm").false_rejections, 0);
    assert_eq!(account(&s, "calm").admitted, account(&s, "calm").attempted);
    let (_, grid) = simulate(scenario("quickstart").with_young_peeks(false));
    let grid_onset = account(&grid, "flood").onset_1s_ratio.unwrap();
    assert!(grid_onset > onset + 0.4, "{grid_onset} against {onset}");
}

/// Sparse hints (`docs/design.md`, "Sparse hints"): a 5× flood of cost-51
/// operations over 40 agents is one operation or none per sub-window on
/// each, so no agent alone calls it, and rounds alone held it from its
/// fourth or fifth second (6-s peak about 2.7× the limit). The agents'
/// hints come together at the master within half a second of its onset,
/// the master polls every agent for the pair, and their answers hold it
/// from its first second's middle.
#[test]
fn a_costly_flood_spread_thin_over_many_agents_is_held_from_its_first_second() {
    let (_, with) = simulate(scenario("costly-flood"));
    let (_, without) = simulate(scenario("costly-flood").with_sparse_hints(false));
    assert!(with.control.by_kind.poll_pushes > 0, "{:?}", with.control);
    assert_eq!(without.control.by_kind.poll_pushes, 0);
    let (on, off) = (account(&with, "costly"), account(&without, "costly"));
    let (peak_on, peak_off) = (on.peak_6s_ratio.unwrap(), off.peak_6s_ratio.unwrap());
    assert!(peak_on <= 1.5, "{on:?}");
    assert!(peak_off >= 2.0, "{off:?}");
    let (onset_on, onset_off) = (
        on.onset_over_admitted.unwrap(),
        off.onset_over_admitted.unwrap(),
    );
    assert!(onset_on * 3 <= onset_off, "{onset_on} against {onset_off}");
    assert!(on.onset_1s_ratio.unwrap() <= 4.0, "{on:?}");
    let steady = on.steady_admitted_ratio.unwrap();
    assert!((0.98..=1.02).contains(&steady), "{steady}");
}

/// `migration` (traffic that only moves) at 0.95× and 0.99× of its limit
/// rather than 0.8×: nothing refused. At the seeds given, the two agents
/// the traffic concentrates onto each read 15–24% high over their first
/// peek, and before early reports said how many operations their rises
/// counted, the master took that jump at 1.18× the limit past its fixed
/// margin (1.15×) and suppressed a 0.95× account by 15% for five seconds
/// (805 cost refused at 0.95×, 784 and 47 at 0.99×).
#[test]
fn traffic_that_moves_just_under_its_limit_is_never_refused() {
    for (share, seed) in [(0.95, 14), (0.99, 13), (0.99, 8)] {
        let (_, summary) = simulate(scaled("migration", seed, share / 0.8));
        let mover = account(&summary, "mover");
        assert_eq!(
            mover.false_rejections, 0,
            "{share}× at seed {seed}: {mover:?}"
        );
        assert_eq!(mover.admitted, mover.attempted, "{share}× at seed {seed}");
    }
}

/// `varying-fanout` (publishes of 1 001 and 1 003 over 20 agents) at
/// 0.95× of its limit: nothing refused. The divisor of the two costs is
/// 1, and until a pair's first cost was known to be one operation's,
/// early reports of single publishes counted a thousand operations each:
/// at these seeds a chance spike read as a proven surge and refused 3–5
/// publishes in the first second. At 63, 312, 421, 565, 587 and 598 a
/// round of the account's first 16 s read 1.5× by chance, 60 publishes
/// where 38 were due, which the master, its step 1, counted as 60 120
/// operations; the agents now tell it what one costs (`op_cost`).
#[test]
fn publishes_of_varying_fanout_just_under_their_limit_are_never_refused() {
    for seed in [7, 18, 19, 21, 63, 312, 421, 565, 587, 598] {
        let (_, summary) = simulate(scaled("varying-fanout", seed, 0.95 / 2.0));
        let fanout = account(&summary, "fanout");
        assert_eq!(fanout.admitted, fanout.attempted, "seed {seed}: {fanout:?}");
    }
}

/// `mixed-costs` (publishes of cost 1 and of 51, half the cost each, over
/// 20 agents) at 0.95× of its limit: nothing refused, where each of these
/// seeds refused 270–2 330 cost in its first seconds. Each agent's pair
/// began with an operation of 1, which divides every cost, and a
/// sub-window with one more operation of 51 than due read as a rise of
/// 51 operations: the master, summing such early reports, read 1.3–1.6×
/// the limit, counted in thousands of operations. A new pair's checks now
/// show the scans every cost, and its rises are counted in operations of
/// its costliest. Seeds 17, 22, 24 and 29 were still refused 80–1 568
/// cost after that: each agent's early report of a chance lump stood at
/// the master until the round, and the lumps added up; an agent now takes
/// back its own early report of a chance lump when the lump has passed.
/// Seed 34 was refused 76 cost after that, by an agent that met no
/// publish of 51 in its youth and counted its later rises in operations
/// of 1; a pair's youth is now twice as long. Seeds 44 and 89 were
/// refused 93 and 388 cost after that: agents whose pair had no answer
/// yet showed the scans no costs, and one early report counted a publish
/// of 51 among cheap ones as 65 operations of 1. Seeds 173, 312 and 525
/// were refused 114–420 cost after that: before any round the master's
/// estimate is the agents' early reports alone, sub-windows of one or two
/// publishes read as rates, and it reached 1.9× the limit; an account the
/// rounds say nothing of is now suppressed by early reports only past 2×
/// (`FIRST_SURGE_MARGIN`). Seed 420 was refused 226 cost after that: 13
/// early reports, a dozen single publishes of 51 and one of 14
/// operations of 1, summed 2.07× the limit, and were weighed as 28
/// operations; an estimate's count is now what its sum's own spread makes
/// it (13). Seed 722 was refused 276 cost by a round at 20 s that chance
/// filled with publishes after nine it had made steady, read as
/// operations of 1; rollups now say their operations, and a round of
/// mixed costs is weighed by the sum of its costs' squares. At 10×, the
/// same account is still held in its first second.
#[test]
fn an_account_of_mixed_costs_just_under_its_limit_is_never_refused() {
    let seeds = (1..=6).chain([17, 22, 24, 29, 34, 44, 89, 173, 312, 420, 525, 722]);
    mixed_costs_under_the_limit_never_refused_and_a_deluge_held(scenario("mixed-costs"), seeds);
}

/// `mixed` (the `mixed-costs` account at twice its limit) at 0.95× of its
/// limit at each of `seeds`: nothing refused; at 10×, held in its first
/// second.
fn mixed_costs_under_the_limit_never_refused_and_a_deluge_held(
    mixed: Scenario,
    seeds: impl IntoIterator<Item = u64>,
) {
    let at = |share: f64, seed: u64| rescaled(mixed.clone(), seed, share / 2.0);
    for seed in seeds {
        let (_, summary) = simulate(at(0.95, seed));
        let a = account(&summary, "mixed-costs");
        assert_eq!(a.admitted, a.attempted, "seed {seed}: {a:?}");
    }
    let (_, summary) = simulate(at(10.0, 1));
    let deluge = account(&summary, "mixed-costs");
    assert_eq!(deluge.reaction_s, Some(1.0), "{deluge:?}");
    assert!(deluge.peak_6s_ratio.unwrap() < 1.2, "{deluge:?}");
}

/// `mixed-costs` at 0.95× on one node: its local guard weighed each
/// 250-ms window as a count of operations of the cost of the one that
/// closed it, mostly cheap ones, whose chance scatter is a fifth of the
/// mix's, and refused it in about every other second, 4% of its cost, at
/// every one of 200 seeds. A window now weighs as the sum of its costs'
/// squares, from the operations counted beside its cost. At 10× it is
/// still held by the guard within its first second.
#[test]
fn an_account_of_mixed_costs_on_one_node_just_under_its_limit_is_never_refused() {
    let text = scenario_toml("mixed-costs");
    assert!(text.contains("\nagents = 20\n"));
    let one_node = Scenario::from_toml(&text.replace("\nagents = 20\n", "\nagents = 1\n")).unwrap();
    mixed_costs_under_the_limit_never_refused_and_a_deluge_held(one_node, 1..=4);
}

/// `mixed-costs` with its costly publisher's operations publishes to
/// 1 000 subscribers (cost 1 001, 3 a second at 2×: 1.4 at 0.95×, among
/// 1 425 cheap operations a second against 3 000/s), over its 20 agents.
/// At 0.95× early reports refused it in every seed, about 49 000 cost
/// (14%) each: an agent that had seen no such publish counted one among
/// its cheap operations as 1 008 operations, a certain rise. Counted as
/// the one it is (`counted_ops`), it is refused nothing at these seeds
/// (in 9 of 20, 7 336 cost in all). Seeds 17 and 20 were refused 1 030
/// and 880 cost after that by rounds that chance filled with seven
/// publishes where 2.85 were due (1.6× the limit), weighed by an
/// effective cost the master learnt report by report, its rises bounded,
/// far below the round's own (46 against about 730); a round is now
/// weighed by its own reports' costs. Seed 7 was refused 348 cost on
/// seven lumps over its first 1.5 s, four of them fallen, summed as if
/// they had come at once; its rises are now weighed over the time they
/// span together. At 10× it is held: the rounds hold
/// it where a single publish's unproven rise used to release it (seed
/// 2: the worst 6-s bucket 4.38× before).
#[test]
fn rare_publishes_to_a_thousand_among_cheap_operations_just_under_the_limit_are_not_refused() {
    let text = scenario_toml("mixed-costs");
    assert!(text.contains("cost = 51\nprofile = [ { at_s = 0, rate = 60 } ]"));
    let heavy = text.replace(
        "cost = 51\nprofile = [ { at_s = 0, rate = 60 } ]",
        "cost = 1001\nprofile = [ { at_s = 0, rate = 3.0 } ]",
    );
    let heavy = Scenario::from_toml(&heavy).unwrap();
    for seed in (2..=4).chain([7, 17, 20]) {
        let (_, summary) = simulate(rescaled(heavy.clone(), seed, 0.95 / 2.0));
        let a = account(&summary, "mixed-costs");
        assert_eq!(a.admitted, a.attempted, "seed {seed}: {a:?}");
    }
    let (_, summary) = simulate(rescaled(heavy, 2, 5.0));
    let deluge = account(&summary, "mixed-costs");
    assert!(deluge.reaction_s.unwrap() <= 2.0, "{deluge:?}");
    assert!(deluge.peak_6s_ratio.unwrap() < 1.35, "{deluge:?}");
}

/// Publishes to 4 000 subscribers among cheap operations, at 0.95× of
/// their account's limit over 20 agents (one publish in three seconds):
/// two or three such lumps on different agents within half a second are
/// chance, not a flood, and the account is refused nothing. At seed 19 a
/// lump one agent took back stayed counted beside two that followed; at
/// seeds 3 and 18 three lumps seen one after another, each read over its
/// own sub-window, summed as if they had come at once.
#[test]
fn rare_publishes_to_four_thousand_seen_one_after_another_are_not_a_flood() {
    let text = scenario_toml("mixed-costs");
    let rare = text.replace(
        "cost = 51\nprofile = [ { at_s = 0, rate = 60 } ]",
        "cost = 4001\nprofile = [ { at_s = 0, rate = 0.75 } ]",
    );
    assert_ne!(rare, text);
    let rare = Scenario::from_toml(&rare).unwrap();
    for seed in [3, 18, 19] {
        let (_, summary) = simulate(rescaled(rare.clone(), seed, 0.95 / 2.0));
        let a = account(&summary, "mixed-costs");
        assert_eq!(a.admitted, a.attempted, "seed {seed}: {a:?}");
    }
}

/// `mixed-costs` held deep, at 5× and 10× of its limit (a factor of 0.8
/// and 0.9): the costly publisher keeps the cheap one's share within 5%.
/// Paced, each lane held its publisher to what the pair offered each of
/// its operations, and the cheap operations, whose probability the credit
/// leans hardest, took the catching up after every costly admission: the
/// costly publisher kept 13% (5×) and 23% (10×) less than its share at
/// these seeds. Lanes now hold every publisher to what an operation of
/// the pair's costliest cost is offered.
#[test]
fn a_costly_publisher_beside_a_cheap_one_keeps_its_share_under_a_deep_factor() {
    for (times, seed) in [(5.0, 1), (10.0, 2)] {
        let (_, summary) = simulate(scaled("mixed-costs", seed, times / 2.0));
        let a = account(&summary, "mixed-costs");
        let fairness = a.fairness_10s.unwrap();
        assert!(fairness < 0.05, "{times}× at seed {seed}: {a:?}");
        assert!(a.steady_admitted_ratio.unwrap() < 1.01, "{a:?}");
    }
}

/// `near-limit-one-node`: accounts each on one node at 0.9×, 0.95× and
/// 0.99× of their limits (cost 1, in the steps' bursts; cost 51 at 0.95×;
/// limits of 100 and 10 a second at 0.95×) are refused nothing, where the
/// local guard, reading each 250-ms window plainly, refused about 80, 630,
/// 2 000 and 15 000 cost of the first four (13% of the costly one), and
/// 5% and 17% of the small ones; the one at 1.5× is still held at its
/// limit.
#[test]
fn accounts_on_one_node_just_under_their_limits_are_never_refused() {
    let (_, s) = simulate(scenario("near-limit-one-node"));
    for name in [
        "one-90",
        "one-95",
        "one-99",
        "costly-95",
        "small-95",
        "tiny-95",
    ] {
        let a = account(&s, name);
        assert_eq!(a.admitted, a.attempted, "{a:?}");
    }
    let over = account(&s, "one-150");
    assert!(over.peak_6s_ratio.unwrap() <= 1.1, "{over:?}");
    assert!(over.admitted < over.attempted * 4 / 5, "{over:?}");
}

/// A new account's first rounds, before their scatter is known, suppress
/// only past what a count of operations of the reports' cost step gives
/// by chance (`docs/design.md`, "Suppress only with confidence"): at these
/// seeds, of 1 000 each, a round read 1.5–1.58× the limit by chance (up to
/// 62 operations of 51 where 35 were due, or 61 of 1 where 36 were), and
/// the account at 0.9× was refused 4 to 8 operations of 51, or 9 of 1.
#[test]
fn a_new_account_under_its_limit_is_not_refused_for_a_chance_round() {
    for (name, seed, refused) in [
        ("near-limit", 124, "costly-90"),
        ("near-limit", 343, "costly-90"),
        ("near-limit", 526, "costly-90"),
        ("near-limit-small", 441, "tiny-90"),
    ] {
        let (_, s) = simulate(scaled(name, seed, 1.0));
        let a = account(&s, refused);
        assert_eq!(
            (a.false_rejections, a.admitted),
            (0, a.attempted),
            "{name} at seed {seed}"
        );
    }
}

/// An account of publishes of 51 on one node at 0.95× of its limit, in
/// lumps of a 100-ms step's arrivals, is not suppressed by one chance lump
/// its agent reports early (`master::surge_proven_by`): at seed 55 a
/// follow-up of the agent's own earlier lump began a new estimate with no
/// count, which the master took for proof; at seeds 206 and 328 a single
/// sub-window of 10–11 where 1.86 were due was weighed as if several
/// agents had said it, and at 176 and 689 (12–14) over rounds that read
/// 1.12–1.27× by chance. Each refused 1–19 publishes. And `costly-flood`
/// (40 agents at 5×) keeps its hold at seeds 11 and 82, where it lost it
/// for four seconds while one agent's rise over rounds that prove the
/// flood was weighed as one sub-window of many.
#[test]
fn a_chance_lump_of_one_agent_does_not_suppress_an_account_under_its_limit() {
    // And 9.5 a second against 10 on one node (`tiny-95`): rounds of 19
    // operations whose measured scatter, learnt from below, read 1.15× as
    // 5σ over (seeds 389, 457 and 624); the scatter is now at least the
    // count's.
    let costly = [55, 206, 328, 176, 689].map(|seed| (seed, "costly-95"));
    let tiny = [389, 457, 624].map(|seed| (seed, "tiny-95"));
    // And 95 a second against 100 on one node (`small-95`) at seed 346:
    // its agent's first early report, sent twice with both answers lost,
    // was taken back, and the next one's rise counted on top of it.
    let small = [(346, "small-95")];
    for (seed, name) in costly.into_iter().chain(tiny).chain(small) {
        let (_, s) = simulate(scaled("near-limit-one-node", seed, 1.0));
        let a = account(&s, name);
        assert_eq!(
            (a.false_rejections, a.admitted),
            (0, a.attempted),
            "{name} at seed {seed}"
        );
    }
    for seed in [11, 82] {
        let (_, s) = simulate(scaled("costly-flood", seed, 1.0));
        let a = account(&s, "costly");
        assert!(a.peak_6s_ratio.unwrap() < 1.5, "seed {seed}: {a:?}");
    }
}

/// Where nothing floods, sparse hints cost next to nothing: no poll, at
/// most 5% more requests and bytes (chance hints, a few a minute), and no
/// account refused that was not without them.
#[test]
fn sparse_hints_cost_next_to_nothing_where_nothing_floods() {
    for name in ["steady", "near-limit", "near-limit-small", "migration"] {
        let (_, with) = simulate(scenario(name));
        let (_, without) = simulate(scenario(name).with_sparse_hints(false));
        let (on, off) = (&with.control, &without.control);
        assert_eq!(on.by_kind.poll_pushes, 0, "{name}: {on:?}");
        assert!(
            on.rpcs_per_s <= 1.05 * off.rpcs_per_s,
            "{name}: {on:?} against {off:?}"
        );
        assert!(
            on.bytes_per_s <= 1.05 * off.bytes_per_s,
            "{name}: {on:?} against {off:?}"
        );
        let refused = |s: &Summary| s.accounts.iter().map(|a| a.false_rejections).sum::<u64>();
        assert_eq!(refused(&with), refused(&without), "{name}");
    }
}

/// Sparse hints of falls (`docs/design.md`, "Sparse hints"): when the
/// costly flood spread over 40 agents stops, each agent sees a run of
/// empty sub-windows its rate makes unlikely within about a second; their
/// fall hints come together at the master, which polls, and the answers
/// release the account on every agent within the round, where rounds
/// alone took 2.5 s or more.
#[test]
fn a_costly_flood_spread_thin_is_released_within_about_a_second() {
    let (_, with) = simulate(scenario("costly-flood"));
    let (_, without) = simulate(scenario("costly-flood").with_sparse_hints(false));
    let (on, off) = (account(&with, "costly"), account(&without, "costly"));
    assert!(on.release_s.unwrap() <= 1.5, "{on:?}");
    assert!(off.release_s.unwrap() >= 2.0, "{off:?}");
    assert!(
        on.false_rejections < off.false_rejections,
        "{on:?} against {off:?}"
    );
}
