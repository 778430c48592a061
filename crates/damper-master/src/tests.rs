use super::*;
use damper_core::ring::Ring;
use damper_core::time::ManualClock;
use damper_proto::v1::{AccountCounts, OpCounts};
use damper_proto::v1::{FactorsRequest, OpAccounts, OpFactors, RollupRequest};
use tonic::Code;

const T0_MS: u64 = 1_800_000_000_000;

fn master(clock: Arc<ManualClock>) -> Master {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let options = MasterOptions {
        shards: 3,
        max_entries: 4,
        ..MasterOptions::default()
    };
    Master::with_clock(config, options, clock)
}

fn counts(account: &str, attempted: u64, admitted: u64) -> AccountCounts {
    AccountCounts {
        op_cost: 0,
        ops: 0,
        id: 0,
        account: account.into(),
        attempted,
        admitted,
        start_unix_ms: 0,
    }
}

fn request(ops: Vec<(&str, Vec<AccountCounts>)>) -> RollupRequest {
    RollupRequest {
        agent_id: "test".into(),
        ring_version: 0,
        interval_start_unix_ms: T0_MS - 2_000,
        interval_end_unix_ms: T0_MS,
        ops: ops
            .into_iter()
            .map(|(op, accounts)| OpCounts {
                op_costs: Vec::new(),
                op_counts: Vec::new(),
                attempted: Vec::new(),
                ids: Vec::new(),
                rejected: Vec::new(),
                op: op.into(),
                accounts,
            })
            .collect(),
        ..Default::default()
    }
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(Nanos::from_millis(T0_MS + 5)))
}

#[test]
fn replies_with_factors_for_limited_pairs_only() {
    let m = master(clock());
    let reply = m
        .rollup(&request(vec![
            (
                "messages",
                vec![counts("flood", 8_000, 8_000), counts("calm", 100, 100)],
            ),
            ("presence", vec![counts("flood", 1_000_000, 1_000_000)]),
        ]))
        .unwrap();
    assert_eq!(reply.rollup_interval_ms, 2_000);
    assert_eq!(reply.ops.len(), 1, "presence has no limit: {reply:?}");
    let messages = &reply.ops[0];
    assert_eq!(messages.op, "messages");
    let flood = messages
        .accounts
        .iter()
        .find(|a| a.account == "flood")
        .unwrap();
    assert_eq!(
        (flood.factor, flood.limit, flood.valid_for_ms),
        (0.75, 1000.0, 6_000)
    );
    let calm = messages
        .accounts
        .iter()
        .find(|a| a.account == "calm")
        .unwrap();
    assert_eq!(calm.factor, 0.0);
    assert_eq!(m.len(), 3);
    assert_eq!(m.factor("flood", "messages"), Some(0.75));
}

#[test]
fn pairs_at_factor_0_under_their_ops_limit_are_implied_not_listed() {
    let clock = clock();
    let config = MasterConfig::from_toml(
        "[limits]\nmessages = 1000\n\"messages/vip\" = 5000\n\"presence/acme\" = 10",
    )
    .unwrap();
    let options = MasterOptions {
        shards: 3,
        ..MasterOptions::default()
    };
    let m = Master::with_clock(config, options, clock.clone());
    let mut calm: Vec<AccountCounts> = (0..100)
        .map(|i| counts(&format!("calm-{i:03}"), 10, 10))
        .collect();
    calm.push(counts("flood", 8_000, 8_000));
    calm.push(counts("vip", 10, 10));
    let round = |k: u64| RollupRequest {
        interval_start_unix_ms: T0_MS + 2_000 * k - 2_000,
        interval_end_unix_ms: T0_MS + 2_000 * k,
        ..request(vec![
            ("messages", calm.clone()),
            (
                "presence",
                vec![counts("acme", 1, 1), counts("other", 1, 1)],
            ),
        ])
    };
    // The first round asks every pair to recheck (their first here): all
    // listed. From the second on, only what differs from the op's default.
    let first = m.rollup(&round(0)).unwrap();
    assert_eq!(first.ops[0].accounts.len(), 102);
    clock.set(Nanos::from_millis(T0_MS + 2_005));
    let reply = m.rollup(&round(1)).unwrap();
    assert_eq!(reply.recheck_after_ms, 0);
    let listed = |op: &OpFactors| -> Vec<(String, f64, f64)> {
        let mut listed: Vec<_> = op
            .accounts
            .iter()
            .map(|a| (a.account.clone(), a.factor, a.limit))
            .collect();
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        listed
    };
    let (messages, presence) = (&reply.ops[0], &reply.ops[1]);
    assert_eq!(
        listed(messages),
        [("flood".into(), 0.75, 1000.0), ("vip".into(), 0.0, 5000.0)]
    );
    assert_eq!(
        (messages.unlisted_limit, messages.unlisted_valid_for_ms),
        (1000.0, 6_000)
    );
    // presence has no limit of its own: `other` is unlimited, not implied.
    assert_eq!(listed(presence), [("acme".into(), 0.0, 10.0)]);
    assert_eq!(presence.unlisted_limit, 0.0);
    // 102 limited pairs answered in a few dozen bytes (the flood with its
    // utilisation, 4.0).
    assert_eq!(
        messages.accounts.iter().map(|a| a.utilisation).sum::<f32>(),
        4.0
    );
    let bytes = prost::Message::encoded_len(&reply);
    assert!(bytes < 125, "{bytes} bytes: {reply:?}");
}

