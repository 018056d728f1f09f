//! Sluice DataNode: stores block replicas on local volumes and moves bytes over the framed
//! data-transfer protocol (`docs/protocol.md`); reports to the metadata service over tarpc.
//!
//! - [`command`]: the `sluice-datanode` command line.
//! - [`node`]: [`DataNode`] — start, addresses, metrics, graceful stop, kill.
//! - [`storage`]: volumes, replica layout and metadata files, replica states, the replica map
//!   (dataset) and the start-up scan.
//! - [`write`]: the `WriteBlock` receiver, its ack responder, and the `ReplicaWriter` actor
//!   around a replica sink (`write::sink::ReplicaSink`).
//! - [`read`]: the `BlockReader` task (streaming read), the classic chunk read, prefetch.
//! - `transfer`: the source side of `TransferBlock`.
//! - [`recovery`]: block recovery — the recovery ops, the primary's worker, the length rules.
//! - `scanner`: the block scanner (verifies finalized replicas' checksums at a bounded rate).
//! - `heartbeat`: registration, heartbeats, block reports, commands.
//! - `server`: the accept loop and per-connection op dispatch; `http`: `/health`, `/status`,
//!   `/metrics`; `actors`: the actix system thread.
//! - `webhdfs`: the data half of WebHDFS (CREATE, OPEN, GETFILECHECKSUM), as a client of the
//!   cluster through `sluice-client`.
//! - `advertise`: `advertised.host = "@ip"` (register this machine's IP, for containers).
//! - [`failpoint`]: named, node-scoped failpoints (feature `failpoints`).
//! - `sys`: every OS call below `std` (directory fsync, `pwrite`, O_DIRECT and its aligned
//!   buffers, `posix_fadvise`, `statvfs`, the host name) and the crate's only `unsafe` code.
//! - [`metrics`], [`error`].
//!
//! See `docs/datanode.md` for the design.

mod actors;
mod advertise;
pub mod command;
mod context;
pub(crate) mod error;
pub(crate) mod failpoint;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub(crate) mod heartbeat;
mod http;
pub(crate) mod metrics;
pub(crate) mod node;
pub(crate) mod read;
pub(crate) mod recovery;
mod scanner;
mod server;
pub(crate) mod storage;
pub(crate) mod sys;
mod transfer;
mod ui;
mod webhdfs;
mod wire;
pub mod write;

pub use error::DatanodeError;
pub use metrics::Metrics;
pub use node::DataNode;
