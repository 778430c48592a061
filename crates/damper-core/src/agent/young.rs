//! Young pairs: an (account, op) a `check` has just created is measured
//! from the moment the round first sees it, a few times within its first
//! sub-window, and reported early as soon as its own rate proves a surge
//! ([`AgentState::peek_young`]).
//!
//! Why: a new account that arrives as a deluge (the README's quickstart:
//! an account at 10× its limit from its first operation, spread over
//! four agents) is otherwise first reported at the next peek or scan of
//! the sub-window grid, 0–100 ms after it began, with a rate measured
//! over a span it filled only in part. Its first second then admits
//! 1.3–2.2× the limit, depending on where on the grid it began. Measured
//! on its own, its rate is known within a few tens of operations.
//!
//! Only pairs a `check` creates are young (a reply or an undrain that
//! creates one brings no traffic), at most [`MAX_YOUNG`] at a time (the
//! rest wait for the grid, as every pair did before), and each for one
//! sub-window: after that the grid's scans measure it whole. A deluge's
//! pair, reported and suppressed, is measured on from its start for
//! [`YOUNG_SPAN`], since the master's estimate stands on what it was told
//! until a whole round replaces it, seconds later. The round's
//! driver is told of the first young pair by the hook
//! ([`AgentState::with_young_hook`]) and wakes the round at once, so no
//! round wakes on a finer grid when nothing is new.

use std::sync::Arc;
use std::time::Duration;

use compact_str::CompactString;

use super::AgentState;
use super::entry::YOUNG_REPORTED;
use super::surge::{SurgeRule, counting_noise};
use crate::Pair;
use crate::time::Nanos;
use crate::wire::SurgeRates;

/// How long after the round first sees a young pair, and after each peek
/// that found nothing, it is peeked at: long enough to hold some tens of
/// operations of a deluge (50 at 2 500/s), short against a sub-window
/// (200 ms).
pub const YOUNG_PEEK_AFTER: Duration = Duration::from_millis(20);

/// The most young pairs held at once. A node that sees thousands of new
/// accounts a second keeps the first ones; the others are found by the
/// grid's scans, as every pair was before. Bounds the list, and the work
/// on an insert, when no round drains it (a library used without one).
pub const MAX_YOUNG: usize = 256;

/// How far a young pair's rate must differ from what its last young
/// report said to be reported again: a first report at a few tens of
/// operations is ±14% (50 operations, one standard deviation), and the
/// master's estimate stands on it until the next round is whole, seconds
/// later; any better measure is worth its one request, but not a change
/// within the rounds' own precision.
const RESAY: f64 = 0.02;

/// How long a young pair that was reported is measured on from its start
/// while its master suppresses it, peeked at each time its age doubles
/// (one sub-window, then two, four, eight). Its first reports come from a
/// sub-window's worth of operations at most (±5% at 2 500/s, one
/// standard deviation) and the master's estimate stands on them until the
/// first round wholly after the deluge began is whole, 2–4 s later: a
/// README quickstart run's master held its 10 000/s at 9 107 until then,
/// and the run admitted 1.10× the limit for two seconds (others 1.18×,
/// 0.85× and 0.79×). Measured over 1.6 s, the same deluge is ±1.8%.
pub const YOUNG_SPAN: Duration = Duration::from_millis(1_600);

/// One young pair.
#[derive(Debug)]
pub(super) struct YoungPair {
    op: Arc<str>,
    account: CompactString,
    /// When the round first saw it, and its attempted cost and operations
    /// then: its rate is measured from there (what came before, the
    /// operations that created it among them, is left out, so a batch of
    /// operations at its birth does not read as a rate). `None` until
    /// then.
    start: Option<(Nanos, u32, u32)>,
    /// When it is next peeked at; its birth until the round has seen it.
    due: Nanos,
    /// The rate its last young report said, `f32` bits; `None` before one.
    reported: Option<u32>,
}

