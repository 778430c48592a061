//! The figures of a run, per (account, op). Definitions in
//! `docs/simulation.md`; all rates are in cost per second over whole
//! simulated seconds.

use std::collections::HashMap;

use serde::Serialize;

use crate::engine::{Control, Run, Series};

/// The figures of one run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    /// Scenario name.
    pub scenario: String,
    /// Policy.
    pub policy: String,
    /// Estimator.
    pub estimator: String,
    /// Rollup requests sent.
    pub rollups_sent: u64,
    /// Rollup requests that failed (lost, partitioned, master down).
    pub rollups_failed: u64,
    /// Cost dropped by agents for being carried too long.
    pub dropped_cost: u64,
    /// Requests and bytes between agents and masters.
    pub control: ControlSummary,
    /// Per (account, op).
    pub accounts: Vec<AccountSummary>,
}

/// Control traffic over the run, in total and per simulated second.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ControlSummary {
    /// Every request agents sent.
    pub rpcs: u64,
    /// Bytes of requests and replies, as `damper.v1` encodes them.
    pub bytes: u64,
    /// `rpcs` per second.
    pub rpcs_per_s: f64,
    /// `bytes` per second.
    pub bytes_per_s: f64,
    /// The requests by kind.
    pub by_kind: Control,
}

/// The figures of one (account, op).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AccountSummary {
    /// Account.
    pub account: String,
    /// Operation.
    pub op: String,
    /// Its limit, cost per second (none: unlimited).
    pub limit: Option<f64>,
    /// Cost attempted over the run.
    pub attempted: u64,
    /// Cost admitted over the run.
    pub admitted: u64,
    /// Admitted rate / limit over the seconds where demand stayed above
    /// 1.5 × limit, skipping the first 10 s of each such stretch.
    pub steady_admitted_ratio: Option<f64>,
    /// (max − min) of the admitted rate in 6 s buckets over those same
    /// seconds, divided by the limit.
    pub oscillation_p2p: Option<f64>,
    /// The same over 1 s buckets: what a user watching each second sees.
    pub oscillation_p2p_1s: Option<f64>,
    /// Worst stretch of overload: seconds from its start until the admitted
    /// rate over the next second first falls to ≤ 1.1 × limit.
    pub reaction_s: Option<f64>,
    /// Worst stretch of overload: the cost admitted in its first second,
    /// divided by the limit. What a deluge gets through before it is
    /// held (the README's quickstart: ≤ 2 is the goal).
    pub onset_1s_ratio: Option<f64>,
    /// Worst stretch of overload that ends with demand below 0.95 × limit:
    /// seconds from its end until no agent applies a factor any more.
    pub release_s: Option<f64>,
    /// The highest admitted rate over any 6 s bucket, divided by the limit.
    pub peak_6s_ratio: Option<f64>,
    /// Cost rejected in seconds whose true demand (the scenario's profile
    /// rates times their costs, summed over the pair's traffic items) was
    /// at or below the limit: refusals of an account that kept to it.
    pub false_rejections: u64,
    /// Cost admitted above the limit, summed over seconds.
    pub over_admitted: u64,
    /// Worst stretch of overload: the cost admitted above the limit in its
    /// first 6 seconds (fewer if it is shorter). What one onset gets
    /// through before it is held, apart from the steady seconds' noise
    /// that `over_admitted` sums over a long flood.
    pub onset_over_admitted: Option<u64>,
    /// When several traffic items share the (account, op) (publishers of
    /// one account): over 10 s buckets of the steady seconds (as for
    /// `steady_admitted_ratio`), the worst relative difference between
    /// one item's kept share (admitted / attempted) and the pair's, so
    /// 0.05 means some publisher kept 5% more or less than its share. None
    /// with one item, or no steady overload.
    pub fairness_10s: Option<f64>,
}

/// The figures of `run`, one record per (account, op) in the order its
/// first traffic item comes.
pub fn summarize(run: &Run) -> Summary {
    Summary {
        scenario: run.scenario.clone(),
        policy: run.policy.clone(),
        estimator: run.estimator.clone(),
        rollups_sent: run.rollups.0,
        rollups_failed: run.rollups.1,
        dropped_cost: run.dropped_cost,
        control: control(run),
        // One pair merged at a time: a fleet's merged series do not all
        // sit in memory at once.
        accounts: groups(&run.series)
            .iter()
            .map(|items| account(&merge(items)))
            .collect(),
    }
}

