//! The client's one error type: metadata errors (matchable as [`ClientError::Meta`]), RPC
//! transport failures, DataNode failures naming the node, checksum errors naming the block,
//! offset and DataNode, timeouts and configuration errors.
//!
//! `ClientError` is `Clone` (I/O sources are kept behind an `Arc`) because a writer's first
//! error is reported again by every later `write`, `hflush` and `close`.

use sluice_common::config::ConfigError;
use sluice_common::proto::BlockStage;
use sluice_common::{
    BlockId, ChecksumError, DatanodeId, FrameError, GenerationStamp, MetaError, Status,
};
use std::io;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// Everything that can go wrong in the client.
#[derive(Debug, Clone, Error)]
pub enum ClientError {
    /// The metadata service refused the request.
    #[error("{0}")]
    Meta(#[from] MetaError),
    /// A metadata RPC failed in transport (connection lost, deadline exceeded).
    #[error("metadata RPC {call} failed: {message}")]
    Rpc {
        /// The RPC.
        call: &'static str,
        /// What tarpc reported.
        message: String,
    },
    /// The metadata service could not be reached.
    #[error("cannot connect to the metadata service at {addr}: {source}")]
    Connect {
        /// The configured address.
        addr: String,
        /// The socket error.
        #[source]
        source: Arc<io::Error>,
    },
    /// A socket to a DataNode failed (connect, read or write).
    #[error("DataNode {node}: {what}: {source}")]
    DatanodeIo {
        /// The DataNode (`id@addr`).
        node: String,
        /// What was being done.
        what: &'static str,
        /// The socket error.
        #[source]
        source: Arc<io::Error>,
    },
    /// A DataNode sent a frame that could not be decoded.
    #[error("DataNode {node}: bad frame: {source}")]
    Frame {
        /// The DataNode.
        node: String,
        /// The codec error.
        #[source]
        source: Arc<FrameError>,
    },
    /// A DataNode answered with an error status.
    #[error("DataNode {node} answered {status} for {block}: {message}")]
    Datanode {
        /// The DataNode.
        node: String,
        /// The block.
        block: BlockId,
        /// The wire status.
        status: Status,
        /// The DataNode's explanation.
        message: String,
    },
    /// A DataNode closed the connection when more was expected.
    #[error("DataNode {node} closed the connection while the client waited for {what}")]
    Closed {
        /// The DataNode.
        node: String,
        /// What was awaited.
        what: &'static str,
    },
    /// A DataNode broke the protocol (unexpected message, offsets out of order).
    #[error("DataNode {node} broke the protocol: {reason}")]
    Protocol {
        /// The DataNode.
        node: String,
        /// What was wrong.
        reason: String,
    },
    /// Data read from a DataNode did not match its checksums.
    #[error("checksum error in {block} at offset {offset} from DataNode {node}: {source}")]
    Checksum {
        /// The block.
        block: BlockId,
        /// Block offset of the bad chunk.
        offset: u64,
        /// The DataNode that served it.
        node: String,
        /// The mismatch.
        #[source]
        source: ChecksumError,
    },
    /// A DataNode did not answer within the socket timeout.
    #[error("timed out after {after:?} waiting for {what} from DataNode {node}")]
    Timeout {
        /// The DataNode.
        node: String,
        /// What was awaited.
        what: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// A write pipeline failed at a DataNode: [`PipelineFailure::node`] is the one blamed
    /// (HDFS's bad node index), the variant says how.
    #[error("write pipeline for {block} failed: {failure}")]
    Pipeline {
        /// The block being written.
        block: BlockId,
        /// What failed, and where.
        failure: Box<PipelineFailure>,
    },
    /// No pipeline could be set up for a new block.
    #[error("could not set up a pipeline for a new block of {path} after {attempts} attempts (DataNodes tried: {}): {last}", list(tried))]
    PipelineSetup {
        /// The file.
        path: String,
        /// Attempts made.
        attempts: u32,
        /// DataNodes excluded along the way, blamed by the failed set-ups.
        tried: Vec<DatanodeId>,
        /// The last failure: a [`ClientError::Pipeline`] set-up failure, or the metadata
        /// service's refusal to place the block once the failed DataNodes were excluded.
        last: Box<ClientError>,
    },
    /// `complete` did not succeed before its deadline (the last block was not reported).
    #[error("could not complete {path} within {after:?}: the last block is not yet reported by the DataNodes")]
    CompleteTimeout {
        /// The file.
        path: String,
        /// How long the client tried.
        after: Duration,
    },
    /// None of a block's DataNodes could say how long its replica is (file under construction).
    #[error("cannot obtain the visible length of {block} of a file under construction: {reason}")]
    BlockLength {
        /// The block.
        block: BlockId,
        /// Why.
        reason: String,
    },
    /// A replica's visible length ends before the offset wanted (it may still be receiving
    /// data, or it buffers acknowledged bytes in memory).
    #[error("the replica of {block} on DataNode {node} ends at {visible} bytes; offset {wanted} was wanted")]
    ShortReplica {
        /// The block.
        block: BlockId,
        /// The DataNode.
        node: String,
        /// Its visible length.
        visible: u64,
        /// The block offset wanted.
        wanted: u64,
    },
    /// A DataNode's replica does not carry the generation stamp the metadata service gave the
    /// reader: the DataNode refused the read (`served: false`, HDFS-style exact-stamp rule), or
    /// it answered with a stamp other than the one asked for (`served: true`: a faulty or
    /// hostile DataNode; the bytes are dropped). The reader goes on with another replica, and
    /// asks the metadata service again when the replica's stamp is newer than its own.
    #[error(
        "DataNode {node} {} {block} with generation stamp {found}; the metadata service gave {expected}",
        if *served { "answered a read of" } else { "holds" }
    )]
    GenStampMismatch {
        /// The DataNode.
        node: String,
        /// The block.
        block: BlockId,
        /// The stamp the reader asked for (from the metadata service).
        expected: GenerationStamp,
        /// The stamp the DataNode named.
        found: GenerationStamp,
        /// True when the DataNode sent an answer naming `found` instead of refusing.
        served: bool,
    },
    /// A block has no replica left to read from.
    #[error("no readable replica of {block} holds offset {offset}")]
    NoReplica {
        /// The block.
        block: BlockId,
        /// The block offset wanted.
        offset: u64,
    },
    /// A seek outside the file.
    #[error("seek to {pos} is outside the file ({len} bytes)")]
    SeekOutOfRange {
        /// The position asked for (may be negative).
        pos: i128,
        /// The file length.
        len: u64,
    },
    /// The writer is closed (or failed and was closed).
    #[error("the writer of {path} is closed")]
    WriterClosed {
        /// The file.
        path: String,
    },
    /// The configuration is invalid.
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// An argument is invalid.
    #[error("invalid argument {name}: {reason}")]
    InvalidArgument {
        /// The argument.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Pipeline recovery ran out of DataNodes: every DataNode of the block's pipeline failed
    /// (HDFS "All datanodes [...] are bad. Aborting..."). Nothing past the last acknowledged
    /// byte is claimed.
    #[error(
        "all DataNodes of the write pipeline for {block} are bad ({}); last failure: {last}",
        list(nodes)
    )]
    AllDatanodesBad {
        /// The block being written.
        block: BlockId,
        /// Every DataNode taken out of the block's pipeline, in the order they failed.
        nodes: Vec<DatanodeId>,
        /// The last failure.
        last: Box<PipelineFailure>,
    },
    /// The same packet failed pipeline recovery too many times without any packet being
    /// acknowledged in between (HDFS "Tried pipeline recovery 5 times without success").
    #[error("failing the write of {block}: tried pipeline recovery {attempts} times without success; last failure: {last}")]
    RecoveryLimit {
        /// The block being written.
        block: BlockId,
        /// Recoveries tried for the packet.
        attempts: u32,
        /// The last failure (it names the DataNode blamed).
        last: Box<PipelineFailure>,
    },
    /// The replace-DataNode-on-failure policy asked for a replacement and none could be added
    /// (HDFS "Failed to replace a bad datanode on the existing pipeline due to no more good
    /// datanodes being available to try"). With `best-effort` the write goes on instead.
    #[error("failed to replace a bad DataNode on the write pipeline for {block} (policy {policy}, {survivors} DataNodes left): {reason}")]
    ReplaceDatanode {
        /// The block being written.
        block: BlockId,
        /// The policy that asked for the replacement.
        policy: String,
        /// DataNodes left in the pipeline.
        survivors: usize,
        /// Why no replacement was added.
        reason: Box<ReplaceFailure>,
    },
}