#[test]
fn bad_rollups_get_a_precise_status_and_count_nothing() {
    let m = master(clock());
    let cases = [
        (
            request(vec![(
                "messages",
                vec![counts("a", 1, 1), counts("", 1, 1)],
            )]),
            Code::InvalidArgument,
            "ops[0].accounts[1]: `account` is empty",
        ),
        (
            request(vec![("", vec![counts("a", 1, 1)])]),
            Code::InvalidArgument,
            "ops[0].accounts[0]: `op` is empty",
        ),
        (
            request(vec![("messages", vec![counts("a", 1, 2)])]),
            Code::InvalidArgument,
            "`admitted` (2) is more than `attempted` (1)",
        ),
        (
            request(vec![("messages", vec![counts(&"x".repeat(300), 1, 1)])]),
            Code::InvalidArgument,
            "`account` is 300 bytes long",
        ),
        (
            RollupRequest {
                interval_start_unix_ms: T0_MS,
                interval_end_unix_ms: T0_MS - 1,
                ..request(vec![])
            },
            Code::InvalidArgument,
            "interval_end_unix_ms",
        ),
        (
            request(vec![(
                "messages",
                (0..5).map(|i| counts(&format!("a{i}"), 1, 1)).collect(),
            )]),
            Code::ResourceExhausted,
            "at most 4",
        ),
    ];
    for (req, code, message) in cases {
        let status = m.rollup(&req).unwrap_err();
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(message), "{status:?}");
    }
    assert!(m.is_empty(), "nothing of a refused rollup is counted");
}

#[test]
fn accounts_spread_over_shards_and_idle_ones_are_evicted() {
    let clock = clock();
    let m = master(clock.clone());
    for i in 0..4 {
        let accounts = (0..4)
            .map(|j| counts(&format!("acct-{i}-{j}"), 10, 10))
            .collect();
        m.rollup(&request(vec![("messages", accounts)])).unwrap();
    }
    assert_eq!(m.len(), 16);
    let used = (0..3).filter(|&s| !m.lock(s).is_empty()).count();
    assert!(used >= 2, "all accounts in one shard");
    // Default idle time: three windows of 24 s plus the settle time.
    clock.advance(Duration::from_secs(60));
    assert_eq!(m.evict_idle(), 0);
    clock.advance(Duration::from_secs(40));
    assert_eq!(m.evict_idle(), 16);
    assert!(m.is_empty());
}

