//! A rollup, validated, ingested shard by shard and answered with a
//! compact reply: the rules are [`damper_core::wire`]'s, the sharding is
//! this service's. Each shard is locked once per request, never across an
//! `await`; its pairs are warmed first so their cache misses overlap.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use damper_core::Pair;
use damper_core::master::{HintStats, MasterState, SurgeTaken, push_reply};
use damper_core::wire::dictionary::Expansion;
use damper_core::wire::{
    FactorsQuery, Reply, ReplyBuilder, ReplyHeader, Rollup, RollupError, query_reply,
};
use damper_proto::v1::{FactorsRequest, RollupReply, RollupRequest};
use tonic::Status;

use crate::Master;

/// Running totals behind [`Master::ingested`].
#[derive(Default)]
pub(crate) struct IngestedCounters {
    foreign: AtomicU64,
    rollups: AtomicU64,
    entries: AtomicU64,
    attempted: AtomicU64,
    admitted: AtomicU64,
}

/// What a master has counted since it started, over all shards: rollups
/// accepted and the entries and cost they carried. Refused rollups are not
/// in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ingested {
    /// Rollups accepted.
    pub rollups: u64,
    /// (account, op) entries they carried.
    pub entries: u64,
    /// Attempted cost they reported (saturating).
    pub attempted: u64,
    /// Admitted cost they reported (saturating).
    pub admitted: u64,
    /// Entries for accounts this master does not own under its view of the
    /// ring (counted all the same).
    pub foreign: u64,
}

/// When refusals of untrusted input were last logged (milliseconds since
/// the epoch), so an attack is logged at most once per
/// [`WARN_EVERY_MS`] per kind rather than once per request.
#[derive(Default)]
pub(crate) struct Warned {
    implausible: AtomicU64,
    max_pairs: AtomicU64,
    max_ops: AtomicU64,
    new_pairs: AtomicU64,
    refused: AtomicU64,
    /// Refused requests not logged since the last line about them.
    refused_unlogged: AtomicU64,
}

/// Counts what one early report's entry did to a shard's sparse hints:
/// hints taken, pairs polled, polls refused for the per-interval bound.
fn count_hints(before: HintStats, after: HintStats) {
    let hints = after.hints - before.hints;
    if hints == 0 {
        return;
    }
    metrics::counter!("damper_master_hints_total").increment(hints);
    metrics::counter!("damper_master_polls_total").increment(after.polls - before.polls);
    let refused = after.polls_refused - before.polls_refused;
    if refused > 0 {
        metrics::counter!("damper_master_polls_refused_total").increment(refused);
    }
}

/// How often refusals of one kind are logged.
const WARN_EVERY_MS: u64 = 10_000;

/// Whether a warning last logged at `last` may be logged again at `now`
/// (claims the slot when it may).
fn may_warn(last: &AtomicU64, now_ms: u64) -> bool {
    let before = last.load(Relaxed);
    now_ms >= before.saturating_add(WARN_EVERY_MS)
        && last
            .compare_exchange(before, now_ms, Relaxed, Relaxed)
            .is_ok()
}

/// An agent id as logged: at most 64 characters of whatever a client sent.
fn truncated(agent: &str) -> String {
    agent.chars().take(64).collect()
}

/// INVALID_ARGUMENT naming the field when a rollup's entries by account
/// number do not line up ([`damper_proto::convert::id_lists_error`]): the
/// conversion alone would cut them to the shortest list.
pub(crate) fn check_id_lists(request: &RollupRequest) -> Result<(), Status> {
    match damper_proto::convert::id_lists_error(request) {
        Some(error) => Err(Status::invalid_argument(error)),
        None => Ok(()),
    }
}

