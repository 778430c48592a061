//! [`AgentRound`]: the state machine behind the module's docs.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::fence::PushFences;
use super::{Message, RequestId, RoundConfig, RoundEvent, Transmit, grid_floor};
use crate::agent::SurgeRule;
use crate::agent::{AgentState, Pending, agent_seed, send_spread};
use crate::membership::{HealthConfig, Membership};
use crate::ring::Ring;
use crate::time::Nanos;
use crate::wire::dictionary::{AgentDictionary, Defined};
use crate::wire::{Factor, FactorsQuery, Reply, Rollup, SurgeRates};
use crate::{OwnedPair, Pair};

/// A round cut and waiting for its send time.
#[derive(Debug)]
struct Cut {
    send_at: Nanos,
    round: u64,
    start: Nanos,
    end: Nanos,
    ring_version: u64,
    batches: Vec<(String, Vec<Pending>)>,
}

/// When the scan after `now` is due: every half sub-window, on the grid
/// (so every agent's sub-windows line up), the ends of sub-windows closing
/// them and the halves between peeking at rises.
fn next_scan_after(now: Nanos, rule: &SurgeRule) -> Nanos {
    let step = (rule.window() / 2).max(Duration::from_nanos(1));
    grid_floor(now, step) + step
}

/// How many sub-windows an early report may go unanswered before the round
/// sends it once more (and, the second time, gives up on it). Two: a round
/// trip to a master is a few milliseconds to tens of them, far below a
/// 200-ms sub-window, and a deluge gets through while it waits.
const SURGE_PATIENCE: u32 = 2;

/// How many times a failed rollup is sent again, as it was, before its
/// counts are carried into the next round. Its master may have counted it
/// and only the reply was lost; carried over, the counts would be counted
/// twice. Each resend multiplies that chance by the loss rate: in the
/// simulator's deluge at 5% loss the masters counted 105.1% of the cost
/// attempted with no resend, 100.35% with one, and 99.9% (never more) with
/// three, the rest still in flight when the run ends. The round counts the
/// first failure at once, so resends never slow a dead master's leaving
/// the ring; a master that is down gets none (its accounts move), one that
/// refuses the rollup gets three.
pub(super) const ROLLUP_RESENDS: u8 = 3;

/// How long a rollup whose master went down unanswered is kept for that
/// master (see [`AgentRound::park`]): less than the 60 s a master
/// remembers an agent's rollup numbers ([`crate::master::RollupLog`]), so
/// the master still knows whether it counted it when it answers again.
pub(super) const IN_DOUBT_FOR: Duration = Duration::from_secs(45);

/// At most this many rollups kept in doubt per master, the oldest dropped
/// first: as many numbers as a master remembers per agent run. A master
/// goes down after two failed rounds, so one or two is the rule.
const IN_DOUBT_MAX: usize = 8;

/// A request sent and not yet answered.
#[derive(Debug)]
enum InFlight {
    Rollup {
        round: u64,
        master: String,
        start: Nanos,
        end: Nanos,
        rollup: Arc<Rollup>,
        /// How many times it was sent again after a failure.
        resent: u8,
        /// When it was first sent: a rollup kept in doubt is given up
        /// [`IN_DOUBT_FOR`] after it.
        sent_at: Nanos,
        /// The account numbers this sending of it defined in its master's
        /// dictionary ([`AgentDictionary::compact`]), confirmed by its reply.
        defined: Defined,
    },
    Recheck {
        master: String,
        pairs: Vec<OwnedPair>,
        /// Whether a failure sends it once more.
        retry: bool,
    },
    Probe {
        master: String,
    },
    Hello {
        tried: usize,
        /// The master asked, for what its reply says of it.
        master: String,
    },
    Surge {
        master: String,
        pairs: Vec<OwnedPair>,
        /// The report, kept to be sent once more if no answer comes in
        /// time; `None` once it has been.
        again: Option<FactorsQuery>,
    },
}

impl InFlight {
    /// The master it went to; `None` for a hello, which tries the next.
    fn master(&self) -> Option<&str> {
        match self {
            InFlight::Rollup { master, .. }
            | InFlight::Recheck { master, .. }
            | InFlight::Probe { master }
            | InFlight::Surge { master, .. } => Some(master),
            InFlight::Hello { .. } => None,
        }
    }

    /// The master it went to, and whether that master's reply says for
    /// certain whether it takes sparse hints: masters that do say so to
    /// hellos, probes and rollups naming every account (sent without a
    /// dictionary: `FactorsQuery::tells_hints`, `Rollup::tells_hints`, as
    /// sent, which a rollup's `defined` records), the replies that can say
    /// they do not; other replies do not say, to keep two bytes off each.
    fn told_hints(&self) -> (&str, bool) {
        match self {
            InFlight::Hello { master, .. } | InFlight::Probe { master } => (master, true),
            InFlight::Rollup {
                master, defined, ..
            } => (master, defined.epoch == 0),
            InFlight::Recheck { master, .. } | InFlight::Surge { master, .. } => (master, false),
        }
    }
}

/// What sends an early report: the grid's scans, or between them a young
/// peek or the answer to a poll (spaced from other reports alike, see
/// `AgentRound::surge_sent`; only a young peek's pairs count as young).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sender {
    Scan,
    YoungPeek,
    Poll,
}

/// A recheck due: when, which master, which `(op, account)` pairs, and
/// whether a failure sends it once more.
type Recheck = (Nanos, String, Vec<OwnedPair>, bool);

/// A round sent and not yet settled.
#[derive(Debug, Default)]
struct Open {
    end: Nanos,
    outstanding: usize,
    /// Per master: did every request to it succeed?
    outcomes: BTreeMap<String, bool>,
    /// A master that said this agent's ring differs, and by how much.
    foreign: Option<(String, u32)>,
}

