//! `GET /v1/events`: the master's [`Events`](crate::events::Events) as
//! Server-Sent Events.
//!
//! Each event is sent with its number as the SSE `id`, its kind as the SSE
//! `event`, and its JSON ([`Event`]) as `data`.
//! Filters: `account=PREFIX` (accounts that start with it, as on
//! `/v1/accounts`), `op=OP`, and `kind=K[,K...]` (of `near_limit`,
//! `near_limit_ended`, `suppression_started`, `suppression_ended`). A client
//! that reconnects with `Last-Event-ID: N` first gets the kept events after
//! N; `after=N` asks the same on a first connection (a browser's
//! `EventSource` cannot set the header then; `after=0`: every kept event).
//! The header wins when both are given. One that falls [`SUBSCRIBER_BUFFER`] events behind gets a last
//! `dropped` event and is disconnected, counted in
//! `damper_master_event_subscribers_dropped_total`; publishing never waits
//! for it. Every stream ends when the master shuts down.
//!
//! [`SUBSCRIBER_BUFFER`]: crate::events::SUBSCRIBER_BUFFER

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use damper_core::master::TransitionKind;
use futures_util::stream::{self, Stream};
use tokio::sync::broadcast::error::RecvError;

use super::{AppState, error};
use crate::events::{Event, Subscription};

/// Which events a subscriber wants.
#[derive(Debug, Default)]
struct Filter {
    account: Option<String>,
    op: Option<String>,
    kinds: Option<Vec<&'static str>>,
    after: Option<u64>,
}

impl Filter {
    /// From the query string, strictly: an unknown parameter or kind is an
    /// error naming it.
    fn parse(params: &[(String, String)]) -> Result<Filter, String> {
        let mut filter = Filter::default();
        for (name, value) in params {
            match name.as_str() {
                "account" => filter.account = Some(value.clone()).filter(|v| !v.is_empty()),
                "op" => filter.op = Some(value.clone()).filter(|v| !v.is_empty()),
                "kind" => {
                    let kinds = value
                        .split(',')
                        .map(|k| {
                            TransitionKind::ALL
                                .iter()
                                .map(|t| t.name())
                                .find(|n| *n == k.trim())
                                .ok_or_else(|| {
                                    format!(
                                        "`kind` {k:?} is not one of near_limit, near_limit_ended, suppression_started, suppression_ended"
                                    )
                                })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    filter.kinds = Some(kinds);
                }
                "after" => {
                    filter.after =
                        Some(value.parse().map_err(|_| {
                            format!("`after` must be an event number, not {value:?}")
                        })?);
                }
                other => {
                    return Err(format!(
                        "unknown parameter `{other}`; expected account, op, kind or after"
                    ));
                }
            }
        }
        Ok(filter)
    }

    fn keeps(&self, event: &Event) -> bool {
        self.account
            .as_deref()
            .is_none_or(|p| event.account.starts_with(p))
            && self.op.as_deref().is_none_or(|o| o == event.op)
            && self.kinds.as_ref().is_none_or(|k| k.contains(&event.kind))
    }
}

/// The route.
pub(super) async fn events(
    State(state): State<AppState>,
    Query(params): Query<Vec<(String, String)>>,
    headers: HeaderMap,
) -> Response {
    let filter = match Filter::parse(&params) {
        Ok(filter) => filter,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let after = match headers.get("last-event-id") {
        None => filter.after,
        Some(value) => match value.to_str().ok().and_then(|v| v.trim().parse().ok()) {
            Some(id) => Some(id),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "`Last-Event-ID` must be an event number".to_string(),
                );
            }
        },
    };
    let subscription = state.master.events().subscribe(after);
    Sse::new(sse_stream(subscription, filter))
        .keep_alive(KeepAlive::default())
        .into_response()
}

struct Follow {
    missed: VecDeque<Arc<Event>>,
    subscription: Subscription,
    filter: Filter,
    done: bool,
}

fn sse_event(event: &Event) -> SseEvent {
    SseEvent::default()
        .id(event.id.to_string())
        .event(event.kind)
        .json_data(event)
        .unwrap_or_else(|_| SseEvent::default().comment("an event could not be encoded"))
}

/// The missed events, then the live ones, filtered.
fn sse_stream(
    subscription: Subscription,
    filter: Filter,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let follow = Follow {
        missed: subscription.missed.iter().cloned().collect(),
        subscription,
        filter,
        done: false,
    };
    stream::unfold(follow, |mut f| async move {
        loop {
            if f.done {
                return None;
            }
            if let Some(event) = f.missed.pop_front() {
                if f.filter.keeps(&event) {
                    return Some((Ok(sse_event(&event)), f));
                }
                continue;
            }
            let next = {
                let subscription = &mut f.subscription;
                tokio::select! {
                    received = subscription.live.recv() => Some(received),
                    _ = subscription.closed.wait_for(|closed| *closed) => None,
                }
            };
            match next {
                None | Some(Err(RecvError::Closed)) => return None,
                Some(Ok(event)) if f.filter.keeps(&event) => {
                    return Some((Ok(sse_event(&event)), f));
                }
                Some(Ok(_)) => {}
                Some(Err(RecvError::Lagged(behind))) => {
                    metrics::counter!("damper_master_event_subscribers_dropped_total").increment(1);
                    f.done = true;
                    let last = SseEvent::default().event("dropped").data(format!(
                        "{behind} events behind: reconnect with Last-Event-ID to resume from those kept"
                    ));
                    return Some((Ok(last), f));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_strictly_and_select() {
        let params = |q: &[(&str, &str)]| -> Vec<(String, String)> {
            q.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let f = Filter::parse(&params(&[
            ("account", "org/"),
            ("kind", "near_limit,suppression_started"),
        ]))
        .unwrap();
        let event = |account: &str, kind: &'static str| Event {
            id: 1,
            at_unix_ms: 0,
            kind,
            account: account.into(),
            op: "messages".into(),
            factor: 0.0,
            demand: 0.0,
            limit: 0.0,
        };
        assert!(f.keeps(&event("org/team", "near_limit")));
        assert!(!f.keeps(&event("other", "near_limit")));
        assert!(!f.keeps(&event("org/team", "suppression_ended")));
        for (bad, named) in [
            (vec![("kind", "nearly")], "`kind` \"nearly\""),
            (vec![("acount", "x")], "`acount`"),
        ] {
            let e = Filter::parse(&params(&bad)).unwrap_err();
            assert!(e.contains(named), "{e}");
        }
    }
}
