//! A load generator for the sidecar's `damper.v1.Check/CheckMany`: N
//! concurrent callers, each sending batches of checks over 100 000
//! accounts as fast as answers come back, for a number of seconds. Prints
//! decisions per second and the batch latency's quantiles as one JSON
//! line. Used by `docs/bench/agentd-peer.sh`.
//!
//! `cargo run --release -p damper-agentd --example grpc_load -- ADDRESS [SECONDS] [BATCH] [CONCURRENCY]`
#![allow(clippy::disallowed_types)] // A benchmark measures wall time.

use std::time::{Duration, Instant};

use damper_proto::v1::check_client::CheckClient;
use damper_proto::v1::{CheckManyRequest, CheckRequest};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let address = args
        .next()
        .ok_or("usage: grpc_load ADDRESS [SECONDS] [BATCH] [CONCURRENCY]")?;
    let seconds: u64 = args.next().map_or(Ok(10), |s| s.parse())?;
    let batch: usize = args.next().map_or(Ok(1000), |s| s.parse())?;
    let concurrency: usize = args.next().map_or(Ok(4), |s| s.parse())?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))?
        .connect()
        .await?;
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for caller in 0..concurrency {
        let mut client = CheckClient::new(channel.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = caller * 7919;
            while Instant::now() < until {
                let checks = (0..batch)
                    .map(|_| {
                        n = (n + 104_729) % 100_000;
                        CheckRequest {
                            account: format!("acct-{n:06}"),
                            op: "messages".into(),
                            cost: Some(1),
                            publisher: None,
                        }
                    })
                    .collect();
                let sent = Instant::now();
                let reply = client.check_many(CheckManyRequest { checks }).await;
                latencies.push(sent.elapsed());
                assert_eq!(
                    reply.expect("CheckMany answers").into_inner().replies.len(),
                    batch
                );
            }
            latencies
        }));
    }
    let started = Instant::now();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    let q = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3;
    println!(
        "{{\"case\":\"grpc CheckMany\",\"batch\":{batch},\"concurrency\":{concurrency},\
         \"decisions_per_sec\":{:.0},\"batch_p50_ms\":{:.3},\"batch_p99_ms\":{:.3}}}",
        (latencies.len() * batch) as f64 / elapsed,
        q(0.5),
        q(0.99)
    );
    Ok(())
}