/// The agent's rollup round: see the module docs.
#[derive(Debug)]
pub struct AgentRound {
    config: RoundConfig,
    membership: Membership,
    spread: Duration,
    /// Start of the interval being counted.
    start: Nanos,
    /// When it is cut.
    next_cut: Nanos,
    cuts: VecDeque<Cut>,
    in_flight: HashMap<RequestId, InFlight>,
    /// Rechecks waiting for their time.
    rechecks: Vec<Recheck>,
    open: BTreeMap<u64, Open>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<RoundEvent>,
    next_id: u64,
    rounds: u64,
    stopping: bool,
    /// When the next surge scan is due (fast onset only).
    next_scan: Option<Nanos>,
    /// When the earliest young pair is due a peek, as the state last said
    /// (see `AgentState::peek_young`); a driver told of a new one by the
    /// state's young hook calls [`handle_timeout`](Self::handle_timeout),
    /// which sets it.
    next_young: Option<Nanos>,
    /// When the last one ran: the next measures from here.
    last_scan: Nanos,
    /// Masters with an early report in flight, the request and when it was
    /// sent: no second one until it is answered, or given up on
    /// ([`SURGE_PATIENCE`] sub-windows later).
    surging: BTreeMap<String, (RequestId, Nanos)>,
    /// When the last early report went to each master, and whether a
    /// young peek sent it. A young peek waits half a sub-window after any
    /// report to the master, and the grid's scans after a young peek's:
    /// the grid's own spacing, which a master's budget
    /// (`policy.surge_min_gap`) is set by, so reports between the grid's
    /// scans never make a master refuse the next. (The grid's scans
    /// follow one another at that spacing, as before young peeks.)
    surge_sent: BTreeMap<String, (Nanos, bool)>,
    /// The pairs each master's latest pushes named, against replies to
    /// requests sent before those pushes arrived (see `fence`).
    fences: PushFences,
    /// This run of the agent, for the masters to tell its rollups from
    /// another run's: [`RoundConfig::incarnation`], by default when the
    /// round was made, in milliseconds.
    incarnation: u64,
    /// The number of the last rollup made, so each is numbered afresh and
    /// a resend keeps its number.
    sequence: u64,
    /// Per master that went down with rollups unanswered: those rollups,
    /// oldest first, to be sent to it again when it is back
    /// ([`AgentRound::park`]).
    in_doubt: BTreeMap<String, VecDeque<InDoubt>>,
    /// The ring the pairs' counts last went out by: the live ring at the
    /// last cut, or at the last joins. When the live ring differs at a
    /// scan, the pairs it moved are joined to their new masters
    /// (`AgentState::offer_joins`).
    counted_ring: Ring,
    /// Per master, the accounts numbered for it, so its rollups name each
    /// account once rather than every round (see
    /// [`crate::wire::dictionary`]).
    dictionaries: BTreeMap<String, AgentDictionary>,
    /// The masters whose replies said they take sparse hints
    /// ([`Reply::takes_hints`]): only those are sent any, since a master
    /// that predates hints would read one as a jump.
    hint_masters: BTreeSet<String>,
}

/// A rollup its master may or may not have counted, kept for it.
#[derive(Debug)]
struct InDoubt {
    round: u64,
    start: Nanos,
    end: Nanos,
    rollup: Arc<Rollup>,
    sent_at: Nanos,
}

impl AgentRound {
    /// A round for masters `members`, counting from the grid interval that
    /// contains `now`.
    pub fn new<S: AsRef<str>>(
        config: RoundConfig,
        members: impl IntoIterator<Item = S>,
        now: Nanos,
    ) -> AgentRound {
        let interval = config.rollup_interval;
        let start = grid_floor(now, interval);
        let health = HealthConfig {
            rollup_interval: interval,
            rejoin_grid: config.fast_onset.map(|rule| rule.window()),
            ..config.health
        };
        let next_scan = config.fast_onset.map(|rule| next_scan_after(now, &rule));
        let membership = Membership::new(members, health, agent_seed(&config.agent_id));
        let mut round = AgentRound {
            counted_ring: membership.live().clone(),
            membership,
            spread: send_spread(&config.agent_id, interval),
            start,
            next_cut: start + interval,
            cuts: VecDeque::new(),
            in_flight: HashMap::new(),
            rechecks: Vec::new(),
            open: BTreeMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            next_id: 0,
            rounds: 0,
            stopping: false,
            next_scan,
            last_scan: now,
            next_young: None,
            surging: BTreeMap::new(),
            surge_sent: BTreeMap::new(),
            fences: PushFences::default(),
            incarnation: config.incarnation.unwrap_or(now.as_millis()),
            sequence: 0,
            in_doubt: BTreeMap::new(),
            dictionaries: BTreeMap::new(),
            hint_masters: BTreeSet::new(),
            config,
        };
        if round.config.fast_onset.is_some() {
            round.hello(0);
        }
        round
    }

    /// Asks one master (each agent its own, so a fleet starting together
    /// spreads its hellos) for the ops' default limits, so the local guard
    /// knows them before the first rollup is answered; every master holds
    /// the same limits. After `tried` failures, the next master; once
    /// every one has failed, the rollups' replies teach them instead.
    fn hello(&mut self, tried: usize) {
        let live = self.live_members();
        if tried >= live.len() {
            return;
        }
        let first = agent_seed(&self.config.agent_id) as usize;
        let master = live[(first + tried) % live.len()].clone();
        let query = FactorsQuery::new(&self.config.agent_id, []);
        let flight = InFlight::Hello {
            tried,
            master: master.clone(),
        };
        self.transmit(master, Message::Probe(query), flight);
    }

    /// The settings.
    pub fn config(&self) -> &RoundConfig {
        &self.config
    }

    /// Which masters are configured and which are up.
    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// Replaces the configured masters (a new DNS answer): known ones keep
    /// their health. Returns whether the live ring changed.
    pub fn set_members<S: AsRef<str>>(&mut self, members: impl IntoIterator<Item = S>) -> bool {
        let changed = self.membership.set_members(members);
        if changed {
            let membership = &self.membership;
            self.dictionaries
                .retain(|master, _| membership.members().any(|m| m == master));
        }
        changed
    }

    /// The next request to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next thing to log or count.
    pub fn poll_event(&mut self) -> Option<RoundEvent> {
        self.events.pop_front()
    }

