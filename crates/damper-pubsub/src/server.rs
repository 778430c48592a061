//! The HTTP server: WebSocket upgrades on `GET /ws?account=ID`, one task
//! per connection, and a graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, watch};

use crate::frame::{bad_request, text};
use crate::node::{Subscriber, channel_key, check_name};
use crate::{ClientFrame, ErrorCode, Node, ServerFrame};

#[derive(Deserialize)]
struct ConnectParams {
    account: Option<String>,
}

/// The HTTP routes: `GET /ws?account=ID` upgrades to the protocol;
/// `GET /stats` is the node's counters as JSON.
pub fn router(node: Node, stopping: watch::Receiver<bool>) -> Router {
    Router::new()
        .route("/ws", get(upgrade))
        .route(
            "/stats",
            get(
                |State((node, _)): State<(Node, watch::Receiver<bool>)>| async move {
                    axum::Json(node.stats())
                },
            ),
        )
        .with_state((node, stopping))
}

async fn upgrade(
    State((node, stopping)): State<(Node, watch::Receiver<bool>)>,
    Query(params): Query<ConnectParams>,
    ws: WebSocketUpgrade,
) -> Response {
    let account = match params.account {
        Some(a) => a,
        None => {
            return (StatusCode::BAD_REQUEST, "connect with ?account=ID\n").into_response();
        }
    };
    if let Err(reason) = check_name("account", &account) {
        return (StatusCode::BAD_REQUEST, format!("{reason}\n")).into_response();
    }
    ws.on_upgrade(move |socket| connection(node, account, socket, stopping))
}

/// One client connection, until it closes or the node shuts down.
async fn connection(
    node: Node,
    account: String,
    mut socket: WebSocket,
    mut stopping: watch::Receiver<bool>,
) {
    let id = node.shared.next_connection.fetch_add(1, Relaxed);
    let (queue, mut outbound) = mpsc::channel::<Arc<str>>(node.shared.config.subscriber_queue);
    let me = Subscriber {
        queue,
        overflow: Arc::new(Notify::new()),
    };
    let mut subscribed: Vec<String> = Vec::new();
    tracing::debug!(connection = id, %account, "connected");
    loop {
        tokio::select! {
            () = async { let _ = stopping.wait_for(|s| *s).await; } => {
                let _ = socket.send(Message::Close(None)).await;
                break;
            }
            () = me.overflow.notified() => {
                let _ = socket.send(text(&ServerFrame::Error {
                    id: None,
                    code: ErrorCode::SlowConsumer,
                    reason: format!(
                        "more than {} messages queued for this connection: disconnected",
                        node.shared.config.subscriber_queue
                    ),
                    retry_after_ms: None,
                    limit: None,
                    demand: None,
                })).await;
                break;
            }
            delivery = outbound.recv() => {
                let Some(frame) = delivery else { break };
                if socket.send(Message::Text(frame.as_ref().into())).await.is_err() {
                    break;
                }
            }
            incoming = socket.recv() => {
                let text_frame = match incoming {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => continue, // ping/pong/binary: nothing to do
                };
                let reply = match serde_json::from_str::<ClientFrame>(&text_frame) {
                    Ok(ClientFrame::Publish { channel, id: publish, data }) => {
                        node.publish(id, &account, &channel, publish, &data)
                    }
                    Ok(ClientFrame::Subscribe { channel }) => match check_name("channel", &channel) {
                        Ok(()) => {
                            let key = channel_key(&account, &channel);
                            node.subscribe(key.clone(), id, me.clone());
                            if !subscribed.contains(&key) {
                                subscribed.push(key);
                            }
                            ServerFrame::Subscribed { channel }
                        }
                        Err(reason) => bad_request(reason),
                    },
                    Ok(ClientFrame::Unsubscribe { channel }) => {
                        let key = channel_key(&account, &channel);
                        node.unsubscribe(&key, id);
                        subscribed.retain(|k| *k != key);
                        ServerFrame::Unsubscribed { channel }
                    }
                    Err(e) => bad_request(format!("not a frame of this protocol: {e}")),
                };
                if socket.send(text(&reply)).await.is_err() {
                    break;
                }
            }
        }
    }
    for key in &subscribed {
        node.unsubscribe(key, id);
    }
    tracing::debug!(connection = id, %account, "disconnected");
}

/// Serves `node` on `listener` until `shutdown` completes; then closes every
/// connection, waits for them, and flushes the agent (a last rollup of what
/// it counted), so a node that stops reports everything it admitted.
pub async fn serve(
    listener: TcpListener,
    node: Node,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop, stopping) = watch::channel(false);
    let sweeper = {
        let node = node.clone();
        let mut stopping = stopping.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(node.shared.config.sweep_every);
            loop {
                tokio::select! {
                    () = async { let _ = stopping.wait_for(|s| *s).await; } => break,
                    _ = tick.tick() => {
                        let now = node.shared.agent.now();
                        node.shared.connections.sweep(now);
                        node.shared.channels.sweep(now);
                    }
                }
            }
        })
    };
    let result = axum::serve(listener, router(node.clone(), stopping))
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = stop.send(true);
        })
        .await;
    let _ = sweeper.await;
    node.shared.agent.shutdown().await;
    result
}
