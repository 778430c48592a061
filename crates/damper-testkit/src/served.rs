//! A master served in-process over real gRPC on `127.0.0.1:0`, for the
//! end-to-end tests: started and stopped in one call each.

use std::net::SocketAddr;

use damper_master::{Master, ServeError, ServerTls, run_with_tls};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running master. [`stop`](Self::stop) shuts it down gracefully and
/// checks it served without error.
pub struct ServedMaster {
    /// Its state, to inspect (`ingested`, `factor`, `len`).
    pub master: Master,
    /// Where it serves.
    pub address: SocketAddr,
    stop: oneshot::Sender<()>,
    server: JoinHandle<Result<(), ServeError>>,
}

impl ServedMaster {
    /// Serves `master` on a fresh loopback port, over TLS when `tls` is
    /// given.
    pub async fn start(master: Master, tls: Option<ServerTls>) -> ServedMaster {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        ServedMaster::serve(master, tls, listener)
    }

    /// Serves `master` at `address`, as a master restarted in place would
    /// be (the port of one stopped a moment ago).
    pub async fn start_at(master: Master, address: SocketAddr) -> ServedMaster {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .expect("the port a stopped master let go");
        ServedMaster::serve(master, None, listener)
    }

    fn serve(
        master: Master,
        tls: Option<ServerTls>,
        listener: tokio::net::TcpListener,
    ) -> ServedMaster {
        let address = listener.local_addr().expect("bound");
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(run_with_tls(listener, master.clone(), tls, async {
            let _ = stopped.await;
        }));
        ServedMaster {
            master,
            address,
            stop,
            server,
        }
    }

    /// Shuts it down, waits for it, and panics if serving failed.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.server
            .await
            .expect("the server task does not panic")
            .expect("the master serves without error");
    }
}
