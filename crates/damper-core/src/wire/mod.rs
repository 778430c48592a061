//! The messages agents and masters exchange, as core types, and every rule
//! about what they carry, in both directions.
//!
//! An agent's [`AgentRound`](crate::round::AgentRound) sends a [`Rollup`]
//! (or a [`FactorsQuery`]) and applies the [`Reply`]; a master validates
//! the rollup ([`Rollup::validate`]), ingests it and answers with a reply
//! that lists only the verdicts that differ from their op's default
//! ([`ReplyBuilder`], compaction), which the agent expands back into one
//! verdict per pair it reported ([`Reply::expand`]). Both halves of that
//! rule live here, so they cannot drift apart; a property test holds them
//! to it.
//!
//! `damper_proto::convert` maps each type one to one onto its `damper.v1`
//! protobuf message (milliseconds on the wire, so times here are whole
//! milliseconds too); the simulator passes these types as they are.
//!
//! # Layout
//! - this file: the message types.
//! - `validate`: names, counts and intervals ([`validate_name`],
//!   [`Report::validate`], [`Rollup::validate`]) and their errors.
//! - `compact`: the reply's compaction ([`ReplyBuilder`]) and expansion
//!   ([`Reply::expand`]).
//! - [`dictionary`]: account names sent once per agent and master, then
//!   by number ([`dictionary::AgentDictionary`], [`dictionary::Dictionaries`]).
//! - `answer`: one [`MasterState`](crate::master::MasterState) answering a
//!   rollup or a query (the simulator's master; the service shards the
//!   same steps).

mod answer;
mod compact;
pub mod dictionary;
mod validate;

use std::time::Duration;

use crate::Pair;
use crate::agent::Pending;
use crate::time::Nanos;

pub use answer::query_reply;
pub use compact::{ReplyBuilder, ReplyHeader};
pub use validate::{
    MAX_CLOCK_AHEAD, MAX_REPORT_SPAN, Report, ReportError, RollupError, Validated, validate_name,
};

/// One agent's counts for the accounts one master owns, over an interval
/// (`RollupRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rollup {
    /// The sending agent, for logs and, with `incarnation` and `sequence`,
    /// de-duplication.
    pub agent_id: String,
    /// Start of the interval the counts cover (whole milliseconds).
    pub start: Nanos,
    /// End (exclusive) of the interval, on the shared rollup grid.
    pub end: Nanos,
    /// Digest of the ring the agent routed by (0: unknown), so a master can
    /// tell the agent's view differs from its own.
    pub ring_version: u64,
    /// When the sending agent started (milliseconds since the epoch): one
    /// run of one agent.
    pub incarnation: u64,
    /// This rollup's number in the incarnation, from 1; a resend carries
    /// the same one, and is counted once ([`RollupLog`](crate::master::RollupLog)).
    /// 0: not numbered.
    pub sequence: u64,
    /// The counts, grouped by op so each op name is carried once.
    pub ops: Vec<OpCounts>,
    /// The epoch of the sender's [`dictionary`] for this master when some
    /// accounts go by number; 0 when every account is named.
    pub dictionary: dictionary::Epoch,
}

/// One op's counts in a [`Rollup`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// The op.
    pub op: String,
    /// One entry per account with activity (or just gone quiet).
    pub accounts: Vec<AccountCounts>,
    /// Entries whose account goes by its number in the sender's
    /// [`dictionary`], sorted by number. Empty once a master has expanded
    /// the rollup ([`dictionary::Dictionaries::expand`]), and in every
    /// rollup the agent's round keeps: only what goes on the wire has them.
    pub by_id: Vec<IdCounts>,
}

/// One account's counts in a [`Rollup`], the account given by its number
/// in the sender's [`dictionary`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdCounts {
    /// The account's number.
    pub id: u32,
    /// As [`AccountCounts::attempted`].
    pub attempted: u64,
    /// As [`AccountCounts::admitted`].
    pub admitted: u64,
    /// As [`AccountCounts::op_cost`].
    pub op_cost: u32,
    /// As [`AccountCounts::ops`].
    pub ops: u32,
}

