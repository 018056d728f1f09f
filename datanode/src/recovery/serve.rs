//! The two recovery ops on a data-transfer connection, and the same steps run locally when the
//! primary is itself a location.
//!
//! - `InitReplicaRecovery`: stop the replica's writer (cancel it and wait until it has flushed,
//!   within `socket.timeout`), then put the replica under recovery and answer it as it was
//!   (`OpResponse.replica`, state = the original state). No replica: `ERROR_NOT_FOUND`.
//! - `UpdateReplicaUnderRecovery`: truncate, restamp and finalize the replica; queue its
//!   `Received` report; answer the finalized replica.

use crate::context::Ctx;
use crate::error::Result;
use crate::wire::{self, FrameWriter};
use sluice_common::proto::{InitReplicaRecoveryOp, OpResponse, ReplicaInfo, UpdateReplicaOp};
use sluice_common::rpc::ReplicaEvent;

/// Serves `InitReplicaRecovery`.
pub(crate) async fn init_op(
    ctx: &Ctx,
    op: InitReplicaRecoveryOp,
    w: &mut FrameWriter,
) -> Result<()> {
    let resp = answer(ctx, init(ctx, op).await);
    wire::respond(w, resp, ctx.socket_timeout()).await
}

/// Serves `UpdateReplicaUnderRecovery`.
pub(crate) async fn update_op(ctx: &Ctx, op: UpdateReplicaOp, w: &mut FrameWriter) -> Result<()> {
    let resp = answer(ctx, update(ctx, op).await);
    wire::respond(w, resp, ctx.socket_timeout()).await
}

fn answer(ctx: &Ctx, r: Result<ReplicaInfo>) -> OpResponse {
    match r {
        Ok(info) => OpResponse {
            replica: Some(info),
            ..OpResponse::ok()
        },
        Err(e) => {
            tracing::info!("recovery op refused: {e}");
            ctx.metrics.op_errors.inc();
            wire::error_response(&e)
        }
    }
}

/// Stops the replica's writer and puts the replica under recovery.
pub(crate) async fn init(ctx: &Ctx, op: InitReplicaRecoveryOp) -> Result<ReplicaInfo> {
    if let Some(entry) = ctx.dataset.get(op.block.id) {
        entry
            .live
            .stop_writer(entry.id, ctx.socket_timeout())
            .await?;
    }
    let ds = ctx.dataset.clone();
    let info = ctx
        .blocking(move || ds.init_replica_recovery(op.block, op.recovery_id))
        .await?;
    ctx.metrics.replicas_under_recovery.inc();
    tracing::info!(block = %op.block.id, recovery_id = %op.recovery_id, state = ?info.state, len = info.block.num_bytes, "replica under recovery");
    Ok(info)
}

/// Finishes the recovery of the replica and reports it.
pub(crate) async fn update(ctx: &Ctx, op: UpdateReplicaOp) -> Result<ReplicaInfo> {
    let ds = ctx.dataset.clone();
    let entry = ctx
        .blocking(move || {
            ds.update_replica_under_recovery(op.block.id, op.recovery_id, op.new_length)
        })
        .await?;
    ctx.metrics.replicas_recovered.inc();
    tracing::info!(block = %entry.block(), "replica recovered and finalized");
    ctx.events.push(ReplicaEvent::Received(entry.block()));
    Ok(entry.info())
}
