//! One `Watch` stream per master, for its pushes
//! ([`damper_core::master::Push`]): verdicts an early report flipped,
//! sent to every agent. Each stream runs on its own task and hands what
//! it receives to the round's loop; it redials after an error, at most
//! once per [`REDIAL_AFTER`], and gives up on a master that predates pushes
//! (UNIMPLEMENTED). A stream that is down changes nothing else: `check`
//! never waits for it, and the pairs hear at their rounds as before.

use std::collections::HashMap;
use std::time::Duration;

use damper_core::wire::Reply;
use damper_proto::v1::WatchRequest;
use damper_proto::v1::master_client::MasterClient;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tonic::transport::Channel;

/// How long a stream that ended or failed waits before it redials.
pub(super) const REDIAL_AFTER: Duration = Duration::from_secs(1);

/// A push, from the master that sent it.
pub(super) type Pushed = (String, Reply);

/// The streams, one per master.
pub(super) struct Watches {
    agent_id: String,
    by_master: HashMap<String, AbortHandle>,
    pushes: mpsc::UnboundedSender<Pushed>,
}

impl Watches {
    /// No streams yet; what they receive goes to `pushes`.
    pub(super) fn new(agent_id: &str, pushes: mpsc::UnboundedSender<Pushed>) -> Watches {
        Watches {
            agent_id: agent_id.to_owned(),
            by_master: HashMap::new(),
            pushes,
        }
    }

    /// Starts watching `master` through `client`, unless it already is.
    pub(super) fn ensure(&mut self, master: &str, client: MasterClient<Channel>) {
        if self.by_master.contains_key(master) {
            return;
        }
        let task = tokio::spawn(watch(
            master.to_owned(),
            client,
            self.agent_id.clone(),
            self.pushes.clone(),
        ));
        self.by_master
            .insert(master.to_owned(), task.abort_handle());
    }

    /// Stops watching masters no longer configured.
    pub(super) fn retain(&mut self, members: &[String]) {
        self.by_master.retain(|m, task| {
            let keep = members.contains(m);
            if !keep {
                task.abort();
            }
            keep
        });
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for task in self.by_master.values() {
            task.abort();
        }
    }
}

/// Receives `master`'s pushes until the loop is gone or the master
/// predates pushes, redialling after each failure.
async fn watch(
    master: String,
    mut client: MasterClient<Channel>,
    agent_id: String,
    pushes: mpsc::UnboundedSender<Pushed>,
) {
    loop {
        let request = WatchRequest {
            agent_id: agent_id.clone(),
        };
        match client.watch(request).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(push)) => {
                            metrics::counter!("damper_agent_pushes_received_total").increment(1);
                            if pushes.send((master.clone(), Reply::from(push))).is_err() {
                                return;
                            }
                        }
                        Ok(None) => break,
                        Err(status) => {
                            tracing::debug!(%master, %status, "push stream ended");
                            break;
                        }
                    }
                }
            }
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                tracing::info!(%master, "master predates pushes; its agents hear at their rounds");
                return;
            }
            Err(status) => tracing::debug!(%master, %status, "cannot watch for pushes yet"),
        }
        if pushes.is_closed() {
            return;
        }
        tokio::time::sleep(REDIAL_AFTER).await;
    }
}
