//! The one mapping between the core's message types
//! ([`damper_core::wire`]) and their `damper.v1` protobuf messages, both
//! ways, field for field. The rules about what a message may carry and
//! what a compact reply means live in `damper_core::wire`; this module
//! only moves values: times and durations become whole milliseconds, an
//! absent value becomes 0, and 0 on the wire reads back as absent.
//!
//! Conversions take their input by value, so names move rather than copy.

use std::time::Duration;

use damper_core::time::Nanos;
use damper_core::wire::{
    AccountCounts, Factor, FactorsQuery, IdCounts, Listed, OpAccounts, OpCounts, OpVerdicts,
    Override, Reply, Rollup, SurgeRates, Unlisted, micros_u32, millis_u32,
};

use crate::v1;

/// 0 on the wire: not said.
fn nonzero_millis(ms: u64) -> Option<Nanos> {
    (ms != 0).then(|| Nanos::from_millis(ms))
}

fn duration_ms(ms: u32) -> Option<Duration> {
    (ms != 0).then(|| Duration::from_millis(u64::from(ms)))
}

impl From<Rollup> for v1::RollupRequest {
    fn from(r: Rollup) -> Self {
        v1::RollupRequest {
            agent_id: r.agent_id,
            interval_start_unix_ms: r.start.as_millis(),
            interval_end_unix_ms: r.end.as_millis(),
            incarnation: r.incarnation,
            sequence: r.sequence,
            ops: r.ops.into_iter().map(op_counts).collect(),
            ring_version: r.ring_version,
            dictionary: r.dictionary,
        }
    }
}

/// One op's counts as the wire carries them.
fn op_counts(op: OpCounts) -> v1::OpCounts {
    let (ids, attempted, rejected) = by_id_lists(&op.by_id);
    let op_costs = op_cost_list(&op.by_id);
    let op_counts = op_count_list(&op.by_id, &op_costs);
    v1::OpCounts {
        op: op.op,
        accounts: op
            .accounts
            .into_iter()
            .map(|c| v1::AccountCounts {
                account: c.account,
                attempted: c.attempted,
                admitted: c.admitted,
                start_unix_ms: c.since.map_or(0, Nanos::as_millis),
                id: c.id,
                op_cost: c.op_cost,
                ops: told_ops(c.op_cost, c.ops),
            })
            .collect(),
        ids,
        attempted,
        rejected,
        op_costs,
        op_counts,
    }
}

/// Entries by number as the wire packs them: each number as its
/// difference from the one before (they come sorted), the attempted cost,
/// and the cost not admitted (0 for most, one byte).
fn by_id_lists(by_id: &[IdCounts]) -> (Vec<u32>, Vec<u64>, Vec<u64>) {
    let mut before = 0u32;
    let ids = by_id
        .iter()
        .map(|c| {
            let delta = c.id.wrapping_sub(before);
            before = c.id;
            delta
        })
        .collect();
    let attempted = by_id.iter().map(|c| c.attempted).collect();
    let rejected = by_id
        .iter()
        .map(|c| c.attempted.saturating_sub(c.admitted))
        .collect();
    (ids, attempted, rejected)
}

/// The op costs of entries by number as the wire packs them: empty when
/// none is costlier than 1 (an op of cost-1 operations sends nothing
/// more), else one per entry, 0 for not known or 1.
fn op_cost_list(by_id: &[IdCounts]) -> Vec<u32> {
    if by_id.iter().all(|c| c.op_cost <= 1) {
        return Vec::new();
    }
    by_id
        .iter()
        .map(|c| if c.op_cost > 1 { c.op_cost } else { 0 })
        .collect()
}

/// The operations of entries by number as the wire packs them: with the
/// op costs (empty when they are), one per entry, 0 where the op cost is
/// not above 1.
fn op_count_list(by_id: &[IdCounts], op_costs: &[u32]) -> Vec<u32> {
    if op_costs.is_empty() {
        return Vec::new();
    }
    by_id.iter().map(|c| told_ops(c.op_cost, c.ops)).collect()
}

/// An entry's operations as sent: only beside an op cost above 1, where
/// they say more than the cost does.
fn told_ops(op_cost: u32, ops: u32) -> u32 {
    if op_cost > 1 { ops } else { 0 }
}

