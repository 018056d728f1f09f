//! Counters, gauges and latency histograms of one DataNode, readable in tests and exported on
//! `/metrics` through `prometheus-client` (Prometheus text format), every name prefixed
//! `sluice_datanode_` (counters end `_total`, units end the name: `_bytes`, `_seconds`), beside
//! `sluice_build_info` and the process metrics (`sluice_common::metrics`). `docs/metrics.md`
//! lists them all; a test checks the list against a scrape.
//!
//! `block_file_writes` counts every `write`/`pwrite` call on a block file: the benchmark
//! divides it by the MiB written to compare syscalls per MiB with and without batching.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sluice_common::metrics::{latency_histogram, Timer};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A monotonic counter (`<name>_total`).
#[derive(Debug, Default, Clone)]
pub struct Counter(prometheus_client::metrics::counter::Counter);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.inc_by(n);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

/// A value that goes up and down.
#[derive(Debug, Default, Clone)]
pub struct Gauge(prometheus_client::metrics::gauge::Gauge);

impl Gauge {
    /// Adds one.
    pub fn inc(&self) {
        self.0.inc();
    }
    /// Subtracts one.
    pub fn dec(&self) {
        self.0.dec();
    }
    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.get()
    }
    /// Adds `n` (negative: subtracts).
    pub fn add(&self, n: i64) {
        self.0.inc_by(n);
    }
    /// Sets the value.
    pub fn set(&self, n: i64) {
        self.0.set(n);
    }
    /// Raises the value to `n` if it is lower (a high-water mark).
    pub fn raise_to(&self, n: i64) {
        self.0.inner().fetch_max(n, Ordering::Relaxed);
    }
}

/// A latency histogram in seconds (`<name>_bucket`, `_sum`, `_count`).
#[derive(Debug, Clone)]
pub struct Histogram(prometheus_client::metrics::histogram::Histogram);

impl Default for Histogram {
    fn default() -> Self {
        Histogram(latency_histogram())
    }
}

impl Histogram {
    /// Observes one duration.
    pub fn observe(&self, d: Duration) {
        self.0.observe(d.as_secs_f64());
    }
    /// Observes the time until the returned guard drops.
    pub fn start_timer(&self) -> Timer<'_> {
        Timer::start(&self.0)
    }
}

/// Decrements a gauge when dropped.
#[derive(Debug)]
pub struct GaugeGuard<'a>(&'a Gauge);

impl<'a> GaugeGuard<'a> {
    /// Increments `g` until the guard drops.
    pub fn new(g: &'a Gauge) -> Self {
        g.inc();
        GaugeGuard(g)
    }
}

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The `volume` label: a volume's data directory.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeLabel {
    /// The directory.
    pub volume: String,
}

/// Space of each volume, set at each scrape.
#[derive(Debug, Default, Clone)]
pub struct VolumeGauges {
    /// Total bytes of the volume's file system.
    pub capacity: Family<VolumeLabel, prometheus_client::metrics::gauge::Gauge>,
    /// Bytes used by replicas.
    pub used: Family<VolumeLabel, prometheus_client::metrics::gauge::Gauge>,
    /// Bytes free.
    pub remaining: Family<VolumeLabel, prometheus_client::metrics::gauge::Gauge>,
}

/// The `mode` label of read requests.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabel {
    mode: &'static str,
}

