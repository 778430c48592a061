//! Envoy's global rate limit service, `envoy.service.ratelimit.v3`
//! `ShouldRateLimit`, wire-compatible with what Envoy's `ratelimit` HTTP
//! and network filters send (types from the `envoy-types` crate).
//!
//! Each descriptor is mapped to an (account, op) by the `[envoy]` table:
//! the account is the value of the entry keyed `account_key` (`tenant` by
//! default), the op the value of `op_key`'s entry, else `op`, else the
//! request's domain; the cost is the descriptor's `hits_addend`, else the
//! request's, else 1; the publisher, when `publisher_key` is set, the value
//! of its entry. Each mapped descriptor is decided like any check and
//! gets its own status; the request is `OVER_LIMIT` if any descriptor is.
//!
//! What Damper does not take from Envoy: a descriptor's own `limit`
//! override (limits are the masters'), and negative hits (refunds: counted
//! nothing, answered OK).
//!
//! Headers for Envoy to add to the response, in the IETF
//! `draft-ietf-httpapi-ratelimit-headers` form:
//! `RateLimit-Policy: "messages";q=1000;w=1` for every mapped descriptor
//! with a known limit, and when over the limit `RateLimit: "messages";r=0;t=2`
//! and `Retry-After: 2`. Damper does not send a remaining quota when it
//! admits: demand is measured across every node, so no sidecar knows it
//! exactly.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tonic::{Request, Response, Status};

use crate::Sidecar;
use crate::config::{EnvoyConfig, Unmapped};
use crate::verdict::{BadInput, Verdict, name};

/// The service, over a [`Sidecar`] and the descriptor mapping.
#[derive(Clone, Debug)]
pub struct EnvoyService {
    sidecar: Sidecar,
    mapping: Arc<EnvoyConfig>,
}

impl EnvoyService {
    /// The service deciding with `sidecar`, mapping descriptors by `mapping`.
    pub fn new(sidecar: Sidecar, mapping: EnvoyConfig) -> EnvoyService {
        EnvoyService {
            sidecar,
            mapping: Arc::new(mapping),
        }
    }
}

/// What one descriptor asks, once mapped.
#[derive(Debug, PartialEq, Eq)]
pub enum Ask<'a> {
    /// Decide `cost` of `op` for `account`.
    Check {
        /// The account.
        account: &'a str,
        /// The op.
        op: &'a str,
        /// The cost.
        cost: u64,
        /// Who sent it: the value of `publisher_key`'s entry, if any.
        publisher: Option<&'a str>,
    },
    /// The descriptor names no account.
    Unmapped,
    /// A refund (negative hits): counted nothing.
    Refund,
}

/// Maps descriptor `i` of a request in `domain` with request-level
/// `hits_addend`, naming the field of what is wrong.
pub fn map<'a>(
    mapping: &'a EnvoyConfig,
    domain: &'a str,
    request_hits: u32,
    i: usize,
    d: &'a RateLimitDescriptor,
) -> Result<Ask<'a>, BadInput> {
    let value = |key: &str| {
        d.entries
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.as_str())
    };
    let Some(account) = value(&mapping.account_key) else {
        return Ok(Ask::Unmapped);
    };
    if d.is_negative_hits {
        return Ok(Ask::Refund);
    }
    let op = mapping
        .op_key
        .as_deref()
        .and_then(value)
        .or(mapping.op.as_deref())
        .unwrap_or(domain);
    let field = |what: &str| format!("descriptors[{i}].{what}");
    name(
        &field(&format!("entries[{}]", mapping.account_key)),
        account,
    )?;
    let op_field = match &mapping.op_key {
        Some(key) if value(key).is_some() => field(&format!("entries[{key}]")),
        _ if mapping.op.is_some() => field("op"),
        _ => "domain".into(),
    };
    name(&op_field, op)?;
    let cost = match &d.hits_addend {
        Some(hits) => hits.value,
        None => u64::from(request_hits.max(1)),
    };
    let publisher = mapping
        .publisher_key
        .as_deref()
        .and_then(|key| value(key).map(|publisher| (field(&format!("entries[{key}]")), publisher)));
    if let Some((field, publisher)) = &publisher {
        name(field, publisher)?;
    }
    Ok(Ask::Check {
        account,
        op,
        cost,
        publisher: publisher.map(|(_, publisher)| publisher),
    })
}

