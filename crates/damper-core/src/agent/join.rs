//! Joins: telling a pair's new master what its previous one had.
//!
//! When a master comes back on an agent's ring, or goes off it, between two
//! cuts, the accounts it owns move. Their new master's rounds hold none of
//! this agent's demand for them: that went to the previous master. Until a
//! whole round at the new master shows it (one to two rounds), the new
//! master sees part of each account and suppresses too little: after a
//! one-way partition heals, the agents that were cut off bring half a
//! flood's demand back to a master that held only the other half. A join
//! is an early report that says, per moved pair, the rate this agent last
//! told the previous master, which the new master adds to its estimate in
//! full ([`SurgeRates::joined`]).

use super::AgentState;
use crate::Pair;
use crate::time::Nanos;
use crate::wire::SurgeRates;

impl AgentState {
    /// Offers `report` a join for each pair `moved` says changed master
    /// since its counts last went out, with the rate this agent last told
    /// the previous master: its last early report's while that may still
    /// stand there (that round or the next), else its last rollup's. Pairs
    /// with nothing to tell, and pairs of ops known to have no limit, are
    /// skipped. A join `report` takes (returns `true`) becomes the pair's
    /// baseline, as an early report's, so the scans that follow measure
    /// surges at the new master from it. Returns how many were taken.
    ///
    /// Off the hot path: one pass over the pairs, by the round, when the
    /// ring changed between cuts.
    pub fn offer_joins(
        &self,
        now: Nanos,
        moved: impl Fn(Pair<'_>) -> bool,
        mut report: impl FnMut(Pair<'_>, SurgeRates) -> bool,
    ) -> usize {
        let round = self.report_round(now);
        let op_limits = self.op_default_limits();
        let pinned = self.pairs.pin();
        let mut taken = 0;
        for found in pinned.pairs() {
            let entry = found.entry();
            let (rate, _) = entry.told_rate(round);
            let limited = match entry.scan_limit(|| found.op(), &op_limits) {
                Some(limit) => !limit.is_some_and(super::entry::is_unlimited),
                None => false,
            };
            if rate <= 0.0 || !limited {
                continue;
            }
            let account = found.account();
            let pair = Pair::new(account.as_str(), found.op());
            if !moved(pair) {
                continue;
            }
            let join = SurgeRates {
                rate,
                joined: true,
                ..SurgeRates::default()
            };
            if report(pair, join) {
                entry.told_early(rate, round, None);
                taken += 1;
            }
        }
        taken
    }
}
