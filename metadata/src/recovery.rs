//! Block recoveries in progress (lease recovery of files whose writer disappeared), as plain
//! data: per block the attempt's recovery id, primary DataNode, the primaries already tried and
//! when the attempt started; per DataNode the `RecoverBlock` commands waiting for its next
//! heartbeat. The choice of the primary is [`choose_primary`], a pure function.
//!
//! An attempt ends when its primary reports (`commit_block_synchronization`) or, after
//! `block.recovery.timeout`, when the state starts a new one with another primary and a new
//! recovery id (the old primary's report is then refused: its recovery id is stale).
//!
//! A command is held until the store made its recovery id durable ([`crate::commit`]): a
//! recovery id a crash could hand out again never reaches a DataNode.

use crate::commit::{CommitClock, UNSEALED};
use crate::namespace::InodeId;
use sluice_common::rpc::{NodeState, RecoveringBlock};
use sluice_common::{BlockId, GenerationStamp, NodeId};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One block recovery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRecovery {
    /// The file whose last block it is.
    pub file: InodeId,
    /// The recovery id (the block's generation stamp once recovered).
    pub recovery_id: GenerationStamp,
    /// The DataNode running it.
    pub primary: NodeId,
    /// Primaries of earlier attempts (avoided while others remain).
    pub tried: BTreeSet<NodeId>,
    /// When this attempt started.
    pub started: Instant,
}

/// Every block recovery in progress.
#[derive(Debug, Default)]
pub struct Recoveries {
    by_block: HashMap<BlockId, BlockRecovery>,
    /// Commands per primary, each with the commit number it waits for.
    commands: HashMap<NodeId, Vec<(RecoveringBlock, u64)>>,
    clock: Arc<CommitClock>,
}

impl Recoveries {
    /// None; commands wait for nothing (a clock at zero).
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// None; commands wait until `clock` made their recovery id durable.
    pub fn with_clock(clock: Arc<CommitClock>) -> Self {
        Recoveries {
            clock,
            ..Self::default()
        }
    }

    /// The attempt on `id`, if any.
    pub fn get(&self, id: BlockId) -> Option<&BlockRecovery> {
        self.by_block.get(&id)
    }

    /// True if the attempt on `id` started `timeout` or longer before `now`.
    pub fn timed_out(&self, id: BlockId, now: Instant, timeout: Duration) -> bool {
        self.by_block
            .get(&id)
            .is_some_and(|r| now.saturating_duration_since(r.started) >= timeout)
    }

    /// Starts an attempt (replacing any earlier one) and queues its command for the primary.
    pub fn start(&mut self, rec: BlockRecovery, cmd: RecoveringBlock) {
        let id = cmd.block.id;
        self.drop_commands(id);
        self.commands
            .entry(rec.primary.clone())
            .or_default()
            .push((cmd, UNSEALED));
        self.by_block.insert(id, rec);
    }

    /// Ends the attempt on `id` (reported, or the block is gone).
    pub fn finish(&mut self, id: BlockId) -> Option<BlockRecovery> {
        self.drop_commands(id);
        self.by_block.remove(&id)
    }

    /// Takes the commands queued for `node` whose recovery id is durable.
    pub fn take_commands(&mut self, node: &NodeId) -> Vec<RecoveringBlock> {
        let seq = self.clock.seal();
        for cmds in self.commands.values_mut() {
            for c in cmds.iter_mut().filter(|c| c.1 == UNSEALED) {
                c.1 = seq;
            }
        }
        let Some(cmds) = self.commands.get_mut(node) else {
            return vec![];
        };
        let (ready, held): (Vec<_>, Vec<_>) = std::mem::take(cmds)
            .into_iter()
            .partition(|(_, s)| self.clock.releases(*s));
        *cmds = held;
        if cmds.is_empty() {
            self.commands.remove(node);
        }
        ready.into_iter().map(|(c, _)| c).collect()
    }

    /// Attempts in progress.
    pub fn len(&self) -> usize {
        self.by_block.len()
    }

