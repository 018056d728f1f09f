//! The block manager (in memory, rebuilt at start from the file records): for each block its
//! generation stamp, length, file, replication, state and the replicas DataNodes reported; per
//! DataNode the blocks it holds and the replicas it must delete.
//!
//! Replica locations are never persisted: they come back from block reports. A DataNode
//! declared dead loses its replicas here (they stop counting) and must register and report
//! again.
//!
//! Every change to a block (its state, replicas, corrupt or deletion marks) marks it *dirty*;
//! the monitor takes the dirty set each pass and decides what the block needs (re-replication,
//! deletion of excess or corrupt replicas), so a pass costs what changed, not the whole map.
//!
//! A queued deletion is held with a commit sequence number ([`crate::commit`]) and handed to
//! its DataNode only once the store made that number durable: a replica is never deleted for a
//! change (a file deleted or overwritten) that a crash could still undo.

use crate::commit::{CommitClock, UNSEALED};
use crate::namespace::{BlockState, InodeId};
use sluice_common::proto::ReplicaState;
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp, NodeId};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// One replica a DataNode reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica {
    /// Its generation stamp.
    pub gen_stamp: GenerationStamp,
    /// Its length.
    pub num_bytes: u64,
    /// Its state.
    pub state: ReplicaState,
}

/// What the block manager knows of one block.
#[derive(Debug, Clone)]
pub struct BlockInfo {
    /// The file it belongs to.
    pub file: InodeId,
    /// Current generation stamp.
    pub gen_stamp: GenerationStamp,
    /// Known length.
    pub num_bytes: u64,
    /// The file's replication factor.
    pub replication: u16,
    /// State.
    pub state: BlockState,
    /// For a block being written: its pipeline.
    pub expected: Vec<NodeId>,
    /// A generation stamp handed out by `update_block_for_pipeline`, not yet used.
    pub pending_gen_stamp: Option<GenerationStamp>,
    /// Reported replicas by DataNode.
    pub replicas: HashMap<NodeId, Replica>,
    /// DataNodes whose replica was reported corrupt.
    pub corrupt: BTreeSet<NodeId>,
    /// DataNodes whose replica is being deleted (excess or corrupt): no longer counted, and
    /// not scheduled for deletion again.
    pub deleting: BTreeSet<NodeId>,
}

impl BlockInfo {
    /// A block with no replicas yet.
    pub fn new(file: InodeId, replication: u16, block: ExtendedBlock, state: BlockState) -> Self {
        BlockInfo {
            file,
            gen_stamp: block.gen_stamp,
            num_bytes: block.num_bytes,
            replication,
            state,
            expected: vec![],
            pending_gen_stamp: None,
            replicas: HashMap::new(),
            corrupt: BTreeSet::new(),
            deleting: BTreeSet::new(),
        }
    }

    /// The block as the protocol names it.
    pub fn extended(&self, id: BlockId) -> ExtendedBlock {
        ExtendedBlock::new(id, self.gen_stamp, self.num_bytes)
    }

    /// Whether a replica counts as a good copy of the block's current version: current
    /// generation stamp, neither corrupt nor being deleted, and finalized at the
    /// right length once the length is final (any state while the block is being written).
    pub fn is_good(&self, node: &NodeId, r: &Replica) -> bool {
        if r.gen_stamp != self.gen_stamp
            || self.corrupt.contains(node)
            || self.deleting.contains(node)
        {
            return false;
        }
        match self.state {
            BlockState::UnderConstruction => r.state != ReplicaState::Temporary,
            BlockState::Committed | BlockState::Complete => {
                r.state == ReplicaState::Finalized && r.num_bytes == self.num_bytes
            }
        }
    }

    /// DataNodes holding a good replica, sorted by id.
    pub fn good_nodes(&self) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self
            .replicas
            .iter()
            .filter(|(n, r)| self.is_good(n, r))
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
    }

    /// Good finalized replicas at the block's length (what completing a block needs).
    pub fn finalized_count(&self) -> usize {
        self.replicas
            .iter()
            .filter(|(n, r)| {
                r.gen_stamp == self.gen_stamp
                    && r.state == ReplicaState::Finalized
                    && r.num_bytes == self.num_bytes
                    && !self.corrupt.contains(*n)
            })
            .count()
    }

    /// Forgets everything about the replica on `node`.
    fn drop_replica(&mut self, node: &NodeId) {
        self.replicas.remove(node);
        self.corrupt.remove(node);
        self.deleting.remove(node);
    }

    /// The highest generation stamp this block's replicas may carry.
    pub fn newest_gen_stamp(&self) -> GenerationStamp {
        self.pending_gen_stamp
            .map_or(self.gen_stamp, |p| p.max(self.gen_stamp))
    }
}

