//! Counters of one DataNode, readable in tests and exported as Prometheus text on `/metrics`.
//!
//! `block_file_writes` counts every `write`/`pwrite` call on a block file: the benchmark
//! divides it by the MiB written to compare syscalls per MiB with and without batching.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// A monotonic counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Subtracts one.
    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
    /// Adds `n` (negative: subtracts).
    pub fn add(&self, n: i64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// Raises the value to `n` if it is lower (a high-water mark).
    pub fn raise_to(&self, n: i64) {
        self.0.fetch_max(n, Ordering::Relaxed);
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

macro_rules! metrics {
    ($( $(#[doc = $doc:literal])* $name:ident : $ty:ident ),* $(,)?) => {
        /// Every counter and gauge of a DataNode.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $( $(#[doc = $doc])* pub $name: $ty, )*
        }

        impl Metrics {
            /// Prometheus text exposition (`sluice_datanode_<name>`).
            pub fn render(&self) -> String {
                let mut out = String::new();
                $(
                    let help = concat!($($doc),*).trim();
                    let kind = if stringify!($ty) == "Gauge" { "gauge" } else { "counter" };
                    let _ = writeln!(out, "# HELP sluice_datanode_{} {}", stringify!($name), help);
                    let _ = writeln!(out, "# TYPE sluice_datanode_{} {}", stringify!($name), kind);
                    let _ = writeln!(out, "sluice_datanode_{} {}", stringify!($name), self.$name.get());
                )*
                out
            }
        }
    };
}

metrics! {
    /// Data-transfer connections accepted.
    connections_accepted: Counter,
    /// Data-transfer connections being served.
    active_transfers: Gauge,
    /// WriteBlock ops received.
    write_block_ops: Counter,
    /// ReadBlock (streaming) ops received.
    read_block_ops: Counter,
    /// ReadChunk (classic) ops received.
    read_chunk_ops: Counter,
    /// TransferBlock ops received (and Transfer commands run).
    transfer_block_ops: Counter,
    /// ReplicaInfo ops received.
    replica_info_ops: Counter,
    /// Ops answered with an error status.
    op_errors: Counter,
    /// Frames that could not be decoded (garbage, too large, truncated).
    bad_frames: Counter,
    /// Write packets received (heartbeats excluded).
    packets_received: Counter,
    /// Heartbeat packets received.
    heartbeat_packets: Counter,
    /// Packets whose checksums did not match.
    checksum_errors: Counter,
    /// Data bytes written to block files.
    bytes_written: Counter,
    /// write/pwrite calls on block files.
    block_file_writes: Counter,
    /// write/pwrite calls on metadata files.
    meta_file_writes: Counter,
    /// fdatasync/fsync calls on replica files.
    fsyncs: Counter,
    /// Acks sent upstream.
    acks_sent: Counter,
    /// Replicas created (Rbw or Temporary).
    replicas_created: Counter,
    /// Replicas finalized.
    replicas_finalized: Counter,
    /// Replicas deleted.
    replicas_deleted: Counter,
    /// Replicas left out at start-up because their metadata was damaged.
    corrupt_replicas_skipped: Counter,
    /// Data bytes sent to readers (ReadBlock, ReadChunk, transfers).
    bytes_read: Counter,
    /// ReadBlock pieces sent.
    pieces_sent: Counter,
    /// ReadBlock pieces read from disk (with prefetch, ahead of the one on the wire).
    stream_pieces_read: Counter,
    /// ReadChunk chunks sent.
    chunks_sent: Counter,
    /// Bytes announced to the kernel with posix_fadvise(WILLNEED).
    prefetch_advised_bytes: Counter,
    /// Bytes dropped from the page cache behind a reader (posix_fadvise(DONTNEED)).
    dropbehind_bytes: Counter,
    /// Heartbeats sent to the metadata service.
    heartbeats_sent: Counter,
    /// Registrations with the metadata service.
    registrations: Counter,
    /// Full block reports sent.
    block_reports_sent: Counter,
    /// Incremental replica events sent.
    replica_events_sent: Counter,
    /// Failed calls to the metadata service.
    metadata_rpc_errors: Counter,
    /// Replicas being written through a write-memory buffer (HDFS-17973).
    buffered_replicas: Gauge,
    /// Replicas whose writer used a write-memory buffer.
    buffered_replicas_created: Counter,
    /// Bytes of write buffers allocated (held by writers or idle in the pool).
    write_buffer_bytes: Gauge,
    /// High-water mark of `write_buffer_bytes`.
    write_buffer_bytes_peak: Gauge,
    /// Writers that had to wait for a write-buffer memory permit.
    write_buffer_permit_waits: Counter,
    /// Writers that waited too long for a permit and wrote directly instead.
    write_buffer_permit_timeouts: Counter,
    /// Write-buffer flushes to block files.
    buffer_flushes: Counter,
    /// Flushes started by the idle-flush timer.
    idle_flushes: Counter,
    /// write/pwrite calls on the block files of buffered replicas (part of block_file_writes).
    buffered_block_file_writes: Counter,
    /// Data bytes written to the block files of buffered replicas (part of bytes_written).
    buffered_bytes_written: Counter,
    /// Buffer flushes running now.
    flushes_in_progress: Gauge,
    /// High-water mark of `flushes_in_progress`.
    flushes_in_progress_peak: Gauge,
    /// Flushes that waited for their volume's flush budget.
    flush_permit_waits: Counter,
    /// Data bytes flushed with O_DIRECT.
    direct_io_bytes: Counter,
    /// Bytes of flushed block files dropped from the page cache (posix_fadvise(DONTNEED)).
    write_dropbehind_bytes: Counter,
    /// Re-replication copies (`Transfer` commands) running now (reported in heartbeats).
    replication_transfers_active: Gauge,
    /// High-water mark of `replication_transfers_active`.
    replication_transfers_peak: Gauge,
    /// `Transfer` commands run.
    replication_transfers: Counter,
    /// `Transfer` commands that failed.
    replication_transfer_failures: Counter,
    /// Block recoveries run as primary (`RecoverBlock` commands).
    block_recoveries: Counter,
    /// Block recoveries that ended without a report to the metadata service.
    block_recovery_failures: Counter,
    /// Replicas put under recovery (`InitReplicaRecovery` ops served).
    replicas_under_recovery: Counter,
    /// Replicas recovered (`UpdateReplicaUnderRecovery` ops served).
    replicas_recovered: Counter,
    /// Replicas the block scanner verified.
    scanner_replicas_verified: Counter,
    /// Bytes the block scanner verified.
    scanner_bytes_verified: Counter,
    /// Corrupt replicas the block scanner found (and reported).
    scanner_corrupt_replicas: Counter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_names_each_metric_with_its_type() {
        let m = Metrics::default();
        m.block_file_writes.add(3);
        let _g = GaugeGuard::new(&m.active_transfers);
        let text = m.render();
        assert!(
            text.contains("sluice_datanode_block_file_writes 3\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE sluice_datanode_active_transfers gauge"),
            "{text}"
        );
        assert!(
            text.contains("sluice_datanode_active_transfers 1\n"),
            "{text}"
        );
    }
}
