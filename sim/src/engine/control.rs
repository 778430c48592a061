//! Control traffic: the requests agents send to masters, by kind, and the
//! bytes they and their replies take as the services encode them
//! (`damper.v1`). What fast onset must not add to when nothing surges.

use damper_core::round::Message;
use damper_core::wire::{Reply, Rollup};
use damper_proto::v1;
use prost::Message as _;
use serde::Serialize;

/// Requests and bytes over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Control {
    /// Rollups sent.
    pub rollups: u64,
    /// Rechecks (`Factors` a reply asked for).
    pub rechecks: u64,
    /// Probes of down masters and new rounds' hellos.
    pub probes: u64,
    /// Early reports of surges.
    pub surges: u64,
    /// (account, op) entries the rollups carried: what a master ingests.
    pub rollup_entries: u64,
    /// Bytes of the rollups alone, encoded: with `rollup_entries`, the
    /// wire's bytes per entry (docs/scale.md).
    pub rollup_bytes: u64,
    /// Bytes of the requests, encoded.
    pub request_bytes: u64,
    /// Bytes of the replies that came back, encoded.
    pub reply_bytes: u64,
    /// Pushes that reached an agent (verdicts early reports flipped, sent
    /// to every agent on a stream: messages, not requests).
    pub pushes: u64,
    /// Bytes of those pushes, encoded.
    pub push_bytes: u64,
    /// Sparse hints the early reports carried (entries, not requests).
    pub hints: u64,
    /// Pushes that reached an agent carrying polls (among `pushes`).
    pub poll_pushes: u64,
}

impl Control {
    /// Every request sent.
    pub fn rpcs(&self) -> u64 {
        self.rollups + self.rechecks + self.probes + self.surges
    }

    /// Bytes both ways, pushes included.
    pub fn bytes(&self) -> u64 {
        self.request_bytes + self.reply_bytes + self.push_bytes
    }

    /// Counts a request leaving an agent.
    pub(super) fn sent(&mut self, message: &Message) {
        let (count, bytes) = match message {
            Message::Rollup(r) => {
                let bytes = v1::RollupRequest::from(Rollup::clone(r)).encoded_len();
                self.rollup_entries += r.entries() as u64;
                self.rollup_bytes += bytes as u64;
                (&mut self.rollups, bytes)
            }
            Message::Recheck(q) => (
                &mut self.rechecks,
                v1::FactorsRequest::from(q.clone()).encoded_len(),
            ),
            Message::Probe(q) => (
                &mut self.probes,
                v1::FactorsRequest::from(q.clone()).encoded_len(),
            ),
            Message::Surge(q) => {
                self.hints += q.surges().filter(|(_, s)| s.hint).count() as u64;
                (
                    &mut self.surges,
                    v1::FactorsRequest::from(q.clone()).encoded_len(),
                )
            }
            _ => unreachable!("every message a round sends is counted"),
        };
        *count += 1;
        self.request_bytes += bytes as u64;
    }

    /// Counts a reply reaching an agent.
    pub(super) fn answered(&mut self, reply: &Reply) {
        self.reply_bytes += v1::RollupReply::from(reply.clone()).encoded_len() as u64;
    }

    /// A push's encoded size: measured once, counted at each agent it
    /// reaches.
    pub(super) fn push_size(reply: &Reply) -> u64 {
        v1::RollupReply::from(reply.clone()).encoded_len() as u64
    }

    /// Counts a push of `bytes` reaching an agent, `polls` or not.
    pub(super) fn pushed(&mut self, bytes: u64, polls: bool) {
        self.pushes += 1;
        self.poll_pushes += u64::from(polls);
        self.push_bytes += bytes;
    }
}
