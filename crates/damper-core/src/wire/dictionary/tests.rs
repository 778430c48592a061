use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::agent::{Delta, Pending};

const T0: u64 = 1_800_000_000_000;

fn at(ms: u64) -> Nanos {
    Nanos::from_millis(T0 + ms)
}

/// A named rollup of `accounts` on op `messages`, each attempting 10 ×
/// its index + 1 and admitting all but 1; `carried` ones with their own
/// start.
fn rollup(sequence: u64, accounts: &[&str], carried: &[&str]) -> Rollup {
    let pending = accounts
        .iter()
        .enumerate()
        .map(|(i, a)| Pending {
            account: (*a).to_owned(),
            op: "messages".into(),
            delta: Delta {
                attempted: 10 * (i as u64 + 1),
                admitted: 10 * (i as u64 + 1) - 1,
                since: carried.contains(a).then(|| at(0)),
                op_cost: 0,
                ops: 0,
            },
            at: 0,
        })
        .collect();
    let mut r = Rollup::from_drain("agent-1", at(2_000), at(4_000), 0, pending);
    r.incarnation = 7;
    r.sequence = sequence;
    r
}

fn reply(takes_ids: bool) -> Reply {
    Reply {
        takes_ids,
        ..Reply::default()
    }
}

/// Its entries as (account, attempted, admitted, since), sorted: what a
/// master counts, whatever the order.
fn counts(r: &Rollup) -> Vec<(String, u64, u64, Option<Nanos>)> {
    let mut v: Vec<_> = r
        .ops
        .iter()
        .flat_map(|o| &o.accounts)
        .map(|c| (c.account.clone(), c.attempted, c.admitted, c.since))
        .collect();
    v.sort();
    v
}

fn numbered(r: &Rollup) -> usize {
    r.ops.iter().map(|o| o.by_id.len()).sum()
}

/// Sends `named` through `agent` to `master`, as the round and the
/// service do: the master's answer (`takes_ids`) or its refusal. The
/// expanded rollup must count exactly what the agent meant.
fn send(
    agent: &mut AgentDictionary,
    master: &mut Dictionaries,
    now: Nanos,
    named: &Rollup,
) -> Result<usize, DictionaryError> {
    let (mut wire, defined) = agent.compact(named);
    let by_number = numbered(&wire);
    match master.expand(now, &mut wire) {
        Ok(takes_ids) => {
            assert_eq!(counts(&wire), counts(named), "expanded as the agent meant");
            agent.confirm(&reply(takes_ids), &defined);
            Ok(by_number)
        }
        Err(e) => {
            if e.is_unknown() {
                agent.refused(&defined);
            }
            Err(e)
        }
    }
}

/// An agent's dictionary, told that its master takes numbers.
fn numbering() -> AgentDictionary {
    let mut agent = AgentDictionary::default();
    agent.confirm(&reply(true), &Defined::default());
    agent
}

/// Both sides of a dictionary in use: an agent told that its master takes
/// numbers, and that master, which took its first rollup naming
/// `accounts`.
fn named_once(accounts: &[&str]) -> (AgentDictionary, Dictionaries) {
    let mut agent = numbering();
    let mut master = Dictionaries::default();
    send(&mut agent, &mut master, at(100), &rollup(1, accounts, &[])).unwrap();
    (agent, master)
}