#[test]
fn early_reporters_are_asked_to_recheck_and_factors_counts_nothing() {
    let clock = clock();
    let m = master(clock.clone());
    // Two agents flood for a few rounds; each reports half.
    let round = |end_ms: u64, each: u64| RollupRequest {
        interval_start_unix_ms: end_ms - 2_000,
        interval_end_unix_ms: end_ms,
        ..request(vec![("messages", vec![counts("flood", each, each)])])
    };
    for k in 0..5u64 {
        let end = T0_MS + 2_000 * k;
        clock.set(Nanos::from_millis(end + 5));
        m.rollup(&round(end, 10_000)).unwrap();
        m.rollup(&round(end, 10_000)).unwrap();
    }
    // The flood stops; the first agent to report is told to ask again once
    // the round can be whole (its end plus the 500 ms grace).
    let end = T0_MS + 10_000;
    clock.set(Nanos::from_millis(end + 5));
    let first = m.rollup(&round(end, 100)).unwrap();
    assert!(first.ops[0].accounts[0].factor > 0.8);
    assert_eq!(first.recheck_after_ms, 495);
    let last = m.rollup(&round(end, 100)).unwrap();
    // Released: factor 0 under the op's limit, so implied, not listed.
    assert!(last.ops[0].accounts.is_empty(), "{last:?}");
    assert_eq!(
        (last.ops[0].unlisted_limit, last.recheck_after_ms),
        (1000.0, 0)
    );
    // The recheck: the release, and nothing counted.
    let before = m.len();
    let ask = FactorsRequest {
        agent_id: "a".into(),
        ops: vec![OpAccounts {
            op: "messages".into(),
            accounts: vec!["flood".into(), "never-seen".into()],
            ..OpAccounts::default()
        }],
        ..FactorsRequest::default()
    };
    clock.set(Nanos::from_millis(end + 500));
    let reply = m.factors(&ask).unwrap();
    assert!(reply.ops[0].accounts.is_empty(), "{reply:?}");
    assert_eq!(
        (
            reply.ops[0].unlisted_limit,
            reply.ops[0].unlisted_valid_for_ms
        ),
        (1000.0, 6_000),
        "both at factor 0 under the op's limit"
    );
    assert_eq!(m.len(), before);
    // Bad names get the same precise status as rollups.
    let bad = FactorsRequest {
        agent_id: "a".into(),
        ops: vec![OpAccounts {
            op: "messages".into(),
            accounts: vec![String::new()],
            ..OpAccounts::default()
        }],
        ..FactorsRequest::default()
    };
    let status = m.factors(&bad).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("ops[0].accounts[0]: `account`"),
        "{status:?}"
    );
}

#[test]
fn accounts_owned_elsewhere_are_counted_and_reported_as_foreign() {
    let m = master(clock());
    let members: Vec<String> = ["a:1", "b:1", "c:1"].map(String::from).to_vec();
    assert!(matches!(
        m.set_ring(&members, "z:1"),
        Err(RingViewError::NotAMember { .. })
    ));
    m.set_ring(&members, "a:1").unwrap();
    assert_eq!(m.set_ring(&members, "a:1"), Err(RingViewError::AlreadySet));
    let ring = Ring::new(&members);
    let (mine, theirs): (Vec<String>, Vec<String>) = (0..4)
        .map(|i| format!("acct-{i}"))
        .partition(|a| ring.owner(a) == Some("a:1"));
    assert!(!mine.is_empty() && !theirs.is_empty());
    let all: Vec<AccountCounts> = mine
        .iter()
        .chain(&theirs)
        .map(|a| counts(a, 10, 10))
        .collect();

    // An agent whose ring is the masters' sends only what this one owns;
    // the versions match and nothing is foreign.
    let mut agreeing = request(vec![(
        "messages",
        mine.iter().map(|a| counts(a, 10, 10)).collect(),
    )]);
    agreeing.ring_version = ring.version();
    let reply = m.rollup(&agreeing).unwrap();
    assert_eq!(
        (reply.ring_version, reply.foreign_entries),
        (ring.version(), 0)
    );

    // An agent with b:1 and c:1 down sends everything here: all of it is
    // counted, and the reply says how much was foreign.
    let mut split = request(vec![("messages", all)]);
    split.ring_version = Ring::new(["a:1"]).version();
    let reply = m.rollup(&split).unwrap();
    assert_eq!(reply.foreign_entries as usize, theirs.len());
    let ingested = m.ingested();
    assert_eq!(ingested.foreign as usize, theirs.len());
    assert_eq!(ingested.entries as usize, 2 * mine.len() + theirs.len());
    assert_eq!(
        m.len(),
        mine.len() + theirs.len(),
        "foreign accounts are tracked"
    );
}

