//! The window's tally of sparse hints: when do agents' hints that a pair's
//! sparse traffic rose, or that a suppressed one's fell (see
//! `damper_core::agent::hint`), come together beyond chance, so that the
//! master polls every agent for the pair.
//!
//! Each agent hints at most once per burst; a rise by chance at most a few
//! times in ten thousand seconds of a pair, a fall about once a minute
//! during a flood (a fall is a run of empty sub-windows, which a flood of
//! one operation per sub-window leaves now and then). A flood spread over
//! many agents makes most of them hint within a few hundred milliseconds
//! of its onset, and of its end. So the tally counts the distinct agents
//! that hinted one way within the last [`HINT_SPAN`] (a span that slides:
//! hints 300 ms before a burst of them count with it), and polls when
//! they are more than the pair's agents would give by chance once in ten
//! thousand such spans ([`hints_needed`]: for rises, two for a handful of
//! agents, three for forty; for falls, six for twenty, eight for forty,
//! and none past about a hundred agents, where the rounds release). A
//! rise polls only when the hinters' rates, were every agent of the pair
//! at them, would be over its limit; a fall only while the pair is
//! suppressed. A poll costs every agent of the pair one early report, so a
//! pair is polled at most once per rollup interval each way.

use std::time::Duration;

use super::DemandWindow;
use crate::agent::poisson_tail;
use crate::config::WindowConfig;
use crate::time::Nanos;

/// How close together hints must come to count together.
pub const HINT_SPAN: Duration = Duration::from_millis(500);

/// Chance rise hints per agent per second of a pair, an upper bound: the
/// agents' test fires by chance about 2.6 times in 10 000 s of a pair at
/// one operation per round (`damper_core::agent::HINT_ALPHA`) when its
/// rate is known, but each agent knows it only from its last round, a
/// count of a few operations, and a round that read low lets chance hint
/// several times as often (seen in the simulator's quiet scenarios: up to
/// 1.6 in 1 000 s).
const HINT_CHANCE_RATE: f64 = 2e-3;

/// Chance fall hints per agent per second of a suppressed pair under
/// `factor`, an upper bound: a run of empty sub-windows that its rate
/// gives once in fifty (`damper_core::agent::FALL_ALPHA`) starts about 0.6
/// times a second at one operation per sub-window, and is that long (four
/// sub-windows) once in 55: 0.011 a second by that model, 0.047 measured
/// in `costly-flood` (its agents' told rates are a round's counts, some of
/// them low), and fewer for sparser pairs; under a deep factor, whose test
/// is looser (`DEEP_FALL_ALPHA`), 0.08 measured. Tied to the agents'
/// threshold, with room over what was measured. An agent may still hold
/// the factor before the master's last: the looser test is assumed a
/// tenth of a factor early.
fn fall_chance_rate(factor: f64) -> f64 {
    3.0 * crate::agent::fall_alpha(factor + 0.1)
}

/// How rarely hints may come together by chance and poll, per span.
const POLL_CHANCE: f64 = 1e-4;

/// The most distinct agents a tally tells apart: past about 120 agents on
/// one pair under a deep factor, or 200 under a mild one, chance falls
/// need more, and are left to the rounds. (At 12, a deep factor's looser
/// fall test would have left them to the rounds past 40 agents.)
const DISTINCT: usize = 24;

/// The hints of one pair within a span, while it stands.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Hints {
    /// Whether the tally's hints are of falls (else rises).
    fall: bool,
    /// The agents that hinted within the span (each a hash of its id; 0
    /// is none), so one agent's repeats count once.
    agents: [u32; DISTINCT],
    /// When each of them last hinted: a hint counts until [`HINT_SPAN`]
    /// after it.
    at: [Nanos; DISTINCT],
    /// The rate each of them last hinted, cost per second.
    rates: [f32; DISTINCT],
    /// No poll on rises, and on falls, before these: the last one is at
    /// most an interval old.
    rise_polled_until: Nanos,
    fall_polled_until: Nanos,
}

/// One agent's sparse hint, as a window weighs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HintFrom {
    /// A hash of the agent's id, to tell agents apart.
    pub agent: u32,
    /// The rate it hinted, cost per second.
    pub rate: f64,
    /// Whether it hints a fall (below what the master holds for it)
    /// rather than a rise.
    pub fall: bool,
}

