//! The DataNode's error type: one `thiserror` enum with structured variants, each mapped to the
//! stable wire [`Status`] that tells a client what to do (retry, exclude the node, or fail).

use sluice_common::config::ConfigError;
use sluice_common::proto::ReplicaState;
use sluice_common::{BlockId, ChecksumError, FrameError, GenerationStamp, Status};
use std::path::PathBuf;
use thiserror::Error;

/// Everything that can go wrong in a DataNode.
#[derive(Debug, Error)]
pub enum DatanodeError {
    /// A local file or directory operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`"open"`, `"write"`, `"fsync"`, ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration is not usable.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// Two volumes of this node carry different node ids.
    #[error("volume {dir} belongs to node {found}, but the other volumes belong to {expected}")]
    NodeIdMismatch {
        /// The offending data directory.
        dir: PathBuf,
        /// The id of the other volumes.
        expected: String,
        /// The id found in `dir`.
        found: String,
    },
    /// A volume's `VERSION` file cannot be understood.
    #[error("bad VERSION file {path}: {reason}")]
    BadVersionFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A listener could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No replica of the block here.
    #[error("replica {block} not found")]
    ReplicaNotFound {
        /// The block.
        block: BlockId,
    },
    /// The request names a newer generation stamp than the replica has.
    #[error("replica {block} has generation stamp {have}, older than the requested {requested}")]
    StaleGenStamp {
        /// The block.
        block: BlockId,
        /// What the request asked for.
        requested: GenerationStamp,
        /// What the replica has.
        have: GenerationStamp,
    },
    /// A read starting at or past the visible length.
    #[error("offset {offset} is at or past the visible length {visible} of replica {block}")]
    OutOfRange {
        /// The block.
        block: BlockId,
        /// Requested offset.
        offset: u64,
        /// The replica's visible length.
        visible: u64,
    },
    /// A replica of the block with the same or a newer generation stamp exists.
    #[error("replica {block} already exists with generation stamp {gen_stamp} ({state:?})")]
    ReplicaExists {
        /// The block.
        block: BlockId,
        /// Its generation stamp.
        gen_stamp: GenerationStamp,
        /// Its state.
        state: ReplicaState,
    },
    /// The operation does not fit the replica's state or length.
    #[error("replica {block}: {reason}")]
    InvalidReplica {
        /// The block.
        block: BlockId,
        /// What does not fit.
        reason: String,
    },
    /// A request or packet that breaks the protocol.
    #[error("invalid request: {reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
    },
    /// Data did not match its checksum.
    #[error("checksum error on {block}: {source}")]
    Checksum {
        /// The block.
        block: BlockId,
        /// The failing chunk.
        #[source]
        source: ChecksumError,
    },
    /// A data-transfer frame could not be read or written.
    #[error("frame: {0}")]
    Frame(#[from] FrameError),
    /// A replica's metadata file is damaged.
    #[error("corrupt metadata file {path}: {reason}")]
    CorruptMeta {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// No volume has room for a new replica.
    #[error("no volume has room for a new replica")]
    NoSpace,
    /// A downstream DataNode failed.
    #[error("downstream {addr}: {reason}")]
    Downstream {
        /// Its data address.
        addr: String,
        /// What happened.
        reason: String,
    },
    /// A peer did not answer within the socket timeout.
    #[error("timed out after {secs:.1}s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// The timeout.
        secs: f64,
    },
    /// An actor could not be reached (it stopped, or the actor system is shutting down).
    #[error("actor {actor} is gone")]
    ActorGone {
        /// Which actor.
        actor: &'static str,
    },
    /// The DataNode is stopping.
    #[error("the DataNode is shutting down")]
    ShuttingDown,
    /// A failpoint fired (tests only).
    #[error("failpoint {name} fired")]
    Failpoint {
        /// The failpoint.
        name: &'static str,
        /// Close the connections without answering (else: answer with an error status).
        drop: bool,
    },
}

impl DatanodeError {
    /// An [`DatanodeError::Io`] for `op` on `path`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DatanodeError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// An [`DatanodeError::Invalid`].
    pub fn invalid(reason: impl Into<String>) -> Self {
        DatanodeError::Invalid {
            reason: reason.into(),
        }
    }

    /// The wire status that reports this error.
    pub fn status(&self) -> Status {
        match self {
            DatanodeError::Io { source, .. } if is_no_space(source) => Status::ErrorNoSpace,
            DatanodeError::Io { .. } | DatanodeError::CorruptMeta { .. } => Status::ErrorIo,
            DatanodeError::ReplicaNotFound { .. } => Status::ErrorNotFound,
            DatanodeError::StaleGenStamp { .. } => Status::ErrorStaleGenStamp,
            DatanodeError::OutOfRange { .. } => Status::ErrorOutOfRange,
            DatanodeError::ReplicaExists { .. } => Status::ErrorExists,
            DatanodeError::InvalidReplica { .. } | DatanodeError::Invalid { .. } => {
                Status::ErrorInvalid
            }
            DatanodeError::Checksum { .. } => Status::ErrorChecksum,
            DatanodeError::Frame(FrameError::TooLarge { .. }) => Status::ErrorFrameTooLarge,
            DatanodeError::Frame(FrameError::Io(_)) => Status::Error,
            DatanodeError::Frame(_) => Status::ErrorBadFrame,
            DatanodeError::NoSpace => Status::ErrorNoSpace,
            DatanodeError::Config(_)
            | DatanodeError::NodeIdMismatch { .. }
            | DatanodeError::BadVersionFile { .. }
            | DatanodeError::Bind { .. }
            | DatanodeError::Downstream { .. }
            | DatanodeError::Timeout { .. }
            | DatanodeError::ActorGone { .. }
            | DatanodeError::ShuttingDown
            | DatanodeError::Failpoint { .. } => Status::Error,
        }
    }
}

fn is_no_space(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC)
}

/// Result alias of the crate.
pub type Result<T> = std::result::Result<T, DatanodeError>;

/// Extension to attach an operation and a path to an `io::Result`.
pub(crate) trait IoContext<T> {
    /// Maps the error to [`DatanodeError::Io`].
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| DatanodeError::io(op, path, e))
    }
}
