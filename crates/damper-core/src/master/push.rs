//! Pushes: verdicts an early report changed, for every agent of the
//! master, not only the one that reported.
//!
//! An early report moves an account's estimate between rounds. The agent
//! that sent it hears the new verdict in its reply; the account's other
//! agents would hear it only at their next round, up to one rollup interval
//! later, or at a recheck if they reported early themselves. When the
//! early report turns the account's suppression on or off, the master
//! queues the verdict as a *push*; its driver takes the queue after the
//! request ([`MasterState::take_pushes`]) and sends it to every agent
//! watching it, and each agent applies it to the pairs it holds
//! ([`AgentState::apply_pushed`](crate::agent::AgentState::apply_pushed)).
//! So a flood that ends is released on every agent once enough of them
//! have reported their fall for the estimate to cross the limit, and one
//! that starts is held on agents whose own share rose too little to call.
//!
//! A change of suppression is pushed, and, while the surge estimate whose
//! flip was pushed stands, its factor again once the share it keeps moved
//! by more than [`REPUSH_MOVED`], at most every [`REPUSH_SPACING`]: the
//! flip comes with the first answers to a poll, whose estimate the rest
//! raise within milliseconds. With nothing surging nothing is sent.

use std::time::Duration;

use super::{MasterState, Verdict};
use crate::Pair;
use crate::config::MasterConfig;
use crate::time::Nanos;
use crate::window::DemandWindow;
use crate::wire::{Listed, OpAccounts, OpVerdicts, Reply, Unlisted};

/// How far under its limit a rollup must bring a suppressed account's
/// demand for its release to be pushed: well under, so an account that
/// hovers at its limit, whose rounds flip it on and off by chance, pushes
/// nothing (and is not let go on every agent by a round that read low).
pub const RELEASE_PUSH_SHARE: f64 = 0.75;

/// Most pairs one push carries: the rest wait for their rounds, as before
/// pushes existed. Bounds what one agent's early report can make a master
/// send to every agent.
pub const PUSH_MAX_PAIRS: usize = 10_000;

/// How soon after a surge estimate's verdict was pushed it may be pushed
/// again: the answers to a poll come within a few milliseconds of each
/// other, and each moves the estimate; spaced, the burst is pushed twice or
/// three times rather than once per answer.
pub const REPUSH_SPACING: Duration = Duration::from_millis(50);

/// How far the share a suppressed pair keeps (`1 − factor`) must move from
/// the one last pushed, as a part of it, to be pushed again: a tenth, the
/// least that changes what the agents admit by more than a second's noise
/// of a costly account.
pub const REPUSH_MOVED: f64 = 0.1;

/// One verdict to push, or one poll.
#[derive(Clone, Debug, PartialEq)]
pub struct Push {
    /// The op.
    pub op: String,
    /// The account.
    pub account: String,
    /// Its verdict after the early report.
    pub verdict: Verdict,
    /// A poll rather than a verdict: agents holding the pair are asked for
    /// their rate now (their sparse hints came together, see
    /// [`MasterState::surge`]), and `verdict` is the one in force, not
    /// sent.
    pub poll: bool,
}

impl MasterState {
    /// Starts (or stops) queueing pushes for [`take_pushes`](Self::take_pushes).
    /// Off by default, so a caller with no agents to push to keeps nothing.
    pub fn track_pushes(&mut self, on: bool) {
        self.pushes = on.then(Vec::new);
    }

