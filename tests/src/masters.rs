//! Real masters for the simulator (`damper_sim::engine::Masters`), so the
//! very same seeded run can be made against the product's master service:
//!
//! - [`WireMasters`]: [`Master`]s in-process on a manual clock, every
//!   message encoded to `damper.v1` bytes and decoded back exactly as gRPC
//!   carries it. Fast enough for simulated minutes.
//!   [`WireMasters::predating_fast_onset`] makes them masters as they were
//!   before fast onset, and [`WireMasters::predating_hints`] as they were
//!   before sparse hints, for the compatibility tests.
//! - [`GrpcMasters`]: [`Master`]s served over real gRPC on `127.0.0.1:0`,
//!   called with tonic's client, their clocks set to the simulated time of
//!   each call.
//!
//! Neither kills or restarts masters: scenarios with master events run
//! against the simulated masters.

use std::sync::Arc;

use damper_core::config::MasterConfig;
use damper_core::round::Message;
use damper_core::time::{ManualClock, Nanos};
use damper_core::wire::{Reply, Rollup};
use damper_master::{Master, MasterOptions};
use damper_proto::v1::master_client::MasterClient;
use damper_proto::v1::{FactorsRequest, RollupReply, RollupRequest};
use damper_sim::engine::{EPOCH, Masters, Refusal};
use prost::Message as _;
use tonic::transport::Channel;

use crate::served::ServedMaster;

/// The request a round message becomes on the wire.
enum Request {
    Rollup(RollupRequest),
    Factors(FactorsRequest),
}

fn request(message: &Message) -> Request {
    match message {
        Message::Rollup(r) => Request::Rollup(Rollup::clone(r).into()),
        Message::Recheck(q) | Message::Probe(q) | Message::Surge(q) => {
            Request::Factors(q.clone().into())
        }
        _ => unreachable!("every message a round sends is handled"),
    }
}

/// What an agent makes of an error status.
fn refusal(status: tonic::Status) -> Refusal {
    if status.code() == tonic::Code::FailedPrecondition {
        Refusal::UnknownNumbers
    } else {
        Refusal::Other
    }
}

/// A master's pushes, as its `Watch` stream would carry them.
type Watched = tokio::sync::broadcast::Receiver<Arc<Reply>>;

/// The push `watched` holds after an answer, if any, through
/// `damper.v1` bytes; `bytes` counts them.
fn next_push(watched: &mut Watched, bytes: &mut usize) -> Option<Reply> {
    let push = watched.try_recv().ok()?;
    let encoded = RollupReply::from(Reply::clone(&push)).encode_to_vec();
    *bytes += encoded.len();
    Some(
        RollupReply::decode(encoded.as_slice())
            .expect("a push decodes")
            .into(),
    )
}

/// Masters in-process, talked to through encoded `damper.v1` messages.
pub struct WireMasters {
    masters: Vec<Master>,
    /// Each master's pushes.
    watched: Vec<Watched>,
    clock: Arc<ManualClock>,
    /// Whether they behave as masters before fast onset did.
    old: bool,
    /// Whether they behave as masters before sparse hints did (fast onset
    /// otherwise as today): they decode early reports without `hints` and
    /// `ops`, and never say they take hints.
    before_hints: bool,
    /// Whether the agents decode pushes as agents before polls did: the
    /// polls a push carries are dropped on the way.
    pub agents_ignore_polls: bool,
    /// Pushes whose polls were dropped so.
    pub polls_dropped: usize,
    /// Bytes of requests and replies carried so far.
    pub wire_bytes: usize,
    /// Rollups that gave some account by number.
    pub numbered_rollups: usize,
}

/// `FactorsRequest` as `damper.v1` had it before fast onset: what a master
/// built then decodes from a new agent's request (protobuf drops the
/// fields it does not know).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FactorsRequestV0 {
    /// Field 1.
    #[prost(string, tag = "1")]
    pub agent_id: String,
    /// Field 2.
    #[prost(message, repeated, tag = "2")]
    pub ops: Vec<OpAccountsV0>,
}

/// `OpAccounts` before fast onset.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OpAccountsV0 {
    /// Field 1.
    #[prost(string, tag = "1")]
    pub op: String,
    /// Field 2.
    #[prost(string, repeated, tag = "2")]
    pub accounts: Vec<String>,
}

/// What a master that predates fast onset sees of `bytes`, a
/// `FactorsRequest`: the old fields alone, as today's type.
pub fn as_seen_before_fast_onset(bytes: &[u8]) -> FactorsRequest {
    let old = FactorsRequestV0::decode(bytes).expect("a FactorsRequest decodes as the old one");
    FactorsRequest::decode(old.encode_to_vec().as_slice()).expect("old fields decode")
}

