//! The agent library against a real master over gRPC on loopback, at a
//! tenth of the production time scale.

use std::time::Duration;

use damper_agent::Agent;
use damper_core::config::MasterConfig;
use damper_master::{Master, MasterOptions};
use damper_tests::served::ServedMaster;

/// A master with 200 ms rollups (time scaled down ten times).
fn scaled_master(limits: &str) -> Master {
    let config = MasterConfig::from_toml(&format!(
        "[window]\nsub_interval_ms = 600\nrollup_interval_ms = 200\ngrace_ms = 100\n[limits]\n{limits}"
    ))
    .unwrap();
    Master::new(config, MasterOptions::default())
}

/// [`scaled_master`] on loopback.
async fn master(limits: &str) -> ServedMaster {
    ServedMaster::start(scaled_master(limits), None).await
}

fn agent(master: &str) -> Agent {
    Agent::builder()
        .masters([master])
        .rollup_interval(Duration::from_millis(200))
        .request_timeout(Duration::from_millis(150))
        .agent_id("test-agent")
        .start()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_gets_a_factor_over_grpc_and_shutdown_flushes() {
    let served = master("messages = 1000").await;
    let agent = agent(&served.address.to_string());
    // 10 000 cost/s for up to 5 s, in 10 ms steps, until the master's
    // factor reaches the agent.
    let mut factor = 0.0;
    for _ in 0..500 {
        for _ in 0..100 {
            agent.check("flood", "messages", 1);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        factor = agent.factor("flood", "messages").unwrap_or(0.0);
        if factor > 0.8 {
            break;
        }
    }
    assert!(factor > 0.8, "factor {factor}");
    // A count made just before shutdown reaches the master.
    agent.check("last-words", "messages", 7);
    agent.shutdown().await;
    assert_eq!(served.master.factor("last-words", "messages"), Some(0.0));
    assert!(served.master.len() >= 2);
    served.stop().await;
}

/// Fast onset over real gRPC at the production time scale (2-s rounds): a
/// flood spread over four agents is reported early and suppressed long
/// before the first round could say anything; with fast onset off, the
/// same flood is still admitted whole at that point. Generous bounds: the
/// early report goes out within 200 ms of the flood, and the check is at
/// 1.5 s, before the first round's reply (2 s plus its send spread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_is_reported_early_and_suppressed_within_the_first_round() {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let served = ServedMaster::start(Master::new(config, MasterOptions::default()), None).await;
    let address = served.address.to_string();
    let agents = |fast_onset: bool| -> Vec<Agent> {
        (0..4)
            .map(|i| {
                Agent::builder()
                    .masters([address.as_str()])
                    .agent_id(format!("edge-{fast_onset}-{i}"))
                    .fast_onset(fast_onset)
                    .start()
                    .unwrap()
            })
            .collect()
    };
    for fast_onset in [true, false] {
        // Start just after a round's grid boundary, so the first round
        // closes about 2 s later, after the check below.
        let ms =
            damper_core::time::Clock::now(&damper_core::time::SystemClock).as_nanos() / 1_000_000;
        let to_boundary = 2_000 - ms % 2_000;
        tokio::time::sleep(Duration::from_millis(to_boundary + 50)).await;
        let agents = agents(fast_onset);
        let account = format!("flood-{fast_onset}");
        // 10 000/s in all, 2 500/s per agent, in 10 ms steps, for 1.5 s.
        let start = tokio::time::Instant::now();
        let mut admitted_last_half_second = 0u64;
        while start.elapsed() < Duration::from_millis(1_500) {
            let late = start.elapsed() >= Duration::from_secs(1);
            for agent in &agents {
                for _ in 0..25 {
                    if agent.check(&account, "messages", 1).is_admit() && late {
                        admitted_last_half_second += 1;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stats: damper_agent::AgentStats = agents.iter().map(Agent::stats).sum();
        let factors: Vec<f64> = agents
            .iter()
            .map(|a| a.factor(&account, "messages").unwrap_or(0.0))
            .collect();
        if fast_onset {
            assert!(stats.early_reports >= 4, "{stats:?}");
            assert_eq!(stats.early_reports_failed, 0, "{stats:?}");
            assert!(factors.iter().all(|f| *f > 0.7), "{factors:?}");
            // 10 000/s for half a second at a factor near 0.9: ~500, and
            // never near the 5 000 of no suppression.
            assert!(
                admitted_last_half_second < 1_500,
                "{admitted_last_half_second}"
            );
        } else {
            assert_eq!(stats.early_reports, 0, "{stats:?}");
            assert!(factors.iter().all(|f| *f == 0.0), "{factors:?}");
        }
        for agent in agents {
            agent.shutdown().await;
        }
    }
    served.stop().await;
}

/// A new account that arrives as a deluge over real gRPC, at the
/// production time scale, starting just after a peek of the sub-window
/// grid: each agent's driver, woken by the state's hook at its first
/// check, peeks at the young pair 20 ms later and reports it, 70 ms before
/// the grid would. Asserts that young peeks reported it (on at least one
/// of the four agents: a driver delayed past the grid's peek lets the grid
/// report it instead), that no early report was refused, and that the
/// account is suppressed at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_accounts_deluge_is_reported_by_its_young_peek() {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let served = ServedMaster::start(Master::new(config, MasterOptions::default()), None).await;
    let address = served.address.to_string();
    let agents: Vec<Agent> = (0..4)
        .map(|i| {
            Agent::builder()
                .masters([address.as_str()])
                .agent_id(format!("edge-young-{i}"))
                .start()
                .unwrap()
        })
        .collect();
    // Let the hellos teach the op's limit, then start 5 ms after a peek
    // of the grid (every 100 ms).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ms = damper_core::time::Clock::now(&damper_core::time::SystemClock).as_nanos() / 1_000_000;
    tokio::time::sleep(Duration::from_millis(100 - ms % 100 + 5)).await;
    // 10 000/s in all, 2 500/s per agent, in 10 ms steps, for 300 ms.
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_millis(300) {
        for agent in &agents {
            for _ in 0..25 {
                agent.check("newcomer", "messages", 1);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stats: damper_agent::AgentStats = agents.iter().map(Agent::stats).sum();
    assert!(stats.young_pairs_reported >= 1, "{stats:?}");
    assert_eq!(stats.early_reports_failed, 0, "{stats:?}");
    let factors: Vec<f64> = agents
        .iter()
        .map(|a| a.factor("newcomer", "messages").unwrap_or(0.0))
        .collect();
    assert!(factors.iter().all(|f| *f > 0.7), "{factors:?}");
    for agent in agents {
        agent.shutdown().await;
    }
    served.stop().await;
}

/// A push over real gRPC at the production time scale: agent A's early
/// report of a flood turns the account's suppression on, and the master
/// pushes the verdict to agent B, which holds the account but saw no
/// flood and reported nothing since: B refuses it within the round, long
/// before its own rollup's reply could say so (2 s plus its send spread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_reported_by_one_agent_is_pushed_to_another_that_holds_the_account() {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let served = ServedMaster::start(Master::new(config, MasterOptions::default()), None).await;
    let address = served.address.to_string();
    let agent = |id: &str| {
        Agent::builder()
            .masters([address.as_str()])
            .agent_id(id)
            .start()
            .unwrap()
    };
    let ms = damper_core::time::Clock::now(&damper_core::time::SystemClock).as_nanos() / 1_000_000;
    tokio::time::sleep(Duration::from_millis(2_000 - ms % 2_000 + 50)).await;
    let (a, b) = (agent("edge-a"), agent("edge-b"));
    // B holds the account: a few operations, told early as every new pair
    // is, and answered with no factor.
    for _ in 0..5 {
        assert!(b.check("acme", "messages", 1).is_admit());
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(b.factor("acme", "messages").unwrap_or(0.0), 0.0);
    // A floods at 10 000/s until B hears, for at most 1.2 s: within B's
    // first round.
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_millis(1_200)
        && b.factor("acme", "messages").unwrap_or(0.0) == 0.0
    {
        for _ in 0..100 {
            a.check("acme", "messages", 1);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // What B had as soon as it heard: the push (its first rollup's reply
    // is due 2 s after it started; the push comes about 1 s after).
    let stats = b.stats();
    let heard = start.elapsed();
    let factor = b.factor("acme", "messages").unwrap_or(0.0);
    assert!(
        factor > 0.5,
        "B's factor {factor} after {heard:?}; {stats:?}"
    );
    assert_eq!(stats.pushes_applied, 1, "{stats:?}");
    a.shutdown().await;
    b.shutdown().await;
    served.stop().await;
}

/// Two agents of one process, both with the default id or both told the
/// same one, started in the same millisecond: the master counts every
/// rollup of both. Each run numbers its rollups from 1, so if the two
/// runs looked alike the master would take one's rollups for resends of
/// the other's and drop them (the flood over two pub/sub nodes was once
/// admitted at twice its limit this way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_of_one_process_are_told_apart_and_every_rollup_of_each_is_counted() {
    let served = master("messages = 1000000").await;
    let address = served.address.to_string();
    let start = |id: Option<&str>| {
        let builder = Agent::builder()
            .masters([address.as_str()])
            .rollup_interval(Duration::from_millis(200))
            .request_timeout(Duration::from_millis(150));
        match id {
            Some(id) => builder.agent_id(id),
            None => builder,
        }
        .start()
        .unwrap()
    };
    let defaults = [start(None), start(None)];
    assert_ne!(defaults[0].id(), defaults[1].id());
    let twins = [start(Some("twin")), start(Some("twin"))];
    let agents: Vec<Agent> = defaults.into_iter().chain(twins).collect();
    // Five rounds of counts from each, the same count at the same moment.
    let mut counted = 0u64;
    for _ in 0..5 {
        for (i, agent) in agents.iter().enumerate() {
            assert!(
                agent
                    .check(&format!("account-{i}"), "messages", 3)
                    .is_admit()
            );
            counted += 3;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for agent in agents {
        agent.shutdown().await;
    }
    assert_eq!(served.master.ingested().attempted, counted);
    served.stop().await;
}

/// Over real gRPC: an account at 0.9× its limit is never refused, and its
/// admitted decisions say how close it is, as the master estimates it
/// over the agents; one at 0.3× says nothing (under the near share).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_decisions_near_the_limit_say_how_near() {
    let served = master("messages = 1000").await;
    let agents = [agent(&served.address.to_string()), {
        Agent::builder()
            .masters([served.address.to_string()])
            .rollup_interval(Duration::from_millis(200))
            .request_timeout(Duration::from_millis(150))
            .agent_id("test-agent-2")
            .start()
            .unwrap()
    }];
    // 900/s and 300/s over the two agents for 3 s, paced by the clock so
    // the rates are exact whatever the sleeps take.
    let (mut near, mut calm) = (None, None);
    let (mut refused, mut done) = (0, 0u64);
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let due = (start.elapsed().as_secs_f64() * 600.0) as u64;
        for n in done..due {
            // Of every 4 checks per agent, 3 are near's and 1 calm's.
            let account = if n % 4 == 3 { "calm" } else { "near" };
            for agent in &agents {
                match agent.check(account, "messages", 1) {
                    damper_agent::Decision::Admit(a) if account == "near" => near = a.utilisation,
                    damper_agent::Decision::Admit(a) => calm = a.utilisation,
                    _ => refused += 1,
                }
            }
        }
        done = due;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(refused, 0);
    let near = near.expect("near its limit: said");
    assert!((0.8..1.0).contains(&near), "{near}");
    assert_eq!(calm, None);
    for agent in agents {
        agent.shutdown().await;
    }
    served.stop().await;
}

/// Over real gRPC: the hello's reply names the accounts whose limit is not
/// the op's default, so a new pair of one is guarded under its own limit
/// (an exempt one under none) from its first check, and only others under
/// the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_account_with_an_override_is_guarded_under_its_own_limit_from_its_first_check() {
    let served =
        master("messages = 100\n\"messages/big\" = 100000\n[exempt]\naccounts = [\"staff\"]").await;
    let agent = agent(&served.address.to_string());
    // Until the hello is answered a new pair has no limit to guard with;
    // a fresh pair made after it starts with one.
    let mut known = false;
    for i in 0..500 {
        let warm = format!("warm-{i}");
        agent.check(&warm, "messages", 1);
        if agent.peek(&warm, "messages").limit > 0.0 {
            known = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(known, "no hello answered within 5 s");
    // 10 000 cost a second on three new accounts for 100 ms, before any
    // rollup's reply could say their limits (the agent's clock is coarse:
    // checks in one tight loop would see no time pass).
    let mut refused = [0usize; 3];
    for _ in 0..50 {
        for (n, account) in ["big", "staff/ops", "small"].into_iter().enumerate() {
            refused[n] += usize::from(!agent.check(account, "messages", 20).is_admit());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let [big, staff, small] = refused;
    assert_eq!(big, 0, "its own 100 000/s");
    assert_eq!(staff, 0, "exempt");
    assert!(small > 25, "the default, 100/s: {small} of 50 refused");
    agent.shutdown().await;
    served.stop().await;
}

/// What [`SlowMaster`] saw.
#[derive(Default)]
struct Seen {
    now: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    entries: std::sync::atomic::AtomicUsize,
}

/// A reply of a master at the default interval that suppresses nothing.
fn no_factors() -> tonic::Response<damper_proto::v1::RollupReply> {
    tonic::Response::new(damper_proto::v1::RollupReply {
        rollup_interval_ms: 2_000,
        ..Default::default()
    })
}

/// A master that takes 30 ms over each rollup and remembers how many were
/// in its hands at once. Answers with no factors.
struct SlowMaster(std::sync::Arc<Seen>);

#[tonic::async_trait]
impl damper_proto::v1::master_server::Master for SlowMaster {
    async fn rollup(
        &self,
        request: tonic::Request<damper_proto::v1::RollupRequest>,
    ) -> Result<tonic::Response<damper_proto::v1::RollupReply>, tonic::Status> {
        use std::sync::atomic::Ordering::SeqCst;
        let seen = &self.0;
        let now = seen.now.fetch_add(1, SeqCst) + 1;
        seen.most.fetch_max(now, SeqCst);
        tokio::time::sleep(Duration::from_millis(30)).await;
        let entries: usize = request.get_ref().ops.iter().map(|o| o.accounts.len()).sum();
        seen.entries.fetch_add(entries, SeqCst);
        seen.now.fetch_sub(1, SeqCst);
        Ok(no_factors())
    }

    async fn factors(
        &self,
        _: tonic::Request<damper_proto::v1::FactorsRequest>,
    ) -> Result<tonic::Response<damper_proto::v1::RollupReply>, tonic::Status> {
        Ok(no_factors())
    }

    async fn accounts(
        &self,
        _: tonic::Request<damper_proto::v1::AccountsRequest>,
    ) -> Result<tonic::Response<damper_proto::v1::AccountsReply>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }

    type WatchStream =
        tonic::codegen::tokio_stream::Empty<Result<damper_proto::v1::RollupReply, tonic::Status>>;

    async fn watch(
        &self,
        _: tonic::Request<damper_proto::v1::WatchRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
}

/// An agent whose round needs many requests to one master sends them a
/// few at a time: all at once, they would share the connection and the
/// master, and every one would finish late (at two million pairs, all of
/// them timed out). 40 requests of 5 entries to a master taking 30 ms over
/// each: never more than two in its hands, and every entry delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollups_to_one_master_go_a_few_at_a_time_and_all_arrive() {
    let slow = std::sync::Arc::new(Seen::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(damper_proto::v1::master_server::MasterServer::new(
                SlowMaster(slow.clone()),
            ))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let agent = Agent::builder()
        .masters([address.as_str()])
        .max_entries_per_request(5)
        .agent_id("many-requests")
        .start()
        .unwrap();
    for i in 0..200 {
        agent.check(&format!("account-{i}"), "messages", 1);
    }
    // The shutdown's last rollup carries all 200 pairs: 40 requests.
    agent.shutdown().await;
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(slow.entries.load(SeqCst), 200);
    let most = slow.most.load(SeqCst);
    assert!((1..=2).contains(&most), "{most} rollups at once");
    server.abort();
}

/// `n` rounds of one check of cost 3 for each of `accounts`, 200 ms apart;
/// the cost checked.
async fn rounds(agent: &Agent, accounts: &[String], n: usize) -> u64 {
    for _ in 0..n {
        for account in accounts {
            assert!(agent.check(account, "messages", 3).is_admit());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    3 * (n * accounts.len()) as u64
}

/// Over real gRPC: once a master has answered a rollup naming an account,
/// later rollups give the account by number (a few bytes an entry, where
/// its 22-byte name alone took more); a master restarted in place, which
/// holds no numbers, refuses them, and the agent's resend names every
/// account again: no count is lost or counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollups_name_accounts_once_and_a_restarted_master_gets_the_names_again() {
    let served = master("messages = 1000000").await;
    let address = served.address;
    let agent = agent(&address.to_string());
    let accounts: Vec<String> = (0..300)
        .map(|i| format!("customer-account-{i:05}"))
        .collect();
    let mut counted = 0u64;
    counted += rounds(&agent, &accounts, 5).await;
    let before = agent.stats();
    counted += rounds(&agent, &accounts, 10).await;
    let after = agent.stats();
    let entries = after.entries_sent - before.entries_sent;
    let per_entry = (after.bytes_sent - before.bytes_sent) as f64 / entries as f64;
    assert!(entries >= 300 * 5, "{entries} entries in 10 rounds");
    assert!(per_entry < 8.0, "{per_entry:.1} bytes per entry");

    // The master restarts in place: a new process, holding nothing.
    let first = served.master.clone();
    served.stop().await;
    let restarted = ServedMaster::start_at(scaled_master("messages = 1000000"), address).await;
    let mut waited = 0;
    while restarted.master.ingested().entries == 0 && waited < 100 {
        counted += rounds(&agent, &accounts, 1).await;
        waited += 1;
    }
    assert!(restarted.master.ingested().entries > 0, "the agent is back");
    counted += rounds(&agent, &accounts, 5).await;
    // By number again, once the restarted master has the names.
    let before = agent.stats();
    counted += rounds(&agent, &accounts, 5).await;
    let after = agent.stats();
    let per_entry = (after.bytes_sent - before.bytes_sent) as f64
        / (after.entries_sent - before.entries_sent) as f64;
    assert!(
        per_entry < 8.0,
        "{per_entry:.1} bytes per entry after the restart"
    );
    agent.shutdown().await;
    let ingested = first.ingested().attempted + restarted.master.ingested().attempted;
    assert_eq!(
        ingested, counted,
        "every count once, over both runs of the master"
    );
    restarted.stop().await;
}

/// Sparse hints over real gRPC, at production timing: twelve agents hold
/// an account of costly operations (cost 51, a limit of 2 000/s) at one
/// operation per round each, then each sends ten a second, 6 120/s in
/// all: each agent alone sees two operations per sub-window, which its
/// surge test calls chance. Their hints reach the master within half a
/// second, it polls every agent on their `Watch` streams, their answers
/// suppress the account, and every agent holds a factor well before the
/// first round after the onset could have said so (2 s and its spread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_costly_flood_spread_thin_is_polled_and_held_before_its_round() {
    let config = MasterConfig::from_toml("[limits]\nmessages = 2000").unwrap();
    let served = ServedMaster::start(Master::new(config, MasterOptions::default()), None).await;
    let address = served.address.to_string();
    let agents: Vec<Agent> = (0..12)
        .map(|i| {
            Agent::builder()
                .masters([address.as_str()])
                .agent_id(format!("edge-sparse-{i}"))
                .start()
                .unwrap()
        })
        .collect();
    // Three rounds at one operation per round each: the pairs reported,
    // their cost per operation learnt.
    let ms =
        || damper_core::time::Clock::now(&damper_core::time::SystemClock).as_nanos() / 1_000_000;
    tokio::time::sleep(Duration::from_millis(2_000 - ms() % 2_000 + 100)).await;
    for _ in 0..3 {
        for (i, agent) in agents.iter().enumerate() {
            tokio::time::sleep(Duration::from_millis(if i == 0 { 0 } else { 100 })).await;
            assert!(agent.check("costly", "messages", 51).is_admit());
        }
        tokio::time::sleep(Duration::from_millis(2_000 - ms() % 2_000 + 100)).await;
    }
    // The flood, just after a cut: ten operations a second on each agent,
    // until every agent holds a factor, for at most 1.8 s.
    let start = tokio::time::Instant::now();
    let held = |agents: &[Agent]| {
        agents
            .iter()
            .all(|a| a.factor("costly", "messages").unwrap_or(0.0) > 0.0)
    };
    while start.elapsed() < Duration::from_millis(1_800) && !held(&agents) {
        for agent in &agents {
            agent.check("costly", "messages", 51);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = start.elapsed();
    let stats: damper_agent::AgentStats = agents.iter().map(Agent::stats).sum();
    println!(
        "every agent held {took:?} after the onset; {} hints, {} polls answered",
        stats.hints_sent, stats.polls_answered
    );
    assert!(
        held(&agents),
        "not every agent held after {took:?}: {stats:?}"
    );
    assert!(stats.hints_sent >= 2, "{stats:?}");
    assert!(stats.polls_answered >= 6, "{stats:?}");
    for agent in agents {
        agent.shutdown().await;
    }
    served.stop().await;
}
