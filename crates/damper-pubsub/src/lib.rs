//! An example pub/sub node that links the Damper agent: a small but real
//! WebSocket server where clients connect with an account id, subscribe to
//! channels and publish messages.
//!
//! Every publish passes three limits, in order, and is refused *at publish
//! time* by the first that says no, with an error frame naming it and a
//! retry hint:
//!
//! 1. the connection's token bucket (`connection_rate_limited`),
//! 2. the channel's token bucket (`channel_rate_limited`),
//! 3. the account-wide limit, `agent.check(account, "messages", 1 +
//!    subscribers)` (`account_rate_limited`): the publish costs one for the
//!    inbound message and one per delivery.
//!
//! An admitted message is delivered to every subscriber of the channel on
//! this node, and the publisher gets an `ack` carrying the subscriber count.
//! Nothing accepted is dropped afterwards: a subscriber too slow to keep up
//! with its queue is disconnected with an error frame, not skipped.
//!
//! Channels are per account (`acme`'s `news` is not `globex`'s). This node
//! does not federate channels with other nodes: a real deployment forwards
//! to the subscribers on other nodes and counts them in the cost.
//!
//! # Layout
//! - [`NodeConfig`], [`Node`]: the limits and the shared state.
//! - [`serve`]: the HTTP server (`GET /ws?account=ID` upgrades) until a
//!   shutdown future completes; it then closes every connection and flushes
//!   the agent's last rollup.
//! - [`ClientFrame`], [`ServerFrame`]: the JSON protocol.
//! - `src/main.rs`: the `damper-pubsub` binary.
//!
//! # Protocol
//! ```text
//! → {"op":"subscribe","channel":"news"}          ← {"type":"subscribed","channel":"news"}
//! → {"op":"publish","channel":"news","id":7,"data":"hi"}
//!                                                ← {"type":"ack","id":7,"subscribers":3}
//!                                   or           ← {"type":"error","id":7,"code":"account_rate_limited",
//!                                                    "reason":"...","retry_after_ms":412}
//! ← {"type":"message","channel":"news","id":7,"data":"hi"}   (to every subscriber)
//! ```
//!
//! # Example
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use damper_agent::Agent;
//! use damper_pubsub::{Node, NodeConfig, serve};
//!
//! let agent = Agent::builder().masters(["127.0.0.1:7070"]).start()?;
//! let node = Node::new(agent, NodeConfig::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8090").await?;
//! serve(listener, node, async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use damper_agent::local::{BucketConfig, Reduced, TokenBuckets};
use damper_agent::{Agent, Decision};
use damper_core::wire::validate_name;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, watch};

/// The op every publish is checked under.
pub const OP: &str = "messages";

/// A node's local limits.
#[derive(Clone, Copy, Debug)]
pub struct NodeConfig {
    /// Each connection's inbound publishes. Default: 50 per second.
    pub connection: BucketConfig,
    /// Each channel's inbound publishes, over all its publishers on this
    /// node. Default: 50 per second.
    pub channel: BucketConfig,
    /// Messages queued for one subscriber before it is disconnected as too
    /// slow. Default 4096.
    pub subscriber_queue: usize,
    /// How often full buckets are swept. Default 10 s.
    pub sweep_every: Duration,
}

impl Default for NodeConfig {
    fn default() -> Self {
        let fifty = BucketConfig::per_second(50).expect("50 is not zero");
        NodeConfig {
            connection: fifty,
            channel: fifty,
            subscriber_queue: 4096,
            sweep_every: Duration::from_secs(10),
        }
    }
}

/// What a client sends, one JSON object per text frame.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientFrame {
    /// Receive the channel's messages.
    Subscribe {
        /// The channel (within the connection's account).
        channel: String,
    },
    /// Stop receiving them.
    Unsubscribe {
        /// The channel.
        channel: String,
    },
    /// Send a message to every subscriber of the channel.
    Publish {
        /// The channel.
        channel: String,
        /// The client's id for this publish, echoed in the ack or error.
        id: u64,
        /// The payload.
        data: String,
    },
}