mod ops;

/// An early report, as the service takes it: the estimate moves at once,
/// the verdict comes back marked for the recheck, a second report from the
/// same agent within the budget is refused (another agent's is not), and
/// lists that do not line up are refused naming the op.
#[test]
fn early_reports_move_the_estimate_within_a_budget() {
    let clock = Arc::new(ManualClock::new(Nanos::from_millis(T0_MS + 300)));
    let m = master(clock.clone());
    // The hello: every op's default limit.
    let hello = m.factors(&FactorsRequest::default()).unwrap();
    assert_eq!(
        (hello.ops[0].op.as_str(), hello.ops[0].unlisted_limit),
        ("messages", 1000.0)
    );
    let early = |agent: &str, rate: f32| FactorsRequest {
        agent_id: agent.into(),
        ops: vec![OpAccounts {
            op: "messages".into(),
            accounts: vec!["flood".into()],
            rates: vec![rate],
            baselines: vec![0.0],
            surged: vec![false],
            joined: vec![],
            ..OpAccounts::default()
        }],
        surge_at_unix_ms: T0_MS + 200,
    };
    let reply = m.factors(&early("a", 2_500.0)).unwrap();
    let flood = &reply.ops[0].accounts[0];
    assert!((flood.factor - 0.6).abs() < 1e-6, "{reply:?}");
    assert!(flood.recheck);
    assert_eq!(reply.recheck_after_ms, 100);
    // One may come a gap early (network jitter): the same report again is
    // a repeat, answered without counting it twice; a third is refused.
    let again = m.factors(&early("a", 2_500.0)).unwrap();
    assert!(
        (again.ops[0].accounts[0].factor - 0.6).abs() < 1e-6,
        "{again:?}"
    );
    let refused = m.factors(&early("a", 2_500.0)).unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("policy.surge_min_gap_ms"),
        "{refused:?}"
    );
    let reply = m.factors(&early("b", 2_500.0)).unwrap();
    assert!(
        (reply.ops[0].accounts[0].factor - 0.8).abs() < 1e-6,
        "{reply:?}"
    );
    let mut bad = early("c", 1.0);
    bad.ops[0].baselines.clear();
    let status = m.factors(&bad).unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("ops[0]"), "{status:?}");
}

