//! The read ops on a connection: `ReadBlock` (streaming, through a [`BlockReader`] task),
//! `ReadChunk` (classic, one chunk per request) and `ReplicaInfo`. Each answers on the
//! connection and leaves it open for the next op; an `Err` means the connection itself failed.
//!
//! Checks, per protocol.md: no replica → `ERROR_NOT_FOUND`; the request's generation stamp
//! other than the replica's → `ERROR_STALE_GENSTAMP` with the replica's stamp in the answer
//! (a reader is never served a replica other than the one it asked for: HDFS's `BlockSender`
//! serves a newer one, Sluice does not, and the reader asks the metadata service again);
//! offset at or past the visible length → `ERROR_OUT_OF_RANGE`, at once. The range starts at
//! the chunk holding `offset` and ends at `min(offset + length, visible length)`. Every
//! `Chunk` names the block and the replica's generation stamp.

use super::memory::ReadCharge;
use super::prefetch::Prefetcher;
use super::range::{file_piece_cached, payload_len, read_piece_into, FilePiece, Piece};
use super::reader::{BlockReader, PieceSource, ReaderItem};
use super::window::ReadWindow;
use crate::context::Ctx;
use crate::error::{DatanodeError, Result};
use crate::storage::dataset::ReadReplica;
use crate::sys::{fadvise, Advice};
use crate::wire::{self, FrameWriter};
use bytes::{Bytes, BytesMut};
use sluice_common::checksum;
use sluice_common::config::{PrefetchAdvice, SendfileMode};
use sluice_common::memory::FileMap;
use sluice_common::proto::{
    ChunkHeader, Message, OpResponse, ReadBlockOp, ReadChunkOp, ReadEnd, ReplicaInfo,
    ReplicaInfoOp, ReplicaState,
};
use sluice_common::{ExtendedBlock, GenerationStamp, Status};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;
use tokio_util::task::AbortOnDropHandle;

/// Room for a frame's prefix and header beside its payload.
const FRAME_SLACK: u64 = 4096;
/// Pieces read ahead of the one on the wire, at most, whatever `read.prefetch.bytes` says
/// (the kernel is still advised over the whole prefetch range).
const MAX_AHEAD_PIECES: u64 = 16;

/// A replica opened for a read, and the range to send.
struct ReadPlan {
    replica: ReadReplica,
    start: u64,
    end: u64,
    response: OpResponse,
}

impl ReadPlan {
    /// The block and generation stamp of the replica the bytes come from.
    fn source(&self) -> ExtendedBlock {
        let e = &self.replica.entry;
        ExtendedBlock::new(e.id, e.gen_stamp, 0)
    }
}

/// Why a read is refused before anything is sent.
enum ReadRefusal {
    /// The replica carries another generation stamp than the one asked for: the answer names
    /// the replica's, so that the reader knows whether to ask the metadata service again.
    OtherStamp {
        asked: GenerationStamp,
        replica: ReplicaInfo,
    },
    /// Any other refusal.
    Error(DatanodeError),
}

impl From<DatanodeError> for ReadRefusal {
    fn from(e: DatanodeError) -> Self {
        ReadRefusal::Error(e)
    }
}

async fn plan(
    ctx: &Ctx,
    block: ExtendedBlock,
    offset: u64,
    length: u64,
) -> std::result::Result<ReadPlan, ReadRefusal> {
    let ds = ctx.dataset.clone();
    let id = block.id;
    let replica = ctx.blocking(move || ds.open_read(id)).await?;
    let e = &replica.entry;
    if e.state == ReplicaState::Temporary {
        return Err(DatanodeError::ReplicaNotFound { block: id }.into());
    }
    let info = e.info();
    if e.gen_stamp != block.gen_stamp {
        return Err(ReadRefusal::OtherStamp {
            asked: block.gen_stamp,
            replica: info,
        });
    }
    let visible = info.block.num_bytes;
    if offset >= visible {
        return Err(DatanodeError::OutOfRange {
            block: id,
            offset,
            visible,
        }
        .into());
    }
    let bpc = e.bytes_per_checksum as u64;
    let mut response = OpResponse::ok();
    response.replica = Some(info);
    Ok(ReadPlan {
        start: offset / bpc * bpc,
        end: offset.saturating_add(length).min(visible),
        replica,
        response,
    })
}

