//! Data-transfer messages: the headers carried in [`crate::frame`] frames between clients and
//! DataNodes and between DataNodes. See `docs/protocol.md` for the conversations they form.
//!
//! A connection opens with an [`Message::Op`] carrying [`PROTOCOL_VERSION`]. The receiver
//! answers with an [`Message::OpResponse`]; then, depending on the op:
//!
//! - `WriteBlock`: the writer sends [`Message::Packet`]s (payload: checksums then data); the
//!   DataNode sends one [`Message::Ack`] per packet, in order.
//! - `ReadBlock`: the DataNode sends [`Message::Chunk`]s (payload: checksums then data) for the
//!   whole range, then [`Message::ReadEnd`].
//! - `ReadChunk`: the DataNode sends one [`Message::Chunk`]; the connection then takes the next op.
//! - `TransferBlock`, `ReplicaInfo`, `InitReplicaRecovery`, `UpdateReplicaUnderRecovery`: the
//!   `OpResponse` is the whole answer.

use crate::ids::{BlockId, DatanodeId, ExtendedBlock, GenerationStamp};
use crate::status::Status;
use crate::token::BlockToken;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The data-transfer protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// The sequence number of a heartbeat packet: no data, sent while a pipeline is idle.
pub const HEARTBEAT_SEQNO: i64 = -1;

/// The most a pipeline's ack timeout grows per DataNode further down (HDFS's
/// `READ_TIMEOUT_EXTENSION`).
pub const ACK_TIMEOUT_EXTENSION: Duration = Duration::from_secs(5);

/// How long a writer waits for an ack that must travel through `downstream` DataNodes: the
/// socket timeout plus, per DataNode, [`ACK_TIMEOUT_EXTENSION`] (or a quarter of the socket
/// timeout when that is shorter, so that tests with short timeouts keep the same shape).
///
/// As in HDFS (`socketTimeout + READ_TIMEOUT_EXTENSION * targets`), each hop upstream waits
/// longer than the one below it, so when a DataNode stalls, the DataNode just above it is the
/// first to give up and names it in its ack; the nodes above, and the client, then see that
/// ack instead of timing out themselves and blaming the wrong node.
///
/// The extension stops growing past [`ACK_TIMEOUT_MAX_EXTENSIONS`] DataNodes: a set-up naming
/// `replication.max` (512) targets must not hold a connection for most of an hour (20,000
/// targets once meant 28 hours). Pipelines the metadata service builds are far shorter.
pub fn ack_timeout(socket_timeout: Duration, downstream: usize) -> Duration {
    let step = ACK_TIMEOUT_EXTENSION.min(socket_timeout / 4);
    let hops = downstream.min(ACK_TIMEOUT_MAX_EXTENSIONS) as u32;
    socket_timeout.saturating_add(step.saturating_mul(hops))
}

/// The most DataNodes further down that extend [`ack_timeout`] (the metadata service's own
/// `replication.max` default): with the default 60 s socket timeout no wait exceeds 140 s.
pub const ACK_TIMEOUT_MAX_EXTENSIONS: usize = 16;

/// Every header that travels in a data-transfer frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Opens a conversation.
    Op {
        /// The sender's [`PROTOCOL_VERSION`].
        version: u16,
        /// What is asked.
        op: Op,
        /// The block access token allowing it (`None` where tokens are off).
        token: Option<BlockToken>,
    },
    /// A write packet (upstream to downstream). Payload: checksums, then `data_len` bytes.
    Packet(PacketHeader),
    /// The answer to an op (downstream to upstream).
    OpResponse(OpResponse),
    /// The pipeline's answer to one packet (downstream to upstream).
    Ack(PipelineAck),
    /// A piece of a block being read. Payload: checksums, then `data_len` bytes.
    Chunk(ChunkHeader),
    /// The end of a `ReadBlock` stream.
    ReadEnd(ReadEnd),
}

/// The operations a DataNode serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Set up (or rebuild) a write pipeline through this DataNode.
    WriteBlock(WriteBlockOp),
    /// Stream a range of a replica in one request (Ozone-style streaming read).
    ReadBlock(ReadBlockOp),
    /// Read one chunk of a replica (the classic one-request-per-chunk read).
    ReadChunk(ReadChunkOp),
    /// Copy this DataNode's replica to other DataNodes (pipeline repair, re-replication).
    TransferBlock(TransferBlockOp),
    /// Report this DataNode's replica: state, generation stamp, visible length.
    ReplicaInfo(ReplicaInfoOp),
    /// Block recovery, first step (sent by the recovery's primary DataNode to every location):
    /// stop any writer of the replica, put it under recovery (Rur) and report it.
    InitReplicaRecovery(InitReplicaRecoveryOp),
    /// Block recovery, second step: truncate the replica under recovery to the agreed length,
    /// give it the recovery id as generation stamp, and finalize it.
    UpdateReplicaUnderRecovery(UpdateReplicaOp),
}

