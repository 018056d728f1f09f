//! Pipeline recovery on the client protocol: a new generation stamp for a block being
//! written (`update_block_for_pipeline`), the rebuilt pipeline (`update_pipeline`), and more
//! DataNodes for it (`get_additional_datanodes`).

use super::State;
use crate::events::EventKind;
use crate::namespace::{BlockState, Inode, NsPath, Txn};
use crate::placement::PlacementRequest;
use sluice_common::rpc::{AdditionalDatanodes, LocatedBlock};
use sluice_common::{BlockId, DatanodeId, ExtendedBlock, MetaError, NodeId};

impl State {
    /// The file and path of a block being written by `client` (pipeline recovery checks).
    fn uc_block(&self, id: BlockId, client: &str) -> Result<(Inode, NsPath), MetaError> {
        let info = self
            .blocks
            .get(id)
            .ok_or(MetaError::UnknownBlock { block: id })?;
        let inode = self
            .ns
            .get(info.file)?
            .ok_or(MetaError::UnknownBlock { block: id })?;
        let path = NsPath::parse(&self.ns.path_of(&inode)?)?;
        let f = inode.file().ok_or(MetaError::UnknownBlock { block: id })?;
        let is_last_uc = f.blocks.last().is_some_and(|b| b.id == id)
            && info.state == BlockState::UnderConstruction;
        match &f.writer {
            Some(w) if is_last_uc && w == client => Ok((inode, path)),
            Some(_) if is_last_uc => Err(MetaError::NotLeaseHolder {
                path: path.to_string(),
                client: client.to_string(),
            }),
            _ => Err(MetaError::NotUnderConstruction {
                path: path.to_string(),
            }),
        }
    }

    /// Hands out a new generation stamp for a block whose pipeline is being rebuilt.
    pub fn update_block_for_pipeline(
        &mut self,
        block: ExtendedBlock,
        client: &str,
    ) -> Result<LocatedBlock, MetaError> {
        let (inode, _) = self.uc_block(block.id, client)?;
        let gs = self.ns.alloc_gen_stamp();
        self.ns.commit(Txn::new())?;
        let offset = inode
            .file()
            .map(|f| {
                f.blocks
                    .iter()
                    .take_while(|b| b.id != block.id)
                    .fold(0u64, |sum, b| sum.saturating_add(b.num_bytes))
            })
            .unwrap_or(0);
        let info = self
            .blocks
            .get_mut(block.id)
            .ok_or(MetaError::UnknownBlock { block: block.id })?;
        info.pending_gen_stamp = Some(gs);
        let (num_bytes, expected) = (info.num_bytes, info.expected.clone());
        Ok(LocatedBlock {
            block: ExtendedBlock::new(block.id, gs, num_bytes),
            offset,
            locations: self.usable_ids(&expected),
            corrupt: false,
            token: None,
        })
    }

    /// Records a rebuilt pipeline: new generation stamp, length and DataNodes.
    pub fn update_pipeline(
        &mut self,
        client: &str,
        old: ExtendedBlock,
        new: ExtendedBlock,
        nodes: &[NodeId],
    ) -> Result<(), MetaError> {
        if old.id != new.id {
            return Err(MetaError::invalid_argument(
                "new_block",
                format!("{} is not {}", new.id, old.id),
            ));
        }
        let (mut inode, _) = self.uc_block(old.id, client)?;
        let info = self
            .blocks
            .get(old.id)
            .ok_or(MetaError::UnknownBlock { block: old.id })?;
        if old.gen_stamp != info.gen_stamp {
            return Err(MetaError::GenerationStampMismatch {
                block: old.id,
                given: old.gen_stamp,
                current: info.gen_stamp,
            });
        }
        if info.pending_gen_stamp != Some(new.gen_stamp) {
            return Err(MetaError::GenerationStampMismatch {
                block: old.id,
                given: new.gen_stamp,
                current: info.pending_gen_stamp.unwrap_or(info.gen_stamp),
            });
        }
        if let Some(unknown) = nodes.iter().find(|n| self.nodes.get(n).is_none()) {
            return Err(MetaError::UnknownDatanode {
                node: unknown.clone(),
            });
        }
        if let Some(rec) = inode
            .file_mut()
            .and_then(|f| f.blocks.iter_mut().find(|b| b.id == old.id))
        {
            rec.gen_stamp = new.gen_stamp;
            rec.num_bytes = new.num_bytes;
        }
        self.ns.update(&inode)?;
        self.apply_new_pipeline(new, nodes);
        self.counters.pipeline_recoveries += 1;
        self.events.push(EventKind::PipelineRecovered {
            block: new,
            nodes: nodes.to_vec(),
        });
        Ok(())
    }

    fn apply_new_pipeline(&mut self, new: ExtendedBlock, nodes: &[NodeId]) {
        let Some(info) = self.blocks.get_mut(new.id) else {
            return;
        };
        // DataNodes taken out of the pipeline may still hold a replica being written under the
        // old stamp, and they do not report replicas being written (HDFS learns of them from
        // RECEIVING_BLOCK reports): ask them to delete it now rather than at their next full
        // block report. A DataNode deletes only a replica whose stamp is not newer.
        let old_gs = info.gen_stamp;
        let dropped: Vec<NodeId> = info
            .expected
            .iter()
            .filter(|n| !nodes.contains(n))
            .cloned()
            .collect();
        info.gen_stamp = new.gen_stamp;
        info.num_bytes = new.num_bytes;
        info.pending_gen_stamp = None;
        info.expected = nodes.to_vec();
        let stale: Vec<(NodeId, ExtendedBlock)> = info
            .replicas
            .iter()
            .filter(|(_, r)| r.gen_stamp < new.gen_stamp)
            .map(|(n, r)| {
                (
                    n.clone(),
                    ExtendedBlock::new(new.id, r.gen_stamp, r.num_bytes),
                )
            })
            .collect();
        for (node, old) in stale {
            self.blocks.remove_replica(&node, new.id);
            if !nodes.contains(&node) {
                self.blocks.schedule_delete(&node, old);
            }
        }
        for node in dropped {
            self.blocks
                .schedule_delete(&node, ExtendedBlock::new(new.id, old_gs, 0));
        }
    }

    /// More DataNodes for an existing pipeline (replacement after a failure).
    pub fn get_additional_datanodes(
        &mut self,
        req: &AdditionalDatanodes,
    ) -> Result<Vec<DatanodeId>, MetaError> {
        let p = NsPath::parse(&req.path)?;
        let inode = self.open_file(&p, &req.client)?;
        let f = inode.file().ok_or_else(|| MetaError::IsADirectory {
            path: p.to_string(),
        })?;
        if !f.blocks.iter().any(|b| b.id == req.block.id) {
            return Err(MetaError::UnknownBlock {
                block: req.block.id,
            });
        }
        let block_size = f.block_size;
        let existing: Vec<DatanodeId> = req
            .existing
            .iter()
            .filter_map(|n| self.nodes.get(n).map(|d| d.id.clone()))
            .collect();
        let mut exclude = req.exclude.clone();
        exclude.extend(req.existing.iter().cloned());
        self.place(&PlacementRequest {
            count: req.count as usize,
            block_size,
            existing: &existing,
            exclude: &exclude,
        })
    }
}
