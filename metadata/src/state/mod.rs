//! The metadata service's state: namespace, block manager, DataNode registry and leases,
//! behind one lock. Every method is plain synchronous logic taking `now`; the RPC layer locks,
//! calls, unlocks, and flushes the store before answering a change.
//!
//! Order of a change (see `docs/metadata.md`): validate everything first; apply the namespace
//! batch to the store; only then update the in-memory maps (so a failed store write leaves
//! memory as the store is); the caller flushes; then it answers.

mod append;
mod lease;
mod pipeline;
mod read;
mod repair;
mod reports;
mod tree;
mod write;

pub use reports::MonitorAction;

use crate::blocks::{BlockInfo, BlockManager};
use crate::datanodes::DatanodeRegistry;
use crate::events::{Event, EventLog};
use crate::leases::LeaseManager;
use crate::namespace::{BlockState, Inode, InodeKind, Namespace, NsPath};
use crate::placement::{choose_targets, Candidate, PlacementRequest};
use crate::recovery::Recoveries;
use crate::replication::ReplicationQueues;
use crate::store::{MetaStore, StoreError};
use rand::rngs::StdRng;
use rand::SeedableRng;
use sluice_common::config::MetadataConfig;
use sluice_common::rpc::NodeState;
use sluice_common::{BlockId, DatanodeId, MetaError, NodeId};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

/// Most replicas deleted by one heartbeat's `Delete` command.
pub const MAX_DELETES_PER_HEARTBEAT: usize = 1000;

/// Counters of the repair work, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairCounters {
    /// Re-replication copies scheduled (one per target).
    pub replications_scheduled: u64,
    /// Excess replicas scheduled for deletion.
    pub excess_deleted: u64,
    /// Corrupt replicas scheduled for deletion.
    pub corrupt_deleted: u64,
    /// Block recovery attempts started.
    pub recoveries_started: u64,
    /// Block recoveries reported by their primary.
    pub recoveries_committed: u64,
    /// Files closed by lease recovery.
    pub leases_recovered: u64,
    /// Pipelines rebuilt by writers (`update_pipeline` accepted).
    pub pipeline_recoveries: u64,
}

/// Repair gauges and counters, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Blocks waiting for re-replication.
    pub needed: u64,
    /// Re-replication copies in flight.
    pub pending: u64,
    /// Block recoveries in progress.
    pub recovering: u64,
    /// Totals since start.
    pub counters: RepairCounters,
}

/// Everything the service knows.
pub struct State {
    cfg: MetadataConfig,
    ns: Namespace,
    blocks: BlockManager,
    nodes: DatanodeRegistry,
    leases: LeaseManager,
    replication: ReplicationQueues,
    recoveries: Recoveries,
    /// Blocks whose excess replicas wait for a stale holder to come back or die.
    postponed: BTreeSet<BlockId>,
    counters: RepairCounters,
    /// Recent events for the web UI.
    events: EventLog,
    rng: StdRng,
    last_tick: Option<Instant>,
    /// When the state was opened: DataNodes need a moment to report their replicas.
    opened: Instant,
}

impl State {
    /// Opens the namespace in `store` and rebuilds the block map and leases from the files.
    pub fn open(
        cfg: &MetadataConfig,
        store: Arc<dyn MetaStore>,
        now: Instant,
    ) -> Result<State, StoreError> {
        let clock = store.clock().clone();
        let (ns, files) = Namespace::open(store)?;
        let mut blocks = BlockManager::with_clock(clock.clone());
        let mut leases = LeaseManager::new();
        for inode in &files {
            let InodeKind::File(f) = &inode.kind else {
                continue;
            };
            for b in &f.blocks {
                blocks.insert(
                    b.id,
                    BlockInfo::new(inode.id, f.replication, b.extended(), b.state),
                );
            }
            if let Some(writer) = &f.writer {
                leases.add(writer, inode.id, now);
            }
        }
        Ok(State {
            cfg: cfg.clone(),
            ns,
            blocks,
            nodes: DatanodeRegistry::new(cfg.stale_interval.get(), cfg.dead_interval.get()),
            leases,
            replication: ReplicationQueues::new(),
            recoveries: Recoveries::with_clock(clock),
            postponed: BTreeSet::new(),
            counters: RepairCounters::default(),
            events: EventLog::default(),
            rng: StdRng::from_os_rng(),
            last_tick: None,
            opened: now,
        })
    }

