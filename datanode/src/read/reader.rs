//! The `BlockReader`: one per streaming read (`ReadBlock`), a plain tokio task, not an actor —
//! it takes no messages: it is given its range when it starts, sends pieces down one channel
//! and stops when the range ends, a read fails, or the consumer goes away. The connection task
//! that serves the `ReadBlock` spawns it and holds its handle, so the reader never outlives the
//! connection (dropping the handle aborts it).
//!
//! It owns the replica's block and metadata files, opened once, and a [`PieceSource`] that cuts
//! the range into aligned pieces with their stored checksums. The task only drives: each piece
//! is read on the blocking pool (never on a runtime thread) into a buffer of the stream's
//! [`ReadWindow`] and handed to the connection task through the channel.
//!
//! **Prefetch.** While the connection task writes one piece to the socket, the reader goes on
//! reading the next ones, up to the window (`read.prefetch.bytes` of pieces; see
//! [`super::window`]), and before each read tells the kernel what comes after it
//! (`posix_fadvise(WILLNEED)` over the next `read.prefetch.bytes`, see [`super::prefetch`]).
//! So the disk works on the next window while the network carries the current piece, even when
//! nothing is in the page cache. With `read.prefetch.bytes = 0` the window is one piece: read,
//! send, read the next — no overlap, no advice — which is what the benchmark compares with.
//!
//! TCP backpressure paces the whole stream: a slow reader fills the socket, the connection task
//! waits, the window fills, and the reader waits for a slot. When the connection task goes away
//! the channel closes and the reader stops.

use super::prefetch::Prefetcher;
use super::range::{
    file_piece, payload_len, read_piece_cached, read_piece_direct, read_piece_into, FilePiece,
    Piece,
};
use super::window::{ReadWindow, WindowPiece};
use crate::error::{DatanodeError, Result};
use crate::metrics::Metrics;
use crate::storage::dataset::ReadReplica;
use crate::sys::{fadvise, Advice};
use bytes::BytesMut;
use sluice_common::proto::ReplicaState;
use std::fs::File;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

/// Cuts `[start, end)` of a replica into pieces, advising the kernel ahead of each read.
#[derive(Debug)]
pub struct PieceSource {
    replica: ReadReplica,
    /// The block file again, shared with the advice issued off this thread.
    advice_file: Arc<File>,
    next: u64,
    end: u64,
    piece: u64,
    stored_len: u64,
    prefetch: Prefetcher,
    metrics: Arc<Metrics>,
    /// The block file opened with O_DIRECT (`read.o.direct.enabled`), for pieces not cached.
    direct: Option<File>,
}

impl PieceSource {
    /// Pieces of `piece` bytes over `[start, end)`; `start` and `piece` are chunk-aligned.
    pub fn new(
        replica: ReadReplica,
        start: u64,
        end: u64,
        piece: u64,
        prefetch: Prefetcher,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let stored_len = replica.entry.live.bytes_on_disk();
        // A ranged read — one that ends before the replica does, as a positioned read — reads
        // exactly its range from disk: the kernel's read-ahead on this open file (an initial
        // window twice the request, then asynchronous windows, 8 MiB on the benchmark
        // machine's disk) would read past `end`, bytes nobody asked for, each costing disk
        // time on a real disk. The stream's own prefetch, bounded by the range, stands in.
        // A read to the end of the replica keeps the kernel's read-ahead (it stops at EOF).
        let mut prefetch = prefetch;
        if end < stored_len {
            fadvise(&replica.block, 0, 0, Advice::Random);
            prefetch = prefetch.within_range();
        }
        let advice_file = replica
            .block
            .try_clone()
            .map_err(|e| DatanodeError::io("dup", &replica.block_path, e))?;
        Ok(PieceSource {
            advice_file: Arc::new(advice_file),
            replica,
            next: start,
            end,
            piece: piece.max(1),
            stored_len,
            prefetch,
            metrics,
            direct: None,
        })
    }

