//! Which masters an agent routes to: the configured members, less those that
//! stopped answering.
//!
//! A master that fails `fail_after` rollups in a row is taken off the live
//! ring, so its accounts move to their next owners (consistent hashing moves
//! nothing else). It is probed while down, with exponential backoff and a
//! per-agent jitter so a fleet of agents does not probe in step, and is put
//! back on the ring as soon as it answers: its accounts move back.
//!
//! ```
//! use std::time::Duration;
//! use damper_core::membership::{HealthConfig, Membership};
//! use damper_core::time::Nanos;
//!
//! let mut m = Membership::new(["m1:7070", "m2:7070"], HealthConfig::default(), 7);
//! let t = Nanos::from_secs(1_800_000_000);
//! assert_eq!(m.live().members().count(), 2);
//! m.failed("m1:7070", t);
//! m.failed("m1:7070", t); // two in a row: down
//! assert_eq!(m.live().members().collect::<Vec<_>>(), ["m2:7070"]);
//! let probe_at = m.next_probe("m1:7070").unwrap();
//! assert!(m.probes_due(probe_at).contains(&"m1:7070".to_string()));
//! // It answers a probe: it started 1 s ago, so it rejoins at start + 1.5 s
//! // (on the 2-s rollup grid).
//! let started = probe_at - Duration::from_secs(1);
//! m.answered("m1:7070", Some(started), probe_at);
//! assert_eq!(m.live().members().count(), 1);
//! m.tick(probe_at + Duration::from_millis(2_500));
//! assert_eq!(m.live().members().count(), 2);
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use crate::ring::Ring;
use crate::time::Nanos;

fn align_up(t: Nanos, grid: Duration) -> Nanos {
    let g = u64::try_from(grid.as_nanos()).unwrap_or(u64::MAX).max(1);
    Nanos::from_nanos(t.as_nanos().div_ceil(g).saturating_mul(g))
}

/// When a master counts as down, and how it is probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthConfig {
    /// Failed rollups in a row that take a master off the ring. Default 2:
    /// one failure can be a blip; two at 2 s intervals is an outage.
    pub fail_after: u32,
    /// First probe delay after a master goes down. Default 500 ms.
    pub probe_initial: Duration,
    /// Longest delay between probes. Default 1 s, so that every agent
    /// notices a master is back within the warm-up, and a partition's heal
    /// within a second or so. A probe is one small `Factors` call that
    /// counts nothing: a thousand agents probing a dead master send it a
    /// thousand connection attempts a second.
    pub probe_max: Duration,
    /// How long after a master (re)starts agents route to it again. Every
    /// agent rejoins it at the same instant, `started + warmup` rounded up to
    /// the rejoin grid, so its accounts move back at once instead of agent
    /// by agent (a split view halves what each master sees, which lets a
    /// flood through). Longer than `probe_max` plus its jitter (25%).
    /// Default 1.5 s: a restarted master is routed to again 1.5–1.7 s after
    /// it started on the 200-ms grid of fast onset, 1.5–3.5 s on the rollup
    /// grid.
    pub warmup: Duration,
    /// The rollup interval. Default 2 s.
    pub rollup_interval: Duration,
    /// The grid rejoins are aligned to: `None`, the rollup interval's, so
    /// accounts move at a cut and the next round tells the master all; the
    /// agent round sets the surge sub-window's when fast onset is on, since
    /// then joins tell the master the moved pairs' rates at once, and a
    /// restarted master need not wait up to a round for its accounts.
    pub rejoin_grid: Option<Duration>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            fail_after: 2,
            probe_initial: Duration::from_millis(500),
            probe_max: Duration::from_secs(1),
            warmup: Duration::from_millis(1_500),
            rollup_interval: crate::DEFAULT_ROLLUP_INTERVAL,
            rejoin_grid: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Health {
    Up {
        failures: u32,
    },
    Down {
        next_probe: Nanos,
        backoff: Duration,
    },
    /// Answering again; back on the ring at `at`.
    Rejoining {
        at: Nanos,
    },
}

