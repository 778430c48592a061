//! Polls: a master that saw several agents hint at once that a pair's
//! sparse traffic rose (see `hint`) asks every agent holding the pair for
//! its rate now ([`Reply::polls`](crate::wire::Reply::polls), pushed). Each answers with an early
//! report of its rate over the last whole sub-window and the part of the
//! current one, with the operations counted, so the master's surge
//! estimate sums every agent's share of the flood over a few hundred
//! milliseconds ([`AgentState::answer_polls`], [`AgentState::report_polls`]).
//!
//! One answer measures 200–400 ms: a 5× flood of cost-51 operations over
//! 40 agents is 40–80 operations in all, its sum ±11–16%. So each polled
//! pair is measured on from the same start and reported again each time
//! its span has doubled, up to [`POLL_SPAN`]: the master's estimate, which
//! stands until whole rounds show the flood, then rests on a second or
//! more of every agent's operations rather than on the first few hundred
//! milliseconds.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use compact_str::CompactString;

use super::AgentState;
use crate::Pair;
use crate::time::Nanos;
use crate::wire::{OpAccounts, SurgeRates};

/// The longest span a polled pair is measured over: by then its estimate
/// rests on a second or more of every agent's operations, and rounds that
/// hold the flood whole are near.
pub const POLL_SPAN: Duration = Duration::from_millis(1_600);

/// The most polled pairs held at once: a master polls a bounded number of
/// pairs per interval, and more than this on one agent at once is a storm
/// whose other pairs are read at their rounds.
pub const MAX_POLLED: usize = 1_024;

/// One pair a master polled.
#[derive(Debug)]
pub(super) struct Polled {
    op: Arc<str>,
    account: CompactString,
    /// Where its measure starts, and its attempted total then.
    start: Nanos,
    base: u32,
    /// The span of its last report; `None` before the first went out.
    reported: Option<Duration>,
    /// When it is next reported.
    due: Nanos,
}

impl AgentState {
    /// Notes the pairs `polls` names that this agent holds (at most
    /// [`MAX_POLLED`] at once; one polled already keeps its measure),
    /// each measured from the start of the last whole sub-window: the one
    /// that ended at `last_close`, `window` long. Returns how many were
    /// noted; [`report_polls`](Self::report_polls) offers them.
    pub fn answer_polls(
        &self,
        now: Nanos,
        last_close: Nanos,
        window: Duration,
        polls: &[OpAccounts],
    ) -> usize {
        let pinned = self.pairs.pin();
        let mut polled = self.polled.lock().unwrap_or_else(|e| e.into_inner());
        let mut noted = 0;
        for op in polls {
            for account in &op.accounts {
                if polled.len() >= MAX_POLLED {
                    return noted;
                }
                if polled
                    .iter()
                    .any(|p| p.account == account.as_str() && *p.op == *op.op)
                {
                    continue;
                }
                let Some(entry) = pinned.find(account, &op.op) else {
                    continue;
                };
                let Some(op) = self.interned(&op.op) else {
                    continue;
                };
                // The cost since the last close, and the sub-window before.
                let total = entry.attempted_total();
                let current = u64::from(total.wrapping_sub(entry.surge_total.load(Relaxed)));
                let last = (entry.last_window_rate() * window.as_secs_f64()).round() as u64;
                let back = (current + last).min(u64::from(u32::MAX)) as u32;
                polled.push(Polled {
                    op,
                    account: account.as_str().into(),
                    start: last_close - window,
                    base: total.saturating_sub(back),
                    reported: None,
                    due: now,
                });
                noted += 1;
            }
        }
        noted
    }

    /// Offers `report` the polled pairs due at `now`: the rate over each
    /// one's span so far, with the operations counted when its cost per
    /// operation is known, against the rate its master holds for this
    /// agent. A pair taken is reported again once its span has doubled,
    /// until it reaches [`POLL_SPAN`], while its master suppresses it; one
    /// not taken (its master busy) is offered at the next call. Pairs gone,
    /// and those whose master's surge estimate has lapsed or whose answer
    /// found no overload, leave. The round calls it on a push and at each
    /// scan (every half sub-window), so a report is at most that late.
    /// Returns how many were taken.
    pub fn report_polls(
        &self,
        now: Nanos,
        mut report: impl FnMut(Pair<'_>, SurgeRates) -> bool,
    ) -> usize {
        let mut polled = self.polled.lock().unwrap_or_else(|e| e.into_inner());
        if polled.is_empty() {
            return 0;
        }
        let round = self.report_round(now);
        let pinned = self.pairs.pin();
        let mut taken = 0;
        polled.retain_mut(|pair| {
            if now < pair.due {
                return true;
            }
            let Some(entry) = pinned.find(&pair.account, &pair.op) else {
                return false;
            };
            let (baseline, surged) = entry.told_rate(round);
            if pair.reported.is_some() && (!surged || entry.master_factor_at(now) == 0) {
                // Its master's surge estimate gave way to whole rounds, or
                // its answers found no overload (a chance poll, or a rise
                // under the limit): the rounds say the rest.
                return false;
            }
            let span = now.since(pair.start);
            let cost = u64::from(entry.attempted_total().wrapping_sub(pair.base));
            let rates = entry
                .early_report(
                    (cost as f64 / span.as_secs_f64().max(1e-9)) as f32,
                    (baseline, surged),
                    super::surge::ops_in(cost, entry.op_cost()),
                )
                .with_span(span);
            if !report(Pair::new(&pair.account, &pair.op), rates) {
                return true;
            }
            taken += 1;
            entry.told_early(rates.rate, round, None);
            pair.reported = Some(span);
            pair.due = pair.start + span * 2;
            span < POLL_SPAN
        });
        taken
    }

    /// The agent's own name for `op` (shared by every pair of it), if it
    /// knows the op.
    fn interned(&self, op: &str) -> Option<Arc<str>> {
        let ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        ops.get(op).map(|o| o.name.clone())
    }
}
