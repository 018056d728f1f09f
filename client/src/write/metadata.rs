//! The streamer's block calls to the metadata service, with their retry policies on top of
//! [`MetadataClient`]: `add_block` (retried while the previous
//! block is not replicated yet), `abandon_block`, and `complete` (retried until the last block
//! is reported). The metadata service answers a repeated `add_block` (same `previous`, block
//! untouched) with the same block, and a repeated `complete`/`abandon_block` with the same
//! outcome, so these calls are retried after a reconnection.

use crate::error::ClientError;
use crate::meta::MetadataClient;
use sluice_common::rpc::LocatedBlock;
use sluice_common::{ExtendedBlock, MetaError, NodeId};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// `add_block`, retried with backoff while the previous block is not replicated yet.
pub(crate) async fn add_block(
    meta: &MetadataClient,
    path: &str,
    previous: Option<ExtendedBlock>,
    excluded: &[NodeId],
) -> Result<LocatedBlock, ClientError> {
    let deadline = Instant::now() + meta.timeout();
    let mut delay = Duration::from_millis(100);
    loop {
        match meta.add_block(path, previous, excluded).await {
            Err(ClientError::Meta(MetaError::NotReplicatedYet { block }))
                if Instant::now() + delay < deadline =>
            {
                debug!(%block, ?delay, "previous block not replicated yet; retrying add_block");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

/// Drops a block whose pipeline could not be set up (failures are logged: the metadata
/// service drops it anyway when the next block is added).
pub(crate) async fn abandon(meta: &MetadataClient, path: &str, lb: &LocatedBlock) {
    if let Err(e) = meta.abandon_block(path, lb.block).await {
        warn!(block = %lb.block.id, error = %e, "abandon_block failed");
    }
}

/// `complete`, retried with a doubling backoff from 100 ms until it says the file is closed or
/// the deadline (the RPC timeout) passes.
pub(crate) async fn complete(
    meta: &MetadataClient,
    path: &str,
    last: Option<ExtendedBlock>,
) -> Result<(), ClientError> {
    let timeout = meta.timeout();
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(100);
    loop {
        if meta.complete(path, last).await? {
            info!(last = ?last.map(|b| b.id), "file complete");
            return Ok(());
        }
        if Instant::now() + delay > deadline {
            return Err(ClientError::CompleteTimeout {
                path: path.to_string(),
                after: timeout,
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}
