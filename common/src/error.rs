//! Typed errors shared by the crates: frame decoding, checksums, and the metadata service's
//! errors as they travel over RPC (structured variants, never bare strings).

use crate::ids::{BlockId, GenerationStamp, NodeId};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A checksum failure. Offsets are positions in the block.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum ChecksumError {
    /// The CRC of the chunk at `offset` does not match.
    #[error("checksum mismatch in the chunk at block offset {offset}: expected {expected:#010x}, computed {actual:#010x}")]
    Mismatch {
        /// Block offset of the bad chunk.
        offset: u64,
        /// Checksum that came with the data.
        expected: u32,
        /// Checksum computed from the data.
        actual: u32,
    },
    /// The checksum bytes do not cover the data.
    #[error("checksum length at block offset {offset}: expected {expected} bytes, got {actual}")]
    Length {
        /// Block offset of the data.
        offset: u64,
        /// Checksum bytes the data needs.
        expected: usize,
        /// Checksum bytes that came.
        actual: usize,
    },
}

/// A data-transfer frame that could not be read or written.
#[derive(Debug, Error)]
pub enum FrameError {
    /// The socket failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A frame announced more bytes than the configured maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// Announced length.
        len: u64,
        /// Configured maximum.
        max: u64,
    },
    /// The frame's header length does not fit inside the frame.
    #[error("header length {header_len} does not fit in a frame of {frame_len} bytes")]
    BadHeaderLength {
        /// Announced header length.
        header_len: u64,
        /// Frame length.
        frame_len: u64,
    },
    /// The header did not decode.
    #[error("malformed frame header: {0}")]
    BadHeader(String),
    /// The header could not be encoded.
    #[error("cannot encode frame header: {0}")]
    Encode(String),
    /// The peer closed the connection in the middle of a frame.
    #[error("connection closed in the middle of a frame ({buffered} bytes buffered)")]
    Truncated {
        /// Bytes of the partial frame that had arrived.
        buffered: usize,
    },
}

/// Errors of the metadata service, as the client and DataNodes receive them over RPC.
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum MetaError {
    /// No file or directory at the path.
    #[error("no such file or directory: {path}")]
    NotFound {
        /// The path.
        path: String,
    },
    /// Something already exists at the path.
    #[error("already exists: {path}")]
    AlreadyExists {
        /// The path.
        path: String,
    },
    /// A directory was expected.
    #[error("not a directory: {path}")]
    NotADirectory {
        /// The path.
        path: String,
    },
    /// A file was expected.
    #[error("is a directory: {path}")]
    IsADirectory {
        /// The path.
        path: String,
    },
    /// A non-recursive delete of a non-empty directory.
    #[error("directory is not empty: {path}")]
    DirectoryNotEmpty {
        /// The path.
        path: String,
    },
    /// The path is not absolute, has empty or `.`/`..` components, or is too long.
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Another client holds the write lease.
    #[error("{path} is being created by another writer ({holder})")]
    LeaseConflict {
        /// The path.
        path: String,
        /// The current lease holder.
        holder: String,
    },
    /// The caller does not hold the file's lease (it expired, or the file was recovered).
    #[error("lease mismatch on {path}: {client} does not hold the lease")]
    NotLeaseHolder {
        /// The path.
        path: String,
        /// The caller.
        client: String,
    },
    /// The file is not open for writing.
    #[error("{path} is not under construction")]
    NotUnderConstruction {
        /// The path.
        path: String,
    },
    /// The metadata service does not know the block.
    #[error("unknown block {block}")]
    UnknownBlock {
        /// The block.
        block: BlockId,
    },
    /// A request named a generation stamp that is not the block's current one.
    #[error("block {block}: generation stamp {given} does not match the current {current}")]
    GenerationStampMismatch {
        /// The block.
        block: BlockId,
        /// What the caller sent.
        given: GenerationStamp,
        /// What the metadata service has.
        current: GenerationStamp,
    },
    /// Placement could not find enough DataNodes.
    #[error(
        "could only place {available} of {needed} replicas: not enough live DataNodes with room"
    )]
    NotEnoughDatanodes {
        /// Replicas asked for.
        needed: u32,
        /// Replicas that could be placed.
        available: u32,
    },
    /// The DataNode is not registered (or was forgotten): it must register again.
    #[error("DataNode {node} is not registered")]
    UnknownDatanode {
        /// The DataNode.
        node: NodeId,
    },
    /// The previous block of the file has not reached its minimum replication yet; retry.
    #[error("block {block} is not yet replicated enough; retry")]
    NotReplicatedYet {
        /// The block.
        block: BlockId,
    },
    /// A request argument is out of range.
    #[error("invalid argument {name}: {reason}")]
    InvalidArgument {
        /// The argument.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The metadata store failed; the change was not made.
    #[error("metadata store error: {message}")]
    Storage {
        /// What the store said.
        message: String,
    },
}

impl MetaError {
    /// A [`MetaError::InvalidArgument`].
    pub fn invalid_argument(name: impl Into<String>, reason: impl Into<String>) -> Self {
        MetaError::InvalidArgument {
            name: name.into(),
            reason: reason.into(),
        }
    }
}
