//! One lazily connected gRPC client per master, over TLS when configured,
//! redialled after a call that timed out or lost its connection.
//!
//! Why redial: a connection whose packets one way were dropped (a one-way
//! partition, a dead middlebox) is left in TCP's retransmission backoff,
//! which doubles up to minutes. Kept, it carries every later call, the
//! probes that would bring the master back included, and only the next
//! retransmission after the link heals (measured up to 12 s later, after a
//! 16-s partition) gets anything through. A new connection starts fresh,
//! so a probe after the heal reaches the master at once. A connection
//! costs a handshake, paid only after a failure.
//!
//! Why a bound on rollups in flight: an agent with many pairs sends each
//! master one request per `max_entries_per_request` entries. Sent all at
//! once, they share the connection's bandwidth and the master's time, so
//! every one of them finishes late: measured with one agent holding two
//! million pairs, all 200 requests of a round timed out, round after round,
//! and no count ever arrived. A few at a time, each is sent, counted and
//! answered within its timeout, which starts when it is sent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use damper_proto::v1::master_client::MasterClient;
use tonic::transport::{Channel, Endpoint};

/// Rollups in flight to one master at a time: one being counted while the
/// next is on the wire.
pub(super) const ROLLUPS_IN_FLIGHT: usize = 2;

/// One lazily connected gRPC client per master.
pub(super) struct Clients {
    timeout: Duration,
    tls: Option<tonic::transport::ClientTlsConfig>,
    by_master: HashMap<String, MasterClient<Channel>>,
    /// Per master, the [`ROLLUPS_IN_FLIGHT`] permits its rollups wait for;
    /// kept across redials, so calls still in flight on a dropped
    /// connection count.
    rollup_slots: HashMap<String, Arc<Semaphore>>,
}

impl Clients {
    pub(super) fn new(timeout: Duration, tls: Option<crate::AgentTls>) -> Clients {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let tls = tls.map(|t| {
            let mut config =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&t.ca_pem));
            if let Some((cert, key)) = &t.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            match t.domain {
                Some(domain) => config.domain_name(domain),
                None => config,
            }
        });
        Clients {
            timeout,
            tls,
            by_master: HashMap::new(),
            rollup_slots: HashMap::new(),
        }
    }

    /// The permits a rollup to `master` takes before it is sent.
    /// Copies `master`'s name only the first time.
    pub(super) fn rollup_slots(&mut self, master: &str) -> Arc<Semaphore> {
        if let Some(slots) = self.rollup_slots.get(master) {
            return slots.clone();
        }
        let slots = Arc::new(Semaphore::new(ROLLUPS_IN_FLIGHT));
        self.rollup_slots.insert(master.to_owned(), slots.clone());
        slots
    }

    pub(super) fn get(
        &mut self,
        master: &str,
    ) -> Result<MasterClient<Channel>, tonic::transport::Error> {
        if let Some(client) = self.by_master.get(master) {
            return Ok(client.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{master}"))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let channel = endpoint
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        let client = MasterClient::new(channel);
        self.by_master.insert(master.to_owned(), client.clone());
        Ok(client)
    }

    /// Drops `master`'s connection after a call to it failed in a way that
    /// may leave the connection unusable (a timeout, a transport error), so
    /// the next call dials anew. Calls in flight on it finish or time out
    /// on their own. Errors the master answered leave the connection be.
    pub(super) fn after_failure(&mut self, master: &str, status: &tonic::Status) {
        if connection_suspect(status) {
            self.by_master.remove(master);
        }
    }

    /// Drops the clients of masters no longer configured.
    pub(super) fn retain(&mut self, members: &[String]) {
        self.by_master.retain(|m, _| members.contains(m));
        self.rollup_slots.retain(|m, _| members.contains(m));
    }
}

/// Whether a failed call says nothing of the connection's health: tonic's
/// timeout reads `Cancelled`, a deadline `DeadlineExceeded`, transport
/// errors `Unavailable` or `Unknown`. Any other code is the master's
/// answer, over a connection that works.
fn connection_suspect(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable | Code::Unknown
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clients_of(masters: &[&str]) -> Clients {
        let mut clients = Clients::new(Duration::from_millis(100), None);
        for master in masters {
            clients.get(master).unwrap();
        }
        clients
    }

    #[tokio::test]
    async fn a_timeout_or_transport_error_redials_and_an_answer_does_not() {
        let mut clients = clients_of(&["127.0.0.1:1", "127.0.0.1:2"]);
        clients.after_failure("127.0.0.1:1", &tonic::Status::cancelled("Timeout expired"));
        clients.after_failure(
            "127.0.0.1:2",
            &tonic::Status::invalid_argument("entries[0]"),
        );
        assert!(!clients.by_master.contains_key("127.0.0.1:1"));
        assert!(clients.by_master.contains_key("127.0.0.1:2"));
        for status in [
            tonic::Status::deadline_exceeded(""),
            tonic::Status::unavailable(""),
            tonic::Status::unknown(""),
        ] {
            clients.after_failure("127.0.0.1:2", &status);
            assert!(!clients.by_master.contains_key("127.0.0.1:2"), "{status:?}");
            clients.get("127.0.0.1:2").unwrap();
        }
        for status in [
            tonic::Status::resource_exhausted(""),
            tonic::Status::permission_denied(""),
            tonic::Status::unauthenticated(""),
        ] {
            clients.after_failure("127.0.0.1:2", &status);
            assert!(clients.by_master.contains_key("127.0.0.1:2"), "{status:?}");
        }
    }
}
