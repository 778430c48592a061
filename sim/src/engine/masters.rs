//! What answers the agents' requests: the simulated masters
//! ([`SimMasters`], one core [`MasterState`] each), or anything else that
//! speaks the round's messages (the test suite plugs real masters in over
//! gRPC on loopback, to check the simulator shows what the product does).

use std::time::Duration;

use damper_core::config::MasterConfig;
use damper_core::master::{MasterState, RollupLog, SurgeBudget, push_reply};
use damper_core::round::Message;
use damper_core::time::Nanos;
use damper_core::wire::dictionary::{Dictionaries, Expansion};
use damper_core::wire::{Reply, ReplyHeader, Rollup, RollupError};

/// The masters of a simulation. Network delay, loss and partitions are the
/// engine's; a master only answers, or is down.
pub trait Masters {
    /// Their addresses, as agents know them: master `m` is `names()[m]`.
    fn names(&self) -> Vec<String>;
    /// Whether master `m` is running.
    fn is_up(&self, m: usize) -> bool;
    /// Master `m` answers `message`, received at `now`, or refuses it
    /// (the agent sees an error status).
    fn answer(&mut self, m: usize, now: Nanos, message: &Message) -> Result<Reply, Refusal>;
    /// Stops master `m`, losing its state.
    fn kill(&mut self, m: usize);
    /// Starts master `m` again, empty, at `now`.
    fn restart(&mut self, m: usize, now: Nanos);
    /// What master `m` pushes to every agent after its last answer
    /// ([`damper_core::master::Push`]), if anything. Masters that do not
    /// push say `None`.
    fn take_push(&mut self, _m: usize) -> Option<Reply> {
        None
    }
}

/// Why a master refused a request, as far as an agent can tell from the
/// status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// A rollup gave accounts by numbers the master does not hold
    /// (FAILED_PRECONDITION): the agent resends it naming them.
    UnknownNumbers,
    /// Anything else (bad input, over a budget): a failure.
    Other,
}

impl From<&RollupError> for Refusal {
    fn from(error: &RollupError) -> Refusal {
        if error.is_unknown_numbers() {
            Refusal::UnknownNumbers
        } else {
            Refusal::Other
        }
    }
}

/// Most entries a simulated master takes in one request, as the service's
/// default.
const MAX_ENTRIES: usize = 100_000;

/// Masters simulated in-process, each one core [`MasterState`] answering
/// by the same rules as the service ([`MasterState::answer_rollup`]).
pub struct SimMasters {
    config: MasterConfig,
    masters: Vec<Option<MasterState>>,
    /// Each master's budget of early reports per agent.
    budgets: Vec<SurgeBudget>,
    /// Each master's numbered rollups counted lately: a resend after a
    /// lost reply is counted once, as by the service.
    logs: Vec<RollupLog>,
    /// Each master's dictionaries of agents' account numbers.
    dictionaries: Vec<Dictionaries>,
    /// When each (last) started: a probe's answer says so.
    started: Vec<Nanos>,
    /// Attempted cost counted by every master, and rollups answered as
    /// repeats (resends of rollups already counted).
    counted: (u64, u64),
    /// Whether the masters push verdicts early reports flipped.
    push: bool,
}

impl SimMasters {
    /// `count` masters on `config`, up since an hour before `now`, pushing
    /// (`push`) or not.
    pub fn new(config: &MasterConfig, count: usize, now: Nanos, push: bool) -> SimMasters {
        SimMasters {
            config: config.clone(),
            masters: (0..count).map(|_| Some(master(config, push))).collect(),
            budgets: (0..count).map(|_| SurgeBudget::default()).collect(),
            logs: (0..count).map(|_| RollupLog::default()).collect(),
            dictionaries: (0..count).map(|_| Dictionaries::default()).collect(),
            started: vec![now - Duration::from_secs(3600); count],
            counted: (0, 0),
            push,
        }
    }

    /// The attempted cost the masters counted, over the whole run (each
    /// rollup once), and how many resent rollups they answered without
    /// counting them again.
    pub fn counted(&self) -> (u64, u64) {
        self.counted
    }
}

impl Masters for SimMasters {
    fn names(&self) -> Vec<String> {
        (0..self.masters.len()).map(|m| format!("m{m}")).collect()
    }

    fn is_up(&self, m: usize) -> bool {
        self.masters[m].is_some()
    }