impl WireMasters {
    /// `count` masters on `config` (TOML), started at the simulation's
    /// epoch.
    pub fn new(config: &str, count: usize) -> WireMasters {
        let config = MasterConfig::from_toml(config).expect("a valid config");
        let clock = Arc::new(ManualClock::new(EPOCH));
        let masters: Vec<Master> = (0..count)
            .map(|_| Master::with_clock(config.clone(), MasterOptions::default(), clock.clone()))
            .collect();
        WireMasters {
            watched: masters.iter().map(Master::watch).collect(),
            masters,
            clock,
            old: false,
            before_hints: false,
            agents_ignore_polls: false,
            polls_dropped: 0,
            wire_bytes: 0,
            numbered_rollups: 0,
        }
    }

    /// Masters as they were before fast onset: they decode only the old
    /// fields of `Factors` (an early report reads as a recheck, answered
    /// with the factors in force and counting nothing), and answer a
    /// request naming nothing (a new agent's hello) with no ops at all.
    pub fn predating_fast_onset(config: &str, count: usize) -> WireMasters {
        WireMasters {
            old: true,
            ..WireMasters::new(config, count)
        }
    }
}

impl WireMasters {
    /// Masters as they were before sparse hints, with fast onset as
    /// today: they decode early reports without `OpAccounts.hints` and
    /// `ops` (a hint would read as an early report of a jump) and never
    /// set `RollupReply.takes_hints`, so today's agents send them none.
    pub fn predating_hints(config: &str, count: usize) -> WireMasters {
        WireMasters {
            before_hints: true,
            ..WireMasters::new(config, count)
        }
    }
}

/// `OpAccounts` as `damper.v1` had it before sparse hints (fields 1–6).
#[derive(Clone, PartialEq, prost::Message)]
pub struct OpAccountsV1 {
    /// Field 1.
    #[prost(string, tag = "1")]
    pub op: String,
    /// Field 2.
    #[prost(string, repeated, tag = "2")]
    pub accounts: Vec<String>,
    /// Field 3.
    #[prost(float, repeated, tag = "3")]
    pub rates: Vec<f32>,
    /// Field 4.
    #[prost(float, repeated, tag = "4")]
    pub baselines: Vec<f32>,
    /// Field 5.
    #[prost(bool, repeated, tag = "5")]
    pub surged: Vec<bool>,
    /// Field 6.
    #[prost(bool, repeated, tag = "6")]
    pub joined: Vec<bool>,
}

/// `FactorsRequest` before sparse hints: its ops as [`OpAccountsV1`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct FactorsRequestV1 {
    /// Field 1.
    #[prost(string, tag = "1")]
    pub agent_id: String,
    /// Field 2.
    #[prost(message, repeated, tag = "2")]
    pub ops: Vec<OpAccountsV1>,
    /// Field 3.
    #[prost(uint64, tag = "3")]
    pub surge_at_unix_ms: u64,
}

/// What a master that predates sparse hints sees of `bytes`, a
/// `FactorsRequest`: the fields it knew, as today's type.
pub fn as_seen_before_hints(bytes: &[u8]) -> FactorsRequest {
    let old = FactorsRequestV1::decode(bytes).expect("a FactorsRequest decodes as the old one");
    FactorsRequest::decode(old.encode_to_vec().as_slice()).expect("old fields decode")
}

impl Masters for WireMasters {
    fn names(&self) -> Vec<String> {
        (0..self.masters.len())
            .map(|i| format!("127.0.0.1:{}", 7000 + i))
            .collect()
    }

    fn is_up(&self, _: usize) -> bool {
        true
    }

