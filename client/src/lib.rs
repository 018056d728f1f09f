//! Sluice client: the [`FileSystem`] API to write and read files in a Sluice cluster.
//!
//! - [`filesystem`]: the entry point — metadata RPCs, `create`, `open`, namespace operations.
//! - [`write`]: [`FileWriter`] and its streamer task (packets, pipeline, ack queue).
//! - [`read`]: [`FileReader`] (stream mode, chunk mode, positioned reads, failover).
//! - `checksum`: file checksums ([`FileChecksum`], COMPOSITE-CRC32C).
//! - [`error`]: the error type, [`ClientError`].
//! - `meta`: the connection to the metadata service, one typed method per RPC (a leaf that
//!   `filesystem`, `write`, `read` and `lease` use).
//! - `connection`: framed data-transfer connections to DataNodes.
//! - `lease`: the lease renewer.
//! - `fuzzing` (cargo feature `fuzzing`): the ack parser's fuzz target body.
//!
//! The library depends on `sluice-common` only; the wire protocols are described in
//! `docs/protocol.md` and the client's behaviour in `docs/client.md`.

pub(crate) mod checksum;
mod connection;
pub(crate) mod error;
pub(crate) mod filesystem;
mod lease;
mod meta;
pub(crate) mod read;
pub(crate) mod write;

pub use checksum::{FileChecksum, COMPOSITE_CRC32C};
pub use error::{ClientError, CopyFailure, PipelineFailure, ReplaceFailure};
pub use filesystem::{ConnectOptions, FileSystem};
pub use read::{FileReader, ReadOptions};
pub use sluice_common::config::{ClientConfig, ReadMode};
pub use sluice_common::rpc::{
    ClusterReport, FileKind, FileStatus, FsckReport, Health, LocatedBlock, LocatedBlocks,
};
pub use write::{FileWriter, WriteOptions};

/// Fuzz target bodies (cargo feature `fuzzing`, used by the harness in `fuzz/`).
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing {
    pub use crate::write::fuzzing::acks;
}

#[cfg(test)]
mod module_graph;

#[cfg(test)]
mod tests {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        send_sync::<super::FileSystem>();
        send_sync::<super::FileWriter>();
        send_sync::<super::FileReader>();
        send_sync::<super::ClientError>();
    }
}
