//! Sluice DataNode: stores block replicas on local volumes and moves bytes over the framed
//! data-transfer protocol (`docs/protocol.md`); reports to the metadata service over tarpc.
//!
//! - [`node`]: [`DataNode`] — start, addresses, metrics, graceful stop, kill.
//! - [`storage`]: volumes, replica layout and metadata files, replica states, the replica map
//!   (dataset) and the start-up scan.
//! - [`write`]: the `WriteBlock` receiver, its ack responder, and the `ReplicaWriter` actor
//!   around a [`write::sink::ReplicaSink`].
//! - [`read`]: the `BlockReader` actor (streaming read), the classic chunk read, prefetch.
//! - `transfer`: the source side of `TransferBlock`.
//! - [`recovery`]: block recovery — the recovery ops, the primary's worker, the length rules.
//! - `scanner`: the block scanner (verifies finalized replicas' checksums at a bounded rate).
//! - `heartbeat`: registration, heartbeats, block reports, commands.
//! - `server`: the accept loop and per-connection op dispatch; `http`: `/health`, `/status`,
//!   `/metrics`; `actors`: the actix system thread.
//! - `advertise`: `advertised.host = "@ip"` (register this machine's IP, for containers).
//! - [`failpoint`]: named, node-scoped failpoints (feature `failpoints`).
//! - [`metrics`], [`error`].
//!
//! See `docs/datanode.md` for the design.

mod actors;
mod advertise;
mod context;
pub mod error;
pub mod failpoint;
pub(crate) mod heartbeat;
mod http;
pub mod metrics;
pub mod node;
pub mod read;
pub mod recovery;
mod scanner;
mod server;
pub mod storage;
mod transfer;
mod wire;
pub mod write;

pub use error::DatanodeError;
pub use metrics::Metrics;
pub use node::DataNode;
