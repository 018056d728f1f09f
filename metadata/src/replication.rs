//! Re-replication bookkeeping as plain data (HDFS's `LowRedundancyBlocks`,
//! `PendingReconstructionBlocks` and each DataNode's replication queue):
//!
//! - **needed**: blocks with fewer good replicas (plus copies in flight) than their factor,
//!   by priority level — how many good replicas they have, fewest first, so a block down to one
//!   copy is repaired before one down to two. Within a level a bookmark rotates (HDFS's
//!   `LowRedundancyBlocks` bookmarks), so blocks that cannot be repaired yet (no free source, no
//!   eligible target) do not keep the others of their level waiting;
//! - **pending**: copies scheduled and not yet reported by their target, with the time they
//!   were scheduled (or handed to their source); a copy that does not arrive within
//!   `replication.pending.timeout` is dropped and its block looked at again;
//! - **work**: the `Transfer` commands waiting for their source DataNode's next heartbeat.
//!
//! The decisions (which block, which source, which targets) are the state's
//! (`state::repair`); this module only keeps their consequences consistent.

use sluice_common::{BlockId, DatanodeId, ExtendedBlock, NodeId};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ops::Bound::{Excluded, Included, Unbounded};
use std::time::{Duration, Instant};

/// One copy to make: `block` from the DataNode whose queue holds it to `targets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferWork {
    /// The block (generation stamp and length of the good replicas).
    pub block: ExtendedBlock,
    /// Where to copy it, in pipeline order.
    pub targets: Vec<DatanodeId>,
}

/// A copy in flight to one target.
#[derive(Debug, Clone)]
struct PendingCopy {
    target: NodeId,
    source: NodeId,
    since: Instant,
}

/// The re-replication queues.
#[derive(Debug, Default)]
pub struct ReplicationQueues {
    needed: BTreeSet<(usize, BlockId)>,
    needed_at: HashMap<BlockId, usize>,
    bookmarks: HashMap<usize, BlockId>,
    pending: HashMap<BlockId, Vec<PendingCopy>>,
    work: HashMap<NodeId, VecDeque<TransferWork>>,
}

impl ReplicationQueues {
    /// Empty queues.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `id` needs more replicas and has `good` good ones (`None`: it does not).
    pub fn set_needed(&mut self, id: BlockId, good: Option<usize>) {
        if let Some(old) = self.needed_at.remove(&id) {
            self.needed.remove(&(old, id));
        }
        if let Some(good) = good {
            self.needed.insert((good, id));
            self.needed_at.insert(id, good);
        }
    }

    /// Up to `n` blocks needing replicas, fewest good replicas first; within a level, from
    /// after the block the previous call stopped at, wrapping around.
    pub fn next_needed(&mut self, n: usize) -> Vec<BlockId> {
        let mut out = Vec::new();
        let mut level = self.needed.first().map(|(l, _)| *l);
        while let Some(l) = level {
            if out.len() >= n {
                break;
            }
            let lo = (l, BlockId(0));
            let hi = (l + 1, BlockId(0));
            let ids: Vec<BlockId> = match self.bookmarks.get(&l).copied() {
                Some(m) => self
                    .needed
                    .range((Excluded((l, m)), Excluded(hi)))
                    .chain(self.needed.range((Included(lo), Included((l, m)))))
                    .map(|(_, id)| *id)
                    .take(n - out.len())
                    .collect(),
                None => self
                    .needed
                    .range((Included(lo), Excluded(hi)))
                    .map(|(_, id)| *id)
                    .take(n - out.len())
                    .collect(),
            };
            if let Some(last) = ids.last() {
                self.bookmarks.insert(l, *last);
            }
            out.extend(ids);
            level = self
                .needed
                .range((Included(hi), Unbounded))
                .next()
                .map(|(l, _)| *l);
        }
        out
    }

    /// Blocks needing replicas.
    pub fn needed_len(&self) -> usize {
        self.needed.len()
    }

    /// Copies of `id` in flight.
    pub fn pending_count(&self, id: BlockId) -> usize {
        self.pending.get(&id).map_or(0, Vec::len)
    }