impl Master {
    /// Ingests one rollup and answers it. The whole rollup is validated
    /// first: a bad one is refused, naming the field, and nothing of it is
    /// counted. The account names of the pairs the reply lists move from
    /// `rollup` into the reply (left empty in `rollup`) rather than being
    /// copied.
    pub fn answer(&self, rollup: &mut Rollup) -> Result<Reply, RollupError> {
        let now = self.shared.clock.now();
        // Every account named: the sender's first rollups here.
        let sent_named = rollup.tells_hints();
        let mut expanded = self.expand(now, rollup)?;
        let takes_ids = expanded.takes_ids;
        let options = &self.shared.options;
        let validated = rollup
            .validate_within(now, options.max_entries, options.max_claimed_rate)
            .map_err(|e| {
                if e.is_implausible() {
                    self.implausible(&rollup.agent_id, now, e)
                } else {
                    e
                }
            })?;
        if !self.first_time(now, rollup) {
            // A resend of a rollup already counted (its reply was lost):
            // the verdicts in force, nothing counted again.
            metrics::counter!("damper_master_rollups_repeated_total").increment(1);
            let mut reply = self.answer_factors(&rollup.as_query())?;
            reply.takes_ids = takes_ids;
            reply.takes_hints = sent_named;
            return Ok(reply);
        }
        let mut refused = Refused::default();
        let mut allowance = self.new_pairs_left(&rollup.agent_id, now);
        let (by_shard, totals) = self.by_shard(rollup);
        // Before the names move into the reply.
        let foreign = self.foreign_entries(rollup);
        let mut reply: Option<ReplyBuilder> = None;
        // Releases this rollup brought, for every agent.
        let mut pushes = Vec::new();
        for (shard, entries) in by_shard.iter().enumerate().filter(|(_, e)| !e.is_empty()) {
            let mut state = self.lock(shard);
            // From the first shard's config: during a reload shards may
            // differ for a moment, and a verdict is left unlisted only if it
            // matches.
            let reply = reply.get_or_insert_with(|| {
                ReplyBuilder::new(state.config(), rollup.ops.iter().map(|o| o.op.as_str()))
            });
            state.warm(entries.iter().map(|&(i, j)| {
                let pair = Pair::new(&rollup.ops[i].accounts[j].account, &rollup.ops[i].op);
                (pair, expanded.hint(i, j))
            }));
            let ((), left) = refused.within(&mut state, allowance, |state| {
                for &(i, j) in entries {
                    let mut at = expanded.hint(i, j);
                    let verdict = state.ingest_validated(validated, &rollup.report(i, j), &mut at);
                    expanded.found(i, j, at);
                    if let Some(v) = verdict {
                        let names = &mut rollup.ops[i].accounts[j].account;
                        reply.add(i, || std::mem::take(names), &v);
                    }
                }
            });
            allowance = left;
            // Published under the shard's lock, so a pair's events keep the
            // order its state changed in: published after it, another
            // request's transitions of the same pair could take an earlier
            // id (seen: `near_limit_ended` before the `suppression_ended`
            // it follows, two agents' reports of one drop in a
            // millisecond). Nothing to publish returns at once.
            self.shared.events.publish(now, state.take_transitions());
            pushes.extend(state.take_pushes());
            drop(state);
        }
        if expanded.moved() {
            // Where the pairs given by number are, for the next round.
            self.dictionaries().learn(&expanded);
        }
        self.new_pairs_added(&rollup.agent_id, now, &refused);
        self.publish_pushes(pushes);
        let reply = match reply {
            Some(reply) => reply,
            None => ReplyBuilder::new(
                self.lock(0).config(),
                rollup.ops.iter().map(|o| o.op.as_str()),
            ),
        };
        self.count(rollup, totals, reply.listed(), foreign);
        let header = ReplyHeader {
            takes_ids,
            // Said to an agent's first rollups (every account named), not
            // to every steady round's (see `ReplyHeader::takes_hints`).
            takes_hints: sent_named,
            ..self.header(foreign.unwrap_or(0))
        };
        Ok(reply.finish(now, header))
    }

