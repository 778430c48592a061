//! One view of the whole ring: any master answers for every master's
//! accounts by asking its peers (`damper.v1.Master/Accounts`) in parallel,
//! each within a timeout, and merging their rows with its own. A peer that
//! does not answer in time is named, and the view marked partial: an
//! operator sees at once that some accounts may be missing, rather than
//! a table that quietly lacks a master's accounts.
//!
//! Peers are the other members of `--ring` (gRPC addresses, as agents
//! dial them); their channels are made on first use and kept, and a peer's
//! is made anew after it did not answer: a connection a partition left in
//! TCP's retransmission backoff would otherwise keep the peer missing for
//! many seconds after the network healed. Over TLS a
//! master presents its own certificate and trusts `--tls-client-ca`, so
//! that is the CA its peers' certificates must chain to (with the
//! `clientAuth` usage beside `serverAuth`), and their identities must be
//! allowed (`--tls-allow`) like an agent's.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use damper_core::master::KeyView;
use damper_proto::v1::master_client::MasterClient;
use damper_proto::v1::{AccountView, AccountsReply, AccountsRequest};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::{AccountsQuery, AccountsSort, Master};

/// How long a peer has to answer before the view goes out without it.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(1);

/// How this master reaches its peers.
#[derive(Clone, Debug, Default)]
pub(crate) enum PeerTransport {
    /// Plain TCP: the master serves plain TCP too.
    #[default]
    Plain,
    /// TLS, presenting this master's certificate.
    Tls(ClientTlsConfig),
    /// One-way TLS: this master has no CA to check its peers with.
    Unverifiable,
}

/// The peers' channels, made on first use, and anew after a peer did not
/// answer.
#[derive(Default)]
pub(crate) struct Peers {
    pub(crate) transport: OnceLock<PeerTransport>,
    channels: Mutex<Vec<(String, Result<Channel, String>)>>,
}

/// One row of the ring's view: which master holds it, and what it says.
#[derive(Clone, Debug, PartialEq)]
pub struct RingRow {
    /// The master's address in the ring.
    pub master: String,
    /// The pair as that master sees it.
    pub view: KeyView,
}

/// A peer that did not answer, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Missing {
    /// Its address in the ring.
    pub master: String,
    /// What went wrong: a timeout, a refused connection, a status.
    pub error: String,
}

/// What [`Master::ring_accounts`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct RingAccounts {
    /// The rows, merged, sorted and cut as the query says.
    pub rows: Vec<RingRow>,
    /// Rows that matched over every master that answered, before the cut.
    pub matched: usize,
    /// The masters that answered, this one first.
    pub answered: Vec<String>,
    /// The masters that did not.
    pub missing: Vec<Missing>,
}

impl Master {
    /// Sets how peers are reached: plain TCP unless told (the gRPC server
    /// sets it from its TLS before serving). Later calls are ignored.
    pub(crate) fn set_peer_transport(&self, transport: PeerTransport) {
        let _ = self.shared.peers.transport.set(transport);
    }

    /// `query` over the whole ring: this master's rows and every peer's,
    /// asked in parallel, each within [`PEER_TIMEOUT`]. Without a ring
    /// (`set_ring`), only this master's, named `None`.
    pub async fn ring_accounts(&self, query: &AccountsQuery) -> Option<RingAccounts> {
        let ring = self.shared.ring.get()?;
        let request = request(query);
        let asks = self.peer_channels().into_iter().map(|(peer, channel)| {
            let request = request.clone();
            async move {
                let answer = match channel {
                    Ok(channel) => ask(channel, request).await,
                    Err(why) => Err(why),
                };
                (peer, answer)
            }
        });
        let answers = futures_util::future::join_all(asks).await;
        let (own, own_matched) = self.accounts(query);
        let mut merged = RingAccounts {
            rows: own
                .into_iter()
                .map(|view| RingRow {
                    master: ring.me().to_owned(),
                    view,
                })
                .collect(),
            matched: own_matched,
            answered: vec![ring.me().to_owned()],
            missing: Vec::new(),
        };
        for (peer, answer) in answers {
            if answer.is_err() {
                self.redial(&peer);
            }
            match answer {
                Ok(reply) => {
                    merged.matched += reply.matched as usize;
                    merged
                        .rows
                        .extend(reply.accounts.into_iter().map(|row| RingRow {
                            master: peer.clone(),
                            view: view(row),
                        }));
                    merged.answered.push(peer);
                }
                Err(error) => merged.missing.push(Missing {
                    master: peer,
                    error,
                }),
            }
        }
        merged
            .rows
            .sort_by(|a, b| crate::accounts::order(query.sort, &a.view, &b.view));
        merged.rows.truncate(query.limit);
        Some(merged)
    }

