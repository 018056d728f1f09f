//! The streamer's block calls to the metadata service: `add_block` (retried while the previous
//! block is not replicated yet), `abandon_block`, and `complete` (retried until the last block
//! is reported). The metadata service answers a repeated `add_block` (same `previous`, block
//! untouched) with the same block, and a repeated `complete`/`abandon_block` with the same
//! outcome, so these calls are retried after a reconnection.

use crate::error::ClientError;
use crate::filesystem::FsInner;
use sluice_common::rpc::LocatedBlock;
use sluice_common::{ExtendedBlock, MetaError, NodeId};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// `add_block`, retried with backoff while the previous block is not replicated yet.
pub(crate) async fn add_block(
    fs: &FsInner,
    path: &str,
    previous: Option<ExtendedBlock>,
    excluded: &[NodeId],
) -> Result<LocatedBlock, ClientError> {
    let deadline = Instant::now() + fs.cfg.rpc_timeout.get();
    let mut delay = Duration::from_millis(100);
    loop {
        let (path, client) = (path.to_string(), fs.client_name.clone());
        let excl = excluded.to_vec();
        let r = fs
            .call("add_block", true, |c, ctx| {
                let (path, client, excl) = (path.clone(), client.clone(), excl.clone());
                async move { c.add_block(ctx, path, client, previous, excl).await }
            })
            .await;
        match r {
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
pub(crate) async fn abandon(fs: &FsInner, path: &str, lb: &LocatedBlock) {
    let (path, client, block) = (path.to_string(), fs.client_name.clone(), lb.block);
    let r = fs
        .call("abandon_block", true, |c, ctx| {
            let (path, client) = (path.clone(), client.clone());
            async move { c.abandon_block(ctx, path, client, block).await }
        })
        .await;
    if let Err(e) = r {
        warn!(block = %block.id, error = %e, "abandon_block failed");
    }
}

/// `complete`, retried with a doubling backoff from 100 ms until it says the file is closed or
/// the deadline (the RPC timeout) passes.
pub(crate) async fn complete(
    fs: &FsInner,
    path: &str,
    last: Option<ExtendedBlock>,
) -> Result<(), ClientError> {
    let timeout = fs.cfg.rpc_timeout.get();
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(100);
    loop {
        let (p, client) = (path.to_string(), fs.client_name.clone());
        let done = fs
            .call("complete", true, |c, ctx| {
                let (p, client) = (p.clone(), client.clone());
                async move { c.complete(ctx, p, client, last).await }
            })
            .await?;
        if done {
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