/// One account's counts in a [`Rollup`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccountCounts {
    /// The account.
    pub account: String,
    /// Cost attempted: admitted plus what the rejected operations would
    /// have cost.
    pub attempted: u64,
    /// Cost admitted; at most `attempted`.
    pub admitted: u64,
    /// What one operation costs, as the agent's scans tell it; 0 when not
    /// known (see [`Report::op_cost`]).
    pub op_cost: u32,
    /// How many operations `attempted` counts; 0 when not known (see
    /// [`Report::ops`]).
    pub ops: u32,
    /// The start of these counts when it is not the rollup's: counts
    /// carried over from a failed rollup.
    pub since: Option<Nanos>,
    /// When not 0, the account's number in the sender's [`dictionary`]
    /// (the rollup's `dictionary` epoch): later rollups may give the
    /// account by this number alone.
    pub id: u32,
    /// The agent's own: where the pair was in its table when drained (its
    /// position plus one; 0 for unknown), so the reply's verdict finds it
    /// there first ([`AgentState::apply_reply_at`]). Never sent.
    ///
    /// [`AgentState::apply_reply_at`]: crate::agent::AgentState::apply_reply_at
    pub at: u32,
}

/// The (account, op) pairs whose factors an agent asks for without
/// reporting counts (`FactorsRequest`): a recheck; naming nothing, a probe
/// of a master that is down (or a new agent's hello); with `surge_at`, an
/// early report of surges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FactorsQuery {
    /// The asking agent.
    pub agent_id: String,
    /// The pairs, grouped by op.
    pub ops: Vec<OpAccounts>,
    /// For an early report: the end of the sub-window its rates were
    /// measured over (whole milliseconds). Every op then carries one
    /// [`SurgeRates`] per account.
    pub surge_at: Option<Nanos>,
}

/// One op's accounts in a [`FactorsQuery`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpAccounts {
    /// The op.
    pub op: String,
    /// Its accounts.
    pub accounts: Vec<String>,
    /// In an early report, each account's surge, in the same order; empty
    /// otherwise.
    pub surges: Vec<SurgeRates>,
}

/// One pair's surge, as an early report carries it: this agent's attempted
/// rate over the last sub-window, and the rate it last told the master.
/// The master moves its estimate of the account by the difference.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SurgeRates {
    /// Attempted cost per second over the sub-window.
    pub rate: f32,
    /// What the master holds for this agent: the rate of its last early
    /// report of the pair (`surged`), or of its last rollup.
    pub baseline: f32,
    /// Whether `baseline` is an early report's, still in the master's
    /// surge estimate, rather than a rollup's.
    pub surged: bool,
    /// A *join*: the pair has just moved to this master (a master came
    /// back on, or went off, this agent's ring between two cuts), and
    /// `rate` is what the agent last told the pair's previous master. The
    /// master has none of it yet, so it adds to the account's estimate in
    /// full rather than as a change (`baseline` is 0). Masters that predate
    /// joins read it as a jump from nothing, which the agents that saw it
    /// prove: right for an account new to them, and never above what
    /// they already had otherwise.
    pub joined: bool,
    /// A *sparse hint*: a pair of sparse costly operations saw more of
    /// them over its last few hundred milliseconds than its rate explains,
    /// but too few for any one agent to call a surge (see
    /// `damper_core::agent::hint`). `rate` is that span's rate, for logs;
    /// the master does not move its estimate by it, but counts the agents
    /// that hint at once and, when they are more than chance, polls every
    /// agent for the pair ([`Reply::polls`]). Sent only to masters that
    /// say they take hints ([`Reply::takes_hints`]).
    pub hint: bool,
    /// How many operations `rate` was measured over, when the agent knows
    /// what one costs (0: not known, not counted, or a fall): a sparse
    /// hint's evidence, a poll's answer's and a rise's, whose Poisson noise
    /// (`1 / √ops`) the master weighs before it suppresses on a few dozen
    /// operations summed over many agents, or on a jump two agents read
    /// high by chance over their first peeks.
    pub ops: u32,
    /// For a follow-up (`surged`): the rate of the agent's last rollup of
    /// the pair (`None`: not said, by agents that predate it, and for any
    /// other report, whose `baseline` it is). The
    /// master's surge estimate may have given way to a fresh one since
    /// the agent's last early report, and the fresh one never held that
    /// report's rate: there the follow-up is the agent's first report,
    /// against this. Taken as a change from `baseline` instead, a fall
    /// from a chance lump that the fresh estimate never held took the lump
    /// off the rounds, and released an account at twice its limit.
    pub rollup_baseline: Option<f32>,
    /// For a rise that counted its operations (`ops`): how long `rate` was
    /// measured over, to the microsecond, ending with the report's
    /// sub-window (`None`: not said, by agents that predate it, and for
    /// any other report). Lumps that agents saw one after another were
    /// not there at once: the master weighs the count of a rise summed
    /// from several reports against the time they span together, not as
    /// if each agent's rate had held over the same sub-window (three
    /// publishes to 4 000 subscribers on three agents, over 400 ms in all,
    /// each read over its own 200, proved 20× the limit of an account at
    /// 0.95× of it).
    pub span: Option<Duration>,
}