macro_rules! metrics {
    ($( $(#[doc = $doc:literal])* $name:ident : $ty:ident = $metric:literal ),* $(,)?) => {
        /// Every counter, gauge and histogram of a DataNode, and the registry exporting them.
        #[derive(Debug)]
        pub struct Metrics {
            $( $(#[doc = $doc])* pub $name: $ty, )*
            /// Streaming reads (`ReadBlock`): request to `ReadEnd` (`read_request_seconds{mode="stream"}`).
            pub read_stream_seconds: Histogram,
            /// Classic reads (`ReadChunk`): request to chunk sent (`read_request_seconds{mode="chunk"}`).
            pub read_chunk_seconds: Histogram,
            /// Space of each volume (set by the HTTP handler before it encodes).
            pub volumes: VolumeGauges,
            registry: Registry,
        }

        impl Default for Metrics {
            fn default() -> Self {
                let mut registry = Registry::default();
                sluice_common::metrics::register_build_and_process(&mut registry);
                let reads: Family<ModeLabel, prometheus_client::metrics::histogram::Histogram> =
                    Family::new_with_constructor(latency_histogram);
                let m = Metrics {
                    $( $name: $ty::default(), )*
                    read_stream_seconds: Histogram(reads.get_or_create_owned(&ModeLabel { mode: "stream" })),
                    read_chunk_seconds: Histogram(reads.get_or_create_owned(&ModeLabel { mode: "chunk" })),
                    volumes: VolumeGauges::default(),
                    registry: Registry::default(),
                };
                let dn = registry.sub_registry_with_prefix("sluice_datanode");
                $(
                    dn.register($metric, concat!($($doc),*).trim(), m.$name.0.clone());
                )*
                dn.register("read_request_seconds", "Read requests by mode (stream: ReadBlock, chunk: ReadChunk), from the op to its last byte sent.", reads);
                dn.register("volume_capacity_bytes", "Total bytes of the volume's file system.", m.volumes.capacity.clone());
                dn.register("volume_used_bytes", "Bytes of the volume used by replicas.", m.volumes.used.clone());
                dn.register("volume_remaining_bytes", "Bytes free on the volume.", m.volumes.remaining.clone());
                Metrics { registry, ..m }
            }
        }

        impl Metrics {
            /// Prometheus text exposition (format 0.0.4).
            pub fn render(&self) -> String {
                sluice_common::metrics::encode(&self.registry)
            }
        }
    };
}

metrics! {
    /// Data-transfer connections accepted.
    connections_accepted: Counter = "connections_accepted",
    /// Data-transfer connections closed at accept: their peer held `data.connections.per-peer.max`.
    connections_refused_per_peer: Counter = "connections_refused_per_peer",
    /// Pipelines closed because no data packet came within `write.setup.idle.timeout` of
    /// their set-up while they held a write-buffer permit.
    idle_setups_closed: Counter = "idle_setups_closed",
    /// Data-transfer connections being served.
    active_transfers: Gauge = "active_transfers",
    /// WriteBlock ops received.
    write_block_ops: Counter = "write_block_ops",
    /// ReadBlock (streaming) ops received.
    read_block_ops: Counter = "read_block_ops",
    /// ReadChunk (classic) ops received.
    read_chunk_ops: Counter = "read_chunk_ops",
    /// TransferBlock ops received (and Transfer commands run).
    transfer_block_ops: Counter = "transfer_block_ops",
    /// ReplicaInfo ops received.
    replica_info_ops: Counter = "replica_info_ops",
    /// Ops answered with an error status.
    op_errors: Counter = "op_errors",
    /// Frames that could not be decoded (garbage, too large, truncated).
    bad_frames: Counter = "bad_frames",
    /// Reads refused because the replica carries another generation stamp than the one asked.
    read_stamp_refusals: Counter = "read_stamp_refusals",
    /// Read-buffer bytes held (read-ahead windows, chunk reply buffers), at most `read.buffer.max.bytes`.
    read_buffer_bytes: Gauge = "read_buffer_bytes",
    /// Reads refused with ERROR_BUSY: their buffers did not fit `read.buffer.max.bytes`.
    reads_busy: Counter = "reads_busy",
    /// Write packets received (heartbeats excluded).
    packets_received: Counter = "packets_received",
    /// Write packets the receiving connection task wrote to the replica itself (a direct
    /// sink's page-cache write), without the hand-off to the writer actor and the blocking pool.
    packets_written_inline: Counter = "packets_written_inline",
    /// Write packets a buffered replica writer copied into its buffer on the actor's own
    /// thread (room left, no flush), without the round trip through the blocking pool.
    packets_buffered_on_actor: Counter = "packets_buffered_on_actor",
    /// Heartbeat packets received.
    heartbeat_packets: Counter = "heartbeat_packets",
    /// Packets whose checksums did not match.
    checksum_errors: Counter = "checksum_errors",
    /// Data bytes written to block files.
    bytes_written: Counter = "written_bytes",
    /// write/pwrite calls on block files.
    block_file_writes: Counter = "block_file_writes",
    /// write/pwrite calls on metadata files.
    meta_file_writes: Counter = "meta_file_writes",
    /// fdatasync/fsync calls on replica files.
    fsyncs: Counter = "fsyncs",
    /// Acks sent upstream.
    acks_sent: Counter = "acks_sent",
    /// Replicas created (Rbw or Temporary).
    replicas_created: Counter = "replicas_created",
    /// Replicas finalized.
    replicas_finalized: Counter = "replicas_finalized",
    /// Replicas deleted.
    replicas_deleted: Counter = "replicas_deleted",
    /// Replicas left out at start-up because their metadata was damaged.
    corrupt_replicas_skipped: Counter = "corrupt_replicas_skipped",
    /// Data bytes sent to readers (ReadBlock, ReadChunk, transfers).
    bytes_read: Counter = "read_bytes",
    /// ReadBlock pieces sent.
    pieces_sent: Counter = "pieces_sent",
    /// ReadBlock pieces read from disk (with prefetch, ahead of the one on the wire).
    stream_pieces_read: Counter = "stream_pieces_read",
    /// ReadBlock pieces found whole in the page cache and read on the connection's own task
    /// (`preadv2(RWF_NOWAIT)`), without the reader task and its blocking-pool read.
    stream_pieces_cached: Counter = "stream_pieces_cached",
    /// Of those, pieces whose data went from the page cache to the socket with `sendfile`
    /// (`read.sendfile`), never through a buffer.
    stream_pieces_sendfile: Counter = "stream_pieces_sendfile",
    /// Of those, pieces whose data went to the socket with `send(2)` straight from a mapping
    /// of the block file (`read.mmap.enabled`), never through a buffer.
    stream_pieces_mapped: Counter = "stream_pieces_mapped",
    /// ReadBlock pieces not in the page cache while the piece after them was (a hole in a
    /// cached range), read on the blocking pool by the connection, which then went on with
    /// cached pieces instead of handing the rest of the range to the prefetching reader.
    stream_pieces_holes: Counter = "stream_pieces_holes",
    /// ReadBlock pieces read by the prefetching reader with O_DIRECT (`read.o.direct.enabled`):
    /// from the disk into the piece's buffer, past the page cache.
    stream_pieces_direct: Counter = "stream_pieces_direct",
    /// ReadChunk chunks sent.
    chunks_sent: Counter = "chunks_sent",
    /// Of those, chunks found in the page cache and sent with `sendfile` (`read.sendfile`).
    chunks_sendfile: Counter = "chunks_sendfile",
    /// ReadChunk reply buffers allocated (one per connection: reused from chunk to chunk).
    chunk_buffers_allocated: Counter = "chunk_buffers_allocated",
    /// Bytes announced to the kernel with posix_fadvise(WILLNEED).
    prefetch_advised_bytes: Counter = "prefetch_advised_bytes",
    /// Bytes dropped from the page cache behind a reader (posix_fadvise(DONTNEED)).
    dropbehind_bytes: Counter = "dropbehind_bytes",
    /// Heartbeats sent to the metadata service.
    heartbeats_sent: Counter = "heartbeats_sent",
    /// Registrations with the metadata service.
    registrations: Counter = "registrations",
    /// Full block reports sent.
    block_reports_sent: Counter = "block_reports_sent",
    /// Incremental replica events sent.
    replica_events_sent: Counter = "replica_events_sent",
    /// Failed calls to the metadata service.
    metadata_rpc_errors: Counter = "metadata_rpc_errors",
    /// Replicas being written through a write-memory buffer (HDFS-17973).
    buffered_replicas: Gauge = "buffered_replicas",
    /// Replicas whose writer used a write-memory buffer.
    buffered_replicas_created: Counter = "buffered_replicas_created",
    /// Bytes of write buffers allocated (held by writers or idle in the pool).
    write_buffer_bytes: Gauge = "write_buffer_bytes",
    /// High-water mark of `write_buffer_bytes`.
    write_buffer_bytes_peak: Gauge = "write_buffer_peak_bytes",
    /// Writers that had to wait for a write-buffer memory permit.
    write_buffer_permit_waits: Counter = "write_buffer_permit_waits",
    /// Writers that waited too long for a permit and wrote directly instead.
    write_buffer_permit_timeouts: Counter = "write_buffer_permit_timeouts",
    /// Write-buffer flushes to block files.
    buffer_flushes: Counter = "buffer_flushes",
    /// Flushes started by the idle-flush timer.
    idle_flushes: Counter = "idle_flushes",
    /// write/pwrite calls on the block files of buffered replicas (part of block_file_writes).
    buffered_block_file_writes: Counter = "buffered_block_file_writes",
    /// Data bytes written to the block files of buffered replicas (part of bytes_written).
    buffered_bytes_written: Counter = "buffered_written_bytes",
    /// Buffer flushes running now.
    flushes_in_progress: Gauge = "flushes_in_progress",
    /// High-water mark of `flushes_in_progress`.
    flushes_in_progress_peak: Gauge = "flushes_in_progress_peak",
    /// Flushes that waited for their volume's flush budget.
    flush_permit_waits: Counter = "flush_permit_waits",
    /// Data bytes flushed with O_DIRECT.
    direct_io_bytes: Counter = "direct_io_bytes",
    /// Bytes of flushed block files dropped from the page cache (posix_fadvise(DONTNEED)).
    write_dropbehind_bytes: Counter = "write_dropbehind_bytes",
    /// Re-replication copies (`Transfer` commands) running now (reported in heartbeats).
    replication_transfers_active: Gauge = "replication_transfers_active",
    /// High-water mark of `replication_transfers_active`.
    replication_transfers_peak: Gauge = "replication_transfers_peak",
    /// `Transfer` commands run.
    replication_transfers: Counter = "replication_transfers",
    /// `Transfer` commands that failed.
    replication_transfer_failures: Counter = "replication_transfer_failures",
    /// Block recoveries run as primary (`RecoverBlock` commands).
    block_recoveries: Counter = "block_recoveries",
    /// Block recoveries that ended without a report to the metadata service.
    block_recovery_failures: Counter = "block_recovery_failures",
    /// Replicas put under recovery (`InitReplicaRecovery` ops served).
    replicas_under_recovery: Counter = "replicas_under_recovery",
    /// Replicas recovered (`UpdateReplicaUnderRecovery` ops served).
    replicas_recovered: Counter = "replicas_recovered",
    /// Replicas the block scanner verified.
    scanner_replicas_verified: Counter = "scanner_replicas_verified",
    /// Bytes the block scanner verified.
    scanner_bytes_verified: Counter = "scanner_verified_bytes",
    /// Corrupt replicas the block scanner found (and reported).
    scanner_corrupt_replicas: Counter = "scanner_corrupt_replicas",
    /// Write pipelines (WriteBlock ops) being served now (reported in heartbeats).
    active_pipelines: Gauge = "active_pipelines",
    /// WriteBlock ops that rebuild a pipeline (stages StreamingRecovery and CloseRecovery).
    pipeline_recoveries: Counter = "pipeline_recoveries",
    /// The cap on write-buffer memory (`write.memory.buffer.max.capacity.mb`; -1: no cap).
    write_buffer_capacity_bytes: Gauge = "write_buffer_capacity_bytes",
    /// Streaming-read pieces already read from disk when the connection was ready to send them.
    prefetch_hits: Counter = "prefetch_hits",
    /// Streaming-read pieces the connection had to wait for the disk to read.
    prefetch_misses: Counter = "prefetch_misses",
    /// Packet received to its ack sent upstream (local write and downstream ack included).
    packet_ack_seconds: Histogram = "packet_ack_seconds",
    /// fdatasync of a replica's block and metadata files.
    fsync_seconds: Histogram = "fsync_seconds",
    /// One write-buffer flush to a block file.
    flush_seconds: Histogram = "flush_seconds",
    /// A WriteBlock op, set-up to its connection's end.
    block_write_seconds: Histogram = "block_write_seconds",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_names_each_metric_with_its_type_and_unit() {
        let m = Metrics::default();
        m.block_file_writes.add(3);
        m.bytes_written.add(4096);
        m.fsync_seconds.observe(Duration::from_millis(3));
        m.read_chunk_seconds.observe(Duration::from_millis(1));
        let _g = GaugeGuard::new(&m.active_transfers);
        let text = m.render();
        for line in [
            "sluice_datanode_block_file_writes_total 3\n",
            "# TYPE sluice_datanode_active_transfers gauge\n",
            "sluice_datanode_active_transfers 1\n",
            "sluice_datanode_written_bytes_total 4096\n",
            "# TYPE sluice_datanode_fsync_seconds histogram\n",
            "sluice_datanode_fsync_seconds_count 1\n",
            "sluice_datanode_read_request_seconds_count{mode=\"chunk\"} 1\n",
            "sluice_datanode_read_request_seconds_count{mode=\"stream\"} 0\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from:\n{text}");
        }
    }

    #[test]
    fn a_high_water_mark_only_rises() {
        let g = Gauge::default();
        g.raise_to(5);
        g.raise_to(2);
        assert_eq!(g.get(), 5);
    }
}
