//! The Redis-protocol front door: any Redis client (redis-py, ioredis,
//! go-redis, Jedis, `redis-cli`) asks `DAMPER.CHECK account op [cost]` on
//! TCP or a Unix socket, RESP2 or RESP3 (after `HELLO 3`), pipelined or
//! not.
//!
//! Each connection reads what the client sent, answers every whole command
//! in it in order, writes the answers at once, and reads again: a
//! pipelined batch costs one write. Limits: `max_connections` open at once
//! (more are told `-ERR max number of clients reached` and closed, as
//! Redis does), `max_frame_bytes` per command, and `idle_timeout` for a
//! connection that sends nothing. A client that does not read its answers
//! stops being read (its writes wait), so it holds at most one buffer of
//! each. At shutdown, what was read is answered, then the connection
//! closes.
//!
//! # Layout
//! - `frame`: cutting commands out of the bytes.
//! - `command`: what a command asks, and its errors.
//! - `reply`: the answer in RESP2 or RESP3.
//! - this file: accepting, the connection loop, and what each command does.

pub mod command;
pub mod frame;
pub mod reply;

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::Sidecar;
use command::{COMMANDS, Command, CommandQuery};
use frame::next_command;
pub use reply::{Protocol, Reply};

/// What every connection of the front door shares.
#[derive(Clone)]
struct Door {
    sidecar: Sidecar,
    /// One permit per connection that may be open.
    permits: Arc<Semaphore>,
    open: Arc<AtomicUsize>,
    next_id: Arc<AtomicU64>,
}

/// A listener of either kind.
pub enum RespListener {
    /// TCP.
    Tcp(TcpListener),
    /// A Unix socket, and its path (removed at shutdown).
    Unix(UnixListener, PathBuf),
}

/// Serves the Redis protocol on `listeners` until `shutdown` turns true,
/// then answers what each connection has read and returns once all are
/// closed.
pub async fn serve(
    listeners: Vec<RespListener>,
    sidecar: Sidecar,
    shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let door = Door {
        permits: Arc::new(Semaphore::new(sidecar.limits().max_connections)),
        sidecar,
        open: Arc::default(),
        next_id: Arc::new(AtomicU64::new(1)),
    };
    let mut accepting = JoinSet::new();
    for listener in listeners {
        accepting.spawn(accept(listener, door.clone(), shutdown.clone()));
    }
    let mut result = Ok(());
    while let Some(done) = accepting.join_next().await {
        if let Ok(Err(e)) = done {
            result = Err(e);
        }
    }
    result
}

