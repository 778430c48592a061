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
    /// The address it serves on.
    pub address: String,
    /// Its log lines after the one that announced the address.
    pub logs: mpsc::Receiver<String>,
}

impl MasterProcess {
    /// Starts a master with `--listen listen` and the extra `args`, and
    /// waits until it serves.
    pub fn start(listen: &str, args: &[&std::ffi::OsStr]) -> MasterProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_damper-master"))
            .args(["--listen", listen])
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
        let address = loop {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("damper-master exited; it logged {before:?}"))
                .expect("readable");
            if let Some(rest) = line.split("listen=").nth(1) {
                break rest
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .trim_matches('"')
                    .to_string();
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
            logs,
        }
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it
    /// exited successfully.
    pub fn terminate(mut self) -> bool {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        self.child.wait().expect("the master exits").success()
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
