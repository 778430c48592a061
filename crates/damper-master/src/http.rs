//! The master's HTTP endpoint for operators: which accounts are suppressed
//! and why, and Prometheus metrics. It serves:
//!
//! - `GET /v1/accounts`: tracked (account, op) pairs as JSON, with filters
//!   `op`, `prefix`, `min_factor`, the order `sort=factor|demand|ratio|account`
//!   (largest first) and `limit` (rows, default 100, at most 10 000). With
//!   a ring (`--ring`), every master's pairs: this master asks its peers
//!   and merges ([`Master::ring_accounts`]), each row naming its `master`,
//!   and `partial: true` with the `missing` masters when some did not
//!   answer; `local=true` keeps to this master's own.
//! - `GET /v1/accounts/{account}`: one account's pairs (404 if untracked),
//!   ring-wide the same way.
//! - `GET /`: a page showing the same table, sortable and filterable,
//!   refreshing every 2 s. Served from the binary: no build step.
//! - `GET /v1/events`: accounts near their limit and suppression starting
//!   and ending, as Server-Sent Events (see `events`).
//! - `GET /metrics`: Prometheus text format, when a recorder handle is given.
//! - `GET /healthz`: `ok` while the process serves (liveness).
//!
//! Read-only. With a bearer token ([`serve_authenticated`]; the binary
//! requires one when bound beyond loopback) every route but `/healthz`
//! needs `Authorization: Bearer TOKEN`, or answers 401: probes stay simple,
//! and who may read which accounts are suppressed is the operator's
//! choice. Without one, bind it to loopback (the binary's default).

mod events;

use std::future::Future;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use damper_core::master::KeyView;
use damper_core::wire::validate_name;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use tokio::net::TcpListener;

use crate::{AccountsQuery, AccountsSort, Master};

/// Most rows one `/v1/accounts` call returns.
pub const MAX_ROWS: usize = 10_000;

/// The accounts page (`src/page.html`).
const PAGE: &str = include_str!("page.html");

#[derive(Clone)]
struct AppState {
    master: Master,
    metrics: Option<PrometheusHandle>,
}

/// The HTTP routes over `master`; `/metrics` renders `metrics` when given
/// (404 otherwise).
pub fn router(master: Master, metrics: Option<PrometheusHandle>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/v1/accounts", get(accounts))
        .route("/v1/accounts/{account}", get(account))
        .route("/v1/events", get(events::events))
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(AppState { master, metrics })
}

/// Serves [`router`] on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    master: Master,
    metrics: Option<PrometheusHandle>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_authenticated(listener, master, metrics, None, shutdown).await
}

/// [`serve`], with every route but `/healthz` behind `token` when given.
pub async fn serve_authenticated(
    listener: TcpListener,
    master: Master,
    metrics: Option<PrometheusHandle>,
    token: Option<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let events = master.clone();
    let shutdown = async move {
        shutdown.await;
        // Event streams never end by themselves: end them, or the server
        // would wait for them.
        events.events().close();
    };
    axum::serve(listener, authenticated(router(master, metrics), token))
        .with_graceful_shutdown(shutdown)
        .await
}

/// `routes` with every path but `/healthz` requiring `Authorization:
/// Bearer token` when a token is given (401 otherwise).
pub fn authenticated(routes: Router, token: Option<String>) -> Router {
    let Some(token) = token else {
        return routes;
    };
    let token: std::sync::Arc<str> = token.into();
    routes.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let token = token.clone();
            async move {
                let presented = request
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "));
                if request.uri().path() == "/healthz"
                    || presented.is_some_and(|p| same(p.as_bytes(), token.as_bytes()))
                {
                    return next.run(request).await;
                }
                let mut refused = error(
                    StatusCode::UNAUTHORIZED,
                    "a bearer token is required: Authorization: Bearer TOKEN".to_string(),
                );
                refused.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
                refused
            }
        },
    ))
}

/// Compares in time that depends on the lengths only, so a wrong token's
/// timing does not tell how much of it was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// What `/v1/accounts` answers.
#[derive(Serialize)]
struct AccountsReply {
    /// The master's clock when the rows were computed.
    now_unix_ms: u64,
    /// Rows that matched the filters, before `limit` cut them, over every
    /// master that answered.
    matched: usize,
    /// The rows, in the requested order.
    accounts: Vec<Row>,
    /// Whether some master of the ring did not answer: its rows are not
    /// here.
    partial: bool,
    /// The masters whose rows these are (empty without a ring: this one's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    masters: Vec<String>,
    /// The masters that did not answer, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    missing: Vec<crate::Missing>,
}

/// One (account, op): the core's view plus its demand/limit ratio.
#[derive(Serialize)]
struct Row {
    #[serde(flatten)]
    view: KeyView,
    /// Demand over limit (0 when unlimited).
    ratio: f64,
    /// The master that holds it, in a ring-wide view.
    #[serde(skip_serializing_if = "Option::is_none")]
    master: Option<String>,
}

impl From<KeyView> for Row {
    fn from(view: KeyView) -> Row {
        Row {
            ratio: crate::ratio(&view),
            view,
            master: None,
        }
    }
}

