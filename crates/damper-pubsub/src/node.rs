//! The node's shared state ([`Node`]): its limits, its subscriptions, and
//! the decision on each publish.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use damper_agent::local::{BucketConfig, Reduced, TokenBuckets};
use damper_agent::{Agent, Decision, Publisher};
use damper_core::wire::validate_name;
use serde::Serialize;
use tokio::sync::{Notify, mpsc};

use crate::{ErrorCode, OP, ServerFrame};

/// A channel's subscribers on this node, by connection id.
type Subscribers = HashMap<u64, Subscriber>;

/// A node's local limits.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
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
        NodeConfig::new(fifty, fifty)
    }
}

impl NodeConfig {
    /// These connection and channel limits, the rest by default.
    pub fn new(connection: BucketConfig, channel: BucketConfig) -> NodeConfig {
        NodeConfig {
            connection,
            channel,
            subscriber_queue: 4096,
            sweep_every: Duration::from_secs(10),
        }
    }
}

/// A subscriber's outbound queue, and how to tell its connection that the
/// queue overflowed.
#[derive(Clone)]
pub(crate) struct Subscriber {
    pub(crate) queue: mpsc::Sender<Arc<str>>,
    pub(crate) overflow: Arc<Notify>,
}

/// The node: the agent, the local limits, and who subscribes to what.
/// Cheap to clone (shared).
#[derive(Clone)]
pub struct Node {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) agent: Agent,
    pub(crate) config: NodeConfig,
    pub(crate) connections: TokenBuckets<u64>,
    /// Keyed `account \0 channel`.
    pub(crate) channels: TokenBuckets<String>,
    /// `account \0 channel` → subscribers.
    pub(crate) subscriptions: RwLock<HashMap<String, Subscribers>>,
    pub(crate) next_connection: AtomicU64,
    pub(crate) stats: NodeCounters,
}

#[derive(Default)]
pub(crate) struct NodeCounters {
    pub(crate) published: AtomicU64,
    pub(crate) delivered: AtomicU64,
    pub(crate) rejected_connection: AtomicU64,
    pub(crate) rejected_channel: AtomicU64,
    pub(crate) rejected_account: AtomicU64,
    pub(crate) would_reject_account: AtomicU64,
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
    /// Publishes accepted that the account-wide limit would have refused,
    /// were it not in shadow (the master's `[shadow]` table).
    pub would_reject_account: u64,
}

pub(crate) fn channel_key(account: &str, channel: &str) -> String {
    format!("{account}\0{channel}")
}

/// The agent's rule for names (1 to 256 bytes, the same the masters
/// enforce), and no NUL, which separates account from channel in keys.
pub(crate) fn check_name(what: &'static str, name: &str) -> Result<(), String> {
    validate_name(what, name).map_err(|e| e.to_string())?;
    if name.contains('\0') {
        return Err(format!("`{what}` must not contain NUL"));
    }
    Ok(())
}

pub(crate) fn millis(d: Duration) -> u64 {
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
            would_reject_account: s.would_reject_account.load(Relaxed),
        }
    }

    pub(crate) fn subscribe(&self, key: String, connection: u64, subscriber: Subscriber) {
        let mut subs = self
            .shared
            .subscriptions
            .write()
            .unwrap_or_else(|e| e.into_inner());
        subs.entry(key).or_default().insert(connection, subscriber);
    }

    pub(crate) fn unsubscribe(&self, key: &str, connection: u64) {
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
        let refuse = |code, reason: String, retry: Option<Duration>| ServerFrame::Error {
            id: Some(id),
            code,
            reason,
            retry_after_ms: retry.map(millis),
            limit: None,
            demand: None,
        };
        if let Err(reason) = check_name("channel", channel) {
            return refuse(ErrorCode::BadRequest, reason, None);
        }
        let key = channel_key(account, channel);
        if let Err((code, reason, retry)) = self.local_limits(connection, &key, channel) {
            return refuse(code, reason, retry);
        }
        let s = &self.shared;
        let subs = s.subscriptions.read().unwrap_or_else(|e| e.into_inner());
        let subscribers = subs.get(&key);
        let fanout = subscribers.map_or(0, |c| c.len() as u64);
        // The connection is the publisher: connections sharing an account
        // each keep their share of what it may publish.
        let decision = s
            .agent
            .check_from(account, OP, 1 + fanout, Publisher::new(connection));
        if decision.shadow_refusal().is_some() {
            s.stats.would_reject_account.fetch_add(1, Relaxed);
        }
        if let Decision::Reject(r) = decision {
            s.stats.rejected_account.fetch_add(1, Relaxed);
            let reason = format!(
                "account {account:?} attempts {:.0} message deliveries per second over all nodes, over its limit of {:.0}; {:.0}% of its publishes are refused",
                r.demand,
                r.limit,
                r.factor * 100.0
            );
            let mut frame = refuse(ErrorCode::AccountRateLimited, reason, Some(r.retry_after));
            if let ServerFrame::Error { limit, demand, .. } = &mut frame {
                (*limit, *demand) = (Some(r.limit), Some(r.demand));
            }
            return frame;
        }
        s.stats.published.fetch_add(1, Relaxed);
        if let Some(subscribers) = subscribers {
            self.deliver(subscribers, channel, id, data);
        }
        ServerFrame::Ack {
            id,
            subscribers: fanout,
            utilisation: decision.utilisation(),
        }
    }

    /// The node's own limits, in order: the connection's bucket, then the
    /// channel's. A refusal says which, the limit in words, and when to
    /// retry.
    fn local_limits(
        &self,
        connection: u64,
        key: &str,
        channel: &str,
    ) -> Result<(), (ErrorCode, String, Option<Duration>)> {
        let s = &self.shared;
        let now = s.agent.now();
        let refused = |code, what: String, c: BucketConfig, counter: &AtomicU64, retry| {
            counter.fetch_add(1, Relaxed);
            let limit = format!(
                "{what} may take {} messages, {} more every {:?}",
                c.capacity(),
                c.refill_amount(),
                c.refill_time()
            );
            Err((code, limit, retry))
        };
        if let Reduced::Denied { retry_after, .. } = s.connections.reduce(&connection, 1, now) {
            return refused(
                ErrorCode::ConnectionRateLimited,
                "this connection".into(),
                s.config.connection,
                &s.stats.rejected_connection,
                retry_after,
            );
        }
        if let Reduced::Denied { retry_after, .. } = s.channels.reduce(key, 1, now) {
            return refused(
                ErrorCode::ChannelRateLimited,
                format!("channel {channel:?}"),
                s.config.channel,
                &s.stats.rejected_channel,
                retry_after,
            );
        }
        Ok(())
    }

    /// Queues an admitted message to every subscriber of its channel. A
    /// subscriber too slow to keep up is told why and closed, never left
    /// to miss messages silently.
    fn deliver(&self, subscribers: &Subscribers, channel: &str, id: u64, data: &str) {
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
                    self.shared.stats.delivered.fetch_add(1, Relaxed);
                }
                Err(mpsc::error::TrySendError::Full(_)) => subscriber.overflow.notify_one(),
                // Disconnecting already.
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
    }
}
