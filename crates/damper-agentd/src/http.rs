//! The operator's endpoint: `GET /healthz` (`ok` while the sidecar
//! serves: liveness and readiness both, since it decides without the
//! masters) and `GET /metrics` (Prometheus text: the agent library's
//! `damper_agent_*` and the sidecar's `damper_agentd_*`, when a recorder
//! handle is given; 404 otherwise). Read-only; bind it to loopback or the
//! pod network.

use std::future::Future;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

/// The routes.
pub fn router(metrics: Option<PrometheusHandle>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(render))
        .with_state(metrics)
}

async fn render(State(metrics): State<Option<PrometheusHandle>>) -> Response {
    match metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no metrics recorder installed\n").into_response(),
    }
}

/// Serves [`router`] on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    metrics: Option<PrometheusHandle>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics))
        .with_graceful_shutdown(shutdown)
        .await
}