/// An `sf-string` for a structured header: printable ASCII, quotes and
/// backslashes escaped, anything else as `_`.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

/// Whole seconds to wait, at least 1.
fn ceil_secs(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).max(1) as u64
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        value,
        ..Default::default()
    }
}

/// The response headers for the decided descriptors: (op, verdict).
pub fn headers(decided: &[(&str, Verdict)]) -> Vec<HeaderValue> {
    let policies: Vec<String> = decided
        .iter()
        .filter(|(_, v)| v.limit > 0.0)
        .map(|(op, v)| {
            format!(
                "{};q={};w=1",
                sf_string(op),
                v.limit.round().max(1.0) as u64
            )
        })
        .collect();
    let over: Vec<(String, u64)> = decided
        .iter()
        .filter(|(_, v)| !v.admitted)
        .map(|(op, v)| (sf_string(op), ceil_secs(v.retry_after)))
        .collect();
    let mut headers = Vec::new();
    if !policies.is_empty() {
        headers.push(header("RateLimit-Policy", policies.join(", ")));
    }
    if !over.is_empty() {
        let items: Vec<String> = over
            .iter()
            .map(|(op, t)| format!("{op};r=0;t={t}"))
            .collect();
        headers.push(header("RateLimit", items.join(", ")));
        let wait = over.iter().map(|(_, t)| *t).max().unwrap_or(1);
        headers.push(header("Retry-After", wait.to_string()));
    }
    headers
}

fn status(code: Code, op: &str, v: Option<&Verdict>) -> DescriptorStatus {
    let current_limit = v.filter(|v| v.limit > 0.0).map(|v| RateLimit {
        name: op.into(),
        requests_per_unit: v.limit.round().clamp(1.0, f64::from(u32::MAX)) as u32,
        unit: Unit::Second.into(),
    });
    let duration_until_reset = v.filter(|v| !v.admitted).map(|v| PbDuration {
        seconds: v.retry_after.as_secs() as i64,
        nanos: v.retry_after.subsec_nanos() as i32,
    });
    DescriptorStatus {
        code: code.into(),
        current_limit,
        duration_until_reset,
        ..Default::default()
    }
}

impl EnvoyService {
    /// The answer to one request, or INVALID_ARGUMENT naming the field.
    /// Nothing is counted unless every descriptor maps cleanly.
    pub fn answer(&self, r: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let invalid = |reason: String| {
            crate::metrics::request("envoy", "invalid");
            Status::invalid_argument(reason)
        };
        if r.descriptors.is_empty() {
            return Err(invalid("descriptors is empty".into()));
        }
        let asks = r
            .descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| map(&self.mapping, &r.domain, r.hits_addend, i, d))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(e.to_string()))?;
        let mut statuses = Vec::with_capacity(asks.len());
        let mut decided = Vec::new();
        for ask in &asks {
            statuses.push(match *ask {
                Ask::Check {
                    account,
                    op,
                    cost,
                    publisher,
                } => {
                    let v = self.sidecar.decide(account, op, cost, publisher);
                    decided.push((op, v));
                    let code = if v.admitted {
                        Code::Ok
                    } else {
                        Code::OverLimit
                    };
                    status(code, op, Some(&v))
                }
                Ask::Unmapped => {
                    let deny = self.mapping.unmapped == Unmapped::Deny;
                    crate::metrics::unmapped(deny);
                    status(if deny { Code::OverLimit } else { Code::Ok }, "", None)
                }
                Ask::Refund => status(Code::Ok, "", None),
            });
        }
        let over = statuses
            .iter()
            .any(|s| s.code == i32::from(Code::OverLimit));
        crate::metrics::request("envoy", "ok");
        Ok(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok }.into(),
            statuses,
            response_headers_to_add: if self.mapping.headers {
                headers(&decided)
            } else {
                Vec::new()
            },
            ..Default::default()
        })
    }
}