#[test]
fn accounts_go_by_number_once_their_names_were_answered() {
    let mut agent = AgentDictionary::default();
    let mut master = Dictionaries::default();
    let named = rollup(1, &["acme", "globex", "initech"], &[]);
    // Before any master said it takes numbers: names, untouched.
    let (wire, defined) = agent.compact(&named);
    assert_eq!(wire, named);
    assert_eq!(defined, Defined::default());
    agent.confirm(&reply(true), &defined);
    assert!(agent.enabled());
    // The first rollup names each account with its number...
    let (wire, defined) = agent.compact(&rollup(2, &["acme", "globex", "initech"], &[]));
    assert_eq!(numbered(&wire), 0);
    assert!(wire.ops[0].accounts.iter().all(|c| c.id != 0));
    assert_eq!(defined.ids.len(), 3);
    let mut expanded = wire.clone();
    assert_eq!(master.expand(at(2_100), &mut expanded), Ok(true));
    agent.confirm(&reply(true), &defined);
    // ... and the next ones by number alone, read back as names.
    assert_eq!(
        send(
            &mut agent,
            &mut master,
            at(4_100),
            &rollup(3, &["acme", "globex", "initech"], &[])
        ),
        Ok(3)
    );
    // A new account is named; the others go by number.
    assert_eq!(
        send(
            &mut agent,
            &mut master,
            at(6_100),
            &rollup(4, &["acme", "hooli"], &[])
        ),
        Ok(1)
    );
    assert_eq!(
        send(
            &mut agent,
            &mut master,
            at(8_100),
            &rollup(5, &["acme", "hooli"], &[])
        ),
        Ok(2)
    );
}