    /// The pushes queued since the last call: at most [`PUSH_MAX_PAIRS`],
    /// as `queue_push` keeps no more (the rest are
    /// dropped: their agents hear at their rounds).
    pub fn take_pushes(&mut self) -> Vec<Push> {
        self.pushes.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Queues `verdict` if pushes are tracked and it flips the pair's
    /// suppression (`was_suppressed` before the report).
    pub(super) fn queue_push(
        &mut self,
        account: &str,
        op: &str,
        was_suppressed: bool,
        verdict: Option<&Verdict>,
    ) {
        if let Some(verdict) = verdict
            && (verdict.factor > 0.0) != was_suppressed
        {
            self.push_verdict(account, op, verdict);
        }
    }

    /// After an early report to a pair whose window is `window`: queues
    /// `verdict` if pushes are tracked and it flips the pair's suppression
    /// (`was_suppressed` before the report), or if it still suppresses
    /// under the surge estimate whose flip was pushed and the share it
    /// keeps moved by more than [`REPUSH_MOVED`] since the last push, at
    /// most every [`REPUSH_SPACING`] (see [`DemandWindow::surge_repush`]).
    pub(super) fn queue_surge_push(
        &mut self,
        window: &mut DemandWindow,
        pair: Pair<'_>,
        was_suppressed: bool,
        verdict: Option<&Verdict>,
        now: Nanos,
    ) {
        let Some(verdict) = verdict.filter(|_| self.pushes.is_some()) else {
            return;
        };
        let keep = 1.0 - verdict.factor;
        let cfg = &self.config.window;
        let flipped = (verdict.factor > 0.0) != was_suppressed;
        let moved = verdict.factor > 0.0
            && window.surge_repush(cfg, now, keep, REPUSH_SPACING, REPUSH_MOVED);
        if flipped || moved {
            window.surge_pushed(cfg, now, keep);
            self.push_verdict(pair.account, pair.op, verdict);
        }
    }

    /// Queues `verdict` for every agent (see [`queue`](Self::queue)).
    fn push_verdict(&mut self, account: &str, op: &str, verdict: &Verdict) {
        let verdict = Verdict {
            recheck_at: None,
            ..*verdict
        };
        self.queue(account, op, verdict, false);
    }

    /// Queues a poll of the pair (see [`Push::poll`]), with the verdict in
    /// force.
    pub(super) fn queue_poll(&mut self, account: &str, op: &str, verdict: Verdict) {
        self.queue(account, op, verdict, true);
    }

    /// Queues a push, if pushes are tracked and fewer than
    /// [`PUSH_MAX_PAIRS`] are queued.
    fn queue(&mut self, account: &str, op: &str, verdict: Verdict, poll: bool) {
        if let Some(pushes) = &mut self.pushes
            && pushes.len() < PUSH_MAX_PAIRS
        {
            pushes.push(Push {
                op: op.to_owned(),
                account: account.to_owned(),
                verdict,
                poll,
            });
        }
    }

    /// Queues `verdict` if pushes are tracked and a rollup released the
    /// pair (suppressed before it, `was`) with its demand at most
    /// [`RELEASE_PUSH_SHARE`] of the limit, or whatever its demand when
    /// the suppression was itself pushed. A flood too sparse on each
    /// agent for any of them to report its end early is released by the
    /// round that shows it; without a push, the agents that reported that
    /// round before it was whole would hear only at their recheck, and
    /// the rest at their next round. Only releases: a rollup that turns
    /// suppression on is not pushed (the agents that report next hear it),
    /// since a round read high by chance would hold the account on every
    /// agent; and one that lets go of a suppression the rounds began,
    /// whose demand hovers near the limit, is not either, so the rounds'
    /// flips of an account at its limit stay where they are heard. But a
    /// suppression pushed to every agent (an early report's) and released
    /// by the round that shows it was chance is released on every agent:
    /// unpushed, an account at 0.95× of its limit that its agents' chance
    /// lumps had suppressed for a tenth of a second was refused for a
    /// second and a half more, until each agent's next round.
    pub(super) fn queue_release_push(
        &mut self,
        account: &str,
        op: &str,
        was: Suppression,
        verdict: Option<&Verdict>,
    ) {
        let released = verdict.is_some_and(|v| {
            v.factor == 0.0 && (was.pushed || v.rates.demand <= RELEASE_PUSH_SHARE * v.limit.get())
        });
        if was.held && released {
            self.queue_push(account, op, was.held, verdict);
        }
    }
}

/// A pair's suppression before a rollup, as its release push is decided.
#[derive(Clone, Copy, Debug)]
pub(super) struct Suppression {
    /// Its last verdict suppressed it.
    pub(super) held: bool,
    /// The last verdict pushed for its surge estimate suppressed it.
    pub(super) pushed: bool,
}

/// The message that carries `pushes` to agents: a reply listing every
/// pushed verdict (none is implied by its op's default), grouped by op,
/// and every poll in its `polls`, stamped with `started` and the master's
/// interval like any reply.
pub fn push_reply(
    config: &MasterConfig,
    pushes: Vec<Push>,
    rollup_interval: Duration,
    started: Nanos,
) -> Reply {
    let mut ops: Vec<OpVerdicts> = Vec::new();
    let mut polls: Vec<OpAccounts> = Vec::new();
    for push in pushes {
        if push.poll {
            match polls.iter_mut().find(|o| o.op == push.op) {
                Some(op) => op.accounts.push(push.account),
                None => polls.push(OpAccounts {
                    op: push.op,
                    accounts: vec![push.account],
                    surges: Vec::new(),
                }),
            }
            continue;
        }
        let listed = Listed::new(push.account, &push.verdict, 0.0);
        match ops.iter_mut().find(|o| o.op == push.op) {
            Some(op) => op.listed.push(listed),
            None => ops.push(OpVerdicts {
                unlisted: Unlisted::of(config, &push.op),
                op: push.op,
                listed: vec![listed],
                overrides: Vec::new(),
            }),
        }
    }
    Reply {
        ops,
        rollup_interval: Some(rollup_interval).filter(|d| !d.is_zero()),
        recheck_after: None,
        started: Some(started).filter(|&s| s != Nanos::ZERO),
        ring_version: 0,
        foreign_entries: 0,
        takes_ids: false,
        takes_hints: true,
        polls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Pair;
    use crate::window::FALLING_FOR;
    use crate::wire::{Report, SurgeRates};

    const T0_MS: u64 = 1_699_999_998_000;

    fn at(ms: u64) -> Nanos {
        Nanos::from_millis(T0_MS + ms)
    }

    fn master(push: bool) -> MasterState {
        let config = MasterConfig::from_toml("[limits]\nmessages = 1000\n").unwrap();
        let mut m = MasterState::new(config);
        m.track_pushes(push);
        m
    }

    /// Two agents' reports of `rate` cost/s each over the round ending at
    /// `end_ms`.
    fn round(m: &mut MasterState, end_ms: u64, rate: f64) {
        for account in ["acme", "acme"] {
            let attempted = (rate * 2.0) as u64;
            let report = Report {
                account,
                op: "messages",
                start: at(end_ms - 2_000),
                end: at(end_ms),
                attempted,
                admitted: attempted,
                op_cost: 0,
                ops: 0,
            };
            m.ingest(at(end_ms + 5), &report).unwrap();
        }
    }

    fn early(m: &mut MasterState, ms: u64, rate: f32, baseline: f32) -> f64 {
        let rates = SurgeRates {
            rate,
            baseline,
            surged: false,
            joined: false,
            ..SurgeRates::default()
        };
        let pair = Pair::new("acme", "messages");
        m.surge(at(ms), at(ms), "a", pair, rates)
            .unwrap()
            .unwrap()
            .factor
    }

    #[test]
    fn early_reports_that_flip_suppression_are_pushed_and_others_are_not() {
        let mut m = master(true);
        // Two agents at 400/s each, for rounds: under the limit.
        for end in (2_000..=20_000).step_by(2_000) {
            round(&mut m, end, 400.0);
        }
        assert!(m.take_pushes().is_empty(), "rounds push nothing");
        // One agent jumps to 4 000/s: the account is suppressed, pushed.
        assert!(early(&mut m, 20_300, 4_000.0, 400.0) > 0.0);
        let pushes = m.take_pushes();
        assert_eq!(pushes.len(), 1);
        assert_eq!(
            (pushes[0].account.as_str(), pushes[0].op.as_str()),
            ("acme", "messages")
        );
        assert!(pushes[0].verdict.factor > 0.5 && pushes[0].verdict.recheck_at.is_none());
        // It rises further, 200 ms on: still suppressed, keeping half the
        // share pushed, so pushed again.
        assert!(early(&mut m, 20_500, 8_000.0, 4_000.0) > 0.0);
        let again = m.take_pushes();
        assert_eq!(again.len(), 1);
        assert!(again[0].verdict.factor > 0.85, "{again:?}");
        // It stops: released, pushed.
        assert_eq!(early(&mut m, 20_700, 100.0, 8_000.0), 0.0);
        let pushes = m.take_pushes();
        assert_eq!(pushes.len(), 1);
        assert_eq!(pushes[0].verdict.factor, 0.0);

        // Carried as a reply that lists it, with its op's default beside.
        let config = MasterConfig::from_toml("[limits]\nmessages = 1000\n").unwrap();
        let reply = push_reply(&config, pushes, Duration::from_secs(2), at(0));
        assert_eq!(reply.ops.len(), 1);
        assert_eq!(reply.ops[0].listed.len(), 1);
        assert_eq!(reply.ops[0].listed[0].factor.factor, 0.0);
        assert!(reply.ops[0].unlisted.is_some() && reply.recheck_after.is_none());
    }

    /// The answers to a poll come a few milliseconds apart, each moving
    /// the estimate. The first that carries it over the limit is pushed;
    /// the rest are pushed again only once the share kept moved by more
    /// than a tenth, and no sooner than [`REPUSH_SPACING`] after the last
    /// push, so the agents that heard only the flip do not keep its mild
    /// factor until their round.
    #[test]
    fn a_standing_rise_is_pushed_again_once_it_moved_and_not_sooner() {
        let mut m = master(true);
        for end in (2_000..=20_000).step_by(2_000) {
            round(&mut m, end, 400.0);
        }
        // The flip, at 4 400/s: keeps 0.23.
        assert!(early(&mut m, 20_300, 4_000.0, 400.0) > 0.7);
        let flip = m.take_pushes();
        assert_eq!(flip.len(), 1);
        // 20 ms on, 8 400/s: keeps 0.12, but too soon after the flip.
        let f = early(&mut m, 20_320, 8_000.0, 4_000.0);
        assert!(f > 0.85, "{f}");
        assert!(m.take_pushes().is_empty(), "spaced");
        const { assert!(REPUSH_SPACING.as_millis() > 20) };
        // 60 ms after the flip, unchanged: pushed now, as it stands.
        early(&mut m, 20_360, 8_000.0, 8_000.0);
        let again = m.take_pushes();
        assert_eq!(again.len(), 1);
        assert!((again[0].verdict.factor - f).abs() < 1e-9, "{again:?}");
        // 8 800/s, 200 ms on: keeps 5% less than pushed, not pushed.
        assert!(early(&mut m, 20_560, 8_400.0, 8_000.0) > f);
        assert!(m.take_pushes().is_empty(), "moved too little");
        // The flood stops: the release is pushed at once.
        assert_eq!(early(&mut m, 20_580, 100.0, 8_400.0), 0.0);
        let release = m.take_pushes();
        assert_eq!(release.len(), 1);
        assert_eq!(release[0].verdict.factor, 0.0);
    }

    /// A suppression the rounds turned on pushed nothing, so early reports
    /// that move it do not push either: the agents hear from their rounds
    /// and rechecks, as before pushes.
    #[test]
    fn a_suppression_by_the_rounds_is_not_pushed_when_early_reports_move_it() {
        let mut m = held_by_rounds();
        m.take_pushes();
        // Two agents at 2 500/s; one reports 6 000/s, then 12 000/s.
        assert!(early(&mut m, 30_300, 6_000.0, 2_500.0) > 0.5);
        assert!(early(&mut m, 30_500, 12_000.0, 6_000.0) > 0.5);
        assert!(m.take_pushes().is_empty());
    }

    /// The factor of `m`'s verdict for the account now.
    fn factor(m: &MasterState, ms: u64) -> f64 {
        m.verdict(at(ms), "acme", "messages").unwrap().factor
    }

    /// A master (pushing) that held a flood of 5× the limit by its rounds
    /// to 30 s, after ten rounds under it.
    fn held_by_rounds() -> MasterState {
        let mut m = master(true);
        for end in (2_000..=20_000).step_by(2_000) {
            round(&mut m, end, 400.0);
        }
        for end in (22_000..=30_000).step_by(2_000) {
            round(&mut m, end, 2_500.0);
        }
        assert!(factor(&m, 30_010) > 0.5);
        m
    }

    /// An agent still suppressed by a fall that early reports are bringing
    /// asks again within `policy.surge_recheck`: the release comes with
    /// the next answers and is pushed, and one that misses the push hears
    /// it from its next recheck rather than its round. Once the fall's
    /// reports stop coming ([`FALLING_FOR`]), it is left to its rounds.
    #[test]
    fn a_fall_is_rechecked_soon_while_its_reports_come_in() {
        let mut m = held_by_rounds();
        let soon = m.config().policy.surge_recheck;
        // One agent falls from 2 500/s to 500/s: 3 000/s in all, 3× the
        // limit.
        let f = early(&mut m, 30_300, 500.0, 2_500.0);
        assert!(f > 0.5, "{f}");
        let falling = m.verdict(at(30_310), "acme", "messages").unwrap();
        assert_eq!(falling.factor, f);
        assert_eq!(falling.recheck_at, Some(at(30_310) + soon));
        // No report since: it stands as it is until its round (whole).
        let ms = 30_300 + FALLING_FOR.as_millis() as u64;
        assert_eq!(
            m.verdict(at(ms), "acme", "messages").unwrap().recheck_at,
            Some(at(ms) + soon)
        );
        let stood = m.verdict(at(ms + 1), "acme", "messages").unwrap();
        assert_eq!((stood.factor, stood.recheck_at), (f, None));
        // The other falls to 900/s, 1 400/s in all, still over the
        // limit: asked again soon.
        let f = early(&mut m, 30_700, 900.0, 2_500.0);
        assert!(f > 0.0 && f < 0.5, "{f}");
        let near = m.verdict(at(30_710), "acme", "messages").unwrap();
        assert_eq!((near.factor, near.recheck_at), (f, Some(at(30_710) + soon)));
    }

    #[test]
    fn a_round_that_releases_well_under_the_limit_is_pushed() {
        // Turning suppression on by a round pushes nothing (the agents
        // that report next hear it).
        let mut m = held_by_rounds();
        assert!(m.take_pushes().is_empty());
        // It falls to 0.6 of the limit: the round that shows it, once
        // whole, releases the account on every agent.
        round(&mut m, 32_000, 300.0);
        assert_eq!(factor(&m, 32_010), 0.0);
        let pushes = m.take_pushes();
        assert_eq!(pushes.len(), 1);
        assert_eq!(pushes[0].verdict.factor, 0.0);
        assert!(pushes[0].verdict.recheck_at.is_none());
        assert!(m.take_pushes().is_empty(), "taken once");
    }

    #[test]
    fn a_round_that_releases_near_the_limit_is_not_pushed() {
        let mut m = held_by_rounds();
        m.take_pushes();
        // Back to 0.9 of the limit: released, but an account that hovers
        // there flips by chance, so its agents hear at their rounds.
        round(&mut m, 32_000, 450.0);
        assert_eq!(factor(&m, 32_010), 0.0);
        assert!(m.take_pushes().is_empty());
        const { assert!(RELEASE_PUSH_SHARE < 0.9) };
    }

    /// A suppression an early report pushed to every agent, which the
    /// rounds then show was chance, is released on every agent however
    /// near the limit the demand is: otherwise each agent went on
    /// refusing its share until its own next round.
    #[test]
    fn a_round_that_releases_a_pushed_suppression_near_the_limit_is_pushed() {
        let mut m = master(true);
        for end in (2_000..=20_000).step_by(2_000) {
            round(&mut m, end, 400.0);
        }
        assert!(early(&mut m, 20_300, 4_000.0, 400.0) > 0.0);
        assert_eq!(m.take_pushes().len(), 1, "the suppression, pushed");
        // The rounds show 0.9 of the limit: the round that holds the
        // report is not enough, the one after it, whole, releases.
        round(&mut m, 22_000, 450.0);
        assert!(factor(&m, 22_010) > 0.0);
        assert!(m.take_pushes().is_empty());
        round(&mut m, 24_000, 450.0);
        assert_eq!(factor(&m, 24_010), 0.0);
        let pushes = m.take_pushes();
        assert_eq!(pushes.len(), 1, "{pushes:?}");
        assert_eq!(pushes[0].verdict.factor, 0.0);
        // Released, the next release of the rounds' own is not pushed.
        round(&mut m, 26_000, 450.0);
        assert!(m.take_pushes().is_empty());
    }

    #[test]
    fn untracked_masters_keep_no_pushes() {
        let mut m = master(false);
        for end in (2_000..=20_000).step_by(2_000) {
            round(&mut m, end, 400.0);
        }
        assert!(early(&mut m, 20_300, 4_000.0, 400.0) > 0.0);
        assert!(m.take_pushes().is_empty());
        assert!(m.pushes.is_none());
    }
}
