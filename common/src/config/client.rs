//! `[client]`: the client library and the `sluice` command.

use super::units::{ByteSize, HumanDuration};
use super::ConfigError;
use serde::{Deserialize, Serialize};

/// How a block is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadMode {
    /// One `ReadBlock` request for the rest of the block; the DataNode streams it.
    Stream,
    /// One `ReadChunk` request per chunk, each answered before the next is sent.
    Chunk,
}

/// When a failed pipeline DataNode is replaced by a new one (HDFS `ReplaceDatanodeOnFailure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ReplacePolicy {
    /// Replace when replication ≥ 3 and at most half the replicas survive, or after hflush.
    Default,
    /// Always replace.
    Always,
    /// Never replace.
    Never,
}

/// Settings of the client. Every key is documented in `docs/configuration.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// The metadata service's RPC address.
    #[serde(rename = "metadata.address")]
    pub metadata_address: String,
    /// Block size of new files (0: the metadata service's default).
    #[serde(rename = "block.size")]
    pub block_size: ByteSize,
    /// Replication factor of new files (0: the metadata service's default).
    pub replication: u16,
    /// Bytes per checksum chunk.
    #[serde(rename = "bytes.per.checksum")]
    pub bytes_per_checksum: u32,
    /// Data bytes per write packet.
    #[serde(rename = "write.packet.size")]
    pub write_packet_size: ByteSize,
    /// Packets sent and not yet acknowledged, at most.
    #[serde(rename = "write.max.packets.in.flight")]
    pub write_max_packets_in_flight: u32,
    /// Read timeout on DataNode sockets (no ack or data for this long fails the DataNode).
    #[serde(rename = "socket.timeout")]
    pub socket_timeout: HumanDuration,
    /// Deadline of each metadata RPC.
    #[serde(rename = "rpc.timeout")]
    pub rpc_timeout: HumanDuration,
    /// A metadata connection unused for this long is replaced by a new one before the next call
    /// (HDFS `ipc.client.connection.maxidletime`), so that a call never goes out on a
    /// connection the service is closing for its `rpc.idle.timeout` (keep it shorter).
    #[serde(rename = "rpc.connection.max-idle")]
    pub rpc_connection_max_idle: HumanDuration,
    /// Times a new block's pipeline set-up is retried elsewhere before the write fails.
    #[serde(rename = "block.write.retries")]
    pub block_write_retries: u32,
    /// How long a DataNode that failed a new block's set-up stays excluded from the writer's
    /// later blocks (HDFS `dfs.client.write.exclude.nodes.cache.expiry.interval.millis`);
    /// 0 excludes it for the failing block only.
    #[serde(rename = "write.exclude.nodes.cache.expiry")]
    pub exclude_nodes_expiry: HumanDuration,
    /// Replace failed pipeline DataNodes at all.
    #[serde(rename = "write.replace-datanode-on-failure.enable")]
    pub replace_enable: bool,
    /// When to replace a failed pipeline DataNode.
    #[serde(rename = "write.replace-datanode-on-failure.policy")]
    pub replace_policy: ReplacePolicy,
    /// Keep writing with fewer DataNodes when a replacement cannot be found.
    #[serde(rename = "write.replace-datanode-on-failure.best-effort")]
    pub replace_best_effort: bool,
    /// Read mode.
    #[serde(rename = "read.mode")]
    pub read_mode: ReadMode,
    /// Bytes per request in chunk mode (Ozone's 4 MB chunk).
    #[serde(rename = "read.chunk.size")]
    pub read_chunk_size: ByteSize,
    /// Streamed bytes kept ahead of the reader, per stream.
    #[serde(rename = "read.buffer.bytes")]
    pub read_buffer_bytes: ByteSize,
    /// Data bytes per piece asked of the DataNode in stream mode.
    #[serde(rename = "read.piece.bytes")]
    pub read_piece_bytes: ByteSize,
    /// Verify checksums of data read.
    #[serde(rename = "read.verify.checksum")]
    pub read_verify_checksum: bool,
    /// Largest data-transfer frame accepted.
    #[serde(rename = "max.frame.bytes")]
    pub max_frame_bytes: ByteSize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            metadata_address: "127.0.0.1:8020".into(),
            block_size: ByteSize(0),
            replication: 0,
            bytes_per_checksum: 512,
            write_packet_size: ByteSize::kib(256),
            write_max_packets_in_flight: 20,
            socket_timeout: HumanDuration::secs(60),
            rpc_timeout: HumanDuration::secs(30),
            rpc_connection_max_idle: HumanDuration::secs(10),
            block_write_retries: 3,
            exclude_nodes_expiry: HumanDuration::secs(600),
            replace_enable: true,
            replace_policy: ReplacePolicy::Default,
            replace_best_effort: false,
            read_mode: ReadMode::Stream,
            read_chunk_size: ByteSize::mib(4),
            read_buffer_bytes: ByteSize::mib(32),
            read_piece_bytes: ByteSize::mib(1),
            read_verify_checksum: true,
            max_frame_bytes: ByteSize::mib(16),
        }
    }
}

impl ClientConfig {
    /// Checks ranges and relations between keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bpc = self.bytes_per_checksum as u64;
        if bpc == 0 || bpc > 1024 * 1024 {
            return Err(ConfigError::invalid(
                "client.bytes.per.checksum",
                self.bytes_per_checksum,
                "must be between 1 and 1048576",
            ));
        }
        let packet = self.write_packet_size.bytes();
        if packet == 0 || !packet.is_multiple_of(bpc) || packet > 16 * 1024 * 1024 {
            return Err(ConfigError::invalid(
                "client.write.packet.size",
                self.write_packet_size,
                "must be a positive multiple of bytes.per.checksum, at most 16MiB",
            ));
        }
        if !self.block_size.bytes().is_multiple_of(bpc) {
            return Err(ConfigError::invalid(
                "client.block.size",
                self.block_size,
                "must be a multiple of bytes.per.checksum",
            ));
        }
        if self.write_max_packets_in_flight == 0 {
            return Err(ConfigError::invalid(
                "client.write.max.packets.in.flight",
                0,
                "must be at least 1",
            ));
        }
        let max_frame = self.max_frame_bytes.bytes();
        let chunk = self.read_chunk_size.bytes();
        let chunk_frame = chunk + chunk.div_ceil(bpc) * 4 + 4096;
        if chunk == 0 || chunk_frame > max_frame {
            return Err(ConfigError::invalid(
                "client.read.chunk.size",
                self.read_chunk_size,
                "must be positive and fit in a frame (max.frame.bytes) with its checksums",
            ));
        }
        if self.read_piece_bytes.bytes() == 0 || self.read_piece_bytes.bytes() * 2 > max_frame {
            return Err(ConfigError::invalid(
                "client.read.piece.bytes",
                self.read_piece_bytes,
                "must be positive and at most half of max.frame.bytes",
            ));
        }
        if self.read_buffer_bytes < self.read_piece_bytes {
            return Err(ConfigError::invalid(
                "client.read.buffer.bytes",
                self.read_buffer_bytes,
                "must hold at least one piece (read.piece.bytes)",
            ));
        }
        for (key, d) in [
            ("client.socket.timeout", self.socket_timeout),
            ("client.rpc.timeout", self.rpc_timeout),
            (
                "client.rpc.connection.max-idle",
                self.rpc_connection_max_idle,
            ),
        ] {
            if d.get().is_zero() {
                return Err(ConfigError::invalid(key, d, "must be positive"));
            }
        }
        Ok(())
    }
}
