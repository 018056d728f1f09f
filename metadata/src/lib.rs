//! Sluice metadata service (HDFS's NameNode, Ozone's OM+SCM): the namespace, block allocation
//! and pipelines, the DataNode registry and replica tracking, served over tarpc and HTTP.
//!
//! - [`store`]: the key-value store trait under the namespace, and its sled implementation.
//! - [`namespace`]: directories and files, paths, inode records and their layout in the store.
//! - [`blocks`]: the in-memory block manager (states, replicas, deletions to send).
//! - [`datanodes`]: the DataNode registry and its liveness state machine.
//! - [`placement`]: choosing DataNodes for a block (load, racks, exclusions).
//! - [`leases`]: write leases by holder and by renewal time.
//! - [`replication`]: re-replication queues (blocks needing copies, copies in flight, commands
//!   waiting for their source's heartbeat).
//! - [`recovery`]: block recoveries in progress and the choice of their primary DataNode.
//! - [`state`]: all of the above behind one lock, with the protocols' logic.
//! - `service`, `rpc`, `http`, `monitor`, [`server`]: the thin async shells.
//!
//! Embed with [`MetadataServer::start`]; see `docs/metadata.md` for the model.

pub mod blocks;
pub mod datanodes;
pub mod error;
mod http;
pub mod leases;
mod metrics;
mod monitor;
pub mod namespace;
pub mod placement;
pub mod recovery;
pub mod replication;
mod rpc;
pub mod server;
mod service;
pub mod state;
pub mod store;

pub use error::MetadataError;
pub use server::MetadataServer;
pub use state::MonitorAction;
