//! `[datanode]`: a DataNode, including the write-memory batching settings of HDFS-17973 (with
//! their upstream names) and the streaming-read prefetch.

use super::units::{ByteSize, HumanDuration, Millis, PathList};
use super::ConfigError;
use serde::{Deserialize, Serialize};

/// Settings of a DataNode. Every key is documented in `docs/configuration.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatanodeConfig {
    /// The metadata service's RPC address.
    #[serde(rename = "metadata.address")]
    pub metadata_address: String,
    /// Address to bind the data-transfer and HTTP listeners to.
    #[serde(rename = "bind.host")]
    pub bind_host: String,
    /// Data-transfer port, 0 for any free port. HDFS's 9866.
    pub port: u16,
    /// HTTP port, 0 for any free port. HDFS's 9864.
    #[serde(rename = "http.port")]
    pub http_port: u16,
    /// The HTTP request head (line and headers) must arrive within this; a slower one is
    /// answered 408 and closed (a slowloris header trickle).
    #[serde(rename = "http.request.timeout")]
    pub http_request_timeout: HumanDuration,
    /// An idle keep-alive HTTP connection is closed after this.
    #[serde(rename = "http.keep-alive.timeout")]
    pub http_keep_alive_timeout: HumanDuration,
    /// Longest gap between two bytes of an HTTP request body (and before the first); past it
    /// the request fails and its connection is closed. The whole body is not bounded.
    #[serde(rename = "http.body.idle.timeout")]
    pub http_body_idle_timeout: HumanDuration,
    /// HTTP connections open at once; more wait in the listen backlog.
    #[serde(rename = "http.connections.max")]
    pub http_connections_max: u32,
    /// HTTP connections one peer address (IP) may hold at once; one more is answered 503 on
    /// its first request and closed.
    #[serde(rename = "http.connections.per-peer.max")]
    pub http_connections_per_peer_max: u32,
    /// Host name or address registered with the metadata service, which hands it to clients
    /// and peers. Empty: `bind.host` if it is a specific address, else this machine's host name.
    /// `@ip`: this machine's IP address, found by the DataNode at start (for containers).
    #[serde(rename = "advertised.host")]
    pub advertised_host: String,
    /// Port registered for data transfer, 0: the bound port (set it behind port mapping).
    #[serde(rename = "advertised.port")]
    pub advertised_port: u16,
    /// Volume directories, one per disk.
    #[serde(rename = "data.dirs")]
    pub data_dirs: PathList,
    /// Topology label used by placement.
    pub rack: String,
    /// File holding the cluster secret this DataNode proves to the metadata service (read at
    /// every registration; it may appear after start-up). Empty: the `SLUICE_CLUSTER_SECRET`
    /// environment variable; with neither, a DataNode with `security.enabled` refuses to start.
    #[serde(rename = "cluster.secret.file")]
    pub cluster_secret_file: std::path::PathBuf,
    /// Prove the cluster secret to the metadata service and demand its proof in return (on by
    /// default). Off: this DataNode proves nothing, joins only a metadata service that demands
    /// no secret, and logs a warning at start-up.
    #[serde(rename = "security.enabled")]
    pub security_enabled: bool,
    /// Heartbeat interval.
    #[serde(rename = "heartbeat.interval")]
    pub heartbeat_interval: HumanDuration,
    /// Interval between full block reports.
    #[serde(rename = "block.report.interval")]
    pub block_report_interval: HumanDuration,
    /// Read timeout on data-transfer sockets (and ack timeout toward downstream).
    #[serde(rename = "socket.timeout")]
    pub socket_timeout: HumanDuration,
    /// Largest data-transfer frame accepted.
    #[serde(rename = "max.frame.bytes")]
    pub max_frame_bytes: ByteSize,
    /// Longest write or copy pipeline a `WriteBlock` or `TransferBlock` may name, this DataNode
    /// included (HDFS `dfs.replication.max`); a longer one is refused before anything is dialled.
    #[serde(rename = "replication.max")]
    pub replication_max: u32,
    /// Data-transfer connections served at once; more wait in the accept queue.
    #[serde(rename = "max.transfer.threads")]
    pub max_transfer_threads: u32,
    /// Data-transfer connections one peer address (IP) may hold at once; more are closed at
    /// accept, so that one host cannot take every `max.transfer.threads` slot.
    #[serde(rename = "data.connections.per-peer.max")]
    pub data_connections_per_peer_max: u32,
    /// A pipeline whose writer holds a write-buffer memory permit and that receives no data
    /// packet within this after its set-up (heartbeats do not count) is closed and the permit
    /// returned: idle set-ups cannot take every write buffer.
    #[serde(rename = "write.setup.idle.timeout")]
    pub write_setup_idle_timeout: HumanDuration,
    /// fsync a replica's block and metadata files when it is finalized (Sluice default: true;
    /// HDFS's `dfs.datanode.synconclose` defaults to false).
    #[serde(rename = "sync.on.close")]
    pub sync_on_close: bool,
    /// The block scanner verifies every finalized replica's checksums once per this period
    /// (HDFS's `dfs.datanode.scan.period.hours`, 3 weeks).
    #[serde(rename = "block.scanner.interval")]
    pub block_scanner_interval: HumanDuration,
    /// Bytes per second the block scanner reads at most; 0 turns the scanner off (HDFS's
    /// `dfs.block.scanner.volume.bytes.per.second`).
    #[serde(rename = "block.scanner.bytes.per.second")]
    pub block_scanner_bytes_per_second: ByteSize,

    /// Batch packets in memory before writing them (HDFS-17973).
    #[serde(rename = "write.memory.buffer.enabled")]
    pub write_buffer_enabled: bool,
    /// Batch only on the last DataNode of the pipeline.
    #[serde(rename = "write.memory.buffer.last-replica-only")]
    pub write_buffer_last_replica_only: bool,
    /// Total memory for write buffers in MiB; -1 for no cap. One permit per buffer.
    #[serde(rename = "write.memory.buffer.max.capacity.mb")]
    pub write_buffer_max_capacity_mb: i64,
    /// Batch only when the DataNode has more volumes than this.
    #[serde(rename = "write.memory.buffer.min.volumes")]
    pub write_buffer_min_volumes: u32,
    /// One replica's buffer (floored at 1 MiB).
    #[serde(rename = "write.buffer.size.bytes")]
    pub write_buffer_size: ByteSize,
    /// Flush a replica's buffer when no packet came for this long; 0 turns it off.
    #[serde(rename = "write.buffer.idle.flush.timeout.ms")]
    pub write_buffer_idle_flush_timeout: Millis,
    /// Flush budget per volume in MiB: bounds the flushes running at once; 0 for no bound.
    #[serde(rename = "concurrent.flush.mb.per.volume")]
    pub concurrent_flush_mb_per_volume: u64,
    /// Reads larger than this drop the pages behind them from the page cache.
    #[serde(rename = "read.ahead.cache.bytes.threshold")]
    pub read_ahead_cache_threshold: ByteSize,
    /// Flush buffers with O_DIRECT (aligned head; unaligned tail through the page cache).
    #[serde(rename = "write.o.direct.enabled")]
    pub write_o_direct: bool,
    /// Drop a buffered replica's written pages from the page cache behind its flushes and at
    /// release (upstream's release does), keeping the cache for reads.
    #[serde(rename = "write.buffer.drop.behind")]
    pub write_buffer_drop_behind: bool,

    /// Data bytes per piece of a streaming read when the client does not ask for a size.
    #[serde(rename = "read.piece.bytes")]
    pub read_piece_bytes: ByteSize,
    /// How far ahead of the piece on the wire a streaming read prefetches from disk; 0 turns
    /// prefetch off.
    #[serde(rename = "read.prefetch.bytes")]
    pub read_prefetch_bytes: ByteSize,
    /// With prefetch on, whether to also advise the kernel (`posix_fadvise(WILLNEED)`) over
    /// the prefetch range, besides reading ahead into buffers.
    #[serde(rename = "read.prefetch.fadvise")]
    pub read_prefetch_fadvise: PrefetchAdvice,
    /// Send the data of pieces and chunks found in the page cache with `sendfile` (zero-copy
    /// from the page cache to the socket, HDFS's `transferTo`), or read them into a buffer
    /// first.
    #[serde(rename = "read.sendfile")]
    pub read_sendfile: SendfileMode,
    /// Send the data of a streaming read's cached pieces that do not go with `sendfile` from a
    /// read-only mapping of the block file (`send(2)` copies it once, into the socket), rather
    /// than reading it into a buffer first.
    #[serde(rename = "read.mmap.enabled")]
    pub read_mmap: bool,
    /// Read a streaming read's pieces that are not in the page cache with `O_DIRECT`: from the
    /// disk straight into the piece's buffer, with no copy out of the page cache and nothing
    /// left in it to drop behind.
    #[serde(rename = "read.o.direct.enabled")]
    pub read_o_direct: bool,
    /// Node-wide cap on read-buffer memory: the read-ahead windows of streaming reads and the
    /// reply buffers of chunk reads. A read that does not fit is answered `ERROR_BUSY` at once
    /// (a stream first gives up its read-ahead); the client tries another replica or later.
    #[serde(rename = "read.buffer.max.bytes")]
    pub read_buffer_max_bytes: ByteSize,
}

