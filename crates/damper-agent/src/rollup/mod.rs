//! The rollup task: a thin driver of the core's sans-IO
//! [`AgentRound`]. It reads the clock, sleeps until the round's next
//! timeout, turns each [`Transmit`] into a gRPC call, hands back each
//! answer or error, and turns the round's events into logs, metrics and
//! [`AgentStats`](crate::AgentStats). Everything a round decides (when to
//! cut, where each account goes, what to carry over, when to recheck or
//! probe, when a master is down) is the round's, the same code the
//! simulator runs.
//!
//! # Layout
//! - this file: the loop, sending, answers, events.
//! - `members`: the masters' addresses (static, or DNS re-resolved).
//! - `clients`: one gRPC client per master, redialled after a timeout,
//!   with at most two rollups in flight to it.
//! - `refused`: a refused connection told from other failures.
//! - `watches`: one `Watch` stream per master, for its pushes.

mod clients;
mod members;
mod refused;
mod watches;

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use damper_core::round::{AgentRound, Message, RequestId, RoundConfig, RoundEvent, Transmit};
use damper_core::time::{Clock, SystemClock};
use damper_core::wire::{Reply, Rollup};
use damper_proto::v1::{FactorsRequest, RollupReply, RollupRequest};
use prost::Message as _;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::{Masters, Shared};
use clients::Clients;
use members::Members;
use watches::Watches;

pub(crate) struct Settings {
    pub(crate) masters: Masters,
    pub(crate) round: RoundConfig,
    pub(crate) request_timeout: Duration,
    pub(crate) tls: Option<crate::AgentTls>,
    /// Notified by the state when `check` creates the first young pair:
    /// the round is woken to schedule its peek.
    pub(crate) young: Arc<tokio::sync::Notify>,
}

/// What a sent request was, for counting its answer.
enum Sent {
    /// A rollup: its entries, encoded size, and per op the (admitted,
    /// attempted) cost it delivers if answered.
    Rollup {
        entries: usize,
        bytes: usize,
        per_op: Vec<(String, u64, u64)>,
    },
    Recheck,
    Probe,
    Surge,
}

/// A request's outcome, back from its task.
struct Answer {
    id: RequestId,
    master: String,
    sent: Sent,
    result: Result<RollupReply, tonic::Status>,
    took: Duration,
}

pub(crate) async fn run(shared: Arc<Shared>, settings: Settings, mut stop: watch::Receiver<bool>) {
    let mut members = Members::new(&settings.masters).await;
    let mut round = AgentRound::new(
        settings.round.clone(),
        members.list.iter(),
        SystemClock.now(),
    );
    let mut clients = Clients::new(settings.request_timeout, settings.tls.clone());
    let mut in_flight: JoinSet<Answer> = JoinSet::new();
    // Pushes come with fast onset only, whose early reports make them.
    let (push_tx, mut pushes) = tokio::sync::mpsc::unbounded_channel();
    let mut watches = settings
        .round
        .fast_onset
        .is_some()
        .then(|| Watches::new(&shared.agent_id, push_tx));
    if let Some(watches) = &mut watches {
        watch_all(watches, &mut clients, &members.list);
    }
    // Encoded size of what this agent holds undelivered this round: the
    // requests that failed and those with no master to go to.
    let mut undelivered = 0usize;
    let mut stopping = false;
    tracing::info!(agent = %shared.agent_id, masters = ?members.list, "damper agent started");
    loop {
        while let Some(transmit) = round.poll_transmit() {
            dispatch(&shared, &mut round, &mut clients, &mut in_flight, transmit);
        }
        while let Some(event) = round.poll_event() {
            let settled = matches!(event, RoundEvent::Settled { .. });
            record(&shared, &round, event, &mut undelivered);
            if settled
                && !stopping
                && let Some(list) = members.refresh_if_due().await
            {
                round.set_members(&list);
                clients.retain(&list);
                if let Some(watches) = &mut watches {
                    watches.retain(&list);
                    watch_all(watches, &mut clients, &list);
                }
            }
        }
        if stopping && round.is_finished() {
            break;
        }
        let wake = round.poll_timeout().map(|at| at.since(SystemClock.now()));
        tokio::select! {
            () = sleep(wake) => round.handle_timeout(SystemClock.now(), &shared.state),
            () = settings.young.notified(), if !stopping => {
                round.handle_timeout(SystemClock.now(), &shared.state);
            }
            Some(joined) = in_flight.join_next() => {
                // A send task that panicked: its counts are lost, nothing else.
                if let Ok(answer) = joined {
                    if let Err(status) = &answer.result {
                        clients.after_failure(&answer.master, status);
                    }
                    answered(&shared, &mut round, answer, &mut undelivered);
                }
            }
            Some((master, push)) = pushes.recv() => {
                round.on_push(SystemClock.now(), &master, &push, &shared.state);
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                round.stop(SystemClock.now(), &shared.state);
            }
        }
    }
    drop(watches);
    in_flight.abort_all();
    tracing::info!(agent = %shared.agent_id, "damper agent stopped after a last rollup");
}