/// One (account, op): its traffic items' seconds summed.
struct PairSeries {
    account: String,
    op: String,
    limit: Option<f64>,
    /// Per second: attempted and admitted cost.
    seconds: Vec<(u64, u64)>,
    /// The same per traffic item, when it has more than one (empty
    /// otherwise).
    items: Vec<Vec<(u64, u64)>>,
    /// Per second: the true demand, cost per second, from the profiles.
    demand: Vec<f64>,
    /// When any agent of any of its items turned a positive factor on
    /// (`true`) or the last one off (`false`), in seconds.
    factor_changes: Vec<(f64, bool)>,
}

/// The series grouped by (account, op), in the order each first appears
/// (by a map: a fleet's 100 000 accounts, compared pairwise, took minutes).
fn groups(series: &[Series]) -> Vec<Vec<&Series>> {
    let mut groups: Vec<Vec<&Series>> = Vec::new();
    let mut index: HashMap<(&str, &str), usize> = HashMap::with_capacity(series.len());
    for s in series {
        let key = (s.traffic.account.as_str(), s.traffic.op.as_str());
        let at = *index.entry(key).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[at].push(s);
    }
    groups
}

/// The series merged by (account, op), in the order each first appears.
#[cfg(test)]
fn pairs(series: &[Series]) -> Vec<PairSeries> {
    groups(series).iter().map(|items| merge(items)).collect()
}

/// One group's series as one (`items` is not empty).
fn merge(items: &[&Series]) -> PairSeries {
    let (account, op) = (&items[0].traffic.account, &items[0].traffic.op);
    let len = items.iter().map(|s| s.seconds.len()).max().unwrap_or(0);
    let mut seconds = vec![(0, 0); len];
    let mut demand = vec![0.0; len];
    for item in items {
        for (t, s) in item.seconds.iter().enumerate() {
            seconds[t].0 += s.attempted;
            seconds[t].1 += s.admitted;
            let rate = item.traffic.mean_rate(t as f64, (t + 1) as f64);
            demand[t] += rate * item.traffic.cost as f64;
        }
    }
    PairSeries {
        account: account.to_owned(),
        op: op.to_owned(),
        limit: items.iter().find_map(|s| s.limit),
        seconds,
        // Only fairness reads them, and only of pairs of several items:
        // a copy of every item's seconds doubled the summary's memory.
        items: items
            .iter()
            .filter(|_| items.len() > 1)
            .map(|s| {
                s.seconds
                    .iter()
                    .map(|s| (s.attempted, s.admitted))
                    .collect()
            })
            .collect(),
        demand,
        factor_changes: merged_changes(items),
    }
}

/// The items' factor changes as one: positive while any item is.
fn merged_changes(items: &[&Series]) -> Vec<(f64, bool)> {
    let mut events: Vec<(f64, usize, bool)> = items
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.factor_changes.iter().map(move |&(t, p)| (t, i, p)))
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut on = vec![false; items.len()];
    let mut merged = Vec::new();
    let mut any = false;
    for (t, i, p) in events {
        on[i] = p;
        let now = on.iter().any(|&x| x);
        if now != any {
            merged.push((t, now));
            any = now;
        }
    }
    merged
}

fn control(run: &Run) -> ControlSummary {
    let c = run.control;
    let secs = run.series.first().map_or(0, |s| s.seconds.len()).max(1) as f64;
    ControlSummary {
        rpcs: c.rpcs(),
        bytes: c.bytes(),
        rpcs_per_s: c.rpcs() as f64 / secs,
        bytes_per_s: c.bytes() as f64 / secs,
        by_kind: c,
    }
}

