//! TLS for the master's gRPC server, mutual when a client CA is set.

/// TLS for the master's gRPC server: its certificate and key, and, for
/// mutual authentication, the CA that agents' client certificates must chain
/// to. PEM throughout.
#[derive(Clone)]
pub struct ServerTls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    client_ca_pem: Option<Vec<u8>>,
    allowed: Option<crate::AllowList>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("ServerTls")
            .field("mutual", &self.client_ca_pem.is_some())
            .field("allowed", &self.allowed)
            .finish_non_exhaustive()
    }
}

/// Why TLS settings were refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("{field}: cannot read {path}: {source}")]
    Read {
        /// Which setting.
        field: &'static str,
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file does not hold what the setting needs.
    #[error("{field}: {path} holds no PEM {what}")]
    NotPem {
        /// Which setting.
        field: &'static str,
        /// The file.
        path: String,
        /// What was expected.
        what: &'static str,
    },
}

impl ServerTls {
    /// TLS with this certificate chain and key (PEM). Agents are not asked
    /// for certificates unless [`require_client_ca`](Self::require_client_ca)
    /// is set too.
    pub fn new(cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> ServerTls {
        ServerTls {
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
            client_ca_pem: None,
            allowed: None,
        }
    }

    /// With mutual TLS, only clients whose certificate carries a subject
    /// alternative name matching one of `patterns` (`*` globs) may report;
    /// others get PERMISSION_DENIED ([`AllowList`](crate::AllowList)).
    pub fn allow_identities(mut self, patterns: impl IntoIterator<Item = String>) -> ServerTls {
        self.allowed = Some(crate::AllowList::new(patterns));
        self
    }

    /// The identities allowed to report, when restricted.
    pub(crate) fn allowed(&self) -> Option<crate::AllowList> {
        self.allowed.clone()
    }

    /// Mutual TLS: refuse agents without a client certificate that chains to
    /// this CA (PEM).
    pub fn require_client_ca(mut self, ca_pem: impl Into<Vec<u8>>) -> ServerTls {
        self.client_ca_pem = Some(ca_pem.into());
        self
    }

    /// Reads the files, checking each holds what it should; errors name
    /// the flag (`--tls-cert`, `--tls-key`, `--tls-client-ca`).
    pub fn from_files(
        cert: &std::path::Path,
        key: &std::path::Path,
        client_ca: Option<&std::path::Path>,
    ) -> Result<ServerTls, TlsError> {
        let read = |field, path: &std::path::Path, marker: &str, what| {
            let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
                field,
                path: path.display().to_string(),
                source,
            })?;
            let text = String::from_utf8_lossy(&bytes);
            if !(text.contains("-----BEGIN ") && text.contains(marker)) {
                return Err(TlsError::NotPem {
                    field,
                    path: path.display().to_string(),
                    what,
                });
            }
            Ok(bytes)
        };
        let mut tls = ServerTls::new(
            read("--tls-cert", cert, "CERTIFICATE-----", "certificate")?,
            read("--tls-key", key, "PRIVATE KEY-----", "private key")?,
        );
        if let Some(ca) = client_ca {
            tls = tls.require_client_ca(read(
                "--tls-client-ca",
                ca,
                "CERTIFICATE-----",
                "certificate",
            )?);
        }
        Ok(tls)
    }

    /// How this master reaches its peers for the ring's view: presenting
    /// its own certificate and trusting the client CA (masters' and agents'
    /// certificates then chain to one CA); with one-way TLS it has no CA to
    /// check them with.
    pub(crate) fn peer_transport(&self) -> crate::ring_accounts::PeerTransport {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        match &self.client_ca_pem {
            Some(ca) => crate::ring_accounts::PeerTransport::Tls(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca))
                    .identity(Identity::from_pem(&self.cert_pem, &self.key_pem)),
            ),
            None => crate::ring_accounts::PeerTransport::Unverifiable,
        }
    }

    pub(crate) fn config(&self) -> tonic::transport::ServerTlsConfig {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let config =
            ServerTlsConfig::new().identity(Identity::from_pem(&self.cert_pem, &self.key_pem));
        match &self.client_ca_pem {
            Some(ca) => config.client_ca_root(Certificate::from_pem(ca)),
            None => config,
        }
    }
}
