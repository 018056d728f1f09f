//! What a reader may read: the file's blocks from the metadata service and, for a file under
//! construction, the last block's visible length asked of its DataNodes with the `ReplicaInfo`
//! op (HDFS `DFSInputStream.readBlockLength`).

use crate::connection::{DnConnection, DnSettings};
use crate::error::ClientError;
use sluice_common::proto::{Op, ReplicaInfoOp};
use sluice_common::rpc::{LocatedBlock, LocatedBlocks};
use sluice_common::{DatanodeId, Status};
use tracing::{debug, warn};

/// The blocks with `block.num_bytes` set to the bytes a reader may read.
pub(crate) async fn readable_blocks(
    mut located: LocatedBlocks,
    settings: DnSettings,
) -> Result<Vec<LocatedBlock>, ClientError> {
    if located.under_construction {
        if let Some(last) = located.blocks.last_mut() {
            last.block.num_bytes = visible_length(last, settings).await?;
        }
    }
    Ok(located.blocks)
}

/// The largest visible length reported by the block's DataNodes. A replica that batches
/// writes in memory may report less than another; the largest is readable somewhere, and a
/// reader that finds a replica short moves to another.
async fn visible_length(lb: &LocatedBlock, settings: DnSettings) -> Result<u64, ClientError> {
    if lb.locations.is_empty() {
        return Ok(lb.block.num_bytes);
    }
    let answers = futures::future::join_all(
        lb.locations
            .iter()
            .map(|dn| replica_length(dn, lb, settings)),
    )
    .await;
    let mut best: Option<u64> = None;
    let mut not_found = 0;
    let mut last_err = String::new();
    for (dn, a) in lb.locations.iter().zip(answers) {
        match a {
            Ok(len) => best = Some(best.map_or(len, |b| b.max(len))),
            Err(ClientError::Datanode {
                status: Status::ErrorNotFound,
                ..
            }) => not_found += 1,
            Err(e) => {
                warn!(block = %lb.block.id, node = %dn, error = %e, "replica info failed");
                last_err = e.to_string();
            }
        }
    }
    match best {
        Some(len) => {
            debug!(block = %lb.block.id, len, "visible length of the last block");
            Ok(len)
        }
        // Every DataNode answered that it has no replica yet: the pipeline is still being set
        // up, so nothing of the block was acknowledged (HDFS makes the same call).
        None if not_found == lb.locations.len() => Ok(0),
        None => Err(ClientError::BlockLength {
            block: lb.block.id,
            reason: last_err,
        }),
    }
}

async fn replica_length(
    dn: &DatanodeId,
    lb: &LocatedBlock,
    settings: DnSettings,
) -> Result<u64, ClientError> {
    let block = lb.block;
    let mut conn = DnConnection::connect(dn, settings).await?;
    conn.send_op(Op::ReplicaInfo(ReplicaInfoOp { block }), lb.token.as_ref())
        .await?;
    let resp = conn.recv_op_response(block.id).await?;
    match resp.replica {
        Some(r) => Ok(r.block.num_bytes),
        None => Err(ClientError::protocol(
            conn.node(),
            "ReplicaInfo answer without replica information",
        )),
    }
}
