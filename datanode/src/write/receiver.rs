//! The receiving side of a `WriteBlock` (HDFS's `BlockReceiver`): one connection task.
//!
//! Set-up: check the op and prepare the replica per stage (create, replace, recover, or
//! close-recover), connect downstream, start the replica's writer — for a buffered writer
//! (write-memory batching) after taking its memory permit, waiting for one if the cap is
//! reached — and only then answer upstream, so a success covers the whole rest of the
//! pipeline. A writer holding a write-buffer permit whose first data packet does not come
//! within `write.setup.idle.timeout` is closed, so idle set-ups give their permits back.
//! Then, for every packet, in this order:
//! 1. check the header ([`PacketValidator`]);
//! 2. forward the frame downstream unchanged;
//! 3. verify every chunk's CRC32C;
//! 4. hand the packet to the replica's [`ReplicaWriter`] actor (`send().await`), which writes it
//!    (5. and fsyncs it when `sync`) — or, when the write is only a copy into the page cache (a
//!    direct sink, no hsync), write it on this task ([`write_inline`]): the copy costs less
//!    than waking the actor's thread and a blocking-pool thread and being woken back;
//! 6. on the last packet, finalize the replica and queue its `Received` report;
//! 7. queue the packet's outcome for the [`Responder`], which acks upstream once the downstream
//!    ack for the same seqno is in.
//!
//! Ending early: a local error is queued as that packet's status and ends the loop; a
//! downstream failure makes the responder cancel `broken`; an upstream that is lost or silent
//! past `socket.timeout` ends the loop. In every case what was received is flushed to the block
//! file (`Stop`) and the replica stays in `rbw/` for recovery.

use super::buffer_pool::BufferLease;
use super::packet::{PacketKind, PacketValidator};
use super::pipeline::{self, Downstream};
use super::responder::{PendingAck, Responder, ResponderEnd};
use super::writer_actor::{write_inline, Finalize, ReplicaWriter, SharedCore, Stop, WritePacket};
use super::writer_core::{WriterCore, WriterSettings};
use crate::context::Ctx;
use crate::error::{DatanodeError, Result};
use crate::failpoint::FailAction;
use crate::metrics::GaugeGuard;
use crate::storage::dataset::OpenReplica;
use crate::storage::meta::MAX_BYTES_PER_CHECKSUM;
use crate::storage::replica::{ReplicaEntry, ReplicaLive};
use crate::wire::{self, FrameReader, FrameWriter};
use actix::{Actor, Addr};
use bytes::Bytes;
use futures::StreamExt;
use sluice_common::checksum;
use sluice_common::proto::{
    BlockStage, Message, OpResponse, PacketHeader, ReplicaState, WriteBlockOp,
};
use sluice_common::rpc::ReplicaEvent;
use sluice_common::token::BlockToken;
use sluice_common::{FrameError, Status};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Packets acknowledged locally and waiting for the downstream ack, at most.
const ACK_QUEUE: usize = 128;

/// The replica once set up.
enum Prepared {
    /// Packets follow.
    Open(OpenReplica),
    /// CloseRecovery: finalized during set-up.
    Closed(ReplicaEntry),
}

/// Serves a `WriteBlock` op on this connection; the connection ends with it.
pub(crate) async fn serve(
    ctx: Ctx,
    op: WriteBlockOp,
    token: Option<BlockToken>,
    reader: FrameReader,
    upstream: FrameWriter,
) {
    let span = tracing::info_span!("write_block", block = %op.block.id, node = %ctx.node_id, stage = ?op.stage);
    let metrics = Arc::clone(&ctx.metrics);
    let _pipeline = GaugeGuard::new(&metrics.active_pipelines);
    let _timer = metrics.block_write_seconds.start_timer();
    serve_inner(ctx, op, token, reader, upstream)
        .instrument(span)
        .await
}