async fn refuse(ctx: &Ctx, w: &mut FrameWriter, e: &DatanodeError) -> Result<()> {
    tracing::debug!("read refused: {e}");
    ctx.metrics.op_errors.inc();
    wire::respond(w, wire::error_response(e), ctx.socket_timeout()).await
}

async fn refuse_plan(ctx: &Ctx, w: &mut FrameWriter, r: ReadRefusal) -> Result<()> {
    match r {
        ReadRefusal::Error(e) => refuse(ctx, w, &e).await,
        ReadRefusal::OtherStamp { asked, replica } => {
            let block = replica.block;
            tracing::warn!(
                block = %block.id,
                node = %ctx.node_id,
                asked = %asked,
                replica = %block.gen_stamp,
                "read refused: the replica has another generation stamp"
            );
            ctx.metrics.op_errors.inc();
            ctx.metrics.read_stamp_refusals.inc();
            let msg = format!(
                "replica {} has generation stamp {}, the read asked for {asked}",
                block.id, block.gen_stamp
            );
            let mut resp = OpResponse::error(Status::ErrorStaleGenStamp, msg);
            resp.replica = Some(replica);
            wire::respond(w, resp, ctx.socket_timeout()).await
        }
    }
}

/// The header of a `Chunk` of `data_len` bytes at `offset` of `replica` (block and stamp).
fn chunk_header(replica: ExtendedBlock, offset: u64, data_len: usize, bpc: u32) -> ChunkHeader {
    ChunkHeader {
        block: replica.id,
        gen_stamp: replica.gen_stamp,
        offset,
        data_len: data_len as u32,
        bytes_per_checksum: bpc,
    }
}

async fn send_piece(
    ctx: &Ctx,
    w: &mut FrameWriter,
    p: &Piece,
    replica: ExtendedBlock,
    bpc: u32,
) -> Result<()> {
    let header = chunk_header(replica, p.offset, p.data_len(), bpc);
    let t = ctx.socket_timeout();
    wire::write_direct(w, &Message::Chunk(header), p.payload_bytes(), t).await?;
    ctx.metrics.bytes_read.add(p.data_len() as u64);
    Ok(())
}

/// Whether cached read data goes to this connection's peer with `sendfile`
/// (`read.sendfile`; `auto`: unless the peer is on this host).
fn use_sendfile(ctx: &Ctx, w: &FrameWriter) -> bool {
    match ctx.cfg.read_sendfile {
        SendfileMode::On => true,
        SendfileMode::Off => false,
        SendfileMode::Auto => w.get_ref().peer_addr().is_ok_and(|a| !a.ip().is_loopback()),
    }
}

/// How a streaming read sends the data of a piece found whole in the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CachedSend {
    /// `sendfile` from the block file (`read.sendfile`).
    Sendfile,
    /// `send(2)` from a mapping of the block file (`read.mmap.enabled`).
    Mapped,
    /// Read into a buffer (`preadv2(RWF_NOWAIT)`), then written.
    Buffer,
}

fn cached_send(ctx: &Ctx, w: &FrameWriter) -> CachedSend {
    if use_sendfile(ctx, w) {
        CachedSend::Sendfile
    } else if ctx.cfg.read_mmap {
        CachedSend::Mapped
    } else {
        CachedSend::Buffer
    }
}

/// Bytes of a block file mapped at once for pieces sent from a mapping: several pieces per
/// `mmap`/`munmap` pair (an unmap flushes the TLB of every core the process runs on).
const MAP_WINDOW: u64 = 8 << 20;

/// Makes `map` cover `source`'s next piece: kept if it does, else replaced by a mapping from
/// that piece on, [`MAP_WINDOW`] bytes or to the range's end. Failpoint `dn::map`: the
/// mapping fails.
fn map_next(ctx: &Ctx, map: &mut Option<FileMap>, source: &PieceSource) -> Result<()> {
    let (at, len) = source.next_range();
    if map.as_ref().is_some_and(|m| m.covers(at, len)) {
        return Ok(());
    }
    *map = None;
    let failed = |e| DatanodeError::io("map", source.block_path(), e);
    if ctx.scope.check("dn::map").is_some() {
        return Err(failed(std::io::Error::other("failpoint dn::map")));
    }
    let want = MAP_WINDOW
        .min(source.range_end().saturating_sub(at))
        .max(len as u64);
    *map = Some(FileMap::new(source.block_file(), at, want as usize).map_err(failed)?);
    Ok(())
}