/// How a write pipeline failed, naming the DataNode blamed ([`PipelineFailure::node`]): the one
/// taken out of the pipeline (recovery) or excluded (set-up of a new block).
#[derive(Debug, Clone, Error)]
pub enum PipelineFailure {
    /// A DataNode's slot in an ack carries an error status (the first non-`SUCCESS` reply).
    #[error("DataNode {node} reported {status} in the ack for seqno {seqno}")]
    ErrorAck {
        /// The DataNode whose reply is not `SUCCESS`.
        node: DatanodeId,
        /// The acknowledged packet.
        seqno: i64,
        /// Its status.
        status: Status,
    },
    /// An ack has fewer replies than the pipeline has DataNodes; the first missing one is
    /// blamed.
    #[error("the ack for seqno {seqno} has {replies} replies for a pipeline of {pipeline}: none from DataNode {node}")]
    ShortAck {
        /// The first DataNode without a reply.
        node: DatanodeId,
        /// The acknowledged packet.
        seqno: i64,
        /// Replies in the ack.
        replies: usize,
        /// DataNodes in the pipeline.
        pipeline: usize,
    },
    /// The first DataNode broke the ack protocol (an unexpected message or seqno).
    #[error("DataNode {node} broke the ack protocol: {reason}")]
    AckProtocol {
        /// The first DataNode.
        node: DatanodeId,
        /// What was wrong.
        reason: String,
    },
    /// No ack arrived within the ack timeout.
    #[error("no ack from DataNode {node} within {after:?}")]
    AckTimeout {
        /// The first DataNode.
        node: DatanodeId,
        /// The timeout.
        after: Duration,
    },
    /// The connection to the first DataNode failed: a send or read failed, or it closed.
    #[error("the connection to DataNode {node} failed: {error}")]
    Connection {
        /// The first DataNode.
        node: DatanodeId,
        /// The socket or frame error.
        error: Box<ClientError>,
    },
    /// Setting the pipeline up failed. `node` is the `first_bad_link` the first DataNode
    /// named when it is one of the pipeline's DataNodes, else the first DataNode.
    #[error("pipeline set-up ({stage:?}) failed at DataNode {node}: {error}")]
    Setup {
        /// The DataNode blamed.
        node: DatanodeId,
        /// The stage set up.
        stage: BlockStage,
        /// The first DataNode's answer ([`ClientError::Datanode`] with its status) or the
        /// connection's failure.
        error: Box<ClientError>,
    },
}