async fn serve_inner(
    ctx: Ctx,
    op: WriteBlockOp,
    token: Option<BlockToken>,
    reader: FrameReader,
    mut upstream: FrameWriter,
) {
    ctx.metrics.write_block_ops.inc();
    if op.stage.is_recovery() {
        ctx.metrics.pipeline_recoveries.inc();
    }
    let t = ctx.socket_timeout();
    let prepared = match prepare(&ctx, &op).await {
        Ok(p) => p,
        Err(e) => {
            tracing::info!("write set-up refused: {e}");
            ctx.metrics.op_errors.inc();
            let _ = wire::respond(&mut upstream, wire::error_response(&e), t).await;
            return;
        }
    };
    if let Prepared::Closed(entry) = &prepared {
        // Finalized during set-up: reported whatever happens to the answer.
        tracing::info!(
            len = entry.reported_length(),
            "close recovery finalized the replica"
        );
        ctx.events.push(ReplicaEvent::Received(entry.block()));
    }
    match ctx.scope.check("dn::setup") {
        Some(FailAction::Drop) => return,
        Some(FailAction::Error) => {
            let resp = OpResponse::error(Status::Error, "failpoint dn::setup");
            let _ = wire::respond(&mut upstream, resp, t).await;
            return;
        }
        None => {}
    }
    let downstream = if op.targets.is_empty() {
        None
    } else {
        match pipeline::connect(&ctx, &op, token.as_ref()).await {
            Ok(d) => Some(d),
            Err(f) => {
                tracing::warn!(bad = %f.first_bad_link, "downstream set-up failed: {}", f.message);
                ctx.metrics.op_errors.inc();
                let _ = wire::respond(&mut upstream, f.response(), t).await;
                return;
            }
        }
    };
    let writer = match prepared {
        Prepared::Open(replica) => match start_writer(&ctx, &op, replica).await {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!("cannot start the replica writer: {e}");
                ctx.metrics.op_errors.inc();
                let _ = wire::respond(&mut upstream, wire::error_response(&e), t).await;
                return;
            }
        },
        Prepared::Closed(_) => None,
    };
    let mut resp = OpResponse::ok();
    resp.replica = ctx.dataset.get(op.block.id).map(|e| e.info());
    if let Err(e) = wire::respond(&mut upstream, resp, t).await {
        tracing::warn!("cannot answer the set-up: {e}");
        if let Some(started) = writer {
            let _ = started.writer.send(Stop).await;
        }
        return;
    }
    if let Some(started) = writer {
        run(ctx, op, started, reader, upstream, downstream).await;
    }
}

/// Checks the op and prepares the local replica for its stage.
async fn prepare(ctx: &Ctx, op: &WriteBlockOp) -> Result<Prepared> {
    let id = op.block.id;
    if op.bytes_per_checksum == 0 || op.bytes_per_checksum > MAX_BYTES_PER_CHECKSUM {
        return Err(DatanodeError::invalid(format!(
            "bytes_per_checksum {} must be in 1..={MAX_BYTES_PER_CHECKSUM}",
            op.bytes_per_checksum
        )));
    }
    if let Some(old) = ctx.dataset.get(id) {
        if matches!(op.stage, BlockStage::StreamingRecovery | BlockStage::Append)
            && old.bytes_per_checksum != op.bytes_per_checksum
        {
            return Err(DatanodeError::InvalidReplica {
                block: id,
                reason: format!(
                    "stored with {} bytes per checksum, not {}",
                    old.bytes_per_checksum, op.bytes_per_checksum
                ),
            });
        }
        let replaces = op.stage.is_recovery()
            || old.gen_stamp < op.latest_gen_stamp
            || old.state == ReplicaState::Temporary;
        if replaces {
            old.live.stop_writer(old.id, ctx.socket_timeout()).await?;
        }
    }
    let ds = ctx.dataset.clone();
    let (block, latest, bpc, stage) = (
        op.block,
        op.latest_gen_stamp,
        op.bytes_per_checksum,
        op.stage,
    );
    match stage {
        BlockStage::Create | BlockStage::TransferRbw | BlockStage::TransferFinalized => {
            let r = ctx
                .blocking(move || ds.create(id, latest, bpc, stage))
                .await?;
            Ok(Prepared::Open(r))
        }
        BlockStage::StreamingRecovery => {
            let r = ctx
                .blocking(move || ds.recover(block, latest, false))
                .await?;
            let r = r.ok_or_else(|| {
                DatanodeError::invalid("streaming recovery of a finalized replica")
            })?;
            Ok(Prepared::Open(r))
        }
        BlockStage::Append => {
            let r = ctx.blocking(move || ds.append(block, latest)).await?;
            Ok(Prepared::Open(r))
        }
        BlockStage::CloseRecovery => {
            ctx.blocking(move || ds.recover(block, latest, true).map(|_| ()))
                .await?;
            let e = ctx
                .dataset
                .get(id)
                .ok_or(DatanodeError::ReplicaNotFound { block: id })?;
            Ok(Prepared::Closed(e))
        }
    }
}

