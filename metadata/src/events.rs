//! The recent cluster events the web UI shows (DataNode dead, pipeline recovered,
//! re-replication done, corrupt replica found): a bounded ring, newest last, kept in the
//! [`crate::state::State`] and filled where the state decides each of them. Not persisted: a
//! restart starts an empty ring (the log keeps the history).

use sluice_common::{BlockId, ExtendedBlock, NodeId};
use std::collections::VecDeque;
use std::time::SystemTime;

/// Events kept; older ones are dropped.
pub const EVENT_RING_CAPACITY: usize = 100;

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// A DataNode missed heartbeats for the dead interval; its replicas no longer count.
    DatanodeDead {
        /// The DataNode.
        node: NodeId,
        /// Replicas it held.
        replicas: u64,
    },
    /// A writer rebuilt a block's pipeline under a new generation stamp.
    PipelineRecovered {
        /// The block under its new stamp and length.
        block: ExtendedBlock,
        /// The new pipeline.
        nodes: Vec<NodeId>,
    },
    /// A re-replication copy arrived at its target.
    ReplicationDone {
        /// The block.
        block: BlockId,
        /// The DataNode that now holds a copy.
        target: NodeId,
    },
    /// A replica was found corrupt (by a reader or by its DataNode's block scanner).
    CorruptReplica {
        /// The block.
        block: BlockId,
        /// The DataNode holding the corrupt replica.
        node: NodeId,
        /// Who found it.
        found_by: CorruptionSource,
    },
}

/// Who found a corrupt replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorruptionSource {
    /// A client whose read failed its checksums (`report_bad_blocks`).
    Reader,
    /// The DataNode's block scanner.
    Scanner,
}

impl EventKind {
    /// A short name, also the CSS class and the `data-kind` of the UI's row.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::DatanodeDead { .. } => "datanode-dead",
            EventKind::PipelineRecovered { .. } => "pipeline-recovered",
            EventKind::ReplicationDone { .. } => "replication-done",
            EventKind::CorruptReplica { .. } => "corrupt-replica",
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            EventKind::DatanodeDead { node, replicas } => {
                format!("DataNode dead: {node} ({replicas} replicas to re-replicate)")
            }
            EventKind::PipelineRecovered { block, nodes } => {
                let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
                format!(
                    "Pipeline recovered: {} at stamp {}, {} bytes, now on {}",
                    block.id,
                    block.gen_stamp,
                    block.num_bytes,
                    nodes.join(", ")
                )
            }
            EventKind::ReplicationDone { block, target } => {
                format!("Re-replication done: {block} copied to {target}")
            }
            EventKind::CorruptReplica {
                block,
                node,
                found_by,
            } => {
                let by = match found_by {
                    CorruptionSource::Reader => "a reader",
                    CorruptionSource::Scanner => "the block scanner",
                };
                format!("Corrupt replica found: {block} on {node}, by {by}")
            }
        }
    }
}

/// One event and when it happened (wall clock, for people).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// When.
    pub at: SystemTime,
    /// What.
    pub kind: EventKind,
}

/// The ring.
#[derive(Debug)]
pub struct EventLog {
    ring: VecDeque<Event>,
    capacity: usize,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog::with_capacity(EVENT_RING_CAPACITY)
    }
}

impl EventLog {
    /// A ring keeping at most `capacity` events (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        EventLog {
            ring: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Records `kind` now, dropping the oldest event if the ring is full.
    pub fn push(&mut self, kind: EventKind) {
        if self.ring.len() == self.capacity {
            self.ring.pop_front();
        }
        self.ring.push_back(Event {
            at: SystemTime::now(),
            kind,
        });
    }

    /// The events, newest first.
    pub fn newest_first(&self) -> Vec<Event> {
        self.ring.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead(n: u64) -> EventKind {
        EventKind::DatanodeDead {
            node: NodeId(format!("dn{n}")),
            replicas: n,
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_events_up_to_its_capacity() {
        let mut log = EventLog::with_capacity(3);
        for n in 0..5 {
            log.push(dead(n));
        }
        let kinds: Vec<EventKind> = log.newest_first().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds, vec![dead(4), dead(3), dead(2)]);
    }

    #[test]
    fn each_kind_is_named_and_described() {
        assert_eq!(dead(1).name(), "datanode-dead");
        assert!(dead(1).describe().starts_with("DataNode dead: dn1"));
        let c = EventKind::CorruptReplica {
            block: BlockId(7),
            node: NodeId("dn2".into()),
            found_by: CorruptionSource::Scanner,
        };
        assert!(
            c.describe().contains("by the block scanner"),
            "{}",
            c.describe()
        );
    }
}