/// A lying agent: a rollup or early report claiming more than one node
/// could attempt is refused naming the entry and the ceiling, counts
/// nothing, and does not suppress the account; honest reports go on.
#[test]
fn claims_above_max_claimed_rate_are_refused_and_count_nothing() {
    let clock = Arc::new(ManualClock::new(Nanos::from_millis(T0_MS + 300)));
    let m = master(clock.clone());
    let lie = m
        .rollup(&request(vec![(
            "messages",
            vec![counts("calm", 1_000, 1_000), counts("victim", u64::MAX, 0)],
        )]))
        .unwrap_err();
    assert_eq!(lie.code(), Code::InvalidArgument);
    assert!(lie.message().contains("ops[0].accounts[1]"), "{lie:?}");
    assert!(lie.message().contains("max_claimed_rate"), "{lie:?}");
    assert_eq!(m.ingested(), Ingested::default(), "nothing of it counted");
    assert_eq!(m.len(), 0);

    let early = FactorsRequest {
        agent_id: "liar".into(),
        ops: vec![OpAccounts {
            op: "messages".into(),
            accounts: vec!["victim".into()],
            rates: vec![1e12],
            baselines: vec![0.0],
            surged: vec![false],
            joined: vec![],
            ..OpAccounts::default()
        }],
        surge_at_unix_ms: T0_MS + 200,
    };
    let lie = m.factors(&early).unwrap_err();
    assert_eq!(lie.code(), Code::InvalidArgument);
    assert!(lie.message().contains("max_claimed_rate"), "{lie:?}");
    // A join claims the same rate, and is held to the same ceiling.
    let mut joined = early.clone();
    joined.ops[0].joined = vec![true];
    let lie = m.factors(&joined).unwrap_err();
    assert_eq!(lie.code(), Code::InvalidArgument);
    assert!(lie.message().contains("max_claimed_rate"), "{lie:?}");
    // And `joined` must be one per account, or empty.
    let mut uneven = early.clone();
    uneven.ops[0].joined = vec![true, false];
    let bad = m.factors(&uneven).unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().contains("joined (2)"), "{bad:?}");
    // So must the spans of counted rises.
    let mut uneven = early.clone();
    uneven.ops[0].span_micros = vec![100_000, 100_000];
    let bad = m.factors(&uneven).unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().contains("span_micros (2)"), "{bad:?}");
    // A follow-up's rollup baseline is a claim too: one far above the
    // ceiling, taken against in a fresh estimate, would move it by as much.
    let mut follow_up = early.clone();
    follow_up.ops[0].rates = vec![10.0];
    follow_up.ops[0].surged = vec![true];
    follow_up.ops[0].rollup_baselines = vec![1e12];
    let lie = m.factors(&follow_up).unwrap_err();
    assert_eq!(lie.code(), Code::InvalidArgument);
    assert!(
        lie.message().contains("ops[0].rollup_baselines[0]"),
        "{lie:?}"
    );
    follow_up.ops[0].rollup_baselines = vec![f32::NAN];
    let bad = m.factors(&follow_up).unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().contains("rollup_baselines"), "{bad:?}");
    assert_eq!(
        m.len(),
        0,
        "the victim is not tracked, let alone suppressed"
    );

    // 10 M cost/s over 2 s is the ceiling, and accepted.
    let honest = m
        .rollup(&request(vec![(
            "messages",
            vec![counts("big", 20_000_000, 1_000)],
        )]))
        .unwrap();
    assert!(honest.ops[0].accounts[0].factor > 0.99);
}

/// Made-up names past `max_pairs` are not tracked, and a flood the master
/// holds stays held through the attack.
#[test]
fn past_max_pairs_made_up_names_are_not_tracked_and_a_flood_stays_held() {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let options = MasterOptions {
        shards: 4,
        max_pairs: 100,
        ..MasterOptions::default()
    };
    let m = Master::with_clock(config, options, clock());
    let flood = m
        .rollup(&request(vec![(
            "messages",
            vec![counts("flood", 20_000, 2_000)],
        )]))
        .unwrap();
    assert_eq!(flood.ops[0].accounts[0].factor, 0.9);
    for batch in 0..100 {
        let names: Vec<AccountCounts> = (0..1_000)
            .map(|i| counts(&format!("made-up-{batch}-{i}"), 1, 1))
            .collect();
        m.rollup(&request(vec![("messages", names)])).unwrap();
    }
    assert!(m.len() <= 100, "{} pairs tracked", m.len());
    let flood = m
        .rollup(&request(vec![(
            "messages",
            vec![counts("flood", 20_000, 2_000)],
        )]))
        .unwrap();
    let f = flood.ops[0]
        .accounts
        .iter()
        .find(|a| a.account == "flood")
        .unwrap();
    assert!(f.factor > 0.85, "the flood is still held: {flood:?}");
}

/// One agent minting names past its per-round budget gets no more pairs
/// tracked this round, while another agent's new pairs are, and the next
/// round gives it its budget back.
#[test]
fn one_agent_adds_at_most_its_new_pairs_per_round() {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let options = MasterOptions {
        shards: 4,
        max_new_pairs_per_agent: 50,
        ..MasterOptions::default()
    };
    let clock = clock();
    let m = Master::with_clock(config, options, clock.clone());
    let names = |prefix: &str, n: usize| -> Vec<AccountCounts> {
        (0..n)
            .map(|i| counts(&format!("{prefix}-{i}"), 1, 1))
            .collect()
    };
    let mut minting = request(vec![("messages", names("made-up", 200))]);
    minting.agent_id = "minting".into();
    m.rollup(&minting).unwrap();
    assert_eq!(m.len(), 50);
    // Its own new pairs in a second rollup of the same round: none.
    let mut again = request(vec![("messages", names("more", 10))]);
    again.agent_id = "minting".into();
    m.rollup(&again).unwrap();
    assert_eq!(m.len(), 50);
    // Another agent is not affected.
    let mut honest = request(vec![("messages", names("real", 20))]);
    honest.agent_id = "honest".into();
    m.rollup(&honest).unwrap();
    assert_eq!(m.len(), 70);
    // The next round: its budget again.
    clock.advance(std::time::Duration::from_secs(2));
    m.rollup(&again).unwrap();
    assert_eq!(m.len(), 80);
}