/// How the packet loop ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The last packet was written, finalized and queued.
    Finished,
    /// A local error was queued as a packet's status.
    LocalError,
    /// The responder stopped the pipeline (downstream failure, upstream unwritable).
    Broken,
    /// The upstream connection was lost or silent.
    UpstreamLost,
    /// No data packet within `write.setup.idle.timeout` of the set-up while the writer held a
    /// write-buffer permit.
    IdleSetup,
    /// Asked to stop (recovery of the replica, delete, graceful shutdown).
    Stopped,
    /// Failpoint `drop`: close everything at once.
    Dropped,
    /// `DataNode::kill`.
    Killed,
}

/// A replica's writer once set up.
struct Started {
    writer: Addr<ReplicaWriter>,
    /// The writer's state, shared with the actor (for inline writes).
    state: SharedCore,
    live: Arc<ReplicaLive>,
    /// The writer holds a write-buffer memory permit.
    buffered: bool,
}

/// Waits until `at`; never when there is none.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The pipeline after set-up: the writer actor, the responder, and the packet loop.
async fn run(
    ctx: Ctx,
    op: WriteBlockOp,
    started: Started,
    mut reader: FrameReader,
    upstream: FrameWriter,
    downstream: Option<Downstream>,
) {
    let Started {
        writer,
        state,
        live,
        buffered,
    } = started;
    let stop = CancellationToken::new();
    let _writer_done = live.attach_writer(stop.clone());
    // A permit holder must show data soon: idle set-ups cannot take every write buffer.
    let first_data_by =
        buffered.then(|| tokio::time::Instant::now() + ctx.cfg.write_setup_idle_timeout.get());
    let validator = PacketValidator::new(live.bytes_on_disk(), op.bytes_per_checksum);
    let (tx, rx) = mpsc::channel(ACK_QUEUE);
    let (broken, downstream_lost) = (CancellationToken::new(), CancellationToken::new());
    let (ds_reader, ds_writer) = downstream.map(|d| (d.reader, d.writer)).unzip();
    let responder = Responder {
        ctx: ctx.clone(),
        upstream,
        downstream: ds_reader,
        downstream_nodes: op.targets.len(),
        queue: rx,
        live: live.clone(),
        broken: broken.clone(),
        downstream_lost: downstream_lost.clone(),
    };
    let responder = tokio::spawn(responder.run().in_current_span());
    let mut lp = PacketLoop {
        ctx: ctx.clone(),
        op: &op,
        writer: writer.clone(),
        state,
        acks: tx,
        validator,
        downstream: ds_writer,
        downstream_lost,
        first_data_by,
    };
    let outcome = lp.run(&mut reader, &broken, &stop).await;
    let downstream = lp.downstream.take();
    drop(lp);
    let ended = Ended {
        outcome,
        writer,
        responder,
        downstream,
    };
    finish(&ctx, &op, &live, ended).await;
}

