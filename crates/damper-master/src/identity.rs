//! Who may report: with mutual TLS, an allow-list of client identities
//! (`--tls-allow`), matched against the subject alternative names of the
//! certificate an agent presented: DNS names (`agent-*.edge.internal`) and
//! URIs (SPIFFE IDs, `spiffe://prod/edge/*`). A certificate from the CA
//! proves an agent is one of ours; the allow-list says which of ours may
//! write counts. Anyone else gets PERMISSION_DENIED and counts nothing.
//!
//! The common name is not matched: identities belong in SANs, and a CN is
//! free text that most CAs do not constrain.

use std::sync::Arc;

use tonic::Status;
use tonic::transport::CertificateDer;

/// Patterns of client identities allowed to report. `*` matches any run
/// of characters (none included); everything else matches itself, case
/// blind for DNS names as DNS is.
#[derive(Clone, Debug)]
pub struct AllowList {
    patterns: Arc<[String]>,
}

impl AllowList {
    /// The list of `patterns`.
    pub fn new(patterns: impl IntoIterator<Item = String>) -> AllowList {
        AllowList {
            patterns: patterns.into_iter().collect(),
        }
    }

    /// Whether `identity` matches a pattern.
    pub fn allows(&self, identity: &str) -> bool {
        self.patterns.iter().any(|p| glob(p, identity))
    }

    /// Admits a request whose peer presented `certs` (the leaf first) with
    /// a SAN on the list; PERMISSION_DENIED naming what was presented
    /// otherwise.
    pub fn check(&self, certs: Option<&[CertificateDer<'static>]>) -> Result<(), Status> {
        let Some(leaf) = certs.and_then(<[_]>::first) else {
            return Err(denied("no client certificate was presented".into()));
        };
        let names = sans(leaf);
        if names.iter().any(|n| self.allows(n)) {
            return Ok(());
        }
        Err(denied(format!(
            "the client certificate's identities [{}] match no --tls-allow pattern",
            names.join(", ")
        )))
    }
}

fn denied(why: String) -> Status {
    metrics::counter!("damper_master_identities_refused_total").increment(1);
    Status::permission_denied(format!("this client may not report to this master: {why}"))
}

/// The DNS and URI subject alternative names of a certificate (none if it
/// does not parse: the TLS layer already checked it chains to the CA).
fn sans(leaf: &CertificateDer<'_>) -> Vec<String> {
    match webpki::EndEntityCert::try_from(leaf) {
        Ok(cert) => cert
            .valid_dns_names()
            .chain(cert.valid_uri_names())
            .map(str::to_owned)
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// `*`-glob match, ASCII case-insensitive.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi].eq_ignore_ascii_case(&t[ti]) {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            // Let the last `*` take one more character.
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_dns_names_and_spiffe_ids() {
        let list = AllowList::new([
            "agent-*.edge.internal".into(),
            "spiffe://prod/edge/*".into(),
        ]);
        for yes in [
            "agent-1.edge.internal",
            "AGENT-eu-7.Edge.Internal",
            "spiffe://prod/edge/node-3",
        ] {
            assert!(list.allows(yes), "{yes}");
        }
        for no in [
            "agent-1.edge.internal.evil",
            "xagent-1.edge.internal",
            "spiffe://prod/core/x",
            "",
        ] {
            assert!(!list.allows(no), "{no}");
        }
        assert!(glob("*", ""));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXbYY"));
        assert!(glob("exact.name", "exact.name"));
    }

    #[test]
    fn no_certificate_is_denied() {
        let list = AllowList::new(["*".into()]);
        let status = list.check(None).unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status.message().contains("no client certificate"),
            "{status:?}"
        );
    }
}
