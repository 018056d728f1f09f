//! The primary's side of a block recovery (HDFS's `BlockRecoveryWorker`), run for a
//! `RecoverBlock` command: ask every location for its replica (`InitReplicaRecovery`, all at
//! once), decide the length ([`super::length::decide`]), bring the participants to it
//! (`UpdateReplicaUnderRecovery`), and report to the metadata service with
//! `commit_block_synchronization`.
//!
//! Failures end the attempt without a report; the metadata service starts another one (new
//! recovery id, maybe another primary) after `block.recovery.timeout`. The block is deleted
//! only when every location answered and none holds a byte of it: a location that failed to
//! answer may hold the data (HDFS deletes in that case too; Sluice waits for the next attempt).

use super::length::{decide, Decision, ReplicaAnswer};
use super::serve;
use crate::context::Ctx;
use crate::error::{DatanodeError, Result};
use crate::wire;
use crate::write::pipeline;
use bytes::Bytes;
use futures::future::join_all;
use sluice_common::proto::{
    InitReplicaRecoveryOp, Message, Op, OpResponse, ReplicaInfo, UpdateReplicaOp, PROTOCOL_VERSION,
};
use sluice_common::rpc::{self, BlockSync, DatanodeProtocolClient, RecoveringBlock};
use sluice_common::token::BlockToken;
use sluice_common::{DatanodeId, ExtendedBlock, NodeId, Status};
use std::time::Duration;

/// Deadline of the `commit_block_synchronization` call.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs a `RecoverBlock` command to its end (logging the outcome).
pub(crate) async fn recover_block(ctx: Ctx, client: DatanodeProtocolClient, rb: RecoveringBlock) {
    ctx.metrics.block_recoveries.inc();
    let outcome = match run(&ctx, &rb).await {
        Ok(sync) => commit(&client, sync).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(()) => tracing::info!("block recovery reported"),
        Err(e) => {
            ctx.metrics.block_recovery_failures.inc();
            tracing::warn!("block recovery failed (the metadata service will retry): {e}");
        }
    }
}

async fn commit(client: &DatanodeProtocolClient, sync: BlockSync) -> Result<()> {
    let failed = |reason: String| DatanodeError::Downstream {
        addr: "the metadata service".into(),
        reason,
    };
    let call = client.commit_block_synchronization(rpc::context_with_timeout(COMMIT_TIMEOUT), sync);
    match rpc::bounded(COMMIT_TIMEOUT, call).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(failed(format!("commit_block_synchronization refused: {e}"))),
        Err(e) => Err(failed(format!("commit_block_synchronization: {e}"))),
    }
}

/// The recovery up to the report it makes.
async fn run(ctx: &Ctx, rb: &RecoveringBlock) -> Result<BlockSync> {
    let init = InitReplicaRecoveryOp {
        block: rb.block,
        recovery_id: rb.recovery_id,
    };
    let asks = rb.locations.iter().map(|loc| async move {
        let r = call(ctx, loc, Op::InitReplicaRecovery(init), rb.token.as_ref()).await;
        (loc, r)
    });
    let mut answers = Vec::new();
    let mut failed = Vec::new();
    for (loc, r) in join_all(asks).await {
        match r {
            Ok(info) => answers.push(answer_of(&loc.node_id, info)),
            Err(DatanodeError::ReplicaNotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(location = %loc, "InitReplicaRecovery failed: {e}");
                failed.push(format!("{loc}: {e}"));
            }
        }
    }
    let decision = decide(rb.block, &answers).map_err(|e| DatanodeError::InvalidReplica {
        block: rb.block.id,
        reason: e.to_string(),
    })?;
    tracing::info!(answers = ?answers, decision = ?decision, "block recovery decided");
    match decision {
        Decision::Delete if failed.is_empty() => Ok(sync(rb, 0, true, vec![])),
        Decision::Delete => Err(DatanodeError::InvalidReplica {
            block: rb.block.id,
            reason: format!("no replica holds data, but some locations failed: {failed:?}"),
        }),
        Decision::Keep {
            length,
            participants,
        } => {
            let done = update_all(ctx, rb, length, &participants).await;
            if done.is_empty() {
                return Err(DatanodeError::InvalidReplica {
                    block: rb.block.id,
                    reason: "every participant failed to update its replica".into(),
                });
            }
            Ok(sync(rb, length, false, done))
        }
    }
}

