//! Lease recovery (HDFS's `internalReleaseLease`, `recoverLease` and
//! `commitBlockSynchronization`): closing a file whose writer disappeared.
//!
//! Triggers: the writer's lease passes `lease.hard.limit` (the monitor); another client's
//! `create` of the file after `lease.soft.limit` (it is told "being created by another writer"
//! meanwhile); `recover_lease` (at once, whatever the limits).
//!
//! What happens to the file:
//! 1. No block, or every block complete: the file is closed at once.
//! 2. Otherwise the lease moves to [`RECOVERY_HOLDER`] (persisted), so that the old writer's
//!    next call fails (`NotLeaseHolder`) and its renewals keep nothing alive. Then:
//!    - the last block committed but not yet on `replication.min` DataNodes, or an earlier
//!      block not complete: wait for the replicas (looked at again every monitor pass);
//!    - the last block under construction, with no DataNode known to hold it and no byte
//!      recorded: it is dropped and the file closed;
//!    - otherwise **block recovery**: a new recovery id (a generation stamp from the persisted
//!      counter) and a primary DataNode among the block's locations (the pipeline and the
//!      DataNodes that reported a replica); the primary gets `RecoverBlock` in its next
//!      heartbeat reply, agrees a length with the other locations (HDFS's rules, see
//!      `docs/recovery.md`) and reports with `commit_block_synchronization`, which records the
//!      block (new stamp, length, locations) or drops it, and closes the file. A length below
//!      what the writer hsynced (`fsync`) is refused: those bytes were acknowledged. An attempt not
//!      reported within `block.recovery.timeout` is started again with another primary and a
//!      new recovery id; the late report of an old attempt is refused.
//!
//! After a restart of the service the lease (held by the recovery holder or not) is rebuilt
//! from the file record and renewed, and no recovery starts during the first
//! `datanode.stale.interval` (HDFS's safe mode, reduced): the locations of an open block are
//! known only once DataNodes have reported, and a block nobody seems to hold would be dropped.

use super::{MonitorAction, State};
use crate::namespace::{now_ms, BlockState, Inode, InodeId, NsPath, Txn};
use crate::recovery::{choose_primary, BlockRecovery, PrimaryCandidate};
use sluice_common::proto::ReplicaState;
use sluice_common::rpc::{BlockSync, RecoveringBlock};
use sluice_common::{BlockId, DatanodeId, ExtendedBlock, MetaError, NodeId};
use std::collections::BTreeSet;
use std::time::Instant;

/// The lease holder of files under lease recovery (HDFS's `HDFS_NameNode`).
pub const RECOVERY_HOLDER: &str = "sluice-metadata-lease-recovery";

/// Where the lease recovery of a file stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseRecovery {
    /// The file is closed.
    Closed,
    /// Its last block is being recovered by a DataNode.
    BlockRecovery,
    /// Waiting for DataNodes (committed blocks to be reported, or any location at all).
    Waiting,
}

impl State {
    /// `recover_lease`: starts (or checks) the recovery of the file at `path`; true once closed.
    pub fn recover_lease(
        &mut self,
        path: &str,
        client: &str,
        now: Instant,
    ) -> Result<bool, MetaError> {
        let p = NsPath::parse(path)?;
        let inode = self.file_at(&p)?;
        let Some(holder) = inode.file().and_then(|f| f.writer.clone()) else {
            return Ok(true);
        };
        tracing::info!(path = %p, holder = %holder, by = client, "lease recovery asked");
        let mut actions = Vec::new();
        let outcome = self.release_lease(inode.id, now, &mut actions)?;
        log_actions(&actions);
        Ok(outcome == LeaseRecovery::Closed)
    }

