//! The compact reply, both ways. Most limited pairs sit at factor 0 under
//! their op's own limit, so a reply lists only the verdicts that differ
//! from that default ([`ReplyBuilder`]) and says, per op, what every other
//! pair the request named gets ([`Unlisted`]); the agent expands it back
//! into one verdict per pair ([`Reply::expand`]). A reply then costs bytes
//! for the suppressed and the specially limited pairs only.

use std::collections::HashSet;
use std::time::Duration;

use crate::Pair;
use crate::config::MasterConfig;
use crate::master::Verdict;
use crate::time::Nanos;

use super::{Factor, HELLO_OVERRIDES_MAX, Listed, OpVerdicts, Reply, Unlisted, millis_u32};

/// What a reply says about the master rather than about pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplyHeader {
    /// The master's rollup interval.
    pub rollup_interval: Duration,
    /// When the master process started.
    pub started: Nanos,
    /// Digest of the master's view of the ring (0: none).
    pub ring_version: u64,
    /// Entries the request carried for accounts the master does not own.
    pub foreign_entries: u32,
    /// Whether the master holds (or would make) a dictionary for the
    /// sender: [`Reply::takes_ids`].
    pub takes_ids: bool,
    /// Whether to say the master takes sparse hints
    /// ([`Reply::takes_hints`]). Every master of this build does; it says
    /// so in replies to requests naming nothing (a hello, a probe) and to
    /// rollups that name every account (an agent's first to it), not in
    /// every steady round's or recheck's reply, where it would cost two
    /// bytes each.
    pub takes_hints: bool,
}

/// Builds the compact reply to one request, verdict by verdict.
#[derive(Debug)]
pub struct ReplyBuilder {
    ops: Vec<OpVerdicts>,
    recheck_at: Option<Nanos>,
    /// `policy.near_limit_share`: a pair at or above it is listed with its
    /// utilisation, so its agents can warn before refusing anything.
    near_share: f32,
}

impl Unlisted {
    /// The default verdict of `op` under `config`: `None` when the op has
    /// no limit of its own.
    pub fn of(config: &MasterConfig, op: &str) -> Option<Unlisted> {
        config.limits.op_match(op).map(|own| Unlisted {
            limit: own.rate.get(),
            valid_for: whole(config.policy.factor_validity),
            shadow: own.shadow,
        })
    }

    /// Whether `verdict` is exactly what leaving its account unlisted says,
    /// as it reaches the agent (validity in whole milliseconds).
    pub fn implies(&self, verdict: &Verdict) -> bool {
        verdict.factor == 0.0
            && verdict.recheck_at.is_none()
            && verdict.limit.get() == self.limit
            && verdict.shadow == self.shadow
            && whole(verdict.valid_for) == self.valid_for
    }

    /// The factor an unlisted pair applies.
    pub fn factor(&self) -> Factor {
        Factor {
            factor: 0.0,
            limit: self.limit,
            valid_for: self.valid_for,
            shadow: self.shadow,
            utilisation: 0.0,
        }
    }
}

/// A verdict's demand over its limit (0 for an exempt account's).
pub fn utilisation(verdict: &Verdict) -> f32 {
    if verdict.limit.is_unlimited() {
        0.0
    } else {
        (verdict.rates.demand / verdict.limit.get()) as f32
    }
}

fn whole(d: Duration) -> Duration {
    Duration::from_millis(u64::from(millis_u32(d)))
}

impl Listed {
    /// `verdict`, listed for `account`, saying `utilisation` (0: not
    /// said).
    pub fn new(account: String, verdict: &Verdict, utilisation: f32) -> Listed {
        Listed {
            account,
            factor: Factor {
                factor: verdict.factor,
                limit: verdict.limit.get(),
                valid_for: whole(verdict.valid_for),
                shadow: verdict.shadow,
                utilisation,
            },
            recheck: verdict.recheck_at.is_some(),
        }
    }
}