impl SurgeRates {
    /// The report with its span said, to the microsecond as the wire
    /// carries it (so the simulator's master reads what a service's does),
    /// when it counted its operations; a report that counted none says no
    /// span ([`span`](Self::span)).
    pub fn with_span(self, span: Duration) -> SurgeRates {
        if self.ops == 0 {
            return self;
        }
        SurgeRates {
            span: Some(Duration::from_micros(u64::from(micros_u32(span)))),
            ..self
        }
    }
}

/// A master's answer to a [`Rollup`] or a [`FactorsQuery`] (`RollupReply`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reply {
    /// Per op: the verdicts listed one by one, and the one implied for the
    /// rest. An op with neither has no limit, and is left out.
    pub ops: Vec<OpVerdicts>,
    /// The master's rollup interval (`None`: not said), so an agent can
    /// warn that its own differs.
    pub rollup_interval: Option<Duration>,
    /// Ask again, for the pairs marked `recheck`, this long after the
    /// reply: they come from a round other agents are still reporting, or
    /// from a fall early reports are still bringing. The soonest any of
    /// them asks for; a pair asked too early is told again when.
    pub recheck_after: Option<Duration>,
    /// When the master process started (`None`: not said); agents rejoin a
    /// master that was down relative to it.
    pub started: Option<Nanos>,
    /// Digest of the master's view of the ring (0: none configured).
    pub ring_version: u64,
    /// Entries of the rollup for accounts the master does not own under its
    /// view of the ring: the agent's view differs.
    pub foreign_entries: u32,
    /// Whether the master holds a [`dictionary`] for the sender (or has
    /// room for one): its next rollups may give accounts by number.
    pub takes_ids: bool,
    /// Whether the master takes sparse hints ([`SurgeRates::hint`]): one
    /// that predates them would read a hint as an early report of a jump.
    pub takes_hints: bool,
    /// In a push: pairs whose master asks every agent that holds them for
    /// their rate now (an early report), because several agents hinted at
    /// once that their sparse traffic rose. Grouped by op; no surges.
    /// Empty in every reply to a request.
    pub polls: Vec<OpAccounts>,
}

/// One op's verdicts in a [`Reply`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpVerdicts {
    /// The op.
    pub op: String,
    /// The pairs whose verdict is not the op's default.
    pub listed: Vec<Listed>,
    /// The verdict of every account of this op the request named and
    /// `listed` leaves out: factor 0 under the op's own limit. `None` when
    /// the op has no limit of its own: unlisted accounts are unlimited.
    pub unlisted: Option<Unlisted>,
    /// In a reply to a query naming nothing (a new agent's hello, a
    /// probe): the accounts whose limit is not the op's default, so the
    /// agent's local guard applies theirs before any master has answered
    /// for them. Empty in every other reply, and when there are more than
    /// [`HELLO_OVERRIDES_MAX`].
    pub overrides: Vec<Override>,
}