/// The entries of an op given by number, from the three packed lists.
/// Malformed lists (which [`id_lists_error`] names) come out as far as
/// they make sense: as long as the shortest, numbers wrapping, admitted
/// at least 0.
fn by_id(op: &v1::OpCounts) -> Vec<IdCounts> {
    let mut id = 0u32;
    op.ids
        .iter()
        .zip(&op.attempted)
        .zip(&op.rejected)
        .enumerate()
        .map(|(j, ((&delta, &attempted), &rejected))| {
            id = id.wrapping_add(delta);
            IdCounts {
                id,
                attempted,
                admitted: attempted.saturating_sub(rejected),
                op_cost: op.op_costs.get(j).copied().unwrap_or(0),
                ops: op.op_counts.get(j).copied().unwrap_or(0),
            }
        })
        .collect()
}

/// Why a rollup's entries by number cannot be read, naming the field;
/// `None` when every op's `ids`, `attempted` and `rejected` have one value
/// per entry, every difference is positive, no number passes 2^32 − 1 and
/// no entry rejected more than it attempted.
pub fn id_lists_error(request: &v1::RollupRequest) -> Option<String> {
    request.ops.iter().enumerate().find_map(|(i, op)| {
        let lens = [op.ids.len(), op.attempted.len(), op.rejected.len()];
        if lens[1] != lens[0] || lens[2] != lens[0] {
            return Some(format!(
                "ops[{i}]: ids ({}), attempted ({}) and rejected ({}) must have one value per entry",
                lens[0], lens[1], lens[2]
            ));
        }
        if !op.op_costs.is_empty() && op.op_costs.len() != lens[0] {
            return Some(format!(
                "ops[{i}]: op_costs ({}) must be empty or have one value per entry of ids ({})",
                op.op_costs.len(),
                lens[0]
            ));
        }
        if !op.op_counts.is_empty() && op.op_counts.len() != lens[0] {
            return Some(format!(
                "ops[{i}]: op_counts ({}) must be empty or have one value per entry of ids ({})",
                op.op_counts.len(),
                lens[0]
            ));
        }
        if let Some(j) = op
            .op_counts
            .iter()
            .zip(&op.attempted)
            .position(|(&n, &a)| u64::from(n) > a)
        {
            return Some(format!(
                "ops[{i}].op_counts[{j}] ({}) is above ops[{i}].attempted[{j}] ({}); every operation costs at least 1",
                op.op_counts[j], op.attempted[j]
            ));
        }
        let mut id = 0u32;
        for (j, &delta) in op.ids.iter().enumerate() {
            if delta == 0 {
                return Some(format!(
                    "ops[{i}].ids[{j}] is 0: each id is its difference from the one before, sorted and distinct, the first from 0"
                ));
            }
            match id.checked_add(delta) {
                Some(next) => id = next,
                None => return Some(format!("ops[{i}].ids[{j}]: the id passes 2^32 - 1")),
            }
        }
        op.rejected
            .iter()
            .zip(&op.attempted)
            .position(|(r, a)| r > a)
            .map(|j| {
                format!(
                    "ops[{i}].rejected[{j}] ({}) is above ops[{i}].attempted[{j}] ({})",
                    op.rejected[j], op.attempted[j]
                )
            })
    })
}

impl From<v1::RollupRequest> for Rollup {
    fn from(r: v1::RollupRequest) -> Self {
        Rollup {
            agent_id: r.agent_id,
            start: Nanos::from_millis(r.interval_start_unix_ms),
            end: Nanos::from_millis(r.interval_end_unix_ms),
            ring_version: r.ring_version,
            incarnation: r.incarnation,
            sequence: r.sequence,
            ops: r
                .ops
                .into_iter()
                .map(|op| OpCounts {
                    by_id: by_id(&op),
                    op: op.op,
                    accounts: op
                        .accounts
                        .into_iter()
                        .map(|c| AccountCounts {
                            account: c.account,
                            attempted: c.attempted,
                            admitted: c.admitted,
                            since: nonzero_millis(c.start_unix_ms),
                            id: c.id,
                            op_cost: c.op_cost,
                            ops: c.ops,
                            at: 0,
                        })
                        .collect(),
                })
                .collect(),
            dictionary: r.dictionary,
        }
    }
}

