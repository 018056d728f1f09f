//! Append on the client protocol (HDFS `FSDirAppendOp`): a closed file is reopened under a new
//! lease; its last block, when partial, goes back under construction with the DataNodes that
//! hold it finalized as its pipeline. The writer then asks for a new generation stamp
//! (`update_block_for_pipeline`), sets up an `Append` pipeline and records it
//! (`update_pipeline`): replicas left with the old stamp are stale from then on.

use super::State;
use crate::namespace::{BlockState, NsPath};
use sluice_common::proto::ReplicaState;
use sluice_common::rpc::{AppendResponse, LocatedBlock};
use sluice_common::{MetaError, NodeId};
use std::time::Instant;

impl State {
    /// Reopens the file at `path` for appending by `client` (see `ClientProtocol::append`).
    pub fn append(
        &mut self,
        path: &str,
        client: &str,
        now: Instant,
    ) -> Result<AppendResponse, MetaError> {
        let p = NsPath::parse(path)?;
        if client.is_empty() {
            return Err(MetaError::invalid_argument("client", "empty"));
        }
        let mut inode = self.file_at(&p)?;
        let holder = inode.file().and_then(|f| f.writer.clone());
        match holder {
            // HDFS: "current leaseholder is trying to recreate file".
            Some(h) if h == client => {
                return Err(MetaError::LeaseConflict {
                    path: p.to_string(),
                    holder: h,
                })
            }
            // Another writer: its lease may have expired (then recovery closes the file, and
            // this append goes on), or the file is busy.
            Some(_) => {
                self.check_lease_for_create(&p, client, now)?;
                inode = self.file_at(&p)?;
            }
            None => {}
        }
        let f = inode.file().ok_or_else(|| MetaError::IsADirectory {
            path: p.to_string(),
        })?;
        if f.writer.is_some() {
            return Err(MetaError::LeaseConflict {
                path: p.to_string(),
                holder: f.writer.clone().unwrap_or_default(),
            });
        }
        let (block_size, offset) = (f.block_size, f.length());
        let last = f.blocks.last().map(|b| b.extended());
        let partial = f
            .blocks
            .last()
            .copied()
            .filter(|b| b.num_bytes < block_size);
        let holders = match partial {
            Some(last) => {
                let holders = self.finalized_holders(last.id);
                if holders.is_empty() {
                    // Nothing to append to: the last block has no usable replica.
                    return Err(MetaError::NotEnoughDatanodes {
                        needed: 1,
                        available: 0,
                    });
                }
                holders
            }
            None => Vec::new(),
        };
        let f = inode.file_mut().ok_or_else(|| MetaError::IsADirectory {
            path: p.to_string(),
        })?;
        f.writer = Some(client.to_string());
        f.closed_by = None;
        if let (Some(_), Some(last)) = (partial, f.blocks.last_mut()) {
            last.state = BlockState::UnderConstruction;
        }
        self.ns.update(&inode)?;
        self.leases.add(client, inode.id, now);
        let last_block = match partial {
            Some(last) => {
                if let Some(info) = self.blocks.get_mut(last.id) {
                    info.state = BlockState::UnderConstruction;
                    info.expected = holders.clone();
                    info.pending_gen_stamp = None;
                }
                Some(LocatedBlock {
                    block: last.extended(),
                    offset: offset.saturating_sub(last.num_bytes),
                    locations: self.usable_ids(&holders),
                    corrupt: false,
                    token: None,
                })
            }
            None => None,
        };
        tracing::info!(%p, client, length = offset, partial = last_block.is_some(), "file reopened for append");
        Ok(AppendResponse {
            status: crate::namespace::file_status(p.to_string(), &inode),
            previous: if last_block.is_none() { last } else { None },
            last_block,
        })
    }

    /// The usable DataNodes holding a good finalized replica of `id` at its current stamp and
    /// length.
    fn finalized_holders(&self, id: sluice_common::BlockId) -> Vec<NodeId> {
        let Some(info) = self.blocks.get(id) else {
            return Vec::new();
        };
        let mut nodes: Vec<NodeId> = info
            .replicas
            .iter()
            .filter(|(n, r)| {
                r.gen_stamp == info.gen_stamp
                    && r.state == ReplicaState::Finalized
                    && r.num_bytes == info.num_bytes
                    && !info.corrupt.contains(*n)
                    && !info.deleting.contains(*n)
                    && self.nodes.is_usable(n)
            })
            .map(|(n, _)| n.clone())
            .collect();
        nodes.sort();
        nodes
    }
}