/// Whether a streaming read's prefetch also advises the kernel (`posix_fadvise(WILLNEED)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefetchAdvice {
    /// Advise unless the volume's device already reads ahead at least `read.prefetch.bytes`
    /// by itself (its `read_ahead_kb`): there the advice only adds work.
    Auto,
    /// Always advise.
    On,
    /// Never advise: prefetch reads ahead into buffers only.
    Off,
}

/// When cached read data goes out with `sendfile` rather than through a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SendfileMode {
    /// For readers on other hosts only. A reader on the same host (a loopback peer) receives
    /// `sendfile`'s page-cache pages at a higher cost than the copy saves the DataNode: on the
    /// benchmark machine warm reads were slower and dearer in CPU for the pair
    /// (docs/benchmarks.md, "fifth round").
    Auto,
    /// Always.
    On,
    /// Never: cached data is read into a buffer and written from it.
    Off,
}

impl Default for DatanodeConfig {
    fn default() -> Self {
        Self {
            metadata_address: "127.0.0.1:8020".into(),
            bind_host: "0.0.0.0".into(),
            port: 9866,
            http_port: 9864,
            http_request_timeout: HumanDuration::secs(5),
            http_keep_alive_timeout: HumanDuration::secs(5),
            http_body_idle_timeout: HumanDuration::secs(60),
            http_connections_max: 1024,
            http_connections_per_peer_max: 256,
            advertised_host: String::new(),
            advertised_port: 0,
            data_dirs: PathList(vec!["./sluice-data/datanode".into()]),
            rack: "/default-rack".into(),
            cluster_secret_file: std::path::PathBuf::new(),
            security_enabled: true,
            heartbeat_interval: HumanDuration::secs(3),
            block_report_interval: HumanDuration::secs(6 * 3600),
            socket_timeout: HumanDuration::secs(60),
            max_frame_bytes: ByteSize::mib(16),
            replication_max: 512,
            max_transfer_threads: 4096,
            data_connections_per_peer_max: 1024,
            write_setup_idle_timeout: HumanDuration::secs(10),
            sync_on_close: true,
            block_scanner_interval: HumanDuration::secs(21 * 24 * 3600),
            block_scanner_bytes_per_second: ByteSize::mib(1),
            write_buffer_enabled: true,
            write_buffer_last_replica_only: true,
            write_buffer_max_capacity_mb: 1024,
            write_buffer_min_volumes: 0,
            write_buffer_size: ByteSize::mib(8),
            write_buffer_idle_flush_timeout: Millis::new(2000),
            concurrent_flush_mb_per_volume: 64,
            read_ahead_cache_threshold: ByteSize::kib(256),
            write_o_direct: false,
            write_buffer_drop_behind: true,
            read_piece_bytes: ByteSize::mib(1),
            read_prefetch_bytes: ByteSize::mib(8),
            read_buffer_max_bytes: ByteSize::gib(1),
            read_prefetch_fadvise: PrefetchAdvice::Auto,
            read_sendfile: SendfileMode::Auto,
            read_mmap: true,
            read_o_direct: false,
        }
    }
}

