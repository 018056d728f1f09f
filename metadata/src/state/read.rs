//! Read-side answers: block locations, `fsck`, the cluster report.

use super::State;
use crate::blocks::BlockInfo;
use crate::namespace::{Inode, NsPath};
use rand::seq::SliceRandom;
use sluice_common::rpc::{
    ClusterReport, DatanodeReport, FsckBlock, FsckFile, FsckReport, Health, LocatedBlock,
    LocatedBlocks,
};
use sluice_common::{BlockId, DatanodeId, MetaError, NodeId};
use std::time::Instant;

impl State {
    /// The blocks of the file at `path` overlapping `[offset, offset + length)`.
    pub fn get_block_locations(
        &mut self,
        path: &str,
        offset: u64,
        length: u64,
    ) -> Result<LocatedBlocks, MetaError> {
        let p = NsPath::parse(path)?;
        let inode = self.file_at(&p)?;
        let Some(f) = inode.file() else {
            return Err(MetaError::IsADirectory {
                path: p.to_string(),
            });
        };
        let uc = f.writer.is_some();
        let end = offset.saturating_add(length);
        let mut start = 0u64;
        let mut blocks = Vec::new();
        for (i, b) in f.blocks.iter().enumerate() {
            let uc_last = uc && i + 1 == f.blocks.len();
            let overlaps = if uc_last {
                start < end
            } else {
                start < end && offset < start.saturating_add(b.num_bytes)
            };
            if overlaps {
                blocks.push(self.locate(b.id, start, uc_last));
            }
            start = start.saturating_add(b.num_bytes);
        }
        Ok(LocatedBlocks {
            file_length: f.length(),
            blocks: blocks.into_iter().flatten().collect(),
            under_construction: uc,
        })
    }

    /// One block with its readable replicas: live before stale, random within each.
    fn locate(&mut self, id: BlockId, offset: u64, uc_last: bool) -> Option<LocatedBlock> {
        let info = self.blocks.get(id)?;
        let block = info.extended(id);
        let (mut nodes, corrupt) = self.good_locations(info, uc_last);
        let mut all_corrupt = false;
        if nodes.is_empty() && !corrupt.is_empty() {
            nodes = corrupt;
            all_corrupt = true;
        }
        let mut located = self.usable_ids(&nodes);
        if !uc_last {
            located.shuffle(&mut self.rng);
            let stale: Vec<bool> = located.iter().map(|d| self.is_stale(&d.node_id)).collect();
            let mut paired: Vec<(bool, DatanodeId)> = stale.into_iter().zip(located).collect();
            paired.sort_by_key(|(s, _)| *s);
            located = paired.into_iter().map(|(_, d)| d).collect();
        }
        Some(LocatedBlock {
            block,
            offset,
            locations: located,
            corrupt: all_corrupt,
            token: None,
        })
    }

    /// Good replicas (for the last block of an open file, its pipeline first) and corrupt
    /// ones, both restricted to DataNodes not dead.
    fn good_locations(&self, info: &BlockInfo, uc_last: bool) -> (Vec<NodeId>, Vec<NodeId>) {
        let mut good: Vec<NodeId> = Vec::new();
        if uc_last {
            good.extend(
                info.expected
                    .iter()
                    .filter(|n| !info.corrupt.contains(*n))
                    .cloned(),
            );
        }
        for n in info.good_nodes() {
            if !good.contains(&n) {
                good.push(n);
            }
        }
        good.retain(|n| self.nodes.is_usable(n));
        let corrupt = info
            .corrupt
            .iter()
            .filter(|n| self.nodes.is_usable(n) && info.replicas.contains_key(*n))
            .cloned()
            .collect();
        (good, corrupt)
    }

    /// Block-level health of every file at or under `path`.
    pub fn fsck(&self, path: &str) -> Result<FsckReport, MetaError> {
        let p = NsPath::parse(path)?;
        let root = self.ns.resolve(&p)?.ok_or_else(|| MetaError::NotFound {
            path: p.to_string(),
        })?;
        let mut files = Vec::new();
        let mut stack = vec![(p.clone(), root)];
        while let Some((path, inode)) = stack.pop() {
            if inode.is_dir() {
                let mut children = self.ns.children(inode.id)?;
                children.reverse();
                stack.extend(children.into_iter().map(|c| (path.join(&c.name), c)));
            } else {
                files.push(self.fsck_file(path.to_string(), &inode));
            }
        }
        let health = files
            .iter()
            .map(|f| f.health)
            .max()
            .unwrap_or(Health::Healthy);
        Ok(FsckReport {
            path: p.to_string(),
            files,
            health,
        })
    }

    fn fsck_file(&self, path: String, inode: &Inode) -> FsckFile {
        let Some(f) = inode.file() else {
            return FsckFile {
                path,
                length: 0,
                replication: 0,
                under_construction: false,
                blocks: vec![],
                health: Health::Healthy,
            };
        };
        let uc = f.writer.is_some();
        let blocks: Vec<FsckBlock> = f
            .blocks
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let uc_last = uc && i + 1 == f.blocks.len();
                self.fsck_block(b.extended(), f.replication, uc_last)
            })
            .collect();
        FsckFile {
            path,
            length: f.length(),
            replication: f.replication,
            under_construction: uc,
            health: blocks
                .iter()
                .map(|b| b.health)
                .max()
                .unwrap_or(Health::Healthy),
            blocks,
        }
    }

    fn fsck_block(
        &self,
        block: sluice_common::ExtendedBlock,
        replication: u16,
        uc_last: bool,
    ) -> FsckBlock {
        let (good, corrupt) = match self.blocks.get(block.id) {
            Some(info) => self.good_locations(info, uc_last),
            None => (vec![], vec![]),
        };
        let health = if good.is_empty() {
            Health::Missing
        } else if !corrupt.is_empty() {
            Health::Corrupt
        } else if good.len() < usize::from(replication) {
            Health::UnderReplicated
        } else {
            Health::Healthy
        };
        FsckBlock {
            block,
            locations: self.usable_ids(&good),
            corrupt_locations: self.usable_ids(&corrupt),
            expected_replicas: replication,
            health,
        }
    }

    /// The DataNodes and totals.
    pub fn cluster_report(&self, now: Instant) -> ClusterReport {
        let datanodes = self
            .nodes
            .all()
            .into_iter()
            .map(|d| DatanodeReport {
                id: d.id.clone(),
                state: d.state,
                capacity: d.capacity,
                used: d.used,
                remaining: d.remaining,
                blocks: self.blocks.node_block_count(&d.id.node_id),
                last_heartbeat_ms_ago: now.saturating_duration_since(d.last_seen).as_millis()
                    as u64,
                active_pipelines: d.active_pipelines,
                buffered_replicas: d.buffered_replicas,
            })
            .collect();
        let t = self.blocks.totals();
        ClusterReport {
            datanodes,
            files: self.ns.file_count(),
            directories: self.ns.dir_count(),
            blocks: t.blocks,
            under_replicated_blocks: t.under_replicated,
            missing_blocks: t.missing,
            corrupt_blocks: t.corrupt,
        }
    }
}
