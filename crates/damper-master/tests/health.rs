//! Standard tooling against the master: gRPC health checking, and
//! `--check-config` for CI pipelines.

use std::process::Command;

use damper_core::config::MasterConfig;
use damper_master::{Master, MasterOptions};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A master served in-process on a loopback port, a channel to it, and
/// what stops it.
async fn serve() -> (
    tonic::transport::Channel,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), damper_master::ServeError>>,
) {
    let config = MasterConfig::from_toml("[limits]\nmessages = 1000").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(damper_master::run(
        listener,
        Master::new(config, MasterOptions::default()),
        async {
            let _ = stopped.await;
        },
    ));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (channel, stop, server)
}

#[tokio::test]
async fn the_master_answers_grpc_health_checks() {
    let (channel, stop, server) = serve().await;
    let mut health = HealthClient::new(channel);
    for service in ["", "damper.v1.Master"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[test]
fn check_config_validates_a_file_and_names_the_bad_field() {
    // Removed, with what the test wrote, when dropped.
    let scratch = tempfile::Builder::new()
        .prefix("damper-check-config-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        "[limits]\nmessages = 1000\n\"messages/acme\" = 5000\n",
    )
    .unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[window]\nsub_intervals = 0\n").unwrap();
    let run = |path: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_damper-master"))
            .arg("--check-config")
            .arg(path)
            .output()
            .unwrap()
    };
    let ok = run(&good);
    assert!(ok.status.success());
    assert!(String::from_utf8_lossy(&ok.stdout).contains("valid (2 limits)"));
    let refused = run(&bad);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("window.sub_intervals"), "{stderr}");
    let missing = run(&dir.join("none.toml"));
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("--check-config"));
}

/// One shard numbers at most 2^24 − 1 pairs: a `--max-pairs` the shards
/// cannot hold stops the master at start, naming the flag and the shards
/// it needs, before it binds anything.
#[test]
fn more_pairs_than_the_shards_can_number_is_refused_at_start() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_damper-master"))
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .output()
            .unwrap()
    };
    let refused = run(&["--max-pairs", "1000000000", "--shards", "8"]);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--max-pairs"), "{stderr}");
    assert!(stderr.contains("--shards 60 or more"), "{stderr}");
}

#[tokio::test]
async fn the_master_answers_grpc_reflection() {
    use tokio_stream::StreamExt;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let (channel, stop, server) = serve().await;
    let mut reflection = ServerReflectionClient::new(channel);
    let ask = |request| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut replies = reflection
        .server_reflection_info(tokio_stream::iter([
            ask(MessageRequest::ListServices(String::new())),
            ask(MessageRequest::FileContainingSymbol(
                "damper.v1.Master".into(),
            )),
        ]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        replies.next().await.unwrap().unwrap().message_response
    else {
        panic!("not a service list");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "damper.v1.Master",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }
    let Some(MessageResponse::FileDescriptorResponse(files)) =
        replies.next().await.unwrap().unwrap().message_response
    else {
        panic!("no file descriptor for damper.v1.Master");
    };
    let file = <prost_types::FileDescriptorProto as prost::Message>::decode(
        files.file_descriptor_proto[0].as_slice(),
    )
    .unwrap();
    assert_eq!(file.package(), "damper.v1");
    let methods: Vec<_> = file.service[0].method.iter().map(|m| m.name()).collect();
    assert_eq!(methods, ["Rollup", "Factors", "Accounts", "Watch"]);
    drop(reflection);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
