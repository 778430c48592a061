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
//! 3. the account-wide limit, `agent.check_from(account, "messages", 1 +
//!    subscribers, connection)` (`account_rate_limited`): the publish
//!    costs one for the inbound message and one per delivery, and the
//!    connection is its publisher, so connections sharing an account each
//!    keep their share of it.
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
//! - `node`: [`NodeConfig`], [`Node`]: the limits, the shared state, and
//!   [`Node::publish`], the decision on each publish.
//! - `server`: [`serve`], the HTTP server (`GET /ws?account=ID` upgrades)
//!   until a shutdown future completes; it then closes every connection and
//!   flushes the agent's last rollup.
//! - `frame`: [`ClientFrame`], [`ServerFrame`]: the JSON protocol.
//! - `src/main.rs`: the `damper-pubsub` binary.
//!
//! # Protocol
//! ```text
//! → {"op":"subscribe","channel":"news"}          ← {"type":"subscribed","channel":"news"}
//! → {"op":"publish","channel":"news","id":7,"data":"hi"}
//!                                                ← {"type":"ack","id":7,"subscribers":3}
//!                    near the limit:             ← {"type":"ack","id":7,"subscribers":3,"utilisation":0.86}
//!                                   or           ← {"type":"error","id":7,"code":"account_rate_limited",
//!                                                    "reason":"...","retry_after_ms":412,
//!                                                    "limit":1000.0,"demand":4210.5}
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

mod frame;
mod node;
mod server;

pub use frame::{ClientFrame, ErrorCode, ServerFrame};
pub use node::{Node, NodeConfig, NodeStats};
pub use server::{router, serve};

/// The op every publish is checked under.
pub const OP: &str = "messages";