/// What happened to a reported replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaOutcome {
    /// Recorded.
    Stored,
    /// The block is unknown, or the replica's generation stamp is older than the block's:
    /// scheduled for deletion on that DataNode.
    Invalidated,
}

/// Totals for reports and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockTotals {
    /// Blocks known.
    pub blocks: u64,
    /// Blocks (length final) with fewer good replicas than their factor but at least one.
    pub under_replicated: u64,
    /// Blocks (length final) with no good replica.
    pub missing: u64,
    /// Blocks with a corrupt replica.
    pub corrupt: u64,
}

/// Blocks whose state or replicas changed since the monitor last looked.
#[derive(Debug, Default)]
struct Dirty(BTreeSet<BlockId>);

/// A queued deletion's key in its DataNode's queue.
type DeleteKey = (BlockId, GenerationStamp);

/// The block map.
#[derive(Debug, Default)]
pub struct BlockManager {
    blocks: HashMap<BlockId, BlockInfo>,
    node_blocks: HashMap<NodeId, HashSet<BlockId>>,
    /// Deletions per DataNode, each with the commit number it waits for.
    invalidate: HashMap<NodeId, BTreeMap<DeleteKey, (ExtendedBlock, u64)>>,
    /// Deletions queued since the last [`BlockManager::take_deletions`], not yet numbered.
    unsealed: Vec<(NodeId, DeleteKey)>,
    clock: Arc<CommitClock>,
    dirty: Dirty,
}

impl BlockManager {
    /// An empty block map whose deletions wait for nothing (a clock at zero).
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty block map whose deletions wait until `clock` made them durable.
    pub fn with_clock(clock: Arc<CommitClock>) -> Self {
        BlockManager {
            clock,
            ..Self::default()
        }
    }

    /// The block `id`.
    pub fn get(&self, id: BlockId) -> Option<&BlockInfo> {
        self.blocks.get(&id)
    }

    /// The block `id`, mutable. The block is marked dirty (the caller may change anything).
    pub fn get_mut(&mut self, id: BlockId) -> Option<&mut BlockInfo> {
        let info = self.blocks.get_mut(&id)?;
        self.dirty.0.insert(id);
        Some(info)
    }

    /// Adds a block (dirty).
    pub fn insert(&mut self, id: BlockId, info: BlockInfo) {
        self.blocks.insert(id, info);
        self.dirty.0.insert(id);
    }

    /// Marks a block for the monitor to look at again.
    pub fn mark_dirty(&mut self, id: BlockId) {
        if self.blocks.contains_key(&id) {
            self.dirty.0.insert(id);
        }
    }

    /// Takes the blocks changed since the last call, in id order.
    pub fn take_dirty(&mut self) -> Vec<BlockId> {
        std::mem::take(&mut self.dirty.0).into_iter().collect()
    }

    /// Removes a block; every DataNode holding or expected to hold a replica is told to delete
    /// it.
    pub fn remove(&mut self, id: BlockId) -> Option<BlockInfo> {
        let info = self.blocks.remove(&id)?;
        self.dirty.0.remove(&id);
        let newest = info.newest_gen_stamp();
        let mut nodes: BTreeSet<&NodeId> = info.replicas.keys().collect();
        nodes.extend(info.expected.iter());
        for node in nodes {
            if let Some(set) = self.node_blocks.get_mut(node) {
                set.remove(&id);
            }
            let gs = info
                .replicas
                .get(node)
                .map_or(newest, |r| r.gen_stamp.max(newest));
            self.schedule_delete(node, ExtendedBlock::new(id, gs, info.num_bytes));
        }
        Some(info)
    }

    /// Queues the deletion of a replica on `node`, sent in a heartbeat reply once every change
    /// made so far is durable.
    pub fn schedule_delete(&mut self, node: &NodeId, block: ExtendedBlock) {
        let key = (block.id, block.gen_stamp);
        self.invalidate
            .entry(node.clone())
            .or_default()
            .insert(key, (block, UNSEALED));
        self.unsealed.push((node.clone(), key));
    }

