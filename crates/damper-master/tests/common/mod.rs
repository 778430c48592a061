//! Starting real `damper-master` processes for the tests in this folder.
//! Each test binary uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

/// A running `damper-master` process and what it logs.
pub struct MasterProcess {
    /// The process.
    pub child: Child,
    /// The address it serves gRPC on.
    pub address: String,
    /// The address of its HTTP endpoint, unless started with `--no-http`.
    pub http: Option<String>,
    /// Its log lines after the one that announced the address.
    pub logs: mpsc::Receiver<String>,
}

impl MasterProcess {
    /// Starts a master with `--listen listen` and the extra `args`, and
    /// waits until it serves. Its HTTP endpoint goes on a fresh loopback
    /// port unless `args` say otherwise, so masters never collide.
    pub fn start(listen: &str, args: &[&std::ffi::OsStr]) -> MasterProcess {
        let http_set = args.iter().any(|a| *a == "--http" || *a == "--no-http");
        let mut child = Command::new(env!("CARGO_BIN_EXE_damper-master"))
            .args(["--listen", listen])
            .args(if http_set {
                &[][..]
            } else {
                &["--http", "127.0.0.1:0"][..]
            })
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("damper-master starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let mut before = Vec::new();
        let field = |line: &str, name: &str| {
            line.split(&format!(" {name}=")).nth(1).map(|rest| {
                rest.split_whitespace()
                    .next()
                    .unwrap()
                    .trim_matches('"')
                    .to_string()
            })
        };
        let (address, http) = loop {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("damper-master exited; it logged {before:?}"))
                .expect("readable");
            if let Some(address) = field(&line, "listen") {
                let http = field(&line, "http").filter(|h| h != "off");
                break (address, http);
            }
            before.push(line);
        };
        // Keep draining its logs so it never blocks on a full pipe.
        let (send, logs) = mpsc::channel();
        for line in before {
            let _ = send.send(line);
        }
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        MasterProcess {
            child,
            address,
            http,
            logs,
        }
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it
    /// exited successfully. When it did not, prints how it ended and its
    /// logs, for the failure's report.
    pub fn terminate(mut self) -> bool {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        let exit = self.child.wait().expect("the master exits");
        if !exit.success() {
            // The log thread sends until the pipe closes, which it now has.
            std::thread::sleep(std::time::Duration::from_millis(100));
            eprintln!("the master ended with {exit}; its logs:");
            for line in self.logs.try_iter() {
                eprintln!("  {line}");
            }
        }
        exit.success()
    }

    /// Sends `signal` (such as `HUP`) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// `GET path` on its HTTP endpoint: the status code and the body.
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.http.as_deref().expect("an HTTP endpoint"), path)
    }

    /// Every log line so far.
    pub fn logged(&self) -> Vec<String> {
        self.logs.try_iter().collect()
    }
}

impl Drop for MasterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET over loopback, one connection per call: enough for
/// the master's endpoint, which sets Content-Length on every reply.
pub fn http_get(address: &str, path: &str) -> (u16, String) {
    http_get_with(address, path, "")
}

/// [`http_get`] with extra header lines (each ending in `\r\n`).
pub fn http_get_with(address: &str, path: &str, headers: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("the HTTP endpoint accepts");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("a whole reply");
    let (head, body) = response.split_once("\r\n\r\n").expect("headers end");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    (status, body.to_string())
}
