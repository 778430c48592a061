//! Telling a refused connection from other failures.
//!
//! A refused connection means nothing listens at the master's address: the
//! process is gone (killed, restarting) while its host is up. The round
//! treats that as certain ([`AgentRound::on_refused`]): the master did not
//! count the request and goes off the ring at once. Every other failure (a
//! timeout, a reset, an error status) leaves it unknown whether the master
//! counted it.
//!
//! [`AgentRound::on_refused`]: damper_core::round::AgentRound::on_refused

use std::error::Error;
use std::io;

/// Whether `status` comes from a connection refused, found by walking its
/// chain of sources to the I/O error.
pub(super) fn is_refused(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn Error + 'static)> = status.source();
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<io::Error>() {
            return io.kind() == io::ErrorKind::ConnectionRefused;
        }
        source = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use damper_proto::v1::FactorsRequest;
    use damper_proto::v1::master_client::MasterClient;
    use tonic::transport::Endpoint;

    #[tokio::test]
    async fn a_port_nobody_listens_on_is_refused_and_an_error_status_is_not() {
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let channel = Endpoint::from_shared(format!("http://{closed}"))
            .unwrap()
            .connect_lazy();
        let status = MasterClient::new(channel)
            .factors(FactorsRequest::default())
            .await
            .unwrap_err();
        assert!(is_refused(&status), "{status:?}");
        assert!(!is_refused(&tonic::Status::unavailable("overloaded")));
        assert!(!is_refused(&tonic::Status::deadline_exceeded("timeout")));
    }
}
