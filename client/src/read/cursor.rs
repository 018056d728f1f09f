//! The reader's cursor over one block at a time: it keeps the current stream (or chunk
//! connection) and its buffer, serves reads from the buffer, and refills it from the network,
//! failing over to another replica when a DataNode fails, serves bad data, or is shorter
//! than needed. Failed replicas are excluded for the rest of the block; a checksum error is
//! reported to the metadata service.

use super::buffer::ReadBuffer;
use super::chunk::ChunkReader;
use super::stats::ReadStats;
use super::stream::{BlockStream, Wait};
use super::{busy_pause, is_busy, wants_refresh, ReadCtx, MAX_REFRESHES};
use crate::error::ClientError;
use bytes::Bytes;
use sluice_common::config::ReadMode;
use sluice_common::rpc::{BadReplica, LocatedBlock};
use sluice_common::{DatanodeId, NodeId};
use std::sync::Arc;
use tracing::{debug, warn};

/// Where the current block's bytes come from.
enum Source {
    None,
    Stream(BlockStream),
    Chunk {
        reader: Box<ChunkReader>,
        buf: ReadBuffer,
    },
}

/// The block being read and its replica bookkeeping.
pub(crate) struct Cursor {
    ctx: Arc<ReadCtx>,
    /// Index of the current block.
    index: usize,
    source: Source,
    /// Replicas of the current block that failed.
    failed: Vec<NodeId>,
    last_error: Option<ClientError>,
    /// The current block as last located: token, generation stamp and locations, replaced
    /// when a DataNode's refusal asks for them again ([`wants_refresh`]).
    located: Option<Arc<LocatedBlock>>,
    /// Refreshes for the current block.
    refreshes: u32,
}

impl Cursor {
    /// A cursor with nothing open yet.
    pub(crate) fn new(ctx: Arc<ReadCtx>) -> Cursor {
        Cursor {
            ctx,
            index: usize::MAX,
            source: Source::None,
            failed: Vec::new(),
            last_error: None,
            located: None,
            refreshes: 0,
        }
    }

    /// Adds the current block's part to `s`: buffered bytes, serving and excluded DataNodes.
    pub(crate) fn fill_stats(&self, s: &mut ReadStats) {
        if self.index == usize::MAX {
            return;
        }
        s.block_index = Some(self.index);
        s.excluded = self.failed.clone();
        match &self.source {
            Source::None => {}
            Source::Stream(st) => {
                s.buffered = st.buffered() as u64;
                s.datanode = Some(st.node().clone());
            }
            Source::Chunk { reader, buf } => {
                s.buffered = buf.held() as u64;
                s.datanode = Some(reader.node().clone());
            }
        }
    }

    /// Copies buffered bytes at file position `pos`; `None` when they are not buffered.
    pub(crate) fn try_read(&mut self, pos: u64, out: &mut [u8]) -> Option<usize> {
        let idx = self.ctx.block_index(pos)?;
        if idx != self.index || out.is_empty() {
            return None;
        }
        let bpos = pos - self.ctx.blocks[idx].offset;
        let n = match &mut self.source {
            Source::None => 0,
            Source::Stream(s) => s.try_copy(bpos, out),
            Source::Chunk { buf, .. } => {
                let n = buf.copy_at(bpos, out);
                buf.release_before(bpos + n as u64);
                n
            }
        };
        (n > 0).then_some(n)
    }

    /// Takes buffered bytes at file position `pos` without copying (at most `max`, never
    /// past the piece holding `pos`); `None` when they are not buffered.
    pub(crate) fn try_take(&mut self, pos: u64, max: usize) -> Option<Bytes> {
        let idx = self.ctx.block_index(pos)?;
        if idx != self.index || max == 0 {
            return None;
        }
        let bpos = pos - self.ctx.blocks[idx].offset;
        match &mut self.source {
            Source::None => None,
            Source::Stream(s) => s.try_take(bpos, max),
            Source::Chunk { buf, .. } => {
                let b = buf.slice_at(bpos, max)?;
                buf.release_before(bpos + b.len() as u64);
                Some(b)
            }
        }
    }

