//! Faults on the agent↔master link, injected by a TCP proxy on loopback
//! ([`damper_tests::proxy`]): a link that drops everything, one that resets,
//! a master that answers slowly. Real gRPC, an in-process master, a 500 ms
//! rollup interval so each test takes seconds.
//!
//! What must hold: `check` never waits on the link; a factor that cannot be
//! refreshed lapses and the agent fails open, counted; an op configured
//! fail-static keeps its factor instead; counts that could not be sent are
//! kept and delivered when the link returns.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use damper_agent::Agent;
use damper_master::{Master, MasterOptions};
use damper_tests::proxy::{Fault, FaultProxy};
use damper_tests::quick_config;
use damper_tests::served::ServedMaster;

const LIMIT: f64 = 1_000.0;
/// Checks per second, each of cost [`COST`]: 10 × the limit.
const CHECKS_PER_SEC: u64 = 2_000;
const COST: u64 = 5;
const INTERVAL: Duration = Duration::from_millis(500);

struct Setup {
    served: ServedMaster,
    proxy: FaultProxy,
}

/// A master with 500 ms rollups behind a fault proxy.
async fn setup() -> Setup {
    let config = quick_config(&format!(
        "[limits]\nmessages = {LIMIT}\npresence = {LIMIT}\n"
    ));
    let served = ServedMaster::start(Master::new(config, MasterOptions::default()), None).await;
    let proxy = FaultProxy::start(served.address).await.unwrap();
    Setup { served, proxy }
}

impl Setup {
    fn agent(
        &self,
        configure: impl FnOnce(damper_agent::AgentBuilder) -> damper_agent::AgentBuilder,
    ) -> Arc<Agent> {
        let builder = Agent::builder()
            .masters([self.proxy.address().to_string()])
            .agent_id("faulty-link")
            .rollup_interval(INTERVAL);
        Arc::new(configure(builder).start().unwrap())
    }

    async fn stop(self) {
        // Close the proxied connections first: a master shutting down
        // gracefully waits for its connections, and a faulty link may never
        // carry its goodbye.
        drop(self.proxy);
        self.served.stop().await;
    }
}

/// A flood on one (account, op) from a plain thread, as a node's publish
/// path would call `check`, recording the slowest call.
struct Flood {
    attempted: AtomicU64,
    admitted: AtomicU64,
    slowest_check_ns: AtomicU64,
    stop: AtomicBool,
}