    /// True if none is in progress.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.by_block.is_empty()
    }

    fn drop_commands(&mut self, id: BlockId) {
        for cmds in self.commands.values_mut() {
            cmds.retain(|(c, _)| c.block.id != id);
        }
        self.commands.retain(|_, c| !c.is_empty());
    }
}

/// A DataNode that may be a recovery's primary.
#[derive(Debug, Clone)]
pub struct PrimaryCandidate {
    /// The DataNode.
    pub node: NodeId,
    /// Its liveness (Dead ones are never picked).
    pub state: NodeState,
    /// Its last heartbeat.
    pub last_seen: Instant,
}

/// HDFS's choice: among the locations not dead, one not tried before if any remain, Live before
/// Stale, then the most recent heartbeat (ties: by id).
pub fn choose_primary(cands: &[PrimaryCandidate], tried: &BTreeSet<NodeId>) -> Option<NodeId> {
    cands
        .iter()
        .filter(|c| c.state != NodeState::Dead)
        .min_by(|a, b| {
            let key = |c: &PrimaryCandidate| (tried.contains(&c.node), c.state != NodeState::Live);
            key(a)
                .cmp(&key(b))
                .then(b.last_seen.cmp(&a.last_seen))
                .then(a.node.cmp(&b.node))
        })
        .map(|c| c.node.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_common::ExtendedBlock;

    fn node(n: &str) -> NodeId {
        NodeId(n.into())
    }

    fn cand(n: &str, state: NodeState, ago_ms: u64, now: Instant) -> PrimaryCandidate {
        PrimaryCandidate {
            node: node(n),
            state,
            last_seen: now - Duration::from_millis(ago_ms),
        }
    }

    #[test]
    fn primary_is_untried_live_and_freshest() {
        let now = Instant::now() + Duration::from_secs(10);
        let cands = vec![
            cand("a", NodeState::Live, 300, now),
            cand("b", NodeState::Live, 100, now),
            cand("c", NodeState::Stale, 0, now),
            cand("d", NodeState::Dead, 0, now),
        ];
        let none = BTreeSet::new();
        assert_eq!(choose_primary(&cands, &none), Some(node("b")));
        let tried = BTreeSet::from([node("b")]);
        assert_eq!(choose_primary(&cands, &tried), Some(node("a")));
        let tried = BTreeSet::from([node("a"), node("b")]);
        assert_eq!(choose_primary(&cands, &tried), Some(node("c")));
        // Everything tried: start over with the best one.
        let tried = BTreeSet::from([node("a"), node("b"), node("c")]);
        assert_eq!(choose_primary(&cands, &tried), Some(node("b")));
        assert_eq!(choose_primary(&cands[3..], &none), None);
    }

    #[test]
    fn a_new_attempt_replaces_the_old_one_and_its_command() {
        let t0 = Instant::now();
        let mut r = Recoveries::new();
        let cmd = |gs| RecoveringBlock {
            block: ExtendedBlock::new(BlockId(1), GenerationStamp(1001), 5),
            recovery_id: GenerationStamp(gs),
            locations: vec![],
            token: None,
        };
        let rec = |p: &str, gs| BlockRecovery {
            file: InodeId(9),
            recovery_id: GenerationStamp(gs),
            primary: node(p),
            tried: BTreeSet::new(),
            started: t0,
        };
        r.start(rec("a", 1002), cmd(1002));
        assert!(!r.timed_out(BlockId(1), t0, Duration::from_secs(1)));
        assert!(r.timed_out(
            BlockId(1),
            t0 + Duration::from_secs(1),
            Duration::from_secs(1)
        ));
        r.start(rec("b", 1003), cmd(1003));
        assert!(r.take_commands(&node("a")).is_empty());
        assert_eq!(r.take_commands(&node("b")), vec![cmd(1003)]);
        assert_eq!(
            r.get(BlockId(1)).unwrap().recovery_id,
            GenerationStamp(1003)
        );
        assert_eq!(r.len(), 1);
        r.finish(BlockId(1));
        assert!(r.is_empty());
    }
}