/// How many distinct agents must hint one way within [`HINT_SPAN`] for a
/// pair with `agents` agents under the master's `factor`: the least count their chance hints reach
/// less than once in ten thousand spans, and at least two; `None` when
/// that is more than a tally tells apart (falls of a pair of many agents).
pub fn hints_needed(agents: u32, fall: bool, factor: f64) -> Option<usize> {
    let per_agent = if fall {
        fall_chance_rate(factor)
    } else {
        HINT_CHANCE_RATE
    };
    let chance = f64::from(agents.max(1)) * per_agent * HINT_SPAN.as_secs_f64();
    (2..=DISTINCT as u32)
        .find(|&n| poisson_tail(chance, n) <= POLL_CHANCE)
        .map(|n| n as usize)
}

impl DemandWindow {
    /// Takes `hint` at `now`; returns whether the pair's agents should be
    /// polled now, for a pair limited to `limit` under the master's
    /// `factor` (suppressed when above 0).
    ///
    /// Polled when the distinct agents that hinted the same way within
    /// [`HINT_SPAN`] are more than chance ([`hints_needed`]) and:
    /// - for rises, their mean rate, were every one of the pair's agents
    ///   at it, would be over `limit`: traffic that moves onto a few agents
    ///   of an account under its limit is a rise on them, but not a flood.
    ///   While the window has no round before the current one (the pair is
    ///   new here, and so is every agent's pair, whose hints rise from
    ///   nothing), how many agents it has is not known: polled when the
    ///   hinters' own rates alone are over `limit`;
    /// - for falls, the pair is `suppressed`, and its agents are known.
    pub fn hint(
        &mut self,
        cfg: &WindowConfig,
        now: Nanos,
        hint: HintFrom,
        limit: f64,
        factor: f64,
    ) -> bool {
        let suppressed = factor > 0.0;
        let known = self.core.reports[1] > 0;
        let agents = self.core.reports[0].max(self.core.reports[1]);
        let needed = hints_needed(u32::from(agents), hint.fall, factor);
        let hints = self
            .extras
            .get_or_insert_default()
            .hints
            .get_or_insert_default();
        let polled_until = if hint.fall {
            hints.fall_polled_until
        } else {
            hints.rise_polled_until
        };
        if now < polled_until {
            return false;
        }
        if hints.fall != hint.fall {
            hints.agents = [0; DISTINCT];
            hints.fall = hint.fall;
        }
        hints.take(now, hint);
        let distinct = hints.agents.iter().filter(|a| **a != 0).count();
        let enough = needed.is_some_and(|n| distinct >= n);
        let poll = if hint.fall {
            enough && suppressed && known
        } else {
            let rates = hints.rates_sum();
            let extrapolated = if known {
                rates / distinct as f64 * f64::from(agents)
            } else {
                rates
            };
            enough && extrapolated > limit
        };
        if !poll {
            return false;
        }
        let until = now + cfg.rollup_interval;
        if hint.fall {
            hints.fall_polled_until = until;
        } else {
            hints.rise_polled_until = until;
        }
        hints.agents = [0; DISTINCT];
        true
    }
}

impl Hints {
    /// Counts `hint`, taken at `now`, after letting go of the hints more
    /// than [`HINT_SPAN`] old: an agent already counted is counted again
    /// from now, at its new rate; a new one takes a free place (past
    /// [`DISTINCT`] agents, the tally is full: enough for any poll it
    /// can tell apart).
    fn take(&mut self, now: Nanos, hint: HintFrom) {
        for (agent, at) in self.agents.iter_mut().zip(&self.at) {
            if now.since(*at) > HINT_SPAN {
                *agent = 0;
            }
        }
        // 0 marks an empty place.
        let agent = hint.agent.max(1);
        let place = match self.agents.iter().position(|a| *a == agent) {
            Some(place) => place,
            None => match self.agents.iter().position(|a| *a == 0) {
                Some(free) => free,
                None => return,
            },
        };
        self.agents[place] = agent;
        self.at[place] = now;
        self.rates[place] = hint.rate.max(0.0) as f32;
    }

    /// Whether it says nothing any more at `now`: no poll held back, and
    /// every hint past its span, so that a tally made afresh would weigh
    /// the next hint the same.
    pub(super) fn lapsed(&self, now: Nanos) -> bool {
        now >= self.rise_polled_until
            && now >= self.fall_polled_until
            && self
                .agents
                .iter()
                .zip(&self.at)
                .all(|(agent, at)| *agent == 0 || now.since(*at) > HINT_SPAN)
    }