    /// Reads the pieces that are not in the page cache with O_DIRECT
    /// (`read.o.direct.enabled`): a finalized replica on a file system that takes it, read
    /// from an aligned offset. Elsewhere (a replica being written, whose newest bytes may sit
    /// in the page cache only; a range starting off a 4 KiB boundary) the pieces go through
    /// the page cache as before.
    pub fn with_direct_reads(mut self) -> Result<Self> {
        let aligned = self.next.is_multiple_of(crate::sys::DIRECT_IO_ALIGN as u64)
            && self
                .piece
                .is_multiple_of(crate::sys::DIRECT_IO_ALIGN as u64);
        if aligned && self.replica.entry.state == ReplicaState::Finalized {
            self.direct =
                crate::sys::open_direct(&self.replica.block_path, crate::sys::DirectFor::Read)?;
        }
        Ok(self)
    }

    /// Payload bytes (checksums and data) of the next piece; `None` at the end of the range.
    pub fn next_payload_len(&self) -> Option<usize> {
        if self.next >= self.end {
            return None;
        }
        let len = self.piece.min(self.end - self.next) as usize;
        Some(payload_len(&self.replica, len))
    }

    /// Reads the next piece into `buf` (blocking); `None` at the end of the range.
    pub fn next_piece_into(&mut self, buf: BytesMut) -> Result<Option<Piece>> {
        if self.next >= self.end {
            return Ok(None);
        }
        let Some(direct) = &self.direct else {
            self.prefetch
                .before_read(&self.advice_file, self.next, &self.metrics);
            return self.next_piece_unadvised(buf);
        };
        // No advice: WILLNEED would read the range into the page cache, and the read below
        // would then read it from the disk a second time.
        let len = self.piece.min(self.end - self.next);
        let p = read_piece_direct(
            &self.replica,
            direct,
            self.next,
            len as usize,
            self.stored_len,
            buf,
        )?;
        self.next += len;
        self.metrics.stream_pieces_read.inc();
        self.metrics.stream_pieces_direct.inc();
        Ok(Some(p))
    }

    /// As [`Self::next_piece_into`], without advising the kernel ahead: for a hole in a cached
    /// range, whose pieces after it need no read-ahead.
    pub fn next_piece_unadvised(&mut self, buf: BytesMut) -> Result<Option<Piece>> {
        if self.next >= self.end {
            return Ok(None);
        }
        let len = self.piece.min(self.end - self.next);
        let p = read_piece_into(&self.replica, self.next, len as usize, self.stored_len, buf)?;
        self.next += len;
        self.metrics.stream_pieces_read.inc();
        self.prefetch
            .after_read(&self.replica.block, self.next, &self.metrics);
        Ok(Some(p))
    }

    /// The next piece as a [`FilePiece`] to send from the block file (with `sendfile` or from
    /// a mapping), for a caller that found its data whole in the page cache
    /// ([`Self::next_piece_cache_state`]); `Err(sums)` when it cannot be sent that way (its
    /// checksums not cached, a partial last chunk stored longer), with nothing consumed.
    pub fn next_file_piece(&mut self, sums: BytesMut) -> std::result::Result<FilePiece, BytesMut> {
        if self.next >= self.end {
            return Err(sums);
        }
        let len = self.piece.min(self.end - self.next);
        self.prefetch
            .before_read(&self.advice_file, self.next, &self.metrics);
        let p = file_piece(
            &self.replica,
            self.next,
            len as usize,
            self.stored_len,
            sums,
        )?;
        self.next += len;
        self.metrics.stream_pieces_read.inc();
        self.metrics.stream_pieces_cached.inc();
        Ok(p)
    }

    /// Drops the pages behind the read position (`read.ahead.cache.bytes.threshold`); for
    /// pieces sent from the block file, called once the piece is on its way (and, from a
    /// mapping, unmapped: the kernel keeps mapped pages).
    pub fn drop_behind(&mut self) {
        self.prefetch
            .after_read(&self.replica.block, self.next, &self.metrics);
    }

    /// Where the range ends.
    pub fn range_end(&self) -> u64 {
        self.end
    }

    /// The block offset and data bytes of the next piece (no bytes at the end of the range).
    pub fn next_range(&self) -> (u64, usize) {
        (
            self.next,
            self.piece.min(self.end.saturating_sub(self.next)) as usize,
        )
    }