#[tonic::async_trait]
impl RateLimitService for EnvoyService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.answer(request.get_ref()).map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::google::protobuf::UInt64Value;

    use super::*;

    fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            hits_addend: hits.map(|value| UInt64Value { value }),
            ..Default::default()
        }
    }

    #[test]
    fn descriptors_map_to_account_op_and_cost() {
        let mut m = EnvoyConfig::default();
        let d = descriptor(&[("tenant", "acme"), ("path", "/x")], None);
        // Op from the domain; cost from the request's hits_addend (0 is 1).
        assert_eq!(
            map(&m, "edge", 0, 0, &d).unwrap(),
            Ask::Check {
                account: "acme",
                op: "edge",
                cost: 1,
                publisher: None,
            }
        );
        assert_eq!(
            map(&m, "edge", 5, 0, &d).unwrap(),
            Ask::Check {
                account: "acme",
                op: "edge",
                cost: 5,
                publisher: None,
            }
        );
        // The descriptor's own hits_addend wins.
        let heavy = descriptor(&[("tenant", "acme")], Some(1001));
        assert_eq!(
            map(&m, "edge", 5, 0, &heavy).unwrap(),
            Ask::Check {
                account: "acme",
                op: "edge",
                cost: 1001,
                publisher: None,
            }
        );
        // A fixed op, then an op key that wins where present.
        m.op = Some("requests".into());
        m.op_key = Some("op".into());
        assert_eq!(
            map(&m, "edge", 0, 0, &d).unwrap(),
            Ask::Check {
                account: "acme",
                op: "requests",
                cost: 1,
                publisher: None,
            }
        );
        let with_op = descriptor(&[("op", "uploads"), ("tenant", "acme")], None);
        assert_eq!(
            map(&m, "edge", 0, 0, &with_op).unwrap(),
            Ask::Check {
                account: "acme",
                op: "uploads",
                cost: 1,
                publisher: None,
            }
        );
        // No account entry: unmapped. Negative hits: a refund.
        assert_eq!(
            map(&m, "edge", 0, 0, &descriptor(&[("path", "/")], None)).unwrap(),
            Ask::Unmapped
        );
        let mut refund = d.clone();
        refund.is_negative_hits = true;
        assert_eq!(map(&m, "edge", 0, 0, &refund).unwrap(), Ask::Refund);
        // A publisher key: its entry names the publisher where present.
        m.publisher_key = Some("client".into());
        let named = descriptor(&[("tenant", "acme"), ("client", "c-7")], None);
        assert_eq!(
            map(&m, "edge", 0, 0, &named).unwrap(),
            Ask::Check {
                account: "acme",
                op: "requests",
                cost: 1,
                publisher: Some("c-7"),
            }
        );
        let empty = descriptor(&[("tenant", "acme"), ("client", "")], None);
        let e = map(&m, "edge", 0, 2, &empty).unwrap_err().to_string();
        assert_eq!(e, "descriptors[2].entries[client] is empty");
    }

    #[test]
    fn bad_descriptors_name_the_field() {
        let m = EnvoyConfig::default();
        let empty = descriptor(&[("tenant", "")], None);
        let e = map(&m, "edge", 0, 3, &empty).unwrap_err().to_string();
        assert_eq!(e, "descriptors[3].entries[tenant] is empty");
        let d = descriptor(&[("tenant", "acme")], None);
        let e = map(&m, "", 0, 0, &d).unwrap_err().to_string();
        assert_eq!(e, "domain is empty");
        let long = "x".repeat(300);
        let e = map(&m, &long, 0, 0, &d).unwrap_err().to_string();
        assert!(e.starts_with("domain is 300 bytes long"), "{e}");
    }

    #[test]
    fn headers_follow_the_ietf_draft() {
        let admitted = Verdict {
            admitted: true,
            factor: 0.0,
            limit: 1000.0,
            retry_after: Duration::ZERO,
            reason: None,
            would_reject: false,
            utilisation: None,
            demand: 0.0,
        };
        let refused = Verdict {
            admitted: false,
            factor: 0.9,
            limit: 250.4,
            retry_after: Duration::from_millis(1500),
            reason: Some(crate::verdict::Reason::AccountLimit),
            would_reject: false,
            utilisation: Some(10.0),
            demand: 2504.0,
        };
        let h = headers(&[("messages", admitted), ("up\"loads", refused)]);
        let pairs: Vec<(&str, &str)> = h
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                (
                    "RateLimit-Policy",
                    r#""messages";q=1000;w=1, "up\"loads";q=250;w=1"#
                ),
                ("RateLimit", r#""up\"loads";r=0;t=2"#),
                ("Retry-After", "2"),
            ]
        );
        assert!(
            headers(&[(
                "messages",
                Verdict {
                    limit: 0.0,
                    ..admitted
                }
            )])
            .is_empty()
        );
    }
}
