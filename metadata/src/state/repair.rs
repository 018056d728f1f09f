//! Replica repair, the metadata side (HDFS's `RedundancyMonitor`): for every block that
//! changed, decide whether it needs copies (a dead DataNode, a corrupt replica), has too many
//! (a DataNode came back, a copy arrived twice) or has corrupt replicas that can go; then
//! schedule copies from live holders to new targets, rate-limited, and hand them out in
//! heartbeat replies.
//!
//! Rules (HDFS's):
//! - only Complete blocks are repaired (the last block of an open file is the writer's);
//! - a block needs copies while good replicas + copies in flight < its replication factor and
//!   it has at least one good replica (none: it is missing, nothing to copy from);
//! - a pass examines at most `replication.work-multiplier` × live DataNodes blocks, fewest
//!   good replicas first (rotating within a level); a source DataNode is given a copy only while fewer than
//!   `replication.max-streams` wait in its queue, and a heartbeat hands out at most
//!   `max-streams` minus the copies the DataNode says it is running;
//! - excess good replicas are deleted (keep rack spread, then free the fullest DataNode),
//!   postponed while a holder is stale (its report may be out of date);
//! - corrupt replicas are deleted once the good ones reach the replication factor.

use super::{MonitorAction, State};
use crate::namespace::BlockState;
use crate::placement::{choose_excess, Holder, PlacementRequest};
use crate::replication::TransferWork;
use rand::seq::IndexedRandom;
use sluice_common::rpc::{DatanodeCommand, NodeState};
use sluice_common::{BlockId, DatanodeId, ExtendedBlock, MetaError, NodeId};
use std::time::Instant;

/// What one block needs, as decided by [`State::check_block`].
#[derive(Debug, Default, PartialEq, Eq)]
struct Verdict {
    /// Good replicas, when more are needed.
    needed: Option<usize>,
    /// Good replicas to delete as excess.
    excess: Vec<NodeId>,
    /// Corrupt replicas to delete.
    corrupt: Vec<NodeId>,
    /// A holder is stale: look again next pass.
    postpone: bool,
}

impl State {
    /// The repair part of the monitor pass.
    pub(super) fn repair_pass(&mut self, now: Instant, actions: &mut Vec<MonitorAction>) {
        let timeout = self.cfg.replication_pending_timeout.get();
        for id in self.replication.timed_out(now, timeout) {
            tracing::warn!(block = %id, "re-replication copy did not arrive in time; rescheduling");
            self.blocks.mark_dirty(id);
        }
        for id in std::mem::take(&mut self.postponed) {
            self.blocks.mark_dirty(id);
        }
        for id in self.blocks.take_dirty() {
            self.check_block(id, actions);
        }
        self.schedule_replication(now, actions);
    }

    /// Classifies one block and schedules its deletions.
    fn check_block(&mut self, id: BlockId, actions: &mut Vec<MonitorAction>) {
        let Some(v) = self.verdict(id) else {
            self.replication.forget(id);
            return;
        };
        self.replication.set_needed(id, v.needed);
        if v.postpone {
            self.postponed.insert(id);
        }
        if !v.excess.is_empty() {
            self.delete_replicas(id, &v.excess, true);
            self.counters.excess_deleted += v.excess.len() as u64;
            actions.push(MonitorAction::ExcessReplicas {
                block: id,
                nodes: v.excess,
            });
        }
        if !v.corrupt.is_empty() {
            self.delete_replicas(id, &v.corrupt, false);
            self.counters.corrupt_deleted += v.corrupt.len() as u64;
            actions.push(MonitorAction::CorruptReplicasDeleted {
                block: id,
                nodes: v.corrupt,
            });
        }
    }

    /// What block `id` needs (`None`: it no longer exists).
    fn verdict(&self, id: BlockId) -> Option<Verdict> {
        let info = self.blocks.get(id)?;
        if info.state != BlockState::Complete {
            return Some(Verdict::default());
        }
        let good = info.good_nodes();
        let rep = usize::from(info.replication);
        let pending = self.replication.pending_count(id);
        let mut v = Verdict::default();
        if !good.is_empty() && good.len() + pending < rep {
            v.needed = Some(good.len());
        }
        if good.len() > rep {
            if good.iter().any(|n| self.is_stale(n)) {
                v.postpone = true;
            } else {
                let holders: Vec<Holder> = good
                    .iter()
                    .filter_map(|n| self.nodes.get(n))
                    .map(|d| Holder {
                        id: d.id.clone(),
                        remaining: d.remaining,
                    })
                    .collect();
                v.excess = choose_excess(&holders, good.len() - rep);
            }
        }
        if good.len() >= rep {
            v.corrupt = info
                .corrupt
                .iter()
                .filter(|n| info.replicas.contains_key(*n) && !info.deleting.contains(*n))
                .cloned()
                .collect();
        }
        Some(v)
    }