/// Brings every participant to `length`; returns those that made it.
async fn update_all(
    ctx: &Ctx,
    rb: &RecoveringBlock,
    length: u64,
    participants: &[ReplicaAnswer],
) -> Vec<NodeId> {
    let updates = participants.iter().filter_map(|p| {
        let loc = rb.locations.iter().find(|l| l.node_id == p.node)?;
        let op = UpdateReplicaOp {
            block: ExtendedBlock::new(rb.block.id, p.gen_stamp, p.length),
            recovery_id: rb.recovery_id,
            new_length: length,
        };
        Some(async move {
            (
                loc,
                call(
                    ctx,
                    loc,
                    Op::UpdateReplicaUnderRecovery(op),
                    rb.token.as_ref(),
                )
                .await,
            )
        })
    });
    let mut done = Vec::new();
    for (loc, r) in join_all(updates).await {
        match r {
            Ok(_) => done.push(loc.node_id.clone()),
            Err(e) => tracing::warn!(location = %loc, "UpdateReplicaUnderRecovery failed: {e}"),
        }
    }
    done
}

fn sync(rb: &RecoveringBlock, length: u64, delete: bool, targets: Vec<NodeId>) -> BlockSync {
    BlockSync {
        block: rb.block,
        new_gen_stamp: rb.recovery_id,
        new_length: length,
        close_file: true,
        delete_block: delete,
        new_targets: targets,
    }
}

fn answer_of(node: &NodeId, info: ReplicaInfo) -> ReplicaAnswer {
    ReplicaAnswer {
        node: node.clone(),
        gen_stamp: info.block.gen_stamp,
        length: info.block.num_bytes,
        state: info.state,
    }
}

/// Runs a recovery op on `loc`: locally when it is this DataNode, else over a connection.
async fn call(
    ctx: &Ctx,
    loc: &DatanodeId,
    op: Op,
    token: Option<&BlockToken>,
) -> Result<ReplicaInfo> {
    if loc.node_id == ctx.node_id {
        return match op {
            Op::InitReplicaRecovery(op) => serve::init(ctx, op).await,
            Op::UpdateReplicaUnderRecovery(op) => serve::update(ctx, op).await,
            other => Err(DatanodeError::invalid(format!(
                "not a recovery op: {other:?}"
            ))),
        };
    }
    let id = match &op {
        Op::InitReplicaRecovery(o) => o.block.id,
        Op::UpdateReplicaUnderRecovery(o) => o.block.id,
        _ => return Err(DatanodeError::invalid("not a recovery op")),
    };
    let resp = remote(ctx, &loc.data_addr, op, token).await?;
    match (resp.status, resp.replica) {
        (Status::Success, Some(info)) => Ok(info),
        (Status::ErrorNotFound, _) => Err(DatanodeError::ReplicaNotFound { block: id }),
        (status, _) => Err(DatanodeError::Downstream {
            addr: loc.data_addr.clone(),
            reason: format!("{status}: {}", resp.message),
        }),
    }
}

/// Sends one op to `addr` (from `bind.host`, as every outbound data connection) and reads its
/// `OpResponse`.
async fn remote(ctx: &Ctx, addr: &str, op: Op, token: Option<&BlockToken>) -> Result<OpResponse> {
    let t = ctx.socket_timeout();
    let down = |reason: String| DatanodeError::Downstream {
        addr: addr.to_string(),
        reason,
    };
    let stream = tokio::time::timeout(t, pipeline::dial(&ctx.cfg.bind_host, addr))
        .await
        .map_err(|_| down("connect timed out".into()))?
        .map_err(|e| down(format!("cannot connect: {e}")))?;
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = wire::split(stream, ctx.codec());
    let msg = Message::Op {
        version: PROTOCOL_VERSION,
        op,
        token: token.cloned(),
    };
    wire::send(&mut writer, msg, Bytes::new(), t).await?;
    match wire::recv(&mut reader, t, "a recovery answer").await? {
        Some(f) => match f.header {
            Message::OpResponse(r) => Ok(r),
            other => Err(down(format!("answered {other:?}"))),
        },
        None => Err(down("closed the connection".into())),
    }
}
