//! The sidecar's own metrics, beside the agent library's
//! (`damper_agent_*`). Recorded through the `metrics` facade; the binary
//! installs the Prometheus recorder that `/metrics` renders.
//!
//! - `damper_agentd_decisions_total{result="admitted|rejected"}`: every
//!   decision, whichever front door asked;
//!   `damper_agentd_would_reject_total`: those admitted that a limit in
//!   shadow would have refused (counted in `admitted` too).
//! - `damper_agentd_requests_total{door, result="ok|invalid|error"}`: calls
//!   per front door (`grpc`, `envoy`, `resp`); `invalid` ones were refused
//!   for bad input and counted nothing.
//! - `damper_agentd_envoy_unmapped_total{outcome="allowed|denied"}`: Envoy
//!   descriptors that named no account.
//! - `damper_agentd_connections{door="resp"}`: open Redis-protocol
//!   connections; `damper_agentd_connections_refused_total{reason}`:
//!   connections closed at accept (`max_connections`) or for idling
//!   (`idle_timeout`), or dropped for a protocol error (`protocol`).

use std::sync::OnceLock;

use metrics::Counter;

use crate::verdict::Verdict;

/// The counters every decision touches, looked up in the recorder once
/// (a lookup hashes the name and labels: measurable at half a million
/// decisions a second). Taken from the recorder installed when first used,
/// so the binary installs its recorder before serving.
struct Hot {
    admitted: Counter,
    rejected: Counter,
    would_reject: Counter,
    /// `requests_total{result="ok"}` per door: grpc, envoy, resp.
    ok: [Counter; 3],
}

fn hot() -> &'static Hot {
    static HOT: OnceLock<Hot> = OnceLock::new();
    HOT.get_or_init(|| {
        Hot {
        admitted: metrics::counter!("damper_agentd_decisions_total", "result" => "admitted"),
        rejected: metrics::counter!("damper_agentd_decisions_total", "result" => "rejected"),
        would_reject: metrics::counter!("damper_agentd_would_reject_total"),
        ok: ["grpc", "envoy", "resp"].map(|door| {
            metrics::counter!("damper_agentd_requests_total", "door" => door, "result" => "ok")
        }),
    }
    })
}

/// Counts one decision.
pub(crate) fn decided(verdict: &Verdict) {
    let hot = hot();
    if verdict.admitted {
        hot.admitted.increment(1);
        if verdict.would_reject {
            hot.would_reject.increment(1);
        }
    } else {
        hot.rejected.increment(1);
    }
}

/// Counts one call on a front door.
pub(crate) fn request(door: &'static str, result: &'static str) {
    let slot = match door {
        "grpc" => 0,
        "envoy" => 1,
        _ => 2,
    };
    if result == "ok" {
        hot().ok[slot].increment(1);
    } else {
        metrics::counter!("damper_agentd_requests_total", "door" => door, "result" => result)
            .increment(1);
    }
}

/// Counts an Envoy descriptor that named no account.
pub(crate) fn unmapped(denied: bool) {
    let outcome = if denied { "denied" } else { "allowed" };
    metrics::counter!("damper_agentd_envoy_unmapped_total", "outcome" => outcome).increment(1);
}

/// Sets the number of open connections on `door`.
pub(crate) fn connections(door: &'static str, open: usize) {
    metrics::gauge!("damper_agentd_connections", "door" => door).set(open as f64);
}

/// Counts a connection closed by the sidecar for `reason`.
pub(crate) fn connection_closed(reason: &'static str) {
    metrics::counter!("damper_agentd_connections_refused_total", "reason" => reason).increment(1);
}