    /// The channels to every other member of the ring, made once the gRPC
    /// server has said how peers are reached (before that, none: each peer
    /// is reported missing, rather than a channel made without the TLS the
    /// server is about to use).
    fn peer_channels(&self) -> Vec<(String, Result<Channel, String>)> {
        let Some(ring) = self.shared.ring.get() else {
            return Vec::new();
        };
        let Some(transport) = self.shared.peers.transport.get() else {
            return ring
                .peers()
                .map(|peer| {
                    let why = "this master's gRPC server has not started yet".to_owned();
                    (peer.to_owned(), Err(why))
                })
                .collect();
        };
        let mut channels = self.channels();
        if channels.is_empty() {
            *channels = ring
                .peers()
                .map(|peer| (peer.to_owned(), channel(peer, transport)))
                .collect();
        }
        channels.clone()
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, Vec<(String, Result<Channel, String>)>> {
        let channels = &self.shared.peers.channels;
        channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `peer`'s channel anew, for the next view to dial it afresh.
    fn redial(&self, peer: &str) {
        let Some(transport) = self.shared.peers.transport.get() else {
            return;
        };
        let mut channels = self.channels();
        if let Some((_, made)) = channels.iter_mut().find(|(p, _)| p == peer) {
            *made = channel(peer, transport);
        }
    }
}

/// A lazily connected channel to `peer`, or why there can be none.
fn channel(peer: &str, transport: &PeerTransport) -> Result<Channel, String> {
    let scheme = match transport {
        PeerTransport::Plain => "http",
        PeerTransport::Tls(_) => "https",
        PeerTransport::Unverifiable => {
            return Err(
                "one-way TLS: this master has no CA to check its peers with (set --tls-client-ca)"
                    .into(),
            );
        }
    };
    // The whole call's deadline is `ask`'s, one clock for every way a peer
    // can hang; a connection that cannot even be made fails sooner.
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{peer}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(PEER_TIMEOUT);
    if let PeerTransport::Tls(config) = transport {
        endpoint = endpoint
            .tls_config(config.clone())
            .map_err(|e| e.to_string())?;
    }
    Ok(endpoint.connect_lazy())
}

/// Asks one peer, within [`PEER_TIMEOUT`] whatever the transport does.
async fn ask(channel: Channel, request: AccountsRequest) -> Result<AccountsReply, String> {
    let call = async move {
        MasterClient::new(channel)
            .accounts(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| match status.code() {
                tonic::Code::Unavailable => format!("unavailable: {}", status.message()),
                tonic::Code::Cancelled | tonic::Code::DeadlineExceeded => {
                    format!("no answer within {PEER_TIMEOUT:?}")
                }
                code => format!("{code:?}: {}", status.message()),
            })
    };
    tokio::time::timeout(PEER_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {PEER_TIMEOUT:?}")))
}

/// The query as the wire carries it.
pub(crate) fn request(query: &AccountsQuery) -> AccountsRequest {
    use damper_proto::v1::AccountsSort as Wire;
    AccountsRequest {
        op: query.op.clone().unwrap_or_default(),
        prefix: query.prefix.clone().unwrap_or_default(),
        account: query.account.clone().unwrap_or_default(),
        min_factor: query.min_factor,
        sort: match query.sort {
            AccountsSort::Factor => Wire::Factor,
            AccountsSort::Demand => Wire::Demand,
            AccountsSort::Ratio => Wire::Ratio,
            AccountsSort::Account => Wire::Account,
        }
        .into(),
        limit: u32::try_from(query.limit).unwrap_or(u32::MAX),
    }
}

/// Why an `Accounts` request was refused: the field and what is wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {reason}")]
pub struct BadQuery {
    /// The request's field.
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

/// The query a wire request asks, checked as the HTTP endpoint checks it.
pub(crate) fn query(request: AccountsRequest) -> Result<AccountsQuery, BadQuery> {
    use damper_proto::v1::AccountsSort as Wire;
    let name = |field: &'static str, value: String| -> Result<Option<String>, BadQuery> {
        if value.is_empty() {
            return Ok(None);
        }
        if value.len() > damper_core::MAX_NAME_LEN {
            return Err(BadQuery {
                field,
                reason: format!(
                    "{} bytes long; the limit is {}",
                    value.len(),
                    damper_core::MAX_NAME_LEN
                ),
            });
        }
        Ok(Some(value))
    };
    if !(request.min_factor >= 0.0 && request.min_factor <= 1.0) {
        return Err(BadQuery {
            field: "min_factor",
            reason: format!("must be between 0 and 1, got {}", request.min_factor),
        });
    }
    let limit = match request.limit {
        0 => 100,
        n if n as usize > crate::http::MAX_ROWS => {
            return Err(BadQuery {
                field: "limit",
                reason: format!("at most {}, got {n}", crate::http::MAX_ROWS),
            });
        }
        n => n as usize,
    };
    let sort = match Wire::try_from(request.sort) {
        Ok(Wire::Factor) => AccountsSort::Factor,
        Ok(Wire::Demand) => AccountsSort::Demand,
        Ok(Wire::Ratio) => AccountsSort::Ratio,
        Ok(Wire::Account) => AccountsSort::Account,
        Err(_) => {
            return Err(BadQuery {
                field: "sort",
                reason: format!("unknown order {}", request.sort),
            });
        }
    };
    Ok(AccountsQuery {
        op: name("op", request.op)?,
        prefix: name("prefix", request.prefix)?,
        account: name("account", request.account)?,
        min_factor: request.min_factor,
        sort,
        limit,
    })
}

/// This master's rows as the wire carries them.
pub(crate) fn reply(now_unix_ms: u64, views: Vec<KeyView>, matched: usize) -> AccountsReply {
    AccountsReply {
        now_unix_ms,
        matched: matched as u64,
        accounts: views
            .into_iter()
            .map(|v| AccountView {
                account: v.account,
                op: v.op,
                limit: v.limit.unwrap_or(0.0),
                limit_key: v.limit_key.unwrap_or_default(),
                shadow: v.shadow,
                exempt: v.exempt.unwrap_or_default(),
                demand: v.demand,
                admitted: v.admitted,
                factor: v.factor,
                last_report_unix_ms: v.last_report_unix_ms,
            })
            .collect(),
    }
}

/// A peer's row as a view.
fn view(row: AccountView) -> KeyView {
    let some = |s: String| (!s.is_empty()).then_some(s);
    KeyView {
        account: row.account,
        op: row.op,
        limit: (row.limit > 0.0).then_some(row.limit),
        limit_key: some(row.limit_key),
        shadow: row.shadow,
        exempt: some(row.exempt),
        demand: row.demand,
        admitted: row.admitted,
        factor: row.factor,
        last_report_unix_ms: row.last_report_unix_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_goes_onto_the_wire_and_back_unchanged_and_bad_fields_are_named() {
        let q = AccountsQuery {
            op: Some("messages".into()),
            prefix: Some("org/".into()),
            account: None,
            min_factor: 0.25,
            sort: AccountsSort::Ratio,
            limit: 7,
        };
        assert_eq!(query(request(&q)), Ok(q));
        let bad = |f: fn(&mut AccountsRequest)| {
            let mut r = request(&AccountsQuery::default());
            f(&mut r);
            query(r).unwrap_err().field
        };
        assert_eq!(bad(|r| r.limit = 10_001), "limit");
        assert_eq!(bad(|r| r.min_factor = -1.0), "min_factor");
        assert_eq!(bad(|r| r.min_factor = f64::NAN), "min_factor");
        assert_eq!(bad(|r| r.sort = 9), "sort");
        assert_eq!(bad(|r| r.account = "a".repeat(300)), "account");
        let mut r = request(&AccountsQuery::default());
        r.limit = 0;
        assert_eq!(query(r).unwrap().limit, 100);
    }

    #[test]
    fn a_view_goes_onto_the_wire_and_back_unchanged() {
        let v = KeyView {
            account: "acme".into(),
            op: "messages".into(),
            limit: Some(1000.0),
            limit_key: Some("messages".into()),
            shadow: true,
            exempt: None,
            demand: 4000.0,
            admitted: 1000.0,
            factor: 0.75,
            last_report_unix_ms: 1_700_000_000_000,
        };
        let wire = reply(5, vec![v.clone()], 3);
        assert_eq!((wire.now_unix_ms, wire.matched), (5, 3));
        assert_eq!(view(wire.accounts[0].clone()), v);
    }
}