    /// Whether the next piece's data is whole in the page cache, by `cachestat`: `None` at the
    /// end of the range or when the kernel cannot tell. Asks without reading, so it starts no
    /// read-ahead.
    pub fn next_piece_cache_state(&self) -> Option<bool> {
        let (at, len) = self.next_range();
        if len == 0 {
            return None;
        }
        crate::sys::cached_pages(&self.replica.block, at, len as u64)
            .map(|(cached, pages)| cached >= pages)
    }

    /// True if the piece after the next one is whole in the page cache (`cachestat`): the next
    /// piece, if not cached, is then a hole in a cached range. False when there is no such
    /// piece or the kernel cannot tell.
    pub fn following_piece_cached(&self) -> bool {
        let after = self.next.saturating_add(self.piece);
        if after >= self.end {
            return false;
        }
        let len = self.piece.min(self.end - after);
        crate::sys::cached_pages(&self.replica.block, after, len)
            .is_some_and(|(cached, pages)| cached >= pages)
    }

    /// The path of the replica's block file, for errors.
    pub fn block_path(&self) -> &std::path::Path {
        &self.replica.block_path
    }

    /// The replica's block file (what `sendfile` sends from, and what is mapped).
    pub fn block_file(&self) -> &File {
        &self.replica.block
    }

    /// Reads the next piece only if it is all in the page cache (no disk wait, so the
    /// connection task may call it on its runtime thread); `Err(buf)` when it is not, or the
    /// range has ended, with nothing consumed: the blocking [`Self::next_piece_into`] reads it.
    pub fn next_piece_cached(&mut self, buf: BytesMut) -> std::result::Result<Piece, BytesMut> {
        if self.next >= self.end {
            return Err(buf);
        }
        let len = self.piece.min(self.end - self.next);
        self.prefetch
            .before_read(&self.advice_file, self.next, &self.metrics);
        let p = read_piece_cached(&self.replica, self.next, len as usize, self.stored_len, buf)?;
        self.next += len;
        self.metrics.stream_pieces_read.inc();
        self.metrics.stream_pieces_cached.inc();
        self.prefetch
            .after_read(&self.replica.block, self.next, &self.metrics);
        Ok(p)
    }
}

/// What the reader hands the connection: a piece holding its window slot, or the error that
/// ended the stream.
pub type ReaderItem = Result<WindowPiece>;

/// One streaming read's reader task: what it reads, where the pieces go, and where the disk
/// reads run.
#[derive(Debug)]
pub struct BlockReader {
    source: PieceSource,
    window: Arc<ReadWindow>,
    out: mpsc::Sender<ReaderItem>,
    io: tokio::runtime::Handle,
}

impl BlockReader {
    /// A reader sending pieces of `source`, read into `window`'s buffers, to `out`; disk reads
    /// run on `io`'s blocking pool.
    pub fn new(
        source: PieceSource,
        window: Arc<ReadWindow>,
        out: mpsc::Sender<ReaderItem>,
        io: tokio::runtime::Handle,
    ) -> Self {
        BlockReader {
            source,
            window,
            out,
            io,
        }
    }

    /// Spawns [`BlockReader::run`] on `io`; dropping the handle stops the reader.
    pub fn spawn(self) -> AbortOnDropHandle<()> {
        let io = self.io.clone();
        AbortOnDropHandle::new(io.spawn(self.run()))
    }