impl Health {
    /// Just gone down at `now`: probed after the first backoff, `jitter`ed.
    fn down(now: Nanos, config: &HealthConfig, jitter: f64) -> Health {
        let backoff = config.probe_initial;
        Health::Down {
            next_probe: now + backoff.mul_f64(jitter),
            backoff,
        }
    }
}

/// The configured masters, their health, and the live ring.
#[derive(Clone, Debug)]
pub struct Membership {
    config: HealthConfig,
    health: BTreeMap<String, Health>,
    live: Ring,
    /// Per-agent seed of the probe jitter.
    seed: u64,
    probes: u64,
}

impl Membership {
    /// All of `members` up. `seed` varies the probe jitter between agents.
    pub fn new<S: AsRef<str>>(
        members: impl IntoIterator<Item = S>,
        config: HealthConfig,
        seed: u64,
    ) -> Membership {
        let mut m = Membership {
            config,
            health: BTreeMap::new(),
            live: Ring::new(Vec::<String>::new()),
            seed,
            probes: 0,
        };
        m.set_members(members);
        m
    }

    /// Replaces the configured members (a DNS answer, say). Members already
    /// known keep their health; new ones start up. Returns whether the live
    /// ring changed.
    pub fn set_members<S: AsRef<str>>(&mut self, members: impl IntoIterator<Item = S>) -> bool {
        let mut health = BTreeMap::new();
        for m in members {
            let m = m.as_ref().to_string();
            let h = self
                .health
                .get(&m)
                .copied()
                .unwrap_or(Health::Up { failures: 0 });
            health.insert(m, h);
        }
        self.health = health;
        self.rebuild()
    }

    /// The ring of the masters currently up: route by this.
    pub fn live(&self) -> &Ring {
        &self.live
    }

    /// Every configured master, up or down.
    pub fn members(&self) -> impl Iterator<Item = &str> {
        self.health.keys().map(String::as_str)
    }

    /// Whether `member` is configured and up.
    pub fn is_up(&self, member: &str) -> bool {
        matches!(self.health.get(member), Some(Health::Up { .. }))
    }

    /// When `member`, if down, is next probed.
    pub fn next_probe(&self, member: &str) -> Option<Nanos> {
        match self.health.get(member) {
            Some(Health::Down { next_probe, .. }) => Some(*next_probe),
            _ => None,
        }
    }

    /// When the first member answering again rejoins the ring, if any is.
    pub fn next_rejoin(&self) -> Option<Nanos> {
        self.health
            .values()
            .filter_map(|h| match h {
                Health::Rejoining { at } => Some(*at),
                _ => None,
            })
            .min()
    }

    /// When the first down member's probe is due, if any is down.
    pub fn next_probe_due(&self) -> Option<Nanos> {
        self.health
            .values()
            .filter_map(|h| match h {
                Health::Down { next_probe, .. } => Some(*next_probe),
                _ => None,
            })
            .min()
    }

    /// A rollup to `member` succeeded. Returns whether the live ring changed.
    pub fn succeeded(&mut self, member: &str, now: Nanos) -> bool {
        self.answered(member, None, now)
    }

    /// `member` answered, and said it started at `started`, if known (a
    /// probe's answer). A member that was down rejoins the ring at
    /// `started + warmup`, on the rejoin grid, like every other agent that
    /// saw it come back; without `started`, at once. Returns whether the live
    /// ring changed.
    pub fn answered(&mut self, member: &str, started: Option<Nanos>, now: Nanos) -> bool {
        let config = self.config;
        let changed = match self.health.get_mut(member) {
            Some(h @ Health::Down { .. }) => {
                let grid = config.rejoin_grid.unwrap_or(config.rollup_interval);
                let at = started.map_or(now, |s| align_up(s + config.warmup, grid));
                *h = Health::Rejoining { at };
                false
            }
            Some(Health::Up { failures }) => {
                *failures = 0;
                false
            }
            _ => false,
        };
        changed | self.tick(now)
    }