    fn answer(&mut self, m: usize, now: Nanos, message: &Message) -> Result<Reply, Refusal> {
        let mut header = ReplyHeader {
            rollup_interval: self.config.window.rollup_interval,
            started: self.started[m],
            ..ReplyHeader::default()
        };
        let state = self.masters[m].as_mut().expect("answered only when up");
        let answered = match message {
            Message::Rollup(rollup) => expand(&mut self.dictionaries[m], now, rollup)
                .and_then(|(named, mut expanded)| {
                    header.takes_ids = expanded.takes_ids;
                    header.takes_hints = rollup.tells_hints();
                    let rollup = named;
                    let log = &mut self.logs[m];
                    let answer = state.answer_rollup_once_near(
                        now,
                        &rollup,
                        &mut expanded,
                        log,
                        MAX_ENTRIES,
                        header,
                    );
                    if expanded.moved() {
                        self.dictionaries[m].learn(&expanded);
                    }
                    answer.map(|answer| (answer, rollup))
                })
                .map(|((reply, repeat), rollup)| {
                    if repeat {
                        self.counted.1 += 1;
                    } else {
                        let cost = rollup
                            .ops
                            .iter()
                            .flat_map(|o| &o.accounts)
                            .map(|c| c.attempted);
                        self.counted.0 += cost.sum::<u64>();
                    }
                    reply
                }),
            Message::Recheck(query) | Message::Probe(query) => {
                state.answer_factors(now, query, MAX_ENTRIES, header)
            }
            Message::Surge(query) => {
                state.answer_surge(now, query, &mut self.budgets[m], MAX_ENTRIES, header)
            }
            _ => unreachable!("every message a round sends is answered"),
        };
        answered.map_err(|e| Refusal::from(&e))
    }

    fn kill(&mut self, m: usize) {
        self.masters[m] = None;
    }

    fn restart(&mut self, m: usize, now: Nanos) {
        if self.masters[m].is_none() {
            self.masters[m] = Some(master(&self.config, self.push));
            self.budgets[m] = SurgeBudget::default();
            self.logs[m] = RollupLog::default();
            self.dictionaries[m] = Dictionaries::default();
            self.started[m] = now;
        }
    }

    fn take_push(&mut self, m: usize) -> Option<Reply> {
        let pushes = self.masters[m].as_mut()?.take_pushes();
        (!pushes.is_empty()).then(|| {
            let interval = self.config.window.rollup_interval;
            push_reply(&self.config, pushes, interval, self.started[m])
        })
    }
}

/// `rollup` with its account numbers turned back into names, as the
/// service does first, with whether the master takes numbers from its
/// sender and where their pairs were last found. A rollup that names every
/// account is not copied.
fn expand<'r>(
    dictionaries: &mut Dictionaries,
    now: Nanos,
    rollup: &'r Rollup,
) -> Result<(std::borrow::Cow<'r, Rollup>, Expansion), RollupError> {
    if rollup.dictionary == 0 {
        let expanded = Expansion::named(dictionaries.named(rollup)?);
        return Ok((std::borrow::Cow::Borrowed(rollup), expanded));
    }
    let mut named = rollup.clone();
    let expanded = dictionaries.expand_found(now, &mut named)?;
    Ok((std::borrow::Cow::Owned(named), expanded))
}

/// A master as the service runs it: queueing pushes when it pushes.
fn master(config: &MasterConfig, push: bool) -> MasterState {
    let mut state = MasterState::new(config.clone());
    state.track_pushes(push);
    state
}

/// Lends masters to a simulation, so the caller can look at them (or stop
/// them) after the run.
impl<M: Masters + ?Sized> Masters for &mut M {
    fn names(&self) -> Vec<String> {
        (**self).names()
    }

    fn is_up(&self, m: usize) -> bool {
        (**self).is_up(m)
    }

    fn answer(&mut self, m: usize, now: Nanos, message: &Message) -> Result<Reply, Refusal> {
        (**self).answer(m, now, message)
    }

    fn kill(&mut self, m: usize) {
        (**self).kill(m)
    }

    fn restart(&mut self, m: usize, now: Nanos) {
        (**self).restart(m, now)
    }

    fn take_push(&mut self, m: usize) -> Option<Reply> {
        (**self).take_push(m)
    }
}