impl Flood {
    fn start(agent: Arc<Agent>, op: &'static str) -> (Arc<Flood>, std::thread::JoinHandle<()>) {
        let flood = Arc::new(Flood {
            attempted: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            slowest_check_ns: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let f = flood.clone();
        let thread = std::thread::spawn(move || {
            let began = tokio::time::Instant::now();
            let mut issued = 0u64;
            while !f.stop.load(Relaxed) {
                let due = (began.elapsed().as_secs_f64() * CHECKS_PER_SEC as f64) as u64;
                while issued < due {
                    issued += 1;
                    let t = tokio::time::Instant::now();
                    let admitted = agent.check("acme", op, COST).is_admit();
                    let took = t.elapsed().as_nanos() as u64;
                    f.slowest_check_ns.fetch_max(took, Relaxed);
                    f.attempted.fetch_add(COST, Relaxed);
                    if admitted {
                        f.admitted.fetch_add(COST, Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        (flood, thread)
    }

    /// (attempted, admitted) so far.
    fn totals(&self) -> (u64, u64) {
        (self.attempted.load(Relaxed), self.admitted.load(Relaxed))
    }

    /// The admitted share of what is attempted over the next `span`.
    async fn admitted_share_over(&self, span: Duration) -> f64 {
        let (a0, b0) = self.totals();
        tokio::time::sleep(span).await;
        let (a1, b1) = self.totals();
        (b1 - b0) as f64 / (a1 - a0).max(1) as f64
    }
}

/// Polls `condition` every 50 ms for up to `within`; returns whether it held.
async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    condition()
}

/// Floods until suppressed, breaks the link with `fault`, and checks the
/// agent fails open and counts it, then heals the link and checks every
/// count made meanwhile reaches the master.
async fn partition_then_heal(fault: Fault) {
    let setup = setup().await;
    let agent = setup.agent(|b| b);
    let (flood, thread) = Flood::start(agent.clone(), "messages");
    let factor = || agent.factor("acme", "messages").unwrap_or(0.0);

    assert!(
        eventually(Duration::from_secs(20), || factor() > 0.8).await,
        "never suppressed: {}",
        factor()
    );
    let share = flood.admitted_share_over(Duration::from_secs(1)).await;
    assert!(
        (0.05..0.2).contains(&share),
        "held near 10% before the fault: {share}"
    );

    setup.proxy.set(fault);
    let broken = tokio::time::Instant::now();
    // The factor cannot be refreshed: it lapses after its validity (1.5 s
    // here) and the agent admits everything.
    assert!(
        eventually(Duration::from_secs(10), || factor() == 0.0).await,
        "factor never lapsed"
    );
    eprintln!(
        "{fault:?}: factor lapsed {:?} after the fault",
        broken.elapsed()
    );
    assert!(
        eventually(Duration::from_secs(5), || agent.stats().factors_expired
            >= 1)
        .await,
        "the lapse was not counted: {:?}",
        agent.stats()
    );
    let share = flood.admitted_share_over(Duration::from_secs(1)).await;
    assert_eq!(share, 1.0, "fails open while the link is down");
    assert!(agent.stats().rollups_failed >= 2, "{:?}", agent.stats());

    flood.stop.store(true, Relaxed);
    thread.join().unwrap();
    let (attempted, _) = flood.totals();
    assert!(
        setup.served.master.ingested().attempted < attempted,
        "the master saw everything although the link was down"
    );

    setup.proxy.set(Fault::Pass);
    let healed = tokio::time::Instant::now();
    // The agent probes the master, rejoins it, and sends what it carried.
    let delivered = eventually(Duration::from_secs(30), || {
        setup.served.master.ingested().attempted >= attempted
    })
    .await;
    let ingested = setup.served.master.ingested().attempted;
    eprintln!(
        "{fault:?}: carried counts delivered {:?} after the heal: {ingested} of {attempted}",
        healed.elapsed(),
    );
    assert!(
        delivered,
        "counts lost: master has {ingested} of {attempted}"
    );
    // A rollup whose reply was lost is resent and counted twice (rollups
    // carry no sequence number yet): at most one interval's worth here.
    let one_interval = CHECKS_PER_SEC * COST * INTERVAL.as_millis() as u64 / 1000;
    assert!(
        ingested <= attempted + one_interval,
        "master has {ingested}, more than {attempted} + one interval"
    );
    assert!(
        flood.slowest_check_ns.load(Relaxed) < 1_000_000_000,
        "a check waited on the link"
    );
    agent.shutdown().await;
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_drops_everything_fails_open_and_delivers_the_counts_later() {
    partition_then_heal(Fault::Drop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_resets_fails_open_and_delivers_the_counts_later() {
    partition_then_heal(Fault::Cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_master_never_slows_check() {
    let setup = setup().await;
    let agent = setup.agent(|b| b);
    let (flood, thread) = Flood::start(agent.clone(), "messages");
    assert!(
        eventually(Duration::from_secs(20), || agent
            .factor("acme", "messages")
            .unwrap_or(0.0)
            > 0.8)
        .await,
        "never suppressed"
    );
    // Every byte now takes 3 s each way: far past the agent's 250 ms
    // request timeout. A `check` that waited on a rollup would take seconds.
    setup.proxy.set(Fault::Delay(Duration::from_secs(3)));
    let before = flood.attempted.load(Relaxed);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = flood.attempted.load(Relaxed) - before;
    let slowest = flood.slowest_check_ns.load(Relaxed);
    flood.stop.store(true, Relaxed);
    thread.join().unwrap();
    assert!(
        during > CHECKS_PER_SEC * COST,
        "checks stalled: {during} cost in 4 s"
    );
    assert!(slowest < 1_000_000_000, "slowest check took {slowest} ns");
    assert!(agent.stats().rollups_failed >= 2, "{:?}", agent.stats());
    assert_eq!(agent.factor("acme", "messages"), Some(0.0), "fails open");
    assert!(agent.stats().factors_expired >= 1);
    agent.shutdown().await;
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_static_op_keeps_its_factor_through_a_partition() {
    let setup = setup().await;
    let agent = setup.agent(|b| b.fail_static("messages", Duration::from_secs(60)));
    let (messages, t1) = Flood::start(agent.clone(), "messages");
    let (presence, t2) = Flood::start(agent.clone(), "presence");
    let factor = |op| agent.factor("acme", op).unwrap_or(0.0);
    assert!(
        eventually(Duration::from_secs(20), || factor("messages") > 0.8
            && factor("presence") > 0.8)
        .await,
        "never suppressed"
    );
    setup.proxy.set(Fault::Drop);
    // `presence` fails open after its validity ...
    assert!(eventually(Duration::from_secs(10), || factor("presence") == 0.0).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // ... while `messages` holds its last factor.
    assert!(factor("messages") > 0.8, "messages: {}", factor("messages"));
    let held = messages.admitted_share_over(Duration::from_secs(1)).await;
    let open = presence.admitted_share_over(Duration::from_secs(1)).await;
    assert!(held < 0.25, "messages admitted {held} of its flood");
    assert_eq!(open, 1.0, "presence admitted {open} of its flood");
    for (flood, thread) in [(messages, t1), (presence, t2)] {
        flood.stop.store(true, Relaxed);
        thread.join().unwrap();
    }
    agent.shutdown().await;
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_ring_is_counted_reported_and_healed() {
    // Two masters, each behind its own proxy; the ring is the proxies'
    // addresses, as agents know them.
    let (a, b) = (setup().await, setup().await);
    let members = vec![a.proxy.address().to_string(), b.proxy.address().to_string()];
    a.served.master.set_ring(&members, &members[0]).unwrap();
    b.served.master.set_ring(&members, &members[1]).unwrap();
    let agent = Arc::new(
        Agent::builder()
            .masters(members.clone())
            .agent_id("split-view")
            .rollup_interval(INTERVAL)
            .start()
            .unwrap(),
    );
    let ring = damper_core::ring::Ring::new(&members);
    let accounts: Vec<String> = (0..20).map(|i| format!("acct-{i}")).collect();
    assert!(accounts.iter().any(|x| ring.owner(x) == Some(&members[0])));
    let traffic = {
        let (agent, accounts) = (agent.clone(), accounts.clone());
        tokio::spawn(async move {
            loop {
                for account in &accounts {
                    agent.check(account, "messages", 1);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(b.served.master.ingested().foreign, 0, "views agree");

    // The agent loses its link to a: a's accounts go to b, which counts them
    // and says they are not its own.
    a.proxy.set(Fault::Cut);
    assert!(
        eventually(Duration::from_secs(10), || b
            .served
            .master
            .ingested()
            .foreign
            > 0)
        .await,
        "b never saw a's accounts"
    );
    let a_before = a.served.master.ingested().entries;

    // The link returns: the agent rejoins a, and b stops receiving them.
    a.proxy.set(Fault::Pass);
    let mut healed = false;
    for _ in 0..30 {
        let foreign = b.served.master.ingested().foreign;
        tokio::time::sleep(Duration::from_secs(2)).await;
        if b.served.master.ingested().foreign == foreign
            && a.served.master.ingested().entries > a_before
        {
            healed = true;
            break;
        }
    }
    assert!(healed, "the split never healed");
    traffic.abort();
    agent.shutdown().await;
    a.stop().await;
    b.stop().await;
}