    /// Gives the deletions queued since the last call their commit number.
    fn seal(&mut self) {
        let seq = self.clock.seal();
        for (node, key) in std::mem::take(&mut self.unsealed) {
            if let Some(entry) = self.invalidate.get_mut(&node).and_then(|q| q.get_mut(&key)) {
                if entry.1 == UNSEALED {
                    entry.1 = seq;
                }
            }
        }
    }

    /// Takes up to `max` queued deletions for `node` whose change is durable.
    pub fn take_deletions(&mut self, node: &NodeId, max: usize) -> Vec<ExtendedBlock> {
        self.seal();
        let Some(queue) = self.invalidate.get_mut(node) else {
            return vec![];
        };
        let clock = &self.clock;
        let ready: Vec<DeleteKey> = queue
            .iter()
            .filter(|(_, (_, seq))| clock.releases(*seq))
            .map(|(k, _)| *k)
            .take(max)
            .collect();
        let out = ready
            .iter()
            .filter_map(|k| queue.remove(k).map(|(b, _)| b))
            .collect();
        if queue.is_empty() {
            self.invalidate.remove(node);
        }
        out
    }

    /// Records a replica `node` reported. A replica of an unknown block, or older than the
    /// block's generation stamp, is scheduled for deletion instead.
    pub fn add_replica(
        &mut self,
        node: &NodeId,
        block: ExtendedBlock,
        state: ReplicaState,
    ) -> ReplicaOutcome {
        let Some(info) = self.blocks.get_mut(&block.id) else {
            self.schedule_delete(node, block);
            return ReplicaOutcome::Invalidated;
        };
        self.dirty.0.insert(block.id);
        if block.gen_stamp < info.gen_stamp {
            info.drop_replica(node);
            if let Some(set) = self.node_blocks.get_mut(node) {
                set.remove(&block.id);
            }
            self.schedule_delete(node, block);
            return ReplicaOutcome::Invalidated;
        }
        let replica = Replica {
            gen_stamp: block.gen_stamp,
            num_bytes: block.num_bytes,
            state,
        };
        let final_length = info.state != BlockState::UnderConstruction;
        if final_length
            && state == ReplicaState::Finalized
            && block.gen_stamp == info.gen_stamp
            && block.num_bytes != info.num_bytes
        {
            // A finalized replica whose length differs from the committed one (HDFS marks it
            // corrupt the same way).
            info.corrupt.insert(node.clone());
        }
        info.replicas.insert(node.clone(), replica);
        self.node_blocks
            .entry(node.clone())
            .or_default()
            .insert(block.id);
        ReplicaOutcome::Stored
    }

    /// Forgets the replica of `id` on `node` (it was deleted).
    pub fn remove_replica(&mut self, node: &NodeId, id: BlockId) {
        if let Some(info) = self.blocks.get_mut(&id) {
            info.drop_replica(node);
            self.dirty.0.insert(id);
        }
        if let Some(set) = self.node_blocks.get_mut(node) {
            set.remove(&id);
        }
    }

    /// Replaces everything known about `node`'s replicas with a full report. Returns how many
    /// replicas were scheduled for deletion.
    pub fn replace_node_replicas(
        &mut self,
        node: &NodeId,
        reports: impl IntoIterator<Item = (ExtendedBlock, ReplicaState)>,
    ) -> u64 {
        let old: HashSet<BlockId> = self.node_blocks.remove(node).unwrap_or_default();
        let mut seen = HashSet::new();
        let mut invalidated = 0;
        for (block, state) in reports {
            seen.insert(block.id);
            if self.add_replica(node, block, state) == ReplicaOutcome::Invalidated {
                invalidated += 1;
            }
        }
        for id in old.difference(&seen) {
            if let Some(info) = self.blocks.get_mut(id) {
                info.drop_replica(node);
                self.dirty.0.insert(*id);
            }
        }
        invalidated
    }

    /// Forgets every replica of `node` (declared dead). Returns how many it held.
    pub fn remove_node(&mut self, node: &NodeId) -> usize {
        let ids = self.node_blocks.remove(node).unwrap_or_default();
        for id in &ids {
            if let Some(info) = self.blocks.get_mut(id) {
                info.drop_replica(node);
                self.dirty.0.insert(*id);
            }
        }
        ids.len()
    }

