//! Real network faults: two `damper-master` processes and four `damper-load`
//! processes (one agent each, as four edge nodes), each in its own Linux
//! network namespace, joined by veth pairs to a bridge in a seventh. The
//! kernel drops and delays their packets: `tc netem` (delay 200 ms ± 50,
//! 5% loss on every host's link) where the kernel has it, otherwise 5%
//! random loss by an nftables rule and no delay (said on stderr). Midway,
//! one master is cut off one way from half the agents (its packets to them
//! are dropped; theirs reach it), then healed. Production timing: 2-s
//! rounds, the masters' default window.
//!
//! What must hold:
//! - `check` never waits on the network: no check slower than
//!   [`SLOWEST_CHECK`], though rollups time out and resend behind it;
//! - failing open never fails closed: accounts at 0.3× their limit are never
//!   refused, partition or not;
//! - every flood is held again within 10 s of the heal (a probe and the
//!   returning agents' joins take 1–4 s here; the bound is generous for a
//!   loaded 2-core machine, and the figure lives in docs/operations.md);
//! - no count lost or doubled: the cost the masters counted is exactly what
//!   the agents counted, and none was dropped.
//!
//! Needs root (namespaces) and `ip` with `nft` or a netem-capable kernel;
//! `crates/damper-load/tests/chaos-setup.sh` installs iproute2 and nftables
//! where it can. Where namespaces are not permitted the test says so and
//! passes without running. It starts only processes it stops (by PID) and
//! namespaces it deletes, named `dmc<PID>-*`. Run it alone with
//! `cargo build -p damper-master && cargo test -p damper-load --test chaos`.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

const LIMIT: u64 = 1_000;
/// Flood accounts, each at 10× [`LIMIT`] over the four agents.
const FLOODS: usize = 4;
/// The agents' run.
const RUN_SECS: u64 = 50;
/// When the one-way partition starts and heals, seconds into the run.
const CUT_AT: u64 = 16;
const HEAL_AT: u64 = 32;
/// How long after the heal every flood must be held again: measured 1–4 s
/// with joins (5–6 s before; one CI run before agents redialled after a
/// timeout took 13 s: the probes rode a connection stuck in TCP's
/// retransmission backoff), bounded generously so the test never flakes.
const HELD_WITHIN: u64 = 10;
/// A check slower than this waited on something: a check takes
/// microseconds; a network wait here is a rollup timeout (seconds). The
/// margin is for a 2-core machine running six processes.
const SLOWEST_CHECK: Duration = Duration::from_millis(250);
/// Held: a second's admitted cost within this factor of the limit.
const HELD: f64 = 1.3;

/// The hosts: two masters, then four agents. Host `i` is `10.99.0.{i+1}`.
const MASTERS: usize = 2;
const AGENTS: usize = 4;