async fn sleep(wake: Option<Duration>) {
    match wake {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Watches every master of `list` for pushes (those already watched
/// keep their stream).
fn watch_all(watches: &mut Watches, clients: &mut Clients, list: &[String]) {
    for master in list {
        match clients.get(master) {
            Ok(client) => watches.ensure(master, client),
            Err(e) => tracing::warn!(%master, error = %e, "bad master address"),
        }
    }
}

/// Sends one transmit as a gRPC call on its own task.
fn dispatch(
    shared: &Shared,
    round: &mut AgentRound,
    clients: &mut Clients,
    in_flight: &mut JoinSet<Answer>,
    transmit: Transmit,
) {
    let Transmit {
        id,
        master,
        message,
    } = transmit;
    let mut client = match clients.get(&master) {
        Ok(client) => client,
        Err(e) => {
            tracing::warn!(%master, error = %e, "bad master address");
            round.on_failure(shared.clock.now(), id, &shared.state);
            return;
        }
    };
    let rollup_slots = matches!(message, Message::Rollup(_)).then(|| clients.rollup_slots(&master));
    in_flight.spawn(async move {
        let mut began = tokio::time::Instant::now();
        let (sent, result) = match message {
            Message::Rollup(rollup) => {
                let per_op = per_op(&rollup);
                let entries = rollup.entries();
                let request = RollupRequest::from(Arc::unwrap_or_clone(rollup));
                let bytes = request.encoded_len();
                // Never closed, so a permit always comes.
                let _slot = match rollup_slots {
                    Some(slots) => slots.acquire_owned().await.ok(),
                    None => None,
                };
                began = tokio::time::Instant::now();
                let result = client.rollup(request).await;
                let sent = Sent::Rollup {
                    entries,
                    bytes,
                    per_op,
                };
                (sent, result)
            }
            Message::Recheck(query) => {
                let result = client.factors(FactorsRequest::from(query)).await;
                (Sent::Recheck, result)
            }
            Message::Probe(query) => {
                let result = client.factors(FactorsRequest::from(query)).await;
                (Sent::Probe, result)
            }
            Message::Surge(query) => {
                let result = client.factors(FactorsRequest::from(query)).await;
                (Sent::Surge, result)
            }
            _ => unreachable!("every message this round sends is handled"),
        };
        Answer {
            id,
            master,
            sent,
            result: result.map(tonic::Response::into_inner),
            took: began.elapsed(),
        }
    });
}

/// Per op, the (admitted, attempted) cost a rollup delivers, its entries
/// by name and by number alike.
fn per_op(rollup: &Rollup) -> Vec<(String, u64, u64)> {
    rollup
        .ops
        .iter()
        .map(|op| {
            let named = op.accounts.iter().map(|c| (c.admitted, c.attempted));
            let numbered = op.by_id.iter().map(|c| (c.admitted, c.attempted));
            let (admitted, attempted) =
                named
                    .chain(numbered)
                    .fold((0u64, 0u64), |(ad, at), (admitted, attempted)| {
                        (ad.saturating_add(admitted), at.saturating_add(attempted))
                    });
            (op.op.clone(), admitted, attempted)
        })
        .collect()
}

/// Counts an answer and hands it to the round.
fn answered(shared: &Shared, round: &mut AgentRound, answer: Answer, undelivered: &mut usize) {
    let Answer {
        id,
        master,
        sent,
        result,
        took,
    } = answer;
    let now = shared.clock.now();
    let refused = matches!(&result, Err(status) if refused::is_refused(status));
    let unknown_numbers =
        matches!(&result, Err(status) if status.code() == tonic::Code::FailedPrecondition);
    let failed = |round: &mut AgentRound| {
        if refused {
            round.on_refused(now, id, &shared.state);
        } else if unknown_numbers {
            round.on_unknown_numbers(now, id, &shared.state);
        } else {
            round.on_failure(now, id, &shared.state);
        }
    };
    match (sent, result) {
        (
            Sent::Rollup {
                entries,
                bytes,
                per_op,
            },
            Ok(reply),
        ) => {
            metrics::histogram!("damper_agent_rollup_duration_seconds").record(took.as_secs_f64());
            metrics::counter!("damper_agent_rollups_total", "result" => "ok").increment(1);
            shared
                .stats
                .answered(entries, bytes, reply.encoded_len(), took);
            count_delivered(per_op);
            round.on_reply(now, id, &Reply::from(reply), &shared.state);
        }
        (Sent::Rollup { bytes, .. }, Err(status)) => {
            metrics::histogram!("damper_agent_rollup_duration_seconds").record(took.as_secs_f64());
            metrics::counter!("damper_agent_rollups_total", "result" => "error").increment(1);
            shared.stats.rollups_failed.fetch_add(1, Relaxed);
            *undelivered += bytes;
            if unknown_numbers {
                // A master that restarted, or dropped this agent's account
                // numbers: the round resends the rollup naming every account.
                tracing::info!(%master, message = status.message(), "master lacks this agent's account numbers; resending with names");
            } else {
                tracing::warn!(%master, code = ?status.code(), message = status.message(), refused, "rollup failed");
            }
            failed(round);
        }
        (Sent::Recheck, Ok(reply)) => {
            metrics::counter!("damper_agent_rechecks_total", "result" => "ok").increment(1);
            round.on_reply(now, id, &Reply::from(reply), &shared.state);
        }
        (Sent::Recheck, Err(status)) => {
            // The factor in force stays until the next rollup's reply.
            metrics::counter!("damper_agent_rechecks_total", "result" => "error").increment(1);
            tracing::debug!(%master, code = ?status.code(), "factor recheck failed");
            failed(round);
        }
        (Sent::Probe, Ok(reply)) => round.on_reply(now, id, &Reply::from(reply), &shared.state),
        (Sent::Probe, Err(_)) => failed(round),
        (Sent::Surge, Ok(reply)) => {
            shared.stats.early_reports.fetch_add(1, Relaxed);
            metrics::counter!("damper_agent_early_reports_total", "result" => "ok").increment(1);
            round.on_reply(now, id, &Reply::from(reply), &shared.state);
        }
        (Sent::Surge, Err(status)) => {
            // Fails open: the factors in force stay, the rollups go on.
            shared.stats.early_reports_failed.fetch_add(1, Relaxed);
            metrics::counter!("damper_agent_early_reports_total", "result" => "error").increment(1);
            tracing::debug!(%master, code = ?status.code(), message = status.message(), "early report failed");
            failed(round);
        }
    }
}

/// Counts the cost admitted and rejected per op once a master has it:
/// `damper_agent_admitted_cost_total{op}` and
/// `damper_agent_rejected_cost_total{op}`. Counted here, off `check`'s path,
/// where each count is delivered exactly once (carried-over counts when
/// they finally go).
fn count_delivered(per_op: Vec<(String, u64, u64)>) {
    for (op, admitted, attempted) in per_op {
        metrics::counter!("damper_agent_admitted_cost_total", "op" => op.clone())
            .increment(admitted);
        metrics::counter!("damper_agent_rejected_cost_total", "op" => op)
            .increment(attempted.saturating_sub(admitted));
    }
}

/// Logs and counts what the round did.
fn record(shared: &Shared, round: &AgentRound, event: RoundEvent, undelivered: &mut usize) {
    match event {
        RoundEvent::RingChanged { master, up } => {
            let live: Vec<&str> = round.membership().live().members().collect();
            tracing::warn!(%master, up, ?live, "master ring changed");
        }
        RoundEvent::Rejoining { master } => {
            tracing::info!(%master, "master answers again; rejoining after its warm-up");
        }
        RoundEvent::ProbesHastened {
            master,
            foreign,
            hastened,
        } => {
            tracing::debug!(%master, entries = foreign, "the master does not own some accounts sent to it: this agent's ring differs");
            if hastened > 0 {
                tracing::info!(
                    hastened,
                    "a master reports a different ring: probing down masters now"
                );
            }
        }
        RoundEvent::IntervalMismatch {
            master,
            master_interval,
        } => {
            tracing::warn!(%master, master_ms = master_interval.as_millis() as u64,
                agent_ms = round.config().rollup_interval.as_millis() as u64,
                "rollup interval differs from the master's: rounds will not line up");
        }
        RoundEvent::Unroutable(rollup) => {
            tracing::warn!(
                entries = rollup.entries(),
                "no master to send counts to; carrying them over"
            );
            *undelivered += RollupRequest::from(rollup).encoded_len();
        }
        RoundEvent::SurgeReported {
            master,
            pairs,
            joined,
            young,
            hints,
        } => {
            tracing::debug!(%master, pairs, joined, young, hints, "early report of surges");
            metrics::counter!("damper_agent_early_report_pairs_total").increment(pairs as u64);
            if hints > 0 {
                shared.stats.hints_sent.fetch_add(hints as u64, Relaxed);
                metrics::counter!("damper_agent_hints_sent_total").increment(hints as u64);
            }
            if young > 0 {
                shared
                    .stats
                    .young_pairs_reported
                    .fetch_add(young as u64, Relaxed);
                metrics::counter!("damper_agent_young_pairs_reported_total")
                    .increment(young as u64);
            }
            if joined > 0 {
                tracing::info!(%master, joined, "pairs moved to this master; its estimate is told their rates");
                metrics::counter!("damper_agent_joined_pairs_total").increment(joined as u64);
            }
        }
        RoundEvent::Pushed {
            master,
            pairs,
            applied,
        } => {
            tracing::debug!(%master, pairs, applied, "push from a master");
            shared
                .stats
                .pushes_applied
                .fetch_add(applied as u64, Relaxed);
            metrics::counter!("damper_agent_pushed_pairs_applied_total").increment(applied as u64);
        }
        RoundEvent::Polled { master, pairs } => {
            tracing::debug!(%master, pairs, "a master polled pairs this agent holds");
            shared.stats.polls_answered.fetch_add(pairs as u64, Relaxed);
            metrics::counter!("damper_agent_polls_answered_total").increment(pairs as u64);
        }
        RoundEvent::Dropped { cost } => {
            shared.stats.dropped_cost.fetch_add(cost, Relaxed);
            metrics::counter!("damper_agent_rollup_dropped_cost_total").increment(cost);
        }
        RoundEvent::Settled {
            lapsed,
            forgotten,
            pairs,
            ..
        } => {
            metrics::gauge!("damper_agent_pending_bytes").set(*undelivered as f64);
            *undelivered = 0;
            // By the difference, so several agents in one process add up.
            let total = shared.stats.would_reject_cost.load(Relaxed);
            let before = shared.stats.would_reject_recorded.swap(total, Relaxed);
            metrics::counter!("damper_agent_would_reject_cost_total")
                .increment(total.saturating_sub(before));
            if lapsed > 0 {
                shared
                    .stats
                    .factors_expired
                    .fetch_add(lapsed as u64, Relaxed);
                metrics::counter!("damper_agent_factors_expired_total").increment(lapsed as u64);
                tracing::warn!(
                    lapsed,
                    "factors lapsed with no fresh one from their master: those (account, op) pairs fail open"
                );
            }
            shared.stats.forgotten.fetch_add(forgotten as u64, Relaxed);
            metrics::counter!("damper_agent_forgotten_total").increment(forgotten as u64);
            metrics::gauge!("damper_agent_pairs").set(pairs as f64);
        }
        _ => {}
    }
}