/// Why a publish was refused: which limit, as the error frame's `code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The connection's own rate.
    ConnectionRateLimited,
    /// The channel's rate on this node.
    ChannelRateLimited,
    /// The account-wide limit, over every node.
    AccountRateLimited,
    /// A frame that is not valid JSON of the protocol, or a bad name.
    BadRequest,
    /// A subscriber whose queue is full: disconnected.
    SlowConsumer,
}

/// What the node sends, one JSON object per text frame.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerFrame {
    /// The subscription is in place.
    Subscribed {
        /// The channel.
        channel: String,
    },
    /// The subscription is gone.
    Unsubscribed {
        /// The channel.
        channel: String,
    },
    /// The publish was accepted and delivered to `subscribers` on this node.
    Ack {
        /// The publish's id.
        id: u64,
        /// Subscribers it was delivered to.
        subscribers: u64,
    },
    /// A message on a subscribed channel.
    Message {
        /// The channel.
        channel: String,
        /// The publisher's id for it.
        id: u64,
        /// The payload.
        data: String,
    },
    /// A refusal.
    Error {
        /// The publish's id, when a publish was refused.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        id: Option<u64>,
        /// Which limit, or what was wrong.
        code: ErrorCode,
        /// For people.
        reason: String,
        /// When trying again may succeed, when known.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        retry_after_ms: Option<u64>,
    },
}

/// A subscriber's outbound queue, and how to tell its connection that the
/// queue overflowed.
#[derive(Clone)]
struct Subscriber {
    queue: mpsc::Sender<Arc<str>>,
    overflow: Arc<Notify>,
}

/// A channel's subscribers on this node, by connection id.
type Subscribers = HashMap<u64, Subscriber>;

/// The node: the agent, the local limits, and who subscribes to what.
/// Cheap to clone (shared).
#[derive(Clone)]
pub struct Node {
    shared: Arc<Shared>,
}

struct Shared {
    agent: Agent,
    config: NodeConfig,
    connections: TokenBuckets<u64>,
    /// Keyed `account \0 channel`.
    channels: TokenBuckets<String>,
    /// `account \0 channel` → subscribers.
    subscriptions: RwLock<HashMap<String, Subscribers>>,
    next_connection: AtomicU64,
    stats: NodeCounters,
}

#[derive(Default)]
struct NodeCounters {
    published: AtomicU64,
    delivered: AtomicU64,
    rejected_connection: AtomicU64,
    rejected_channel: AtomicU64,
    rejected_account: AtomicU64,
}

/// What a node has done since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeStats {
    /// Publishes accepted.
    pub published: u64,
    /// Messages handed to subscribers' queues.
    pub delivered: u64,
    /// Publishes refused by the connection limit.
    pub rejected_connection: u64,
    /// Publishes refused by the channel limit.
    pub rejected_channel: u64,
    /// Publishes refused by the account-wide limit.
    pub rejected_account: u64,
}

fn channel_key(account: &str, channel: &str) -> String {
    format!("{account}\0{channel}")
}