    /// `create` over a file held by another writer: past the soft limit (or already under
    /// recovery) its lease is recovered; unless that closed the file at once, the caller gets
    /// `LeaseConflict`.
    pub(super) fn check_lease_for_create(
        &mut self,
        p: &NsPath,
        client: &str,
        now: Instant,
    ) -> Result<(), MetaError> {
        let Some(existing) = self.ns.resolve(p)? else {
            return Ok(());
        };
        let Some(holder) = existing.file().and_then(|f| f.writer.clone()) else {
            return Ok(());
        };
        if holder == client {
            return Ok(());
        }
        let soft = self.cfg.lease_soft_limit.get();
        let expired = holder == RECOVERY_HOLDER
            || self
                .leases
                .renewed_at(&holder)
                .is_none_or(|t| now.saturating_duration_since(t) >= soft);
        if expired {
            let mut actions = Vec::new();
            let outcome = self.release_lease(existing.id, now, &mut actions)?;
            log_actions(&actions);
            if outcome == LeaseRecovery::Closed {
                return Ok(());
            }
        }
        Err(MetaError::LeaseConflict {
            path: p.to_string(),
            holder,
        })
    }

    /// The monitor's lease work: recover the files of writers past the hard limit, and move on
    /// the recoveries in progress.
    pub(super) fn lease_pass(&mut self, now: Instant, actions: &mut Vec<MonitorAction>) {
        let hard = self.cfg.lease_hard_limit.get();
        let mut files: BTreeSet<InodeId> = self
            .leases
            .expired(now, hard)
            .into_iter()
            .filter(|(h, _)| h != RECOVERY_HOLDER)
            .flat_map(|(_, f)| f)
            .collect();
        files.extend(self.leases.files_of(RECOVERY_HOLDER));
        for file in files {
            if let Err(e) = self.release_lease(file, now, actions) {
                tracing::warn!(
                    file = file.0,
                    "lease recovery failed, retried next pass: {e}"
                );
            }
        }
    }

    /// HDFS's `internalReleaseLease` for one file.
    pub(super) fn release_lease(
        &mut self,
        file: InodeId,
        now: Instant,
        actions: &mut Vec<MonitorAction>,
    ) -> Result<LeaseRecovery, MetaError> {
        if now.saturating_duration_since(self.opened) < self.cfg.stale_interval.get() {
            // Just started: the DataNodes have not all reported their replicas yet, and the
            // locations of open blocks come only from them.
            return Ok(LeaseRecovery::Waiting);
        }
        let Some(mut inode) = self.ns.get(file)? else {
            return Ok(LeaseRecovery::Closed);
        };
        let Some((holder, blocks)) = inode
            .file()
            .and_then(|f| f.writer.clone().map(|w| (w, f.blocks.clone())))
        else {
            return Ok(LeaseRecovery::Closed);
        };
        let Some((last, before)) = blocks.split_last() else {
            self.close_recovered(inode, &holder, actions)?;
            return Ok(LeaseRecovery::Closed);
        };
        let before_complete = before
            .iter()
            .all(|b| self.try_complete(b.id) == Some(BlockState::Complete));
        let last_state = self.try_complete(last.id).unwrap_or(last.state);
        if before_complete && last_state == BlockState::Complete {
            self.close_recovered(inode, &holder, actions)?;
            return Ok(LeaseRecovery::Closed);
        }
        self.reassign_to_recovery(&mut inode, &holder, now)?;
        if last_state != BlockState::UnderConstruction {
            tracing::debug!(
                file = file.0,
                "lease recovery waits for committed blocks' replicas"
            );
            return Ok(LeaseRecovery::Waiting);
        }
        self.recover_last_block(inode, last.id, now, actions)
    }

    /// Gives the file's lease to [`RECOVERY_HOLDER`] (persisted).
    fn reassign_to_recovery(
        &mut self,
        inode: &mut Inode,
        holder: &str,
        now: Instant,
    ) -> Result<(), MetaError> {
        if holder == RECOVERY_HOLDER {
            return Ok(());
        }
        if let Some(f) = inode.file_mut() {
            f.writer = Some(RECOVERY_HOLDER.to_string());
        }
        self.ns.update(inode)?;
        self.leases.remove(holder, inode.id);
        self.leases.add(RECOVERY_HOLDER, inode.id, now);
        tracing::info!(
            file = inode.id.0,
            old_holder = holder,
            "lease reassigned for recovery"
        );
        Ok(())
    }

