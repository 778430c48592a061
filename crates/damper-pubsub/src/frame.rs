//! The JSON protocol: what clients send ([`ClientFrame`]) and what the
//! node answers ([`ServerFrame`]).

use axum::extract::ws::Message;
use serde::{Deserialize, Serialize};

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
        /// The account's deliveries per second over every node, over its
        /// limit, when its master says it is near that limit (at or above
        /// its near share, 0.8 by default): warn before refusals start.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        utilisation: Option<f32>,
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
        /// For `account_rate_limited`: the account's limit, message
        /// deliveries per second over all nodes.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        limit: Option<f64>,
        /// For `account_rate_limited`: the account's demand, deliveries
        /// attempted per second over all nodes, as its master estimates it.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        demand: Option<f64>,
    },
}

pub(crate) fn text(frame: &ServerFrame) -> Message {
    Message::Text(
        serde_json::to_string(frame)
            .expect("frames serialize")
            .into(),
    )
}

pub(crate) fn bad_request(reason: String) -> ServerFrame {
    ServerFrame::Error {
        id: None,
        code: ErrorCode::BadRequest,
        reason,
        retry_after_ms: None,
        limit: None,
        demand: None,
    }
}