#[test]
fn numbers_take_a_fraction_of_the_names_bytes() {
    // The wire's packing is damper-proto's; here, what goes by number.
    let names: Vec<String> = (0..100).map(|i| format!("account-{i:04}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (mut agent, _) = named_once(&names);
    let (wire, _) = agent.compact(&rollup(2, &names, &[]));
    assert_eq!(numbered(&wire), 100);
    assert!(wire.ops[0].accounts.is_empty());
    let ids: Vec<u32> = wire.ops[0].by_id.iter().map(|c| c.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "sorted: {ids:?}");
}

#[test]
fn a_carried_entry_keeps_its_name_and_start() {
    let (mut agent, mut master) = named_once(&["acme", "globex"]);
    let named = rollup(2, &["acme", "globex"], &["globex"]);
    let (wire, _) = agent.compact(&named);
    assert_eq!(wire.ops[0].by_id.len(), 1);
    assert_eq!(wire.ops[0].accounts.len(), 1);
    assert_eq!(wire.ops[0].accounts[0].account, "globex");
    assert_eq!(send(&mut agent, &mut master, at(2_100), &named), Ok(1));
}

#[test]
fn a_master_that_restarted_refuses_numbers_and_the_resend_names_everything() {
    let (mut agent, _) = named_once(&["acme", "globex"]);
    // The master restarts: it holds nothing.
    let mut master = Dictionaries::default();
    let named = rollup(2, &["acme", "globex"], &[]);
    let refused = send(&mut agent, &mut master, at(2_100), &named).unwrap_err();
    assert!(refused.is_unknown(), "{refused}");
    assert!(refused.to_string().contains("send the account names again"));
    // The round resends it at once, same number: every account named, in a
    // new epoch, and taken.
    let (wire, _) = agent.compact(&named);
    assert_eq!(numbered(&wire), 0);
    assert_eq!(send(&mut agent, &mut master, at(2_200), &named), Ok(0));
    assert_eq!(
        send(
            &mut agent,
            &mut master,
            at(4_100),
            &rollup(3, &["acme", "globex"], &[])
        ),
        Ok(2)
    );
}

#[test]
fn a_rollup_whose_answer_was_lost_names_its_new_accounts_again() {
    let (mut agent, mut master) = named_once(&["acme"]);
    // Sent with a new account; the master took it but the reply was lost.
    let named = rollup(2, &["acme", "globex"], &[]);
    let (mut wire, _) = agent.compact(&named);
    let epoch = wire.dictionary;
    master.expand(at(2_100), &mut wire).unwrap();
    // The resend: the same epoch, `acme` by number, `globex` named with the
    // same number again, which the master takes again.
    let (wire, defined) = agent.compact(&named);
    assert_eq!(wire.dictionary, epoch);
    assert_eq!(numbered(&wire), 1);
    assert_eq!(defined.ids.len(), 1);
    assert_eq!(send(&mut agent, &mut master, at(2_300), &named), Ok(1));
    assert_eq!(send(&mut agent, &mut master, at(4_100), &named), Ok(2));
    assert_eq!(master.len(), 1);
    assert_eq!(master.total(), DICTIONARY_ROOM + 3, "numbers 0 to 2");
}

#[test]
fn a_master_that_predates_numbers_gets_names() {
    let mut agent = numbering();
    let (_, defined) = agent.compact(&rollup(1, &["acme"], &[]));
    // Its reply has no `takes_ids`: names from now on.
    agent.confirm(&reply(false), &defined);
    assert!(!agent.enabled());
    assert!(agent.is_empty());
    let named = rollup(2, &["acme"], &[]);
    assert_eq!(agent.compact(&named).0, named);
}

#[test]
fn a_number_given_another_name_is_a_conflict() {
    let mut master = Dictionaries::default();
    let mut first = rollup(1, &["acme"], &[]);
    first.dictionary = 1;
    first.ops[0].accounts[0].id = 1;
    assert_eq!(master.expand(at(100), &mut first), Ok(true));
    let mut second = rollup(2, &["globex"], &[]);
    second.dictionary = 1;
    second.ops[0].accounts[0].id = 1;
    let refused = master.expand(at(200), &mut second).unwrap_err();
    assert!(
        matches!(refused, DictionaryError::Conflict { id: 1, .. }),
        "{refused:?}"
    );
    assert!(refused.is_unknown());
}

#[test]
fn malformed_numbers_are_refused_by_name() {
    let mut master = Dictionaries::default();
    // Numbers in a rollup that names no dictionary.
    let mut r = rollup(1, &["acme"], &[]);
    r.ops[0].accounts[0].id = 3;
    let refused = master.expand(at(100), &mut r).unwrap_err();
    assert_eq!(refused, DictionaryError::NoDictionary { op: 0 });
    assert!(!refused.is_unknown());
    // Number 0.
    let mut r = rollup(2, &["acme"], &[]);
    r.dictionary = 1;
    r.ops[0].accounts[0].id = 1;
    master.expand(at(100), &mut r).unwrap();
    let mut r = rollup(3, &[], &[]);
    r.dictionary = 1;
    r.ops.push(OpCounts {
        op: "messages".into(),
        accounts: Vec::new(),
        by_id: vec![IdCounts {
            id: 0,
            attempted: 1,
            admitted: 1,
            op_cost: 0,
            ops: 0,
        }],
    });
    assert_eq!(
        master.expand(at(200), &mut r),
        Err(DictionaryError::Zero { op: 0 })
    );
}

#[test]
fn an_agent_past_its_budget_is_told_to_name_its_accounts() {
    let limits = DictionaryLimits {
        max_ids: 2,
        ..DictionaryLimits::default()
    };
    let mut master = Dictionaries::new(limits);
    let mut agent = numbering();
    assert_eq!(
        send(
            &mut agent,
            &mut master,
            at(100),
            &rollup(1, &["a", "b"], &[])
        ),
        Ok(0)
    );
    assert!(agent.enabled());
    // A third account passes `max_ids`: counted (it is named) but no
    // number is kept, and the agent names everything from then on: the
    // master keeps saying so until the agent's dictionary, empty, is
    // dropped idle.
    assert_eq!(
        send(
            &mut agent,
            &mut master,
            at(2_100),
            &rollup(2, &["a", "b", "c"], &[])
        ),
        Ok(2)
    );
    assert!(!agent.enabled());
    assert_eq!(master.total(), DICTIONARY_ROOM);
    assert_eq!(master.names(), 0);
    for round in 3..6 {
        let named = rollup(round, &["a", "b", "c"], &[]);
        assert_eq!(
            send(&mut agent, &mut master, at(round * 2_000), &named),
            Ok(0)
        );
        assert!(!agent.enabled(), "round {round}");
    }
    assert_eq!(master.evict_idle(at(400_000)), 1);
    assert_eq!(master.total(), 0);
}

#[test]
fn the_masters_total_is_bounded_over_every_agent() {
    // Room for one dictionary of three accounts (numbers 0 to 3), not two.
    let limits = DictionaryLimits {
        max_total: 2 * DICTIONARY_ROOM + 3,
        ..DictionaryLimits::default()
    };
    let mut master = Dictionaries::new(limits);
    let mut one = numbering();
    send(
        &mut one,
        &mut master,
        at(100),
        &rollup(1, &["a", "b", "c"], &[]),
    )
    .unwrap();
    assert_eq!(master.total(), DICTIONARY_ROOM + 4);
    // Another agent run: no room for its numbers.
    let mut other = rollup(1, &["x", "y"], &[]);
    other.incarnation = 8;
    let mut agent = numbering();
    assert_eq!(send(&mut agent, &mut master, at(200), &other), Ok(0));
    assert!(!agent.enabled());
    assert_eq!(master.total(), DICTIONARY_ROOM + 4);
    assert!(one.enabled());
}

#[test]
fn idle_dictionaries_are_dropped() {
    let mut master = Dictionaries::new(DictionaryLimits {
        idle_for: Duration::from_secs(60),
        ..DictionaryLimits::default()
    });
    let mut agent = numbering();
    send(&mut agent, &mut master, at(100), &rollup(1, &["acme"], &[])).unwrap();
    assert_eq!(master.evict_idle(at(30_000)), 0);
    assert_eq!(master.evict_idle(at(60_100)), 1);
    assert!(master.is_empty());
    // The agent's next numbers are refused, and its resend names them.
    assert!(
        send(
            &mut agent,
            &mut master,
            at(62_000),
            &rollup(2, &["acme"], &[])
        )
        .is_err()
    );
    assert_eq!(
        send(
            &mut agent,
            &mut master,
            at(62_100),
            &rollup(2, &["acme"], &[])
        ),
        Ok(0)
    );
}

#[test]
fn accounts_gone_quiet_are_pruned_in_a_new_epoch() {
    let mut agent = numbering();
    let mut master = Dictionaries::default();
    let many: Vec<String> = (0..100).map(|i| format!("a{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    send(&mut agent, &mut master, at(0), &rollup(1, &many, &[])).unwrap();
    // Only two stay busy, for three times PRUNE_AFTER (looked over every
    // PRUNE_AFTER, pruned of what was quiet for as long).
    let rounds = 3 * PRUNE_AFTER.as_millis() as u64 / 2_000;
    for round in 2..(2 + rounds) {
        let mut busy = rollup(round, &["a1", "a2"], &[]);
        busy.end = at(round * 2_000);
        send(&mut agent, &mut master, at(round * 2_000), &busy).unwrap();
    }
    assert_eq!(agent.len(), 2, "the quiet accounts were forgotten");
    assert!(
        master.total() <= DICTIONARY_ROOM + 3,
        "the master's copy followed: {}",
        master.total()
    );
}

proptest! {
    /// Whatever accounts come and go and whichever requests fail (the
    /// master took it or not) or masters restart, every rollup a master
    /// takes counts exactly what the agent meant, and numbers are used
    /// once a round has confirmed them.
    #[test]
    fn a_master_reads_what_the_agent_meant(
        rounds in proptest::collection::vec(
            (proptest::collection::btree_set(0u8..24, 0..12), 0u8..10),
            1..40),
    ) {
        let mut agent = numbering();
        let mut master = Dictionaries::default();
        let mut by_number = 0;
        for (i, (accounts, fate)) in rounds.iter().enumerate() {
            let names: Vec<String> = accounts.iter().map(|a| format!("acct-{a}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let named = rollup(i as u64 + 1, &names, &[]);
            let now = at(i as u64 * 2_000);
            let (mut wire, defined) = agent.compact(&named);
            let sent_by_number = numbered(&wire);
            match fate {
                // Lost before the master.
                0 => {}
                // Taken, the reply lost.
                1 => {
                    let _ = master.expand(now, &mut wire);
                }
                // The master restarts.
                2 => master = Dictionaries::default(),
                _ => match master.expand(now, &mut wire) {
                    Ok(takes_ids) => {
                        prop_assert_eq!(counts(&wire), counts(&named));
                        by_number += sent_by_number;
                        agent.confirm(&reply(takes_ids), &defined);
                    }
                    Err(e) => {
                        prop_assert!(e.is_unknown());
                        prop_assert!(defined.by_number > 0);
                        agent.refused(&defined);
                    }
                },
            }
        }
        prop_assert!(by_number <= rounds.iter().map(|r| r.0.len()).sum::<usize>());
    }
}

#[test]
fn a_name_numbered_by_many_agents_is_held_once() {
    let mut master = Dictionaries::new(DictionaryLimits {
        idle_for: Duration::from_secs(60),
        ..DictionaryLimits::default()
    });
    let mut agents: Vec<AgentDictionary> = (0..3).map(|_| numbering()).collect();
    for (i, agent) in agents.iter_mut().enumerate() {
        let mut named = rollup(1, &["acme", "globex"], &[]);
        named.incarnation = i as u64;
        send(agent, &mut master, at(i as u64 * 1_000), &named).unwrap();
    }
    assert_eq!(master.len(), 3);
    assert_eq!(master.names(), 2);
    // By number, each agent's own, read back right.
    for (i, agent) in agents.iter_mut().enumerate() {
        let mut named = rollup(2, &["globex", "acme"], &[]);
        named.incarnation = i as u64;
        assert_eq!(send(agent, &mut master, at(30_000), &named), Ok(2));
    }
    // Dropping dictionaries drops a name with its last reference only.
    assert_eq!(master.evict_idle(at(62_500)), 0);
    let mut last = rollup(3, &["acme"], &[]);
    last.incarnation = 2;
    send(&mut agents[2], &mut master, at(62_600), &last).unwrap();
    assert_eq!(master.evict_idle(at(90_100)), 2);
    assert_eq!(master.names(), 2, "the last agent still numbers both");
    assert_eq!(master.evict_idle(at(122_700)), 1);
    assert_eq!((master.names(), master.total()), (0, 0));
    // A name freed and numbered again reuses its place.
    let mut again = numbering();
    send(
        &mut again,
        &mut master,
        at(130_000),
        &rollup(1, &["initech"], &[]),
    )
    .unwrap();
    assert_eq!(
        send(
            &mut again,
            &mut master,
            at(132_000),
            &rollup(2, &["initech"], &[])
        ),
        Ok(1)
    );
    assert_eq!(master.names(), 1);
}

/// Where the master found each account's pair is remembered once per
/// name (every agent that numbers the account shares it), handed back
/// with the entries given by number, and forgotten with the name.
#[test]
fn hints_of_where_pairs_are_follow_the_names() {
    let (mut agent, mut master) = named_once(&["acme", "globex"]);
    // Another agent, numbering globex too.
    let of = |agent_id: &str, sequence, accounts: &[&str]| Rollup {
        agent_id: agent_id.into(),
        ..rollup(sequence, accounts, &[])
    };
    let mut other = numbering();
    send(
        &mut other,
        &mut master,
        at(100),
        &of("agent-2", 1, &["globex"]),
    )
    .unwrap();
    let by_number =
        |agent: &mut AgentDictionary, master: &mut Dictionaries, id, accounts: &[&str]| {
            let (mut wire, _) = agent.compact(&of(id, 2, accounts));
            assert_eq!(numbered(&wire), accounts.len());
            let expanded = master.expand_found(at(2_100), &mut wire).unwrap();
            (wire, expanded)
        };
    let (wire, mut expanded) = by_number(&mut agent, &mut master, "agent-1", &["acme", "globex"]);
    assert!(expanded.takes_ids);
    // Entries come in number order: acme (1), then globex (2).
    let names: Vec<&str> = wire.ops[0]
        .accounts
        .iter()
        .map(|c| c.account.as_str())
        .collect();
    assert_eq!(names, ["acme", "globex"]);
    assert_eq!(
        (expanded.hint(0, 0), expanded.hint(0, 1)),
        (0, 0),
        "none known yet"
    );
    expanded.found(0, 0, 7);
    expanded.found(0, 1, 9);
    assert!(expanded.moved());
    master.learn(&expanded);
    let (_, mut expanded) = by_number(&mut agent, &mut master, "agent-1", &["acme", "globex"]);
    assert_eq!((expanded.hint(0, 0), expanded.hint(0, 1)), (7, 9));
    expanded.found(0, 0, 7);
    assert!(
        !expanded.moved(),
        "found where the hint said: nothing to learn"
    );
    // The other agent numbers globex too, and is told the same.
    let (_, expanded) = by_number(&mut other, &mut master, "agent-2", &["globex"]);
    assert_eq!(expanded.hint(0, 0), 9);
    // Entries that came named have no hint.
    assert_eq!(Expansion::named(true).hint(0, 0), 0);
    // Once no dictionary holds a name, its hint goes with it: a name
    // interned again in that place starts with none.
    assert_eq!(master.evict_idle(at(2_100) + Duration::from_secs(600)), 2);
    let (mut agent, mut master) = (numbering(), master);
    send(
        &mut agent,
        &mut master,
        at(700_000),
        &rollup(1, &["initech"], &[]),
    )
    .unwrap();
    let (_, expanded) = by_number(&mut agent, &mut master, "agent-1", &["initech"]);
    assert_eq!(expanded.hint(0, 0), 0);
}

proptest! {
    /// Hints change how a master finds a pair, never what it counts:
    /// rollups from three agents, given by number to one master (hints
    /// used and learned) and named to another, over two ops, with pairs
    /// forgotten between rounds (so others move into their places), leave
    /// both with the same pairs and the same verdict for every one.
    #[test]
    fn hints_never_change_what_a_master_counts(
        rounds in proptest::collection::vec(
            (0usize..3,
             proptest::collection::btree_map((0u8..12, 0u8..2), 1u64..4_000, 1..10),
             0u64..4),
            1..50),
    ) {
        use crate::config::MasterConfig;
        use crate::master::MasterState;
        use crate::wire::ReplyHeader;
        let config = MasterConfig::from_toml("[limits]\nmessages = 1000\npresence = 300").unwrap();
        let (mut hinted, mut plain) = (MasterState::new(config.clone()), MasterState::new(config));
        let mut dictionaries = Dictionaries::default();
        let mut agents: Vec<AgentDictionary> = (0..3).map(|_| numbering()).collect();
        let ops = ["messages", "presence"];
        let mut round = 1u64;
        for (agent, entries, skipped) in &rounds {
            round += 1 + skipped;
            let end = at(round * 2_000);
            let now = end + Duration::from_millis(5);
            let pending = entries
                .iter()
                .map(|(&(account, op), &cost)| Pending {
                    account: format!("acct-{account}"),
                    op: ops[op as usize].into(),
                    delta: Delta { attempted: cost, admitted: cost, since: None, op_cost: 0, ops: 0 },
                    at: 0,
                })
                .collect();
            let mut named = Rollup::from_drain(&format!("agent-{agent}"), end - Duration::from_secs(2), end, 0, pending);
            named.incarnation = 1;
            let (mut wire, defined) = agents[*agent].compact(&named);
            let mut expanded = dictionaries.expand_found(now, &mut wire).unwrap();
            hinted
                .answer_rollup_near(now, &wire, &mut expanded, 100, ReplyHeader::default())
                .unwrap();
            dictionaries.learn(&expanded);
            agents[*agent].confirm(&reply(expanded.takes_ids), &defined);
            plain.answer_rollup(now, &named, 100, ReplyHeader::default()).unwrap();
            // Pairs quiet for 5 s are forgotten: others move into their places.
            let idle = Duration::from_secs(5);
            prop_assert_eq!(hinted.evict_idle(now, idle), plain.evict_idle(now, idle));
            prop_assert_eq!(hinted.len(), plain.len());
            for account in (0..12).map(|a| format!("acct-{a}")) {
                for op in ops {
                    prop_assert_eq!(
                        hinted.verdict(now, &account, op),
                        plain.verdict(now, &account, op),
                        "{}/{}", account, op
                    );
                }
            }
        }
    }
}