    /// Closes a file whose blocks are all complete; releases `holder`'s lease.
    fn close_recovered(
        &mut self,
        mut inode: Inode,
        holder: &str,
        actions: &mut Vec<MonitorAction>,
    ) -> Result<(), MetaError> {
        if let Some(f) = inode.file_mut() {
            for b in &mut f.blocks {
                b.state = BlockState::Complete;
            }
            f.writer = None;
            f.closed_by = Some(RECOVERY_HOLDER.to_string());
        }
        inode.mtime_ms = now_ms();
        self.ns.update(&inode)?;
        self.leases.remove(holder, inode.id);
        self.counters.leases_recovered += 1;
        actions.push(MonitorAction::FileClosed { file: inode.id });
        Ok(())
    }

    /// Starts (or keeps) the block recovery of the file's under-construction last block.
    fn recover_last_block(
        &mut self,
        inode: Inode,
        id: BlockId,
        now: Instant,
        actions: &mut Vec<MonitorAction>,
    ) -> Result<LeaseRecovery, MetaError> {
        let timeout = self.cfg.block_recovery_timeout.get();
        let previous = self.recoveries.get(id).cloned();
        if previous.is_some() && !self.recoveries.timed_out(id, now, timeout) {
            return Ok(LeaseRecovery::BlockRecovery);
        }
        let info = self
            .blocks
            .get(id)
            .ok_or(MetaError::UnknownBlock { block: id })?;
        let (empty, held) = (info.num_bytes == 0, !info.replicas.is_empty());
        let locations = self.recovery_locations(id);
        if locations.is_empty() {
            if empty && !held {
                tracing::info!(block = %id, "no DataNode holds the empty last block: dropping it");
                self.drop_last_block(inode, id, actions)?;
                return Ok(LeaseRecovery::Closed);
            }
            tracing::warn!(block = %id, "no live DataNode holds the last block: recovery waits");
            return Ok(LeaseRecovery::Waiting);
        }
        let mut tried = previous.map(|r| r.tried).unwrap_or_default();
        if let Some(old) = self.recoveries.get(id) {
            tried.insert(old.primary.clone());
        }
        let started = self.start_attempt(inode.id, id, locations, tried, now)?;
        if let Some(action) = started {
            actions.push(action);
            return Ok(LeaseRecovery::BlockRecovery);
        }
        Ok(LeaseRecovery::Waiting)
    }

    /// Removes the file's empty last block and closes the file.
    fn drop_last_block(
        &mut self,
        mut inode: Inode,
        id: BlockId,
        actions: &mut Vec<MonitorAction>,
    ) -> Result<(), MetaError> {
        if let Some(f) = inode.file_mut() {
            f.blocks.pop();
        }
        self.blocks.remove(id);
        self.recoveries.finish(id);
        self.close_recovered(inode, RECOVERY_HOLDER, actions)
    }

