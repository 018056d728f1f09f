//! The monitor task: every `monitor.interval` it asks the state for its periodic decisions
//! ([`crate::state::State::tick`], plain logic tested without a runtime) and logs them. Acting
//! on them — re-replicating a dead DataNode's blocks, recovering expired leases — comes in later
//! issues and belongs here.

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
        for action in actions {
            log(&action);
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
                "DataNode is dead: its replicas no longer count (re-replication not yet implemented)"
            );
        }
        MonitorAction::LeaseExpired { holder, files } => {
            tracing::warn!(
                holder = %holder,
                files = files.len(),
                "lease passed the hard limit (lease recovery not yet implemented)"
            );
        }
    }
}