/// Starts the replica's writer actor: buffered if batching applies to this replica and a
/// memory permit comes (see [`lease_buffer`]), direct otherwise.
async fn start_writer(ctx: &Ctx, op: &WriteBlockOp, replica: OpenReplica) -> Result<Started> {
    let live = replica.entry.live.clone();
    let settings = WriterSettings {
        stage: op.stage,
        last_in_pipeline: op.targets.is_empty(),
        sync_on_close: ctx.cfg.sync_on_close,
        scope: ctx.scope.clone(),
    };
    let lease = if ctx.buffers.applies(op.stage, settings.last_in_pipeline) {
        lease_buffer(ctx).await?
    } else {
        None
    };
    let buffered = lease.is_some();
    let (ds, m) = (ctx.dataset.clone(), ctx.metrics.clone());
    let core = ctx
        .blocking(move || WriterCore::new(replica, settings, ds, m, lease))
        .await?;
    let state: SharedCore = Arc::new(std::sync::Mutex::new(core));
    let (io, metrics) = (ctx.io.clone(), ctx.metrics.clone());
    let idle = ctx.buffers.settings().idle_flush;
    let shared = state.clone();
    let addr = ReplicaWriter::start_in_arbiter(&ctx.arbiter, move |_| {
        ReplicaWriter::new(shared, io, idle, metrics)
    });
    Ok(Started {
        writer: addr,
        state,
        live,
        buffered,
    })
}

/// Takes a write-buffer memory permit, waiting while the cap is reached — at most half the
/// socket timeout, so that the upstream's set-up does not time out: then the replica is
/// written directly (which needs no buffer, so the cap holds either way).
async fn lease_buffer(ctx: &Ctx) -> Result<Option<BufferLease>> {
    let limit = ctx.socket_timeout() / 2;
    tokio::select! {
        biased;
        _ = ctx.kill.cancelled() => Err(DatanodeError::ShuttingDown),
        _ = ctx.shutdown.cancelled() => Err(DatanodeError::ShuttingDown),
        lease = ctx.buffers.lease(limit) => {
            if lease.is_none() {
                tracing::warn!("no write buffer free within {limit:?}: this replica is written directly");
            }
            Ok(lease)
        }
    }
}

/// What is left of a pipeline once its packet loop ended.
struct Ended {
    outcome: Outcome,
    writer: Addr<ReplicaWriter>,
    responder: tokio::task::JoinHandle<ResponderEnd>,
    downstream: Option<FrameWriter>,
}

/// Lets the responder answer what it still can, flushes the writer after an early end, and
/// drops a failed transfer's Temporary replica.
async fn finish(ctx: &Ctx, op: &WriteBlockOp, live: &Arc<ReplicaLive>, e: Ended) {
    let outcome = e.outcome;
    tracing::debug!(?outcome, "packet loop ended");
    match outcome {
        Outcome::Killed => {
            e.responder.abort();
            return;
        }
        Outcome::Finished | Outcome::LocalError | Outcome::Broken => {
            // Acks of earlier packets still come from downstream: its connection stays open
            // until the responder is done.
            let t = ctx.socket_timeout() * 2;
            match tokio::time::timeout(t, e.responder).await {
                Ok(Ok(end)) => tracing::debug!(?end, "responder ended"),
                _ => tracing::warn!("responder did not end in time"),
            }
            drop(e.downstream);
        }
        Outcome::UpstreamLost | Outcome::IdleSetup | Outcome::Stopped | Outcome::Dropped => {
            drop(e.downstream);
            e.responder.abort();
        }
    }
    if outcome == Outcome::Finished {
        return;
    }
    match e.writer.send(Stop).await {
        Ok(Ok(())) => tracing::info!(?outcome, "pipeline ended early; received bytes flushed"),
        Ok(Err(err)) => tracing::error!("flushing the replica after an early end failed: {err}"),
        Err(err) => tracing::error!("replica writer unreachable: {err}"),
    }
    if op.stage.is_transfer() {
        // A partial copy is worth nothing: drop the Temporary replica now.
        let (ds, id, live) = (ctx.dataset.clone(), op.block.id, live.clone());
        if let Err(err) = ctx.blocking(move || ds.delete_temporary(id, &live)).await {
            tracing::warn!("cannot remove the failed transfer's replica: {err}");
        }
    }
}

