//! One data-transfer connection: read an `Op`, dispatch it, and for the ops that allow it
//! (reads, `ReplicaInfo`, `TransferBlock`, the recovery ops) take the next op on the same
//! connection.
//!
//! A frame that cannot be decoded (too large, bad header, unknown message), a message out of
//! place or a wrong protocol version is answered with an error `OpResponse` where possible,
//! and the connection is closed. Nothing stored changes because of it.

use crate::context::Ctx;
use crate::error::DatanodeError;
use crate::read::serve as read;
use crate::wire::{self, FrameReader, FrameWriter};
use crate::{transfer, write};
use futures::StreamExt;
use sluice_common::proto::{Message, Op, OpResponse, TransferBlockOp, PROTOCOL_VERSION};
use sluice_common::token::BlockToken;
use sluice_common::{FrameError, Status};
use tokio::net::TcpStream;
use tracing::Instrument;

/// Serves the connection until the peer closes it, an op ends it, or the node stops.
pub(crate) async fn serve(ctx: Ctx, stream: TcpStream) {
    let (mut reader, mut writer) = wire::split(stream, ctx.codec());
    let t = ctx.socket_timeout();
    let mut chunk_buffer = read::ChunkBuffer::default();
    loop {
        let next = tokio::select! {
            biased;
            _ = ctx.kill.cancelled() => return,
            _ = ctx.shutdown.cancelled() => return,
            n = tokio::time::timeout(t, reader.next()) => n,
        };
        let frame = match next {
            Err(_) | Ok(None) => return,
            Ok(Some(Ok(f))) => f,
            Ok(Some(Err(e))) => return bad_frame(&ctx, &mut writer, e).await,
        };
        let (op, token) = match frame.header {
            Message::Op { version, .. } if version != PROTOCOL_VERSION => {
                let msg = format!("protocol version {version} unsupported, this DataNode speaks {PROTOCOL_VERSION}");
                let _ = wire::respond(&mut writer, OpResponse::error(Status::ErrorVersion, msg), t)
                    .await;
                return;
            }
            Message::Op { op, token, .. } => (op, token),
            other => {
                ctx.metrics.bad_frames.inc();
                let msg = format!("expected an Op, got {}", message_name(&other));
                let _ = wire::respond(&mut writer, OpResponse::error(Status::ErrorInvalid, msg), t)
                    .await;
                return;
            }
        };
        if let Some(resp) = too_many_targets(&ctx, &op) {
            ctx.metrics.op_errors.inc();
            tracing::warn!(node = %ctx.node_id, op = op_name(&op), "op refused: {}", resp.message);
            let _ = wire::respond(&mut writer, resp, t).await;
            return;
        }
        if let Err(e) = super::access::check(&ctx, &op, token.as_ref()).await {
            ctx.metrics.op_errors.inc();
            tracing::warn!(node = %ctx.node_id, op = op_name(&op), "op refused: {e}");
            let resp = OpResponse::error(Status::ErrorAccessToken, e.to_string());
            let _ = wire::respond(&mut writer, resp, t).await;
            return;
        }
        match dispatch(&ctx, op, token, (reader, writer), &mut chunk_buffer).await {
            Some((r, w)) => (reader, writer) = (r, w),
            None => return,
        }
    }
}

/// The refusal of a `WriteBlock` or `TransferBlock` whose pipeline (this DataNode and its
/// targets) is longer than `replication.max`: checked before the token and before anything is
/// dialled, since set-up and ack waits grow with the number of targets.
fn too_many_targets(ctx: &Ctx, op: &Op) -> Option<OpResponse> {
    let targets = match op {
        Op::WriteBlock(w) => w.targets.len(),
        Op::TransferBlock(t) => t.targets.len(),
        _ => return None,
    };
    let max = ctx.cfg.replication_max as usize;
    (targets >= max).then(|| {
        OpResponse::error(
            Status::ErrorInvalid,
            format!("{targets} targets: a pipeline has at most replication.max = {max} DataNodes"),
        )
    })
}