/// Sends a piece whose data stays in the block file: header and checksums, then the data
/// with `sendfile` ([`wire::write_from_file`]).
async fn send_file_piece(
    ctx: &Ctx,
    w: &mut FrameWriter,
    p: &FilePiece,
    file: &std::fs::File,
    replica: ExtendedBlock,
    bpc: u32,
) -> Result<()> {
    let header = chunk_header(replica, p.offset, p.data_len, bpc);
    let t = ctx.socket_timeout();
    let data = (file, p.offset, p.data_len);
    wire::write_from_file(w, &Message::Chunk(header), &p.sums, data, t).await?;
    ctx.metrics.bytes_read.add(p.data_len as u64);
    Ok(())
}

/// Sends a piece whose data stays in the block file: header and checksums, then the data
/// with `send(2)` from `map` ([`wire::write_from_map`]).
async fn send_mapped_piece(
    ctx: &Ctx,
    w: &mut FrameWriter,
    p: &FilePiece,
    map: &FileMap,
    replica: ExtendedBlock,
    bpc: u32,
) -> Result<()> {
    let header = chunk_header(replica, p.offset, p.data_len, bpc);
    let t = ctx.socket_timeout();
    let data = (map, p.offset, p.data_len);
    wire::write_from_map(w, &Message::Chunk(header), &p.sums, data, t).await?;
    ctx.metrics.bytes_read.add(p.data_len as u64);
    Ok(())
}

/// The data bytes per piece: asked (0: configured), a multiple of `bpc`, fitting a frame.
fn piece_size(ctx: &Ctx, asked: u32, bpc: u64) -> u64 {
    let want = if asked == 0 {
        ctx.cfg.read_piece_bytes.bytes()
    } else {
        asked as u64
    };
    let max_data = ctx.cfg.max_frame_bytes.bytes().saturating_sub(FRAME_SLACK) * bpc / (bpc + 4);
    (want.min(max_data) / bpc * bpc).max(bpc)
}

/// Pieces read ahead of the one on the wire for a prefetch range of `prefetch` bytes: enough
/// to cover it, at most [`MAX_AHEAD_PIECES`]; 0 when prefetch is off.
fn ahead_pieces(prefetch: u64, piece: u64) -> usize {
    prefetch.div_ceil(piece.max(1)).min(MAX_AHEAD_PIECES) as usize
}

/// The read-buffer memory of a stream's window (`read.buffer.max.bytes`): the whole
/// read-ahead window when it fits, else one piece without read-ahead, else nothing (busy).
/// Returns the pieces read ahead and the bytes held.
fn charge_window(ctx: &Ctx, piece: u64, bpc: u64) -> Option<(usize, ReadCharge)> {
    let per_piece = piece + piece.div_ceil(bpc.max(1)) * 4;
    let ahead = ahead_pieces(ctx.cfg.read_prefetch_bytes.bytes(), piece);
    let whole = per_piece.saturating_mul(ahead as u64 + 1);
    if let Some(c) = ctx.read_memory.try_take_quiet(whole) {
        return Some((ahead, c));
    }
    ctx.read_memory.try_take(per_piece).map(|c| (0, c))
}

/// The answer to a read whose buffers do not fit `read.buffer.max.bytes`.
async fn busy(ctx: &Ctx, w: &mut FrameWriter, bytes: u64) -> Result<()> {
    tracing::warn!(node = %ctx.node_id, bytes, max = %ctx.cfg.read_buffer_max_bytes, "read refused: read.buffer.max.bytes reached");
    ctx.metrics.op_errors.inc();
    let msg = format!(
        "busy: {bytes} bytes of read buffers do not fit read.buffer.max.bytes ({}) now",
        ctx.cfg.read_buffer_max_bytes
    );
    let resp = OpResponse::error(Status::ErrorBusy, msg);
    wire::respond(w, resp, ctx.socket_timeout()).await
}

