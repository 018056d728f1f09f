//! Sluice common: everything the metadata service, the DataNode and the client share.
//!
//! - [`ids`]: block ids, generation stamps, node ids, DataNode descriptors.
//! - [`checksum`]: CRC32C per checksum chunk (512 bytes by default, as HDFS).
//! - [`status`]: stable wire status codes carried by data-transfer responses and acks.
//! - [`frame`]: the length-prefixed data-transfer frame codec (bincode header + raw payload).
//! - [`proto`]: the data-transfer messages (ops, packets, acks, read chunks).
//! - [`rpc`]: the tarpc control-plane services (client protocol, DataNode protocol) and their types.
//! - [`error`]: typed errors shared across crates.
//! - [`config`]: the configuration file and environment loading, with validation.
//! - [`telemetry`]: tracing set-up for the binaries.

pub mod checksum;
pub mod config;
pub mod error;
pub mod frame;
pub mod ids;
pub mod proto;
pub mod rpc;
pub mod status;
pub mod telemetry;

pub use error::{ChecksumError, FrameError, MetaError};
pub use ids::{BlockId, DatanodeId, ExtendedBlock, GenerationStamp, NodeId};
pub use status::Status;
