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
    Override, Reply, Rollup, SurgeRates, Unlisted, millis_u32,
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
            ops: r
                .ops
                .into_iter()
                .map(|op| {
                    let (ids, attempted, rejected) = by_id_lists(&op.by_id);
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
                            })
                            .collect(),
                        ids,
                        attempted,
                        rejected,
                    }
                })
                .collect(),
            ring_version: r.ring_version,
            dictionary: r.dictionary,
        }
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
        .map(|((&delta, &attempted), &rejected)| {
            id = id.wrapping_add(delta);
            IdCounts {
                id,
                attempted,
                admitted: attempted.saturating_sub(rejected),
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

/// An op's surges from the three parallel lists. Lists of unequal length
/// are a malformed request, which [`surge_lists_error`] names; converted
/// anyway, they come out as long as `rates`, the missing values 0 or
/// `false`.
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
        })
        .collect()
}

/// Why an early report's parallel lists do not line up, naming the field;
/// `None` when every op's `rates`, `baselines` and `surged` are as long as
/// its `accounts` (or all empty), and `joined`, `hints` and `ops` each as
/// long or empty (and empty when the rest are).
pub fn surge_lists_error(request: &v1::FactorsRequest) -> Option<String> {
    request.ops.iter().enumerate().find_map(|(i, op)| {
        let n = op.accounts.len();
        let lens = [op.rates.len(), op.baselines.len(), op.surged.len()];
        let optional = [
            ("joined", op.joined.len()),
            ("hints", op.hints.len()),
            ("ops", op.ops.len()),
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

    prop_compose! {
        fn rollup()(
            agent_id in "[a-z0-9-]{0,12}",
            start in 1u64..1u64 << 44, span in 0u64..60_000, ring_version: u64,
            incarnation: u64, sequence: u64, dictionary: u32,
            ops in proptest::collection::vec(
                ("[a-z/]{1,8}", proptest::collection::vec(
                    ("[a-z]{1,8}", any::<u64>(), any::<u64>(), proptest::option::of(1u64..1 << 44), any::<u32>()),
                    0..4),
                 proptest::collection::btree_map(1u32.., (any::<u64>(), any::<u64>()), 0..6)),
                0..4),
        ) -> Rollup {
            Rollup {
                agent_id, start: ms(start), end: ms(start + span), ring_version, incarnation, sequence,
                ops: ops.into_iter().map(|(op, accounts, by_id)| OpCounts {
                    op,
                    accounts: accounts.into_iter().map(|(account, attempted, admitted, since, id)| AccountCounts {
                        account, attempted, admitted, since: since.map(ms), id, at: 0,
                    }).collect(),
                    // Sorted and distinct, admitted at most attempted: as
                    // an agent sends them.
                    by_id: by_id.into_iter().map(|(id, (a, b))| IdCounts {
                        id, attempted: a.max(b), admitted: a.min(b),
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
                (p, SurgeRates { rate: i as f32 * 1.5, baseline: i as f32, surged: i % 2 == 0, joined: i % 3 == 0, hint, ops })
            });
            let query = FactorsQuery::surge(&rollup.agent_id, ms(1 << 40), surges);
            let request = v1::FactorsRequest::from(query.clone());
            prop_assert_eq!(surge_lists_error(&request), None);
            prop_assert_eq!(FactorsQuery::from(request), query);
        }
    }
}