impl PipelineFailure {
    /// The DataNode blamed.
    pub fn node(&self) -> &DatanodeId {
        match self {
            PipelineFailure::ErrorAck { node, .. }
            | PipelineFailure::ShortAck { node, .. }
            | PipelineFailure::AckProtocol { node, .. }
            | PipelineFailure::AckTimeout { node, .. }
            | PipelineFailure::Connection { node, .. }
            | PipelineFailure::Setup { node, .. } => node,
        }
    }

    /// The status a DataNode answered, when the failure is one.
    pub fn status(&self) -> Option<Status> {
        match self {
            PipelineFailure::ErrorAck { status, .. } => Some(*status),
            PipelineFailure::Setup { error, .. } => match error.as_ref() {
                ClientError::Datanode { status, .. } => Some(*status),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Why no replacement DataNode could be added to a pipeline (HDFS
/// `addDatanode2ExistingPipeline`), with the copies that failed along the way.
#[derive(Debug, Clone, Error)]
pub enum ReplaceFailure {
    /// The metadata service has no more good DataNodes to offer.
    #[error(
        "no more good DataNodes available to try ({error}){}",
        copies_text(copies)
    )]
    NoMoreDatanodes {
        /// Its refusal (`NotEnoughDatanodes`).
        error: MetaError,
        /// Copies to earlier candidates that failed.
        copies: Vec<CopyFailure>,
    },
    /// The metadata service answered with no DataNode.
    #[error("the metadata service offered no DataNode{}", copies_text(copies))]
    NoneOffered {
        /// Copies to earlier candidates that failed.
        copies: Vec<CopyFailure>,
    },
    /// Copying the replica to every candidate tried failed.
    #[error("every copy to a replacement failed{}", copies_text(copies))]
    CopiesFailed {
        /// The copies, in order.
        copies: Vec<CopyFailure>,
    },
}

/// A failed copy of the acknowledged replica to a candidate replacement (`TransferRbw`).
#[derive(Debug, Clone, Error)]
#[error("copy from {from} to {to} failed: {error}")]
pub struct CopyFailure {
    /// The surviving DataNode asked to copy.
    pub from: DatanodeId,
    /// The candidate (excluded afterwards).
    pub to: DatanodeId,
    /// What failed.
    pub error: Box<ClientError>,
}

fn list(nodes: &[DatanodeId]) -> String {
    nodes
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn copies_text(copies: &[CopyFailure]) -> String {
    copies.iter().map(|c| format!("; {c}")).collect()
}

impl From<ConfigError> for ClientError {
    fn from(e: ConfigError) -> Self {
        ClientError::Config(e.to_string())
    }
}

impl ClientError {
    /// A [`ClientError::DatanodeIo`].
    pub(crate) fn dn_io(node: &str, what: &'static str, e: io::Error) -> Self {
        ClientError::DatanodeIo {
            node: node.to_string(),
            what,
            source: Arc::new(e),
        }
    }

    /// A [`ClientError::Protocol`].
    pub(crate) fn protocol(node: &str, reason: impl Into<String>) -> Self {
        ClientError::Protocol {
            node: node.to_string(),
            reason: reason.into(),
        }
    }

    /// True when the error says the metadata service refused the request (as opposed to a
    /// transport or DataNode failure).
    pub fn is_meta(&self) -> bool {
        matches!(self, ClientError::Meta(_))
    }

    fn io_kind(&self) -> io::ErrorKind {
        use io::ErrorKind as K;
        match self {
            ClientError::Meta(m) => match m {
                MetaError::NotFound { .. } => K::NotFound,
                MetaError::AlreadyExists { .. } => K::AlreadyExists,
                MetaError::InvalidPath { .. } | MetaError::InvalidArgument { .. } => {
                    K::InvalidInput
                }
                MetaError::DirectoryNotEmpty { .. } => K::DirectoryNotEmpty,
                MetaError::NotADirectory { .. } => K::NotADirectory,
                MetaError::IsADirectory { .. } => K::IsADirectory,
                _ => K::Other,
            },
            ClientError::Connect { source, .. } | ClientError::DatanodeIo { source, .. } => {
                source.kind()
            }
            ClientError::Timeout { .. } | ClientError::CompleteTimeout { .. } => K::TimedOut,
            ClientError::Checksum { .. } | ClientError::Frame { .. } => K::InvalidData,
            ClientError::Protocol { .. } => K::InvalidData,
            ClientError::Closed { .. } => K::UnexpectedEof,
            ClientError::SeekOutOfRange { .. } | ClientError::InvalidArgument { .. } => {
                K::InvalidInput
            }
            ClientError::WriterClosed { .. } => K::BrokenPipe,
            ClientError::AllDatanodesBad { .. }
            | ClientError::RecoveryLimit { .. }
            | ClientError::ReplaceDatanode { .. }
            | ClientError::Pipeline { .. }
            | ClientError::PipelineSetup { .. } => K::BrokenPipe,
            _ => K::Other,
        }
    }
}

/// The `AsyncRead`/`AsyncWrite` impls surface the real cause: the `io::Error` wraps the
/// `ClientError` (recover it with `get_ref()` and `downcast_ref::<ClientError>()`).
impl From<ClientError> for io::Error {
    fn from(e: ClientError) -> Self {
        io::Error::new(e.io_kind(), e)
    }
}

/// Turns a tarpc call result into the client's error.
pub(crate) fn rpc_result<T>(
    call: &'static str,
    r: Result<Result<T, MetaError>, tarpc::client::RpcError>,
) -> Result<T, ClientError> {
    match r {
        Ok(inner) => inner.map_err(ClientError::Meta),
        Err(e) => Err(ClientError::Rpc {
            call,
            message: error_chain(&e),
        }),
    }
}

/// An error with its sources, `a: b: c`.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_error_keeps_the_client_error_and_a_fitting_kind() {
        let e = ClientError::Meta(MetaError::NotFound { path: "/x".into() });
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::NotFound);
        let inner = io
            .get_ref()
            .and_then(|r| r.downcast_ref::<ClientError>())
            .unwrap();
        assert!(matches!(
            inner,
            ClientError::Meta(MetaError::NotFound { .. })
        ));
        let c = ClientError::Checksum {
            block: BlockId(7),
            offset: 512,
            node: "dn1@127.0.0.1:1".into(),
            source: ChecksumError::Mismatch {
                offset: 512,
                expected: 1,
                actual: 2,
            },
        };
        let text = c.to_string();
        assert!(text.contains("blk_7") && text.contains("512") && text.contains("dn1"));
        assert_eq!(io::Error::from(c).kind(), io::ErrorKind::InvalidData);
    }
}