    /// Targets of the copies of `id` in flight.
    pub fn pending_targets(&self, id: BlockId) -> Vec<NodeId> {
        self.pending
            .get(&id)
            .map(|v| v.iter().map(|p| p.target.clone()).collect())
            .unwrap_or_default()
    }

    /// Copies in flight over all blocks.
    pub fn pending_len(&self) -> usize {
        self.pending.values().map(Vec::len).sum()
    }

    /// Commands queued for `source` and not yet handed out.
    pub fn queued_for(&self, source: &NodeId) -> usize {
        self.work.get(source).map_or(0, VecDeque::len)
    }

    /// Queues a copy from `source`; each target counts as pending from `now`.
    pub fn schedule(&mut self, source: &NodeId, work: TransferWork, now: Instant) {
        let pending = self.pending.entry(work.block.id).or_default();
        for t in &work.targets {
            pending.push(PendingCopy {
                target: t.node_id.clone(),
                source: source.clone(),
                since: now,
            });
        }
        self.work.entry(source.clone()).or_default().push_back(work);
    }

    /// Hands out up to `max` queued commands of `source`; their copies' timers restart now.
    /// A command whose copies all timed out meanwhile (the block was scheduled again) is
    /// dropped; one that lost some targets goes out with the others.
    pub fn take_work(&mut self, source: &NodeId, max: usize, now: Instant) -> Vec<TransferWork> {
        let Some(queue) = self.work.get_mut(source) else {
            return vec![];
        };
        let mut out = Vec::new();
        while out.len() < max {
            let Some(mut w) = queue.pop_front() else {
                break;
            };
            let Some(pending) = self.pending.get_mut(&w.block.id) else {
                continue;
            };
            w.targets.retain(|t| {
                pending
                    .iter()
                    .any(|p| &p.source == source && p.target == t.node_id)
            });
            for p in pending.iter_mut().filter(|p| &p.source == source) {
                p.since = now;
            }
            if !w.targets.is_empty() {
                out.push(w);
            }
        }
        if queue.is_empty() {
            self.work.remove(source);
        }
        out
    }

    /// The copy of `id` to `target` arrived (or will never come). True if it was pending.
    pub fn arrived(&mut self, id: BlockId, target: &NodeId) -> bool {
        let Some(v) = self.pending.get_mut(&id) else {
            return false;
        };
        let before = v.len();
        v.retain(|p| &p.target != target);
        let found = v.len() != before;
        if v.is_empty() {
            self.pending.remove(&id);
        }
        found
    }

    /// Drops the copies pending for longer than `timeout`; returns their blocks.
    pub fn timed_out(&mut self, now: Instant, timeout: Duration) -> Vec<BlockId> {
        let mut out = Vec::new();
        self.pending.retain(|id, v| {
            let before = v.len();
            v.retain(|p| now.saturating_duration_since(p.since) < timeout);
            if v.len() != before {
                out.push(*id);
            }
            !v.is_empty()
        });
        out.sort();
        out
    }

    /// A DataNode died: its queued commands and every copy from or to it are dropped. Returns
    /// the blocks concerned.
    pub fn node_dead(&mut self, node: &NodeId) -> Vec<BlockId> {
        let mut out: BTreeSet<BlockId> = BTreeSet::new();
        if let Some(queue) = self.work.remove(node) {
            out.extend(queue.iter().map(|w| w.block.id));
        }
        self.pending.retain(|id, v| {
            let before = v.len();
            v.retain(|p| &p.source != node && &p.target != node);
            if v.len() != before {
                out.insert(*id);
            }
            !v.is_empty()
        });
        out.into_iter().collect()
    }

