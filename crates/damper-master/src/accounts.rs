//! Which (account, op) pairs a master tracks, filtered, sorted and cut:
//! what the HTTP endpoint and the accounts page show.

use damper_core::Pair;
use damper_core::master::KeyView;

use crate::Master;

/// Demand over limit: how far over its limit a pair is (0 when unlimited).
pub fn ratio(v: &KeyView) -> f64 {
    match v.limit {
        Some(limit) if limit > 0.0 => v.demand / limit,
        _ => 0.0,
    }
}

/// Which (account, op) pairs [`Master::accounts`] returns, and in what
/// order. The HTTP endpoint parses it from the query string.
#[derive(Clone, Debug, PartialEq)]
pub struct AccountsQuery {
    /// Only this op.
    pub op: Option<String>,
    /// Only accounts that start with this.
    pub prefix: Option<String>,
    /// Only this account.
    pub account: Option<String>,
    /// Only pairs whose factor is at least this (0: all).
    pub min_factor: f64,
    /// The order, largest first.
    pub sort: AccountsSort,
    /// Most rows returned.
    pub limit: usize,
}

impl Default for AccountsQuery {
    fn default() -> Self {
        AccountsQuery {
            op: None,
            prefix: None,
            account: None,
            min_factor: 0.0,
            sort: AccountsSort::Factor,
            limit: 100,
        }
    }
}

/// The order of [`Master::accounts`]: largest first, ties by account then
/// op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AccountsSort {
    /// By suppression factor.
    Factor,
    /// By demand rate.
    Demand,
    /// By demand over limit.
    Ratio,
    /// By account name only (ascending).
    Account,
}

impl Master {
    /// The tracked (account, op) pairs that `query` selects, sorted and cut
    /// to its limit, and how many matched before the cut. What the HTTP
    /// endpoint and the accounts page show.
    pub fn accounts(&self, query: &AccountsQuery) -> (Vec<KeyView>, usize) {
        let now = self.shared.clock.now();
        let keep = |pair: Pair<'_>| {
            query.op.as_deref().is_none_or(|o| o == pair.op)
                && query
                    .prefix
                    .as_deref()
                    .is_none_or(|p| pair.account.starts_with(p))
                && query.account.as_deref().is_none_or(|a| a == pair.account)
        };
        let mut views: Vec<KeyView> = match &query.account {
            // One account lives in one shard.
            Some(account) => self.lock(self.shard(account)).views(now, keep),
            None => (0..self.shared.shards.len())
                .flat_map(|s| self.lock(s).views(now, keep))
                .collect(),
        };
        views.retain(|v| v.factor >= query.min_factor);
        let matched = views.len();
        views.sort_by(|a, b| order(query.sort, a, b));
        views.truncate(query.limit);
        (views, matched)
    }
}

/// The order of `sort`: largest first, ties by account then op.
pub(crate) fn order(sort: AccountsSort, a: &KeyView, b: &KeyView) -> std::cmp::Ordering {
    let key = |v: &KeyView| match sort {
        AccountsSort::Factor => v.factor,
        AccountsSort::Demand => v.demand,
        AccountsSort::Ratio => ratio(v),
        AccountsSort::Account => 0.0,
    };
    key(b)
        .total_cmp(&key(a))
        .then_with(|| (&a.account, &a.op).cmp(&(&b.account, &b.op)))
}