/// The piece source of `plan` in pieces of `piece` bytes, with its kernel advice.
fn piece_source(ctx: &Ctx, plan: ReadPlan, piece: u64) -> Result<PieceSource> {
    let prefetch_bytes = ctx.cfg.read_prefetch_bytes.bytes();
    let advise = match ctx.cfg.read_prefetch_fadvise {
        PrefetchAdvice::Off => 0,
        PrefetchAdvice::On | PrefetchAdvice::Auto => prefetch_bytes,
    };
    let mut prefetch = Prefetcher::new(
        plan.start,
        plan.end,
        advise,
        piece,
        ctx.cfg.read_ahead_cache_threshold.bytes(),
    );
    if ctx.cfg.read_prefetch_fadvise == PrefetchAdvice::Auto {
        prefetch = prefetch.auto();
    }
    let source = PieceSource::new(
        plan.replica,
        plan.start,
        plan.end,
        piece,
        prefetch,
        ctx.metrics.clone(),
    )?;
    if ctx.cfg.read_o_direct {
        return source.with_direct_reads();
    }
    Ok(source)
}

/// Starts the `BlockReader` task over the rest of `source`, `ahead` pieces ahead of the wire;
/// returns where its pieces arrive and the task's handle (dropping it stops the reader).
fn start_reader(
    ctx: &Ctx,
    source: PieceSource,
    ahead: usize,
) -> (mpsc::Receiver<ReaderItem>, AbortOnDropHandle<()>) {
    let window = ReadWindow::new(ahead);
    let (tx, rx) = mpsc::channel(window.ahead() + 1);
    let reader = BlockReader::new(source, window, tx, ctx.io.clone()).spawn();
    (rx, reader)
}

/// How a stream stopped by a shutdown ends: the reader is told why.
fn stopped() -> ReadEnd {
    let e = DatanodeError::ShuttingDown;
    ReadEnd {
        status: e.status(),
        message: e.to_string(),
    }
}

/// Reads `source`'s next piece, a hole in a cached range, on the blocking pool into `buf`:
/// the source back, and the piece or why it could not be read.
async fn read_hole(
    ctx: &Ctx,
    mut source: PieceSource,
    buf: BytesMut,
) -> Result<(PieceSource, Result<Piece>)> {
    let (source, read) = ctx
        .blocking(move || {
            let read = source.next_piece_unadvised(buf);
            Ok((source, read))
        })
        .await?;
    let read = read
        .and_then(|p| p.ok_or_else(|| DatanodeError::invalid("a hole past the end of the range")));
    if read.is_ok() {
        ctx.metrics.stream_pieces_holes.inc();
    }
    Ok((source, read))
}