/// Why a pipeline is being set up (HDFS's `BlockConstructionStage`, reduced to what Sluice uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockStage {
    /// A brand-new replica. The only stage whose replica may use the write-memory buffer.
    Create,
    /// Rebuilding a pipeline in the middle of a block: the replica continues at its acked length
    /// under a new generation stamp.
    StreamingRecovery,
    /// Rebuilding a pipeline while closing the block: finalize under the new generation stamp.
    CloseRecovery,
    /// Receiving a copy of a replica still being written (pipeline repair).
    TransferRbw,
    /// Receiving a copy of a finalized replica (re-replication).
    TransferFinalized,
    /// Appending to a finalized replica (HDFS `PIPELINE_SETUP_APPEND`, and its retry
    /// `PIPELINE_SETUP_APPEND_RECOVERY`): the replica, finalized at `block.num_bytes` under
    /// `block`'s generation stamp (or already reopened by an earlier attempt under a stamp up
    /// to the new one), goes back to being written under the new stamp. Packets continue at
    /// its length; a partial last chunk is re-sent whole, so that its checksum is rewritten.
    Append,
}

impl BlockStage {
    /// True for the stages that rebuild an existing replica under a new generation stamp.
    pub fn is_recovery(self) -> bool {
        matches!(
            self,
            BlockStage::StreamingRecovery | BlockStage::CloseRecovery
        )
    }

    /// True for the stages that receive a copy from another DataNode.
    pub fn is_transfer(self) -> bool {
        matches!(
            self,
            BlockStage::TransferRbw | BlockStage::TransferFinalized
        )
    }
}

/// Set up a write pipeline. The receiver connects to `targets[0]` (passing `targets[1..]`) before
/// it answers, so the answer covers the whole rest of the pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteBlockOp {
    /// The block. For `Create` its generation stamp is the new one and `num_bytes` is 0. For
    /// recovery it is the replica as the DataNodes hold it (old generation stamp) and `num_bytes`
    /// is the length acknowledged to the writer.
    pub block: ExtendedBlock,
    /// Why.
    pub stage: BlockStage,
    /// The DataNodes after the receiver, in pipeline order (empty: the receiver is last).
    pub targets: Vec<DatanodeId>,
    /// The writing client's name (a DataNode's id for transfers).
    pub client_name: String,
    /// Bytes per checksum chunk of this block.
    pub bytes_per_checksum: u32,
    /// The generation stamp the replica has once this pipeline is set up.
    pub latest_gen_stamp: GenerationStamp,
}

/// One write packet. Its data starts at `offset_in_block`, which is always a multiple of
/// `bytes_per_checksum`: after an hflush that ended inside a chunk, the next packet starts again
/// at that chunk's start and carries the chunk's bytes again, so that every checksum covers one
/// aligned chunk. The receiver writes only what is new and rewrites the last chunk's checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PacketHeader {
    /// Consecutive from 0 within one pipeline; [`HEARTBEAT_SEQNO`] for heartbeats.
    pub seqno: i64,
    /// Block offset of the first data byte.
    pub offset_in_block: u64,
    /// Data bytes in the payload (after the checksums).
    pub data_len: u32,
    /// The last packet of the block: it carries no data; the replica is finalized.
    pub last: bool,
    /// Make everything up to this packet durable (fsync) before acknowledging it (hsync).
    pub sync: bool,
}

/// An ack: the status of one packet at each DataNode, the first entry being the sender's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineAck {
    /// The packet's sequence number.
    pub seqno: i64,
    /// One status per DataNode from the sender to the end of the pipeline: `replies[i]` is the
    /// i-th DataNode counting from the sender. A DataNode whose downstream connection failed (or
    /// did not ack within the socket timeout) sends `[own status, Error]`: the `Error` names its
    /// immediate downstream as the bad node.
    pub replies: Vec<Status>,
}

impl PipelineAck {
    /// Index of the first DataNode that did not succeed, if any.
    pub fn first_failure(&self) -> Option<usize> {
        self.replies.iter().position(|s| !s.is_success())
    }
}

/// The answer to an op.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpResponse {
    /// The outcome.
    pub status: Status,
    /// A human-readable explanation when `status` is an error.
    pub message: String,
    /// For `WriteBlock`: the data address of the first downstream DataNode that could not be
    /// reached or refused the set-up, so that the writer can exclude it.
    pub first_bad_link: Option<String>,
    /// The replica as the DataNode holds it (reads, `ReplicaInfo`, transfers).
    pub replica: Option<ReplicaInfo>,
}

impl OpResponse {
    /// A success with no replica information.
    pub fn ok() -> Self {
        Self {
            status: Status::Success,
            message: String::new(),
            first_bad_link: None,
            replica: None,
        }
    }

    /// A failure.
    pub fn error(status: Status, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            first_bad_link: None,
            replica: None,
        }
    }
}

/// A replica's state on a DataNode (HDFS's replica states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplicaState {
    /// Complete and immutable; under `finalized/`.
    Finalized,
    /// Being written by a live pipeline; under `rbw/`.
    Rbw,
    /// Was being written when the DataNode restarted; waiting for recovery; under `rbw/`.
    Rwr,
    /// Under block recovery.
    Rur,
    /// A copy being received from another DataNode; invisible to readers and reports.
    Temporary,
}

