//! The buffered sink of write-memory batching (HDFS-17973, upstream's `BufferedBlockWriter`):
//! a replica's packets are gathered in one pooled, aligned buffer and written to the block file
//! in large sequential flushes.
//!
//! A flush happens when the buffer is full, on the idle-flush timer (`Flush`), on hsync, at the
//! end of the block, and when the pipeline ends early (`Stop`). `bytes_on_disk` is raised only
//! by a flush, so the replica's visible length (`min(acked, on disk)`) never passes the bytes in
//! the block file.
//!
//! **Layout.** The buffer holds the bytes after `on_disk`; its index `i` is block offset
//! `round_down(on_disk, 4096) + i`, so a 4096-aligned block offset sits at a 4096-aligned
//! address. That is what O_DIRECT needs: with `write.o.direct.enabled` a flush writes its
//! aligned middle with O_DIRECT straight from the buffer, and its unaligned head and tail
//! through the page cache (upstream's fork does the same).
//!
//! **Checksums.** The checksums of the buffered chunks wait beside the data, from the chunk
//! holding `on_disk` on. A packet after an hflush restarts at the chunk the hflush ended in:
//! its checksums replace the waiting ones, so the partial chunk's CRC is rewritten. A flush
//! ends where a packet ended, where the waiting checksum covers exactly the bytes flushed;
//! a packet larger than the whole buffer goes straight to the file after a flush.
//!
//! **Crash-safety order** of a flush, as for the direct sink: data to the block file, then
//! the checksums to the metadata file, then `bytes_on_disk` rises. A failed flush keeps the
//! buffer; a later flush rewrites the same bytes at the same offsets.
//!
//! **Release** (idempotent, never flushes): drops the pages of the block file from the page
//! cache when `write.buffer.drop.behind` is on (upstream's release does), closes the files,
//! returns the buffer to the pool and then its memory permit.

use super::buffer_pool::{BufferLease, PooledBuffer, WriteBuffers, DIRECT_IO_ALIGN};
use super::sink::ReplicaSink;
use crate::error::{DatanodeError, IoContext, Result};
use crate::failpoint::{FailAction, FailScope};
use crate::metrics::{Gauge, Metrics};
use crate::storage::dataset::OpenReplica;
use crate::storage::meta::MetaHeader;
use crate::sys::Advice;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Writes packets through a pooled memory buffer.
#[derive(Debug)]
pub struct BufferedSink {
    block: Option<File>,
    meta: Option<File>,
    /// The block file opened with O_DIRECT (`write.o.direct.enabled`).
    direct: Option<File>,
    block_path: PathBuf,
    meta_path: PathBuf,
    bpc: u64,
    volume: usize,
    /// Bytes in the block file.
    on_disk: u64,
    buf: Option<PooledBuffer>,
    owner: Arc<WriteBuffers>,
    /// Index in `buf` of block offset `on_disk`.
    start: usize,
    /// Bytes buffered after `on_disk`.
    len: usize,
    /// Checksums of chunks `sums_first..` not yet in the metadata file.
    sums: Vec<u8>,
    sums_first: u64,
    /// Block offset up to which pages were dropped behind.
    dropped_to: u64,
    metrics: Arc<Metrics>,
    scope: FailScope,
    released: bool,
}

impl BufferedSink {
    /// A buffered sink over a new replica, holding `lease`'s permit. The buffer comes from
    /// the pool (allocated if none is idle). On failure the buffer and the permit go back.
    pub fn new(
        replica: OpenReplica,
        lease: BufferLease,
        metrics: Arc<Metrics>,
        scope: FailScope,
    ) -> Result<BufferedSink> {
        let owner = lease.owner().clone();
        let block_path = replica.entry.block_path();
        let buf = lease.into_buffer().ok_or_else(|| {
            DatanodeError::io(
                "allocate a write buffer for",
                &block_path,
                std::io::ErrorKind::OutOfMemory.into(),
            )
        })?;
        let direct = if owner.settings().o_direct {
            crate::sys::open_direct(&block_path, crate::sys::DirectFor::Write)?
        } else {
            None
        };
        let on_disk = replica.entry.live.bytes_on_disk();
        let bpc = replica.header.bytes_per_checksum as u64;
        metrics.buffered_replicas.inc();
        metrics.buffered_replicas_created.inc();
        Ok(BufferedSink {
            meta_path: replica.entry.meta_path(),
            volume: replica.entry.volume,
            block: Some(replica.block),
            meta: Some(replica.meta),
            direct,
            block_path,
            bpc,
            on_disk,
            buf: Some(buf),
            owner,
            start: (on_disk % DIRECT_IO_ALIGN as u64) as usize,
            len: 0,
            sums: Vec::new(),
            sums_first: on_disk / bpc,
            dropped_to: 0,
            metrics,
            scope,
            released: false,
        })
    }

