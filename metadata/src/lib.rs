//! Sluice metadata service (HDFS's NameNode, Ozone's OM+SCM): the namespace, block allocation
//! and pipelines, the DataNode registry and replica tracking, served over tarpc and HTTP.
//!
//! - [`store`]: the key-value store trait under the namespace, its sled implementation and an
//!   in-memory one for tests.
//! - [`commit`]: commit sequence numbers; what a change implies waits until it is durable.
//! - [`namespace`]: directories and files, paths, inode records and their layout in the store.
//! - [`blocks`]: the in-memory block manager (states, replicas, deletions to send).
//! - [`datanodes`]: the DataNode registry and its liveness state machine.
//! - [`placement`]: choosing DataNodes for a block (load, racks, exclusions).
//! - [`leases`]: write leases by holder and by renewal time.
//! - [`replication`]: re-replication queues (blocks needing copies, copies in flight, commands
//!   waiting for their source's heartbeat).
//! - [`events`]: the bounded ring of recent cluster events the web UI shows.
//! - [`recovery`]: block recoveries in progress and the choice of their primary DataNode.
//! - [`tokens`]: block access tokens on located blocks, new blocks and commands.
//! - [`state`]: all of the above behind one lock, with the protocols' logic.
//! - `service`, `rpc`, `http` (with the `webhdfs` gateway and the `ui` web page), `monitor`,
//!   [`server`]: the thin async shells.
//!
//! [`command`] is the `sluice-metadata` command line. Embed with [`MetadataServer::start`]; see `docs/metadata.md` for the model.

pub(crate) mod blocks;
pub mod command;
pub(crate) mod commit;
pub(crate) mod datanodes;
pub(crate) mod error;
pub(crate) mod events;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod http;
pub(crate) mod leases;
mod metrics;
mod monitor;
pub(crate) mod namespace;
pub(crate) mod placement;
pub(crate) mod recovery;
pub(crate) mod replication;
mod rpc;
pub(crate) mod server;
mod service;
pub(crate) mod state;
pub mod store;
pub(crate) mod tokens;
mod ui;
mod webhdfs;

pub use error::MetadataError;
pub use server::MetadataServer;
pub use state::MonitorAction;
