//! Tests of the buffered sink against real files: flush points, the partial-chunk checksum
//! after an hflush, packets larger than the buffer, O_DIRECT, release, and a failed
//! construction giving back its permit and buffer.

use super::buffer_pool::{BufferSettings, WriteBuffers};
use super::buffered_sink::BufferedSink;
use super::sink::ReplicaSink;
use crate::error::Result;
use crate::failpoint::FailScope;
use crate::metrics::Metrics;
use crate::storage::dataset::{Dataset, OpenReplica};
use crate::storage::meta::MetaHeader;
use sluice_common::checksum;
use sluice_common::config::{ByteSize, DatanodeConfig};
use sluice_common::proto::BlockStage;
use sluice_common::{BlockId, GenerationStamp};
use std::sync::Arc;
use std::time::Duration;

const MIB: usize = 1 << 20;

struct Fixture {
    _dir: tempfile::TempDir,
    ds: Dataset,
    buffers: Arc<WriteBuffers>,
    metrics: Arc<Metrics>,
    rt: tokio::runtime::Runtime,
}

fn fixture(o_direct: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::default());
    let ds = Dataset::open(&[dir.path().to_path_buf()], metrics.clone()).unwrap();
    let cfg = DatanodeConfig {
        write_buffer_size: ByteSize::mib(1),
        write_buffer_max_capacity_mb: 2,
        write_o_direct: o_direct,
        ..DatanodeConfig::default()
    };
    let buffers = Arc::new(WriteBuffers::new(
        BufferSettings::from_config(&cfg),
        1,
        metrics.clone(),
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    Fixture {
        _dir: dir,
        ds,
        buffers,
        metrics,
        rt,
    }
}

impl Fixture {
    fn replica(&self, id: u64) -> OpenReplica {
        self.ds
            .create(BlockId(id), GenerationStamp(1), 512, BlockStage::Create)
            .unwrap()
    }

    fn sink(&self, replica: OpenReplica) -> Result<BufferedSink> {
        let lease = self
            .rt
            .block_on(self.buffers.lease(Duration::from_secs(1)))
            .unwrap();
        BufferedSink::new(replica, lease, self.metrics.clone(), FailScope::default())
    }
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + i / 7) as u8).collect()
}

/// Sends `bytes[from..to]` as one packet at `from` (a chunk boundary).
fn put(sink: &mut BufferedSink, bytes: &[u8], from: usize, to: usize) {
    let d = &bytes[from..to];
    sink.write(from as u64, d, &checksum::compute(d, 512))
        .unwrap();
}

/// The block file and the metadata file hold exactly `want`, with its checksums.
fn assert_files(f: &Fixture, id: u64, want: &[u8]) {
    let e = f.ds.get(BlockId(id)).unwrap();
    let block = std::fs::read(e.block_path()).unwrap();
    assert_eq!(block.len(), want.len(), "block file length");
    assert!(block == want, "block file bytes");
    let meta = std::fs::read(e.meta_path()).unwrap();
    let mut expect = MetaHeader {
        bytes_per_checksum: 512,
    }
    .encode()
    .to_vec();
    expect.extend(checksum::compute(want, 512));
    assert_eq!(meta, expect, "metadata file: header and every checksum");
}

#[test]
fn bytes_wait_in_memory_until_a_flush_then_reach_the_file_in_one_write() {
    let f = fixture(false);
    let mut s = f.sink(f.replica(1)).unwrap();
    let d = data(300_000);
    for off in (0..d.len()).step_by(65_536) {
        put(&mut s, &d, off, (off + 65_536).min(d.len()));
    }
    assert_eq!((s.bytes_received(), s.bytes_on_disk()), (300_000, 0));
    assert!(s.pending());
    assert_eq!(f.metrics.block_file_writes.get(), 0, "nothing written yet");
    s.flush().unwrap();
    assert_eq!(s.bytes_on_disk(), 300_000);
    assert!(!s.pending());
    assert_eq!(f.metrics.buffered_block_file_writes.get(), 1, "one write");
    assert_eq!(f.metrics.meta_file_writes.get(), 1);
    s.flush().unwrap();
    assert_eq!(
        f.metrics.buffer_flushes.get(),
        1,
        "nothing pending: no flush"
    );
    assert_files(&f, 1, &d);
}