    /// True when flushes use O_DIRECT.
    pub fn uses_direct_io(&self) -> bool {
        self.direct.is_some()
    }

    /// Free room in the buffer.
    fn room(&self) -> usize {
        let cap = self.buf.as_ref().map_or(0, |b| b.bytes().len());
        cap.saturating_sub(self.start + self.len)
    }

    fn released_error() -> DatanodeError {
        DatanodeError::invalid("the replica sink was already released")
    }

    /// Appends new data bytes to the buffer (the caller checked the room).
    fn append(&mut self, fresh: &[u8]) -> Result<()> {
        let at = self.start + self.len;
        let buf = self.buf.as_mut().ok_or_else(Self::released_error)?;
        let dst = buf
            .bytes_mut()
            .get_mut(at..at + fresh.len())
            .ok_or_else(|| DatanodeError::invalid("write buffer overrun"))?;
        dst.copy_from_slice(fresh);
        self.len += fresh.len();
        Ok(())
    }

    /// Merges a packet's checksums (chunk `offset / bpc` on) into the waiting ones. `held`
    /// is the bytes received before the packet.
    fn merge_sums(&mut self, offset: u64, data_len: u64, sums: &[u8], held: u64) -> Result<()> {
        const W: usize = sluice_common::checksum::CHECKSUM_SIZE;
        let mut sums = sums;
        let end = offset + data_len;
        if end < held && !end.is_multiple_of(self.bpc) {
            // A resend ending inside a chunk this sink holds more of: its last checksum
            // covers fewer bytes than are held, so it is not used.
            sums = &sums[..sums.len().saturating_sub(W)];
        }
        let mut first = offset / self.bpc;
        if first < self.sums_first {
            // Chunks wholly in the file already: their checksums are there too.
            let skip = ((self.sums_first - first) as usize).saturating_mul(W);
            sums = sums.get(skip..).unwrap_or(&[]);
            first = self.sums_first;
        }
        if sums.is_empty() {
            return Ok(());
        }
        let pos = ((first - self.sums_first) as usize) * W;
        if pos > self.sums.len() {
            return Err(DatanodeError::invalid(format!(
                "checksums from chunk {first} leave a gap after chunk {}",
                self.sums_first + (self.sums.len() / W) as u64
            )));
        }
        let overlap = (self.sums.len() - pos).min(sums.len());
        self.sums[pos..pos + overlap].copy_from_slice(&sums[..overlap]);
        self.sums.extend_from_slice(&sums[overlap..]);
        Ok(())
    }

    fn failpoint(&self, name: &'static str) -> Result<()> {
        match self.scope.check(name) {
            None => Ok(()),
            Some(a) => Err(DatanodeError::Failpoint {
                name,
                drop: a == FailAction::Drop,
            }),
        }
    }