#[test]
fn masters_and_agents_in_namespaces_through_loss_delay_and_a_one_way_partition() {
    if let Err(why) = namespaces_permitted() {
        eprintln!("SKIPPED: network namespaces are not available here: {why}");
        return;
    }
    let net = Net::build(MASTERS + AGENTS);
    let delay = net.impair_all();
    eprintln!(
        "links: 5% loss{}",
        if delay {
            ", delay 200 ms ± 50 (netem)"
        } else {
            " (nftables); no delay: this kernel has no netem"
        }
    );
    let dir = scratch_dir();
    let config = dir.join("master.toml");
    fs::write(&config, format!("[limits]\nmessages = {LIMIT}\n")).unwrap();

    let mut procs = Procs::default();
    let masters: Vec<String> = (0..MASTERS).map(|m| format!("{}:7070", ip(m))).collect();
    for (m, listen) in masters.iter().enumerate() {
        let log = dir.join(format!("master{m}.log"));
        let mut cmd = net.exec(m, &bin("damper-master"));
        cmd.args(["--listen", listen, "--http", "127.0.0.1:7080"])
            .arg("--config")
            .arg(&config)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info");
        procs.spawn(cmd, &log, &log);
        wait_for(&log, "damper-master serving");
    }
    for a in 0..AGENTS {
        let out = dir.join(format!("agent{a}.jsonl"));
        let mut cmd = net.exec(MASTERS + a, &bin("damper-load"));
        cmd.args([
            "--masters",
            &masters.join(","),
            "--agents",
            "1",
            "--accounts",
        ])
        .arg(FLOODS.to_string())
        .args([
            "--traffic",
            &format!("flood-{{i}}:messages:{}", 10 * LIMIT / 4),
        ])
        .args([
            "--traffic",
            &format!("calm-{{i}}:messages:{}", 3 * LIMIT / 40),
        ])
        .args(["--duration", &format!("{RUN_SECS}s")])
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info");
        procs.spawn(cmd, &out, &dir.join(format!("agent{a}.log")));
    }

    // Master 1 cut off one way from agents 0 and 1: its packets to them are
    // dropped, theirs still reach it. Then healed.
    sleep(Duration::from_secs(CUT_AT));
    let cut: Vec<String> = (0..AGENTS / 2).map(|a| ip(MASTERS + a)).collect();
    net.drop_to(1, &cut);
    eprintln!("t={CUT_AT}s: master 1 cut off from {cut:?} (its replies dropped)");
    sleep(Duration::from_secs(HEAL_AT - CUT_AT));
    net.heal(1);
    eprintln!("t={HEAL_AT}s: healed");

    procs.wait_agents(MASTERS, Duration::from_secs(RUN_SECS - HEAL_AT + 60));
    procs.stop_masters(MASTERS);

    let runs: Vec<AgentRun> = (0..AGENTS)
        .map(|a| AgentRun::read(&dir.join(format!("agent{a}.jsonl"))))
        .collect();
    let counted: Vec<Counted> = (0..MASTERS)
        .map(|m| Counted::read(&dir.join(format!("master{m}.log"))))
        .collect();
    report_and_check(&runs, &counted);
    // `DAMPER_CHAOS_KEEP=1` keeps the processes' logs to read.
    if std::env::var_os("DAMPER_CHAOS_KEEP").is_none() {
        let _ = fs::remove_dir_all(&dir);
    } else {
        eprintln!("logs kept in {}", dir.display());
    }
}

fn report_and_check(runs: &[AgentRun], counted: &[Counted]) {
    // Per account, per second, summed over the agents.
    let mut seconds: BTreeMap<String, BTreeMap<u64, (u64, u64)>> = BTreeMap::new();
    for run in runs {
        for (account, t, attempted, admitted) in &run.seconds {
            let s = seconds
                .entry(account.clone())
                .or_default()
                .entry(*t)
                .or_default();
            s.0 += attempted;
            s.1 += admitted;
        }
    }
    for (account, by_second) in &seconds {
        let line: Vec<String> = by_second.values().map(|s| s.1.to_string()).collect();
        eprintln!("{account} admitted/s: {}", line.join(" "));
    }
    let slowest = runs.iter().map(|r| r.slowest_check_us).max().unwrap();
    let attempted: u64 = runs.iter().map(|r| r.attempted).sum();
    let dropped: u64 = runs.iter().map(|r| r.dropped_cost).sum();
    let failed: u64 = runs.iter().map(|r| r.rollups_failed).sum();
    let at_masters: u64 = counted.iter().map(|c| c.attempted).sum();
    let admitted: u64 = runs.iter().map(|r| r.admitted).sum();
    let admitted_at_masters: u64 = counted.iter().map(|c| c.admitted).sum();
    eprintln!(
        "slowest check {slowest} µs; rollups failed {failed}; cost attempted {attempted} \
         (dropped {dropped}), counted by the masters {at_masters} {:?}; admitted {admitted}, \
         counted {admitted_at_masters}",
        counted.iter().map(|c| c.attempted).collect::<Vec<_>>()
    );

    assert!(
        Duration::from_micros(slowest) < SLOWEST_CHECK,
        "a check took {slowest} µs: it waited on the network"
    );
    for (account, by_second) in seconds.iter().filter(|(a, _)| a.starts_with("calm-")) {
        for (t, (tried, admitted)) in by_second {
            assert_eq!(
                tried, admitted,
                "{account} refused at {t} s at 0.3× its limit"
            );
        }
    }
    let held_from = HEAL_AT + HELD_WITHIN + 1;
    for (account, by_second) in seconds.iter().filter(|(a, _)| a.starts_with("flood-")) {
        // The last second is partial.
        for (t, (_, admitted)) in by_second.range(held_from..RUN_SECS) {
            let ratio = *admitted as f64 / LIMIT as f64;
            assert!(
                ratio <= HELD,
                "{account} admitted {ratio:.2}× its limit at {t} s, {} s after the heal",
                t - HEAL_AT
            );
        }
    }
    assert_eq!(
        dropped, 0,
        "the agents dropped {dropped} cost: too old to carry"
    );
    assert_eq!(
        at_masters, attempted,
        "the masters counted {at_masters} cost attempted; the agents {attempted}"
    );
    assert_eq!(
        admitted_at_masters, admitted,
        "the masters counted {admitted_at_masters} cost admitted; the agents {admitted}"
    );
}

