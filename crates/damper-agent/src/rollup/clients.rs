//! One lazily connected gRPC client per master, over TLS when configured.

use std::collections::HashMap;
use std::time::Duration;

use damper_proto::v1::master_client::MasterClient;
use tonic::transport::{Channel, Endpoint};

/// One lazily connected gRPC client per master.
pub(super) struct Clients {
    timeout: Duration,
    tls: Option<tonic::transport::ClientTlsConfig>,
    by_master: HashMap<String, MasterClient<Channel>>,
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
        }
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

    /// Drops the clients of masters no longer configured.
    pub(super) fn retain(&mut self, members: &[String]) {
        self.by_master.retain(|m, _| members.contains(m));
    }
}
