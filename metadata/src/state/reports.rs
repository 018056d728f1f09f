//! The DataNode protocol's logic (register, heartbeat with its commands, incremental and full
//! block reports), bad-replica reports from readers, and the monitor's periodic pass.

use super::lease::RECOVERY_HOLDER;
use super::{State, MAX_DELETES_PER_HEARTBEAT};
use crate::datanodes::HeartbeatOutcome;
use crate::events::{CorruptionSource, EventKind};
use crate::namespace::InodeId;
use sluice_common::proto::ReplicaState;
use sluice_common::rpc::{
    BadReplica, DatanodeCommand, DatanodeRegistration, Heartbeat, HeartbeatResponse, NodeState,
    RegisterResponse, ReplicaEvent, ReplicaReport,
};
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp, MetaError, NodeId};
use std::collections::HashSet;
use std::time::Instant;

/// A decision of the monitor, for its task to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MonitorAction {
    /// A DataNode missed heartbeats for the stale interval: placement avoids it.
    NodeStale {
        /// The DataNode.
        node: NodeId,
    },
    /// A DataNode missed heartbeats for the dead interval: its replicas no longer count and
    /// its blocks are re-replicated; `replicas` says how many it held.
    NodeDead {
        /// The DataNode.
        node: NodeId,
        /// Replicas it held.
        replicas: usize,
    },
    /// A writer did not renew its lease for the hard limit: its files are recovered.
    LeaseExpired {
        /// The writer.
        holder: String,
        /// Its open files.
        files: Vec<InodeId>,
    },
    /// Lease recovery closed a file.
    FileClosed {
        /// The file.
        file: InodeId,
    },
    /// A block recovery attempt started (a `RecoverBlock` command for the primary).
    BlockRecoveryStarted {
        /// The block.
        block: BlockId,
        /// The DataNode running it.
        primary: NodeId,
        /// Its recovery id.
        recovery_id: GenerationStamp,
    },
    /// A re-replication copy was scheduled.
    ReplicationScheduled {
        /// The block.
        block: BlockId,
        /// The DataNode that sends it.
        source: NodeId,
        /// The DataNodes that receive it.
        targets: Vec<NodeId>,
    },
    /// Excess replicas are being deleted.
    ExcessReplicas {
        /// The block.
        block: BlockId,
        /// Where.
        nodes: Vec<NodeId>,
    },
    /// Corrupt replicas are being deleted (enough good ones exist).
    CorruptReplicasDeleted {
        /// The block.
        block: BlockId,
        /// Where.
        nodes: Vec<NodeId>,
    },
}

impl MonitorAction {
    /// True if the action changed the namespace store (the monitor flushes it).
    pub fn is_durable(&self) -> bool {
        matches!(
            self,
            MonitorAction::FileClosed { .. } | MonitorAction::BlockRecoveryStarted { .. }
        )
    }
}

impl State {
    /// Registers (or re-registers) a DataNode.
    pub fn register(&mut self, reg: &DatanodeRegistration, now: Instant) -> RegisterResponse {
        self.nodes.register(reg, now);
        let stale_ms = self.cfg.stale_interval.get().as_millis() as u64;
        RegisterResponse {
            heartbeat_interval_ms: (stale_ms / 3).clamp(100, 3000),
            block_keys: None,
        }
    }

    /// Records a heartbeat; the answer carries queued deletions, re-replication copies (no
    /// more than the DataNode has free streams for) and block recoveries (or asks to
    /// re-register).
    pub fn heartbeat(&mut self, hb: &Heartbeat, now: Instant) -> HeartbeatResponse {
        if self.nodes.heartbeat(hb, now) == HeartbeatOutcome::Reregister {
            return HeartbeatResponse {
                commands: vec![DatanodeCommand::Reregister],
                block_keys: None,
            };
        }
        let blocks = self
            .blocks
            .take_deletions(&hb.node, MAX_DELETES_PER_HEARTBEAT);
        let mut commands = Vec::new();
        if !blocks.is_empty() {
            commands.push(DatanodeCommand::Delete { blocks });
        }
        commands.extend(self.transfer_commands(&hb.node, hb.transfers_in_progress, now));
        commands.extend(
            self.recoveries
                .take_commands(&hb.node)
                .into_iter()
                .map(DatanodeCommand::RecoverBlock),
        );
        HeartbeatResponse {
            commands,
            block_keys: None,
        }
    }

    fn check_registered(&self, node: &NodeId) -> Result<(), MetaError> {
        if self.nodes.is_usable(node) {
            Ok(())
        } else {
            Err(MetaError::UnknownDatanode { node: node.clone() })
        }
    }

