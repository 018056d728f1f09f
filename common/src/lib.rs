//! Sluice common: everything the metadata service, the DataNode and the client share.
//!
//! - `ids`: block ids, generation stamps, node ids, DataNode descriptors.
//! - [`checksum`]: CRC32C per checksum chunk (512 bytes by default, as HDFS).
//! - `status`: stable wire status codes carried by data-transfer responses and acks.
//! - [`frame`]: the length-prefixed data-transfer frame codec (bincode header + raw payload).
//! - [`framed`]: sending and receiving frames within a time limit.
//! - `fuzzing` (cargo feature `fuzzing`): fuzz target bodies of the frame decoder and the token
//!   parser, and the replay of kept inputs.
//! - [`html`]: escaping for the services' web pages.
//! - [`proto`]: the data-transfer messages (ops, packets, acks, read chunks).
//! - [`rpc`]: the tarpc control-plane services (client protocol, DataNode protocol) and their types.
//! - [`auth`]: the cluster secret and the challenge DataNodes answer to join the cluster.
//! - [`token`]: block access tokens (HMAC-SHA256), their keys and their checks.
//! - `error`: typed errors shared across crates.
//! - [`config`]: the configuration file and environment loading, with validation.
//! - [`ready`]: the JSON line a service binary prints to stdout once its sockets are bound.
//! - [`webhdfs`]: WebHDFS parameters, JSON documents and `RemoteException` errors.
//! - `telemetry` (cargo feature `telemetry`): tracing set-up for the binaries.
//! - `metrics` (cargo feature `telemetry`): what both services' `/metrics` share (histograms,
//!   build info, process metrics, the Prometheus text encoding).

pub mod auth;
pub mod checksum;
pub mod config;
pub(crate) mod error;
pub mod frame;
pub mod framed;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod html;
#[cfg(feature = "http")]
pub mod http_limits;
pub(crate) mod ids;
#[cfg(feature = "telemetry")]
pub mod memory;
pub mod metrics;
pub mod peer_limit;
pub mod proto;
pub mod ready;
pub mod rpc;
pub mod rpc_stream;
pub(crate) mod status;
#[cfg(feature = "telemetry")]
pub mod telemetry;
pub mod token;
pub mod webhdfs;

pub use error::{ChecksumError, FrameError, MetaError};
pub use ids::{BlockId, DatanodeId, ExtendedBlock, GenerationStamp, NodeId};
pub use status::Status;
