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
//! sub-window: after that the grid's scans measure it whole. The round's
//! driver is told of the first young pair by the hook
//! ([`AgentState::with_young_hook`]) and wakes the round at once, so no
//! round wakes on a finer grid when nothing is new.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
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

/// One young pair.
#[derive(Debug)]
pub(super) struct YoungPair {
    op: Arc<str>,
    account: CompactString,
    /// When the round first saw it, and its attempted total then: its
    /// rate is measured from there (what came before, the operations
    /// that created it among them, is left out, so a batch of operations
    /// at its birth does not read as a rate). `None` until then.
    start: Option<(Nanos, u64)>,
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
    /// A pair is young for one sub-window of `rule`; pairs gone or
    /// unlimited, and those the grid's scans reported, leave at once.
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
            let Some((start, base)) = pair.start else {
                pair.start = Some((now, entry.attempted_total()));
                pair.due = now + YOUNG_PEEK_AFTER;
                return true;
            };
            let age = now.since(start);
            let (baseline, surged) = entry.told_rate(round);
            let ours = pair.reported == Some(entry.surge_rate.load(Relaxed));
            if age >= rule.window() || (surged && !ours) {
                // Old enough for the grid's scans, or reported by them.
                return false;
            }
            let Some(limit) = entry.scan_limit(&pair.op, &op_limits) else {
                return false;
            };
            let secs = age.as_secs_f64();
            let rate = entry.attempted_total().wrapping_sub(base) as f64 / secs;
            let again = if pair.reported.is_some() {
                (rate - f64::from(baseline)).abs() > RESAY * f64::from(baseline)
            } else {
                let noise = counting_noise(entry.op_cost(), f64::from(baseline), secs);
                rule.is_surge(rate, f64::from(baseline), false, limit, noise)
            };
            // A reported pair waits for twice the operations; one that is
            // not is looked at again soon.
            let next = |reported: bool| {
                if reported {
                    (start + age * 2).min(start + rule.window())
                } else {
                    now + YOUNG_PEEK_AFTER
                }
            };
            let rates = SurgeRates {
                rate: rate as f32,
                baseline,
                surged,
                joined: false,
                ..SurgeRates::default()
            };
            // Not taken: its master is busy with another early report.
            if !again || !report(Pair::new(&pair.account, &pair.op), rates) {
                pair.due = next(pair.reported.is_some());
                return true;
            }
            entry.told_early(rates.rate, round);
            entry.set_scanned(YOUNG_REPORTED, true);
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
        let scan = |from: u64, to: u64| {
            let mut taken = Vec::new();
            agent.scan_surges(at(from), at(to), &rule(), |_, rates| {
                taken.push(rates);
                true
            });
            taken
        };
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