/// At most this many [`Override`]s go in a hello's reply, over all ops;
/// a config with more sends none (agents then guard new pairs under their
/// op's default until a master answers for them, as before overrides were
/// sent). 10 000 overrides are about 300 kB, once per agent start.
pub const HELLO_OVERRIDES_MAX: usize = 10_000;

/// An account, and every account under it (at `/` boundaries, as limit
/// keys match), whose limit is not its op's default: a `[limits]` key
/// `op/account`, or an `[exempt]` entry (no limit at all).
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    /// The account path.
    pub account: String,
    /// Its limit, cost per second; `f64::MAX` for an exempt account, as a
    /// verdict says (`Rate::UNLIMITED`).
    pub limit: f64,
    /// Whether the limit is in shadow.
    pub shadow: bool,
}

/// One account's verdict, listed in a [`Reply`].
#[derive(Clone, Debug, PartialEq)]
pub struct Listed {
    /// The account.
    pub account: String,
    /// What the agent applies.
    pub factor: Factor,
    /// Ask again after the reply's `recheck_after`.
    pub recheck: bool,
}

/// What an agent applies to one (account, op): reject with probability
/// `factor` for `valid_for`, under an account-wide `limit`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Factor {
    /// Probability of rejecting each operation, 0 to 1.
    pub factor: f64,
    /// The account-wide limit, in cost per second (the local guard's).
    pub limit: f64,
    /// How long it holds without a fresher one (whole milliseconds).
    pub valid_for: Duration,
    /// Whether the limit is in shadow: admit what `factor` would refuse,
    /// and say so.
    pub shadow: bool,
    /// The account's demand over its limit as the master estimates it,
    /// for pairs at or above the near share of their limit; 0 when not
    /// said.
    pub utilisation: f32,
}

/// The verdict a reply implies for the accounts of an op it does not list.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Unlisted {
    /// The op's own limit, in cost per second.
    pub limit: f64,
    /// How long their factor 0 holds (whole milliseconds).
    pub valid_for: Duration,
    /// Whether the op's own limit is in shadow.
    pub shadow: bool,
}

/// Groups `(op, item)` pairs that come grouped by op (sorted, or as a
/// reply listed them): one entry per op, so each op name goes on the wire
/// once.
fn group_by_op<O: PartialEq, T>(items: impl IntoIterator<Item = (O, T)>) -> Vec<(O, Vec<T>)> {
    let mut groups: Vec<(O, Vec<T>)> = Vec::new();
    for (op, item) in items {
        match groups.last_mut() {
            Some((last, group)) if *last == op => group.push(item),
            _ => groups.push((op, vec![item])),
        }
    }
    groups
}

/// A time as the wire carries it: whole milliseconds.
pub(crate) fn whole_millis(t: Nanos) -> Nanos {
    Nanos::from_millis(t.as_millis())
}