    /// Repair queues and counters.
    pub fn repair_report(&self) -> RepairReport {
        RepairReport {
            needed: self.replication.needed_len() as u64,
            pending: self.replication.pending_len() as u64,
            recovering: self.recoveries.len() as u64,
            counters: self.counters,
        }
    }

    /// Recent events, newest first.
    pub fn events(&self) -> Vec<Event> {
        self.events.newest_first()
    }

    /// The store under the namespace.
    pub fn store(&self) -> Arc<dyn MetaStore> {
        self.ns.store().clone()
    }

    /// Files open for writing.
    pub fn open_files(&self) -> usize {
        self.leases.files()
    }

    /// The configuration.
    #[cfg(test)]
    pub fn config(&self) -> &MetadataConfig {
        &self.cfg
    }

    /// The file at `path` open for writing by `client`.
    fn open_file(&self, path: &NsPath, client: &str) -> Result<Inode, MetaError> {
        let inode = self.file_at(path)?;
        match inode.file().and_then(|f| f.writer.as_deref()) {
            None => Err(MetaError::NotUnderConstruction {
                path: path.to_string(),
            }),
            Some(w) if w != client => Err(MetaError::NotLeaseHolder {
                path: path.to_string(),
                client: client.to_string(),
            }),
            Some(_) => Ok(inode),
        }
    }

    /// The file at `path`.
    /// The replication factor of a file created without one (`replication.default`).
    pub fn default_replication(&self) -> u16 {
        self.cfg.default_replication
    }

    fn file_at(&self, path: &NsPath) -> Result<Inode, MetaError> {
        let inode = self.ns.resolve(path)?.ok_or_else(|| MetaError::NotFound {
            path: path.to_string(),
        })?;
        if inode.is_dir() {
            return Err(MetaError::IsADirectory {
                path: path.to_string(),
            });
        }
        Ok(inode)
    }

    /// Placement over the registered DataNodes.
    fn place(&mut self, req: &PlacementRequest<'_>) -> Result<Vec<DatanodeId>, MetaError> {
        let candidates: Vec<Candidate> = self
            .nodes
            .all()
            .into_iter()
            .map(|d| Candidate {
                id: d.id.clone(),
                state: d.state,
                remaining: d.remaining,
                load: d.used_fraction(),
            })
            .collect();
        choose_targets(&candidates, req, &mut self.rng)
    }

    /// The DataNodes of `ids` that are registered and not dead, in order.
    fn usable_ids(&self, ids: &[NodeId]) -> Vec<DatanodeId> {
        ids.iter()
            .filter(|n| self.nodes.is_usable(n))
            .filter_map(|n| self.nodes.get(n).map(|d| d.id.clone()))
            .collect()
    }

    /// True if `id` is Stale.
    fn is_stale(&self, id: &NodeId) -> bool {
        self.nodes.state(id) == Some(NodeState::Stale)
    }

    /// Completes a committed block that has `replication.min` good finalized replicas.
    /// Returns its state.
    fn try_complete(&mut self, id: sluice_common::BlockId) -> Option<BlockState> {
        let min = usize::from(self.cfg.min_replication);
        let info = self.blocks.get_mut(id)?;
        if info.state == BlockState::Committed && info.finalized_count() >= min {
            info.state = BlockState::Complete;
        }
        Some(info.state)
    }
}

#[cfg(test)]
mod tests;