    /// Forgets a block that no longer exists.
    pub fn forget(&mut self, id: BlockId) {
        self.set_needed(id, None);
        self.pending.remove(&id);
        for queue in self.work.values_mut() {
            queue.retain(|w| w.block.id != id);
        }
        self.work.retain(|_, q| !q.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_common::GenerationStamp;

    fn node(n: &str) -> NodeId {
        NodeId(n.into())
    }

    fn dn(n: &str) -> DatanodeId {
        DatanodeId {
            node_id: node(n),
            data_addr: format!("{n}:9866"),
            http_addr: format!("{n}:9864"),
            rack: "/r".into(),
        }
    }

    fn work(id: u64, targets: &[&str]) -> TransferWork {
        TransferWork {
            block: ExtendedBlock::new(BlockId(id), GenerationStamp(1001), 10),
            targets: targets.iter().map(|t| dn(t)).collect(),
        }
    }

    #[test]
    fn needed_is_ordered_by_good_replicas_and_updated_in_place() {
        let mut q = ReplicationQueues::new();
        q.set_needed(BlockId(1), Some(2));
        q.set_needed(BlockId(2), Some(1));
        q.set_needed(BlockId(3), Some(2));
        assert_eq!(q.next_needed(10), vec![BlockId(2), BlockId(1), BlockId(3)]);
        q.set_needed(BlockId(3), Some(0));
        q.set_needed(BlockId(2), None);
        assert_eq!(q.next_needed(1), vec![BlockId(3)]);
        assert_eq!(q.needed_len(), 2);
    }

    #[test]
    fn a_level_rotates_so_stuck_blocks_do_not_starve_the_others() {
        let mut q = ReplicationQueues::new();
        for id in 1..=5 {
            q.set_needed(BlockId(id), Some(2));
        }
        q.set_needed(BlockId(9), Some(1));
        assert_eq!(q.next_needed(3), vec![BlockId(9), BlockId(1), BlockId(2)]);
        assert_eq!(q.next_needed(3), vec![BlockId(9), BlockId(3), BlockId(4)]);
        assert_eq!(q.next_needed(3), vec![BlockId(9), BlockId(5), BlockId(1)]);
        // A block of a higher priority is taken first whatever the bookmarks say.
        q.set_needed(BlockId(7), Some(0));
        assert_eq!(q.next_needed(2), vec![BlockId(7), BlockId(9)]);
    }

    #[test]
    fn pending_copies_arrive_time_out_and_die_with_their_nodes() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut q = ReplicationQueues::new();
        q.schedule(&node("src"), work(1, &["a", "b"]), t0);
        q.schedule(&node("src"), work(2, &["c"]), t0);
        q.schedule(&node("other"), work(3, &["a"]), t0);
        assert_eq!(q.pending_count(BlockId(1)), 2);
        assert_eq!(q.queued_for(&node("src")), 2);
        // Handing out restarts the timers of what was handed out only.
        let out = q.take_work(&node("src"), 1, t0 + s(200));
        assert_eq!(out, vec![work(1, &["a", "b"])]);
        assert_eq!(q.queued_for(&node("src")), 1);
        assert!(q.arrived(BlockId(1), &node("a")));
        assert!(!q.arrived(BlockId(1), &node("a")));
        assert_eq!(q.pending_targets(BlockId(1)), vec![node("b")]);
        assert_eq!(
            q.timed_out(t0 + s(300), s(300)),
            vec![BlockId(2), BlockId(3)]
        );
        assert_eq!(q.pending_count(BlockId(1)), 1);
        // A queued command whose copies timed out is not handed out any more.
        assert!(q.take_work(&node("other"), 5, t0 + s(301)).is_empty());
        assert_eq!(q.node_dead(&node("b")), vec![BlockId(1)]);
        assert_eq!(q.pending_len(), 0);
        q.schedule(&node("src"), work(4, &["d"]), t0);
        assert_eq!(q.node_dead(&node("src")), vec![BlockId(2), BlockId(4)]);
        assert_eq!(q.queued_for(&node("src")), 0);
    }

    #[test]
    fn forgetting_a_block_drops_its_work() {
        let t0 = Instant::now();
        let mut q = ReplicationQueues::new();
        q.set_needed(BlockId(7), Some(1));
        q.schedule(&node("src"), work(7, &["a"]), t0);
        q.forget(BlockId(7));
        assert_eq!(q.needed_len(), 0);
        assert_eq!(q.pending_len(), 0);
        assert!(q.take_work(&node("src"), 5, t0).is_empty());
    }
}
