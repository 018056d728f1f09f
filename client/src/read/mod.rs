//! The read path: [`FileReader`] (HDFS `DFSInputStream`, Ozone `StreamBlockInputStream`).
//!
//! - [`buffer`]: the bounded buffer of one block stream (plain logic).
//! - [`stream`]: stream mode, one `ReadBlock` per block position, fetched by a task.
//! - [`chunk`]: chunk mode, one `ReadChunk` per chunk.
//! - [`cursor`]: the current block, refills, and replica failover.
//! - [`locate`]: the blocks and, for a file being written, the last block's visible length.
//! - [`positioned`]: positioned reads ([`FileReader::read_at`]), with requests of their own
//!   that never touch the stream.
//! - [`stats`]: what a reader has done ([`ReadStats`]).

mod buffer;
mod chunk;
mod cursor;
mod locate;
mod positioned;
mod stats;
mod stream;

use crate::connection::DnSettings;
use crate::error::ClientError;
use crate::meta::MetadataClient;
use bytes::Bytes;
use cursor::Cursor;
use sluice_common::config::{ClientConfig, ReadMode};
use sluice_common::rpc::{FileKind, LocatedBlock};
use sluice_common::{MetaError, Status};
use stats::ReadCounters;
pub use stats::ReadStats;
use std::future::Future;
use std::io::{self, SeekFrom};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use stream::StreamParams;
use tokio::io::{AsyncRead, AsyncSeek, ReadBuf};
use tracing::debug;

/// Options of [`crate::FileSystem::open_with`]; `None` takes the configured value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Stream or chunk mode (`read.mode`).
    pub mode: Option<ReadMode>,
    /// Verify checksums (`read.verify.checksum`).
    pub verify_checksum: Option<bool>,
    /// Bytes kept ahead of the reader per stream (`read.buffer.bytes`).
    pub buffer_bytes: Option<u64>,
}

/// What every part of one open reader shares.
pub(crate) struct ReadCtx {
    /// Token refreshes and bad-replica reports.
    pub meta: Arc<MetadataClient>,
    pub path: String,
    /// Blocks in order; `block.num_bytes` is the readable length.
    pub blocks: Vec<LocatedBlock>,
    pub len: u64,
    pub mode: ReadMode,
    pub params: StreamParams,
    pub chunk_size: u64,
    pub counters: Arc<ReadCounters>,
}

impl ReadCtx {
    /// Index of the block holding file position `pos`.
    pub(crate) fn block_index(&self, pos: u64) -> Option<usize> {
        if pos >= self.len {
            return None;
        }
        let i = self.blocks.partition_point(|b| b.offset <= pos);
        let i = i.checked_sub(1)?;
        let b = &self.blocks[i];
        (pos < b.offset + b.block.num_bytes).then_some(i)
    }
}

/// A DataNode refused the read in a way that asking the metadata service again may cure: the
/// op's block access token (expired, or signed by a key rolled out), or the generation stamp,
/// when the DataNode's replica is newer than the reader's (an append or a pipeline recovery
/// since the reader located the block).
pub(crate) fn wants_refresh(e: &ClientError) -> bool {
    match e {
        ClientError::Datanode {
            status: Status::ErrorAccessToken,
            ..
        } => true,
        ClientError::GenStampMismatch {
            served: false,
            expected,
            found,
            ..
        } => found > expected,
        _ => false,
    }
}

/// Every replica answered `ERROR_BUSY` (a DataNode at its read-buffer cap): worth trying
/// again after a pause.
pub(crate) fn is_busy(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Datanode {
            status: Status::ErrorBusy,
            ..
        }
    )
}

/// The pause before the `attempt`-th (0, 1, …) new round over busy replicas.
pub(crate) fn busy_pause(attempt: u32) -> std::time::Duration {
    std::time::Duration::from_millis(100 << attempt.min(4))
}

/// Locations refreshes per block and read before a refusal is final.
pub(crate) const MAX_REFRESHES: u32 = 3;

