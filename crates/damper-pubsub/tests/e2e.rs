//! Real WebSocket clients against two `damper-pubsub` nodes and a master,
//! all on loopback: real gRPC between the nodes' agents and the master, real
//! WebSockets between clients and nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use damper_agent::Agent;
use damper_agent::local::BucketConfig;
use damper_core::config::MasterConfig;
use damper_master::{Master, MasterOptions};
use damper_pubsub::{ClientFrame, ErrorCode, Node, NodeConfig, ServerFrame};
use damper_testkit::{ServedMaster, assert_held};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

type Sink = futures_util::stream::SplitSink<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    Message,
>;

/// A connected client: what it sends goes through `sink`; every frame it
/// receives is recorded with the time since `epoch`.
struct Client {
    sink: Sink,
    frames: Arc<Mutex<Vec<(Duration, ServerFrame)>>>,
    reader: JoinHandle<()>,
}

impl Client {
    async fn connect(node: SocketAddr, account: &str, epoch: Instant) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{node}/ws?account={account}"))
            .await
            .expect("the node accepts");
        let (sink, mut stream) = ws.split();
        let frames: Arc<Mutex<Vec<(Duration, ServerFrame)>>> = Arc::default();
        let recorded = frames.clone();
        let reader = tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                if let Message::Text(text) = message {
                    let frame: ServerFrame = serde_json::from_str(&text).expect("a protocol frame");
                    recorded.lock().unwrap().push((epoch.elapsed(), frame));
                }
            }
        });
        Client {
            sink,
            frames,
            reader,
        }
    }

    async fn send(&mut self, frame: &ClientFrame) {
        let text = serde_json::to_string(frame).unwrap();
        self.sink
            .send(Message::Text(text.into()))
            .await
            .expect("sent");
    }

    async fn send_raw(&mut self, text: &str) {
        self.sink
            .send(Message::Text(text.into()))
            .await
            .expect("sent");
    }

    async fn subscribe(&mut self, channel: &str) {
        self.send(&ClientFrame::Subscribe {
            channel: channel.into(),
        })
        .await;
        let want = ServerFrame::Subscribed {
            channel: channel.into(),
        };
        self.wait(|frames| frames.iter().any(|(_, f)| *f == want))
            .await;
    }

    async fn publish(&mut self, channel: &str, id: u64) {
        self.send(&ClientFrame::Publish {
            channel: channel.into(),
            id,
            data: format!("message {id}"),
        })
        .await;
    }

    /// Waits (up to 10 s) until `done` holds of the frames received.
    async fn wait(&self, done: impl Fn(&[(Duration, ServerFrame)]) -> bool) {
        for _ in 0..1000 {
            if done(&self.frames.lock().unwrap()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never: {:?}", self.frames.lock().unwrap().last());
    }

    fn frames(&self) -> Vec<(Duration, ServerFrame)> {
        self.frames.lock().unwrap().clone()
    }

    /// The ids of the messages received, by channel.
    fn received(&self) -> BTreeSet<(String, u64)> {
        self.frames()
            .into_iter()
            .filter_map(|(_, f)| match f {
                ServerFrame::Message { channel, id, .. } => Some((channel, id)),
                _ => None,
            })
            .collect()
    }

    async fn close(mut self) {
        let _ = self.sink.close().await;
        let _ = self.reader.await;
    }
}

/// A node on a loopback port, with its agent pointed at `master`.
struct RunningNode {
    address: SocketAddr,
    node: Node,
    stop: oneshot::Sender<()>,
    server: JoinHandle<std::io::Result<()>>,
}

async fn start_node(master: &str, config: NodeConfig) -> RunningNode {
    let agent = Agent::builder()
        .masters([master.to_string()])
        .rollup_interval(Duration::from_millis(500))
        .start()
        .unwrap();
    let node = Node::new(agent, config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(damper_pubsub::serve(listener, node.clone(), async {
        let _ = stopped.await;
    }));
    RunningNode {
        address,
        node,
        stop,
        server,
    }
}

impl RunningNode {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.server
            .await
            .unwrap()
            .expect("the node serves without error");
    }
}

/// The account limit: cost (1 + subscribers) per second over both nodes.
const LIMIT: f64 = 400.0;
/// Flood subscribers per node: each flood publish costs 1 + 3.
const SUBSCRIBERS: usize = 3;
/// Flood publishers per node, each on its own channel, each 125/s: 1 000
/// publishes/s, 4 000 cost/s over both nodes, 10 × the limit.
const PUBLISHERS: usize = 4;
const PERIOD: Duration = Duration::from_millis(8);
const FLOOD_FOR: Duration = Duration::from_secs(14);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_over_two_nodes_is_held_at_the_account_limit_and_nothing_accepted_is_lost() {
    let config = MasterConfig::from_toml(&format!(
        "[window]\nrollup_interval_ms = 500\nsub_interval_ms = 1500\ngrace_ms = 200\n\
         [limits]\nmessages = {LIMIT}\n"
    ))
    .unwrap();
    let served = ServedMaster::start(Master::new(config, MasterOptions::default()), None).await;
    let master_address = served.address.to_string();
    // Local limits well above what each connection and channel sends here:
    // only the account-wide limit should bite.
    let roomy = NodeConfig::new(
        BucketConfig::per_second(1_000).unwrap(),
        BucketConfig::per_second(1_000).unwrap(),
    );
    let nodes = [
        start_node(&master_address, roomy).await,
        start_node(&master_address, roomy).await,
    ];
    let epoch = Instant::now();

    // Subscribers first, so every publish has its fanout.
    let channels: Vec<String> = (0..PUBLISHERS).map(|i| format!("ch-{i}")).collect();
    let mut subscribers = Vec::new(); // (node, its channels, client)
    for (n, node) in nodes.iter().enumerate() {
        for _ in 0..SUBSCRIBERS {
            let mut client = Client::connect(node.address, "flood-co", epoch).await;
            for channel in &channels {
                client.subscribe(channel).await;
            }
            subscribers.push((n, channels.clone(), client));
        }
        let mut calm = Client::connect(node.address, "calm-co", epoch).await;
        calm.subscribe("updates").await;
        subscribers.push((n, vec!["updates".to_string()], calm));
    }

    // Publishers: 4 flood publishers and 1 calm one (10/s, cost 2) per node.
    let mut publishers = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for (i, channel) in channels.iter().enumerate() {
            let client = Client::connect(node.address, "flood-co", epoch).await;
            let first_id = ((n * PUBLISHERS + i) as u64) << 32;
            publishers.push((n, channel.clone(), first_id, PERIOD, client));
        }
        let calm = Client::connect(node.address, "calm-co", epoch).await;
        publishers.push((
            n,
            "updates".to_string(),
            (99 + n as u64) << 32,
            Duration::from_millis(100),
            calm,
        ));
    }
    let started = Instant::now();
    let tasks: Vec<_> = publishers
        .into_iter()
        .map(|(n, channel, first_id, period, mut client)| {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let mut sent = 0u64;
                while started.elapsed() < FLOOD_FOR {
                    tick.tick().await;
                    client.publish(&channel, first_id + sent).await;
                    sent += 1;
                }
                // Every publish gets exactly one answer.
                client
                    .wait(|frames| {
                        frames
                            .iter()
                            .filter(|(_, f)| {
                                matches!(f, ServerFrame::Ack { .. } | ServerFrame::Error { .. })
                            })
                            .count() as u64
                            >= sent
                    })
                    .await;
                (n, channel, sent, client)
            })
        })
        .collect();
    let mut finished = Vec::new();
    for task in tasks {
        finished.push(task.await.unwrap());
    }
    // Deliveries in flight arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // What the publishers saw: admitted flood cost per second, over both nodes.
    let mut admitted_cost: BTreeMap<u64, u64> = BTreeMap::new();
    let mut acked: BTreeMap<usize, BTreeSet<(String, u64)>> = BTreeMap::new();
    let (mut flood_sent, mut flood_rejected) = (0u64, 0u64);
    for (n, channel, sent, client) in &finished {
        let frames = client.frames();
        let answers: Vec<_> = frames
            .iter()
            .filter(|(_, f)| matches!(f, ServerFrame::Ack { .. } | ServerFrame::Error { .. }))
            .collect();
        assert_eq!(
            answers.len() as u64,
            *sent,
            "{channel}: one answer per publish"
        );
        let calm = channel == "updates";
        for (at, frame) in answers {
            match frame {
                ServerFrame::Ack {
                    id, subscribers, ..
                } => {
                    if !calm {
                        assert_eq!(*subscribers, SUBSCRIBERS as u64);
                        *admitted_cost.entry(at.as_secs()).or_default() += 1 + subscribers;
                    }
                    acked.entry(*n).or_default().insert((channel.clone(), *id));
                }
                ServerFrame::Error {
                    id,
                    code,
                    retry_after_ms,
                    reason,
                    limit,
                    demand,
                } => {
                    assert!(!calm, "the calm account was refused: {reason}");
                    assert!(id.is_some(), "an error frame names its publish");
                    assert_eq!(*code, ErrorCode::AccountRateLimited, "{reason}");
                    assert!(retry_after_ms.is_some_and(|ms| ms > 0), "{reason}");
                    // It says how far over: the limit, and a demand above it.
                    let (limit, demand) = (limit.unwrap(), demand.unwrap());
                    assert!(limit > 0.0 && demand > limit, "{limit} {demand}: {reason}");
                    flood_rejected += 1;
                }
                _ => unreachable!(),
            }
        }
        if !calm {
            flood_sent += sent;
        }
    }
    let steady: Vec<u64> = admitted_cost.range(5..14).map(|(_, c)| *c).collect();
    let mean = steady.iter().sum::<u64>() as f64 / steady.len() as f64;
    eprintln!(
        "flood: {flood_sent} publishes, {flood_rejected} refused; admitted cost per second: {admitted_cost:?}; seconds 5-13 mean {mean:.0} against {LIMIT}"
    );
    assert!(steady.len() >= 8, "{admitted_cost:?}");
    assert_held(
        &format!("seconds 5-13 of {admitted_cost:?}"),
        mean,
        LIMIT,
        0.1,
    );
    assert!(
        flood_sent as f64 >= 0.8 * 2.0 * PUBLISHERS as f64 * 125.0 * 14.0,
        "the flood ran: {flood_sent}"
    );

    // Every accepted message reached every subscriber on its node.
    for (n, subscribed, client) in &subscribers {
        let received = client.received();
        let want: BTreeSet<_> = acked[n]
            .iter()
            .filter(|(channel, _)| subscribed.contains(channel))
            .cloned()
            .collect();
        assert!(!want.is_empty());
        assert_eq!(
            received.len(),
            want.len(),
            "node {n}: a subscriber of {subscribed:?} missed accepted messages"
        );
        assert_eq!(received, want);
    }
    let stats: Vec<_> = nodes.iter().map(|n| n.node.stats()).collect();
    eprintln!("node stats: {stats:?}");
    assert_eq!(
        stats
            .iter()
            .map(|s| s.rejected_connection + s.rejected_channel)
            .sum::<u64>(),
        0
    );

    for (_, _, client) in subscribers {
        client.close().await;
    }
    for (_, _, _, client) in finished {
        client.close().await;
    }
    let [a, b] = nodes;
    a.stop().await;
    b.stop().await;
    // The nodes flushed their agents: the master saw every flood publish.
    assert!(served.master.ingested().attempted >= flood_sent * (1 + SUBSCRIBERS as u64));
    served.stop().await;
}