    fn answer(&mut self, m: usize, now: Nanos, message: &Message) -> Result<Reply, Refusal> {
        self.clock.set(now);
        let master = &self.masters[m];
        let reply = match request(message) {
            Request::Rollup(r) => {
                self.numbered_rollups += usize::from(r.ops.iter().any(|o| !o.ids.is_empty()));
                let bytes = r.encode_to_vec();
                self.wire_bytes += bytes.len();
                let mut reply = master.rollup_bytes(&bytes).map_err(refusal)?;
                // Masters before fast onset predate account numbers too.
                reply.takes_ids &= !self.old;
                reply.takes_hints &= !(self.old || self.before_hints);
                reply
            }
            Request::Factors(q) => {
                let bytes = q.encode_to_vec();
                self.wire_bytes += bytes.len();
                if self.old {
                    let seen = as_seen_before_fast_onset(&bytes);
                    let mut reply = master.factors(&seen).map_err(refusal)?;
                    if seen.ops.is_empty() {
                        reply.ops.clear();
                    }
                    reply.takes_hints = false;
                    reply
                } else if self.before_hints {
                    let mut reply = master
                        .factors(&as_seen_before_hints(&bytes))
                        .map_err(refusal)?;
                    reply.takes_hints = false;
                    reply
                } else {
                    let decoded = FactorsRequest::decode(bytes.as_slice()).expect("encoded above");
                    master.factors(&decoded).map_err(refusal)?
                }
            }
        };
        let bytes = reply.encode_to_vec();
        self.wire_bytes += bytes.len();
        Ok(RollupReply::decode(bytes.as_slice())
            .expect("a reply decodes")
            .into())
    }

    fn kill(&mut self, _: usize) {
        panic!("WireMasters do not kill masters: run master events against SimMasters");
    }

    fn take_push(&mut self, m: usize) -> Option<Reply> {
        // Masters before fast onset make no early reports' verdicts, and
        // have no stream to push them on.
        if self.old {
            return None;
        }
        let mut push = next_push(&mut self.watched[m], &mut self.wire_bytes)?;
        if self.agents_ignore_polls && !push.polls.is_empty() {
            push.polls.clear();
            self.polls_dropped += 1;
        }
        Some(push)
    }

    fn restart(&mut self, _: usize, _: Nanos) {
        panic!("WireMasters do not restart masters: run master events against SimMasters");
    }
}

/// Masters served over real gRPC on loopback.
pub struct GrpcMasters {
    runtime: tokio::runtime::Runtime,
    served: Vec<ServedMaster>,
    clients: Vec<MasterClient<Channel>>,
    clock: Arc<ManualClock>,
    /// Each master's pushes, taken in-process: the gRPC stream that
    /// carries them is `tests/agent.rs`'s to test, and waiting on it here
    /// would make the simulation's order depend on the network.
    watched: Vec<Watched>,
}

impl GrpcMasters {
    /// `count` masters on `config` (TOML), each served on its own port.
    pub fn new(config: &str, count: usize) -> GrpcMasters {
        let config = MasterConfig::from_toml(config).expect("a valid config");
        let clock = Arc::new(ManualClock::new(EPOCH));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let (served, clients) = runtime.block_on(async {
            let mut served = Vec::new();
            let mut clients = Vec::new();
            for _ in 0..count {
                let master =
                    Master::with_clock(config.clone(), MasterOptions::default(), clock.clone());
                let s = ServedMaster::start(master, None).await;
                let channel =
                    tonic::transport::Endpoint::from_shared(format!("http://{}", s.address))
                        .expect("an address")
                        .connect()
                        .await
                        .expect("the master serves");
                let client = MasterClient::new(channel);
                served.push(s);
                clients.push(client);
            }
            (served, clients)
        });
        GrpcMasters {
            runtime,
            watched: served.iter().map(|s| s.master.watch()).collect(),
            served,
            clients,
            clock,
        }
    }

    /// Stops every master, checking each served without error.
    pub fn stop(self) {
        let GrpcMasters {
            runtime, served, ..
        } = self;
        runtime.block_on(async {
            for s in served {
                s.stop().await;
            }
        });
    }
}

impl Masters for GrpcMasters {
    fn names(&self) -> Vec<String> {
        self.served.iter().map(|s| s.address.to_string()).collect()
    }

    fn is_up(&self, _: usize) -> bool {
        true
    }

    fn answer(&mut self, m: usize, now: Nanos, message: &Message) -> Result<Reply, Refusal> {
        self.clock.set(now);
        let mut client = self.clients[m].clone();
        let reply = self.runtime.block_on(async move {
            match request(message) {
                Request::Rollup(r) => client.rollup(r).await,
                Request::Factors(q) => client.factors(q).await,
            }
        });
        reply.map(|r| r.into_inner().into()).map_err(refusal)
    }

    fn kill(&mut self, _: usize) {
        panic!("GrpcMasters do not kill masters: run master events against SimMasters");
    }

    fn take_push(&mut self, m: usize) -> Option<Reply> {
        next_push(&mut self.watched[m], &mut 0)
    }

    fn restart(&mut self, _: usize, _: Nanos) {
        panic!("GrpcMasters do not restart masters: run master events against SimMasters");
    }
}