/// The smallest write buffer (HDFS-17973 floors the buffer at 1 MiB).
pub const MIN_WRITE_BUFFER: u64 = 1024 * 1024;

impl DatanodeConfig {
    /// One replica's buffer size after the 1 MiB floor.
    pub fn effective_write_buffer_size(&self) -> u64 {
        self.write_buffer_size.bytes().max(MIN_WRITE_BUFFER)
    }

    /// Buffers the memory cap allows at once (`None`: no cap).
    pub fn write_buffer_permits(&self) -> Option<u64> {
        if self.write_buffer_max_capacity_mb < 0 {
            return None;
        }
        let cap = self.write_buffer_max_capacity_mb as u64 * 1024 * 1024;
        Some(cap / self.effective_write_buffer_size())
    }

    /// Checks ranges and relations between keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.data_connections_per_peer_max == 0 {
            return Err(ConfigError::invalid(
                "datanode.data.connections.per-peer.max",
                0,
                "must be at least 1",
            ));
        }
        if self.replication_max == 0 {
            return Err(ConfigError::invalid(
                "datanode.replication.max",
                0,
                "must be at least 1",
            ));
        }
        for (key, value) in [
            ("datanode.http.request.timeout", self.http_request_timeout),
            (
                "datanode.http.keep-alive.timeout",
                self.http_keep_alive_timeout,
            ),
            (
                "datanode.http.body.idle.timeout",
                self.http_body_idle_timeout,
            ),
            (
                "datanode.write.setup.idle.timeout",
                self.write_setup_idle_timeout,
            ),
        ] {
            if value.get().is_zero() {
                return Err(ConfigError::invalid(key, value, "must be positive"));
            }
        }
        if self.http_connections_max == 0 {
            return Err(ConfigError::invalid(
                "datanode.http.connections.max",
                0,
                "must be at least 1",
            ));
        }
        if self.http_connections_per_peer_max == 0 {
            return Err(ConfigError::invalid(
                "datanode.http.connections.per-peer.max",
                0,
                "must be at least 1",
            ));
        }
        if self.data_dirs.0.is_empty() {
            return Err(ConfigError::invalid(
                "datanode.data.dirs",
                "[]",
                "needs at least one directory",
            ));
        }
        if self.heartbeat_interval.get().is_zero() {
            return Err(ConfigError::invalid(
                "datanode.heartbeat.interval",
                self.heartbeat_interval,
                "must be positive",
            ));
        }
        if self.socket_timeout.get().is_zero() {
            return Err(ConfigError::invalid(
                "datanode.socket.timeout",
                self.socket_timeout,
                "must be positive",
            ));
        }
        if self.max_frame_bytes < ByteSize::kib(128) || self.max_frame_bytes > ByteSize::mib(256) {
            return Err(ConfigError::invalid(
                "datanode.max.frame.bytes",
                self.max_frame_bytes,
                "must be between 128KiB and 256MiB",
            ));
        }
        if self.block_scanner_interval.get().is_zero() {
            return Err(ConfigError::invalid(
                "datanode.block.scanner.interval",
                self.block_scanner_interval,
                "must be positive",
            ));
        }
        if self.max_transfer_threads == 0 {
            return Err(ConfigError::invalid(
                "datanode.max.transfer.threads",
                0,
                "must be at least 1",
            ));
        }
        if self.write_buffer_max_capacity_mb < -1 {
            return Err(ConfigError::invalid(
                "datanode.write.memory.buffer.max.capacity.mb",
                self.write_buffer_max_capacity_mb,
                "must be -1 (no cap) or a size in MiB",
            ));
        }
        if self.write_buffer_enabled && self.write_buffer_permits() == Some(0) {
            return Err(ConfigError::invalid(
                "datanode.write.memory.buffer.max.capacity.mb",
                self.write_buffer_max_capacity_mb,
                "is smaller than one write buffer (write.buffer.size.bytes): no writer could ever batch",
            ));
        }
        if !self.write_buffer_size.bytes().is_multiple_of(512) {
            return Err(ConfigError::invalid(
                "datanode.write.buffer.size.bytes",
                self.write_buffer_size,
                "must be a multiple of 512 bytes",
            ));
        }
        let piece = self.read_piece_bytes.bytes();
        if piece == 0 || !piece.is_multiple_of(512) || piece * 2 > self.max_frame_bytes.bytes() {
            return Err(ConfigError::invalid(
                "datanode.read.piece.bytes",
                self.read_piece_bytes,
                "must be a positive multiple of 512 bytes and at most half of max.frame.bytes",
            ));
        }
        Ok(())
    }
}