impl AgentState {
    /// Calls `hook` (from the thread of the `check` that created it) when
    /// a young pair arrives and none was waiting: the round's driver wakes
    /// the round, whose [`peek_young`](Self::peek_young) then starts
    /// measuring it. Off `check`'s path for a known key; never called
    /// with a lock held.
    pub fn with_young_hook(mut self, hook: impl Fn() + Send + Sync + 'static) -> AgentState {
        self.young_hook = Some(Box::new(hook));
        self
    }

    /// Records a pair a `check` just created at `now`.
    pub(super) fn note_young(&self, now: Nanos, op: &Arc<str>, account: &str) {
        if !(self.config.fast_onset && self.config.young_peeks) {
            return;
        }
        let first = {
            let mut young = self.young.lock().unwrap_or_else(|e| e.into_inner());
            if young.len() >= MAX_YOUNG {
                return;
            }
            young.push(YoungPair {
                op: op.clone(),
                account: account.into(),
                start: None,
                due: now,
                reported: None,
            });
            young.len() == 1
        };
        if first && let Some(hook) = &self.young_hook {
            hook();
        }
    }

    /// When the earliest young pair is due a peek (at once for one the
    /// round has not seen yet); `None` when there is none.
    pub fn young_due(&self) -> Option<Nanos> {
        let young = self.young.lock().unwrap_or_else(|e| e.into_inner());
        earliest_due(&young)
    }

    /// Peeks at the young pairs due at `now`. One seen for the first time
    /// starts being measured, and is peeked at [`YOUNG_PEEK_AFTER`] later.
    /// Then its rate since is judged by `rule` against nothing (the
    /// master has none of it) with the noise of counting its operations,
    /// and a surge is offered to `report` as [`AgentState::scan_surges`]
    /// does (a pair it takes has that rate as its baseline).
    ///
    /// A pair reported is peeked at again at twice the age of its
    /// measure, which then holds twice the operations, and offered again
    /// (as a follow-up of its report) unless it is within 2% of what was
    /// said: the first report may be a tenth off, and the master's
    /// estimate stands on it until the next round is whole.
    ///
    /// A pair is young for one sub-window of `rule`, and its reports
    /// rest on that much at most; one that was reported (by a peek or by
    /// the grid's scans, which judge its first sub-window once they have)
    /// and that its master still suppresses on what was said is measured
    /// on from its start for [`YOUNG_SPAN`], peeked at as its age doubles
    /// and told again when more than 2% off what was said last. Pairs
    /// gone or unlimited leave at once, the rest when their time is up.
    /// Returns when the earliest young pair left is due (as
    /// [`young_due`](Self::young_due) would say after it).
    pub fn peek_young(
        &self,
        now: Nanos,
        rule: &SurgeRule,
        mut report: impl FnMut(Pair<'_>, SurgeRates) -> bool,
    ) -> Option<Nanos> {
        let mut young = {
            let mut held = self.young.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut *held)
        };
        if young.is_empty() {
            return None;
        }
        let round = self.report_round(now);
        let op_limits = self.op_default_limits();
        let pinned = self.pairs.pin();
        young.retain_mut(|pair| {
            if now < pair.due {
                return true;
            }
            let Some(entry) = pinned.find(&pair.account, &pair.op) else {
                return false;
            };
            let Some((start, base, ops_base)) = pair.start else {
                let (total, ops) = entry.attempted();
                pair.start = Some((now, total, ops));
                pair.due = now + YOUNG_PEEK_AFTER;
                return true;
            };
            let age = now.since(start);
            let (baseline, surged) = entry.told_rate(round);
            let ours = pair.reported == Some(entry.told_early_rate().to_bits());
            let grown = age >= rule.window();
            if pair.due > start + YOUNG_SPAN {
                // Measured over its whole span at the last peek.
                return false;
            }
            if !grown && surged && !ours {
                // The grid's scans reported it: they judge its first
                // sub-window; from there it is measured on (below).
                pair.due = start + rule.window();
                return true;
            }
            // Past its first sub-window, a pair measured on: one that was
            // reported, by a peek or by the scans, and that its master
            // still suppresses on what was said; against the last said.
            let measured_on = surged && entry.master_factor_at(now) != 0;
            if grown && !measured_on {
                return false;
            }
            let Some(limit) = entry.scan_limit(|| &pair.op, &op_limits) else {
                return false;
            };
            let secs = age.as_secs_f64();
            let (total, ops) = entry.attempted();
            let cost = u64::from(total.wrapping_sub(base));
            let rate = cost as f64 / secs;
            if grown && !holds_steady(entry, rate, rule.window()) {
                // Its traffic moved since: its mean since its start lags,
                // and the grid's scans judge the change.
                return false;
            }
            let follow_up = pair.reported.is_some() || grown;
            let again = if follow_up {
                (rate - f64::from(baseline)).abs() > RESAY * f64::from(baseline)
            } else {
                let noise = counting_noise(entry.rise_cost(), f64::from(baseline), secs);
                rule.is_surge(rate, f64::from(baseline), false, limit, noise)
            };
            // A reported pair waits for twice the operations, within its
            // first sub-window and then over its span; one that is not is
            // looked at again soon.
            let next = |reported: bool| {
                if !reported {
                    now + YOUNG_PEEK_AFTER
                } else if !grown {
                    (start + age * 2).min(start + rule.window())
                } else if age < YOUNG_SPAN {
                    (start + age * 2).min(start + YOUNG_SPAN)
                } else {
                    // Past its span: it leaves at the next peek.
                    now + YOUNG_PEEK_AFTER
                }
            };
            let ops = super::counter::ops_between(ops_base, ops);
            let rates = entry.rise_report(rate, (baseline, surged), (cost, ops), age);
            // Not taken: its master is busy with another early report.
            if !again || !report(Pair::new(&pair.account, &pair.op), rates) {
                pair.due = next(follow_up);
                return true;
            }
            entry.told_early(rates.rate, round, Some(super::surge::rise_counted(&rates)));
            if !grown {
                // The sub-window the next scan closes began before it.
                entry.set_scanned(YOUNG_REPORTED, true);
            }
            pair.reported = Some(rates.rate.to_bits());
            pair.due = next(true);
            true
        });
        drop(pinned);
        let mut held = self.young.lock().unwrap_or_else(|e| e.into_inner());
        // Pairs that arrived meanwhile are kept, after these, within the
        // bound (they saw the list empty while it was taken).
        young.append(&mut held);
        young.truncate(MAX_YOUNG);
        *held = young;
        earliest_due(&held)
    }
}