/// The first part of a `ReadBlock`: while every piece is already in the page cache, the
/// connection task reads it itself ([`PieceSource::next_piece_cached`], which cannot wait
/// for the disk) and sends it — no reader task, no blocking-pool hop, no read-ahead buffers
/// gone cold in the CPU caches before they are sent: with nothing to wait for there is
/// nothing for prefetch to hide. A piece that is not cached while the one after it is (a hole
/// in a cached range: a few pages evicted) is read on the blocking pool, and the cached
/// pieces go on. Returns the source and `Some(end)` when the range (or the stream) ended
/// here; `None` at the first piece not cached whose successor is not cached either, from
/// which the prefetching reader takes the rest.
async fn serve_cached(
    ctx: &Ctx,
    w: &mut FrameWriter,
    mut source: PieceSource,
    replica: ExtendedBlock,
    bpc: u32,
) -> Result<(PieceSource, Option<ReadEnd>)> {
    let mut how = cached_send(ctx, w);
    let mut spare = BytesMut::new();
    // The window of the block file mapped for `CachedSend::Mapped`; unmapped before the pages
    // behind it are dropped (the kernel keeps mapped pages).
    let mut map: Option<FileMap> = None;
    loop {
        if ctx.kill.is_cancelled() {
            return Err(DatanodeError::ShuttingDown);
        }
        if ctx.shutdown.is_cancelled() {
            return Ok((source, Some(stopped())));
        }
        if source.next_payload_len().is_none() {
            drop(map.take());
            source.drop_behind();
            let end = ReadEnd {
                status: Status::Success,
                message: String::new(),
            };
            return Ok((source, Some(end)));
        }
        // Asked once per piece, before anything is read.
        let state = source.next_piece_cache_state();
        let cached = state == Some(true);
        if cached && how == CachedSend::Mapped {
            if let Err(e) = map_next(ctx, &mut map, &source) {
                // Not the reader's problem: the cached pieces go through a buffer instead.
                tracing::warn!(block = %replica.id, "cached pieces sent through a buffer: {e}");
                how = CachedSend::Buffer;
            }
        }
        if cached && how != CachedSend::Buffer {
            match source.next_file_piece(spare) {
                Ok(fp) => {
                    let send = async {
                        match (how, map.as_ref()) {
                            (CachedSend::Mapped, Some(m)) => {
                                send_mapped_piece(ctx, w, &fp, m, replica, bpc).await
                            }
                            (CachedSend::Sendfile, _) => {
                                let file = source.block_file();
                                send_file_piece(ctx, w, &fp, file, replica, bpc).await
                            }
                            _ => Err(DatanodeError::invalid("a mapped piece without a mapping")),
                        }
                    };
                    tokio::select! {
                        biased;
                        _ = ctx.kill.cancelled() => return Err(DatanodeError::ShuttingDown),
                        _ = ctx.shutdown.cancelled() => return Err(DatanodeError::ShuttingDown),
                        r = send => r?,
                    }
                    ctx.metrics.pieces_sent.inc();
                    if how == CachedSend::Sendfile {
                        ctx.metrics.stream_pieces_sendfile.inc();
                    } else {
                        ctx.metrics.stream_pieces_mapped.inc();
                        let (next, len) = source.next_range();
                        if map.as_ref().is_some_and(|m| !m.covers(next, len)) {
                            map = None;
                        }
                    }
                    if map.is_none() {
                        source.drop_behind();
                    }
                    spare = fp.sums;
                    continue;
                }
                Err(buf) => {
                    // The rest is read into buffers, here or by the reader: nothing mapped
                    // stays behind to keep its pages from being dropped.
                    drop(map.take());
                    spare = buf;
                }
            }
        }
        let piece = if state == Some(false) {
            // Decided before any read of the piece: a `preadv2(RWF_NOWAIT)` of pages not
            // cached starts the kernel's read-ahead, which would make a cold stream's next
            // piece look cached.
            if !source.following_piece_cached() {
                return Ok((source, None));
            }
            drop(map.take());
            let (back, read) = read_hole(ctx, source, spare).await?;
            source = back;
            match read {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(block = %replica.id, "streaming read failed: {e}");
                    let end = ReadEnd {
                        status: e.status(),
                        message: e.to_string(),
                    };
                    return Ok((source, Some(end)));
                }
            }
        } else {
            match source.next_piece_cached(spare) {
                Ok(p) => p,
                Err(_) => return Ok((source, None)),
            }
        };
        // A reader that stopped reading must not hold up a stop for a socket timeout.
        tokio::select! {
            biased;
            _ = ctx.kill.cancelled() => return Err(DatanodeError::ShuttingDown),
            _ = ctx.shutdown.cancelled() => return Err(DatanodeError::ShuttingDown),
            r = send_piece(ctx, w, &piece, replica, bpc) => r?,
        }
        ctx.metrics.pieces_sent.inc();
        spare = piece.into_buffer().unwrap_or_default();
    }
}