    /// Runs `f` inside the volume's flush budget, counting flushes in progress.
    fn gated<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let owner = self.owner.clone();
        let metrics = self.metrics.clone();
        let permit = owner.flush_gate(self.volume).map(|g| {
            let (p, waited) = g.enter();
            if waited {
                metrics.flush_permit_waits.inc();
            }
            p
        });
        let running = Running::new(&metrics.flushes_in_progress);
        metrics
            .flushes_in_progress_peak
            .raise_to(metrics.flushes_in_progress.get());
        let r = f(self);
        drop(running);
        drop(permit);
        r
    }

    /// Writes the buffer and the waiting checksums to the files (one flush).
    fn flush_buffer(&mut self) -> Result<()> {
        if self.len == 0 && self.sums.is_empty() {
            return Ok(());
        }
        if self.released {
            return Err(Self::released_error());
        }
        self.failpoint("dn::flush")?;
        let from = self.on_disk;
        let end = from + self.len as u64;
        let started = Instant::now();
        self.gated(|s| {
            s.write_buffer()?;
            s.write_sums()
        })?;
        self.metrics.flush_seconds.observe(started.elapsed());
        self.metrics.buffer_flushes.inc();
        self.advance(end);
        self.drop_behind_after_flush(from);
        Ok(())
    }

    /// The buffered bytes to the block file: with O_DIRECT, the aligned middle straight from
    /// the buffer and the unaligned head and tail through the page cache.
    fn write_buffer(&mut self) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let (from, end) = (self.on_disk, self.on_disk + self.len as u64);
        let align = DIRECT_IO_ALIGN as u64;
        let (a0, a1) = (from.div_ceil(align) * align, end / align * align);
        let Some(buf) = self.buf.as_ref() else {
            return Err(Self::released_error());
        };
        let bytes = buf.bytes();
        let base = from - self.start as u64;
        let slice = |a: u64, b: u64| &bytes[(a - base) as usize..(b - base) as usize];
        let block = self.block.as_ref().ok_or_else(Self::released_error)?;
        let m = &self.metrics;
        let path = &self.block_path;
        match &self.direct {
            Some(direct) if a1 > a0 => {
                pwrite_all(block, slice(from, a0), from, m).ctx("write", path)?;
                match pwrite_all(direct, slice(a0, a1), a0, m) {
                    Ok(()) => m.direct_io_bytes.add(a1 - a0),
                    Err(e) if crate::sys::refuses_direct_io(&e) => {
                        tracing::warn!(path = %path.display(), "O_DIRECT write refused (EINVAL): flushing through the page cache from now on");
                        pwrite_all(block, slice(a0, a1), a0, m).ctx("write", path)?;
                        self.direct = None;
                    }
                    Err(e) => return Err(DatanodeError::io("write (O_DIRECT)", path, e)),
                }
                pwrite_all(block, slice(a1, end), a1, m).ctx("write", path)?;
            }
            _ => pwrite_all(block, slice(from, end), from, m).ctx("write", path)?,
        }
        let n = end - from;
        m.bytes_written.add(n);
        m.buffered_bytes_written.add(n);
        Ok(())
    }

    /// The waiting checksums to the metadata file.
    fn write_sums(&mut self) -> Result<()> {
        if self.sums.is_empty() {
            return Ok(());
        }
        let meta = self.meta.as_ref().ok_or_else(Self::released_error)?;
        let pos = MetaHeader::checksum_pos(self.sums_first);
        super::sink::write_all_at(meta, &self.sums, pos, &self.metrics.meta_file_writes)
            .ctx("write", &self.meta_path)
    }

    /// Everything up to `end` is in the files: empty the buffer.
    fn advance(&mut self, end: u64) {
        self.on_disk = end;
        self.len = 0;
        self.start = (end % DIRECT_IO_ALIGN as u64) as usize;
        self.sums.clear();
        self.sums_first = end / self.bpc;
    }

    /// A packet larger than the whole buffer (the buffer was just flushed): straight to the
    /// files, under the flush budget.
    fn write_through(&mut self, offset: u64, data: &[u8], sums: &[u8]) -> Result<()> {
        let held = self.on_disk;
        let skip = (held - offset) as usize;
        self.merge_sums(offset, data.len() as u64, sums, held)?;
        self.failpoint("dn::flush")?;
        let end = offset + data.len() as u64;
        let started = Instant::now();
        self.gated(|s| {
            let block = s.block.as_ref().ok_or_else(Self::released_error)?;
            pwrite_all(block, &data[skip..], held, &s.metrics).ctx("write", &s.block_path)?;
            s.metrics.bytes_written.add(end - held);
            s.metrics.buffered_bytes_written.add(end - held);
            s.write_sums()
        })?;
        self.metrics.flush_seconds.observe(started.elapsed());
        self.metrics.buffer_flushes.inc();
        self.advance(end);
        self.drop_behind_after_flush(held);
        Ok(())
    }

    /// After a flush that began at `from`: drops the pages of the earlier flushes, which the
    /// kernel has had a buffer's time to write back (dirty pages are only queued for
    /// writeback, never dropped).
    fn drop_behind_after_flush(&mut self, from: u64) {
        if !self.owner.settings().drop_behind {
            return;
        }
        let upto = from;
        if upto > self.dropped_to {
            if let Some(b) = &self.block {
                crate::sys::fadvise(b, self.dropped_to, upto - self.dropped_to, Advice::DontNeed);
                self.metrics
                    .write_dropbehind_bytes
                    .add(upto - self.dropped_to);
            }
            self.dropped_to = upto;
        }
    }
}

