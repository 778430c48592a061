//! Where the masters are: a fixed list, or a DNS name resolved again
//! every so often.

use std::time::Duration;

use crate::Masters;

/// The configured masters: a fixed list, or a DNS name resolved again
/// every so often.
pub(super) struct Members {
    pub(super) list: Vec<String>,
    dns: Option<Dns>,
}

struct Dns {
    host: String,
    port: u16,
    every: Duration,
    next: tokio::time::Instant,
}

impl Members {
    pub(super) async fn new(masters: &Masters) -> Members {
        match masters {
            Masters::Static(list) => Members {
                list: list.clone(),
                dns: None,
            },
            Masters::Dns { host, port, every } => {
                let mut members = Members {
                    list: Vec::new(),
                    dns: Some(Dns {
                        host: host.clone(),
                        port: *port,
                        every: *every,
                        next: tokio::time::Instant::now(),
                    }),
                };
                if let Some(list) = members.refresh_if_due().await {
                    members.list = list;
                }
                members
            }
        }
    }

    /// Resolves the DNS name again when due. Returns the new list if it
    /// changed.
    pub(super) async fn refresh_if_due(&mut self) -> Option<Vec<String>> {
        let dns = self.dns.as_mut()?;
        if tokio::time::Instant::now() < dns.next {
            return None;
        }
        dns.next = tokio::time::Instant::now() + dns.every;
        let target = format!("{}:{}", dns.host, dns.port);
        let resolved = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::lookup_host(target.clone()),
        )
        .await;
        let mut addresses: Vec<String> = match resolved {
            Ok(Ok(addrs)) => addrs.map(|a| a.to_string()).collect(),
            Ok(Err(e)) => {
                tracing::warn!(%target, error = %e, "cannot resolve masters; keeping the last list");
                return None;
            }
            Err(_) => {
                tracing::warn!(%target, "resolving masters timed out; keeping the last list");
                return None;
            }
        };
        addresses.sort();
        addresses.dedup();
        if addresses == self.list {
            return None;
        }
        tracing::info!(%target, masters = ?addresses, "master list changed");
        self.list = addresses.clone();
        Some(addresses)
    }
}