    /// Reads pieces into the window until the range ends, a read fails, or the consumer
    /// leaves.
    pub async fn run(self) {
        let BlockReader {
            mut source,
            window,
            out,
            io,
        } = self;
        while let Some(size) = source.next_payload_len() {
            let slot = tokio::select! {
                biased;
                _ = out.closed() => return,
                s = window.slot() => match s {
                    Ok(s) => s,
                    Err(_) => return,
                },
            };
            let buf = window.buffer(size);
            let job = io.spawn_blocking(move || {
                let r = source.next_piece_into(buf);
                (source, r)
            });
            let (s, r) = match job.await {
                Ok(v) => v,
                Err(_) => {
                    let _ = out.send(Err(DatanodeError::ShuttingDown)).await;
                    return;
                }
            };
            source = s;
            let item = match r {
                Ok(Some(p)) => Ok(WindowPiece::new(p, Arc::clone(&window), slot)),
                Ok(None) => return,
                Err(e) => Err(e),
            };
            let failed = item.is_err();
            if out.send(item).await.is_err() || failed {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::dataset::Dataset;
    use crate::write::sink::{DirectSink, ReplicaSink};
    use sluice_common::checksum;
    use sluice_common::proto::BlockStage;
    use sluice_common::{BlockId, GenerationStamp};
    use std::time::{Duration, Instant};

    const PIECE: u64 = 4096;

    /// A finalized replica of `len` bytes of block 1; the dataset, its metrics, the bytes.
    fn replica(dir: &std::path::Path, len: usize) -> (Dataset, Arc<Metrics>, Vec<u8>) {
        let m = Arc::new(Metrics::default());
        let ds = Dataset::open(&[dir.to_path_buf()], m.clone()).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let r = ds
            .create(BlockId(1), GenerationStamp(1), 512, BlockStage::Create)
            .unwrap();
        let live = r.entry.live.clone();
        let mut sink = DirectSink::new(r, m.clone());
        sink.write(0, &data, &checksum::compute(&data, 512))
            .unwrap();
        sink.sync().unwrap();
        live.set_bytes_on_disk(len as u64);
        ds.finalize(BlockId(1), &live, len as u64, BlockStage::Create)
            .unwrap();
        (ds, m, data)
    }

    fn start(
        ds: &Dataset,
        m: &Arc<Metrics>,
        len: u64,
        ahead: usize,
    ) -> (Arc<ReadWindow>, mpsc::Receiver<ReaderItem>) {
        let r = ds.open_read(BlockId(1)).unwrap();
        let prefetch = Prefetcher::new(0, len, ahead as u64 * PIECE, PIECE, u64::MAX);
        let source = PieceSource::new(r, 0, len, PIECE, prefetch, m.clone()).unwrap();
        let window = ReadWindow::new(ahead);
        let (tx, rx) = mpsc::channel(ahead + 1);
        let io = tokio::runtime::Handle::current();
        tokio::spawn(BlockReader::new(source, Arc::clone(&window), tx, io).run());
        (window, rx)
    }

    async fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "not reached: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn drain(rx: &mut mpsc::Receiver<ReaderItem>, out: &mut Vec<u8>) {
        while let Some(item) = rx.recv().await {
            let held = item.unwrap();
            let p = held.piece().unwrap();
            assert_eq!(p.offset, out.len() as u64);
            out.extend_from_slice(&p.data());
        }
    }

    #[tokio::test]
    async fn prefetch_reads_the_window_ahead_while_a_piece_is_on_the_wire() {
        tokio::time::timeout(Duration::from_secs(20), async {
            let dir = tempfile::tempdir().unwrap();
            let len = 10 * PIECE as usize + 100;
            let (ds, m, data) = replica(dir.path(), len);
            let (window, mut rx) = start(&ds, &m, len as u64, 3);
            let first = rx.recv().await.unwrap().unwrap();
            // While the first piece is "on the wire" (held), three more are read from disk.
            wait_for("three pieces read ahead", || {
                m.stream_pieces_read.get() == 4
            })
            .await;
            assert_eq!(
                window.free_slots(),
                0,
                "the window is full: the reader waits"
            );
            assert_eq!(m.stream_pieces_read.get(), 4);
            let mut got = first.piece().unwrap().data().to_vec();
            drop(first);
            wait_for("one more once the first left", || {
                m.stream_pieces_read.get() == 5
            })
            .await;
            drain(&mut rx, &mut got).await;
            assert!(got == data, "the bytes streamed are the replica's");
            assert_eq!(m.stream_pieces_read.get(), 11);
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn without_prefetch_the_next_piece_is_read_only_after_the_current_one_left() {
        tokio::time::timeout(Duration::from_secs(20), async {
            let dir = tempfile::tempdir().unwrap();
            let len = 5 * PIECE as usize;
            let (ds, m, data) = replica(dir.path(), len);
            let (window, mut rx) = start(&ds, &m, len as u64, 0);
            let first = rx.recv().await.unwrap().unwrap();
            // The reader needs a slot before it reads, and the one slot is held.
            assert_eq!(window.free_slots(), 0);
            assert_eq!(m.stream_pieces_read.get(), 1);
            assert!(rx.try_recv().is_err(), "nothing read ahead");
            let mut got = first.piece().unwrap().data().to_vec();
            drop(first);
            drain(&mut rx, &mut got).await;
            assert!(got == data);
            assert_eq!(m.prefetch_advised_bytes.get(), 0, "no advice either");
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn dropping_the_handle_stops_the_reader_even_while_its_channel_is_open() {
        tokio::time::timeout(Duration::from_secs(20), async {
            let dir = tempfile::tempdir().unwrap();
            let len = 64 * PIECE as usize;
            let (ds, m, _) = replica(dir.path(), len);
            let r = ds.open_read(BlockId(1)).unwrap();
            let prefetch = Prefetcher::new(0, len as u64, 0, PIECE, u64::MAX);
            let source = PieceSource::new(r, 0, len as u64, PIECE, prefetch, m.clone()).unwrap();
            let window = ReadWindow::new(0);
            let (tx, mut rx) = mpsc::channel(1);
            let io = tokio::runtime::Handle::current();
            let handle = BlockReader::new(source, Arc::clone(&window), tx, io).spawn();
            let first = rx.recv().await.unwrap().unwrap();
            drop(handle);
            drop(first); // a slot for the next piece: only the abort keeps it from being read
                         // The task is gone, and its sender with it: the channel ends, short of the range.
            let mut more = 0;
            while let Some(item) = rx.recv().await {
                item.unwrap();
                more += 1;
            }
            assert!(more <= 1, "{more} pieces after the handle was dropped");
            assert!(m.stream_pieces_read.get() < 64, "the reader stopped early");
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_consumer_that_leaves_stops_the_reader() {
        tokio::time::timeout(Duration::from_secs(20), async {
            let dir = tempfile::tempdir().unwrap();
            let len = 64 * PIECE as usize;
            let (ds, m, _) = replica(dir.path(), len);
            let (window, mut rx) = start(&ds, &m, len as u64, 2);
            let first = rx.recv().await.unwrap().unwrap();
            drop(first);
            drop(rx);
            // Every slot comes back: pieces in the channel are dropped with it.
            wait_for("slots released", || window.free_slots() == 3).await;
            assert!(m.stream_pieces_read.get() < 64, "the reader stopped early");
        })
        .await
        .unwrap();
    }

    /// Reads `[0, end)` of the cold replica with no prefetch, then returns which pages of the
    /// whole block file are resident; `None` where the file system cannot evict (tmpfs).
    fn cold_read_then_resident(ds: &Dataset, m: &Arc<Metrics>, end: u64) -> Option<Vec<bool>> {
        let r = ds.open_read(BlockId(1)).unwrap();
        let len = r.entry.live.bytes_on_disk();
        let probe = std::fs::File::open(&r.block_path).unwrap();
        fadvise(&probe, 0, 0, Advice::DontNeed);
        if sluice_common::memory::resident_pages(&probe, len)
            .unwrap()
            .iter()
            .any(|&p| p)
        {
            return None;
        }
        let prefetch = Prefetcher::new(0, end, 0, PIECE, u64::MAX);
        let mut source = PieceSource::new(r, 0, end, PIECE, prefetch, m.clone()).unwrap();
        let mut got = 0;
        while let Some(n) = source.next_payload_len() {
            let p = source
                .next_piece_into(BytesMut::with_capacity(n))
                .unwrap()
                .unwrap();
            got += p.data().len() as u64;
        }
        assert_eq!(got, end);
        Some(sluice_common::memory::resident_pages(&probe, len).unwrap())
    }

    /// Fails without the `POSIX_FADV_RANDOM` of a ranged read: 512 pages past a 1 MiB range
    /// were read ahead on this machine's disk.
    #[test]
    fn a_ranged_read_reads_nothing_past_its_range_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let len = 16 << 20;
        let (ds, m, _) = replica(dir.path(), len);
        let end = 1 << 20;
        let Some(resident) = cold_read_then_resident(&ds, &m, end) else {
            eprintln!("skipped: the temp dir's file system keeps every page (tmpfs?)");
            return;
        };
        let page = 4096;
        let past: usize = resident[(end as usize / page)..]
            .iter()
            .filter(|&&p| p)
            .count();
        assert_eq!(past, 0, "{past} pages past the range were read ahead");
    }
}