impl ReplicaSink for BufferedSink {
    fn write(&mut self, offset: u64, data: &[u8], checksums: &[u8]) -> Result<()> {
        let held = self.bytes_received();
        if !offset.is_multiple_of(self.bpc) || offset > held {
            return Err(DatanodeError::invalid(format!(
                "packet at offset {offset}: not a chunk boundary or past the {held} bytes held"
            )));
        }
        if self.released {
            return Err(Self::released_error());
        }
        let skip = (held - offset).min(data.len() as u64) as usize;
        let fresh = &data[skip..];
        if fresh.len() > self.room() {
            self.flush_buffer()?;
            if fresh.len() > self.room() {
                return self.write_through(offset, data, checksums);
            }
        }
        self.append(fresh)?;
        self.merge_sums(offset, data.len() as u64, checksums, held)?;
        if self.room() == 0 {
            self.flush_buffer()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        self.flush_buffer()
    }

    fn sync(&mut self) -> Result<()> {
        self.flush_buffer()?;
        let (Some(block), Some(meta)) = (&self.block, &self.meta) else {
            return Err(Self::released_error());
        };
        let _t = self.metrics.fsync_seconds.start_timer();
        block.sync_data().ctx("fdatasync", &self.block_path)?;
        meta.sync_data().ctx("fdatasync", &self.meta_path)?;
        self.metrics.fsyncs.add(2);
        Ok(())
    }

    fn bytes_received(&self) -> u64 {
        self.on_disk + self.len as u64
    }

    fn bytes_on_disk(&self) -> u64 {
        self.on_disk
    }

    fn pending(&self) -> bool {
        self.len > 0 || !self.sums.is_empty()
    }

    fn writes_in_memory(&self, len: usize) -> bool {
        // A copy into the buffer that leaves room: no flush before or after it.
        !self.released && len < self.room()
    }

    fn is_buffered(&self) -> bool {
        true
    }

    fn release(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        if self.owner.settings().drop_behind && self.on_disk > self.dropped_to {
            if let Some(b) = &self.block {
                // Offset 0, length 0: the whole file.
                crate::sys::fadvise(b, 0, 0, Advice::DontNeed);
                self.metrics
                    .write_dropbehind_bytes
                    .add(self.on_disk - self.dropped_to);
            }
        }
        self.direct = None;
        self.block = None;
        self.meta = None;
        // The buffer goes back to the pool, then its permit is released.
        self.buf = None;
        self.metrics.buffered_replicas.dec();
    }
}

impl Drop for BufferedSink {
    fn drop(&mut self) {
        self.release();
    }
}

/// Counts a flush in progress while alive.
struct Running<'a>(&'a Gauge);

impl<'a> Running<'a> {
    fn new(g: &'a Gauge) -> Self {
        g.inc();
        Running(g)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// `pwrite`s all of `buf` at `pos`, counting every call as a block-file write of a buffered
/// replica.
fn pwrite_all(file: &File, buf: &[u8], pos: u64, m: &Metrics) -> std::io::Result<()> {
    crate::sys::write_all_at(file, buf, pos, || {
        m.block_file_writes.inc();
        m.buffered_block_file_writes.inc();
    })
}
