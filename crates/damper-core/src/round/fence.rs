//! Push fences: a reply to a request sent before a push arrived does not
//! undo that push.
//!
//! A master pushes a verdict when an early report turns an account's
//! suppression on or off: the newest word on whether the pair is
//! suppressed. A reply to a request this agent sent earlier (an early
//! report, a poll's answer, a rollup) may have been made before the push
//! and arrive after it, the two taking different paths: in the simulator,
//! 15 ± 5 ms each. Applied, it put the flood's factor back on a pair the
//! push had just released, until the pair's next report (up to 1.5 s in
//! `costly-flood`, whose release comes while its agents' answers to the
//! fall's poll are still in flight). A reply that contradicts a later
//! push, suppressing what it released or releasing what it suppressed, is
//! skipped for that pair: an early report that flipped the pair back
//! after the push would have been pushed too, and a round that did
//! (rounds turn suppression on without a push) is heard at the agent's
//! next report, one round at most. A reply that agrees with the push may
//! be newer than it (a rise's factor grows as its reports come in after
//! the flip), and is applied.
//!
//! Requests are numbered in the order they are sent, so "sent before the
//! push arrived" is "numbered below the first request after it": the
//! fence. A pair's fence is kept only while a request below it may still
//! be answered.

use std::collections::HashMap;

use crate::Pair;
use crate::wire::{Factor, Reply};

/// A push's word on a pair: the first request number sent after it
/// arrived, and whether it suppressed the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fence {
    id: u64,
    suppressed: bool,
}

/// Per master, per op, per account: the latest push that named the pair.
#[derive(Debug, Default)]
pub(super) struct PushFences {
    by_master: HashMap<String, HashMap<String, HashMap<String, Fence>>>,
}

impl PushFences {
    /// Notes the pairs `push` from `master` names, fenced at `next_id`
    /// (the number the next request will take), and forgets fences that
    /// no request in flight to `master` can cross: `oldest` is the lowest
    /// number in flight to it (`None`: none is).
    pub(super) fn note(&mut self, master: &str, push: &Reply, next_id: u64, oldest: Option<u64>) {
        self.prune(master, oldest);
        for op in push.ops.iter().filter(|op| !op.listed.is_empty()) {
            let accounts = self
                .by_master
                .entry(master.to_owned())
                .or_default()
                .entry(op.op.clone())
                .or_default();
            for listed in &op.listed {
                let fence = Fence {
                    id: next_id,
                    suppressed: listed.factor.factor > 0.0,
                };
                accounts.insert(listed.account.clone(), fence);
            }
        }
    }

    /// Forgets the fences of `master` that no request in flight to it can
    /// cross: `oldest` is the lowest number in flight to it (`None`: none
    /// is). Called as replies come, so a fence outlives its push only as
    /// long as the requests sent before it.
    pub(super) fn prune(&mut self, master: &str, oldest: Option<u64>) {
        let Some(ops) = self.by_master.get_mut(master) else {
            return;
        };
        let oldest = oldest.unwrap_or(u64::MAX);
        ops.retain(|_, accounts| {
            accounts.retain(|_, fence| fence.id > oldest);
            !accounts.is_empty()
        });
        if ops.is_empty() {
            self.by_master.remove(master);
        }
    }

    /// Whether the reply to request `id` to `master`, giving `pair` the
    /// `factor`, contradicts a push that may be newer than it: the push
    /// arrived after the request was sent, and said otherwise of whether
    /// the pair is suppressed. Such a verdict is not applied.
    pub(super) fn stale(&self, master: &str, id: u64, pair: Pair<'_>, factor: &Factor) -> bool {
        self.by_master
            .get(master)
            .and_then(|ops| ops.get(pair.op))
            .and_then(|accounts| accounts.get(pair.account))
            .is_some_and(|fence| id < fence.id && (factor.factor > 0.0) != fence.suppressed)
    }

    /// Whether any fence is kept for `master`: replies from masters with
    /// none (nearly always) are applied without a lookup per pair.
    pub(super) fn any(&self, master: &str) -> bool {
        self.by_master.contains_key(master)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::wire::{Listed, OpVerdicts};

    /// A push giving each of `accounts` the factor `factor`.
    fn push(accounts: &[&str], factor: f64) -> Reply {
        Reply {
            ops: vec![OpVerdicts {
                op: "messages".into(),
                listed: accounts
                    .iter()
                    .map(|a| Listed {
                        account: (*a).into(),
                        factor: with(factor),
                        recheck: false,
                    })
                    .collect(),
                unlisted: None,
                overrides: Vec::new(),
            }],
            ..Reply::default()
        }
    }

    fn with(factor: f64) -> Factor {
        Factor {
            factor,
            limit: 1_000.0,
            valid_for: Duration::from_secs(6),
            shadow: false,
            utilisation: 0.0,
        }
    }

    fn pair(account: &str) -> Pair<'_> {
        Pair::new(account, "messages")
    }

    #[test]
    fn replies_older_than_a_push_that_contradict_it_are_skipped() {
        let mut fences = PushFences::default();
        assert!(!fences.any("m1"));
        // Requests 3 and 4 in flight when a push releasing acme arrives.
        fences.note("m1", &push(&["acme"], 0.0), 5, Some(3));
        assert!(fences.any("m1"));
        let (held, free) = (with(0.8), with(0.0));
        assert!(fences.stale("m1", 3, pair("acme"), &held));
        assert!(fences.stale("m1", 4, pair("acme"), &held));
        // Saying what the push said; sent after it; about another pair,
        // op or master.
        assert!(!fences.stale("m1", 4, pair("acme"), &free));
        assert!(!fences.stale("m1", 5, pair("acme"), &held));
        assert!(!fences.stale("m1", 3, pair("globex"), &held));
        assert!(!fences.stale("m2", 3, pair("acme"), &held));
        assert!(!fences.stale("m1", 3, Pair::new("acme", "presence"), &held));
        // A push that suppresses: an older reply releasing is skipped, one
        // suppressing (by more, say: it may be newer) is not.
        fences.note("m1", &push(&["acme"], 0.5), 7, Some(3));
        assert!(fences.stale("m1", 6, pair("acme"), &free));
        assert!(!fences.stale("m1", 6, pair("acme"), &held));
    }

    #[test]
    fn fences_no_request_in_flight_can_cross_are_forgotten() {
        let mut fences = PushFences::default();
        fences.note("m1", &push(&["acme"], 0.0), 5, Some(3));
        // A later push about another pair, with request 5 the oldest in
        // flight: acme's fence (5) can no longer be crossed.
        fences.note("m1", &push(&["globex"], 0.0), 9, Some(5));
        assert!(!fences.stale("m1", 4, pair("acme"), &with(0.8)));
        assert!(fences.stale("m1", 8, pair("globex"), &with(0.8)));
        // Request 8 answered, nothing else in flight: nothing is kept.
        fences.prune("m1", None);
        assert!(!fences.any("m1"));
        fences.note("m1", &push(&[], 0.0), 12, None);
        assert!(!fences.any("m1"));
    }
}
