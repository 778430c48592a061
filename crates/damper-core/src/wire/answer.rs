//! One [`MasterState`] answering an agent: the master's side of a round,
//! in one piece, for a master that is a single shard (the simulator's).
//! The master service runs the same steps over its shards: validate the
//! whole request, ingest each entry, compact the verdicts.

use crate::Pair;
use crate::config::MasterConfig;
use crate::master::{MasterState, SurgeBudget, SurgeTaken};
use crate::time::Nanos;

use super::dictionary::Expansion;
use super::{FactorsQuery, Reply, ReplyBuilder, ReplyHeader, Rollup, RollupError, Validated};

impl MasterState {
    /// Validates `rollup` as received at `now` (at most `max_entries`),
    /// ingests every entry, and answers with the compact reply. A refused
    /// rollup is not counted at all.
    pub fn answer_rollup(
        &mut self,
        now: Nanos,
        rollup: &Rollup,
        max_entries: usize,
        header: ReplyHeader,
    ) -> Result<Reply, RollupError> {
        self.answer_rollup_near(now, rollup, &mut Expansion::default(), max_entries, header)
    }

    /// [`answer_rollup`](Self::answer_rollup) of a rollup whose numbers
    /// a dictionary turned into names, with where their pairs were last
    /// found (`expanded`, [`Dictionaries::expand_found`]); notes there where
    /// they are now, for [`Dictionaries::learn`].
    ///
    /// [`Dictionaries::expand_found`]: super::dictionary::Dictionaries::expand_found
    /// [`Dictionaries::learn`]: super::dictionary::Dictionaries::learn
    pub fn answer_rollup_near(
        &mut self,
        now: Nanos,
        rollup: &Rollup,
        expanded: &mut Expansion,
        max_entries: usize,
        header: ReplyHeader,
    ) -> Result<Reply, RollupError> {
        let validated = rollup.validate(now, max_entries)?;
        Ok(self.answer_validated(validated, rollup, expanded, header))
    }

    /// [`answer_rollup_near`](Self::answer_rollup_near) of a rollup
    /// already validated.
    fn answer_validated(
        &mut self,
        validated: Validated,
        rollup: &Rollup,
        expanded: &mut Expansion,
        header: ReplyHeader,
    ) -> Reply {
        let mut reply = ReplyBuilder::new(self.config(), rollup.ops.iter().map(|o| o.op.as_str()));
        for (op, account, report) in rollup.reports() {
            let mut at = expanded.hint(op, account);
            let verdict = self.ingest_validated(validated, &report, &mut at);
            expanded.found(op, account, at);
            if let Some(v) = verdict {
                reply.add(op, || report.account.to_owned(), &v);
            }
        }
        reply.finish(validated.now(), header)
    }

    /// [`answer_rollup`](Self::answer_rollup), counting a numbered rollup
    /// once: a resend of one `log` has seen (its reply was lost) is answered
    /// with the verdicts in force for its pairs and counts nothing. Returns
    /// the reply and whether it was such a repeat.
    pub fn answer_rollup_once(
        &mut self,
        now: Nanos,
        rollup: &Rollup,
        log: &mut crate::master::RollupLog,
        max_entries: usize,
        header: ReplyHeader,
    ) -> Result<(Reply, bool), RollupError> {
        let mut expanded = Expansion::default();
        self.answer_rollup_once_near(now, rollup, &mut expanded, log, max_entries, header)
    }

    /// [`answer_rollup_once`](Self::answer_rollup_once) with where the
    /// pairs were last found, as [`answer_rollup_near`](Self::answer_rollup_near).
    pub fn answer_rollup_once_near(
        &mut self,
        now: Nanos,
        rollup: &Rollup,
        expanded: &mut Expansion,
        log: &mut crate::master::RollupLog,
        max_entries: usize,
        header: ReplyHeader,
    ) -> Result<(Reply, bool), RollupError> {
        let validated = rollup.validate(now, max_entries)?;
        if !log.first_time(now, &rollup.agent_id, rollup.incarnation, rollup.sequence) {
            let mut reply = self.answer_factors(now, &rollup.as_query(), max_entries, header)?;
            // Said as to any rollup (the agent reads it so).
            reply.takes_hints = header.takes_hints;
            return Ok((reply, true));
        }
        let reply = self.answer_validated(validated, rollup, expanded, header);
        Ok((reply, false))
    }

    /// The verdicts in force at `now` for the pairs `query` names, counting
    /// nothing, as a compact reply. A query naming nothing (a probe, or a
    /// new agent's hello) is told every op's default limit.
    pub fn answer_factors(
        &self,
        now: Nanos,
        query: &FactorsQuery,
        max_entries: usize,
        header: ReplyHeader,
    ) -> Result<Reply, RollupError> {
        query.validate(max_entries)?;
        let header = ReplyHeader {
            takes_hints: query.tells_hints(),
            ..header
        };
        let mut reply = query_reply(self.config(), query);
        for (i, op) in query.ops.iter().enumerate() {
            for account in &op.accounts {
                if let Some(v) = self.verdict(now, account, &op.op) {
                    reply.add(i, || account.clone(), &v);
                }
            }
        }
        Ok(reply.finish(now, header))
    }

    /// Takes an early report (`query` with surges) at `now`, within the
    /// agent's `budget` (`policy.surge_min_gap`), and answers with the
    /// verdicts of its pairs, marked for a recheck. A repeat (the agent
    /// never heard the answer to this very report) is answered as a
    /// recheck: counted once is enough.
    pub fn answer_surge(
        &mut self,
        now: Nanos,
        query: &FactorsQuery,
        budget: &mut SurgeBudget,
        max_entries: usize,
        header: ReplyHeader,
    ) -> Result<Reply, RollupError> {
        query.validate(max_entries)?;
        let at = query.surge_at.unwrap_or(now);
        let gap = self.config().policy.surge_min_gap;
        if budget.take(&query.agent_id, now, at, gap)? == SurgeTaken::Repeat {
            return self.answer_factors(now, query, max_entries, header);
        }

        let mut reply = query_reply(self.config(), query);
        for (i, op) in query.ops.iter().enumerate() {
            for (j, (account, rates)) in op.accounts.iter().zip(&op.surges).enumerate() {
                let verdict = self
                    .surge(now, at, &query.agent_id, Pair::new(account, &op.op), *rates)
                    .map_err(|error| RollupError::Entry {
                        op: i,
                        account: j,
                        error,
                    })?;
                // A hint asks for no verdict (see `AgentRound`).
                if let Some(v) = verdict.filter(|_| !rates.hint) {
                    reply.add(i, || account.clone(), &v);
                }
            }
        }
        Ok(reply.finish(now, header))
    }
}

/// The reply being built for `query`: for its ops, or, when it names none,
/// for every op with a default limit and the accounts whose limit is not
/// it, so a new agent learns them all.
pub fn query_reply(config: &MasterConfig, query: &FactorsQuery) -> ReplyBuilder {
    if query.ops.is_empty() {
        let mut ops: Vec<&str> = config.limits.default_ops().collect();
        ops.sort_unstable();
        ReplyBuilder::new(config, ops).with_overrides(config)
    } else {
        ReplyBuilder::new(config, query.ops.iter().map(|o| o.op.as_str()))
    }
}