/// `ReadBlock`: `OpResponse`, the pieces, `ReadEnd`.
pub(crate) async fn read_block(ctx: &Ctx, op: ReadBlockOp, w: &mut FrameWriter) -> Result<()> {
    ctx.metrics.read_block_ops.inc();
    let _timer = ctx.metrics.read_stream_seconds.start_timer();
    let plan = match plan(ctx, op.block, op.offset, op.length).await {
        Ok(p) => p,
        Err(r) => return refuse_plan(ctx, w, r).await,
    };
    let t = ctx.socket_timeout();
    let bpc32 = plan.replica.entry.bytes_per_checksum;
    let source_block = plan.source();
    let piece = piece_size(ctx, op.piece_size, bpc32 as u64);
    let response = plan.response.clone();
    let Some((ahead, _charge)) = charge_window(ctx, piece, bpc32 as u64) else {
        return busy(ctx, w, piece).await;
    };
    let source = match piece_source(ctx, plan, piece) {
        Ok(s) => s,
        Err(e) => return refuse(ctx, w, &e).await,
    };
    wire::respond(w, response, t).await?;
    let (source, end) = serve_cached(ctx, w, source, source_block, bpc32).await?;
    if let Some(end) = end {
        return wire::send(w, Message::ReadEnd(end), Bytes::new(), t).await;
    }
    // `_reader` lives as long as this op: the reader never outlives the connection.
    let (mut rx, _reader) = start_reader(ctx, source, ahead);
    let end = loop {
        // A piece already waiting is a prefetch hit: the disk read was done ahead of the wire.
        // A stop wins over a waiting piece, as in the select below.
        if ctx.kill.is_cancelled() {
            return Err(DatanodeError::ShuttingDown);
        }
        let (next, ready) = match rx.try_recv() {
            _ if ctx.shutdown.is_cancelled() => (Some(Err(DatanodeError::ShuttingDown)), false),
            Ok(p) => (Some(p), true),
            Err(TryRecvError::Disconnected) => (None, false),
            Err(TryRecvError::Empty) => {
                let p = tokio::select! {
                    biased;
                    _ = ctx.kill.cancelled() => return Err(DatanodeError::ShuttingDown),
                    _ = ctx.shutdown.cancelled() => Some(Err(DatanodeError::ShuttingDown)),
                    p = rx.recv() => p,
                };
                (p, false)
            }
        };
        match next {
            None => {
                break ReadEnd {
                    status: Status::Success,
                    message: String::new(),
                }
            }
            Some(Ok(held)) => {
                let Some(p) = held.piece() else { continue };
                if ready {
                    ctx.metrics.prefetch_hits.inc();
                } else {
                    ctx.metrics.prefetch_misses.inc();
                }
                // A reader that stopped reading must not hold up a stop for a socket timeout.
                tokio::select! {
                    biased;
                    _ = ctx.kill.cancelled() => return Err(DatanodeError::ShuttingDown),
                    _ = ctx.shutdown.cancelled() => return Err(DatanodeError::ShuttingDown),
                    r = send_piece(ctx, w, p, source_block, bpc32) => r?,
                }
                ctx.metrics.pieces_sent.inc();
                // Dropping it frees its window slot: the reader may read one more piece ahead.
                drop(held);
            }
            Some(Err(e)) => {
                tracing::warn!(block = %op.block.id, "streaming read failed: {e}");
                break ReadEnd {
                    status: e.status(),
                    message: e.to_string(),
                };
            }
        }
    };
    wire::send(w, Message::ReadEnd(end), Bytes::new(), t).await
}

/// The reply buffer of one connection's `ReadChunk`s, reused from chunk to chunk: the classic
/// read pays a request and a disk read per chunk, not a fresh zero-filled allocation. Its
/// bytes, spare included, are charged to `read.buffer.max.bytes` while the connection lives.
#[derive(Debug, Default)]
pub(crate) struct ChunkBuffer {
    spare: Option<BytesMut>,
    charge: Option<ReadCharge>,
}

impl ChunkBuffer {
    /// A buffer of `len` bytes: the spare one when there is one (its old contents are
    /// overwritten by the read; only growth past its length is zero-filled), else a new one.
    /// `None` when `len` bytes do not fit the read-buffer budget.
    fn take(&mut self, ctx: &Ctx, len: usize) -> Option<BytesMut> {
        if self.charge.as_ref().map_or(0, ReadCharge::bytes) < len as u64 {
            // Give back what is held first: the bigger charge replaces it.
            (self.spare, self.charge) = (None, None);
            self.charge = Some(ctx.read_memory.try_take(len as u64)?);
        }
        let mut buf = self.spare.take().unwrap_or_else(|| {
            ctx.metrics.chunk_buffers_allocated.inc();
            BytesMut::new()
        });
        if buf.len() >= len {
            buf.truncate(len);
        } else {
            buf.resize(len, 0);
        }
        Some(buf)
    }

    /// Keeps the piece's buffer for the next chunk, when nothing else shares it.
    fn give_back(&mut self, piece: Piece) {
        self.spare = piece.into_buffer();
    }
}