impl AccountsReply {
    /// `query` over the ring when this master has one and `local` is not
    /// asked, else over this master alone.
    async fn of(master: &Master, query: &AccountsQuery, local: bool) -> AccountsReply {
        let ring = if local {
            None
        } else {
            master.ring_accounts(query).await
        };
        match ring {
            Some(ring) => AccountsReply {
                now_unix_ms: master.now().as_millis(),
                matched: ring.matched,
                accounts: ring
                    .rows
                    .into_iter()
                    .map(|r| Row {
                        master: Some(r.master),
                        ..Row::from(r.view)
                    })
                    .collect(),
                partial: !ring.missing.is_empty(),
                masters: ring.answered,
                missing: ring.missing,
            },
            None => {
                let (views, matched) = master.accounts(query);
                AccountsReply {
                    now_unix_ms: master.now().as_millis(),
                    matched,
                    accounts: views.into_iter().map(Row::from).collect(),
                    partial: false,
                    masters: Vec::new(),
                    missing: Vec::new(),
                }
            }
        }
    }
}

/// A 400 or 404 with a JSON body naming what is wrong.
fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

/// Parses the query string strictly: an unknown parameter or a bad value
/// is a 400 naming it, never silently ignored.
fn parse_query(params: &[(String, String)]) -> Result<(AccountsQuery, bool), String> {
    let mut query = AccountsQuery::default();
    let mut local = false;
    for (name, value) in params {
        match name.as_str() {
            "local" => local = parse_local(value)?,
            "op" => query.op = Some(value.clone()).filter(|v| !v.is_empty()),
            "prefix" => query.prefix = Some(value.clone()).filter(|v| !v.is_empty()),
            "min_factor" => {
                query.min_factor = value
                    .parse::<f64>()
                    .ok()
                    .filter(|f| (0.0..=1.0).contains(f))
                    .ok_or_else(|| {
                        format!("`min_factor` must be a number from 0 to 1, not {value:?}")
                    })?
            }
            "sort" => {
                query.sort = match value.as_str() {
                    "factor" => AccountsSort::Factor,
                    "demand" => AccountsSort::Demand,
                    "ratio" => AccountsSort::Ratio,
                    "account" => AccountsSort::Account,
                    _ => {
                        return Err(format!(
                            "`sort` must be factor, demand, ratio or account, not {value:?}"
                        ));
                    }
                }
            }
            "limit" => {
                query.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_ROWS).contains(n))
                    .ok_or_else(|| {
                        format!(
                            "`limit` must be a whole number from 1 to {MAX_ROWS}, not {value:?}"
                        )
                    })?
            }
            other => {
                return Err(format!(
                    "unknown parameter `{other}`; known: op, prefix, min_factor, sort, limit, local"
                ));
            }
        }
    }
    Ok((query, local))
}

/// `local=true|false`: this master's own rows only, or the ring's.
fn parse_local(value: &str) -> Result<bool, String> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("`local` must be true or false, not {value:?}")),
    }
}

async fn accounts(
    State(state): State<AppState>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let (query, local) = match parse_query(&params) {
        Ok(parsed) => parsed,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    Json(AccountsReply::of(&state.master, &query, local).await).into_response()
}

async fn account(
    State(state): State<AppState>,
    Path(account): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    if let Err(e) = validate_name("account", &account) {
        return error(StatusCode::BAD_REQUEST, e.to_string());
    }
    let mut local = false;
    for (name, value) in &params {
        match name.as_str() {
            "local" => match parse_local(value) {
                Ok(l) => local = l,
                Err(message) => return error(StatusCode::BAD_REQUEST, message),
            },
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("unknown parameter `{other}`; known: local"),
                );
            }
        }
    }
    let query = AccountsQuery {
        account: Some(account.clone()),
        sort: AccountsSort::Account,
        limit: MAX_ROWS,
        ..AccountsQuery::default()
    };
    let reply = AccountsReply::of(&state.master, &query, local).await;
    if reply.accounts.is_empty() {
        let missing = if reply.partial {
            format!(
                " (masters that did not answer: {})",
                reply
                    .missing
                    .iter()
                    .map(|m| m.master.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            String::new()
        };
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "account {account:?} has no recent reports on any master that answered{missing}"
            ),
        );
    }
    Json(serde_json::json!({
        "now_unix_ms": reply.now_unix_ms,
        "account": account,
        "ops": reply.accounts,
        "partial": reply.partial,
        "missing": reply.missing,
    }))
    .into_response()
}

async fn page() -> Html<&'static str> {
    Html(PAGE)
}

async fn render_metrics(State(state): State<AppState>) -> Response {
    match &state.metrics {
        Some(handle) => {
            state.master.record_gauges();
            // The standard process metrics (process_resident_memory_bytes,
            // CPU seconds, open descriptors), read from /proc per scrape.
            metrics_process::Collector::default().collect();
            (
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                handle.render(),
            )
                .into_response()
        }
        None => error(
            StatusCode::NOT_FOUND,
            "no metrics recorder is installed in this process".to_string(),
        ),
    }
}