impl ReadCtx {
    /// `lb` located again (HDFS `DFSInputStream.fetchBlockAt` after an
    /// `InvalidBlockTokenException`): a fresh token, the current generation stamp and
    /// locations; the readable length stays the one the reader knows. `attempt` (0, 1, …)
    /// spaces the asks out: a DataNode may hold a new stamp a moment before the metadata
    /// service has recorded it (the writer's `update_pipeline` follows the pipeline set-up).
    pub(crate) async fn refresh(
        &self,
        lb: &LocatedBlock,
        attempt: u32,
    ) -> Result<LocatedBlock, ClientError> {
        if attempt > 0 {
            let wait = std::time::Duration::from_millis(100 << attempt.min(4));
            tokio::time::sleep(wait).await;
        }
        let located = self
            .meta
            .get_block_locations(&self.path, lb.offset, 1)
            .await?;
        let Some(mut fresh) = located
            .blocks
            .into_iter()
            .find(|b| b.block.id == lb.block.id)
        else {
            return Err(ClientError::NoReplica {
                block: lb.block.id,
                offset: 0,
            });
        };
        debug!(
            block = %lb.block.id,
            was = %lb.block.gen_stamp,
            now = %fresh.block.gen_stamp,
            "block located again"
        );
        fresh.block.num_bytes = lb.block.num_bytes;
        fresh.offset = lb.offset;
        Ok(fresh)
    }
}

type FillFuture = Pin<Box<dyn Future<Output = (Cursor, Result<(), ClientError>)> + Send>>;

/// A file open for reading. Implements [`AsyncRead`] and [`AsyncSeek`] (a seek past the end
/// is an error that leaves the position unchanged).
pub struct FileReader {
    ctx: Arc<ReadCtx>,
    pos: u64,
    cursor: Option<Cursor>,
    /// A refill in progress. In a `Mutex` only so that `FileReader` is `Sync` (for `read_at`
    /// from several tasks); it is reached through `get_mut`, never locked.
    pending: std::sync::Mutex<Option<FillFuture>>,
}

impl std::fmt::Debug for FileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileReader")
            .field("path", &self.ctx.path)
            .field("len", &self.ctx.len)
            .field("pos", &self.pos)
            .finish()
    }
}

impl FileReader {
    /// Opens `path`: its status, its blocks, and (under construction) the last block's
    /// visible length from the DataNodes.
    pub(crate) async fn open(
        meta: Arc<MetadataClient>,
        cfg: &ClientConfig,
        path: &str,
        opts: ReadOptions,
    ) -> Result<FileReader, ClientError> {
        let status = meta.stat(path).await?;
        if status.kind == FileKind::Directory {
            return Err(ClientError::Meta(MetaError::IsADirectory {
                path: path.to_string(),
            }));
        }
        let located = meta.get_block_locations(path, 0, u64::MAX).await?;
        let params = StreamParams {
            settings: DnSettings {
                timeout: cfg.socket_timeout.get(),
                max_frame: cfg.max_frame_bytes.as_usize(),
            },
            piece_size: u32::try_from(cfg.read_piece_bytes.bytes()).unwrap_or(u32::MAX),
            buffer_bytes: opts
                .buffer_bytes
                .map(|b| usize::try_from(b).unwrap_or(usize::MAX))
                .unwrap_or(cfg.read_buffer_bytes.as_usize()),
            verify: opts.verify_checksum.unwrap_or(cfg.read_verify_checksum),
        };
        let blocks = locate::readable_blocks(located, params.settings).await?;
        let len = blocks
            .last()
            .map(|b| b.offset + b.block.num_bytes)
            .unwrap_or(0);
        debug!(path, len, blocks = blocks.len(), "opened for reading");
        let ctx = Arc::new(ReadCtx {
            path: path.to_string(),
            blocks,
            len,
            mode: opts.mode.unwrap_or(cfg.read_mode),
            params,
            chunk_size: cfg.read_chunk_size.bytes(),
            counters: Arc::default(),
            meta,
        });
        Ok(FileReader {
            cursor: Some(Cursor::new(Arc::clone(&ctx))),
            ctx,
            pos: 0,
            pending: std::sync::Mutex::new(None),
        })
    }

    /// The file's length (for a file being written: as readable when it was opened).
    pub fn len(&self) -> u64 {
        self.ctx.len
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.ctx.len == 0
    }

    /// The stream position.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The file's blocks as this reader reads them: offsets, readable lengths, and replicas
    /// in the order they are tried.
    pub fn blocks(&self) -> &[LocatedBlock] {
        &self.ctx.blocks
    }

    /// The read mode in use.
    pub fn mode(&self) -> ReadMode {
        self.ctx.mode
    }