impl From<FactorsQuery> for v1::FactorsRequest {
    fn from(q: FactorsQuery) -> Self {
        v1::FactorsRequest {
            agent_id: q.agent_id,
            ops: q
                .ops
                .into_iter()
                .map(|op| v1::OpAccounts {
                    op: op.op,
                    accounts: op.accounts,
                    rates: op.surges.iter().map(|s| s.rate).collect(),
                    baselines: op.surges.iter().map(|s| s.baseline).collect(),
                    surged: op.surges.iter().map(|s| s.surged).collect(),
                    // Empty unless a pair joined, so early reports stay as
                    // small as before.
                    joined: if op.surges.iter().any(|s| s.joined) {
                        op.surges.iter().map(|s| s.joined).collect()
                    } else {
                        Vec::new()
                    },
                    hints: if op.surges.iter().any(|s| s.hint) {
                        op.surges.iter().map(|s| s.hint).collect()
                    } else {
                        Vec::new()
                    },
                    ops: if op.surges.iter().any(|s| s.ops != 0) {
                        op.surges.iter().map(|s| s.ops).collect()
                    } else {
                        Vec::new()
                    },
                    // Empty unless a follow-up says it: for the rest it is
                    // their baseline.
                    rollup_baselines: if op
                        .surges
                        .iter()
                        .any(|s| s.surged && s.rollup_baseline.is_some())
                    {
                        op.surges
                            .iter()
                            .map(|s| s.rollup_baseline.unwrap_or(s.baseline))
                            .collect()
                    } else {
                        Vec::new()
                    },
                    // Empty unless a counted rise says it.
                    span_micros: if op.surges.iter().any(|s| s.span.is_some()) {
                        op.surges
                            .iter()
                            .map(|s| s.span.map_or(0, micros_u32))
                            .collect()
                    } else {
                        Vec::new()
                    },
                })
                .collect(),
            surge_at_unix_ms: q.surge_at.map_or(0, |t| t.as_millis()),
        }
    }
}

impl From<v1::FactorsRequest> for FactorsQuery {
    fn from(q: v1::FactorsRequest) -> Self {
        FactorsQuery {
            agent_id: q.agent_id,
            ops: q
                .ops
                .into_iter()
                .map(|op| OpAccounts {
                    surges: surges(&op),
                    op: op.op,
                    accounts: op.accounts,
                })
                .collect(),
            surge_at: (q.surge_at_unix_ms != 0).then(|| Nanos::from_millis(q.surge_at_unix_ms)),
        }
    }
}

/// An op's surges from its parallel lists. Lists of unequal length are a
/// malformed request, which [`surge_lists_error`] names; converted
/// anyway, they come out as long as `rates`, the missing values 0, `false`
/// or `None`. A rollup baseline is read for follow-ups (`surged`) only.
fn surges(op: &v1::OpAccounts) -> Vec<SurgeRates> {
    op.rates
        .iter()
        .enumerate()
        .map(|(i, &rate)| SurgeRates {
            rate,
            baseline: op.baselines.get(i).copied().unwrap_or(0.0),
            surged: op.surged.get(i).copied().unwrap_or(false),
            joined: op.joined.get(i).copied().unwrap_or(false),
            hint: op.hints.get(i).copied().unwrap_or(false),
            ops: op.ops.get(i).copied().unwrap_or(0),
            rollup_baseline: op
                .surged
                .get(i)
                .is_some_and(|&s| s)
                .then(|| op.rollup_baselines.get(i).copied())
                .flatten(),
            span: op
                .span_micros
                .get(i)
                .filter(|&&us| us != 0)
                .map(|&us| Duration::from_micros(u64::from(us))),
        })
        .collect()
}

