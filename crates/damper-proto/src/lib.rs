//! The Damper gRPC APIs, package `damper.v1`: agent↔master
//! (`damper.proto`) and the sidecar's decisions (`check.proto`).
//!
//! Generated at build time from `proto/damper/v1/` (the field
//! documentation lives there and is carried into these types) with
//! `tonic-prost-build` and a vendored `protoc`.
//!
//! # Layout
//! - [`v1`]: the messages ([`v1::RollupRequest`], [`v1::RollupReply`], …),
//!   the client ([`v1::master_client::MasterClient`]) and the server trait
//!   ([`v1::master_server::Master`]); the sidecar's `Check` service
//!   ([`v1::check_server::Check`], [`v1::check_client::CheckClient`]).
//! - [`convert`]: `From` both ways between these messages and the core's
//!   ([`damper_core::wire`]), the one place the mapping is written.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors of `damper.v1`, for
//!   gRPC server reflection.
//!
//! # Example
//! ```
//! use damper_proto::v1::{AccountCounts, OpCounts, RollupRequest};
//! use prost::Message;
//!
//! let request = RollupRequest {
//!     agent_id: "edge-1".into(),
//!     interval_start_unix_ms: 1_700_000_000_000,
//!     interval_end_unix_ms: 1_700_000_002_000,
//!     ops: vec![OpCounts {
//!         op: "messages".into(),
//!         accounts: vec![AccountCounts {
//!             account: "acme".into(),
//!             attempted: 1001,
//!             admitted: 0,
//!             ..Default::default()
//!         }],
//!         ..Default::default()
//!     }],
//!     // The digest of the ring the agent routed by (0: unknown).
//!     ring_version: 0,
//!     ..Default::default()
//! };
//! let bytes = request.encode_to_vec();
//! assert_eq!(RollupRequest::decode(bytes.as_slice()).unwrap(), request);
//! ```

pub mod convert;

/// Version 1 of the API (`damper.v1`).
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    tonic::include_proto!("damper.v1");
}

/// The encoded `FileDescriptorSet` of `damper.v1`, so a server can answer
/// gRPC reflection (`grpcurl`, `grpc_cli`) without the `.proto` file.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("damper_descriptor");