/// `ReadChunk`: `OpResponse`, then one `Chunk`. A chunk longer than
/// `read.ahead.cache.bytes.threshold` drops its pages once read, as a streaming read does.
pub(crate) async fn read_chunk(
    ctx: &Ctx,
    op: ReadChunkOp,
    w: &mut FrameWriter,
    buffer: &mut ChunkBuffer,
) -> Result<()> {
    ctx.metrics.read_chunk_ops.inc();
    let _timer = ctx.metrics.read_chunk_seconds.start_timer();
    let plan = match plan(ctx, op.block, op.offset, op.length).await {
        Ok(p) => p,
        Err(r) => return refuse_plan(ctx, w, r).await,
    };
    let bpc = plan.replica.entry.bytes_per_checksum;
    let source = plan.source();
    let len = plan.end - plan.start;
    let frame = len + checksum::checksum_len(len as usize, bpc) as u64 + FRAME_SLACK;
    if frame > ctx.cfg.max_frame_bytes.bytes() {
        let e = DatanodeError::invalid(format!(
            "a chunk of {len} bytes does not fit max.frame.bytes ({})",
            ctx.cfg.max_frame_bytes
        ));
        return refuse(ctx, w, &e).await;
    }
    let (start, response) = (plan.start, plan.response);
    let replica = plan.replica;
    let stored = replica.entry.live.bytes_on_disk();
    let want = payload_len(&replica, len as usize);
    let Some(buf) = buffer.take(ctx, want) else {
        return busy(ctx, w, want as u64).await;
    };
    let drop_behind = len > ctx.cfg.read_ahead_cache_threshold.bytes();
    // A chunk whose data is all in the page cache goes out with sendfile from this task, as
    // HDFS's classic read (`BlockSender`, `transferTo`) sends it; the rest is read on the
    // blocking pool into the connection's reply buffer.
    let buf = if use_sendfile(ctx, w) {
        match file_piece_cached(&replica, start, len as usize, stored, buf) {
            Ok(fp) => {
                wire::respond(w, response, ctx.socket_timeout()).await?;
                send_file_piece(ctx, w, &fp, &replica.block, source, bpc).await?;
                if drop_behind {
                    fadvise(&replica.block, start, len, Advice::DontNeed);
                    ctx.metrics.dropbehind_bytes.add(len);
                }
                ctx.metrics.chunks_sent.inc();
                ctx.metrics.chunks_sendfile.inc();
                buffer.spare = Some(fp.sums);
                return Ok(());
            }
            Err(buf) => buf,
        }
    } else {
        buf
    };
    let metrics = ctx.metrics.clone();
    let piece = match ctx
        .blocking(move || {
            let piece = read_piece_into(&replica, start, len as usize, stored, buf)?;
            if drop_behind {
                fadvise(&replica.block, start, len, Advice::DontNeed);
                metrics.dropbehind_bytes.add(len);
            }
            Ok(piece)
        })
        .await
    {
        Ok(p) => p,
        Err(e) => return refuse(ctx, w, &e).await,
    };
    wire::respond(w, response, ctx.socket_timeout()).await?;
    send_piece(ctx, w, &piece, source, bpc).await?;
    ctx.metrics.chunks_sent.inc();
    buffer.give_back(piece);
    Ok(())
}

/// `ReplicaInfo`: the replica's state, generation stamp and visible length.
pub(crate) async fn replica_info(ctx: &Ctx, op: ReplicaInfoOp, w: &mut FrameWriter) -> Result<()> {
    ctx.metrics.replica_info_ops.inc();
    let resp = match ctx.dataset.get(op.block.id) {
        Some(e) if e.state != ReplicaState::Temporary => {
            let mut r = OpResponse::ok();
            r.replica = Some(e.info());
            r
        }
        _ => {
            ctx.metrics.op_errors.inc();
            wire::error_response(&DatanodeError::ReplicaNotFound { block: op.block.id })
        }
    };
    wire::respond(w, resp, ctx.socket_timeout()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_covers_the_prefetch_range_in_pieces_and_zero_turns_it_off() {
        let mib = 1 << 20;
        assert_eq!(ahead_pieces(0, mib), 0);
        assert_eq!(ahead_pieces(8 * mib, mib), 8);
        assert_eq!(ahead_pieces(mib / 2, mib), 1);
        assert_eq!(ahead_pieces(64 * mib, mib), MAX_AHEAD_PIECES as usize);
    }
}