/// A client inventing op names gets at most `MAX_OPS` of them tracked per
/// shard: the rollup is answered, the pairs of further ops fail open, and
/// the ops known before are held as ever.
#[test]
fn op_names_past_the_most_a_shard_interns_fail_open() {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let options = MasterOptions {
        shards: 1,
        ..MasterOptions::default()
    };
    let m = Master::with_clock(config, options, clock());
    let flood = request(vec![("messages", vec![counts("flood", 8_000, 8_000)])]);
    m.rollup(&flood).unwrap();
    let ops: Vec<String> = (0..damper_core::master::MAX_OPS + 10)
        .map(|i| format!("made-up-{i}"))
        .collect();
    let minting = request(
        ops.iter()
            .map(|op| (op.as_str(), vec![counts("acme", 1, 1)]))
            .collect(),
    );
    m.rollup(&minting).unwrap();
    assert_eq!(m.len(), damper_core::master::MAX_OPS);
    let reply = m.rollup(&flood).unwrap();
    assert!(reply.ops[0].accounts[0].factor > 0.5, "{reply:?}");
}

/// A numbered rollup sent again (its reply was lost) is answered with the
/// verdicts in force and counted once; unnumbered ones (agents that
/// predate numbering) are counted each time, as before.
#[test]
fn a_resent_rollup_is_counted_once() {
    let m = master(clock());
    let mut numbered = request(vec![("messages", vec![counts("flood", 8_000, 8_000)])]);
    numbered.incarnation = 1_799_999_000_000;
    numbered.sequence = 41;
    let first = m.rollup(&numbered).unwrap();
    let once = m.ingested();
    assert_eq!(once.attempted, 8_000);
    let again = m.rollup(&numbered).unwrap();
    assert_eq!(m.ingested(), once, "the resend counts nothing");
    assert_eq!(
        again.ops[0].accounts[0].factor,
        first.ops[0].accounts[0].factor
    );
    // The next number, or another run of the agent, is counted.
    numbered.sequence = 42;
    m.rollup(&numbered).unwrap();
    numbered.incarnation += 1;
    m.rollup(&numbered).unwrap();
    assert_eq!(m.ingested().attempted, 24_000);
    // Unnumbered: counted every time.
    let old = request(vec![("messages", vec![counts("old", 100, 100)])]);
    m.rollup(&old).unwrap();
    m.rollup(&old).unwrap();
    assert_eq!(m.ingested().attempted, 24_200);
}

/// Account numbers at the master: a reply says it takes them; a rollup
/// naming an account with its number, then giving it by number alone, is
/// counted as the named one; an unknown number is FAILED_PRECONDITION and
/// counts nothing; `max_account_numbers = 0` turns numbers off.
#[test]
fn accounts_by_number_are_counted_as_named_and_unknown_numbers_are_refused() {
    let m = master(clock());
    let mut naming = request(vec![("messages", vec![counts("acme", 5_000, 5_000)])]);
    naming.dictionary = 1;
    naming.ops[0].accounts[0].id = 1;
    assert!(m.rollup(&naming).unwrap().takes_ids);
    let by_number = |dictionary: u32, id: u32| {
        let mut r = request(vec![("messages", Vec::new())]);
        r.dictionary = dictionary;
        r.ops[0].ids = vec![id];
        r.ops[0].attempted = vec![3_000];
        r.ops[0].rejected = vec![1_000];
        r
    };
    let before = m.ingested();
    let reply = m.rollup(&by_number(1, 1)).unwrap();
    assert!(reply.takes_ids);
    let after = m.ingested();
    assert_eq!(after.attempted - before.attempted, 3_000);
    assert_eq!(after.admitted - before.admitted, 2_000);
    // A number never given, or another epoch: refused whole.
    for (dictionary, id) in [(1, 2), (2, 1)] {
        let refused = m.rollup(&by_number(dictionary, id)).unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    }
    assert_eq!(m.ingested(), after);

    let options = MasterOptions {
        max_account_numbers: 0,
        ..MasterOptions::default()
    };
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let off = Master::with_clock(config, options, clock());
    assert!(!off.rollup(&naming).unwrap().takes_ids);
    assert_eq!(
        off.rollup(&by_number(1, 1)).unwrap_err().code(),
        Code::FailedPrecondition
    );
}