    /// A recovery attempt on block `id`: a new recovery id (persisted counter) and a primary
    /// among `locations`; its command waits for the primary's heartbeat. `None` if no location
    /// can be primary.
    fn start_attempt(
        &mut self,
        file: InodeId,
        id: BlockId,
        locations: Vec<DatanodeId>,
        tried: BTreeSet<NodeId>,
        now: Instant,
    ) -> Result<Option<MonitorAction>, MetaError> {
        let cands: Vec<PrimaryCandidate> = locations
            .iter()
            .filter_map(|d| self.nodes.get(&d.node_id))
            .map(|d| PrimaryCandidate {
                node: d.id.node_id.clone(),
                state: d.state,
                last_seen: d.last_seen,
            })
            .collect();
        let Some(primary) = choose_primary(&cands, &tried) else {
            return Ok(None);
        };
        let recovery_id = self.ns.alloc_gen_stamp();
        self.ns.commit(Txn::new())?;
        let Some(info) = self.blocks.get_mut(id) else {
            return Err(MetaError::UnknownBlock { block: id });
        };
        info.pending_gen_stamp = Some(recovery_id);
        let block = info.extended(id);
        tracing::info!(block = %block, primary = %primary, recovery_id = %recovery_id, "block recovery started");
        let rec = BlockRecovery {
            file,
            recovery_id,
            primary: primary.clone(),
            tried,
            started: now,
        };
        let cmd = RecoveringBlock {
            block,
            recovery_id,
            locations,
            token: None,
        };
        self.recoveries.start(rec, cmd);
        self.counters.recoveries_started += 1;
        Ok(Some(MonitorAction::BlockRecoveryStarted {
            block: id,
            primary,
            recovery_id,
        }))
    }

    /// The DataNodes (not dead) that may hold a replica of `id`: its pipeline, then every
    /// DataNode that reported a replica not older than the block.
    fn recovery_locations(&self, id: BlockId) -> Vec<DatanodeId> {
        let Some(info) = self.blocks.get(id) else {
            return vec![];
        };
        let mut nodes: Vec<NodeId> = info.expected.clone();
        let mut reported: Vec<NodeId> = info
            .replicas
            .iter()
            .filter(|(_, r)| r.gen_stamp >= info.gen_stamp && r.state != ReplicaState::Temporary)
            .map(|(n, _)| n.clone())
            .collect();
        reported.sort();
        for n in reported {
            if !nodes.contains(&n) {
                nodes.push(n);
            }
        }
        self.usable_ids(&nodes)
    }

    /// `commit_block_synchronization`: the primary's report of a block recovery.
    pub fn commit_block_synchronization(
        &mut self,
        sync: &BlockSync,
        _now: Instant,
    ) -> Result<(), MetaError> {
        let id = sync.block.id;
        let Some(file) = self.check_sync(sync)? else {
            return Ok(());
        };
        let mut inode = self
            .ns
            .get(file)?
            .ok_or(MetaError::UnknownBlock { block: id })?;
        let holder = inode.file().and_then(|f| f.writer.clone()).ok_or_else(|| {
            MetaError::NotUnderConstruction {
                path: format!("inode {}", file.0),
            }
        })?;
        let targets: Vec<NodeId> = sync
            .new_targets
            .iter()
            .filter(|n| self.nodes.get(n).is_some())
            .cloned()
            .collect();
        let close = self.record_recovered_block(&mut inode, sync, targets.len())?;
        self.ns.update(&inode)?;
        if sync.delete_block {
            self.blocks.remove(id);
        } else {
            self.apply_recovered(sync, &targets);
        }
        self.recoveries.finish(id);
        self.counters.recoveries_committed += 1;
        if close {
            self.leases.remove(&holder, file);
            self.counters.leases_recovered += 1;
            tracing::info!(file = file.0, block = %id, "file closed by lease recovery");
        }
        Ok(())
    }

    /// Checks a recovery report against the attempt in progress: `Some(file)` to apply it,
    /// `None` for a harmless repeat of a report already applied.
    fn check_sync(&self, sync: &BlockSync) -> Result<Option<InodeId>, MetaError> {
        let id = sync.block.id;
        let Some(info) = self.blocks.get(id) else {
            // A retried report after the block was dropped, or the file was deleted meanwhile.
            return if sync.delete_block {
                Ok(None)
            } else {
                Err(MetaError::UnknownBlock { block: id })
            };
        };
        let mismatch = |current| MetaError::GenerationStampMismatch {
            block: id,
            given: sync.new_gen_stamp,
            current,
        };
        match self.recoveries.get(id) {
            Some(r) if r.recovery_id == sync.new_gen_stamp => Ok(Some(info.file)),
            Some(r) => Err(mismatch(r.recovery_id)),
            None if info.gen_stamp == sync.new_gen_stamp
                && info.num_bytes == sync.new_length
                && info.state != BlockState::UnderConstruction =>
            {
                Ok(None)
            }
            None => Err(mismatch(info.gen_stamp)),
        }
    }