    /// Replicas `node` is known to hold.
    pub fn node_block_count(&self, node: &NodeId) -> u64 {
        self.node_blocks.get(node).map_or(0, |s| s.len() as u64)
    }

    /// Marks the replica of `block` on `node` corrupt. False if the block is unknown.
    pub fn mark_corrupt(&mut self, node: &NodeId, block: BlockId) -> bool {
        match self.blocks.get_mut(&block) {
            Some(info) => {
                info.corrupt.insert(node.clone());
                self.dirty.0.insert(block);
                true
            }
            None => false,
        }
    }

    /// Block totals. Blocks still being written count as neither missing nor under-replicated.
    pub fn totals(&self) -> BlockTotals {
        let mut t = BlockTotals {
            blocks: self.blocks.len() as u64,
            ..BlockTotals::default()
        };
        for info in self.blocks.values() {
            if !info.corrupt.is_empty() {
                t.corrupt += 1;
            }
            if info.state == BlockState::UnderConstruction {
                continue;
            }
            let good = info.good_nodes().len();
            if good == 0 {
                t.missing += 1;
            } else if good < usize::from(info.replication) {
                t.under_replicated += 1;
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: &str) -> NodeId {
        NodeId(n.into())
    }

    fn blk(id: u64, gs: u64, len: u64) -> ExtendedBlock {
        ExtendedBlock::new(BlockId(id), GenerationStamp(gs), len)
    }

    #[test]
    fn unknown_and_stale_replicas_are_invalidated() {
        let mut bm = BlockManager::new();
        let b = blk(1, 1001, 10);
        bm.insert(b.id, BlockInfo::new(InodeId(5), 3, b, BlockState::Complete));
        let report = vec![
            (b, ReplicaState::Finalized),
            (blk(2, 1000, 5), ReplicaState::Finalized),
        ];
        assert_eq!(bm.replace_node_replicas(&node("a"), report), 1);
        assert_eq!(
            bm.add_replica(&node("b"), blk(1, 1000, 10), ReplicaState::Finalized),
            ReplicaOutcome::Invalidated
        );
        assert_eq!(bm.get(b.id).unwrap().good_nodes(), vec![node("a")]);
        assert_eq!(bm.take_deletions(&node("a"), 10), vec![blk(2, 1000, 5)]);
        assert_eq!(bm.take_deletions(&node("b"), 10), vec![blk(1, 1000, 10)]);
        assert!(bm.take_deletions(&node("b"), 10).is_empty());
    }

    #[test]
    fn full_report_drops_missing_replicas_and_wrong_length_is_corrupt() {
        let mut bm = BlockManager::new();
        let b = blk(1, 1001, 10);
        bm.insert(b.id, BlockInfo::new(InodeId(5), 2, b, BlockState::Complete));
        bm.add_replica(&node("a"), b, ReplicaState::Finalized);
        bm.add_replica(&node("b"), blk(1, 1001, 9), ReplicaState::Finalized);
        let info = bm.get(b.id).unwrap();
        assert_eq!(info.good_nodes(), vec![node("a")]);
        assert!(info.corrupt.contains(&node("b")));
        assert_eq!(bm.totals().under_replicated, 1);
        assert_eq!(bm.totals().corrupt, 1);
        bm.replace_node_replicas(&node("a"), vec![]);
        assert_eq!(bm.totals().missing, 1);
        assert_eq!(bm.node_block_count(&node("a")), 0);
    }

    #[test]
    fn removing_a_block_schedules_deletes_on_holders_and_pipeline() {
        let mut bm = BlockManager::new();
        let b = blk(7, 1005, 0);
        let mut info = BlockInfo::new(InodeId(5), 2, b, BlockState::UnderConstruction);
        info.expected = vec![node("a"), node("b")];
        bm.insert(b.id, info);
        bm.add_replica(&node("c"), b, ReplicaState::Rbw);
        bm.remove(b.id).unwrap();
        for n in ["a", "b", "c"] {
            assert_eq!(bm.take_deletions(&node(n), 10), vec![b], "{n}");
        }
        assert_eq!(bm.node_block_count(&node("c")), 0);
    }
}
