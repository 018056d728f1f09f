//! The `BlockReader` actor: one per streaming read (`ReadBlock`). It owns the replica's block
//! and metadata files, opened once, and a [`PieceSource`] that cuts the range into aligned
//! pieces with their stored checksums. The actor only drives: each piece is read on the
//! blocking pool (never on the actor thread) and pushed into a bounded channel — the window of
//! pieces read ahead of the one on the wire. The connection task takes pieces from the channel
//! and writes the frames; TCP backpressure on the connection paces the whole stream. When the
//! connection task goes away the channel closes and the actor stops.

use super::prefetch::Prefetcher;
use super::range::{read_piece, Piece};
use crate::error::{DatanodeError, Result};
use crate::metrics::Metrics;
use crate::storage::dataset::ReadReplica;
use actix::prelude::*;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Cuts `[start, end)` of a replica into pieces, reading ahead with the prefetcher.
#[derive(Debug)]
pub struct PieceSource {
    replica: ReadReplica,
    next: u64,
    end: u64,
    piece: u64,
    stored_len: u64,
    prefetch: Prefetcher,
    metrics: Arc<Metrics>,
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
    ) -> Self {
        let stored_len = replica.entry.live.bytes_on_disk();
        PieceSource {
            replica,
            next: start,
            end,
            piece,
            stored_len,
            prefetch,
            metrics,
        }
    }

    /// Reads the next piece (blocking); `None` at the end of the range.
    pub fn next_piece(&mut self) -> Result<Option<Piece>> {
        if self.next >= self.end {
            return Ok(None);
        }
        let len = self.piece.min(self.end - self.next);
        self.prefetch
            .before_read(&self.replica.block, self.next, &self.metrics);
        let p = read_piece(&self.replica, self.next, len as usize, self.stored_len)?;
        self.next += len;
        self.prefetch
            .after_read(&self.replica.block, self.next, &self.metrics);
        Ok(Some(p))
    }
}

/// The actor.
#[derive(Debug)]
pub struct BlockReader {
    source: Option<PieceSource>,
    out: mpsc::Sender<Result<Piece>>,
    io: tokio::runtime::Handle,
}

impl BlockReader {
    /// A reader sending pieces of `source` to `out`, reading on `io`'s blocking pool.
    pub fn new(
        source: PieceSource,
        out: mpsc::Sender<Result<Piece>>,
        io: tokio::runtime::Handle,
    ) -> Self {
        BlockReader {
            source: Some(source),
            out,
            io,
        }
    }
}

async fn pump(
    mut source: PieceSource,
    out: mpsc::Sender<Result<Piece>>,
    io: tokio::runtime::Handle,
) {
    loop {
        let job = io.spawn_blocking(move || {
            let r = source.next_piece();
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
        match r {
            Ok(Some(p)) => {
                if out.send(Ok(p)).await.is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                let _ = out.send(Err(e)).await;
                return;
            }
        }
    }
}

impl Actor for BlockReader {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let Some(source) = self.source.take() else {
            ctx.stop();
            return;
        };
        let fut = pump(source, self.out.clone(), self.io.clone());
        ctx.wait(fut.into_actor(self).map(|(), _act, ctx| ctx.stop()));
    }
}