    /// Incremental replica events.
    pub fn block_received(
        &mut self,
        node: &NodeId,
        events: &[ReplicaEvent],
    ) -> Result<(), MetaError> {
        self.check_registered(node)?;
        for event in events {
            match event {
                ReplicaEvent::Received(b) => {
                    self.blocks.add_replica(node, *b, ReplicaState::Finalized);
                    self.copy_arrived(b.id, node);
                    self.try_complete(b.id);
                }
                ReplicaEvent::Deleted(b) => self.blocks.remove_replica(node, b.id),
                ReplicaEvent::Corrupt(b) => self.replica_corrupt(node, *b),
            }
        }
        Ok(())
    }

    /// A full block report: replaces what is known of `node`'s replicas. Returns how many
    /// replicas were scheduled for deletion (unknown blocks, stale generation stamps).
    pub fn block_report(
        &mut self,
        node: &NodeId,
        replicas: &[ReplicaReport],
    ) -> Result<u64, MetaError> {
        self.check_registered(node)?;
        let reports = replicas
            .iter()
            .filter(|r| r.state != ReplicaState::Temporary)
            .map(|r| (r.block, r.state));
        let invalidated = self.blocks.replace_node_replicas(node, reports);
        for r in replicas {
            if r.state == ReplicaState::Finalized {
                self.copy_arrived(r.block.id, node);
            }
            self.try_complete(r.block.id);
            let doomed = self
                .blocks
                .get(r.block.id)
                .is_some_and(|info| info.deleting.contains(node));
            if doomed {
                // Still there: the Delete command was lost (say, the DataNode restarted).
                self.blocks.schedule_delete(node, r.block);
            }
        }
        Ok(invalidated)
    }

    /// The block scanner of `node` found its replica of `b` corrupt. A replica older than the
    /// block is simply deleted; a current one is marked corrupt (replaced, then deleted).
    fn replica_corrupt(&mut self, node: &NodeId, b: ExtendedBlock) {
        let Some(info) = self.blocks.get(b.id) else {
            self.blocks.schedule_delete(node, b);
            return;
        };
        if b.gen_stamp < info.gen_stamp {
            self.blocks.remove_replica(node, b.id);
            self.blocks.schedule_delete(node, b);
        } else {
            tracing::warn!(block = %b, node = %node, "the block scanner found a corrupt replica");
            if self.blocks.mark_corrupt(node, b.id) {
                self.events.push(EventKind::CorruptReplica {
                    block: b.id,
                    node: node.clone(),
                    found_by: CorruptionSource::Scanner,
                });
            }
        }
    }

    /// A finalized replica of `id` is on `node`: if it was a re-replication copy, that copy is
    /// done.
    fn copy_arrived(&mut self, id: BlockId, node: &NodeId) {
        if self.replication.arrived(id, node) {
            self.events.push(EventKind::ReplicationDone {
                block: id,
                target: node.clone(),
            });
        }
    }

    /// Marks replicas that served bad data corrupt. Unknown blocks are skipped.
    pub fn report_bad_blocks(&mut self, bad: &[BadReplica]) {
        for r in bad {
            if self.blocks.mark_corrupt(&r.node, r.block.id) {
                self.events.push(EventKind::CorruptReplica {
                    block: r.block.id,
                    node: r.node.clone(),
                    found_by: CorruptionSource::Reader,
                });
            } else {
                tracing::debug!(block = %r.block.id, node = %r.node, "bad replica of an unknown block");
            }
        }
    }

    /// The monitor's periodic pass at `now`: liveness transitions (a dead node's replicas are
    /// dropped and its copies rescheduled), leases (expiry reported once; recovery started or
    /// moved on) and replica repair.
    pub fn tick(&mut self, now: Instant) -> Vec<MonitorAction> {
        let mut actions = Vec::new();
        for change in self.nodes.check_liveness(now) {
            match change.to {
                NodeState::Dead => {
                    let replicas = self.blocks.remove_node(&change.node);
                    self.repair_node_dead(&change.node);
                    self.events.push(EventKind::DatanodeDead {
                        node: change.node.clone(),
                        replicas: replicas as u64,
                    });
                    actions.push(MonitorAction::NodeDead {
                        node: change.node,
                        replicas,
                    });
                }
                NodeState::Stale => actions.push(MonitorAction::NodeStale { node: change.node }),
                NodeState::Live => {}
            }
        }
        let hard = self.cfg.lease_hard_limit.get();
        let before: HashSet<String> = match self.last_tick {
            Some(t) => self
                .leases
                .expired(t, hard)
                .into_iter()
                .map(|(h, _)| h)
                .collect(),
            None => HashSet::new(),
        };
        for (holder, files) in self.leases.expired(now, hard) {
            if !before.contains(&holder) && holder != RECOVERY_HOLDER {
                actions.push(MonitorAction::LeaseExpired { holder, files });
            }
        }
        self.last_tick = Some(now);
        self.lease_pass(now, &mut actions);
        self.repair_pass(now, &mut actions);
        actions
    }
}
