//! Generates the `damper.v1` messages and gRPC stubs from `proto/` with a
//! protoc vendored through crates.io, so a fresh machine needs nothing
//! installed beyond the Rust toolchain.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    // The agent<->master API, and the sidecar's decision API.
    let protos = [
        root.join("damper/v1/damper.proto"),
        root.join("damper/v1/check.proto"),
    ];
    for proto in &protos {
        println!("cargo:rerun-if-changed={}", proto.display());
    }

    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    // The encoded descriptors, for gRPC server reflection on the master.
    let descriptors = PathBuf::from(std::env::var("OUT_DIR")?).join("damper_descriptor.bin");
    tonic_prost_build::configure()
        .build_transport(false)
        .file_descriptor_set_path(descriptors)
        .compile_with_config(config, &protos, &[root])?;
    Ok(())
}