impl ReplyBuilder {
    /// A reply to a request naming `ops` (in the request's order), under
    /// `config`.
    pub fn new<'a>(config: &MasterConfig, ops: impl IntoIterator<Item = &'a str>) -> Self {
        ReplyBuilder {
            ops: ops
                .into_iter()
                .map(|op| OpVerdicts {
                    op: op.to_owned(),
                    listed: Vec::new(),
                    unlisted: Unlisted::of(config, op),
                    overrides: Vec::new(),
                })
                .collect(),
            recheck_at: None,
            near_share: config.policy.near_limit_share as f32,
        }
    }

    /// The verdict for `account` on the request's op number `op`: listed
    /// unless its op's default implies it and it is under the near share
    /// of its limit. `account` is called only when it is listed (the
    /// master moves the name out of the request).
    pub fn add(&mut self, op: usize, account: impl FnOnce() -> String, verdict: &Verdict) {
        // The soonest any pair asks for: a fall that may release any moment
        // asks within 100 ms, and waiting for another pair's round would
        // hold it (the others are asked early, and told again when).
        self.recheck_at = match (self.recheck_at, verdict.recheck_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let entry = &mut self.ops[op];
        let near = utilisation(verdict);
        let near = if near >= self.near_share { near } else { 0.0 };
        if near > 0.0 || !entry.unlisted.is_some_and(|u| u.implies(verdict)) {
            entry.listed.push(Listed::new(account(), verdict, near));
        }
    }

    /// Lists, for each of the reply's ops, the accounts whose limit is not
    /// the op's default (`[limits]` keys with an account, `[exempt]`
    /// entries), unless there are more than [`HELLO_OVERRIDES_MAX`] in all:
    /// what a hello's reply carries.
    pub fn with_overrides(mut self, config: &MasterConfig) -> Self {
        let mut total = 0;
        for op in &mut self.ops {
            op.overrides = config.overrides(&op.op).collect();
            total += op.overrides.len();
        }
        if total > HELLO_OVERRIDES_MAX {
            for op in &mut self.ops {
                op.overrides.clear();
            }
        }
        self
    }

    /// Verdicts listed so far.
    pub fn listed(&self) -> usize {
        self.ops.iter().map(|op| op.listed.len()).sum()
    }

    /// The reply, sent at `now`. Ops with nothing listed and no limit of
    /// their own are left out.
    pub fn finish(self, now: Nanos, header: ReplyHeader) -> Reply {
        Reply {
            ops: self
                .ops
                .into_iter()
                .filter(|op| !op.listed.is_empty() || op.unlisted.is_some())
                .collect(),
            rollup_interval: Some(whole(header.rollup_interval)).filter(|d| !d.is_zero()),
            recheck_after: self
                .recheck_at
                .map(|at| Duration::from_millis(u64::from(millis_u32(at.since(now)).max(1)))),
            started: Some(header.started).filter(|&s| s != Nanos::ZERO),
            ring_version: header.ring_version,
            foreign_entries: header.foreign_entries,
            takes_ids: header.takes_ids,
            takes_hints: header.takes_hints,
            polls: Vec::new(),
        }
    }
}

impl Reply {
    /// Every verdict this reply gives: each listed one, and the op's
    /// default for each pair of `asked` (those the request named) that it
    /// does not list. Calls `visit(pair, factor, hint)` once per pair:
    /// each asked pair comes with a hint of the caller's, given back with
    /// its op's default verdict (a listed verdict comes with 0), the
    /// agent's position of the pair in its table
    /// ([`AccountCounts::at`](super::AccountCounts::at)).
    pub fn expand<'a>(
        &self,
        asked: impl IntoIterator<Item = (Pair<'a>, u32)>,
        mut visit: impl FnMut(Pair<'_>, Factor, u32),
    ) {
        let mut defaults: Vec<(&str, Unlisted, HashSet<&str>)> = Vec::new();
        for op in &self.ops {
            for l in &op.listed {
                visit(Pair::new(&l.account, &op.op), l.factor, 0);
            }
            if let Some(unlisted) = op.unlisted {
                let listed = op.listed.iter().map(|l| l.account.as_str()).collect();
                defaults.push((op.op.as_str(), unlisted, listed));
            }
        }
        if defaults.is_empty() {
            return;
        }
        for (pair, at) in asked {
            if let Some((_, unlisted, listed)) = defaults.iter().find(|(o, _, _)| *o == pair.op)
                && !listed.contains(pair.account)
            {
                visit(pair, unlisted.factor(), at);
            }
        }
    }

    /// The pairs marked for a recheck.
    pub fn rechecks(&self) -> impl Iterator<Item = Pair<'_>> {
        self.ops.iter().flat_map(|op| {
            op.listed
                .iter()
                .filter(|l| l.recheck)
                .map(move |l| Pair::new(&l.account, &op.op))
        })
    }
}