#[test]
fn a_resent_partial_chunk_after_a_flush_rewrites_its_checksum() {
    let f = fixture(false);
    let mut s = f.sink(f.replica(2)).unwrap();
    let d = data(2000);
    put(&mut s, &d, 0, 700);
    s.sync().unwrap();
    assert_files(&f, 2, &d[..700]);
    // The writer resends chunk 1 (512..) with the bytes after the hflush.
    put(&mut s, &d, 512, 2000);
    assert_eq!((s.bytes_received(), s.bytes_on_disk()), (2000, 700));
    s.flush().unwrap();
    assert_files(&f, 2, &d);
    // Both still in the buffer: the later checksum wins too.
    let mut s = f.sink(f.replica(3)).unwrap();
    put(&mut s, &d, 0, 700);
    put(&mut s, &d, 512, 1300);
    put(&mut s, &d, 1024, 2000);
    s.flush().unwrap();
    assert_files(&f, 3, &d);
}

#[test]
fn a_full_buffer_flushes_itself_and_a_larger_packet_goes_straight_through() {
    let f = fixture(false);
    let mut s = f.sink(f.replica(4)).unwrap();
    let d = data(3 * MIB);
    for off in (0..MIB).step_by(65_536) {
        put(&mut s, &d, off, off + 65_536);
    }
    assert_eq!(s.bytes_on_disk(), MIB as u64, "flushed when full");
    assert_eq!(f.metrics.buffered_block_file_writes.get(), 1);
    put(&mut s, &d, MIB, MIB + 100);
    put(&mut s, &d, MIB, 3 * MIB);
    assert_eq!(s.bytes_on_disk(), 3 * MIB as u64, "larger than the buffer");
    assert!(!s.pending());
    assert_files(&f, 4, &d);
}

#[test]
fn o_direct_flushes_write_the_aligned_middle_directly_and_read_back_exact() {
    let f = fixture(true);
    let mut s = f.sink(f.replica(5)).unwrap();
    if !s.uses_direct_io() {
        eprintln!("this file system refuses O_DIRECT; the test checks the fallback only");
    }
    let d = data(2 * MIB + 777);
    put(&mut s, &d, 0, 700);
    s.sync().unwrap();
    for off in (512..d.len()).step_by(65_536) {
        put(&mut s, &d, off, (off + 65_536).min(d.len()));
    }
    s.sync().unwrap();
    assert_files(&f, 5, &d);
    if s.uses_direct_io() {
        assert!(f.metrics.direct_io_bytes.get() >= MIB as u64);
    }
}

#[test]
fn release_is_idempotent_and_gives_back_buffer_and_permit() {
    let f = fixture(false);
    let mut s = f.sink(f.replica(6)).unwrap();
    assert_eq!(f.buffers.available_permits(), Some(1));
    assert_eq!(f.metrics.buffered_replicas.get(), 1);
    put(&mut s, &data(1000), 0, 1000);
    s.release();
    s.release();
    assert_eq!(f.buffers.available_permits(), Some(2));
    assert_eq!(f.buffers.idle_buffers(), 1);
    assert_eq!(f.metrics.buffered_replicas.get(), 0);
    assert!(s.write(1000, b"x", &checksum::compute(b"x", 512)).is_err());
    drop(s);
    assert_eq!(f.metrics.buffered_replicas.get(), 0, "drop after release");
}

#[test]
fn a_failed_construction_gives_back_its_permit_and_buffer() {
    let f = fixture(true);
    let r = f.replica(7);
    std::fs::remove_file(r.entry.block_path()).unwrap();
    let err = f.sink(r).unwrap_err();
    assert!(err.to_string().contains("O_DIRECT"), "{err}");
    assert_eq!(f.buffers.available_permits(), Some(2), "permit back");
    assert_eq!(f.buffers.idle_buffers(), 1, "buffer back in the pool");
    assert_eq!(f.metrics.buffered_replicas.get(), 0);
    assert_eq!(f.metrics.buffered_replicas_created.get(), 0);
}