    /// Sends `pushes` (verdicts a report flipped) to every agent watching
    /// this master, as one reply; nothing when there are none. The reply
    /// is built under the first shard's lock, from its config, which it
    /// reads without a copy (no other lock is held by the callers).
    fn publish_pushes(&self, pushes: Vec<damper_core::master::Push>) {
        if pushes.is_empty() {
            return;
        }
        let push = push_reply(
            self.lock(0).config(),
            pushes,
            self.shared.rollup_interval,
            self.shared.started,
        );
        self.shared.pushes.publish(push);
    }

    /// Turns the rollup's account numbers back into names (see
    /// [`damper_core::wire::dictionary`]); whether this master holds the
    /// sender's dictionary, and where the pairs given by number were last
    /// found ([`Expansion`]). The entries by number are counted on the way
    /// (`damper_master_rollup_entries_by_id_total`).
    fn expand(
        &self,
        now: damper_core::time::Nanos,
        rollup: &mut Rollup,
    ) -> Result<Expansion, RollupError> {
        let by_id: usize = rollup.ops.iter().map(|o| o.by_id.len()).sum();
        if rollup.entries() > self.shared.options.max_entries {
            // Refused by the validation that follows, before any work.
            return Ok(Expansion::default());
        }
        let expanded = self.dictionaries().expand_found(now, rollup);
        match &expanded {
            Ok(_) => {
                metrics::counter!("damper_master_rollup_entries_by_id_total")
                    .increment(by_id as u64);
            }
            Err(e) => {
                let reason = if e.is_unknown() {
                    "unknown"
                } else {
                    "malformed"
                };
                metrics::counter!("damper_master_dictionary_refusals_total", "reason" => reason)
                    .increment(1);
            }
        }
        Ok(expanded?)
    }

    /// [`answer`](Self::answer) on the protobuf request, as the service
    /// receives it; errors as the service sends them. Copies the request.
    pub fn rollup(&self, request: &RollupRequest) -> Result<RollupReply, Status> {
        check_id_lists(request)?;
        let mut rollup = Rollup::from(request.clone());
        self.answer(&mut rollup)
            .map(RollupReply::from)
            .map_err(crate::status)
    }

    /// [`rollup`](Self::rollup) on an encoded `RollupRequest`, as it comes
    /// off the wire: bytes that do not decode are INVALID_ARGUMENT. The
    /// entry point of the fuzz target and of the malformed-input corpus.
    pub fn rollup_bytes(&self, bytes: &[u8]) -> Result<RollupReply, Status> {
        let request = <RollupRequest as prost::Message>::decode(bytes)
            .map_err(|e| Status::invalid_argument(format!("not a RollupRequest: {e}")))?;
        check_id_lists(&request)?;
        let mut rollup = Rollup::from(request);
        self.answer(&mut rollup)
            .map(RollupReply::from)
            .map_err(crate::status)
    }