    /// Puts back on the ring the members whose rejoin time has come. Call
    /// at every rollup cut, and at [`next_rejoin`](Self::next_rejoin).
    /// Returns whether the live ring changed.
    pub fn tick(&mut self, now: Nanos) -> bool {
        let mut promoted = false;
        for h in self.health.values_mut() {
            if let Health::Rejoining { at } = h
                && *at <= now
            {
                *h = Health::Up { failures: 0 };
                promoted = true;
            }
        }
        promoted && self.rebuild()
    }

    /// A rollup or probe to `member` failed. After `fail_after` in a row it
    /// goes down; a failed probe doubles the wait for the next one. Returns
    /// whether the live ring changed.
    pub fn failed(&mut self, member: &str, now: Nanos) -> bool {
        let config = self.config;
        let jitter = self.jitter();
        let Some(h) = self.health.get_mut(member) else {
            return false;
        };
        match h {
            Health::Up { failures } => {
                *failures += 1;
                if *failures < config.fail_after.max(1) {
                    return false;
                }
                *h = Health::down(now, &config, jitter);
                self.rebuild()
            }
            Health::Down {
                next_probe,
                backoff,
            } => {
                *backoff = (*backoff * 2).min(config.probe_max);
                *next_probe = now + backoff.mul_f64(jitter);
                false
            }
            Health::Rejoining { .. } => {
                // Gone again before it rejoined.
                *h = Health::down(now, &config, jitter);
                false
            }
        }
    }

    /// A request to `member` was refused: nothing listens at its address
    /// (a refused connection), so the master process is not running. Unlike
    /// a timeout this is certain, and it goes down at once rather than
    /// after `fail_after` rounds. Returns whether the live ring changed.
    pub fn refused(&mut self, member: &str, now: Nanos) -> bool {
        let config = self.config;
        let jitter = self.jitter();
        match self.health.get_mut(member) {
            Some(h @ (Health::Up { .. } | Health::Rejoining { .. })) => {
                let was_up = matches!(h, Health::Up { .. });
                *h = Health::down(now, &config, jitter);
                was_up && self.rebuild()
            }
            _ => false,
        }
    }

    /// A master said it received counts it does not own under its view of
    /// the ring: this agent's view differs, most likely because it still has
    /// down a master the others see up. Brings every down member's next
    /// probe forward to within `within` of `now` (jittered) and resets its
    /// backoff, so the views agree again within an interval or two instead
    /// of a full backoff. Returns how many probes were brought forward.
    pub fn hasten_probes(&mut self, now: Nanos, within: Duration) -> usize {
        let initial = self.config.probe_initial;
        let mut hastened = 0;
        let jitter = self.jitter();
        for h in self.health.values_mut() {
            if let Health::Down {
                next_probe,
                backoff,
            } = h
            {
                let soon = now + within.mul_f64(jitter);
                if *next_probe > soon {
                    *next_probe = soon;
                    hastened += 1;
                }
                *backoff = initial;
            }
        }
        hastened
    }

    /// The down members whose probe is due at `now`. Each is scheduled for
    /// its next probe at once, so a probe that never returns is not sent
    /// again before then.
    pub fn probes_due(&mut self, now: Nanos) -> Vec<String> {
        let mut due = Vec::new();
        let jitter = self.jitter();
        for (m, h) in &mut self.health {
            if let Health::Down {
                next_probe,
                backoff,
            } = h
                && *next_probe <= now
            {
                *next_probe = now + backoff.mul_f64(jitter);
                due.push(m.clone());
            }
        }
        due
    }

    /// A factor in [0.75, 1.25), different for each agent and each use:
    /// spreads the probes of many agents over time.
    fn jitter(&mut self) -> f64 {
        self.probes = self.probes.wrapping_add(1);
        let mut x = self.seed ^ self.probes.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        0.75 + (x >> 11) as f64 / (1u64 << 53) as f64 * 0.5
    }

