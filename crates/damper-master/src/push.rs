//! Pushes to every watching agent ([`damper_core::master::Push`]): the
//! verdicts early reports flipped, sent as they happen on each agent's
//! `Watch` stream.
//!
//! One bounded broadcast buffer: a watcher that falls [`PUSH_BUFFER`]
//! pushes behind skips to the newest (counted), since a stale push is worth
//! nothing and its pairs hear at their rounds anyway.

use std::sync::Arc;

use damper_core::wire::Reply;
use tokio::sync::broadcast;

/// Pushes a watcher may fall behind before it skips.
pub const PUSH_BUFFER: usize = 64;

/// The pushes going out, and who watches them.
#[derive(Debug)]
pub(crate) struct Pushes {
    live: broadcast::Sender<Arc<Reply>>,
}

impl Default for Pushes {
    fn default() -> Self {
        Pushes {
            live: broadcast::channel(PUSH_BUFFER).0,
        }
    }
}

impl Pushes {
    /// Sends `push` to every watcher, counted by its pairs and its
    /// receivers.
    pub(crate) fn publish(&self, push: Reply) {
        let pairs: usize = push.ops.iter().map(|o| o.listed.len()).sum();
        metrics::counter!("damper_master_pushed_pairs_total").increment(pairs as u64);
        if let Ok(watchers) = self.live.send(Arc::new(push)) {
            metrics::counter!("damper_master_pushes_sent_total").increment(watchers as u64);
        }
    }

    /// A new watcher's receiver.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<Reply>> {
        self.live.subscribe()
    }
}