    /// The verdicts in force for the pairs `query` names, counting nothing:
    /// a recheck, or (naming nothing) a probe or a new agent's hello, told
    /// every op's default limit. An early report (`surge_at`) is taken
    /// first, within the agent's budget (`policy.surge_min_gap_ms`).
    pub fn answer_factors(&self, query: &FactorsQuery) -> Result<Reply, RollupError> {
        query.validate(self.shared.options.max_entries)?;
        let now = self.shared.clock.now();
        query
            .check_rates(self.shared.options.max_claimed_rate)
            .map_err(|e| self.implausible(&query.agent_id, now, e))?;
        let config = self.lock(0).config().clone();
        let mut reply = query_reply(&config, query);
        // A repeat (the agent never heard the answer) is answered as a
        // recheck: counted once is enough.
        let surge = match query.surge_at {
            Some(at) => match self.take_surge_budget(&query.agent_id, now, at, &config)? {
                SurgeTaken::Repeat => None,
                _ => Some(at),
            },
            None => None,
        };
        match surge {
            Some(at) => {
                let mut pushes = Vec::new();
                for (i, op) in query.ops.iter().enumerate() {
                    for (j, (account, rates)) in op.accounts.iter().zip(&op.surges).enumerate() {
                        // The verdict after the early report, marked for
                        // the recheck ([`MasterState::surge`]).
                        let mut state = self.lock(self.shard(account));
                        let allowance = self.new_pairs_left(&query.agent_id, now);
                        let mut refused = Refused::default();
                        let before = state.hint_stats();
                        let (verdict, _) = refused.within(&mut state, allowance, |state| {
                            state.surge(
                                now,
                                at,
                                &query.agent_id,
                                Pair::new(account, &op.op),
                                *rates,
                            )
                        });
                        count_hints(before, state.hint_stats());
                        // Under the shard's lock, as for rollups.
                        self.shared.events.publish(now, state.take_transitions());
                        pushes.extend(state.take_pushes());
                        drop(state);
                        self.new_pairs_added(&query.agent_id, now, &refused);
                        let verdict = verdict.map_err(|error| RollupError::Entry {
                            op: i,
                            account: j,
                            error,
                        })?;
                        // A hint asks for no verdict: its reply could cross a
                        // push and undo it.
                        if let Some(v) = verdict.filter(|_| !rates.hint) {
                            reply.add(i, || account.clone(), &v);
                        }
                    }
                }
                self.publish_pushes(pushes);
            }
            None => {
                for (i, op) in query.ops.iter().enumerate() {
                    for account in &op.accounts {
                        let verdict = self.lock(self.shard(account)).verdict(now, account, &op.op);
                        if let Some(v) = verdict {
                            reply.add(i, || account.clone(), &v);
                        }
                    }
                }
            }
        }
        let header = ReplyHeader {
            takes_hints: query.tells_hints(),
            ..self.header(0)
        };
        Ok(reply.finish(now, header))
    }

    /// A receiver of every push from now on: the verdicts early reports
    /// flip, for the `Watch` stream.
    pub fn watch(&self) -> tokio::sync::broadcast::Receiver<std::sync::Arc<Reply>> {
        self.shared.pushes.subscribe()
    }

    /// Whether `rollup` is counted for the first time (always, unnumbered),
    /// recording it. Checked after validation, so a refused rollup's resend
    /// is refused again rather than taken for a repeat.
    fn first_time(&self, now: damper_core::time::Nanos, rollup: &Rollup) -> bool {
        rollup.sequence == 0
            || self
                .shared
                .rollup_log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .first_time(now, &rollup.agent_id, rollup.incarnation, rollup.sequence)
    }

    /// Counts and (at most every ten seconds) logs a request refused for
    /// claiming more than `max_claimed_rate`; gives the error back.
    fn implausible(
        &self,
        agent: &str,
        now: damper_core::time::Nanos,
        error: RollupError,
    ) -> RollupError {
        metrics::counter!("damper_master_implausible_requests_total").increment(1);
        if may_warn(&self.shared.warned.implausible, now.as_millis()) {
            tracing::warn!(
                agent = %truncated(agent), %error,
                "refused a request claiming more than max_claimed_rate (logged at most every 10 s)"
            );
        }
        error
    }

    /// Logs a refused request (`what`: "rollup" or "factors request") at
    /// most every 10 s, with how many were refused and not logged since:
    /// a client sending bad requests in a loop must not flood the logs.
    pub(crate) fn log_refused(&self, what: &str, agent: &str, status: &tonic::Status) {
        let warned = &self.shared.warned;
        if may_warn(&warned.refused, self.shared.clock.now().as_millis()) {
            let unlogged = warned.refused_unlogged.swap(0, Relaxed);
            tracing::warn!(
                agent = %truncated(agent), code = ?status.code(), message = status.message(),
                refused_since_last_line = unlogged,
                "{what} refused (logged at most every 10 s)"
            );
        } else {
            warned.refused_unlogged.fetch_add(1, Relaxed);
        }
    }