    /// When to call [`handle_timeout`](Self::handle_timeout) next; `None`
    /// once stopped.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        let cut = (!self.stopping).then_some(self.next_cut);
        let send = self.cuts.front().map(|c| c.send_at);
        let recheck = self.rechecks.iter().map(|r| r.0).min();
        let scan = self.next_scan.filter(|_| !self.stopping);
        let probe = self.membership.next_probe_due().filter(|_| !self.stopping);
        let rejoin = self.membership.next_rejoin().filter(|_| !self.stopping);
        let young = self.next_young.filter(|_| !self.stopping);
        [cut, send, recheck, scan, probe, rejoin, young]
            .into_iter()
            .flatten()
            .min()
    }

    /// Does what is due at `now`: cutting the round, sending it, scanning
    /// for surges, probing down masters, sending rechecks.
    pub fn handle_timeout(&mut self, now: Nanos, state: &AgentState) {
        if !self.stopping && now >= self.next_cut {
            // Woken late (a suspended process), the round covers every
            // interval missed: what was counted meanwhile is all there.
            let end = grid_floor(now, self.config.rollup_interval).max(self.next_cut);
            self.cut(end, end + self.spread, state);
        }
        while self.cuts.front().is_some_and(|c| c.send_at <= now) {
            let cut = self.cuts.pop_front().expect("a cut is waiting");
            self.send(cut, now, state);
        }
        if !self.stopping {
            // Before the scan, so the pairs it moves are joined at once.
            self.rejoin(now);
        }
        if !self.stopping && self.next_scan.is_some_and(|at| now >= at) {
            self.scan(now, state);
        }
        if !self.stopping {
            self.next_young = self.peek_young(now, state).map(|due| due.max(now));
        }
        if !self.stopping {
            self.send_probes(now);
        }
        self.send_rechecks(now);
    }

    /// Stops: cuts what was counted since the last round at `now` and sends
    /// it (and any round still waiting for its send time) at once. Keep
    /// passing answers until [`is_finished`](Self::is_finished).
    pub fn stop(&mut self, now: Nanos, state: &AgentState) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        self.rechecks.clear();
        let end = now.max(self.start);
        self.cut(end, now, state);
        // What is still in doubt is for masters that are down: given up.
        let cost = std::mem::take(&mut self.in_doubt)
            .into_values()
            .flatten()
            .map(|kept| kept.rollup.attempted())
            .sum();
        self.dropped(cost);
        while let Some(cut) = self.cuts.pop_front() {
            self.send(cut, now, state);
        }
    }

    /// Whether a stopped round has every rollup answered or failed, so a
    /// driver may exit: the counts are delivered or were carried as far as
    /// they could be.
    pub fn is_finished(&self) -> bool {
        self.stopping
            && self.cuts.is_empty()
            && !self
                .in_flight
                .values()
                .any(|f| matches!(f, InFlight::Rollup { .. }))
    }

    /// A push from `master` ([`crate::master::Push`]), received at `now`:
    /// its verdicts applied to the pairs this agent holds. Ignored with
    /// fast onset off, which is how the round ran before pushes.
    ///
    /// Pairs it polls ([`Reply::polls`]) that this agent holds are
    /// reported at once (within the spacing of early reports to their
    /// masters; else at the next scan), and again as their measure grows
    /// (see `AgentState::answer_polls`).
    pub fn on_push(&mut self, now: Nanos, master: &str, reply: &Reply, state: &AgentState) {
        let Some(rule) = self.config.fast_onset else {
            return;
        };
        let applied = state.apply_pushed(now, reply);
        let oldest = self.oldest_in_flight(master);
        self.fences.note(master, reply, self.next_id, oldest);
        let pairs = reply.ops.iter().map(|o| o.listed.len()).sum();
        self.events.push_back(RoundEvent::Pushed {
            master: master.to_owned(),
            pairs,
            applied,
        });
        if reply.polls.is_empty() || self.stopping {
            return;
        }
        let noted = state.answer_polls(now, self.last_scan, rule.window(), &reply.polls);
        self.events.push_back(RoundEvent::Polled {
            master: master.to_owned(),
            pairs: noted,
        });
        if noted > 0 {
            self.report_between_scans(now, &rule, Sender::Poll, |offer| {
                state.report_polls(now, offer)
            });
        }
    }

    /// The answer to request `id`, received at `now`.
    pub fn on_reply(&mut self, now: Nanos, id: RequestId, reply: &Reply, state: &AgentState) {
        let flight = self.in_flight.remove(&id);
        if let Some((master, told)) = flight.as_ref().map(InFlight::told_hints) {
            self.learn_hints(master, reply, told);
        }
        let fenced = flight
            .as_ref()
            .and_then(InFlight::master)
            .filter(|master| self.fences.any(master))
            .map(str::to_owned);
        self.apply_answer(now, id, reply, flight, state);
        if let Some(master) = fenced {
            let oldest = self.oldest_in_flight(&master);
            self.fences.prune(&master, oldest);
        }
    }

    /// What the reply to request `id`, sent as `flight`, does.
    fn apply_answer(
        &mut self,
        now: Nanos,
        id: RequestId,
        reply: &Reply,
        flight: Option<InFlight>,
        state: &AgentState,
    ) {
        match flight {
            Some(InFlight::Rollup {
                round,
                master,
                rollup,
                resent,
                defined,
                ..
            }) => {
                self.check_interval(&master, reply);
                self.dictionary(&master).confirm(reply, &defined);
                // A resend's round was settled at its first failure.
                if reply.foreign_entries > 0 && resent == 0 {
                    let open = self.open.entry(round).or_default();
                    open.foreign
                        .get_or_insert((master.clone(), reply.foreign_entries));
                }
                self.schedule_recheck(now, &master, reply);
                state.apply_reply_at(now, reply, rollup.pairs_at(), self.fenced(&master, id));
                if resent == 0 {
                    self.finish_one(round, master, true, now, state);
                } else if self.membership.is_up(&master) {
                    // The failure the round counted was a lost reply: the
                    // master is answering, so its failures start over.
                    self.membership.succeeded(&master, now);
                }
            }
            Some(InFlight::Recheck { master, pairs, .. }) => {
                // The round may still not be whole (a report lost): the
                // master then names when it counts as whole regardless.
                self.schedule_recheck(now, &master, reply);
                let pairs = pairs.iter().map(OwnedPair::as_pair);
                state.apply_reply_but(now, reply, pairs, self.fenced(&master, id));
            }
            Some(InFlight::Probe { master }) => {
                state.learn_hello(reply);
                if self.membership.answered(&master, reply.started, now) {
                    // Its warm-up already past (a partition healed).
                    self.events
                        .push_back(RoundEvent::RingChanged { master, up: true });
                } else if !self.membership.is_up(&master) {
                    self.events.push_back(RoundEvent::Rejoining { master });
                }
            }
            Some(InFlight::Hello { .. }) => state.learn_hello(reply),
            Some(InFlight::Surge { master, pairs, .. }) => {
                self.surging.remove(&master);
                self.schedule_recheck(now, &master, reply);
                let pairs = pairs.iter().map(OwnedPair::as_pair);
                state.apply_reply_but(now, reply, pairs, self.fenced(&master, id));
            }
            None => {}
        }
    }

    /// The lowest request number in flight to `master`, if any.
    fn oldest_in_flight(&self, master: &str) -> Option<u64> {
        self.in_flight
            .iter()
            .filter(|(_, flight)| flight.master() == Some(master))
            .map(|(id, _)| id.0)
            .min()
    }

    /// Whether a pair's verdict in the reply to request `id` to `master`
    /// is skipped: it contradicts a push that named the pair after the
    /// request was sent, so may be older than it (see `fence`).
    fn fenced<'a>(
        &'a self,
        master: &'a str,
        id: RequestId,
    ) -> impl Fn(Pair<'_>, &Factor) -> bool + 'a {
        let any = self.fences.any(master);
        move |pair, factor| any && self.fences.stale(master, id.0, pair, factor)
    }

    /// Notes whether `master` takes sparse hints, as its `reply` says: it
    /// does if any reply says so; it does not if a reply that such masters
    /// always tell (`told`, see [`InFlight::told_hints`]) does not (a
    /// master replaced by an older build).
    fn learn_hints(&mut self, master: &str, reply: &Reply, told: bool) {
        let known = self.hint_masters.contains(master);
        if reply.takes_hints && !known {
            self.hint_masters.insert(master.to_owned());
        } else if !reply.takes_hints && told && known {
            self.hint_masters.remove(master);
        }
    }

    /// A recheck of the pairs `reply` marks, if it asks for one.
    fn schedule_recheck(&mut self, now: Nanos, master: &str, reply: &Reply) {
        if let Some(after) = reply.recheck_after {
            let pairs: Vec<OwnedPair> = reply.rechecks().map(Pair::to_owned).collect();
            if !pairs.is_empty() && !self.stopping {
                self.rechecks
                    .push((now + after, master.to_owned(), pairs, true));
            }
        }
    }

    /// Request `id` failed at `now` (refused, timed out, unreachable).
    pub fn on_failure(&mut self, now: Nanos, id: RequestId, state: &AgentState) {
        match self.in_flight.remove(&id) {
            // Whether the master counted it is unknown (a reply lost, a
            // timeout). The round counts the failure at once, as it always
            // did (so a master that is down leaves the ring as soon as it
            // did); the rollup is sent again as it was, with its number,
            // while its master is up, so a master that counted it answers
            // without counting it again. Once the resends are spent, the
            // counts go into the next round, to the same master; if the
            // master is down, the rollup is kept for it (`park`).
            Some(InFlight::Rollup {
                round,
                master,
                start,
                end,
                rollup,
                resent,
                sent_at,
                ..
            }) => {
                if resent == 0 {
                    self.finish_one(round, master.clone(), false, now, state);
                }
                let up = self.membership.is_up(&master);
                if resent < ROLLUP_RESENDS && up {
                    let flight = InFlight::Rollup {
                        round,
                        master: master.clone(),
                        start,
                        end,
                        rollup: rollup.clone(),
                        resent: resent + 1,
                        sent_at,
                        defined: Defined::default(),
                    };
                    self.transmit(master, Message::Rollup(rollup), flight);
                    return;
                }
                self.recheck_after_failure(now, &master, &rollup, state);
                if up {
                    // The master answers, only not this: into the next
                    // round, to the same master.
                    self.carry_over(rollup.pending(), start, end, state);
                } else {
                    let kept = InDoubt {
                        round,
                        start,
                        end,
                        rollup,
                        sent_at,
                    };
                    self.park(now, master, kept);
                }
            }
            // A recheck is how a factor is lifted between rounds: a lost
            // one is sent once more at once (a master that is down fails
            // it again, and the factors lapse as they would have).
            Some(InFlight::Recheck {
                master,
                pairs,
                retry: true,
            }) if !self.stopping => self.rechecks.push((now, master, pairs, false)),
            // Otherwise the factors in force stay until the next rollup's
            // reply.
            Some(InFlight::Recheck { .. }) | None => {}
            Some(InFlight::Hello { tried, .. }) if !self.stopping => self.hello(tried + 1),
            Some(InFlight::Hello { .. }) => {}
            Some(InFlight::Probe { master }) => {
                self.membership.failed(&master, now);
            }
            // A failed early report says nothing of the master's health;
            // the rollups do.
            Some(InFlight::Surge { master, pairs, .. }) => {
                self.forget_surge(&master, &pairs, state);
            }
        }
    }

    /// Request `id`, a rollup that gave accounts by number, was refused at
    /// `now` because its master does not hold those numbers (it
    /// restarted, or dropped this agent's dictionary: FAILED_PRECONDITION
    /// on the wire). Nothing of it was counted, and the master is up: the
    /// dictionary starts a new epoch and the rollup is sent again at once,
    /// naming every account, with its number, no failure counted. Any other
    /// request, or a rollup that gave no account by number (so it cannot
    /// have been refused for that), is a failure like any other
    /// ([`on_failure`](Self::on_failure)).
    pub fn on_unknown_numbers(&mut self, now: Nanos, id: RequestId, state: &AgentState) {
        let numbered = matches!(
            self.in_flight.get(&id),
            Some(InFlight::Rollup { defined, .. }) if defined.by_number > 0
        );
        if !numbered {
            return self.on_failure(now, id, state);
        }
        let Some(mut flight) = self.in_flight.remove(&id) else {
            return;
        };
        let InFlight::Rollup {
            master,
            rollup,
            defined,
            ..
        } = &mut flight
        else {
            unreachable!("matched above");
        };
        let (master, rollup) = (master.clone(), rollup.clone());
        self.dictionary(&master).refused(defined);
        *defined = Defined::default();
        self.transmit(master, Message::Rollup(rollup), flight);
    }

    /// Request `id` was refused at `now` without reaching a master: nothing
    /// listens at its address (a refused connection; a process killed on a
    /// host that is still up). Unlike [`on_failure`](Self::on_failure) this
    /// is certain: the master did not count it and is not running. It goes
    /// off the ring at once, and a rollup's counts go to their accounts'
    /// next owners at once, in the same round, rather than two rounds
    /// later: before the dead master's factors lapse.
    pub fn on_refused(&mut self, now: Nanos, id: RequestId, state: &AgentState) {
        let Some(master) = self.in_flight.get(&id).map(InFlight::master) else {
            return;
        };
        let Some(master) = master.map(str::to_owned) else {
            // A hello names no master it depends on: the next one.
            return self.on_failure(now, id, state);
        };
        if self.membership.refused(&master, now) {
            self.events.push_back(RoundEvent::RingChanged {
                master: master.clone(),
                up: false,
            });
        }
        match self.in_flight.remove(&id) {
            Some(InFlight::Rollup {
                round,
                start,
                end,
                rollup,
                ..
            }) => {
                self.recheck_after_failure(now, &master, &rollup, state);
                self.reroute(round, start, end, &rollup, now, state);
                // The rerouted counts tell the new owners what joins would.
                self.counts_went_out();
                self.finish_one(round, master, false, now, state);
            }
            Some(other) => {
                // As any failure: put back and handled there.
                self.in_flight.insert(id, other);
                self.on_failure(now, id, state);
            }
            None => {}
        }
    }

    /// Sends the counts of `rollup`, refused by a master now down, to
    /// their accounts' owners on the live ring, as part of `round` (or
    /// into the next round when no master is up).
    fn reroute(
        &mut self,
        round: u64,
        start: Nanos,
        end: Nanos,
        rollup: &Rollup,
        now: Nanos,
        state: &AgentState,
    ) {
        let live = self.membership.live();
        let ring_version = live.version();
        let mut by_owner: BTreeMap<String, Vec<Pending>> = BTreeMap::new();
        let mut unroutable = Vec::new();
        for pending in rollup.pending() {
            match live.owner(&pending.account) {
                Some(owner) => by_owner.entry(owner.to_owned()).or_default().push(pending),
                None => unroutable.push(pending),
            }
        }
        self.carry_over(unroutable, start, end, state);
        let round_open = self.open.contains_key(&round);
        for (owner, pending) in by_owner {
            let moved = self.numbered(Rollup::from_drain(
                &self.config.agent_id,
                start,
                end,
                ring_version,
                pending,
            ));
            if let Some(open) = self.open.get_mut(&round) {
                open.outstanding += 1;
            }
            let flight = InFlight::Rollup {
                round,
                master: owner.clone(),
                start,
                end,
                rollup: moved.clone(),
                // Part of a round still open, or a resend of one settled.
                resent: u8::from(!round_open),
                sent_at: now,
                defined: Defined::default(),
            };
            self.transmit(owner, Message::Rollup(moved), flight);
        }
    }

    /// A rollup to `master` failed: the pairs of it that this agent
    /// suppresses ask their master again at once, with a query that counts
    /// nothing. Most failures are one lost message; without this, a reply
    /// lost in the round that shows a deluge's end would keep its factor
    /// in force until the next round's reply, or its validity (three
    /// rounds) if that one is lost too. A master that is down fails the
    /// query as well, and the factors lapse as they would have.
    fn recheck_after_failure(
        &mut self,
        now: Nanos,
        master: &str,
        rollup: &Rollup,
        state: &AgentState,
    ) {
        if self.stopping {
            return;
        }
        let pairs: Vec<OwnedPair> = rollup
            .pairs()
            .filter(|p| state.factor(now, p.account, p.op).is_some_and(|f| f > 0.0))
            .map(Pair::to_owned)
            .collect();
        if !pairs.is_empty() {
            self.rechecks.push((now, master.to_owned(), pairs, true));
        }
    }

    /// Early reports unanswered for [`SURGE_PATIENCE`] sub-windows: each is
    /// sent once more, unchanged (the master answers a report it already
    /// counted without counting it again), and after that given up on,
    /// taken as counted while its master is up. A lost early report must
    /// not leave its master deaf to this agent's surges until the driver's
    /// request timeout, sized for rollups (up to a second), while the
    /// deluge gets through; nor can the next scan simply report the pairs
    /// again, since the jump itself has raised their noise for a second or
    /// two.
    fn give_up_surges(&mut self, now: Nanos, window: Duration, state: &AgentState) {
        let patience = window * SURGE_PATIENCE;
        let late: Vec<RequestId> = self
            .surging
            .values()
            .filter(|(_, sent)| now.since(*sent) >= patience)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            match self.in_flight.remove(&id) {
                Some(InFlight::Surge {
                    master,
                    pairs,
                    again: Some(query),
                }) if self.membership.is_up(&master) => {
                    let flight = InFlight::Surge {
                        master: master.clone(),
                        pairs,
                        again: None,
                    };
                    let id = self.transmit(master.clone(), Message::Surge(query), flight);
                    self.surging.insert(master, (id, now));
                }
                // Sent twice, unanswered both times, its master still up:
                // the master counted it unless both sends were lost, not
                // only their replies (three times in four, losses falling
                // alike each way), and it counts a send once however often
                // it comes. So the pairs' baselines stay the rate it
                // told. Taken back, the next report's rise was counted on
                // top of it: one node's account at 0.95× of 100/s, whose
                // first report of 110/s lost its replies, read 195/s from
                // two reports a second apart, and was refused.
                Some(InFlight::Surge {
                    master,
                    again: None,
                    ..
                }) if self.membership.is_up(&master) => {
                    self.surging.remove(&master);
                }
                Some(InFlight::Surge { master, pairs, .. }) => {
                    self.forget_surge(&master, &pairs, state);
                }
                _ => {}
            }
        }
    }

    /// An early report that failed or was given up on: its master may
    /// never have seen it, so the pairs' baselines are their rollups'
    /// again, and the next scan finds them if they still surge.
    fn forget_surge(&mut self, master: &str, pairs: &[OwnedPair], state: &AgentState) {
        self.surging.remove(master);
        for pair in pairs {
            state.unmark_surge(pair.as_pair());
        }
    }

    /// Step 4: scans for surges and sends one early report per master.
    fn scan(&mut self, now: Nanos, state: &AgentState) {
        let Some(rule) = self.config.fast_onset else {
            return;
        };
        self.next_scan = Some(next_scan_after(now, &rule));
        // Halfway through a sub-window (its start already scanned), a peek
        // at its first half; otherwise it closes.
        let peek = self.last_scan >= grid_floor(now, rule.window());
        let since = if peek {
            self.last_scan
        } else {
            self.give_up_surges(now, rule.window(), state);
            std::mem::replace(&mut self.last_scan, now)
        };
        let max = self.config.max_entries_per_request.max(1);
        let busy = |master: &str| self.surge_busy(now, &rule, false, master);
        let live = self.membership.live();
        let hint_masters = &self.hint_masters;
        let takes_hints = |master: &str| hint_masters.contains(master);
        let mut batches = SurgeBatches::default();
        let mut offer = |pair: Pair<'_>, rates: SurgeRates| {
            batches.offer(live, busy, takes_hints, max, pair, rates)
        };
        // Polled pairs due a report (see `AgentState::report_polls`).
        state.report_polls(now, &mut offer);
        // The ring moved pairs since their counts last went out: their
        // new masters hear this agent's rates first, in these reports (a
        // join a busy master misses waits for the rounds, as before joins).
        let moved_since_cut = self.counted_ring.version() != live.version();
        if moved_since_cut {
            let before = &self.counted_ring;
            let moved =
                |pair: Pair<'_>| match (before.owner(pair.account), live.owner(pair.account)) {
                    (Some(was), Some(is)) => was != is,
                    _ => false,
                };
            state.offer_joins(now, moved, &mut offer);
        }
        let mut confirms: BTreeMap<String, Vec<OwnedPair>> = BTreeMap::new();
        if peek {
            state.peek_surges(since, now, &rule, &mut offer);
        } else {
            let confirm = |pair: Pair<'_>| {
                if let Some(master) = live.owner(pair.account) {
                    confirms
                        .entry(master.to_owned())
                        .or_default()
                        .push(pair.to_owned());
                }
            };
            state.scan_surges_confirming(since, now, &rule, &mut offer, confirm);
        }
        // Pairs the local guard refuses under their op's default limit:
        // their master says their own limit at once (see
        // `AgentState::scan_surges_confirming`).
        for (master, pairs) in confirms {
            for chunk in pairs.chunks(max) {
                // Not retried: the first rollup's reply says it too.
                self.rechecks
                    .push((now, master.clone(), chunk.to_vec(), false));
            }
        }
        self.send_surges(now, batches, Sender::Scan);
        self.counts_went_out();
    }

    /// Step 4b: between the grid's scans, peeks at the pairs `check` just
    /// created that are due (see `AgentState::peek_young`), and sends
    /// those that surge as early reports. Returns when the next is due.
    fn peek_young(&mut self, now: Nanos, state: &AgentState) -> Option<Nanos> {
        let rule = self.config.fast_onset?;
        let due = state.young_due()?;
        if due > now {
            return Some(due);
        }
        self.report_between_scans(now, &rule, Sender::YoungPeek, |offer| {
            state.peek_young(now, &rule, offer)
        })
    }

    /// Early reports between the grid's scans, of the pairs `offer_all`
    /// offers (`by` a young peek or a poll's answer): each master's waits
    /// half a sub-window after any report to it (see `surge_sent`), and
    /// none is a sparse hint. Returns what `offer_all` does.
    fn report_between_scans<T>(
        &mut self,
        now: Nanos,
        rule: &SurgeRule,
        by: Sender,
        offer_all: impl FnOnce(&mut dyn FnMut(Pair<'_>, SurgeRates) -> bool) -> T,
    ) -> T {
        let max = self.config.max_entries_per_request.max(1);
        let busy = |master: &str| self.surge_busy(now, rule, true, master);
        let live = self.membership.live();
        let mut batches = SurgeBatches::default();
        let out =
            offer_all(&mut |pair, rates| batches.offer(live, busy, |_| false, max, pair, rates));
        self.send_surges(now, batches, by);
        out
    }

    /// Whether an early report cannot go to `master` at `now`: one is in
    /// flight, or one was sent less than half a sub-window ago by a young
    /// peek, or by anything when `young` (see `surge_sent`).
    fn surge_busy(&self, now: Nanos, rule: &SurgeRule, young: bool, master: &str) -> bool {
        self.surging.contains_key(master)
            || self.surge_sent.get(master).is_some_and(|(sent, by_young)| {
                (young || *by_young) && now.since(*sent) < rule.window() / 2
            })
    }

    /// Sends one early report per master of `batches`, sent `by` a scan of
    /// the grid or between its scans.
    fn send_surges(&mut self, now: Nanos, batches: SurgeBatches, by: Sender) {
        for (master, mut batch) in batches.0 {
            batch.sort_unstable_by(|(a, _), (b, _)| (&a.op, &a.account).cmp(&(&b.op, &b.account)));
            let query = FactorsQuery::surge(
                &self.config.agent_id,
                now,
                batch.iter().map(|(p, r)| (p.as_pair(), *r)),
            );
            let joined = batch.iter().filter(|(_, r)| r.joined).count();
            let hints = batch.iter().filter(|(_, r)| r.hint).count();
            let reported = batch.len();
            // The pairs whose verdicts the reply gives: a hint asks for
            // none (its reply lists none, and a verdict it carried could
            // be older than a push that crossed it), and marks no baseline
            // a failure would undo.
            let pairs: Vec<OwnedPair> = batch
                .into_iter()
                .filter(|(_, r)| !r.hint)
                .map(|(p, _)| p)
                .collect();
            self.events.push_back(RoundEvent::SurgeReported {
                master: master.clone(),
                pairs: reported,
                joined,
                young: if by == Sender::YoungPeek {
                    pairs.len()
                } else {
                    0
                },
                hints,
            });
            let flight = InFlight::Surge {
                master: master.clone(),
                pairs,
                again: Some(query.clone()),
            };
            let id = self.transmit(master.clone(), Message::Surge(query), flight);
            self.surge_sent
                .insert(master.clone(), (now, by != Sender::Scan));
            self.surging.insert(master, (id, now));
        }
    }

    /// The pairs' counts (or joins) have gone out by the live ring: the
    /// next joins are for pairs it moves after this.
    fn counts_went_out(&mut self) {
        let live = self.membership.live();
        if self.counted_ring.version() != live.version() {
            self.counted_ring = live.clone();
        }
    }

    /// Step 1: cut `[start, end)`, to be sent at `send_at`.
    fn cut(&mut self, end: Nanos, send_at: Nanos, state: &AgentState) {
        let start = self.start;
        self.rejoin(end);
        self.send_probes(end);
        self.resend_in_doubt(end);
        let live = self.membership.live();
        let ring_version = live.version();
        let routed = state.drain_by_owner(end, live);
        // This round's counts tell the new owners all a join would.
        self.counts_went_out();
        if !routed.unroutable.is_empty() {
            let rollup =
                Rollup::from_pending(&self.config.agent_id, start, end, 0, &routed.unroutable);
            self.events.push_back(RoundEvent::Unroutable(rollup));
            self.carry_over(routed.unroutable, start, end, state);
        }
        let max = self.config.max_entries_per_request.max(1);
        let mut batches = Vec::new();
        for (master, pending) in routed.by_master {
            let mut pending = pending.into_iter().peekable();
            while pending.peek().is_some() {
                batches.push((master.clone(), pending.by_ref().take(max).collect()));
            }
        }
        self.rounds += 1;
        self.cuts.push_back(Cut {
            send_at,
            round: self.rounds,
            start,
            end,
            ring_version,
            batches,
        });
        self.start = end;
        self.next_cut = end + self.config.rollup_interval;
    }

    /// Step 2: one transmit per request of a cut round.
    fn send(&mut self, cut: Cut, now: Nanos, state: &AgentState) {
        let open = Open {
            end: cut.end,
            outstanding: cut.batches.len(),
            ..Open::default()
        };
        self.open.insert(cut.round, open);
        for (master, pending) in cut.batches {
            let rollup = self.numbered(Rollup::from_drain(
                &self.config.agent_id,
                cut.start,
                cut.end,
                cut.ring_version,
                pending,
            ));
            let flight = InFlight::Rollup {
                round: cut.round,
                master: master.clone(),
                start: cut.start,
                end: cut.end,
                rollup: rollup.clone(),
                resent: 0,
                sent_at: now,
                defined: Defined::default(),
            };
            self.transmit(master, Message::Rollup(rollup), flight);
        }
        if self.open[&cut.round].outstanding == 0 {
            self.settle(cut.round, now, state);
        }
    }

    /// Puts back on the ring the masters whose rejoin instant has come.
    fn rejoin(&mut self, now: Nanos) {
        // Most timeouts: no member to bring back, and no list to make (it
        // was 1% of the simulator's time, a string per master each time).
        if self.membership.next_rejoin().is_none_or(|at| at > now) {
            return;
        }
        let before = self.live_members();
        if self.membership.tick(now) {
            for master in self.live_members() {
                if !before.contains(&master) {
                    self.events
                        .push_back(RoundEvent::RingChanged { master, up: true });
                }
            }
        }
    }

    /// Probes the down masters whose probe is due, each when it is due
    /// rather than at the next cut: a master back from a partition is back
    /// on the ring a probe's wait after the heal (up to 1.25 s), not a
    /// cut's (up to 2 s more).
    fn send_probes(&mut self, now: Nanos) {
        for master in self.membership.probes_due(now) {
            let query = FactorsQuery::new(&self.config.agent_id, []);
            self.transmit(
                master.clone(),
                Message::Probe(query),
                InFlight::Probe { master },
            );
        }
    }

    fn send_rechecks(&mut self, now: Nanos) {
        let (due, later) = std::mem::take(&mut self.rechecks)
            .into_iter()
            .partition(|r| r.0 <= now);
        self.rechecks = later;
        for (_, master, pairs, retry) in due {
            let asked = pairs.iter().map(OwnedPair::as_pair);
            let query = FactorsQuery::new(&self.config.agent_id, asked);
            let flight = InFlight::Recheck {
                master: master.clone(),
                pairs,
                retry,
            };
            self.transmit(master, Message::Recheck(query), flight);
        }
    }

    /// `rollup` with this run's incarnation and the next number: a resend
    /// keeps it, so a master that counted it once does not again.
    fn numbered(&mut self, mut rollup: Rollup) -> Arc<Rollup> {
        self.sequence += 1;
        rollup.incarnation = self.incarnation;
        rollup.sequence = self.sequence;
        Arc::new(rollup)
    }

    fn transmit(&mut self, master: String, message: Message, mut flight: InFlight) -> RequestId {
        let message = match message {
            Message::Rollup(rollup) => Message::Rollup(self.compact(&master, rollup, &mut flight)),
            other => other,
        };
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.in_flight.insert(id, flight);
        self.transmits.push_back(Transmit {
            id,
            master,
            message,
        });
        id
    }

    /// `rollup` as it goes to `master`: its accounts by number where the
    /// master holds them. The round keeps the named rollup (`flight`), and
    /// the numbers this sending defines.
    fn compact(&mut self, master: &str, rollup: Arc<Rollup>, flight: &mut InFlight) -> Arc<Rollup> {
        if !self.config.account_numbers {
            return rollup;
        }
        let dictionary = self.dictionary(master);
        if !dictionary.enabled() {
            return rollup;
        }
        let (compacted, defined) = dictionary.compact(&rollup);
        if let InFlight::Rollup { defined: d, .. } = flight {
            *d = defined;
        }
        Arc::new(compacted)
    }

    /// The dictionary of `master`, made if need be.
    fn dictionary(&mut self, master: &str) -> &mut AgentDictionary {
        if !self.dictionaries.contains_key(master) {
            self.dictionaries
                .insert(master.to_owned(), AgentDictionary::default());
        }
        self.dictionaries.get_mut(master).expect("just made sure")
    }

    /// Keeps `kept`, a rollup whose master went down before answering it,
    /// for that master. Whether the master counted it is unknown: a lost
    /// reply and a lost request look alike, and a one-way partition loses
    /// only replies. Carried into the next round, its counts would go to
    /// the account's next owner while the old one may have counted them
    /// and still hold them: counted twice for as long as the partition
    /// lasts, and in the ledger for good. Kept instead, it is sent again,
    /// with its number, when the master is back
    /// ([`resend_in_doubt`](Self::resend_in_doubt)), and the master counts
    /// it only if it had not. The next owner estimates from the rounds that
    /// follow (a round of one agent's counts is all it misses). Given up,
    /// and reported dropped, after [`IN_DOUBT_FOR`], or when more than
    /// [`IN_DOUBT_MAX`] wait for one master.
    fn park(&mut self, now: Nanos, master: String, kept: InDoubt) {
        if now.since(kept.sent_at) >= IN_DOUBT_FOR {
            self.dropped(kept.rollup.attempted());
            return;
        }
        let waiting = self.in_doubt.entry(master).or_default();
        // Oldest first: a rollup parked again after its resend failed goes
        // back in its place.
        let at = waiting.partition_point(|k| k.sent_at <= kept.sent_at);
        waiting.insert(at, kept);
        let over = waiting.len().saturating_sub(IN_DOUBT_MAX);
        let cost = waiting.drain(..over).map(|k| k.rollup.attempted()).sum();
        self.dropped(cost);
    }

    /// At a cut: sends the rollups kept in doubt to their masters that are
    /// up again, and gives up those kept too long.
    fn resend_in_doubt(&mut self, now: Nanos) {
        let masters: Vec<String> = self.in_doubt.keys().cloned().collect();
        for master in masters {
            let waiting = self.in_doubt.get_mut(&master).expect("listed");
            let old = waiting
                .iter()
                .take_while(|k| now.since(k.sent_at) >= IN_DOUBT_FOR)
                .count();
            let cost: u64 = waiting.drain(..old).map(|k| k.rollup.attempted()).sum();
            self.dropped(cost);
            if self.membership.is_up(&master) {
                let waiting = self.in_doubt.remove(&master).unwrap_or_default();
                for kept in waiting {
                    let flight = InFlight::Rollup {
                        round: kept.round,
                        master: master.clone(),
                        start: kept.start,
                        end: kept.end,
                        rollup: kept.rollup.clone(),
                        resent: ROLLUP_RESENDS,
                        sent_at: kept.sent_at,
                        defined: Defined::default(),
                    };
                    self.transmit(master.clone(), Message::Rollup(kept.rollup), flight);
                }
            } else if self.in_doubt[&master].is_empty() {
                self.in_doubt.remove(&master);
            }
        }
    }

    /// Reports `cost` attempted dropped, if any.
    fn dropped(&mut self, cost: u64) {
        if cost > 0 {
            self.events.push_back(RoundEvent::Dropped { cost });
        }
    }

    /// Puts back counts that could not be delivered; what is too old to
    /// fit any master's window is dropped, and said so.
    fn carry_over(&mut self, pending: Vec<Pending>, start: Nanos, end: Nanos, state: &AgentState) {
        let dropped: u64 = pending
            .into_iter()
            .map(|p| state.carry_over(p, start, end, self.config.max_carry))
            .sum();
        self.dropped(dropped);
    }

    /// One request of `round` is done; the round settles with its last.
    fn finish_one(&mut self, round: u64, master: String, ok: bool, now: Nanos, state: &AgentState) {
        let Some(open) = self.open.get_mut(&round) else {
            return;
        };
        let outcome = open.outcomes.entry(master).or_insert(true);
        *outcome &= ok;
        open.outstanding = open.outstanding.saturating_sub(1);
        if open.outstanding == 0 {
            self.settle(round, now, state);
        }
    }

    /// Step 5: the round's consequences.
    fn settle(&mut self, round: u64, now: Nanos, state: &AgentState) {
        let Some(open) = self.open.remove(&round) else {
            return;
        };
        for (master, ok) in open.outcomes {
            let changed = if ok {
                self.membership.succeeded(&master, now)
            } else {
                self.membership.failed(&master, now)
            };
            if changed {
                self.events
                    .push_back(RoundEvent::RingChanged { master, up: ok });
            }
        }
        if let Some((master, foreign)) = open.foreign {
            let hastened = self
                .membership
                .hasten_probes(now, self.config.rollup_interval);
            self.events.push_back(RoundEvent::ProbesHastened {
                master,
                foreign,
                hastened,
            });
        }
        let lapsed = state.expired_factors(now);
        let forgotten = state.forget_idle(now);
        self.events.push_back(RoundEvent::Settled {
            end: open.end,
            lapsed,
            forgotten,
            pairs: state.len(),
        });
    }

    fn check_interval(&mut self, master: &str, reply: &Reply) {
        if let Some(theirs) = reply.rollup_interval
            && theirs != self.config.rollup_interval
        {
            self.events.push_back(RoundEvent::IntervalMismatch {
                master: master.to_owned(),
                master_interval: theirs,
            });
        }
    }

    fn live_members(&self) -> Vec<String> {
        self.membership
            .live()
            .members()
            .map(str::to_owned)
            .collect()
    }
}

/// Early reports being gathered for one pass, per master, each within the
/// request's size and only for masters with none in flight.
#[derive(Default)]
struct SurgeBatches(BTreeMap<String, Vec<(OwnedPair, SurgeRates)>>);

impl SurgeBatches {
    /// Takes `pair`'s surge for its master on `live` unless that master
    /// is `busy` (see `AgentRound::surge_busy`), its batch is full
    /// (`max`), or it is a sparse hint and the master does not take them
    /// (`takes_hints`).
    fn offer(
        &mut self,
        live: &Ring,
        busy: impl Fn(&str) -> bool,
        takes_hints: impl Fn(&str) -> bool,
        max: usize,
        pair: Pair<'_>,
        rates: SurgeRates,
    ) -> bool {
        let Some(master) = live.owner(pair.account) else {
            return false;
        };
        if busy(master) || (rates.hint && !takes_hints(master)) {
            return false;
        }
        let batch = match self.0.get_mut(master) {
            Some(batch) => batch,
            None => self.0.entry(master.to_owned()).or_default(),
        };
        if batch.len() >= max {
            return false;
        }
        batch.push((pair.to_owned(), rates));
        true
    }
}
