use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::Pair;
use crate::config::MasterConfig;
use crate::limits::Rate;
use crate::master::Verdict;
use crate::window::Rates;

/// Limits with an op of its own limit (`messages`), one with overrides
/// only (`presence`, unlimited otherwise), and an override on `messages`.
const CONFIG: &str = r#"
[limits]
messages = 1000
"messages/big" = 20000
"presence/vip" = 50
"#;

fn config() -> MasterConfig {
    MasterConfig::from_toml(CONFIG).unwrap()
}

const NOW: Nanos = Nanos::from_secs(1_800_000_000);

/// A verdict a master could give: `kind` picks the factor, the recheck
/// and, from 4 on, whether the limit is in shadow.
fn verdict(
    config: &MasterConfig,
    account: &str,
    op: &str,
    kind: u8,
    factor: f64,
) -> Option<Verdict> {
    let limit = config.limits.lookup(account, op)?.rate;
    Some(Verdict {
        factor: if kind.is_multiple_of(2) { 0.0 } else { factor },
        limit,
        valid_for: config.policy.factor_validity,
        rates: Rates::default(),
        shadow: kind >= 4,
        recheck_at: (kind % 4 >= 2).then_some(NOW + Duration::from_millis(137)),
    })
}

fn factor_of(v: &Verdict) -> Factor {
    Factor {
        factor: v.factor,
        limit: v.limit.get(),
        valid_for: Duration::from_millis(v.valid_for.as_millis() as u64),
        shadow: v.shadow,
        // These verdicts have no demand: never near their limit, so
        // nothing is listed for its utilisation (tested apart below).
        utilisation: 0.0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Whatever a master compacts, the agent expands to exactly the
    /// verdicts the master gave, one per pair, and nothing for the pairs
    /// no limit applies to.
    #[test]
    fn expansion_gives_back_exactly_the_verdicts_compaction_took(
        entries in proptest::collection::vec(
            (0usize..3, 0usize..6, 0u8..8, 0.01f64..1.0), 0..60),
    ) {
        let config = config();
        let ops = ["messages", "presence", "typing"];
        let accounts = ["acme", "big", "vip", "big/sub", "zed", "vip/x"];
        // The request: each (op, account) once, grouped by op.
        let mut request: BTreeMap<usize, BTreeMap<usize, (u8, f64)>> = BTreeMap::new();
        for (op, account, kind, factor) in entries {
            request.entry(op).or_default().insert(account, (kind, factor));
        }
        let names: Vec<&str> = request.keys().map(|&o| ops[o]).collect();
        let mut builder = ReplyBuilder::new(&config, names.iter().copied());
        let mut given: BTreeMap<(String, String), Factor> = BTreeMap::new();
        let mut asked = Vec::new();
        for (i, (&op, accounts_of)) in request.iter().enumerate() {
            for (&account, &(kind, factor)) in accounts_of {
                let (op, account) = (ops[op], accounts[account]);
                asked.push(Pair::new(account, op));
                if let Some(v) = verdict(&config, account, op, kind, factor) {
                    builder.add(i, || account.to_owned(), &v);
                    given.insert((op.to_owned(), account.to_owned()), factor_of(&v));
                }
            }
        }
        let header = ReplyHeader { rollup_interval: Duration::from_secs(2), ..ReplyHeader::default() };
        let reply = builder.finish(NOW, header);
        let mut expanded: BTreeMap<(String, String), Factor> = BTreeMap::new();
        reply.expand(asked.iter().map(|&pair| (pair, 0)), |pair, f, _| {
            let again = expanded.insert((pair.op.to_owned(), pair.account.to_owned()), f);
            assert!(again.is_none(), "{pair} expanded twice");
        });
        prop_assert_eq!(&expanded, &given);
        // Only what differs from its op's default is listed.
        for op in &reply.ops {
            for l in &op.listed {
                let implied = op.unlisted.is_some_and(|u| u.factor() == l.factor && !l.recheck);
                prop_assert!(!implied, "{}/{} listed needlessly", op.op, l.account);
            }
        }
    }
}

/// A reply asks again as soon as its soonest pair wants: a fall that may
/// release any moment (within 100 ms) is not held to another pair's
/// round (500 ms), whichever comes first; both are marked.
#[test]
fn a_reply_asks_again_when_its_soonest_pair_wants() {
    let config = config();
    let suppressed = |account: &str, after_ms: u64| Verdict {
        recheck_at: Some(NOW + Duration::from_millis(after_ms)),
        ..verdict(&config, account, "messages", 3, 0.9).unwrap()
    };
    for order in [[100, 500], [500, 100]] {
        let mut builder = ReplyBuilder::new(&config, ["messages"]);
        builder.add(0, || "a".into(), &suppressed("a", order[0]));
        builder.add(0, || "b".into(), &suppressed("b", order[1]));
        builder.add(
            0,
            || "c".into(),
            &verdict(&config, "c", "messages", 1, 0.9).unwrap(),
        );
        let reply = builder.finish(NOW, ReplyHeader::default());
        assert_eq!(reply.recheck_after, Some(Duration::from_millis(100)));
        assert_eq!(
            reply.rechecks().collect::<Vec<_>>(),
            [Pair::new("a", "messages"), Pair::new("b", "messages")]
        );
    }
}

#[test]
fn a_reply_lists_only_what_differs_and_asks_for_rechecks() {
    let config = config();
    let mut builder = ReplyBuilder::new(&config, ["messages", "typing"]);
    let calm = verdict(&config, "calm", "messages", 0, 0.0).unwrap();
    let flood = verdict(&config, "flood", "messages", 3, 0.9).unwrap();
    let big = verdict(&config, "big", "messages", 0, 0.0).unwrap();
    builder.add(0, || unreachable!("implied, never listed"), &calm);
    builder.add(0, || "flood".into(), &flood);
    builder.add(0, || "big".into(), &big);
    assert_eq!(builder.listed(), 2);
    let reply = builder.finish(NOW, ReplyHeader::default());
    // `typing` has no limit at all: left out.
    assert_eq!(reply.ops.len(), 1);
    assert_eq!(
        reply.ops[0].unlisted,
        Some(Unlisted {
            limit: 1000.0,
            valid_for: Duration::from_secs(6),
            shadow: false,
        })
    );
    assert_eq!(reply.recheck_after, Some(Duration::from_millis(137)));
    assert_eq!(
        reply.rechecks().collect::<Vec<_>>(),
        [Pair::new("flood", "messages")]
    );
    assert_eq!(reply.started, None, "0 on the wire means not said");
    assert_eq!(Rate::per_second(1000.0).unwrap().get(), 1000.0);
}

#[test]
fn rollups_group_by_op_and_validate_every_entry() {
    use crate::agent::{Delta, Pending};
    let pending = |op: &str, account: &str, attempted, admitted| Pending {
        account: account.into(),
        op: op.into(),
        delta: Delta {
            attempted,
            admitted,
            since: None,
            op_cost: 0,
            ops: 0,
        },
        at: 0,
    };
    let start = NOW - Duration::from_secs(2);
    let rollup = Rollup::from_pending(
        "edge-1",
        start + Duration::from_nanos(1),
        NOW,
        7,
        &[
            pending("messages", "a", 10, 10),
            pending("messages", "b", 5, 1),
            pending("presence", "a", 1, 1),
        ],
    );
    assert_eq!(rollup.ops.len(), 2);
    assert_eq!(rollup.entries(), 3);
    assert_eq!(rollup.start, start, "whole milliseconds, as on the wire");
    assert_eq!(rollup.validate(NOW, 3).map(|v| v.now()), Ok(NOW));
    assert_eq!(
        rollup.validate(NOW, 2),
        Err(RollupError::TooManyEntries { entries: 3, max: 2 })
    );
    let mut bad = rollup.clone();
    bad.ops[1].accounts[0].admitted = 2;
    let err = bad.validate(NOW, 10).unwrap_err();
    assert_eq!(
        err.to_string(),
        "ops[1].accounts[0]: `admitted` (2) is more than `attempted` (1)"
    );
    assert!(!err.is_implausible());
    // Rates in the same pass: `messages`/`a` claims 10 over 2 s.
    let within = |max| rollup.validate_within(NOW, 10, max);
    assert_eq!(within(5).map(|v| v.now()), Ok(NOW));
    let lie = within(4).unwrap_err();
    assert!(lie.is_implausible(), "{lie}");
    assert!(lie.to_string().starts_with("ops[0].accounts[0]: "), "{lie}");
    // Each entry is judged in turn, as malformed first: the first
    // refused says why.
    assert!(
        !bad.validate_within(NOW, 10, 5)
            .unwrap_err()
            .is_implausible()
    );
    // An entry carrying counts over from earlier rounds is judged on its
    // own interval: its span, and its rate over it.
    let mut carried = rollup.clone();
    carried.ops[1].accounts[0].since = Some(NOW - Duration::from_secs(10));
    carried.ops[1].accounts[0].attempted = 40;
    assert!(
        carried.validate_within(NOW, 10, 5).is_ok(),
        "4/s over its 10 s"
    );
    assert!(
        carried
            .validate_within(NOW, 10, 3)
            .unwrap_err()
            .is_implausible()
    );
    carried.ops[1].accounts[0].since = Some(NOW - MAX_REPORT_SPAN - Duration::from_secs(1));
    assert_eq!(
        carried.validate(NOW, 10).unwrap_err().to_string(),
        "ops[1].accounts[0]: the interval is 3601000 ms long; at most 3600000 ms is accepted"
    );
    let query = FactorsQuery::new(
        "edge-1",
        [
            Pair::new("a", "messages"),
            Pair::new("b", "messages"),
            Pair::new("", "x"),
        ],
    );
    assert_eq!(query.ops.len(), 2);
    assert_eq!(
        query.validate(10).unwrap_err().to_string(),
        "ops[1].accounts[0]: `account` is empty"
    );
}

/// A pair at or above the near share of its limit is listed with its
/// utilisation though its verdict is the op's default (factor 0), so its
/// agents can warn before refusing; one under it is left to the default.
#[test]
fn pairs_near_their_limit_are_listed_with_their_utilisation() {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000\n").unwrap();
    let at = |demand: f64| Verdict {
        factor: 0.0,
        limit: config.limits.lookup("a", "messages").unwrap().rate,
        valid_for: config.policy.factor_validity,
        rates: Rates {
            demand,
            ..Rates::default()
        },
        shadow: false,
        recheck_at: None,
    };
    let mut builder = ReplyBuilder::new(&config, ["messages"]);
    builder.add(0, || "near".into(), &at(850.0));
    builder.add(0, || "calm".into(), &at(790.0));
    let reply = builder.finish(NOW, ReplyHeader::default());
    let listed: Vec<(&str, f32)> = reply.ops[0]
        .listed
        .iter()
        .map(|l| (l.account.as_str(), l.factor.utilisation))
        .collect();
    assert_eq!(listed, [("near", 0.85)]);
}

/// A hello's reply (a query naming nothing) names, per op with a default,
/// the accounts whose limit is not it: `[limits]` overrides and `[exempt]`
/// entries. Other replies name none, and past [`HELLO_OVERRIDES_MAX`] a
/// hello names none either.
#[test]
fn a_hello_is_told_the_overrides_and_exemptions_of_each_op() {
    use crate::master::MasterState;
    let config = MasterConfig::from_toml(&format!(
        "{CONFIG}\"messages/org\" = 5000\n[exempt]\naccounts = [\"staff\"]\nmessages = [\"partner\"]\n[shadow]\nlimits = [\"messages/org\"]\n"
    ))
    .unwrap();
    let master = MasterState::new(config);
    let header = ReplyHeader::default();
    let hello = master
        .answer_factors(NOW, &FactorsQuery::new("edge-1", []), 100, header)
        .unwrap();
    let ops: Vec<&str> = hello.ops.iter().map(|o| o.op.as_str()).collect();
    assert_eq!(ops, ["messages"], "only ops with a default of their own");
    let mut overrides: Vec<(&str, f64, bool)> = hello.ops[0]
        .overrides
        .iter()
        .map(|o| (o.account.as_str(), o.limit, o.shadow))
        .collect();
    overrides.sort_by(|a, b| a.0.cmp(b.0));
    assert_eq!(
        overrides,
        [
            ("big", 20_000.0, false),
            ("org", 5_000.0, true),
            ("partner", f64::MAX, false),
            ("staff", f64::MAX, false),
        ]
    );
    let asked = master
        .answer_factors(
            NOW,
            &FactorsQuery::new("edge-1", [Pair::new("a", "messages")]),
            100,
            header,
        )
        .unwrap();
    assert!(asked.ops.iter().all(|o| o.overrides.is_empty()));

    let many: String = (0..=HELLO_OVERRIDES_MAX)
        .map(|i| format!("\"messages/a{i}\" = 5\n"))
        .collect();
    let master = MasterState::new(
        MasterConfig::from_toml(&format!("[limits]\nmessages = 1\n{many}")).unwrap(),
    );
    let hello = master
        .answer_factors(NOW, &FactorsQuery::new("edge-1", []), 100, header)
        .unwrap();
    assert_eq!(hello.ops[0].unlisted.map(|u| u.limit), Some(1.0));
    assert!(hello.ops[0].overrides.is_empty(), "too many: none");
}