/// The round that shows a flood has ended, well under its limit, releases
/// it on every agent: the service pushes the verdict, as it does an early
/// report's. The rounds that held it pushed nothing.
#[test]
fn a_rollup_that_releases_a_flood_is_pushed_to_every_agent() {
    let clock = clock();
    let m = master(clock.clone());
    let mut pushed = m.watch();
    let round = |end_ms: u64, attempted: u64| {
        clock.set(Nanos::from_millis(end_ms + 5));
        let rollup = RollupRequest {
            interval_start_unix_ms: end_ms - 2_000,
            interval_end_unix_ms: end_ms,
            ..request(vec![(
                "messages",
                vec![counts("flood", attempted, attempted)],
            )])
        };
        m.rollup(&rollup).unwrap().ops[0]
            .accounts
            .iter()
            .find(|a| a.account == "flood")
            .map_or(0.0, |a| a.factor)
    };
    for i in 0..5 {
        assert!(round(T0_MS + i * 2_000, 5_000) > 0.5);
    }
    assert!(pushed.try_recv().is_err(), "holding pushes nothing");
    // Down to 0.3 of the limit.
    assert_eq!(round(T0_MS + 10_000, 600), 0.0);
    let push = pushed.try_recv().expect("the release is pushed");
    let listed = &push.ops[0].listed;
    assert_eq!(
        (
            push.ops[0].op.as_str(),
            listed.len(),
            listed[0].account.as_str()
        ),
        ("messages", 1, "flood")
    );
    assert_eq!(listed[0].factor.factor, 0.0);
    assert!(pushed.try_recv().is_err());
}

/// Accounts given by number go straight to their pairs where the master
/// last found them; once forgetting has moved the pairs, a number whose
/// old place now holds another account is counted on its own pair, never
/// on the one that moved in.
#[test]
fn numbered_accounts_are_counted_on_their_own_pairs_after_others_move() {
    let clock = clock();
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let options = MasterOptions {
        shards: 1,
        ..MasterOptions::default()
    };
    let m = Master::with_clock(config, options, clock.clone());
    let at = |end_ms: u64, ops: Vec<OpCounts>| {
        clock.set(Nanos::from_millis(end_ms + 5));
        RollupRequest {
            dictionary: 1,
            interval_start_unix_ms: end_ms - 2_000,
            interval_end_unix_ms: end_ms,
            ops,
            ..request(Vec::new())
        }
    };
    let named = |accounts: &[(&str, u32)]| OpCounts {
        op: "messages".into(),
        accounts: accounts
            .iter()
            .map(|&(name, id)| AccountCounts {
                id,
                ..counts(name, 20, 20)
            })
            .collect(),
        ..OpCounts::default()
    };
    let by_number = |entries: &[(u32, u64)]| OpCounts {
        op: "messages".into(),
        // Packed: each number as the step from the one before.
        ids: entries
            .iter()
            .scan(0, |before, &(id, _)| {
                Some(id - std::mem::replace(before, id))
            })
            .collect(),
        attempted: entries.iter().map(|&(_, cost)| cost).collect(),
        rejected: vec![0; entries.len()],
        ..OpCounts::default()
    };
    let accounts: Vec<String> = (0..10).map(|i| format!("acct-{i}")).collect();
    let numbered: Vec<(&str, u32)> = (0..10)
        .map(|i| (accounts[i].as_str(), i as u32 + 1))
        .collect();
    m.rollup(&at(T0_MS, vec![named(&numbered)])).unwrap();
    let all: Vec<(u32, u64)> = (1..=10).map(|id| (id, 20)).collect();
    m.rollup(&at(T0_MS + 2_000, vec![by_number(&all)])).unwrap();
    // A minute on, all but acct-0 report, and a new account comes last.
    let rollup = at(
        T0_MS + 62_000,
        vec![by_number(&all[1..]), named(&[("late", 11)])],
    );
    m.rollup(&rollup).unwrap();
    clock.advance(Duration::from_secs(40));
    assert_eq!(
        m.evict_idle(),
        1,
        "acct-0 forgotten; late moves into its place"
    );
    // acct-0 floods, by the number whose place late holds now.
    let flood = at(T0_MS + 104_000, vec![by_number(&[(1, 200_000), (11, 20)])]);
    m.rollup(&flood).unwrap();
    assert!(m.factor("acct-0", "messages").unwrap() > 0.9);
    assert_eq!(m.factor("late", "messages"), Some(0.0));
    assert_eq!(m.len(), 11);
    // And again, now from where acct-0 was found.
    let flood = at(T0_MS + 106_000, vec![by_number(&[(1, 200_000), (11, 20)])]);
    m.rollup(&flood).unwrap();
    assert_eq!(m.factor("late", "messages"), Some(0.0));
    assert_eq!(m.len(), 11);
}

