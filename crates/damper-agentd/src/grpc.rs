//! The `damper.v1.Check` front door (`proto/damper/v1/check.proto`): one
//! gRPC call per decision, a batch, or a peek. A rejection is an OK reply
//! with `admitted = false`; INVALID_ARGUMENT names the field of a request
//! that cannot be decided, and then nothing of it is counted.

use std::time::Duration;

use damper_proto::v1::check_server::Check;
use damper_proto::v1::{
    CheckManyReply, CheckManyRequest, CheckReply, CheckRequest, PeekReply, PeekRequest,
    Reason as WireReason,
};
use tonic::{Request, Response, Status};

use crate::Sidecar;
use crate::verdict::{BadInput, Reason, Verdict, validate, validate_publisher};

/// The service, over a [`Sidecar`].
#[derive(Clone, Debug)]
pub struct CheckService {
    sidecar: Sidecar,
}

impl CheckService {
    /// The service deciding with `sidecar`.
    pub fn new(sidecar: Sidecar) -> CheckService {
        CheckService { sidecar }
    }
}

fn wire_reason(reason: Option<Reason>) -> i32 {
    match reason {
        None => WireReason::Unspecified,
        Some(Reason::LocalGuard) => WireReason::LocalGuard,
        Some(_) => WireReason::AccountLimit,
    }
    .into()
}

fn millis(d: Duration) -> u32 {
    d.as_millis().min(u128::from(u32::MAX)) as u32
}

fn reply(v: Verdict) -> CheckReply {
    CheckReply {
        admitted: v.admitted,
        factor: v.factor,
        limit: v.limit,
        retry_after_ms: millis(v.retry_after),
        reason: wire_reason(v.reason),
        demand: v.demand,
        would_reject: v.would_reject,
        utilisation: v.utilisation.unwrap_or(0.0),
    }
}

fn invalid(e: BadInput) -> Status {
    crate::metrics::request("grpc", "invalid");
    Status::invalid_argument(e.to_string())
}

#[tonic::async_trait]
impl Check for CheckService {
    async fn check(&self, request: Request<CheckRequest>) -> Result<Response<CheckReply>, Status> {
        let c = request.into_inner();
        let verdict = self
            .sidecar
            .check(
                &c.account,
                &c.op,
                c.cost.unwrap_or(1),
                c.publisher.as_deref(),
            )
            .map_err(invalid)?;
        crate::metrics::request("grpc", "ok");
        Ok(Response::new(reply(verdict)))
    }

    async fn check_many(
        &self,
        request: Request<CheckManyRequest>,
    ) -> Result<Response<CheckManyReply>, Status> {
        let checks = request.into_inner().checks;
        let max = self.sidecar.limits().max_batch;
        if checks.len() > max {
            crate::metrics::request("grpc", "invalid");
            return Err(Status::invalid_argument(format!(
                "checks: {} in one call; the limit is {max}",
                checks.len()
            )));
        }
        // All or nothing: every name is checked before anything is counted.
        for (i, c) in checks.iter().enumerate() {
            validate(&c.account, &c.op)
                .and_then(|()| validate_publisher(c.publisher.as_deref()))
                .map_err(|e| invalid(e.within(&format!("checks[{i}]."))))?;
        }
        let replies = checks
            .iter()
            .map(|c| {
                let cost = c.cost.unwrap_or(1);
                reply(
                    self.sidecar
                        .decide(&c.account, &c.op, cost, c.publisher.as_deref()),
                )
            })
            .collect();
        crate::metrics::request("grpc", "ok");
        Ok(Response::new(CheckManyReply { replies }))
    }

    async fn peek(&self, request: Request<PeekRequest>) -> Result<Response<PeekReply>, Status> {
        let p = request.into_inner();
        let standing = self.sidecar.peek(&p.account, &p.op).map_err(invalid)?;
        crate::metrics::request("grpc", "ok");
        Ok(Response::new(PeekReply {
            factor: standing.factor,
            limit: standing.limit,
            reason: wire_reason(standing.source.map(Reason::of)),
            tracked: standing.tracked,
        }))
    }
}