/// Why an early report's parallel lists do not line up, naming the field;
/// `None` when every op's `rates`, `baselines` and `surged` are as long as
/// its `accounts` (or all empty), and `joined`, `hints`, `ops` and
/// `rollup_baselines` and `span_micros` each as long or empty (and empty
/// when the rest are).
pub fn surge_lists_error(request: &v1::FactorsRequest) -> Option<String> {
    request.ops.iter().enumerate().find_map(|(i, op)| {
        let n = op.accounts.len();
        let lens = [op.rates.len(), op.baselines.len(), op.surged.len()];
        let optional = [
            ("joined", op.joined.len()),
            ("hints", op.hints.len()),
            ("ops", op.ops.len()),
            ("rollup_baselines", op.rollup_baselines.len()),
            ("span_micros", op.span_micros.len()),
        ];
        if lens != [0, 0, 0] && lens != [n, n, n] {
            return Some(format!(
                "ops[{i}]: rates ({}), baselines ({}) and surged ({}) must each have one value per account ({n})",
                lens[0], lens[1], lens[2]
            ));
        }
        let each = if lens == [0, 0, 0] { 0 } else { n };
        optional
            .into_iter()
            .find(|&(_, len)| len != 0 && len != each)
            .map(|(name, len)| {
                format!("ops[{i}]: {name} ({len}) must have one value per account ({each}) or none")
            })
    })
}

impl From<Reply> for v1::RollupReply {
    fn from(r: Reply) -> Self {
        v1::RollupReply {
            ops: r
                .ops
                .into_iter()
                .map(|op| v1::OpFactors {
                    op: op.op,
                    accounts: op
                        .listed
                        .into_iter()
                        .map(|l| v1::AccountFactor {
                            account: l.account,
                            factor: l.factor.factor,
                            limit: l.factor.limit,
                            valid_for_ms: millis_u32(l.factor.valid_for),
                            recheck: l.recheck,
                            shadow: l.factor.shadow,
                            utilisation: l.factor.utilisation,
                        })
                        .collect(),
                    unlisted_limit: op.unlisted.map_or(0.0, |u| u.limit),
                    unlisted_valid_for_ms: op.unlisted.map_or(0, |u| millis_u32(u.valid_for)),
                    unlisted_shadow: op.unlisted.is_some_and(|u| u.shadow),
                    overrides: op
                        .overrides
                        .into_iter()
                        .map(|o| v1::LimitOverride {
                            account: o.account,
                            limit: o.limit,
                            shadow: o.shadow,
                        })
                        .collect(),
                })
                .collect(),
            rollup_interval_ms: r.rollup_interval.map_or(0, millis_u32),
            recheck_after_ms: r.recheck_after.map_or(0, millis_u32),
            started_unix_ms: r.started.map_or(0, Nanos::as_millis),
            ring_version: r.ring_version,
            foreign_entries: r.foreign_entries,
            takes_ids: r.takes_ids,
            takes_hints: r.takes_hints,
            polls: r.polls.into_iter().map(v1::OpAccounts::from).collect(),
        }
    }
}

impl From<v1::RollupReply> for Reply {
    fn from(r: v1::RollupReply) -> Self {
        Reply {
            ops: r
                .ops
                .into_iter()
                .map(|op| OpVerdicts {
                    listed: op
                        .accounts
                        .into_iter()
                        .map(|f| Listed {
                            account: f.account,
                            factor: Factor {
                                factor: f.factor,
                                limit: f.limit,
                                valid_for: Duration::from_millis(u64::from(f.valid_for_ms)),
                                shadow: f.shadow,
                                utilisation: f.utilisation,
                            },
                            recheck: f.recheck,
                        })
                        .collect(),
                    // A master that predates the field sends 0: no default,
                    // as before.
                    unlisted: (op.unlisted_limit > 0.0).then(|| Unlisted {
                        limit: op.unlisted_limit,
                        valid_for: Duration::from_millis(u64::from(op.unlisted_valid_for_ms)),
                        shadow: op.unlisted_shadow,
                    }),
                    overrides: op
                        .overrides
                        .into_iter()
                        .map(|o| Override {
                            account: o.account,
                            limit: o.limit,
                            shadow: o.shadow,
                        })
                        .collect(),
                    op: op.op,
                })
                .collect(),
            rollup_interval: duration_ms(r.rollup_interval_ms),
            recheck_after: duration_ms(r.recheck_after_ms),
            started: nonzero_millis(r.started_unix_ms),
            ring_version: r.ring_version,
            foreign_entries: r.foreign_entries,
            takes_ids: r.takes_ids,
            takes_hints: r.takes_hints,
            polls: r.polls.into_iter().map(OpAccounts::from).collect(),
        }
    }
}

/// A poll's pairs of one op (no surges).
impl From<OpAccounts> for v1::OpAccounts {
    fn from(op: OpAccounts) -> Self {
        v1::OpAccounts {
            op: op.op,
            accounts: op.accounts,
            ..v1::OpAccounts::default()
        }
    }
}