/// Maximal runs `[start, end)` of seconds where demand is above 1.5 × limit.
fn overload_stretches(demand: &[f64], limit: f64) -> Vec<(usize, usize)> {
    let mut stretches = Vec::new();
    let mut start = None;
    for (s, d) in demand.iter().enumerate() {
        match (start, *d > 1.5 * limit) {
            (None, true) => start = Some(s),
            (Some(b), false) => {
                stretches.push((b, s));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(b) = start {
        stretches.push((b, demand.len()));
    }
    stretches
}

fn account(pair: &PairSeries) -> AccountSummary {
    let attempted: Vec<f64> = pair.seconds.iter().map(|s| s.0 as f64).collect();
    let admitted: Vec<f64> = pair.seconds.iter().map(|s| s.1 as f64).collect();
    let mut out = AccountSummary {
        account: pair.account.clone(),
        op: pair.op.clone(),
        limit: pair.limit,
        attempted: pair.seconds.iter().map(|s| s.0).sum(),
        admitted: pair.seconds.iter().map(|s| s.1).sum(),
        steady_admitted_ratio: None,
        oscillation_p2p: None,
        oscillation_p2p_1s: None,
        reaction_s: None,
        onset_1s_ratio: None,
        release_s: None,
        peak_6s_ratio: None,
        false_rejections: 0,
        over_admitted: 0,
        onset_over_admitted: None,
        fairness_10s: None,
    };
    let Some(limit) = pair.limit else {
        return out;
    };
    let stretches = overload_stretches(&attempted, limit);
    (out.steady_admitted_ratio, out.oscillation_p2p) = steady(&admitted, &stretches, limit, 6);
    (_, out.oscillation_p2p_1s) = steady(&admitted, &stretches, limit, 1);
    out.fairness_10s = fairness(pair, &stretches);
    out.reaction_s = reaction(&admitted, &stretches, limit);
    out.onset_1s_ratio = stretches
        .iter()
        .map(|&(start, _)| admitted[start] / limit)
        .reduce(f64::max);
    out.onset_over_admitted = stretches
        .iter()
        .map(|&(start, end)| {
            admitted[start..end.min(start + ONSET_S)]
                .iter()
                .map(|a| (a - limit).max(0.0) as u64)
                .sum()
        })
        .max();
    out.release_s = release(pair, &attempted, &stretches, limit);
    out.peak_6s_ratio = admitted
        .chunks(6)
        .filter(|c| c.len() == 6)
        .map(|c| c.iter().sum::<f64>() / 6.0 / limit)
        .reduce(f64::max);
    for (t, &(tried, let_in)) in pair.seconds.iter().enumerate() {
        if pair.demand[t] <= limit {
            out.false_rejections += tried - let_in;
        }
        out.over_admitted += (admitted[t] - limit).max(0.0) as u64;
    }
    out
}

/// The seconds of an overload stretch `onset_over_admitted` sums: as long
/// as the bucket `peak_6s_ratio` reads.
const ONSET_S: usize = 6;

/// Over the steady part of each overload stretch (from its 10th second):
/// the admitted rate over the limit, and the peak-to-peak of its
/// `bucket_s` buckets over the limit.
fn steady(
    admitted: &[f64],
    stretches: &[(usize, usize)],
    limit: f64,
    bucket_s: usize,
) -> (Option<f64>, Option<f64>) {
    let (mut sum, mut n) = (0.0, 0usize);
    let mut buckets: Vec<f64> = Vec::new();
    for &(start, end) in stretches {
        let from = start + 10;
        if from >= end {
            continue;
        }
        sum += admitted[from..end].iter().sum::<f64>();
        n += end - from;
        buckets.extend(
            admitted[from..end]
                .chunks_exact(bucket_s)
                .map(|c| c.iter().sum::<f64>() / bucket_s as f64),
        );
    }
    let ratio = (n > 0).then(|| sum / n as f64 / limit);
    let p2p = (!buckets.is_empty()).then(|| {
        let max = buckets.iter().cloned().fold(f64::MIN, f64::max);
        let min = buckets.iter().cloned().fold(f64::MAX, f64::min);
        (max - min) / limit
    });
    (ratio, p2p)
}

/// The worst relative difference between an item's kept share and its
/// pair's, over 10 s buckets of the steady part of each overload stretch.
fn fairness(pair: &PairSeries, stretches: &[(usize, usize)]) -> Option<f64> {
    if pair.items.len() < 2 {
        return None;
    }
    let kept = |seconds: &[(u64, u64)]| {
        let (tried, let_in) = seconds.iter().fold((0, 0), |(t, a), s| (t + s.0, a + s.1));
        (tried > 0).then(|| let_in as f64 / tried as f64)
    };
    let mut worst: Option<f64> = None;
    for &(start, end) in stretches {
        let mut from = start + 10;
        while from + 10 <= end {
            let bucket = from..from + 10;
            from += 10;
            let Some(whole) = kept(&pair.seconds[bucket.clone()]).filter(|&k| k > 0.0) else {
                continue;
            };
            for item in &pair.items {
                if let Some(share) = item.get(bucket.clone()).and_then(kept) {
                    let off = (share / whole - 1.0).abs();
                    worst = Some(worst.map_or(off, |w| w.max(off)));
                }
            }
        }
    }
    worst
}

/// Seconds from the start of an overload stretch to its first second at
/// most 1.1 × the limit, in the worst stretch.
fn reaction(admitted: &[f64], stretches: &[(usize, usize)], limit: f64) -> Option<f64> {
    stretches
        .iter()
        .map(|&(start, end)| {
            (start..end)
                .find(|&s| admitted[s] <= 1.1 * limit)
                .unwrap_or(end)
                .saturating_sub(start) as f64
        })
        .reduce(f64::max)
}

/// Seconds from the end of an overload stretch (demand back below 0.95 ×
/// the limit) until no agent applies a positive factor, in the worst
/// stretch.
fn release(
    pair: &PairSeries,
    demand: &[f64],
    stretches: &[(usize, usize)],
    limit: f64,
) -> Option<f64> {
    let duration = demand.len() as f64;
    stretches
        .iter()
        .filter(|&&(_, end)| end < demand.len() && demand[end] < 0.95 * limit)
        .map(|&(_, end)| {
            let e = end as f64;
            let positive_at_e = pair
                .factor_changes
                .iter()
                .take_while(|(t, _)| *t <= e)
                .last()
                .is_some_and(|(_, p)| *p);
            if !positive_at_e {
                return 0.0;
            }
            pair.factor_changes
                .iter()
                .find(|(t, p)| *t > e && !*p)
                .map_or(duration - e, |(t, _)| t - e)
        })
        .reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Second;
    use crate::scenario::{Arrivals, ProfilePoint, Traffic};

    /// A series whose profile says `profile` (at second, rate of cost 1).
    fn series_of(
        profile: &[(f64, f64)],
        demand: &[u64],
        admitted: &[u64],
        changes: Vec<(f64, bool)>,
    ) -> Series {
        Series {
            traffic: Traffic {
                account: "a".into(),
                op: "m".into(),
                agents: vec![0],
                cost: 1,
                profile: profile
                    .iter()
                    .map(|&(at_s, rate)| ProfilePoint { at_s, rate })
                    .collect(),
                arrivals: Arrivals::Uniform,
            },
            limit: Some(100.0),
            seconds: demand
                .iter()
                .zip(admitted)
                .map(|(&attempted, &admitted)| Second {
                    attempted,
                    admitted,
                    factor: 0.0,
                })
                .collect(),
            factor_changes: changes,
        }
    }

    fn series(demand: &[u64], admitted: &[u64], changes: Vec<(f64, bool)>) -> Series {
        series_of(&[(0.0, 1.0)], demand, admitted, changes)
    }

    fn summary_of(items: &[Series]) -> AccountSummary {
        let pairs = pairs(items);
        assert_eq!(pairs.len(), 1);
        account(&pairs[0])
    }

    #[test]
    fn figures_follow_their_definitions() {
        // 5 quiet seconds at 50, 24 s of overload at 1000, then 50 again.
        let mut demand = vec![50u64; 5];
        demand.extend([1000u64; 24]);
        demand.extend([50u64; 11]);
        let mut admitted = vec![50u64; 5];
        admitted[2] = 40; // 10 rejected while quiet: a false rejection
        admitted.extend([1000, 400, 150, 105]); // reacts in 3 s
        admitted.extend([100u64; 8]);
        admitted.extend([130u64, 70, 100, 100, 100, 100]); // some wobble
        admitted.extend([100u64; 6]);
        admitted.extend([50u64; 11]);
        assert_eq!(admitted.len(), demand.len());
        // The factor goes positive at 6 s and back to 0 at 30.5 s.
        let profile = [(0.0, 50.0), (5.0, 1000.0), (29.0, 50.0)];
        let s = series_of(
            &profile,
            &demand,
            &admitted,
            vec![(6.0, true), (30.5, false)],
        );
        let a = summary_of(&[s]);
        assert_eq!(a.reaction_s, Some(3.0));
        assert_eq!(a.onset_1s_ratio, Some(10.0));
        assert_eq!(a.release_s, Some(30.5 - 29.0));
        // Steady: seconds 15..29 = 14 seconds, two whole 6 s buckets.
        let steady: Vec<u64> = admitted[15..29].to_vec();
        let mean = steady.iter().sum::<u64>() as f64 / 14.0;
        assert!((a.steady_admitted_ratio.unwrap() - mean / 100.0).abs() < 1e-12);
        let b1 = admitted[15..21].iter().sum::<u64>() as f64 / 6.0;
        let b2 = admitted[21..27].iter().sum::<u64>() as f64 / 6.0;
        assert!((a.oscillation_p2p.unwrap() - (b1 - b2).abs() / 100.0).abs() < 1e-12);
        // Over the limit: 900 + 300 + 50 + 5 + 30.
        assert_eq!(a.over_admitted, 1285);
        // Rejections in seconds whose true demand was under the limit: the
        // 10 of second 2, not the flood's (seconds 5 to 28).
        assert_eq!(a.false_rejections, 10);
        // Each second of the steady part as a bucket: 130 and 70.
        assert!((a.oscillation_p2p_1s.unwrap() - 0.6).abs() < 1e-12);
        // Buckets aligned at 0 s: the first holds the onset, 4 × 50 + 40 + 1000.
        assert_eq!(
            a.peak_6s_ratio,
            Some((4.0 * 50.0 + 40.0 + 1000.0) / 6.0 / 100.0)
        );
    }

    #[test]
    fn unlimited_pairs_have_no_ratios() {
        let mut s = series(&[10, 10], &[10, 10], vec![]);
        s.limit = None;
        let a = summary_of(&[s]);
        assert_eq!(
            (a.steady_admitted_ratio, a.reaction_s, a.release_s),
            (None, None, None)
        );
        assert_eq!((a.attempted, a.admitted), (20, 20));
    }

    /// Two traffic items of one (account, op), on different agents, are one
    /// record: their seconds and true demands add up, and its factor is
    /// positive while either item's is.
    #[test]
    fn traffic_items_of_one_pair_are_one_record() {
        // Each item at 60/s against a limit of 100: together over it.
        let a = series_of(
            &[(0.0, 60.0)],
            &[60; 4],
            &[60, 50, 50, 50],
            vec![(1.0, true), (3.5, false)],
        );
        let b = series_of(
            &[(0.0, 60.0)],
            &[60; 4],
            &[60, 50, 50, 50],
            vec![(1.2, true), (3.0, false)],
        );
        let merged = &pairs(&[a, b])[0];
        assert_eq!(
            merged.seconds,
            vec![(120, 120), (120, 100), (120, 100), (120, 100)]
        );
        assert_eq!(merged.demand, vec![120.0; 4]);
        assert_eq!(merged.factor_changes, vec![(1.0, true), (3.5, false)]);
        let summary = account(merged);
        assert_eq!((summary.attempted, summary.admitted), (480, 420));
        // Over the limit all along: none of its refusals is false.
        assert_eq!(summary.false_rejections, 0);
        assert_eq!(summary.over_admitted, 20);
    }

    /// Publishers of one account: the worst 10 s bucket of the steady part
    /// where one kept a share unlike the pair's.
    #[test]
    fn fairness_is_the_worst_publishers_share_against_the_pairs() {
        // 40 s of overload at 2 × 150 against 100: steady part 10..40,
        // three 10 s buckets. A keeps 60/150 throughout; B keeps 40 of 150
        // in the second bucket and 60 elsewhere.
        let a = series_of(&[(0.0, 150.0)], &[150; 40], &[60; 40], vec![]);
        let mut b_admitted = [60u64; 40];
        b_admitted[20..30].fill(40);
        let b = series_of(&[(0.0, 150.0)], &[150; 40], &b_admitted, vec![]);
        let summary = account(&pairs(&[a, b])[0]);
        // Second bucket: the pair keeps 100/300; A 60/150 = 1.2 of it.
        let fairness = summary.fairness_10s.unwrap();
        assert!((fairness - 0.2).abs() < 1e-12, "{fairness}");
        // One item alone has no fairness figure.
        let alone = series_of(&[(0.0, 150.0)], &[150; 40], &[60; 40], vec![]);
        assert_eq!(summary_of(&[alone]).fairness_10s, None);
    }
}