    /// Queues the deletion of the replicas of `id` on `nodes`, marked as being deleted.
    fn delete_replicas(&mut self, id: BlockId, nodes: &[NodeId], excess: bool) {
        let mut doomed = Vec::new();
        if let Some(info) = self.blocks.get_mut(id) {
            for n in nodes {
                if let Some(r) = info.replicas.get(n) {
                    doomed.push((n.clone(), ExtendedBlock::new(id, r.gen_stamp, r.num_bytes)));
                }
                info.deleting.insert(n.clone());
            }
        }
        for (n, b) in doomed {
            tracing::info!(block = %id, node = %n, excess, "deleting a replica");
            self.blocks.schedule_delete(&n, b);
        }
    }

    /// Schedules copies for the neediest blocks, within the per-pass budget.
    fn schedule_replication(&mut self, now: Instant, actions: &mut Vec<MonitorAction>) {
        let live = self.nodes.counts().0 as usize;
        let budget = live * self.cfg.replication_work_multiplier as usize;
        for id in self.replication.next_needed(budget) {
            match self.schedule_block(id, now) {
                Ok(Some((source, targets))) => {
                    self.counters.replications_scheduled += targets.len() as u64;
                    actions.push(MonitorAction::ReplicationScheduled {
                        block: id,
                        source,
                        targets,
                    });
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(block = %id, "cannot re-replicate yet: {e}"),
            }
        }
    }

    /// Picks a source and targets for block `id`; `Ok(None)` if nothing is to do or no source
    /// has a free slot.
    fn schedule_block(
        &mut self,
        id: BlockId,
        now: Instant,
    ) -> Result<Option<(NodeId, Vec<NodeId>)>, MetaError> {
        let Some(info) = self.blocks.get(id) else {
            self.replication.forget(id);
            return Ok(None);
        };
        let block = info.extended(id);
        let good = info.good_nodes();
        let rep = usize::from(info.replication);
        let pending = self.replication.pending_targets(id);
        let wanted = rep.saturating_sub(good.len() + pending.len());
        if wanted == 0 || good.is_empty() {
            self.replication.set_needed(id, None);
            return Ok(None);
        }
        let mut exclude: Vec<NodeId> = info.replicas.keys().cloned().collect();
        exclude.extend(pending);
        let Some(source) = self.choose_source(&good) else {
            return Ok(None);
        };
        let existing: Vec<DatanodeId> = self.usable_ids(&good);
        let targets = self.place_up_to(wanted, block.num_bytes, &existing, &exclude)?;
        if targets.is_empty() {
            return Ok(None);
        }
        let target_ids: Vec<NodeId> = targets.iter().map(|d| d.node_id.clone()).collect();
        tracing::info!(block = %id, source = %source, targets = ?target_ids, "scheduling re-replication");
        self.replication
            .schedule(&source, TransferWork { block, targets }, now);
        if good.len() + self.replication.pending_count(id) >= rep {
            self.replication.set_needed(id, None);
        }
        Ok(Some((source, target_ids)))
    }

    /// A random holder of a good replica whose queue has room, Live ones first.
    fn choose_source(&mut self, good: &[NodeId]) -> Option<NodeId> {
        let max = self.cfg.replication_max_streams as usize;
        for want in [NodeState::Live, NodeState::Stale] {
            let eligible: Vec<&NodeId> = good
                .iter()
                .filter(|n| self.nodes.state(n) == Some(want))
                .filter(|n| self.replication.queued_for(n) < max)
                .collect();
            if let Some(n) = eligible.choose(&mut self.rng) {
                return Some((*n).clone());
            }
        }
        None
    }

    /// Up to `count` targets (fewer if fewer DataNodes are eligible).
    fn place_up_to(
        &mut self,
        count: usize,
        size: u64,
        existing: &[DatanodeId],
        exclude: &[NodeId],
    ) -> Result<Vec<DatanodeId>, MetaError> {
        let req = PlacementRequest {
            count,
            block_size: size,
            existing,
            exclude,
        };
        match self.place(&req) {
            Err(MetaError::NotEnoughDatanodes { available, .. }) if available > 0 => {
                self.place(&PlacementRequest {
                    count: available as usize,
                    ..req
                })
            }
            Err(MetaError::NotEnoughDatanodes { .. }) => Ok(vec![]),
            other => other,
        }
    }

    /// The `Transfer` commands for a heartbeat of `node`, which runs `running` copies.
    pub(super) fn transfer_commands(
        &mut self,
        node: &NodeId,
        running: u32,
        now: Instant,
    ) -> Vec<DatanodeCommand> {
        let free = self.cfg.replication_max_streams.saturating_sub(running) as usize;
        let mut out = Vec::new();
        for w in self.replication.take_work(node, free, now) {
            let id = w.block.id;
            let valid = self.blocks.get(id).is_some_and(|info| {
                info.state == BlockState::Complete && info.gen_stamp == w.block.gen_stamp
            });
            if valid {
                out.push(DatanodeCommand::Transfer {
                    block: w.block,
                    targets: w.targets,
                    token: None,
                });
            } else {
                for t in &w.targets {
                    self.replication.arrived(id, &t.node_id);
                }
                self.blocks.mark_dirty(id);
            }
        }
        out
    }

    /// A DataNode died: the copies it was to send or receive are rescheduled.
    pub(super) fn repair_node_dead(&mut self, node: &NodeId) {
        for id in self.replication.node_dead(node) {
            self.blocks.mark_dirty(id);
        }
    }
}