/// A duration as the wire carries it: whole milliseconds that fit a `u32`.
pub fn millis_u32(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// A duration as the wire carries a span: whole microseconds that fit a
/// `u32` (71 minutes; a master reads no more than a round).
pub fn micros_u32(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

impl Rollup {
    /// Whether its reply says if the master takes sparse hints
    /// ([`Reply::takes_hints`]): a rollup sent without a dictionary names
    /// every account (an agent's first to a master, or after it lost the
    /// dictionary), and only such replies carry the flag, two bytes that
    /// every steady round's would pay otherwise. An agent reads a reply
    /// to such a rollup that does not say so as "takes none".
    pub fn tells_hints(&self) -> bool {
        self.dictionary == 0
    }

    /// The rollup that reports `pending` (a drain's counts for one master,
    /// sorted by op) for `[start, end)`: counts grouped by op, each with its
    /// own start when it was carried over. Times are cut to whole
    /// milliseconds, as the wire carries them.
    pub fn from_pending(
        agent_id: &str,
        start: Nanos,
        end: Nanos,
        ring_version: u64,
        pending: &[Pending],
    ) -> Rollup {
        Rollup::from_drain(agent_id, start, end, ring_version, pending.to_vec())
    }

    /// [`from_pending`](Self::from_pending), moving the names out of
    /// `pending` rather than copying them.
    pub fn from_drain(
        agent_id: &str,
        start: Nanos,
        end: Nanos,
        ring_version: u64,
        pending: Vec<Pending>,
    ) -> Rollup {
        let counts = pending.into_iter().map(|p| {
            let counts = AccountCounts {
                account: p.account,
                attempted: p.delta.attempted,
                admitted: p.delta.admitted,
                since: p.delta.since.map(whole_millis),
                op_cost: p.delta.op_cost,
                ops: p.delta.ops,
                id: 0,
                at: p.at,
            };
            (p.op, counts)
        });
        let ops = group_by_op(counts)
            .into_iter()
            .map(|(op, accounts)| OpCounts {
                op: op.to_string(),
                accounts,
                by_id: Vec::new(),
            })
            .collect();
        Rollup {
            agent_id: agent_id.to_owned(),
            start: whole_millis(start),
            end: whole_millis(end),
            ring_version,
            incarnation: 0,
            sequence: 0,
            ops,
            dictionary: 0,
        }
    }

    /// This rollup's header (who, when, which ring and number) with no
    /// counts.
    pub fn without_ops(&self) -> Rollup {
        Rollup {
            agent_id: self.agent_id.clone(),
            start: self.start,
            end: self.end,
            ring_version: self.ring_version,
            incarnation: self.incarnation,
            sequence: self.sequence,
            ops: Vec::new(),
            dictionary: self.dictionary,
        }
    }

    /// A query for the verdicts of this rollup's pairs, counting nothing:
    /// how a master answers a rollup it has already counted.
    pub fn as_query(&self) -> FactorsQuery {
        FactorsQuery {
            agent_id: self.agent_id.clone(),
            ops: self
                .ops
                .iter()
                .map(|op| OpAccounts {
                    op: op.op.clone(),
                    accounts: op.accounts.iter().map(|c| c.account.clone()).collect(),
                    surges: Vec::new(),
                })
                .collect(),
            surge_at: None,
        }
    }

    /// Number of (account, op) entries, named or by number.
    pub fn entries(&self) -> usize {
        self.ops
            .iter()
            .map(|op| op.accounts.len() + op.by_id.len())
            .sum()
    }

    /// The attempted cost of every entry, summed (saturating).
    pub fn attempted(&self) -> u64 {
        let named = self.ops.iter().flat_map(|op| &op.accounts);
        let numbered = self.ops.iter().flat_map(|op| &op.by_id);
        named
            .map(|c| c.attempted)
            .chain(numbered.map(|c| c.attempted))
            .fold(0u64, u64::saturating_add)
    }

    /// The (account, op) of every named entry (every entry, in a rollup
    /// the agent's round keeps or a master has expanded).
    pub fn pairs(&self) -> impl Iterator<Item = Pair<'_>> {
        self.pairs_at().map(|(pair, _)| pair)
    }

    /// [`pairs`](Self::pairs), each with where it was in the agent's table
    /// ([`AccountCounts::at`]).
    pub fn pairs_at(&self) -> impl Iterator<Item = (Pair<'_>, u32)> {
        self.ops.iter().flat_map(|op| {
            op.accounts
                .iter()
                .map(move |c| (Pair::new(&c.account, &op.op), c.at))
        })
    }

    /// The entries as an agent's drained counts again: what a failed
    /// rollup puts back.
    pub fn pending(&self) -> Vec<Pending> {
        self.ops
            .iter()
            .flat_map(|op| {
                let name: std::sync::Arc<str> = op.op.as_str().into();
                op.accounts.iter().map(move |c| Pending {
                    at: c.at,
                    account: c.account.clone(),
                    op: name.clone(),
                    delta: crate::agent::Delta {
                        attempted: c.attempted,
                        admitted: c.admitted,
                        since: c.since,
                        op_cost: c.op_cost,
                        ops: c.ops,
                    },
                })
            })
            .collect()
    }

    /// Every entry as the master ingests it, with its op's and its own
    /// index: an entry's own start, when it has one, overrides the
    /// rollup's.
    pub fn reports(&self) -> impl Iterator<Item = (usize, usize, Report<'_>)> {
        self.ops
            .iter()
            .enumerate()
            .flat_map(move |(i, op)| (0..op.accounts.len()).map(move |j| (i, j, self.report(i, j))))
    }

    /// Entry `j` of op `i` as the master ingests it.
    pub fn report(&self, i: usize, j: usize) -> Report<'_> {
        let op = &self.ops[i];
        let counts = &op.accounts[j];
        Report {
            account: &counts.account,
            op: &op.op,
            start: counts.since.unwrap_or(self.start),
            end: self.end,
            attempted: counts.attempted,
            admitted: counts.admitted,
            op_cost: counts.op_cost,
            ops: counts.ops,
        }
    }
}