    /// What this reader has done so far: requests, bytes received, bytes buffered, the
    /// DataNode serving the current block and those excluded for it. The per-block part is
    /// empty while a refill is in progress.
    pub fn stats(&self) -> ReadStats {
        let mut s = self.ctx.counters.snapshot();
        if let Some(c) = &self.cursor {
            c.fill_stats(&mut s);
        }
        s
    }

    /// Reads up to `buf.len()` bytes at `pos` with requests of its own, without moving or
    /// disturbing the stream. Returns fewer bytes only at the end of the file.
    pub async fn read_at(&self, pos: u64, buf: &mut [u8]) -> Result<usize, ClientError> {
        let mut done = 0usize;
        while done < buf.len() {
            let p = pos + done as u64;
            let Some(idx) = self.ctx.block_index(p) else {
                break;
            };
            let lb = &self.ctx.blocks[idx];
            let bpos = p - lb.offset;
            let want = ((lb.block.num_bytes - bpos) as usize).min(buf.len() - done);
            positioned::read_range(&self.ctx, lb, bpos, &mut buf[done..done + want]).await?;
            done += want;
        }
        Ok(done)
    }

    /// Reads the next bytes at the stream position without copying them: what the DataNode
    /// sent, checksums verified, handed over as the received buffer itself (at most `max`
    /// bytes, at most one piece or chunk; fewer is not the end). Empty only at the end of the
    /// file. The zero-copy counterpart of [`AsyncRead`] (HDFS's `read(ByteBufferPool,
    /// maxLength)`): an [`AsyncRead`] read copies each byte once more, into the caller's
    /// buffer. Dropping the future before it completes starts a new stream at the position on
    /// the next read.
    pub async fn read_bytes(&mut self, max: usize) -> Result<Bytes, ClientError> {
        let pending = self
            .pending
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(fut) = pending {
            let (cursor, r) = fut.await;
            self.cursor = Some(cursor);
            r?;
        }
        loop {
            if max == 0 || self.pos >= self.ctx.len {
                return Ok(Bytes::new());
            }
            let mut cursor = match self.cursor.take() {
                Some(c) => c,
                None => Cursor::new(Arc::clone(&self.ctx)),
            };
            if let Some(b) = cursor.try_take(self.pos, max) {
                self.pos += b.len() as u64;
                self.cursor = Some(cursor);
                return Ok(b);
            }
            let r = cursor.fill(self.pos).await;
            self.cursor = Some(cursor);
            r?;
        }
    }

    fn poll_read_inner(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<Result<(), ClientError>> {
        loop {
            let pending = self.pending.get_mut().unwrap_or_else(|p| p.into_inner());
            if let Some(fut) = pending.as_mut() {
                let (cursor, r) = ready!(fut.as_mut().poll(cx));
                *pending = None;
                self.cursor = Some(cursor);
                r?;
            }
            if buf.remaining() == 0 || self.pos >= self.ctx.len {
                return Poll::Ready(Ok(()));
            }
            let mut cursor = match self.cursor.take() {
                Some(c) => c,
                None => Cursor::new(Arc::clone(&self.ctx)),
            };
            let out = buf.initialize_unfilled();
            if let Some(n) = cursor.try_read(self.pos, out) {
                buf.advance(n);
                self.pos += n as u64;
                self.cursor = Some(cursor);
                return Poll::Ready(Ok(()));
            }
            let pos = self.pos;
            let fut: FillFuture = Box::pin(async move {
                let r = cursor.fill(pos).await;
                (cursor, r)
            });
            *self.pending.get_mut().unwrap_or_else(|p| p.into_inner()) = Some(fut);
        }
    }
}

impl AsyncRead for FileReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut()
            .poll_read_inner(cx, buf)
            .map_err(io::Error::from)
    }
}

impl AsyncSeek for FileReader {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        let len = this.ctx.len;
        let target: i128 = match position {
            SeekFrom::Start(n) => i128::from(n),
            SeekFrom::End(d) => i128::from(len) + i128::from(d),
            SeekFrom::Current(d) => i128::from(this.pos) + i128::from(d),
        };
        if target < 0 || target > i128::from(len) {
            return Err(ClientError::SeekOutOfRange { pos: target, len }.into());
        }
        this.pos = target as u64;
        Ok(())
    }

    fn poll_complete(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Poll::Ready(Ok(self.pos))
    }
}
