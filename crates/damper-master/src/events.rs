//! [`Events`]: what changed for which accounts, as operators follow it.
//!
//! Each [`Transition`] of a shard (an account near its limit or no longer,
//! suppression started or ended) becomes one [`Event`] with a number: a
//! log line at `info`, an entry in a bounded ring of the latest ones, and a
//! message to every live subscriber of `GET /v1/events` (Server-Sent
//! Events). A subscriber that comes back with `Last-Event-ID` is first
//! given what it missed, from the ring. Publishing never waits for a
//! subscriber: they share one bounded broadcast buffer, and one that falls
//! behind it is dropped (and counted) instead of slowing ingest.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use damper_core::master::{Transition, TransitionKind};
use damper_core::time::Nanos;
use serde::Serialize;
use tokio::sync::{broadcast, watch};

/// How many of the latest events are kept for subscribers that reconnect.
pub const KEPT: usize = 10_000;

/// How many events a live subscriber may fall behind before it is dropped.
pub const SUBSCRIBER_BUFFER: usize = 1_024;

/// One change for one (account, op), as `/v1/events` sends it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Event {
    /// Its number: increasing, from 1, for this master's run.
    pub id: u64,
    /// When the master saw it, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// `near_limit`, `near_limit_ended`, `suppression_started`,
    /// `suppression_ended`, or under a limit in shadow
    /// `shadow_suppression_started` and `shadow_suppression_ended`.
    pub kind: &'static str,
    /// The account.
    pub account: String,
    /// The operation.
    pub op: String,
    /// The factor now (0 once suppression ended).
    pub factor: f64,
    /// The demand estimate, cost per second.
    pub demand: f64,
    /// The limit, cost per second (0 when none applies any more).
    pub limit: f64,
}

struct Ring {
    next: u64,
    kept: VecDeque<Arc<Event>>,
}

/// The master's events: see the module docs.
pub struct Events {
    ring: Mutex<Ring>,
    live: broadcast::Sender<Arc<Event>>,
    closed: watch::Sender<bool>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            ring: Mutex::new(Ring {
                next: 1,
                kept: VecDeque::new(),
            }),
            live: broadcast::channel(SUBSCRIBER_BUFFER).0,
            closed: watch::channel(false).0,
        }
    }
}

/// A new subscriber: the events it missed, then the live ones.
pub struct Subscription {
    /// Kept events numbered after the `Last-Event-ID` given, oldest first.
    pub missed: Vec<Arc<Event>>,
    /// Every event from then on.
    pub live: broadcast::Receiver<Arc<Event>>,
    /// Becomes `true` when the master shuts down.
    pub closed: watch::Receiver<bool>,
}

impl Events {
    /// Numbers, logs, keeps and sends each of `transitions`, seen at `now`.
    pub fn publish(&self, now: Nanos, transitions: Vec<Transition>) {
        if transitions.is_empty() {
            return;
        }
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        for t in transitions {
            log(&t);
            metrics::counter!("damper_master_events_total", "kind" => t.kind.name()).increment(1);
            let event = Arc::new(Event {
                id: ring.next,
                at_unix_ms: now.as_millis(),
                kind: t.kind.name(),
                account: t.account,
                op: t.op,
                factor: t.factor,
                demand: t.demand,
                limit: t.limit,
            });
            ring.next += 1;
            if ring.kept.len() == KEPT {
                ring.kept.pop_front();
            }
            ring.kept.push_back(event.clone());
            // No subscriber is not an error; a full buffer drops the
            // slowest, never waits.
            let _ = self.live.send(event);
        }
    }

    /// Subscribes, with the kept events numbered after `after` (`None`:
    /// only those to come). Taken under the ring's lock, which publishing
    /// holds while it sends, so nothing is missed or sent twice between the
    /// two.
    pub fn subscribe(&self, after: Option<u64>) -> Subscription {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let missed = match after {
            None => Vec::new(),
            Some(after) => ring.kept.iter().filter(|e| e.id > after).cloned().collect(),
        };
        Subscription {
            missed,
            live: self.live.subscribe(),
            closed: self.closed.subscribe(),
        }
    }

    /// Ends every subscription: the master is shutting down, and its HTTP
    /// server waits for open responses.
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// The number the next event will get.
    pub fn next_id(&self) -> u64 {
        self.ring.lock().unwrap_or_else(|e| e.into_inner()).next
    }
}

/// One log line per event.
fn log(t: &Transition) {
    let (account, op) = (&t.account, &t.op);
    match t.kind {
        TransitionKind::Started => tracing::info!(
            %account, %op, factor = t.factor, demand = t.demand, limit = t.limit,
            "suppression started"
        ),
        TransitionKind::Stopped => {
            tracing::info!(%account, %op, demand = t.demand, "suppression stopped")
        }
        TransitionKind::NearLimit => tracing::info!(
            %account, %op, demand = t.demand, limit = t.limit, "near the limit"
        ),
        TransitionKind::NearLimitEnded => {
            tracing::info!(%account, %op, demand = t.demand, "no longer near the limit")
        }
        TransitionKind::ShadowStarted => tracing::info!(
            %account, %op, factor = t.factor, demand = t.demand, limit = t.limit,
            "suppression would start: the limit is in shadow, nothing is refused"
        ),
        TransitionKind::ShadowStopped => {
            tracing::info!(%account, %op, demand = t.demand, "shadow suppression stopped")
        }
        other => tracing::info!(%account, %op, kind = other.name(), "account changed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transition(account: &str, kind: TransitionKind) -> Transition {
        Transition {
            op: "messages".into(),
            account: account.into(),
            kind,
            factor: 0.5,
            demand: 2_000.0,
            limit: 1_000.0,
        }
    }

    #[test]
    fn events_are_numbered_kept_boundedly_and_replayed_after_the_last_seen() {
        let events = Events::default();
        let mut first = events.subscribe(None);
        events.publish(
            Nanos::from_millis(1_000),
            vec![
                transition("a", TransitionKind::NearLimit),
                transition("a", TransitionKind::Started),
            ],
        );
        assert_eq!(first.live.try_recv().unwrap().id, 1);
        assert_eq!(first.live.try_recv().unwrap().kind, "suppression_started");
        let again = events.subscribe(Some(1));
        assert_eq!(again.missed.iter().map(|e| e.id).collect::<Vec<_>>(), [2]);
        for i in 0..KEPT + 5 {
            events.publish(
                Nanos::from_millis(2_000),
                vec![transition(&format!("b{i}"), TransitionKind::NearLimit)],
            );
        }
        let late = events.subscribe(Some(1));
        assert_eq!(late.missed.len(), KEPT);
        assert_eq!(late.missed[0].id, 8);
        assert_eq!(events.next_id(), KEPT as u64 + 8);
        // The first subscriber never read: it fell behind, and is told so.
        assert!(matches!(
            first.live.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(_))
        ));
    }
}