/// The agent's rule for names (1 to 256 bytes, the same the masters
/// enforce), and no NUL, which separates account from channel in keys.
fn check_name(what: &'static str, name: &str) -> Result<(), String> {
    validate_name(what, name).map_err(|e| e.to_string())?;
    if name.contains('\0') {
        return Err(format!("`{what}` must not contain NUL"));
    }
    Ok(())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Node {
    /// A node deciding with `agent` under `config`'s local limits.
    pub fn new(agent: Agent, config: NodeConfig) -> Node {
        Node {
            shared: Arc::new(Shared {
                agent,
                config,
                connections: TokenBuckets::new(config.connection),
                channels: TokenBuckets::new(config.channel),
                subscriptions: RwLock::default(),
                next_connection: AtomicU64::new(1),
                stats: NodeCounters::default(),
            }),
        }
    }

    /// The agent.
    pub fn agent(&self) -> &Agent {
        &self.shared.agent
    }

    /// What the node has done since start.
    pub fn stats(&self) -> NodeStats {
        let s = &self.shared.stats;
        NodeStats {
            published: s.published.load(Relaxed),
            delivered: s.delivered.load(Relaxed),
            rejected_connection: s.rejected_connection.load(Relaxed),
            rejected_channel: s.rejected_channel.load(Relaxed),
            rejected_account: s.rejected_account.load(Relaxed),
        }
    }

    fn subscribe(&self, key: String, connection: u64, subscriber: Subscriber) {
        let mut subs = self
            .shared
            .subscriptions
            .write()
            .unwrap_or_else(|e| e.into_inner());
        subs.entry(key).or_default().insert(connection, subscriber);
    }

    fn unsubscribe(&self, key: &str, connection: u64) {
        let mut subs = self
            .shared
            .subscriptions
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = subs.get_mut(key) {
            channel.remove(&connection);
            if channel.is_empty() {
                subs.remove(key);
            }
        }
    }

    /// Decides one publish and, if admitted, delivers it: the three limits
    /// in order, then every subscriber's queue. Returns the frame for the
    /// publisher.
    pub fn publish(
        &self,
        connection: u64,
        account: &str,
        channel: &str,
        id: u64,
        data: &str,
    ) -> ServerFrame {
        let s = &self.shared;
        let refuse = |code, reason: String, retry: Option<Duration>| ServerFrame::Error {
            id: Some(id),
            code,
            reason,
            retry_after_ms: retry.map(millis),
        };
        if let Err(reason) = check_name("channel", channel) {
            return refuse(ErrorCode::BadRequest, reason, None);
        }
        let now = s.agent.now();
        // A local bucket's refusal: the limit, in words, and when to retry.
        let local = |code, what: String, c: BucketConfig, counter: &AtomicU64, retry| {
            counter.fetch_add(1, Relaxed);
            refuse(
                code,
                format!(
                    "{what} may take {} messages, {} more every {:?}",
                    c.capacity(),
                    c.refill_amount(),
                    c.refill_time()
                ),
                retry,
            )
        };
        if let Reduced::Denied { retry_after, .. } = s.connections.reduce(&connection, 1, now) {
            return local(
                ErrorCode::ConnectionRateLimited,
                "this connection".into(),
                s.config.connection,
                &s.stats.rejected_connection,
                retry_after,
            );
        }
        let key = channel_key(account, channel);
        if let Reduced::Denied { retry_after, .. } = s.channels.reduce(key.as_str(), 1, now) {
            return local(
                ErrorCode::ChannelRateLimited,
                format!("channel {channel:?}"),
                s.config.channel,
                &s.stats.rejected_channel,
                retry_after,
            );
        }
        let subs = s.subscriptions.read().unwrap_or_else(|e| e.into_inner());
        let subscribers = subs.get(&key);
        let fanout = subscribers.map_or(0, |c| c.len() as u64);
        if let Decision::Reject(r) = s.agent.check(account, OP, 1 + fanout) {
            s.stats.rejected_account.fetch_add(1, Relaxed);
            return refuse(
                ErrorCode::AccountRateLimited,
                format!(
                    "account {account:?} is over its limit of {:.0} message deliveries per second over all nodes; {:.0}% of its publishes are refused",
                    r.limit,
                    r.factor * 100.0
                ),
                Some(r.retry_after),
            );
        }
        s.stats.published.fetch_add(1, Relaxed);
        if let Some(subscribers) = subscribers {
            let frame: Arc<str> = serde_json::to_string(&ServerFrame::Message {
                channel: channel.to_owned(),
                id,
                data: data.to_owned(),
            })
            .expect("frames serialize")
            .into();
            for subscriber in subscribers.values() {
                match subscriber.queue.try_send(frame.clone()) {
                    Ok(()) => {
                        s.stats.delivered.fetch_add(1, Relaxed);
                    }
                    // Too slow to keep up: its connection is told why and
                    // closed, never left to miss messages silently.
                    Err(mpsc::error::TrySendError::Full(_)) => subscriber.overflow.notify_one(),
                    // Disconnecting already.
                    Err(mpsc::error::TrySendError::Closed(_)) => {}
                }
            }
        }
        ServerFrame::Ack {
            id,
            subscribers: fanout,
        }
    }
}

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

fn text(frame: &ServerFrame) -> Message {
    Message::Text(
        serde_json::to_string(frame)
            .expect("frames serialize")
            .into(),
    )
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

fn bad_request(reason: String) -> ServerFrame {
    ServerFrame::Error {
        id: None,
        code: ErrorCode::BadRequest,
        reason,
        retry_after_ms: None,
    }
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