/// What one `damper-load` printed.
#[derive(Default)]
struct AgentRun {
    /// (account, second, attempted, admitted).
    seconds: Vec<(String, u64, u64, u64)>,
    attempted: u64,
    admitted: u64,
    dropped_cost: u64,
    rollups_failed: u64,
    slowest_check_us: u64,
}

impl AgentRun {
    fn read(path: &Path) -> AgentRun {
        let text = fs::read_to_string(path).unwrap();
        let mut run = AgentRun::default();
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: {e}: {line}", path.display()));
            let n = |k: &str| v[k].as_u64().unwrap_or(0);
            if v["agents_summary"] == true {
                run.attempted = n("attempted");
                run.admitted = n("admitted");
                run.dropped_cost = n("dropped_cost");
                run.rollups_failed = n("rollups_failed");
            } else if v["summary"] == true {
                run.slowest_check_us = run.slowest_check_us.max(n("slowest_check_us"));
            } else {
                let account = v["account"].as_str().unwrap().to_string();
                run.seconds
                    .push((account, n("t"), n("attempted"), n("admitted")));
            }
        }
        assert!(run.attempted > 0, "{}: no summary", path.display());
        run
    }
}

/// What one master said it counted, from its last log line.
struct Counted {
    attempted: u64,
    admitted: u64,
}

impl Counted {
    fn read(path: &Path) -> Counted {
        let text = fs::read_to_string(path).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains("damper-master stopped"))
            .unwrap_or_else(|| panic!("{} has no stop line:\n{text}", path.display()));
        let field = |name: &str| -> u64 {
            let at = line.find(&format!(" {name}=")).expect(name) + name.len() + 2;
            let digits: String = line[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().unwrap()
        };
        Counted {
            attempted: field("attempted"),
            admitted: field("admitted"),
        }
    }
}

/// Namespaces `dmc<PID>-sw` (the bridge) and `dmc<PID>-h<i>` (the hosts),
/// deleted on drop.
struct Net {
    prefix: String,
    hosts: usize,
}

fn ip(host: usize) -> String {
    format!("10.99.0.{}", host + 1)
}

impl Net {
    fn build(hosts: usize) -> Net {
        let net = Net {
            prefix: format!("dmc{}", std::process::id()),
            hosts,
        };
        let sw = net.switch();
        run(&["ip", "netns", "add", &sw]);
        run(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"]);
        run(&["ip", "-n", &sw, "link", "set", "br0", "up"]);
        for h in 0..hosts {
            let ns = net.host(h);
            let port = format!("p{h}");
            run(&["ip", "netns", "add", &ns]);
            run(&[
                "ip", "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port,
                "netns", &sw,
            ]);
            run(&["ip", "-n", &sw, "link", "set", &port, "master", "br0", "up"]);
            run(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", ip(h)),
                "dev",
                "eth0",
            ]);
            run(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        net
    }

    fn switch(&self) -> String {
        format!("{}-sw", self.prefix)
    }

    fn host(&self, h: usize) -> String {
        format!("{}-h{h}", self.prefix)
    }

    /// `program` to be run in host `h`'s namespace.
    fn exec(&self, h: usize, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.host(h)]).arg(program);
        cmd
    }