    /// The rates the agents counted hinted, summed.
    fn rates_sum(&self) -> f64 {
        self.agents
            .iter()
            .zip(&self.rates)
            .filter(|(agent, _)| **agent != 0)
            .map(|(_, rate)| f64::from(*rate))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WindowSection;

    fn cfg() -> WindowConfig {
        WindowConfig::try_from(WindowSection::default()).unwrap()
    }

    fn ms(t: u64) -> Nanos {
        Nanos::from_secs(1_800_000_000) + Duration::from_millis(t)
    }

    #[test]
    fn forty_agents_poll_at_three_rises_or_eight_falls_or_twelve_deep_ones_and_larger_fleets_need_more()
     {
        assert_eq!(hints_needed(0, false, 0.0), Some(2));
        assert_eq!(hints_needed(5, false, 0.0), Some(2));
        assert_eq!(hints_needed(40, false, 0.0), Some(3));
        assert_eq!(hints_needed(1_000, false, 0.0), Some(7));
        assert_eq!(hints_needed(20, true, 0.3), Some(6));
        assert_eq!(hints_needed(40, true, 0.3), Some(8));
        assert_eq!(hints_needed(100, true, 0.3), Some(12));
        assert_eq!(hints_needed(200, true, 0.3), Some(18));
        assert_eq!(hints_needed(1_000, true, 0.3), None);
        assert_eq!(hints_needed(100_000, false, 0.0), None);
        // Under a deep factor (and a tenth of one before it, which an
        // agent may still hold), the agents' looser test hints more by
        // chance: more must come together.
        assert_eq!(hints_needed(40, true, 0.8), Some(12));
        assert_eq!(hints_needed(40, true, 0.4), Some(12));
        assert_eq!(hints_needed(100, true, 0.8), Some(21));
        assert_eq!(hints_needed(200, true, 0.8), None);
    }

    fn rise(agent: u32, rate: f64) -> HintFrom {
        HintFrom {
            agent,
            rate,
            fall: false,
        }
    }

    /// A window whose last two rounds had `agents` reports, at 10/s each.
    fn window(agents: u16) -> DemandWindow {
        let mut w = DemandWindow::new(&cfg());
        for end in [2_000, 4_000] {
            for _ in 0..agents {
                w.record(&cfg(), ms(end - 2_000), ms(end), 20, 20);
            }
        }
        w
    }

    #[test]
    fn distinct_agents_within_the_span_poll_once_a_round() {
        // Four agents: two hints poll.
        let (c, mut w) = (cfg(), window(4));
        let hint =
            |w: &mut DemandWindow, t, agent| w.hint(&c, ms(t), rise(agent, 500.0), 1_000.0, 0.0);
        assert!(!hint(&mut w, 4_000, 7));
        // The same agent again counts once.
        assert!(!hint(&mut w, 4_100, 7));
        // Another, too late to count with the first.
        assert!(!hint(&mut w, 4_700, 8));
        // A third within the span of the second: poll.
        assert!(hint(&mut w, 4_900, 9));
        // Not again within the interval, however many hint.
        assert!(!hint(&mut w, 5_000, 10));
        assert!(!hint(&mut w, 5_100, 11));
        // After it, hints count afresh.
        assert!(!hint(&mut w, 7_000, 12));
        assert!(hint(&mut w, 7_100, 13));
    }

    /// A window's hints are let go of, and its extras with them, at the
    /// first round that begins once they say nothing (past their span, no
    /// poll held back); not before.
    #[test]
    fn hints_that_say_nothing_any_more_are_let_go_of_as_a_round_begins() {
        let (c, mut w) = (cfg(), window(4));
        assert!(!w.hint(&c, ms(4_100), rise(7, 500.0), 1_000.0, 0.0));
        assert!(w.hint(&c, ms(4_200), rise(8, 500.0), 1_000.0, 0.0));
        // The poll holds back others until 6.2 s: the round that begins
        // at 6 s keeps them.
        let round = |w: &mut DemandWindow, end: u64| {
            for _ in 0..4 {
                w.record(&c, ms(end - 2_000), ms(end), 20, 20);
            }
        };
        round(&mut w, 6_000);
        assert!(w.extras.is_some());
        round(&mut w, 8_000);
        assert!(w.extras.is_none());
        // And a hint after that is weighed afresh.
        assert!(!w.hint(&c, ms(8_100), rise(9, 500.0), 1_000.0, 0.0));
        assert!(w.hint(&c, ms(8_200), rise(10, 500.0), 1_000.0, 0.0));
    }

    #[test]
    fn hints_that_would_not_reach_the_limit_or_come_first_do_not_poll() {
        let c = cfg();
        // Four agents hinting 200/s each: 800/s were all at it, under
        // 1 000/s (traffic that moved onto them).
        let mut w = window(4);
        for agent in 1..=4 {
            assert!(!w.hint(&c, ms(4_000), rise(agent, 200.0), 1_000.0, 0.0));
        }
        // At 300/s each, 1 200/s: over.
        let mut w = window(4);
        assert!(!w.hint(&c, ms(4_000), rise(1, 300.0), 1_000.0, 0.0));
        assert!(w.hint(&c, ms(4_000), rise(2, 300.0), 1_000.0, 0.0));
        // A pair with no round before this one here: its agents are not
        // known, so the hinters' own rates must be over the limit.
        let mut w = DemandWindow::new(&c);
        for agent in 1..=3 {
            assert!(!w.hint(&c, ms(0), rise(agent, 300.0), 1_000.0, 0.0));
        }
        assert!(w.hint(&c, ms(0), rise(4, 300.0), 1_000.0, 0.0));
    }

    fn fall(agent: u32) -> HintFrom {
        HintFrom {
            agent,
            rate: 0.0,
            fall: true,
        }
    }

    /// The span slides: hints count with those of the last [`HINT_SPAN`],
    /// wherever a burst of them begins, and an old one stops counting.
    #[test]
    fn hints_count_with_those_of_the_last_span() {
        let c = cfg();
        // Forty agents: eight falls needed.
        let mut w = window(40);
        // Two early hints, then a burst 400 ms later: they count together
        // (a span from the first hint would end before the burst).
        assert!(!w.hint(&c, ms(4_000), fall(1), 1_000.0, 0.3));
        assert!(!w.hint(&c, ms(4_050), fall(2), 1_000.0, 0.3));
        for agent in 3..=7 {
            assert!(!w.hint(&c, ms(4_400), fall(agent), 1_000.0, 0.3));
        }
        assert!(w.hint(&c, ms(4_450), fall(8), 1_000.0, 0.3));
        // Hints more than the span apart never add up.
        let mut w = window(40);
        for agent in 1..=20 {
            let t = 4_000 + 600 * u64::from(agent);
            assert!(!w.hint(&c, ms(t), fall(agent), 1_000.0, 0.3));
        }
        // An agent that hints again counts once, from its latest hint.
        let mut w = window(40);
        for agent in 1..=7 {
            assert!(!w.hint(&c, ms(4_000), fall(agent), 1_000.0, 0.3));
        }
        assert!(!w.hint(&c, ms(4_300), fall(1), 1_000.0, 0.3));
        // At 4 600 ms the hints of 4 000 are gone; agent 1's of 4 300 stays.
        for agent in 8..=13 {
            assert!(!w.hint(&c, ms(4_600), fall(agent), 1_000.0, 0.3));
        }
        assert!(w.hint(&c, ms(4_600), fall(14), 1_000.0, 0.3));
    }

    #[test]
    fn falls_poll_a_suppressed_pair_when_enough_agents_hint_them() {
        let c = cfg();
        // Four agents (four falls needed), the pair suppressed: polled at
        // the fourth, once an interval; a rise poll is apart.
        assert_eq!(hints_needed(4, true, 0.3), Some(4));
        let mut w = window(4);
        assert!(!w.hint(&c, ms(4_000), fall(1), 1_000.0, 0.3));
        assert!(!w.hint(&c, ms(4_100), fall(2), 1_000.0, 0.3));
        assert!(!w.hint(&c, ms(4_200), fall(3), 1_000.0, 0.3));
        assert!(w.hint(&c, ms(4_300), fall(4), 1_000.0, 0.3));
        assert!(!w.hint(&c, ms(4_350), fall(1), 1_000.0, 0.3));
        assert!(!w.hint(&c, ms(4_400), rise(5, 900.0), 1_000.0, 0.3));
        assert!(w.hint(&c, ms(4_400), rise(6, 900.0), 1_000.0, 0.3));
        // Not suppressed: a fall is nothing to release.
        let mut w = window(4);
        for agent in 1..=4 {
            assert!(!w.hint(&c, ms(4_000), fall(agent), 1_000.0, 0.0));
        }
        // Rises and falls are not counted together.
        let mut w = window(4);
        assert!(!w.hint(&c, ms(4_000), fall(1), 1_000.0, 0.3));
        assert!(!w.hint(&c, ms(4_000), rise(2, 900.0), 1_000.0, 0.3));
        assert!(!w.hint(&c, ms(4_000), fall(3), 1_000.0, 0.3));
    }
}