#[tokio::test]
async fn local_limits_refuse_with_their_own_codes_and_bad_frames_are_answered() {
    // No master: the agent fails open, so only the local limits can refuse.
    let tight = NodeConfig::new(
        BucketConfig::new(5, 1, Duration::from_secs(10)).unwrap(),
        BucketConfig::new(8, 1, Duration::from_secs(10)).unwrap(),
    );
    let node = start_node("127.0.0.1:9", tight).await;
    let epoch = Instant::now();

    // One connection: 5 pass, the 6th is the connection's limit.
    let mut a = Client::connect(node.address, "acme", epoch).await;
    for id in 0..6 {
        a.publish("news", id).await;
    }
    a.wait(|f| f.len() >= 6).await;
    let frames = a.frames();
    assert!(
        frames[..5]
            .iter()
            .all(|(_, f)| matches!(f, ServerFrame::Ack { .. })),
        "{frames:?}"
    );
    match &frames[5].1 {
        ServerFrame::Error {
            id: Some(5),
            code: ErrorCode::ConnectionRateLimited,
            retry_after_ms: Some(ms),
            ..
        } => {
            assert!((9_000..=10_000).contains(ms), "retry hint {ms} ms")
        }
        other => panic!("{other:?}"),
    }

    // A second connection on the same channel: the channel has 3 left.
    let mut b = Client::connect(node.address, "acme", epoch).await;
    for id in 10..14 {
        b.publish("news", id).await;
    }
    b.wait(|f| f.len() >= 4).await;
    let codes: Vec<_> = b
        .frames()
        .into_iter()
        .map(|(_, f)| match f {
            ServerFrame::Ack { .. } => None,
            ServerFrame::Error { code, .. } => Some(code),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        codes,
        [None, None, None, Some(ErrorCode::ChannelRateLimited)]
    );
    // Another account's channel of the same name is its own.
    let mut c = Client::connect(node.address, "globex", epoch).await;
    c.publish("news", 1).await;
    c.wait(|f| matches!(f.first(), Some((_, ServerFrame::Ack { .. }))))
        .await;

    // Bad frames get an answer; the connection stays usable.
    c.send_raw("not json").await;
    c.send_raw(r#"{"op":"publish","channel":"","id":2,"data":"x"}"#)
        .await;
    c.publish("news", 3).await;
    c.wait(|f| f.len() >= 4).await;
    let frames = c.frames();
    assert!(
        matches!(
            &frames[1].1,
            ServerFrame::Error {
                code: ErrorCode::BadRequest,
                id: None,
                ..
            }
        ),
        "{frames:?}"
    );
    assert!(
        matches!(
            &frames[2].1,
            ServerFrame::Error {
                code: ErrorCode::BadRequest,
                id: Some(2),
                ..
            }
        ),
        "{frames:?}"
    );
    assert!(
        matches!(&frames[3].1, ServerFrame::Ack { id: 3, .. }),
        "{frames:?}"
    );

    // No account: the upgrade is refused.
    let refused = tokio_tungstenite::connect_async(format!("ws://{}/ws", node.address)).await;
    assert!(refused.is_err());

    let stats = node.node.stats();
    assert_eq!(
        (
            stats.rejected_connection,
            stats.rejected_channel,
            stats.rejected_account
        ),
        (1, 1, 0)
    );
    for client in [a, b, c] {
        client.close().await;
    }
    node.stop().await;
}