    fn rebuild(&mut self) -> bool {
        let up: Vec<&String> = self
            .health
            .iter()
            .filter(|(_, h)| matches!(h, Health::Up { .. }))
            .map(|(m, _)| m)
            .collect();
        let ring = Ring::new(up);
        let changed = ring.version() != self.live.version();
        self.live = ring;
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Nanos {
        Nanos::from_millis(1_800_000_000_000 + ms)
    }

    #[test]
    fn a_master_goes_down_after_failures_in_a_row_and_its_accounts_move() {
        let mut m = Membership::new(["a:1", "b:1", "c:1"], HealthConfig::default(), 1);
        let before: Vec<(String, String)> = (0..3000)
            .map(|i| {
                let acct = format!("acct-{i}");
                let owner = m.live().owner(&acct).unwrap().to_string();
                (acct, owner)
            })
            .collect();
        assert!(!m.failed("b:1", t(0)), "one failure is a blip");
        assert!(!m.succeeded("b:1", t(1)) && m.is_up("b:1"));
        assert!(!m.failed("b:1", t(2)));
        assert!(m.failed("b:1", t(3)), "two in a row: off the ring");
        assert!(!m.is_up("b:1"));
        for (acct, owner) in &before {
            let now = m.live().owner(acct).unwrap();
            if owner == "b:1" {
                assert_ne!(now, "b:1");
            } else {
                assert_eq!(now, owner, "{acct} moved off a live master");
            }
        }
        // Back up (no start time known: at once): every account returns.
        assert!(m.answered("b:1", None, t(5)));
        for (acct, owner) in &before {
            assert_eq!(m.live().owner(acct).unwrap(), owner);
        }
    }

    #[test]
    fn probes_back_off_with_jitter_up_to_the_maximum() {
        let config = HealthConfig::default();
        let mut m = Membership::new(["a:1", "b:1"], config, 42);
        m.failed("a:1", t(0));
        m.failed("a:1", t(0));
        let mut now = t(0);
        let mut waits = Vec::new();
        for _ in 0..12 {
            let next = m.next_probe("a:1").unwrap();
            waits.push(next.since(now));
            assert!(m.probes_due(now).is_empty() || next <= now);
            now = next;
            assert_eq!(m.probes_due(now), vec!["a:1".to_string()]);
            m.failed("a:1", now); // the probe fails too
        }
        // Doubling from 500 ms (± 25%) to at most 1 s (± 25%).
        assert!(
            waits[0] >= Duration::from_millis(375) && waits[0] < Duration::from_millis(625),
            "{waits:?}"
        );
        assert!(waits[2] > waits[0], "{waits:?}");
        assert!(
            waits.iter().all(|w| *w < Duration::from_millis(1_250)),
            "{waits:?}"
        );
        assert!(
            waits.last().unwrap() >= &Duration::from_millis(750),
            "{waits:?}"
        );
    }

    #[test]
    fn agents_that_see_a_master_return_at_different_times_rejoin_it_together() {
        let started = t(100_300);
        let mut rejoined = Vec::new();
        for (seed, seen_at) in [(1, t(100_400)), (2, t(100_900)), (3, t(101_700))] {
            let mut m = Membership::new(["a:1", "b:1"], HealthConfig::default(), seed);
            m.failed("a:1", t(0));
            m.failed("a:1", t(0));
            m.answered("a:1", Some(started), seen_at);
            assert!(!m.is_up("a:1"), "not before the common instant");
            // The common instant: 100.3 s + 1.5 s, up to the 2 s grid = 102 s.
            assert!(!m.tick(t(101_999)));
            assert!(m.tick(t(102_000)));
            rejoined.push(m.live().version());
        }
        assert!(rejoined.windows(2).all(|w| w[0] == w[1]));
        // An agent that only finds out later rejoins at once.
        let mut late = Membership::new(["a:1", "b:1"], HealthConfig::default(), 4);
        late.failed("a:1", t(0));
        late.failed("a:1", t(0));
        assert!(late.answered("a:1", Some(started), t(102_500)));
        // Dying again while rejoining sends it back to probing.
        let mut m = Membership::new(["a:1", "b:1"], HealthConfig::default(), 5);
        m.failed("a:1", t(0));
        m.failed("a:1", t(0));
        m.answered("a:1", Some(started), t(101_000));
        m.failed("a:1", t(102_000));
        assert!(m.next_probe("a:1").is_some());
        assert!(!m.tick(t(200_000)));
    }

    #[test]
    fn on_a_finer_rejoin_grid_a_restarted_master_is_back_within_two_seconds() {
        let config = HealthConfig {
            rejoin_grid: Some(Duration::from_millis(200)),
            ..HealthConfig::default()
        };
        let started = t(100_300);
        let mut m = Membership::new(["a:1", "b:1"], config, 1);
        m.failed("a:1", t(0));
        m.failed("a:1", t(0));
        m.answered("a:1", Some(started), t(100_900));
        // 100.3 s + 1.5 s, up to the 200-ms grid: 101.8 s, not 102 s.
        assert_eq!(m.next_rejoin(), Some(t(101_800)));
        assert!(!m.tick(t(101_799)));
        assert!(m.tick(t(101_800)));
        assert_eq!(m.next_rejoin(), None);
    }

    #[test]
    fn a_hint_that_views_differ_brings_probes_forward_and_resets_backoff() {
        let mut m = Membership::new(["a:1", "b:1"], HealthConfig::default(), 7);
        m.failed("a:1", t(0));
        m.failed("a:1", t(0));
        // Backed off to 8 s.
        for _ in 0..5 {
            let next = m.next_probe("a:1").unwrap();
            m.probes_due(next);
            m.failed("a:1", next);
        }
        let now = m.next_probe("a:1").unwrap() - Duration::from_secs(5);
        assert_eq!(m.hasten_probes(now, Duration::from_secs(2)), 1);
        let next = m.next_probe("a:1").unwrap();
        assert!(
            next.since(now) < Duration::from_millis(2_500),
            "{:?}",
            next.since(now)
        );
        // Already soon: not pushed back, not counted.
        assert_eq!(m.hasten_probes(now, Duration::from_secs(2)), 0);
        assert_eq!(m.next_probe("a:1"), Some(next));
        // The backoff starts again from 1 s.
        m.probes_due(next);
        m.failed("a:1", next);
        let wait = m.next_probe("a:1").unwrap().since(next);
        assert!(wait < Duration::from_millis(2_600), "{wait:?}");
        // Up members are untouched.
        assert!(m.is_up("b:1"));
    }

    #[test]
    fn agents_probe_out_of_step() {
        let firsts: Vec<Nanos> = (0..50)
            .map(|seed| {
                let mut m = Membership::new(["a:1", "b:1"], HealthConfig::default(), seed);
                m.failed("a:1", t(0));
                m.failed("a:1", t(0));
                m.next_probe("a:1").unwrap()
            })
            .collect();
        let distinct: std::collections::BTreeSet<_> = firsts.iter().collect();
        assert!(distinct.len() > 40, "probes bunch up");
    }

    #[test]
    fn new_member_lists_keep_known_health() {
        let mut m = Membership::new(["a:1", "b:1"], HealthConfig::default(), 1);
        m.failed("a:1", t(0));
        m.failed("a:1", t(0));
        assert!(!m.set_members(["a:1", "b:1"]), "same list, same ring");
        assert!(!m.is_up("a:1"));
        assert!(m.set_members(["a:1", "b:1", "c:1"]));
        assert!(m.is_up("c:1") && !m.is_up("a:1"));
        assert_eq!(m.live().members().collect::<Vec<_>>(), ["b:1", "c:1"]);
        // All down: an empty live ring (the agent carries counts and fails open).
        let mut solo = Membership::new(["a:1"], HealthConfig::default(), 1);
        solo.failed("a:1", t(0));
        solo.failed("a:1", t(0));
        assert!(solo.live().is_empty());
    }
}