impl FactorsQuery {
    /// Whether its reply says if the master takes sparse hints
    /// ([`Reply::takes_hints`]): a query naming nothing (a new agent's
    /// hello, a probe of a master that was down) is how an agent learns
    /// it; a recheck's or an early report's reply does not say.
    pub fn tells_hints(&self) -> bool {
        self.ops.is_empty()
    }

    /// The query for `pairs` (grouped by op: sorted, or as a reply
    /// listed them).
    pub fn new<'a>(agent_id: &str, pairs: impl IntoIterator<Item = Pair<'a>>) -> Self {
        let accounts = pairs
            .into_iter()
            .map(|Pair { account, op }| (op.to_owned(), account.to_owned()));
        let ops = group_by_op(accounts)
            .into_iter()
            .map(|(op, accounts)| OpAccounts {
                op,
                accounts,
                surges: Vec::new(),
            })
            .collect();
        FactorsQuery {
            agent_id: agent_id.to_owned(),
            ops,
            surge_at: None,
        }
    }

    /// The early report of `surges` (grouped by op) measured over the
    /// sub-window that ends at `at`.
    pub fn surge<'a>(
        agent_id: &str,
        at: Nanos,
        surges: impl IntoIterator<Item = (Pair<'a>, SurgeRates)>,
    ) -> Self {
        let entries = surges
            .into_iter()
            .map(|(Pair { account, op }, rates)| (op.to_owned(), (account.to_owned(), rates)));
        let ops = group_by_op(entries)
            .into_iter()
            .map(|(op, entries)| {
                let (accounts, surges) = entries.into_iter().unzip();
                OpAccounts {
                    op,
                    accounts,
                    surges,
                }
            })
            .collect();
        FactorsQuery {
            agent_id: agent_id.to_owned(),
            ops,
            surge_at: Some(whole_millis(at)),
        }
    }

    /// Every surge an early report carries, with its pair (none for
    /// other queries).
    pub fn surges(&self) -> impl Iterator<Item = (Pair<'_>, SurgeRates)> {
        self.ops.iter().flat_map(|op| {
            op.accounts
                .iter()
                .zip(&op.surges)
                .map(move |(a, s)| (Pair::new(a, &op.op), *s))
        })
    }

    /// Number of (account, op) pairs asked for.
    pub fn entries(&self) -> usize {
        self.ops.iter().map(|op| op.accounts.len()).sum()
    }

    /// Every pair asked for.
    pub fn pairs(&self) -> impl Iterator<Item = Pair<'_>> {
        self.ops
            .iter()
            .flat_map(|op| op.accounts.iter().map(move |a| Pair::new(a, &op.op)))
    }
}

#[cfg(test)]
mod tests;