/// What a DataNode knows of one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    /// Id, generation stamp, and the visible length: bytes a reader may read (acknowledged
    /// bytes that are in the block file).
    pub block: ExtendedBlock,
    /// The state.
    pub state: ReplicaState,
    /// Bytes in the block file (may exceed the visible length while a pipeline runs).
    pub bytes_on_disk: u64,
}

/// Stream `[offset, offset + length)` of a replica. The DataNode starts at the checksum chunk
/// holding `offset` and sends pieces of `piece_size` bytes (0: its default, 1 MiB), each aligned
/// to chunk boundaries, clamped to the replica's visible length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadBlockOp {
    /// The block; its generation stamp must be the replica's (`ERROR_STALE_GENSTAMP`
    /// otherwise).
    pub block: ExtendedBlock,
    /// First byte wanted.
    pub offset: u64,
    /// Bytes wanted (clamped to the replica's visible length).
    pub length: u64,
    /// Data bytes per piece, 0 for the DataNode's default.
    pub piece_size: u32,
}

/// Read one chunk `[offset, offset + length)` of a replica; answered by one [`Message::Chunk`]
/// starting at the checksum chunk that holds `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadChunkOp {
    /// The block; its generation stamp must be the replica's.
    pub block: ExtendedBlock,
    /// First byte wanted.
    pub offset: u64,
    /// Bytes wanted.
    pub length: u64,
}

/// A piece of a replica. `offset` is a multiple of the block's bytes per checksum. Every
/// piece names the block and the generation stamp of the replica it was read from, so that a
/// reader checks each one against the stamp the metadata service gave it, mid-stream included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkHeader {
    /// The block the bytes belong to.
    pub block: BlockId,
    /// The generation stamp of the replica the bytes were read from.
    pub gen_stamp: GenerationStamp,
    /// Block offset of the first data byte.
    pub offset: u64,
    /// Data bytes in the payload (after the checksums).
    pub data_len: u32,
    /// Bytes per checksum of the replica.
    pub bytes_per_checksum: u32,
}

/// The end of a `ReadBlock` stream: success, or the error that cut it short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadEnd {
    /// The outcome.
    pub status: Status,
    /// Explanation on error.
    pub message: String,
}

/// Copy `block.num_bytes` bytes of this DataNode's replica to `targets` as a pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferBlockOp {
    /// The block and the length to copy.
    pub block: ExtendedBlock,
    /// Where to copy it, in pipeline order.
    pub targets: Vec<DatanodeId>,
    /// `TransferRbw` (a replica being written) or `TransferFinalized`.
    pub stage: BlockStage,
    /// Who asked (a client name, or the metadata service's command).
    pub client_name: String,
}

/// Ask a DataNode about its replica of `block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaInfoOp {
    /// The block (its generation stamp and length are ignored).
    pub block: ExtendedBlock,
}

/// Put a replica under recovery (HDFS `initReplicaRecovery`). The answer's `replica` is the
/// replica as it was before: its generation stamp, its length (bytes on disk for a replica being
/// written, the final length of a finalized one) and its **original** state (never `Rur`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitReplicaRecoveryOp {
    /// The block as the metadata service knows it: id and generation stamp (a replica with an
    /// older one is refused as stale); the length is ignored.
    pub block: ExtendedBlock,
    /// The recovery id: a generation stamp newer than the replica's.
    pub recovery_id: GenerationStamp,
}

/// Finish the recovery of a replica (HDFS `updateReplicaUnderRecovery`): the replica must be
/// under recovery with `recovery_id`; it is truncated to `new_length` (a finalized one must
/// already have it), takes `recovery_id` as generation stamp and is finalized. The answer's
/// `replica` is the finalized replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateReplicaOp {
    /// The block: id and the replica's generation stamp as `InitReplicaRecovery` reported it.
    pub block: ExtendedBlock,
    /// The recovery id the replica was put under recovery with.
    pub recovery_id: GenerationStamp,
    /// The agreed length.
    pub new_length: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_grows_per_downstream_node() {
        let t = Duration::from_secs(60);
        assert_eq!(ack_timeout(t, 0), t);
        assert_eq!(ack_timeout(t, 2), Duration::from_secs(70));
        // Short timeouts (tests) grow by a quarter per node.
        let t = Duration::from_secs(2);
        assert_eq!(ack_timeout(t, 3), Duration::from_millis(3500));
        assert!(ack_timeout(t, usize::MAX) >= t);
        // Capped: a hostile set-up naming hundreds of targets waits no longer than 16 hops.
        let t = Duration::from_secs(60);
        assert_eq!(ack_timeout(t, 16), Duration::from_secs(140));
        assert_eq!(ack_timeout(t, 512), Duration::from_secs(140));
        assert_eq!(ack_timeout(t, usize::MAX), Duration::from_secs(140));
    }
}