/// A poll's pairs of one op; any surges it carries are ignored.
impl From<v1::OpAccounts> for OpAccounts {
    fn from(op: v1::OpAccounts) -> Self {
        OpAccounts {
            op: op.op,
            accounts: op.accounts,
            surges: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ms(n: u64) -> Nanos {
        Nanos::from_millis(n)
    }

    /// Operations as an agent would send them: beside an op cost above 1,
    /// at most the cost attempted.
    fn sent_ops(op_cost: u32, ops: u32, attempted: u64) -> u32 {
        if op_cost > 1 {
            u64::from(ops).min(attempted) as u32
        } else {
            0
        }
    }

    prop_compose! {
        fn rollup()(
            agent_id in "[a-z0-9-]{0,12}",
            start in 1u64..1u64 << 44, span in 0u64..60_000, ring_version: u64,
            incarnation: u64, sequence: u64, dictionary: u32,
            ops in proptest::collection::vec(
                ("[a-z/]{1,8}", proptest::collection::vec(
                    ("[a-z]{1,8}", any::<u64>(), any::<u64>(), proptest::option::of(1u64..1 << 44), any::<u32>(), any::<u32>(), any::<u32>()),
                    0..4),
                 // An op cost of 1 goes as 0 (not known): nothing to
                 // learn from it, and an op of such entries sends no list.
                 proptest::collection::btree_map(1u32.., (any::<u64>(), any::<u64>(), prop_oneof![Just(0u32), 2u32..], any::<u32>()), 0..6)),
                0..4),
        ) -> Rollup {
            Rollup {
                agent_id, start: ms(start), end: ms(start + span), ring_version, incarnation, sequence,
                ops: ops.into_iter().map(|(op, accounts, by_id)| OpCounts {
                    op,
                    // Operations only beside an op cost above 1, and at
                    // most the cost attempted: as an agent sends them.
                    accounts: accounts.into_iter().map(|(account, attempted, admitted, since, id, op_cost, ops)| AccountCounts {
                        account, attempted, admitted, since: since.map(ms), id, op_cost, at: 0,
                        ops: sent_ops(op_cost, ops, attempted),
                    }).collect(),
                    // Sorted and distinct, admitted at most attempted: as
                    // an agent sends them.
                    by_id: by_id.into_iter().map(|(id, (a, b, op_cost, ops))| IdCounts {
                        id, attempted: a.max(b), admitted: a.min(b), op_cost,
                        ops: sent_ops(op_cost, ops, a.max(b)),
                    }).collect(),
                }).collect(),
                dictionary,
            }
        }
    }

    prop_compose! {
        fn reply()(
            ops in proptest::collection::vec(
                ("[a-z]{1,8}", proptest::collection::vec(
                    ("[a-z]{1,8}", 0.0f64..=1.0, 0.5f64..1e9, 1u32.., any::<bool>(), any::<bool>(), 0.0f32..1e3), 0..4),
                 proptest::option::of((0.5f64..1e9, 1u32.., any::<bool>())),
                 proptest::collection::vec(("[a-z]{1,8}(/[a-z]{1,4})?", 0.5f64..1e9, any::<bool>()), 0..3)),
                0..4),
            interval in proptest::option::of(1u32..), recheck in proptest::option::of(1u32..),
            started in proptest::option::of(1u64..1 << 44), ring_version: u64, foreign_entries: u32,
            takes_ids: bool, takes_hints: bool,
            polls in proptest::collection::vec(("[a-z]{1,8}", proptest::collection::vec("[a-z]{1,8}", 0..3)), 0..3),
        ) -> Reply {
            let d = |ms: u32| Duration::from_millis(u64::from(ms));
            Reply {
                ops: ops.into_iter().map(|(op, listed, unlisted, overrides)| OpVerdicts {
                    op,
                    listed: listed.into_iter().map(|(account, factor, limit, valid, recheck, shadow, utilisation)| Listed {
                        account, factor: Factor { factor, limit, valid_for: d(valid), shadow, utilisation }, recheck,
                    }).collect(),
                    unlisted: unlisted.map(|(limit, valid, shadow)| Unlisted { limit, valid_for: d(valid), shadow }),
                    overrides: overrides.into_iter().map(|(account, limit, shadow)| Override { account, limit, shadow }).collect(),
                }).collect(),
                rollup_interval: interval.map(d), recheck_after: recheck.map(d),
                started: started.map(ms), ring_version, foreign_entries, takes_ids, takes_hints,
                polls: polls.into_iter().map(|(op, accounts)| OpAccounts { op, accounts, surges: Vec::new() }).collect(),
            }
        }
    }

    /// `OpCounts` and `AccountCounts` as masters before op costs knew
    /// them: fields 1 to 5.
    mod before_op_costs {
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct OpCounts {
            #[prost(string, tag = "1")]
            pub op: String,
            #[prost(message, repeated, tag = "2")]
            pub accounts: Vec<AccountCounts>,
            #[prost(uint32, repeated, tag = "3")]
            pub ids: Vec<u32>,
            #[prost(uint64, repeated, tag = "4")]
            pub attempted: Vec<u64>,
            #[prost(uint64, repeated, tag = "5")]
            pub rejected: Vec<u64>,
        }

        #[derive(Clone, PartialEq, prost::Message)]
        pub struct AccountCounts {
            #[prost(string, tag = "1")]
            pub account: String,
            #[prost(uint64, tag = "2")]
            pub attempted: u64,
            #[prost(uint64, tag = "3")]
            pub admitted: u64,
            #[prost(uint64, tag = "4")]
            pub start_unix_ms: u64,
            #[prost(uint32, tag = "5")]
            pub id: u32,
        }
    }

    /// An op's costs go only where some entry's operations cost more than
    /// 1, one per entry; a master that predates them reads the rest of the
    /// entry unchanged, and an agent that predates them sends none (every
    /// op cost 0: not known).
    #[test]
    fn op_costs_are_sent_only_for_costly_ops_and_old_masters_skip_them() {
        use prost::Message;
        let entry = |id, op_cost| IdCounts {
            id,
            attempted: 2_004,
            admitted: 1_001,
            op_cost,
            ops: 0,
        };
        let named = AccountCounts {
            account: "fanout".into(),
            attempted: 3_007,
            admitted: 3_007,
            op_cost: 1_003,
            ..AccountCounts::default()
        };
        let op = |by_id| OpCounts {
            op: "messages".into(),
            accounts: vec![named.clone()],
            by_id,
        };
        let costly = op_counts(op(vec![entry(3, 1_003), entry(9, 0)]));
        assert_eq!(costly.op_costs, [1_003, 0]);
        let cheap = op_counts(op(vec![entry(3, 1), entry(9, 0)]));
        assert!(cheap.op_costs.is_empty(), "{cheap:?}");
        let old = before_op_costs::OpCounts::decode(costly.encode_to_vec().as_slice()).unwrap();
        assert_eq!(
            (old.ids, old.attempted, old.rejected),
            (vec![3, 6], vec![2_004; 2], vec![1_003; 2])
        );
        assert_eq!(
            (
                old.accounts[0].account.as_str(),
                old.accounts[0].attempted,
                old.accounts[0].admitted
            ),
            ("fanout", 3_007, 3_007)
        );
        let from_old_agent = before_op_costs::OpCounts {
            op: "messages".into(),
            accounts: vec![before_op_costs::AccountCounts {
                account: "fanout".into(),
                attempted: 3_007,
                admitted: 3_007,
                ..Default::default()
            }],
            ids: vec![3],
            attempted: vec![2_004],
            rejected: vec![0],
        };
        let new = v1::OpCounts::decode(from_old_agent.encode_to_vec().as_slice()).unwrap();
        assert!(
            new.op_costs.is_empty() && new.accounts[0].op_cost == 0,
            "{new:?}"
        );
        assert_eq!(by_id(&new)[0].op_cost, 0);
    }

    /// Op costs of another length than the entries by number are refused,
    /// naming the field.
    #[test]
    fn op_costs_of_another_length_are_named() {
        let mut request = v1::RollupRequest::from(Rollup {
            ops: vec![OpCounts {
                op: "messages".into(),
                accounts: Vec::new(),
                by_id: vec![IdCounts {
                    id: 1,
                    attempted: 51,
                    admitted: 51,
                    op_cost: 51,
                    ops: 0,
                }],
            }],
            ..Rollup::default()
        });
        assert_eq!(id_lists_error(&request), None);
        request.ops[0].op_costs.push(51);
        let error = id_lists_error(&request).expect("refused");
        assert!(error.contains("op_costs (2)"), "{error}");
    }

    #[test]
    fn op_counts_go_beside_op_costs_and_bad_ones_are_named() {
        use prost::Message;
        let entry = |id, op_cost, ops| IdCounts {
            id,
            attempted: 102,
            admitted: 102,
            op_cost,
            ops,
        };
        let rollup = |by_id| Rollup {
            ops: vec![OpCounts {
                op: "messages".into(),
                accounts: vec![AccountCounts {
                    account: "acme".into(),
                    attempted: 153,
                    admitted: 153,
                    op_cost: 51,
                    ops: 3,
                    ..AccountCounts::default()
                }],
                by_id,
            }],
            ..Rollup::default()
        };
        // Sent only beside an op cost above 1, where they say more.
        let request = v1::RollupRequest::from(rollup(vec![entry(1, 51, 2), entry(2, 0, 102)]));
        assert_eq!(request.ops[0].op_counts, [2, 0]);
        assert_eq!(request.ops[0].accounts[0].ops, 3);
        assert_eq!(id_lists_error(&request), None);
        let back = Rollup::from(request.clone());
        assert_eq!(back.ops[0].by_id[0].ops, 2);
        assert_eq!(back.ops[0].accounts[0].ops, 3);
        // Masters that predate them read the rest as before.
        let old =
            before_op_costs::OpCounts::decode(request.ops[0].encode_to_vec().as_slice()).unwrap();
        assert_eq!(old.ids, request.ops[0].ids);
        let cheap = v1::RollupRequest::from(rollup(vec![entry(1, 0, 102)]));
        assert!(cheap.ops[0].op_counts.is_empty());
        let mut bad = request.clone();
        bad.ops[0].op_counts.push(1);
        let error = id_lists_error(&bad).expect("refused");
        assert!(error.contains("op_counts (3)"), "{error}");
        let mut bad = request;
        bad.ops[0].op_counts[1] = 103;
        let error = id_lists_error(&bad).expect("refused");
        assert!(
            error.contains("ops[0].op_counts[1] (103) is above ops[0].attempted[1] (102)"),
            "{error}"
        );
    }

    proptest! {
        /// Every core message goes onto the wire and back unchanged.
        #[test]
        fn core_messages_survive_the_wire(rollup in rollup(), reply in reply()) {
            use prost::Message;
            let request = v1::RollupRequest::from(rollup.clone());
            prop_assert_eq!(id_lists_error(&request), None);
            let bytes = request.encode_to_vec();
            let back = Rollup::from(v1::RollupRequest::decode(bytes.as_slice()).unwrap());
            prop_assert_eq!(back, rollup.clone());
            let bytes = v1::RollupReply::from(reply.clone()).encode_to_vec();
            let back = Reply::from(v1::RollupReply::decode(bytes.as_slice()).unwrap());
            prop_assert_eq!(back, reply);
            let pairs = rollup.ops.iter()
                .flat_map(|o| o.accounts.iter().map(move |a| damper_core::Pair::new(&a.account, &o.op)));
            let query = FactorsQuery::new(&rollup.agent_id, pairs.clone());
            let back = FactorsQuery::from(v1::FactorsRequest::from(query.clone()));
            prop_assert_eq!(back, query);
            let surges = pairs.enumerate().map(|(i, p)| {
                let (hint, ops) = (i % 4 == 1, (i % 5) as u32);
                let surged = i % 2 == 0;
                let rollup_baseline = surged.then_some(i as f32 * 0.5);
                let span = (ops > 0).then(|| Duration::from_micros(100_000 + i as u64));
                (p, SurgeRates { rate: i as f32 * 1.5, baseline: i as f32, surged, joined: i % 3 == 0, hint, ops, rollup_baseline, span })
            });
            let query = FactorsQuery::surge(&rollup.agent_id, ms(1 << 40), surges);
            let request = v1::FactorsRequest::from(query.clone());
            prop_assert_eq!(surge_lists_error(&request), None);
            prop_assert_eq!(FactorsQuery::from(request), query);
        }
    }
}