/// Two agents' early reports flipping one pair's suppression on and off
/// from two threads at once: its events come out in the order its state
/// changed, started and ended by turns, near and no longer near by turns.
/// Published after the shard's lock was let go, another request's
/// transitions could take the earlier number (seen over gRPC, once in the
/// events test: `near_limit_ended` numbered before the `suppression_ended`
/// it follows). The window is narrow: built as it was, this test failed
/// in one run of ten; published under the lock, the order cannot differ.
#[test]
fn a_pairs_events_keep_the_order_its_state_changed_in_under_concurrent_reports() {
    let clock = Arc::new(ManualClock::new(Nanos::from_millis(T0_MS + 300)));
    let m = master(clock);
    // Each agent's drop is measured a millisecond after its jump: the same
    // instant twice would be a resend, answered without counting it.
    let report = |agent: String, rate: f32, baseline: f32, surged: bool| FactorsRequest {
        agent_id: agent,
        ops: vec![OpAccounts {
            op: "messages".into(),
            accounts: vec!["flipper".into()],
            rates: vec![rate],
            baselines: vec![baseline],
            surged: vec![surged],
            ..OpAccounts::default()
        }],
        surge_at_unix_ms: T0_MS + 200 + u64::from(surged),
    };
    std::thread::scope(|s| {
        // Each thread's agents jump to 10× the limit and report their drop
        // back, by turns: the estimate moves between none, one and two
        // jumps, and crosses the limit again and again.
        for thread in ["a", "b"] {
            let (m, report) = (&m, &report);
            s.spawn(move || {
                for i in 0..1_000 {
                    let agent = format!("{thread}-{i}");
                    let _ = m.factors(&report(agent.clone(), 10_000.0, 0.0, false));
                    let _ = m.factors(&report(agent, 0.0, 10_000.0, true));
                }
            });
        }
    });
    let kept = m.events().subscribe(Some(0)).missed;
    let kinds: Vec<&str> = kept
        .iter()
        .filter(|e| e.account == "flipper")
        .map(|e| e.kind)
        .collect();
    let by_turns = |on: &str, off: &str| {
        let flips: Vec<&&str> = kinds.iter().filter(|k| **k == on || **k == off).collect();
        flips
            .iter()
            .enumerate()
            .all(|(i, k)| **k == if i % 2 == 0 { on } else { off })
    };
    assert!(
        kinds
            .iter()
            .filter(|k| **k == "suppression_started")
            .count()
            > 10,
        "{kinds:?}"
    );
    assert!(
        by_turns("suppression_started", "suppression_ended"),
        "{kinds:?}"
    );
    assert!(by_turns("near_limit", "near_limit_ended"), "{kinds:?}");
}