/// How far the last sub-window's rate may stray from a pair's mean since
/// its start, as a share of the mean, for the mean to still be its rate:
/// a deluge's sub-windows stray by a few percent (2 500/s: ±4.5%), one
/// that stopped or doubled by far more.
const STEADY_SHARE: f64 = 0.25;

/// Whether `entry`'s last closed sub-window (`window` long) ran at `mean`,
/// within [`STEADY_SHARE`] of it or four times the noise of counting its
/// operations, whichever is more.
fn holds_steady(entry: &super::entry::Entry, mean: f64, window: Duration) -> bool {
    let noise = counting_noise(entry.op_cost(), mean, window.as_secs_f64());
    (entry.last_window_rate() - mean).abs() <= (STEADY_SHARE * mean).max(4.0 * noise)
}

/// When the earliest of `young` is due a peek.
fn earliest_due(young: &[YoungPair]) -> Option<Nanos> {
    young.iter().map(|p| p.due).min()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;
    use crate::agent::AgentConfig;
    use crate::wire::{OpVerdicts, Reply, Unlisted};

    const T0: Nanos = Nanos::from_secs(1_800_000_000);

    fn at(ms: u64) -> Nanos {
        T0 + Duration::from_millis(ms)
    }

    fn rule() -> SurgeRule {
        SurgeRule::default_for(Duration::from_secs(2))
    }

    /// An agent that knows the op's default limit, 1 000/s, as a hello
    /// would have taught it.
    fn learned(config: AgentConfig) -> AgentState {
        let agent = AgentState::new(config);
        let mut hello = Reply::default();
        hello.ops.push(OpVerdicts {
            op: "messages".into(),
            listed: Vec::new(),
            unlisted: Some(Unlisted {
                limit: 1_000.0,
                valid_for: Duration::from_secs(6),
                shadow: false,
            }),
            overrides: Vec::new(),
        });
        agent.learn_hello(&hello);
        agent
    }

    /// `per_ms` operations of cost 1 at each millisecond of `[from, to)`.
    fn traffic(agent: &AgentState, account: &str, from: u64, to: u64, per_ms: u64) {
        let mut rng = SmallRng::seed_from_u64(from);
        for ms in from..to {
            agent.check_batch(at(ms), account, "messages", 1, per_ms, &mut rng);
        }
    }

    fn peek(agent: &AgentState, ms: u64) -> Vec<(String, SurgeRates)> {
        let mut taken = Vec::new();
        agent.peek_young(at(ms), &rule(), |pair, rates| {
            taken.push((pair.account.to_owned(), rates));
            true
        });
        taken
    }

    /// What the grid's scan closing the sub-window `[from, to)` reports.
    fn scan(agent: &AgentState, from: u64, to: u64) -> Vec<SurgeRates> {
        let mut taken = Vec::new();
        agent.scan_surges(at(from), at(to), &rule(), |_, rates| {
            taken.push(rates);
            true
        });
        taken
    }

    /// An agent whose new account `flood` began at 3 000/s, was told to
    /// its master 20 ms after the round first saw it (at 1 ms), and
    /// suppressed by 0.6 at once.
    fn told_and_suppressed() -> AgentState {
        let agent = learned(AgentConfig::default());
        traffic(&agent, "flood", 0, 1, 3);
        assert_eq!(peek(&agent, 1), vec![]);
        traffic(&agent, "flood", 1, 21, 3);
        assert_eq!(peek(&agent, 21).len(), 1, "3 000/s, told");
        let suppressed = Duration::from_secs(6);
        agent.apply(at(21), "flood", "messages", 0.6, 1_000.0, suppressed);
        agent
    }

    /// A new account flooding at 3 000/s is reported 20 ms after the round
    /// first sees it, at its rate since then (the operations that created
    /// it left out), and told once more at twice that age when the rate
    /// has moved; the round's driver is woken for the first young pair
    /// only.
    #[test]
    fn a_new_flood_is_reported_within_its_first_tens_of_operations() {
        let woken = std::sync::Arc::new(AtomicUsize::new(0));
        let hook = woken.clone();
        let agent = learned(AgentConfig::default()).with_young_hook(move || {
            hook.fetch_add(1, SeqCst);
        });
        traffic(&agent, "flood", 0, 1, 500);
        traffic(&agent, "other", 0, 1, 1);
        assert_eq!(woken.load(SeqCst), 1, "woken once, for the first");
        assert_eq!(agent.young_due(), Some(at(0)), "due at once: not seen yet");
        // The round sees them: measuring starts, nothing is reported.
        assert_eq!(peek(&agent, 1), vec![]);
        assert_eq!(agent.young_due(), Some(at(21)));
        traffic(&agent, "flood", 1, 21, 3);
        let taken = peek(&agent, 21);
        let [(account, rates)] = &taken[..] else {
            panic!("{taken:?}")
        };
        assert_eq!(account, "flood");
        assert_eq!(rates.rate, 3_000.0, "60 in 20 ms; the first 500 left out");
        assert_eq!((rates.baseline, rates.surged), (0.0, false));
        assert_eq!(rates.ops, 60, "what it counted, for the master to weigh");
        assert_eq!(
            rates.span,
            Some(Duration::from_millis(20)),
            "and over how long"
        );
        // Measured over 40 ms at 2 000/s since: 100 in 40 ms, 2 500/s, a
        // follow-up of what it said.
        assert_eq!(agent.young_due(), Some(at(41)));
        traffic(&agent, "flood", 21, 41, 2);
        let taken = peek(&agent, 41);
        let [(_, rates)] = &taken[..] else {
            panic!("{taken:?}")
        };
        assert_eq!(
            (rates.rate, rates.baseline, rates.surged),
            (2_500.0, 3_000.0, true)
        );
        // Within 2% of what it said (2 500/s on): not told again. At a
        // sub-window's age it leaves the young (the grid's scans measure
        // it whole).
        let mut rng = SmallRng::seed_from_u64(2);
        let mut at_2_500 = |from: u64, to: u64| {
            for ms in from..to {
                let n = 2 + ms % 2;
                agent.check_batch(at(ms), "flood", "messages", 1, n, &mut rng);
            }
        };
        at_2_500(41, 81);
        assert_eq!(peek(&agent, 81), vec![]);
        at_2_500(81, 161);
        assert_eq!(peek(&agent, 161), vec![]);
        at_2_500(161, 201);
        assert_eq!(peek(&agent, 201), vec![]);
        assert_eq!(agent.young_due(), None);
    }

    /// A young pair its master suppresses on what it said is measured on
    /// from its start past its first sub-window, while its traffic holds
    /// steady: peeked at as its age doubles (400, 800, 1 600 ms) and told
    /// again when its rate since the start moved by more than 2% from
    /// what was said; after 1.6 s it leaves the young. The grid's scans
    /// close each sub-window, as the round's do.
    #[test]
    fn a_suppressed_young_pair_is_measured_on_for_more_than_a_sub_window() {
        let agent = told_and_suppressed();
        let scan = |from: u64, to: u64| scan(&agent, from, to);
        let mut rng = SmallRng::seed_from_u64(4);
        let mut at_2_500 = |from: u64, to: u64| {
            for ms in from..to {
                let n = 2 + ms % 2;
                agent.check_batch(at(ms), "flood", "messages", 1, n, &mut rng);
            }
        };
        for (from, to) in [(21, 41), (41, 81), (81, 161)] {
            traffic(&agent, "flood", from, to, 3);
            assert_eq!(peek(&agent, to), vec![], "the same 3 000/s at {to} ms");
        }
        traffic(&agent, "flood", 161, 201, 3);
        assert_eq!(scan(0, 200), vec![], "its first sub-window");
        assert_eq!(peek(&agent, 201), vec![]);
        // Past its sub-window, 2 500/s: looked at when twice as old, and
        // told its mean since its start each time it moved by over 2%.
        let mut told = Vec::new();
        for (peek_at, closes) in [
            (401, [400].as_slice()),
            (801, &[600, 800]),
            (1_601, &[1_000, 1_200, 1_400, 1_600]),
        ] {
            assert_eq!(agent.young_due(), Some(at(peek_at)));
            for &end in closes {
                at_2_500(end - 199, end + 1);
                assert_eq!(
                    scan(end - 200, end),
                    vec![],
                    "no fall of a sixth at {end} ms"
                );
            }
            for (_, rates) in peek(&agent, peek_at) {
                assert!(rates.surged);
                told.push((peek_at, rates.baseline, rates.rate));
            }
        }
        // 1 100 in 400 ms, 2 100 in 800, 4 100 in 1 600.
        assert_eq!(
            told,
            [
                (401, 3_000.0, 2_750.0),
                (801, 2_750.0, 2_625.0),
                (1_601, 2_625.0, 2_562.5)
            ]
        );
        // Measured over its whole span: gone at the next peek.
        assert_eq!(agent.young_due(), Some(at(1_621)));
        assert_eq!(peek(&agent, 1_621), vec![]);
        assert_eq!(agent.young_due(), None);
    }

    /// A young pair measured on leaves once its traffic moves: a flood
    /// that stops is judged by the grid's scans on its sub-windows, not on
    /// a mean since its start that lags (which a peek would tell its
    /// master as the pair's rate).
    #[test]
    fn a_young_pair_whose_flood_stops_is_left_to_the_grid() {
        let agent = told_and_suppressed();
        traffic(&agent, "flood", 21, 200, 3);
        assert_eq!(scan(&agent, 0, 200), vec![]);
        // It stops at 200 ms: the next sub-window is empty, and the young
        // pair's peek at 401 ms (its mean since its start: 1 500/s) tells
        // nothing.
        assert_eq!(scan(&agent, 200, 400), vec![]);
        assert_eq!(peek(&agent, 401), vec![]);
        assert_eq!(agent.young_due(), None);
    }

    /// A new account under the floor of a surge (an eighth of its limit)
    /// is never reported by a young peek, and leaves after a sub-window.
    #[test]
    fn a_new_account_that_is_no_flood_is_left_to_the_grid() {
        let agent = learned(AgentConfig::default());
        traffic(&agent, "calm", 0, 1, 1);
        assert_eq!(peek(&agent, 0), vec![]);
        for ms in (0..200).step_by(20) {
            // 100/s: one operation every 10 ms.
            traffic(&agent, "calm", ms, ms + 20, 0);
            agent.check_batch(
                at(ms + 10),
                "calm",
                "messages",
                1,
                2,
                &mut SmallRng::seed_from_u64(1),
            );
            assert_eq!(peek(&agent, ms + 20), vec![], "at {ms} ms");
        }
        assert_eq!(agent.young_due(), None);
    }

    /// Young pairs are bounded, made by `check` only, and not made at all
    /// with fast onset off.
    #[test]
    fn young_pairs_are_bounded_and_made_by_checks_only() {
        let agent = learned(AgentConfig::default());
        let mut rng = SmallRng::seed_from_u64(3);
        for i in 0..MAX_YOUNG + 10 {
            agent.check(at(0), &format!("a{i}"), "messages", 1, &mut rng);
        }
        assert_eq!(agent.young.lock().unwrap().len(), MAX_YOUNG);
        agent.apply(
            at(0),
            "answered",
            "messages",
            0.5,
            1_000.0,
            Duration::from_secs(6),
        );
        assert_eq!(agent.young.lock().unwrap().len(), MAX_YOUNG);

        let agent = learned(AgentConfig {
            fast_onset: false,
            ..AgentConfig::default()
        });
        agent.check(at(0), "a", "messages", 1, &mut rng);
        assert_eq!(agent.young_due(), None);
    }

    /// The grid's scan that closes the sub-window a young pair was
    /// reported in reads a rate diluted by the time before the pair
    /// existed: it reports no fall of it, though its master suppresses it.
    /// The next sub-window's does.
    #[test]
    fn the_sub_window_of_a_young_report_is_no_fall() {
        let agent = learned(AgentConfig::default());
        let mut rng = SmallRng::seed_from_u64(5);
        let scan = |from: u64, to: u64| scan(&agent, from, to);
        agent.check(at(150), "flood", "messages", 1, &mut rng);
        assert_eq!(peek(&agent, 150), vec![]);
        traffic(&agent, "flood", 150, 170, 3);
        assert_eq!(peek(&agent, 170).len(), 1);
        agent.apply(
            at(171),
            "flood",
            "messages",
            0.7,
            1_000.0,
            Duration::from_secs(6),
        );
        traffic(&agent, "flood", 170, 200, 3);
        assert_eq!(scan(0, 200), vec![], "150 of 600 a second: no fall");
        traffic(&agent, "flood", 200, 400, 3);
        assert_eq!(scan(200, 400), vec![], "its rate, as reported");
        // The flood stops: two empty sub-windows are a fall.
        assert_eq!(scan(400, 600), vec![]);
        let fall = scan(600, 800);
        assert_eq!(fall.len(), 1, "{fall:?}");
        assert!(fall[0].rate < fall[0].baseline);
    }
}