    /// Delay and loss on every host's link; whether delay could be had.
    fn impair_all(&self) -> bool {
        let netem = (0..self.hosts).all(|h| {
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.host(h),
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    "eth0",
                ])
                .args(["root", "netem", "delay", "200ms", "50ms", "loss", "5%"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        if !netem {
            for h in 0..self.hosts {
                self.nft(
                    h,
                    "table inet loss {\n chain out {\n type filter hook output priority 0;\n \
                     numgen random mod 100 < 5 drop\n }\n}\n",
                );
            }
        }
        netem
    }

    /// Drops every packet host `h` sends to `to`.
    fn drop_to(&self, h: usize, to: &[String]) {
        self.nft(
            h,
            &format!(
                "table inet cut {{\n chain out {{\n type filter hook output priority 0;\n \
                 ip daddr {{ {} }} drop\n }}\n}}\n",
                to.join(", ")
            ),
        );
    }

    fn heal(&self, h: usize) {
        run(&[
            "ip",
            "netns",
            "exec",
            &self.host(h),
            "nft",
            "delete",
            "table",
            "inet",
            "cut",
        ]);
    }

    fn nft(&self, h: usize, ruleset: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.host(h), "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("nft");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(ruleset.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "nft refused: {ruleset}");
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in (0..self.hosts).map(|h| self.host(h)).chain([self.switch()]) {
            let _ = Command::new("ip").args(["netns", "del", &ns]).status();
        }
    }
}

/// The processes started, killed by PID on drop if still running.
#[derive(Default)]
struct Procs(Vec<Child>);

impl Procs {
    fn spawn(&mut self, mut cmd: Command, out: &Path, err: &Path) {
        let stdout = fs::File::create(out).unwrap();
        let stderr = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(err)
            .unwrap();
        self.0
            .push(cmd.stdout(stdout).stderr(stderr).spawn().expect("spawn"));
    }

    /// Waits for the agents (after the `masters` first processes) to end.
    fn wait_agents(&mut self, masters: usize, within: Duration) {
        let give_up = within.as_millis() / 100;
        for child in &mut self.0[masters..] {
            let mut waited = 0;
            while child.try_wait().unwrap().is_none() {
                assert!(waited < give_up, "an agent did not finish in {within:?}");
                sleep(Duration::from_millis(100));
                waited += 1;
            }
        }
    }

    /// SIGTERM to the masters, and waits: they log what they counted.
    fn stop_masters(&mut self, masters: usize) {
        for child in &self.0[..masters] {
            run(&["kill", "-TERM", &child.id().to_string()]);
        }
        for child in &mut self.0[..masters] {
            child.wait().unwrap();
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn namespaces_permitted() -> Result<(), String> {
    let probe = format!("dmc{}-probe", std::process::id());
    let added = Command::new("ip")
        .args(["netns", "add", &probe])
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| {
            format!("`ip` not found ({e}); run crates/damper-load/tests/chaos-setup.sh")
        })?;
    if !added.status.success() {
        return Err(String::from_utf8_lossy(&added.stderr).trim().to_string());
    }
    let nft = Command::new("ip")
        .args(["netns", "exec", &probe, "nft", "list", "ruleset"])
        .output();
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    match nft {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err("`nft` is missing or refused; run crates/damper-load/tests/chaos-setup.sh".into()),
    }
}

fn run(args: &[&str]) {
    let status = Command::new(args[0]).args(&args[1..]).status().unwrap();
    assert!(status.success(), "{args:?} failed");
}

/// The release or debug binary beside this crate's own.
fn bin(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_damper-load")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo build -p damper-master` first (the workspace's tests build it)",
        path.display()
    );
    path
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("damper-chaos-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits until `log` contains `text` (a process announcing it serves).
fn wait_for(log: &Path, text: &str) {
    for _ in 0..300 {
        if fs::read_to_string(log).is_ok_and(|t| t.contains(text)) {
            return;
        }
        sleep(Duration::from_millis(50));
    }
    panic!(
        "{} never said {text:?}:\n{}",
        log.display(),
        fs::read_to_string(log).unwrap_or_default()
    );
}