/// The packet loop's state.
struct PacketLoop<'a> {
    ctx: Ctx,
    op: &'a WriteBlockOp,
    writer: Addr<ReplicaWriter>,
    state: SharedCore,
    acks: mpsc::Sender<PendingAck>,
    validator: PacketValidator,
    downstream: Option<FrameWriter>,
    downstream_lost: CancellationToken,
    /// Until the first data packet, for a writer holding a write-buffer permit: when the
    /// pipeline is closed if none came.
    first_data_by: Option<tokio::time::Instant>,
}

/// What one packet led to.
enum Step {
    Continue,
    End(Outcome),
}

impl PacketLoop<'_> {
    async fn run(
        &mut self,
        reader: &mut FrameReader,
        broken: &CancellationToken,
        stop: &CancellationToken,
    ) -> Outcome {
        let t = self.ctx.socket_timeout();
        loop {
            let next = tokio::select! {
                biased;
                _ = self.ctx.kill.cancelled() => return Outcome::Killed,
                _ = broken.cancelled() => return Outcome::Broken,
                _ = stop.cancelled() => return Outcome::Stopped,
                _ = self.ctx.shutdown.cancelled() => return Outcome::Stopped,
                _ = sleep_until(self.first_data_by) => {
                    self.ctx.metrics.idle_setups_closed.inc();
                    tracing::warn!(
                        timeout = %self.ctx.cfg.write_setup_idle_timeout,
                        "no data packet since the set-up (write.setup.idle.timeout): closing the pipeline and returning its write buffer"
                    );
                    return Outcome::IdleSetup;
                }
                r = tokio::time::timeout(t, reader.next()) => r,
            };
            let frame = match next {
                Err(_) => {
                    tracing::warn!("upstream silent for {t:?}");
                    return Outcome::UpstreamLost;
                }
                Ok(None) | Ok(Some(Err(FrameError::Io(_) | FrameError::Truncated { .. }))) => {
                    return Outcome::UpstreamLost
                }
                Ok(Some(Err(e))) => {
                    self.ctx.metrics.bad_frames.inc();
                    return self
                        .local_error(self.validator.expected_seqno(), &DatanodeError::from(e))
                        .await;
                }
                Ok(Some(Ok(f))) => f,
            };
            let step = match frame.header {
                Message::Packet(h) => self.on_packet(h, frame.payload).await,
                other => {
                    let e = DatanodeError::invalid(format!("expected a packet, got {other:?}"));
                    Step::End(self.local_error(self.validator.expected_seqno(), &e).await)
                }
            };
            if let Step::End(o) = step {
                return o;
            }
        }
    }

    async fn on_packet(&mut self, h: PacketHeader, payload: Bytes) -> Step {
        let kind = match self.validator.check(&h, payload.len()) {
            Ok(k) => k,
            Err(e) => return Step::End(self.local_error(h.seqno, &e).await),
        };
        if let Some(end) = self.failpoint("dn::before_forward", h.seqno).await {
            return Step::End(end);
        }
        self.forward(h, &payload).await;
        if let Some(end) = self.failpoint("dn::after_forward", h.seqno).await {
            return Step::End(end);
        }
        match kind {
            PacketKind::Heartbeat => {
                self.ctx.metrics.heartbeat_packets.inc();
                self.queue(PendingAck {
                    seqno: h.seqno,
                    status: Status::Success,
                    end: 0,
                    last: false,
                    received: None,
                })
                .await
            }
            PacketKind::Data => self.on_data(h, payload).await,
            PacketKind::Last => self.on_last(h).await,
        }
    }

    async fn on_data(&mut self, h: PacketHeader, payload: Bytes) -> Step {
        self.first_data_by = None;
        let received = Instant::now();
        self.ctx.metrics.packets_received.inc();
        let bpc = self.op.bytes_per_checksum;
        let sums_len = checksum::checksum_len(h.data_len as usize, bpc);
        let (sums, data) = (payload.slice(..sums_len), payload.slice(sums_len..));
        if let Err(source) = checksum::verify(&data, &sums, bpc, h.offset_in_block) {
            self.ctx.metrics.checksum_errors.inc();
            let e = DatanodeError::Checksum {
                block: self.op.block.id,
                source,
            };
            return Step::End(self.local_error(h.seqno, &e).await);
        }
        if let Some(end) = self.failpoint("dn::before_write", h.seqno).await {
            return Step::End(end);
        }
        let msg = WritePacket {
            offset: h.offset_in_block,
            data,
            checksums: sums,
            sync: h.sync,
        };
        let written = match write_inline(&self.state, &msg) {
            Some(r) => {
                self.ctx.metrics.packets_written_inline.inc();
                Ok(r)
            }
            None => self.writer.send(msg).await,
        };
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Step::End(self.write_error(h.seqno, e).await),
            Err(_) => {
                let e = DatanodeError::ActorGone {
                    actor: "replica writer",
                };
                return Step::End(self.local_error(h.seqno, &e).await);
            }
        }
        let end = h.offset_in_block + h.data_len as u64;
        self.queue(PendingAck {
            seqno: h.seqno,
            status: Status::Success,
            end,
            last: false,
            received: Some(received),
        })
        .await
    }

    async fn on_last(&mut self, h: PacketHeader) -> Step {
        let entry = match self.writer.send(Finalize).await {
            Ok(Ok(e)) => e,
            Ok(Err(e)) => return Step::End(self.write_error(h.seqno, e).await),
            Err(_) => {
                let e = DatanodeError::ActorGone {
                    actor: "replica writer",
                };
                return Step::End(self.local_error(h.seqno, &e).await);
            }
        };
        tracing::info!(len = entry.reported_length(), state = ?entry.state, "replica complete");
        if entry.state == ReplicaState::Finalized {
            self.ctx.events.push(ReplicaEvent::Received(entry.block()));
        }
        match self
            .queue(PendingAck {
                seqno: h.seqno,
                status: Status::Success,
                end: 0,
                last: true,
                received: None,
            })
            .await
        {
            Step::Continue => Step::End(Outcome::Finished),
            other => other,
        }
    }

    /// Forwards the packet downstream unchanged, header and payload in one vectored write
    /// straight from the received buffer (the codec would copy the payload first). A failure
    /// is left to the responder, which then acks `[own, ERROR]`.
    async fn forward(&mut self, h: PacketHeader, payload: &Bytes) {
        let Some(w) = self.downstream.as_mut() else {
            return;
        };
        let t = self.ctx.socket_timeout();
        if let Err(e) = wire::write_direct(w, &Message::Packet(h), payload, t).await {
            tracing::warn!(seqno = h.seqno, "forwarding downstream failed: {e}");
            self.downstream = None;
            self.downstream_lost.cancel();
        }
    }

    async fn queue(&mut self, p: PendingAck) -> Step {
        match self.acks.send(p).await {
            Ok(()) => Step::Continue,
            Err(_) => Step::End(Outcome::Broken),
        }
    }

    async fn write_error(&mut self, seqno: i64, e: DatanodeError) -> Outcome {
        if let DatanodeError::Failpoint { drop: true, .. } = e {
            return Outcome::Dropped;
        }
        self.local_error(seqno, &e).await
    }

    /// Queues `seqno` with this DataNode's error status; the responder acks it and stops.
    async fn local_error(&mut self, seqno: i64, e: &DatanodeError) -> Outcome {
        if self.ctx.kill.is_cancelled() {
            // A killed node answers nothing (its actors vanished under this packet).
            return Outcome::Killed;
        }
        tracing::warn!(seqno, "local error: {e}");
        self.ctx.metrics.op_errors.inc();
        let p = PendingAck {
            seqno,
            status: e.status(),
            end: 0,
            last: false,
            received: None,
        };
        let _ = self.acks.send(p).await;
        Outcome::LocalError
    }

    async fn failpoint(&mut self, name: &'static str, seqno: i64) -> Option<Outcome> {
        match self.ctx.scope.check(name)? {
            FailAction::Drop => Some(Outcome::Dropped),
            FailAction::Error => Some(
                self.local_error(seqno, &DatanodeError::Failpoint { name, drop: false })
                    .await,
            ),
        }
    }
}