    /// Updates the file record for a recovered (or dropped) last block; closes it when asked
    /// and every block is complete. Returns whether it closed.
    fn record_recovered_block(
        &mut self,
        inode: &mut Inode,
        sync: &BlockSync,
        targets: usize,
    ) -> Result<bool, MetaError> {
        let id = sync.block.id;
        let min = usize::from(self.cfg.min_replication);
        let f = inode
            .file_mut()
            .ok_or(MetaError::UnknownBlock { block: id })?;
        if f.blocks.last().map(|b| b.id) != Some(id) {
            return Err(MetaError::invalid_argument(
                "block",
                format!("{id} is not the last block of its file"),
            ));
        }
        if !sync.delete_block {
            f.check_last_length(sync.new_length, "new_length")?;
        }
        let acked = f.blocks.last().map_or(0, |b| b.num_bytes);
        if !sync.delete_block && sync.new_length < acked {
            // The writer hsynced `acked` bytes: every replica acknowledged them.
            return Err(MetaError::invalid_argument(
                "new_length",
                format!(
                    "{} is below the {acked} bytes acknowledged for {id}",
                    sync.new_length
                ),
            ));
        }
        if sync.delete_block {
            f.blocks.pop();
        } else if let Some(last) = f.blocks.last_mut() {
            last.gen_stamp = sync.new_gen_stamp;
            last.num_bytes = sync.new_length;
            last.state = if targets >= min {
                BlockState::Complete
            } else {
                BlockState::Committed
            };
        }
        let before: Vec<BlockId> = f.blocks.iter().map(|b| b.id).filter(|b| *b != id).collect();
        let last_ok = f
            .blocks
            .last()
            .is_none_or(|b| b.id != id || b.state == BlockState::Complete);
        let before_ok = before
            .iter()
            .all(|b| self.try_complete(*b) == Some(BlockState::Complete));
        let close = sync.close_file && last_ok && before_ok;
        let f = inode
            .file_mut()
            .ok_or(MetaError::UnknownBlock { block: id })?;
        if close {
            for b in &mut f.blocks {
                b.state = BlockState::Complete;
            }
            f.writer = None;
            f.closed_by = Some(RECOVERY_HOLDER.to_string());
            inode.mtime_ms = now_ms();
        }
        Ok(close)
    }

    /// Applies a recovered block to the block map: stamp, length, locations; replicas left with
    /// an older stamp are forgotten and deleted.
    fn apply_recovered(&mut self, sync: &BlockSync, targets: &[NodeId]) {
        let id = sync.block.id;
        let min = usize::from(self.cfg.min_replication);
        let mut stale = Vec::new();
        if let Some(info) = self.blocks.get_mut(id) {
            info.gen_stamp = sync.new_gen_stamp;
            info.num_bytes = sync.new_length;
            info.pending_gen_stamp = None;
            info.expected = targets.to_vec();
            info.state = if targets.len() >= min {
                BlockState::Complete
            } else {
                BlockState::Committed
            };
            for (n, r) in &info.replicas {
                if r.gen_stamp < sync.new_gen_stamp && !targets.contains(n) {
                    stale.push((n.clone(), ExtendedBlock::new(id, r.gen_stamp, r.num_bytes)));
                }
            }
        }
        for (n, b) in stale {
            self.blocks.remove_replica(&n, id);
            self.blocks.schedule_delete(&n, b);
        }
        let recovered = ExtendedBlock::new(id, sync.new_gen_stamp, sync.new_length);
        for n in targets {
            self.blocks
                .add_replica(n, recovered, ReplicaState::Finalized);
        }
    }
}

fn log_actions(actions: &[MonitorAction]) {
    for a in actions {
        tracing::info!(action = ?a, "lease recovery");
    }
}