/// Runs one op; gives the connection back when it may carry another.
async fn dispatch(
    ctx: &Ctx,
    op: Op,
    token: Option<BlockToken>,
    (reader, mut writer): (FrameReader, FrameWriter),
    chunk_buffer: &mut read::ChunkBuffer,
) -> Option<(FrameReader, FrameWriter)> {
    let res = match op {
        Op::WriteBlock(op) => {
            write::receiver::serve(ctx.clone(), op, token, reader, writer).await;
            return None;
        }
        Op::ReadBlock(op) => {
            let span =
                tracing::debug_span!("read_block", block = %op.block.id, node = %ctx.node_id);
            read::read_block(ctx, op, &mut writer)
                .instrument(span)
                .await
        }
        Op::ReadChunk(op) => {
            let span =
                tracing::debug_span!("read_chunk", block = %op.block.id, node = %ctx.node_id);
            read::read_chunk(ctx, op, &mut writer, chunk_buffer)
                .instrument(span)
                .await
        }
        Op::ReplicaInfo(op) => read::replica_info(ctx, op, &mut writer).await,
        Op::TransferBlock(op) => {
            let span = tracing::info_span!("transfer", block = %op.block.id, node = %ctx.node_id);
            transfer_op(ctx, op, token.as_ref(), &mut writer)
                .instrument(span)
                .await
        }
        Op::InitReplicaRecovery(op) => {
            let span = tracing::info_span!("init_replica_recovery", block = %op.block.id, node = %ctx.node_id);
            crate::recovery::serve::init_op(ctx, op, &mut writer)
                .instrument(span)
                .await
        }
        Op::UpdateReplicaUnderRecovery(op) => {
            let span = tracing::info_span!("update_replica_under_recovery", block = %op.block.id, node = %ctx.node_id);
            crate::recovery::serve::update_op(ctx, op, &mut writer)
                .instrument(span)
                .await
        }
    };
    match res {
        Ok(()) => Some((reader, writer)),
        Err(e) => {
            tracing::debug!("connection ended: {e}");
            None
        }
    }
}

async fn transfer_op(
    ctx: &Ctx,
    op: TransferBlockOp,
    token: Option<&BlockToken>,
    writer: &mut FrameWriter,
) -> crate::error::Result<()> {
    ctx.metrics.transfer_block_ops.inc();
    let resp = match transfer::transfer(ctx, op, token).await {
        Ok(_) => OpResponse::ok(),
        Err(e) => {
            tracing::warn!("transfer failed: {e}");
            ctx.metrics.op_errors.inc();
            transfer_failure(&e)
        }
    };
    wire::respond(writer, resp, ctx.socket_timeout()).await
}

fn transfer_failure(e: &DatanodeError) -> OpResponse {
    let mut r = wire::error_response(e);
    if let DatanodeError::Downstream { addr, .. } = e {
        r.first_bad_link = Some(addr.clone());
    }
    r
}

async fn bad_frame(ctx: &Ctx, writer: &mut FrameWriter, e: FrameError) {
    if matches!(e, FrameError::Io(_)) {
        return;
    }
    ctx.metrics.bad_frames.inc();
    let err = DatanodeError::from(e);
    tracing::info!(node = %ctx.node_id, "bad frame, closing the connection: {err}");
    let _ = wire::respond(writer, wire::error_response(&err), ctx.socket_timeout()).await;
}

fn message_name(m: &Message) -> &'static str {
    match m {
        Message::Op { .. } => "Op",
        Message::Packet(_) => "Packet",
        Message::OpResponse(_) => "OpResponse",
        Message::Ack(_) => "Ack",
        Message::Chunk(_) => "Chunk",
        Message::ReadEnd(_) => "ReadEnd",
    }
}

fn op_name(op: &Op) -> &'static str {
    match op {
        Op::WriteBlock(_) => "WriteBlock",
        Op::ReadBlock(_) => "ReadBlock",
        Op::ReadChunk(_) => "ReadChunk",
        Op::TransferBlock(_) => "TransferBlock",
        Op::ReplicaInfo(_) => "ReplicaInfo",
        Op::InitReplicaRecovery(_) => "InitReplicaRecovery",
        Op::UpdateReplicaUnderRecovery(_) => "UpdateReplicaUnderRecovery",
    }
}