    /// What `agent` may still add in this round ([`NewPairBudget`]).
    ///
    /// [`NewPairBudget`]: damper_core::master::NewPairBudget
    fn new_pairs_left(&self, agent: &str, now: damper_core::time::Nanos) -> usize {
        self.shared
            .new_pairs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .left(agent, now)
    }

    /// Records the new pairs `agent` added, and counts and (at most every
    /// 10 s) logs those refused, by the cap that refused them.
    fn new_pairs_added(&self, agent: &str, now: damper_core::time::Nanos, refused: &Refused) {
        self.shared
            .new_pairs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .spend(agent, now, refused.added);
        let options = &self.shared.options;
        let warned = &self.shared.warned;
        let caps = [
            (
                refused.max_pairs,
                "max_pairs",
                options.max_pairs as u64,
                &warned.max_pairs,
                "new (account, op) pairs not tracked: max_pairs are",
            ),
            (
                refused.max_ops,
                "max_ops",
                damper_core::master::MAX_OPS as u64,
                &warned.max_ops,
                "reports of new ops not tracked: max_ops op names are",
            ),
            (
                refused.per_agent,
                "per_agent",
                options.max_new_pairs_per_agent as u64,
                &warned.new_pairs,
                "new (account, op) pairs not tracked: this agent added max_new_pairs_per_agent this round",
            ),
        ];
        for (count, cap, bound, last, what) in caps {
            if count == 0 {
                continue;
            }
            metrics::counter!("damper_master_pairs_refused_total", "cap" => cap).increment(count);
            if may_warn(last, now.as_millis()) {
                tracing::warn!(
                    agent = %truncated(agent), refused = count, cap, bound,
                    "{what} (logged at most every 10 s)"
                );
            }
        }
    }

    /// Takes one early report from `agent`, measured over the sub-window
    /// that ended at `at`, out of its budget, or refuses it; counted
    /// either way.
    fn take_surge_budget(
        &self,
        agent: &str,
        now: damper_core::time::Nanos,
        at: damper_core::time::Nanos,
        config: &damper_core::config::MasterConfig,
    ) -> Result<SurgeTaken, RollupError> {
        let taken = self
            .shared
            .surge_budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(agent, now, at, config.policy.surge_min_gap);
        match taken {
            Ok(taken) => {
                metrics::counter!("damper_master_early_reports_total").increment(1);
                if taken == SurgeTaken::Repeat {
                    metrics::counter!("damper_master_early_reports_repeated_total").increment(1);
                }
                Ok(taken)
            }
            Err(refused) => {
                metrics::counter!("damper_master_early_reports_refused_total").increment(1);
                Err(refused.into())
            }
        }
    }

    /// [`answer_factors`](Self::answer_factors) on the protobuf request.
    pub fn factors(&self, request: &FactorsRequest) -> Result<RollupReply, Status> {
        if let Some(error) = damper_proto::convert::surge_lists_error(request) {
            return Err(Status::invalid_argument(error));
        }
        self.answer_factors(&FactorsQuery::from(request.clone()))
            .map(RollupReply::from)
            .map_err(crate::status)
    }

    /// What a reply says about this master.
    fn header(&self, foreign_entries: usize) -> ReplyHeader {
        ReplyHeader {
            rollup_interval: self.shared.rollup_interval,
            started: self.shared.started,
            ring_version: self.shared.ring.get().map_or(0, |v| v.ring.version()),
            foreign_entries: u32::try_from(foreign_entries).unwrap_or(u32::MAX),
            takes_ids: false,
            takes_hints: false,
        }
    }

