//! The `damper.v1.Master` gRPC service and the server around it: the one
//! place core errors become a `tonic::Status`.

use std::future::Future;
use std::time::Duration;

use damper_core::wire::{FactorsQuery, Rollup, RollupError};
use damper_proto::v1::master_server::MasterServer;
use damper_proto::v1::{
    AccountsReply, AccountsRequest, FactorsRequest, RollupReply, RollupRequest, WatchRequest,
};

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::AllowList;
use crate::{Master, ServerTls};

/// The status a refused request gets: RESOURCE_EXHAUSTED when it was too
/// big (split it and send again), FAILED_PRECONDITION when it gives an
/// account by a number this master does not hold (send the names again),
/// INVALID_ARGUMENT naming the field otherwise.
pub fn status(error: RollupError) -> Status {
    if error.is_too_big() {
        Status::resource_exhausted(error.to_string())
    } else if error.is_unknown_numbers() {
        Status::failed_precondition(error.to_string())
    } else {
        Status::invalid_argument(error.to_string())
    }
}

/// The `damper.v1.Master` gRPC service.
#[derive(Clone)]
pub struct MasterService {
    master: Master,
    /// Who may report, with mutual TLS; anyone the TLS admits when `None`.
    allowed: Option<AllowList>,
    /// Set when the server begins to shut down: `Watch` streams end then,
    /// or the graceful shutdown would wait for them for ever. Held here,
    /// so it lives as long as the service.
    closing: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
}

impl MasterService {
    /// The service over `master`.
    pub fn new(master: Master) -> MasterService {
        MasterService {
            master,
            allowed: None,
            closing: std::sync::Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// `Watch` streams end once `closing` holds true.
    pub fn with_closing(
        mut self,
        closing: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    ) -> MasterService {
        self.closing = closing;
        self
    }

    /// Only clients whose certificate `allowed` admits may report.
    pub fn with_allowed(mut self, allowed: Option<AllowList>) -> MasterService {
        self.allowed = allowed;
        self
    }

    /// PERMISSION_DENIED unless the peer's certificate is allowed (when an
    /// allow-list is set).
    fn admit<T>(&self, request: &Request<T>) -> Result<(), Status> {
        match &self.allowed {
            None => Ok(()),
            Some(allowed) => allowed.check(request.peer_certs().as_deref().map(Vec::as_slice)),
        }
    }
}

#[tonic::async_trait]
impl damper_proto::v1::master_server::Master for MasterService {
    async fn rollup(
        &self,
        request: Request<RollupRequest>,
    ) -> Result<Response<RollupReply>, Status> {
        self.admit(&request)?;
        let began = tokio::time::Instant::now();
        let request = request.into_inner();
        if let Err(status) = crate::ingest::check_id_lists(&request) {
            metrics::counter!("damper_master_rollups_rejected_total").increment(1);
            self.master
                .log_refused("rollup", &request.agent_id, &status);
            return Err(status);
        }
        let mut rollup = Rollup::from(request);
        let result = self.master.answer(&mut rollup);
        metrics::histogram!("damper_master_ingest_duration_seconds")
            .record(began.elapsed().as_secs_f64());
        match result {
            Ok(reply) => Ok(Response::new(RollupReply::from(reply))),
            Err(error) => {
                let status = status(error);
                metrics::counter!("damper_master_rollups_rejected_total").increment(1);
                self.master.log_refused("rollup", &rollup.agent_id, &status);
                Err(status)
            }
        }
    }

    async fn factors(
        &self,
        request: Request<FactorsRequest>,
    ) -> Result<Response<RollupReply>, Status> {
        self.admit(&request)?;
        let query = FactorsQuery::from(request.into_inner());
        match self.master.answer_factors(&query) {
            Ok(reply) => Ok(Response::new(RollupReply::from(reply))),
            Err(error) => {
                let status = status(error);
                self.master
                    .log_refused("factors request", &query.agent_id, &status);
                Err(status)
            }
        }
    }

    type WatchStream = std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<RollupReply, Status>> + Send + 'static>,
    >;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.admit(&request)?;
        let agent = request.into_inner().agent_id;
        tracing::debug!(%agent, "agent watches for pushes");
        let pushes = self.master.watch();
        Ok(Response::new(Box::pin(push_stream(
            pushes,
            self.closing.subscribe(),
        ))))
    }

    async fn accounts(
        &self,
        request: Request<AccountsRequest>,
    ) -> Result<Response<AccountsReply>, Status> {
        self.admit(&request)?;
        let query = crate::ring_accounts::query(request.into_inner())
            .map_err(|bad| Status::invalid_argument(bad.to_string()))?;
        let now = self.master.now().as_millis();
        let (views, matched) = self.master.accounts(&query);
        Ok(Response::new(crate::ring_accounts::reply(
            now, views, matched,
        )))
    }
}

/// The pushes a watcher receives, as messages; one that fell behind
/// skips to the newest (counted). The stream ends when `closing` turns
/// true, or with the master.
fn push_stream(
    pushes: tokio::sync::broadcast::Receiver<std::sync::Arc<damper_core::wire::Reply>>,
    closing: tokio::sync::watch::Receiver<bool>,
) -> impl futures_util::Stream<Item = Result<RollupReply, Status>> + Send + 'static {
    futures_util::stream::unfold((pushes, closing), |(mut pushes, mut closing)| async move {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            let received = tokio::select! {
                received = pushes.recv() => received,
                // Closing, or the service (and its sender) gone.
                _ = closing.wait_for(|closing| *closing) => return None,
            };
            match received {
                Ok(push) => {
                    let message = RollupReply::from(damper_core::wire::Reply::clone(&push));
                    return Some((Ok(message), (pushes, closing)));
                }
                Err(RecvError::Lagged(skipped)) => {
                    metrics::counter!("damper_master_pushes_skipped_total").increment(skipped);
                }
                Err(RecvError::Closed) => return None,
            }
        }
    })
}

