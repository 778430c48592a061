//! One [`MasterState`] answering an agent: the master's side of a round,
//! in one piece, for a master that is a single shard (the simulator's).
//! The master service runs the same steps over its shards: validate the
//! whole request, ingest each entry, compact the verdicts.

use crate::master::MasterState;
use crate::time::Nanos;

use super::{FactorsQuery, Reply, ReplyBuilder, ReplyHeader, Rollup, RollupError};

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
        rollup.validate(now, max_entries)?;
        let mut reply = ReplyBuilder::new(self.config(), rollup.ops.iter().map(|o| o.op.as_str()));
        for (op, account, report) in rollup.reports() {
            let verdict = self
                .ingest(now, &report)
                .map_err(|error| RollupError::Entry { op, account, error })?;
            if let Some(v) = verdict {
                reply.add(op, || report.account.to_owned(), &v);
            }
        }
        Ok(reply.finish(now, header))
    }

    /// The verdicts in force at `now` for the pairs `query` names, counting
    /// nothing, as a compact reply.
    pub fn answer_factors(
        &self,
        now: Nanos,
        query: &FactorsQuery,
        max_entries: usize,
        header: ReplyHeader,
    ) -> Result<Reply, RollupError> {
        query.validate(max_entries)?;
        let mut reply = ReplyBuilder::new(self.config(), query.ops.iter().map(|o| o.op.as_str()));
        for (i, op) in query.ops.iter().enumerate() {
            for account in &op.accounts {
                if let Some(v) = self.verdict(now, account, &op.op) {
                    reply.add(i, || account.clone(), &v);
                }
            }
        }
        Ok(reply.finish(now, header))
    }
}