    /// Makes file position `pos` (inside the file) buffered.
    pub(crate) async fn fill(&mut self, pos: u64) -> Result<(), ClientError> {
        let idx = self
            .ctx
            .block_index(pos)
            .ok_or_else(|| ClientError::InvalidArgument {
                name: "pos",
                reason: format!("{pos} is past the end of {}", self.ctx.path),
            })?;
        if idx != self.index {
            self.index = idx;
            self.source = Source::None;
            self.failed.clear();
            self.last_error = None;
            self.located = Some(Arc::new(self.ctx.blocks[idx].clone()));
            self.refreshes = 0;
        }
        let bpos = pos - self.ctx.blocks[idx].offset;
        loop {
            let lb = match &self.located {
                Some(lb) => Arc::clone(lb),
                None => Arc::new(self.ctx.blocks[idx].clone()),
            };
            let done = match self.ctx.mode {
                ReadMode::Stream => self.fill_stream(&lb, bpos).await,
                ReadMode::Chunk => self.fill_chunk(&lb, bpos).await,
            };
            match done {
                Ok(true) => return Ok(()),
                Ok(false) => continue,
                Err(e) => {
                    // Every replica failed: report, and start afresh on the next read.
                    self.failed.clear();
                    self.last_error = None;
                    self.source = Source::None;
                    if is_busy(&e) && self.refreshes < MAX_REFRESHES {
                        // Every replica was at its read-buffer cap: a new round after a pause.
                        debug!(error = %e, "every replica busy; trying again");
                        tokio::time::sleep(busy_pause(self.refreshes)).await;
                        self.refreshes += 1;
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// One step in stream mode: `Ok(true)` when buffered, `Ok(false)` to try again.
    async fn fill_stream(&mut self, lb: &LocatedBlock, bpos: u64) -> Result<bool, ClientError> {
        if !matches!(self.source, Source::Stream(_)) {
            let dn = self.pick(lb, bpos)?;
            let length = lb.block.num_bytes - bpos;
            debug!(block = %lb.block.id, node = %dn, offset = bpos, length, "starting stream");
            let counters = Arc::clone(&self.ctx.counters);
            let s = BlockStream::start(
                dn,
                (lb.block, lb.token.clone()),
                (bpos, length),
                self.ctx.params,
                counters,
            );
            self.source = Source::Stream(s);
        }
        let Source::Stream(s) = &self.source else {
            return Ok(false);
        };
        match s.wait_for(bpos).await {
            Wait::Ready => Ok(true),
            Wait::Restart => {
                self.source = Source::None;
                Ok(false)
            }
            Wait::Short { end } => {
                let node = s.node().clone();
                let e = short_error(lb, &node, end, bpos);
                self.replica_failed(lb, node, e).await;
                Ok(false)
            }
            Wait::Failed(e) if s.progressed() && is_connection_loss(&e) => {
                // A DataNode may drop a stream the reader paused for long: after progress,
                // a lost connection is retried on the same replica (progress bounds it).
                debug!(block = %lb.block.id, node = %s.node(), error = %e, "stream lost; reopening");
                self.source = Source::None;
                Ok(false)
            }
            Wait::Failed(e) => {
                let node = s.node().clone();
                self.replica_failed(lb, node, e).await;
                Ok(false)
            }
        }
    }

    /// One step in chunk mode.
    async fn fill_chunk(&mut self, lb: &LocatedBlock, bpos: u64) -> Result<bool, ClientError> {
        if !matches!(self.source, Source::Chunk { .. }) {
            let dn = self.pick(lb, bpos)?;
            let token = lb.token.clone();
            match ChunkReader::connect(&dn, lb.block, token, self.ctx.params.settings).await {
                Ok(reader) => {
                    let reader = Box::new(reader);
                    let buf = ReadBuffer::new(bpos, usize::MAX);
                    self.source = Source::Chunk { reader, buf };
                }
                Err(e) => {
                    self.replica_failed(lb, dn, e).await;
                    return Ok(false);
                }
            }
        }
        let Source::Chunk { reader, buf } = &mut self.source else {
            return Ok(false);
        };
        let length = self.ctx.chunk_size.min(lb.block.num_bytes - bpos);
        let verify = self.ctx.params.verify;
        self.ctx.counters.request();
        let outcome: Result<(), ClientError> = match reader.read(bpos, length, verify).await {
            Ok(chunk) => {
                self.ctx.counters.received(chunk.data.len());
                *buf = ReadBuffer::new(bpos, usize::MAX);
                let _ = buf.push(chunk.start, chunk.data);
                if buf.contains(bpos) {
                    return Ok(true);
                }
                Err(short_error(lb, reader.node(), buf.end(), bpos))
            }
            Err(e) => Err(e),
        };
        if let Err(e) = outcome {
            if reader.served() > 0 && is_connection_loss(&e) {
                // The kept-open connection went stale: reconnect to the same replica.
                debug!(block = %lb.block.id, node = %reader.node(), error = %e, "chunk connection lost; reconnecting");
                self.source = Source::None;
                return Ok(false);
            }
            let node = reader.node().clone();
            self.replica_failed(lb, node, e).await;
        }
        Ok(false)
    }

    /// The first replica of `lb` that has not failed; the last error when none is left.
    fn pick(&mut self, lb: &LocatedBlock, bpos: u64) -> Result<DatanodeId, ClientError> {
        match lb
            .locations
            .iter()
            .find(|d| !self.failed.contains(&d.node_id))
        {
            Some(d) => Ok(d.clone()),
            None => Err(self.last_error.take().unwrap_or(ClientError::NoReplica {
                block: lb.block.id,
                offset: bpos,
            })),
        }
    }

    /// Excludes `node` for this block, reports a checksum error, and remembers the error.
    async fn replica_failed(&mut self, lb: &LocatedBlock, node: DatanodeId, e: ClientError) {
        self.source = Source::None;
        if matches!(e, ClientError::GenStampMismatch { .. }) {
            self.ctx.counters.stamp_mismatch();
        }
        if wants_refresh(&e) && self.refreshes < MAX_REFRESHES {
            let attempt = self.refreshes;
            self.refreshes += 1;
            match self.ctx.refresh(lb, attempt).await {
                Ok(fresh) => {
                    debug!(block = %lb.block.id, node = %node, error = %e, "refused; located again, trying again");
                    self.located = Some(Arc::new(fresh));
                    return;
                }
                Err(re) => {
                    warn!(block = %lb.block.id, error = %re, "locating the block again failed")
                }
            }
        }
        warn!(block = %lb.block.id, node = %node, error = %e, "replica failed; trying another");
        self.source = Source::None;
        self.failed.push(node.node_id.clone());
        if matches!(e, ClientError::Checksum { .. }) {
            report_bad(&self.ctx, lb, &node, &e).await;
        }
        self.last_error = Some(e);
    }
}

/// A dropped connection (not a timeout, not bad data, not an error status).
fn is_connection_loss(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Closed { .. } | ClientError::DatanodeIo { .. }
    )
}

fn short_error(lb: &LocatedBlock, node: &DatanodeId, end: u64, bpos: u64) -> ClientError {
    ClientError::ShortReplica {
        block: lb.block.id,
        node: node.to_string(),
        visible: end,
        wanted: bpos,
    }
}

/// Tells the metadata service that `node` served corrupt data for `lb`.
pub(crate) async fn report_bad(
    ctx: &ReadCtx,
    lb: &LocatedBlock,
    node: &DatanodeId,
    e: &ClientError,
) {
    let bad = vec![BadReplica {
        block: lb.block,
        node: node.node_id.clone(),
        reason: e.to_string(),
    }];
    ctx.counters.reported_bad();
    if let Err(err) = ctx.meta.report_bad_blocks(&bad).await {
        warn!(block = %lb.block.id, node = %node, error = %err, "report_bad_blocks failed");
    }
}