    /// The rollup's entries grouped by shard, as (op, entry) indexes, so
    /// each shard is locked once; and what they carry, for
    /// [`ingested`](Self::ingested).
    fn by_shard(&self, rollup: &Rollup) -> (Vec<Vec<(usize, usize)>>, Totals) {
        let mut by_shard: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.shared.shards.len()];
        let mut totals = Totals::default();
        for (i, op) in rollup.ops.iter().enumerate() {
            for (j, counts) in op.accounts.iter().enumerate() {
                by_shard[self.shard(&counts.account)].push((i, j));
                totals.entries += 1;
                totals.attempted = totals.attempted.saturating_add(counts.attempted);
                totals.admitted = totals.admitted.saturating_add(counts.admitted);
            }
        }
        (by_shard, totals)
    }

    /// Counts an accepted rollup in the totals and metrics.
    fn count(&self, rollup: &Rollup, totals: Totals, listed: usize, foreign: Option<usize>) {
        let counted = &self.shared.ingested;
        counted.rollups.fetch_add(1, Relaxed);
        counted.entries.fetch_add(totals.entries, Relaxed);
        let add = |total: &AtomicU64, v: u64| {
            let _ = total.fetch_update(Relaxed, Relaxed, |t| Some(t.saturating_add(v)));
        };
        add(&counted.attempted, totals.attempted);
        add(&counted.admitted, totals.admitted);
        metrics::counter!("damper_master_rollups_total").increment(1);
        metrics::counter!("damper_master_entries_total").increment(totals.entries);
        metrics::counter!("damper_master_cost_total", "count" => "attempted")
            .increment(totals.attempted);
        metrics::counter!("damper_master_cost_total", "count" => "admitted")
            .increment(totals.admitted);
        metrics::counter!("damper_master_factors_sent_total").increment(listed as u64);
        if let Some(foreign) = foreign.filter(|&f| f > 0) {
            counted.foreign.fetch_add(foreign as u64, Relaxed);
            metrics::counter!("damper_master_foreign_entries_total").increment(foreign as u64);
            tracing::debug!(agent = %rollup.agent_id, foreign, "rollup carries accounts this master does not own: the agent's ring differs");
        }
    }

    /// Its events: accounts near their limit, suppression started and
    /// ended (`/v1/events`).
    pub fn events(&self) -> &crate::events::Events {
        &self.shared.events
    }

    /// What this master has counted since it started.
    pub fn ingested(&self) -> Ingested {
        let c = &self.shared.ingested;
        Ingested {
            rollups: c.rollups.load(Relaxed),
            entries: c.entries.load(Relaxed),
            attempted: c.attempted.load(Relaxed),
            admitted: c.admitted.load(Relaxed),
            foreign: c.foreign.load(Relaxed),
        }
    }
}

/// New pairs one request added, and those refused, by the cap that
/// refused them.
#[derive(Debug, Default)]
struct Refused {
    added: usize,
    max_pairs: u64,
    per_agent: u64,
    /// Reports of new ops past `MAX_OPS`.
    max_ops: u64,
}

impl Refused {
    /// Runs `ingest` on a shard's `state` with at most `allowance` new
    /// pairs allowed, and counts what it added and what was refused, by
    /// cap (the agent's allowance if it ran out, else `max_pairs`).
    /// Returns `ingest`'s result and what is left of the allowance.
    fn within<T>(
        &mut self,
        state: &mut MasterState,
        allowance: usize,
        ingest: impl FnOnce(&mut MasterState) -> T,
    ) -> (T, usize) {
        let refused_before = state.refused_pairs();
        let ops_before = state.refused_ops();
        state.allow_new_pairs(Some(allowance));
        let out = ingest(state);
        self.max_ops += state.refused_ops() - ops_before;
        let left = state.new_pairs_allowed().unwrap_or(0);
        state.allow_new_pairs(None);
        let refused = state.refused_pairs() - refused_before;
        if left == 0 {
            self.per_agent += refused;
        } else {
            self.max_pairs += refused;
        }
        self.added += allowance - left;
        (out, left)
    }
}

/// What one rollup carries.
#[derive(Clone, Copy, Default)]
struct Totals {
    entries: u64,
    attempted: u64,
    admitted: u64,
}
