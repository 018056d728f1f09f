//! Where a replica writer's bytes go: the [`ReplicaSink`] abstraction and the direct sink.
//!
//! A sink receives each packet as it arrived (`offset` on a checksum-chunk boundary, at most
//! the bytes it already holds) and is responsible for writing only the bytes it does not hold
//! yet and *all* the packet's checksums — so that after an hflush that ended inside a chunk, the
//! resent chunk's checksum replaces the partial one. The direct sink writes every packet with
//! positional writes as it arrives. The buffered sink of write-memory batching (HDFS-17973,
//! [`super::buffered_sink::BufferedSink`]) implements the same trait: it holds packets in a pooled
//! buffer and writes them in large sequential flushes, with `bytes_on_disk` lagging behind
//! `bytes_received` until a flush.
//!
//! Crash-safety order of the direct sink: per packet, the new data bytes go to the block file,
//! then the packet's checksums to the meta file, then `bytes_on_disk` rises (a crash in between
//! leaves checksums behind the data, which the start-up scan trims to what verifies). `sync`
//! fdatasyncs the block file, then the meta file; only then is an hsync packet acknowledged.

use crate::error::{DatanodeError, IoContext, Result};
use crate::metrics::Metrics;
use crate::storage::dataset::OpenReplica;
use crate::storage::meta::MetaHeader;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

/// The storage side of a replica writer. Every method blocks on disk I/O.
pub trait ReplicaSink: Send {
    /// Takes a packet: `data` starts at block offset `offset` (a chunk boundary, at most
    /// [`ReplicaSink::bytes_received`]); `checksums` are the CRCs of its chunks.
    fn write(&mut self, offset: u64, data: &[u8], checksums: &[u8]) -> Result<()>;
    /// Hands everything received to the files (no fsync).
    fn flush(&mut self) -> Result<()>;
    /// Flushes, then makes everything received durable (fdatasync block and metadata file).
    fn sync(&mut self) -> Result<()>;
    /// Bytes received so far (the next packet continues here).
    fn bytes_received(&self) -> u64;
    /// Bytes in the block file (never more than received; readers see at most this).
    fn bytes_on_disk(&self) -> u64;
    /// True when bytes or checksums wait in memory for a flush (the idle timer skips the
    /// flush otherwise).
    fn pending(&self) -> bool {
        self.bytes_received() > self.bytes_on_disk()
    }
    /// True for a sink that batches in memory.
    fn is_buffered(&self) -> bool {
        false
    }
    /// True when taking a packet of `len` bytes only copies memory — into the page cache or
    /// the sink's buffer — with no flush, fsync or direct I/O that waits for the disk: the
    /// receiver then writes it on its own task instead of handing it to another thread.
    fn writes_in_memory(&self, _len: usize) -> bool {
        false
    }
    /// Frees files, buffers and permits. Idempotent; never flushes.
    fn release(&mut self);
}

/// Writes each packet straight to the block and metadata files with positional writes.
#[derive(Debug)]
pub struct DirectSink {
    files: Option<(File, File)>,
    block_path: PathBuf,
    meta_path: PathBuf,
    bpc: u64,
    on_disk: u64,
    metrics: Arc<Metrics>,
}

impl DirectSink {
    /// A sink over an open replica, continuing at its bytes on disk.
    pub fn new(replica: OpenReplica, metrics: Arc<Metrics>) -> DirectSink {
        DirectSink {
            block_path: replica.entry.block_path(),
            meta_path: replica.entry.meta_path(),
            bpc: replica.header.bytes_per_checksum as u64,
            on_disk: replica.entry.live.bytes_on_disk(),
            files: Some((replica.block, replica.meta)),
            metrics,
        }
    }

    fn files(&self) -> Result<&(File, File)> {
        self.files
            .as_ref()
            .ok_or_else(|| DatanodeError::invalid("the replica sink was already released"))
    }
}

/// `pwrite`s all of `buf` at `pos`, counting each call.
pub(crate) fn write_all_at(
    file: &File,
    buf: &[u8],
    pos: u64,
    calls: &crate::metrics::Counter,
) -> std::io::Result<()> {
    crate::sys::write_all_at(file, buf, pos, || calls.inc())
}

impl ReplicaSink for DirectSink {
    fn write(&mut self, offset: u64, data: &[u8], checksums: &[u8]) -> Result<()> {
        if !offset.is_multiple_of(self.bpc) || offset > self.on_disk {
            return Err(DatanodeError::invalid(format!(
                "packet at offset {offset}: not a chunk boundary or past the {} bytes held",
                self.on_disk
            )));
        }
        let end = offset + data.len() as u64;
        let skip = (self.on_disk - offset).min(data.len() as u64) as usize;
        let (block, meta) = self.files()?;
        let m = &self.metrics;
        if skip < data.len() {
            write_all_at(block, &data[skip..], self.on_disk, &m.block_file_writes)
                .ctx("write", &self.block_path)?;
            m.bytes_written.add((data.len() - skip) as u64);
        }
        if !checksums.is_empty() {
            let pos = MetaHeader::checksum_pos(offset / self.bpc);
            write_all_at(meta, checksums, pos, &m.meta_file_writes)
                .ctx("write", &self.meta_path)?;
        }
        self.on_disk = self.on_disk.max(end);
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        let (block, meta) = self.files()?;
        let _t = self.metrics.fsync_seconds.start_timer();
        block.sync_data().ctx("fdatasync", &self.block_path)?;
        meta.sync_data().ctx("fdatasync", &self.meta_path)?;
        self.metrics.fsyncs.add(2);
        Ok(())
    }

    fn bytes_received(&self) -> u64 {
        self.on_disk
    }

    fn bytes_on_disk(&self) -> u64 {
        self.on_disk
    }

    fn writes_in_memory(&self, _len: usize) -> bool {
        // Buffered positional writes: a copy into the page cache (writeback is the kernel's).
        self.files.is_some()
    }

    fn release(&mut self) {
        self.files = None;
    }
}