/// Accepts on one listener until shutdown, then waits for its connections.
async fn accept(
    listener: RespListener,
    door: Door,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let mut connections = JoinSet::new();
    loop {
        if *shutdown.borrow() {
            break;
        }
        let watching = shutdown.clone();
        tokio::select! {
            accepted = accept_one(&listener, &door, &watching) => {
                match accepted {
                    Ok(task) => { connections.spawn(task); }
                    // A failed accept (out of descriptors, a reset before
                    // accept) says nothing about the next one.
                    Err(e) => {
                        tracing::warn!(error = %e, "resp: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                }
            }
            _ = shutdown.changed() => {}
        }
        // Reap the connections that ended, so the set stays small.
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
    if let RespListener::Unix(_, path) = &listener {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

type Connection = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Accepts one connection: the future that serves it (or, past
/// `max_connections`, tells it so and closes it).
async fn accept_one(
    listener: &RespListener,
    door: &Door,
    shutdown: &watch::Receiver<bool>,
) -> io::Result<Connection> {
    let stream: Box<dyn Stream> = match listener {
        RespListener::Tcp(l) => {
            let (stream, _) = l.accept().await?;
            let _ = stream.set_nodelay(true);
            Box::new(stream)
        }
        RespListener::Unix(l, _) => Box::new(l.accept().await?.0),
    };
    Ok(door.clone().admit(stream, shutdown.clone()))
}

/// A connection's byte stream, TCP or Unix.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

impl Door {
    /// The connection's future; past `max_connections`, one that tells
    /// the client so and closes.
    fn admit(self, mut stream: Box<dyn Stream>, shutdown: watch::Receiver<bool>) -> Connection {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            crate::metrics::connection_closed("max_connections");
            return Box::pin(async move {
                let _ = stream
                    .write_all(b"-ERR max number of clients reached\r\n")
                    .await;
                let _ = stream.shutdown().await;
            });
        };
        Box::pin(async move {
            crate::metrics::connections("resp", self.open.fetch_add(1, Relaxed) + 1);
            let id = self.next_id.fetch_add(1, Relaxed);
            let mut session = Session::new(id, self.sidecar.clone());
            if let Err(e) = session.run(&mut stream, shutdown).await {
                tracing::debug!(error = %e, id, "resp: connection ended");
            }
            crate::metrics::connections("resp", self.open.fetch_sub(1, Relaxed) - 1);
            drop(permit);
        })
    }
}

/// One connection's state.
struct Session {
    id: u64,
    protocol: Protocol,
    name: Option<String>,
    sidecar: Sidecar,
}

/// What to do after a command.
enum Then {
    Go,
    Close,
}

impl Session {
    fn new(id: u64, sidecar: Sidecar) -> Session {
        Session {
            id,
            protocol: Protocol::Resp2,
            name: None,
            sidecar,
        }
    }

    /// Reads, answers, writes, until the client leaves, idles out, breaks
    /// the protocol, or the sidecar shuts down.
    async fn run(
        &mut self,
        stream: &mut Box<dyn Stream>,
        mut shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        let limits = self.sidecar.limits().clone();
        let mut input = BytesMut::with_capacity(4096);
        let mut output = BytesMut::with_capacity(4096);
        loop {
            let then = self.answer_buffered(&mut input, limits.max_frame_bytes, &mut output);
            if !output.is_empty() {
                stream.write_all(&output).await?;
                output.clear();
            }
            if matches!(then, Then::Close) || *shutdown.borrow() {
                break;
            }
            tokio::select! {
                read = tokio::time::timeout(limits.idle_timeout, stream.read_buf(&mut input)) => {
                    match read {
                        Err(_) => {
                            crate::metrics::connection_closed("idle_timeout");
                            break;
                        }
                        Ok(Ok(0)) => break,
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return Err(e),
                    }
                }
                _ = shutdown.changed() => {}
            }
        }
        stream.shutdown().await
    }

    /// Answers every whole command in `input` into `output`, and drops
    /// them from `input`.
    fn answer_buffered(&mut self, input: &mut BytesMut, max: usize, output: &mut BytesMut) -> Then {
        let mut used = 0;
        let mut then = Then::Go;
        loop {
            let rest = &input[used..];
            match next_command(rest, max) {
                Ok(None) => break,
                Ok(Some((args, len))) => {
                    used += len;
                    if args.is_empty() {
                        continue;
                    }
                    let (reply, next) = self.execute(rest, &args);
                    reply.encode(self.protocol, output);
                    if let Then::Close = next {
                        then = Then::Close;
                        break;
                    }
                }
                Err(e) => {
                    crate::metrics::connection_closed("protocol");
                    crate::metrics::request("resp", "invalid");
                    Reply::err(e).encode(self.protocol, output);
                    then = Then::Close;
                    break;
                }
            }
        }
        input.advance(used);
        then
    }

    /// Does one command.
    fn execute(&mut self, buf: &[u8], args: &[std::ops::Range<usize>]) -> (Reply, Then) {
        let command = match Command::parse(buf, args) {
            Ok(command) => command,
            Err(e) => {
                crate::metrics::request("resp", "invalid");
                return (Reply::Error(e.0), Then::Go);
            }
        };
        crate::metrics::request("resp", "ok");
        let reply = match command {
            Command::Check {
                account,
                op,
                cost,
                publisher,
            } => match self.sidecar.check(account, op, cost, publisher) {
                Ok(v) => Reply::Array(vec![
                    Reply::Int(i64::from(v.admitted)),
                    Reply::Double(v.factor),
                    Reply::Int(v.retry_after.as_millis().min(i64::MAX as u128) as i64),
                    Reply::Double(v.limit),
                ]),
                Err(e) => Reply::err(e),
            },
            Command::Peek { account, op } => match self.sidecar.peek(account, op) {
                Ok(s) => Reply::Array(vec![
                    Reply::Double(s.factor),
                    Reply::Double(s.limit),
                    Reply::text(
                        s.source
                            .map_or("", |r| crate::verdict::Reason::of(r).as_str()),
                    ),
                ]),
                Err(e) => Reply::err(e),
            },
            Command::Ping(None) => Reply::Simple("PONG"),
            Command::Ping(Some(m)) | Command::Echo(m) => Reply::Bulk(Bytes::copy_from_slice(m)),
            Command::Hello { version, setname } => {
                match version {
                    Some(3) => self.protocol = Protocol::Resp3,
                    Some(_) => self.protocol = Protocol::Resp2,
                    None => {}
                }
                if let Some(name) = setname {
                    self.name = Some(name.to_owned());
                }
                self.hello()
            }
            Command::SetName(name) => {
                self.name = (!name.is_empty()).then(|| name.to_owned());
                Reply::Ok
            }
            Command::GetName => self.name.clone().map_or(Reply::Null, Reply::text),
            Command::ClientId => Reply::Int(self.id as i64),
            Command::Accepted => Reply::Ok,
            Command::Command(query) => commands(query),
            Command::Info => Reply::text(self.sidecar.info()),
            Command::ConfigGet(names) => Reply::Map(
                names
                    .iter()
                    .filter_map(|n| match n.as_str() {
                        "save" => Some(("save", "")),
                        "appendonly" => Some(("appendonly", "no")),
                        _ => None,
                    })
                    .map(|(k, v)| (Reply::text(k), Reply::text(v)))
                    .collect(),
            ),
            Command::Quit => return (Reply::Ok, Then::Close),
            Command::Reset => {
                self.protocol = Protocol::Resp2;
                self.name = None;
                Reply::Simple("RESET")
            }
        };
        (reply, Then::Go)
    }

    /// `HELLO`'s description of the server.
    fn hello(&self) -> Reply {
        let proto = match self.protocol {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        };
        Reply::Map(vec![
            (Reply::text("server"), Reply::text("damper-agentd")),
            (
                Reply::text("version"),
                Reply::text(env!("CARGO_PKG_VERSION")),
            ),
            (Reply::text("proto"), Reply::Int(proto)),
            (Reply::text("id"), Reply::Int(self.id as i64)),
            (Reply::text("mode"), Reply::text("standalone")),
            (Reply::text("role"), Reply::text("master")),
            (Reply::text("modules"), Reply::Array(Vec::new())),
        ])
    }
}

/// `COMMAND`'s answers.
fn commands(query: CommandQuery) -> Reply {
    let describe = |(name, arity, flags): &(&'static str, i64, &'static [&'static str])| {
        let first_key = i64::from(name.starts_with("damper."));
        Reply::Array(vec![
            Reply::text(*name),
            Reply::Int(*arity),
            Reply::Array(flags.iter().copied().map(Reply::Simple).collect()),
            Reply::Int(first_key),
            Reply::Int(first_key),
            Reply::Int(first_key),
            Reply::Array(Vec::new()),
        ])
    };
    match query {
        CommandQuery::All => Reply::Array(COMMANDS.iter().map(describe).collect()),
        CommandQuery::Count => Reply::Int(COMMANDS.len() as i64),
        CommandQuery::Docs => Reply::Map(Vec::new()),
        CommandQuery::Info(names) => Reply::Array(
            names
                .iter()
                .map(|n| {
                    COMMANDS
                        .iter()
                        .find(|c| c.0 == n)
                        .map_or(Reply::Null, describe)
                })
                .collect(),
        ),
    }
}