/// Why serving stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The reflection service could not be built from the descriptors.
    #[error("gRPC reflection: {0}")]
    Reflection(String),
}

/// Serves `master` on `listener` until `shutdown` completes, then finishes
/// the requests in flight and returns. Evicts idle state in the background
/// meanwhile. Plain TCP: see [`run_with_tls`].
pub async fn run(
    listener: TcpListener,
    master: Master,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    run_with_tls(listener, master, None, shutdown).await
}

/// [`run`], over TLS when `tls` is given.
pub async fn run_with_tls(
    listener: TcpListener,
    master: Master,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let evictor = {
        let master = master.clone();
        // At least hourly: an entry's last report reads right for 0.8 days
        // past the longest idle time (`MAX_REPORT_AGE`), and a pass must
        // come within them.
        let every = (master.shared.idle_after / 3).min(Duration::from_secs(3600));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // A pass over every pair: on a blocking thread, so the
                // runtime's workers go on serving rollups meanwhile.
                let pass = master.clone();
                let evicted = tokio::task::spawn_blocking(move || pass.evict_idle())
                    .await
                    .unwrap_or(0);
                if evicted > 0 {
                    tracing::debug!(evicted, "evicted idle (account, op) state");
                }
            }
        })
    };
    let max = master.shared.options.max_message_bytes;
    let allowed = tls.as_ref().and_then(ServerTls::allowed);
    master.set_peer_transport(
        tls.as_ref()
            .map_or_else(Default::default, ServerTls::peer_transport),
    );
    let closing = std::sync::Arc::new(tokio::sync::watch::Sender::new(false));
    let service = MasterServer::new(
        MasterService::new(master)
            .with_allowed(allowed)
            .with_closing(closing.clone()),
    )
    .max_decoding_message_size(max)
    .max_encoding_message_size(max);
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = &tls {
        server = match server.tls_config(tls.config()) {
            Ok(server) => server,
            Err(e) => {
                evictor.abort();
                return Err(e.into());
            }
        };
    }
    // gRPC health checking (grpc.health.v1), so standard probes and tools
    // can ask whether `damper.v1.Master` serves; NOT_SERVING once shutdown
    // begins.
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<MasterServer<MasterService>>().await;
    let shutdown = async move {
        shutdown.await;
        closing.send_replace(true);
        health
            .set_not_serving::<MasterServer<MasterService>>()
            .await;
    };
    let reflection = match tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(damper_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
    {
        Ok(reflection) => reflection,
        Err(e) => {
            evictor.abort();
            return Err(ServeError::Reflection(e.to_string()));
        }
    };
    let result = server
        .add_service(health_service)
        .add_service(reflection)
        .add_service(service)
        // TCP_NODELAY, as tonic's own `serve` sets it: without it Nagle
        // holds a reply's last segment for the agent's delayed ACK (40 ms;
        // measured on the sidecar's gRPC door, whose batch replies went
        // from 44 ms to 1 ms).
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await;
    evictor.abort();
    result.map_err(ServeError::from)
}
