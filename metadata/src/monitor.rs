//! The monitor task: every `monitor.interval` it runs the state's periodic pass
//! ([`crate::state::State::tick`], plain logic tested without a runtime) — liveness, lease
//! recovery, replica repair — logs its decisions, and flushes the store when one of them
//! changed the namespace (a file closed, a recovery id handed out) so that the commands they
//! imply are released.

use crate::service::Shared;
use crate::state::MonitorAction;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Runs until `shutdown`.
pub async fn run(shared: Arc<Shared>, interval: Duration, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let actions = shared.lock().tick(Instant::now());
        for action in &actions {
            log(action);
        }
        // A closed file or a recovery id handed out is a namespace change: its commands wait
        // for this flush (a no-op when the pass changed nothing).
        if let Err(e) = shared.flush().await {
            tracing::error!(error = %e, "metadata store flush after the monitor pass failed");
        }
    }
}

fn log(action: &MonitorAction) {
    match action {
        MonitorAction::NodeStale { node } => {
            tracing::warn!(node = %node, "DataNode is stale: no heartbeat for the stale interval");
        }
        MonitorAction::NodeDead { node, replicas } => {
            tracing::warn!(
                node = %node,
                replicas,
                "DataNode is dead: its replicas no longer count and are re-replicated"
            );
        }
        MonitorAction::LeaseExpired { holder, files } => {
            tracing::warn!(
                holder = %holder,
                files = files.len(),
                "lease passed the hard limit: recovering its files"
            );
        }
        MonitorAction::FileClosed { file } => {
            tracing::info!(file = file.0, "lease recovery closed the file");
        }
        MonitorAction::BlockRecoveryStarted {
            block,
            primary,
            recovery_id,
        } => {
            tracing::info!(block = %block, node = %primary, recovery_id = %recovery_id, "block recovery started");
        }
        MonitorAction::ReplicationScheduled {
            block,
            source,
            targets,
        } => {
            tracing::info!(block = %block, node = %source, targets = ?targets, "re-replication scheduled");
        }
        MonitorAction::ExcessReplicas { block, nodes } => {
            tracing::info!(block = %block, nodes = ?nodes, "deleting excess replicas");
        }
        MonitorAction::CorruptReplicasDeleted { block, nodes } => {
            tracing::info!(block = %block, nodes = ?nodes, "deleting corrupt replicas (replaced)");
        }
    }
}
