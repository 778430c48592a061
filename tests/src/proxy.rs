//! A fault-injecting TCP proxy for the agent↔master link, on loopback only.
//!
//! It listens on `127.0.0.1:0` and forwards each connection to one upstream
//! address. The fault in force can be changed at any time, and applies to
//! the connections already open as well as new ones:
//!
//! - [`Fault::Pass`]: forward bytes as they come.
//! - [`Fault::Delay`]: hold every chunk, in both directions, for a while
//!   before forwarding it: a slow master or a congested path.
//! - [`Fault::Drop`]: accept and read, but forward nothing: a path that
//!   silently loses packets. Callers see timeouts, not errors.
//! - [`Fault::Cut`]: close every open connection and close new ones as soon
//!   as they are accepted: a link that resets.
//!
//! Dropping the [`FaultProxy`] stops it and closes every connection.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What the proxy does to the traffic it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    Pass,
    /// Forward everything, each chunk after this delay.
    Delay(Duration),
    /// Forward nothing and answer nothing.
    Drop,
    /// Reset every connection.
    Cut,
}

/// A running proxy. See the module docs.
#[derive(Debug)]
pub struct FaultProxy {
    address: SocketAddr,
    fault: watch::Sender<Fault>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on `127.0.0.1:0` to `upstream`, passing traffic.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (fault, watched) = watch::channel(Fault::Pass);
        let task = tokio::spawn(accept(listener, upstream, watched));
        Ok(FaultProxy {
            address,
            fault,
            task,
        })
    }

    /// The address to give agents instead of the master's.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Switches to `fault`, for open connections too.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, fault: watch::Receiver<Fault>) {
    // Owned here, so aborting the accept task closes every connection.
    let mut connections = JoinSet::new();
    loop {
        let Ok((downstream, _)) = listener.accept().await else {
            continue;
        };
        while connections.try_join_next().is_some() {}
        if *fault.borrow() == Fault::Cut {
            drop(downstream);
            continue;
        }
        connections.spawn(connection(downstream, upstream, fault.clone()));
    }
}

async fn connection(downstream: TcpStream, upstream: SocketAddr, fault: watch::Receiver<Fault>) {
    let Ok(upstream) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = downstream.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (down_read, down_write) = downstream.into_split();
    let (up_read, up_write) = upstream.into_split();
    // Either direction ending (a close, an error, a cut) ends both.
    tokio::select! {
        () = pump(down_read, up_write, fault.clone()) => {}
        () = pump(up_read, down_write, fault) => {}
    }
}

/// Copies one direction, applying the fault in force to each chunk.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut fault: watch::Receiver<Fault>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = fault.changed() => {
                if changed.is_err() || *fault.borrow() == Fault::Cut {
                    return;
                }
                continue;
            }
        };
        let current = *fault.borrow();
        match current {
            Fault::Pass => {}
            Fault::Delay(by) => tokio::time::sleep(by).await,
            Fault::Drop => continue,
            Fault::Cut => return,
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
