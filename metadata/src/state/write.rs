//! The write path of the client protocol: create, add_block, abandon_block, complete, fsync,
//! and pipeline recovery (update_block_for_pipeline, update_pipeline, additional DataNodes).

use super::State;
use crate::blocks::BlockInfo;
use crate::namespace::{now_ms, BlockRecord, BlockState, CreateRequest, Inode, NsPath};
use crate::placement::PlacementRequest;
use sluice_common::rpc::{CreateOptions, FileStatus, LocatedBlock};
use sluice_common::{DatanodeId, ExtendedBlock, MetaError, NodeId};
use std::time::Instant;

fn bad_previous(reason: String) -> MetaError {
    MetaError::invalid_argument("previous", reason)
}

impl State {
    /// Creates a file open for writing (see `ClientProtocol::create`).
    pub fn create(
        &mut self,
        path: &str,
        opts: &CreateOptions,
        now: Instant,
    ) -> Result<FileStatus, MetaError> {
        let p = NsPath::parse(path)?;
        let req = self.create_request(opts)?;
        self.check_lease_for_create(&p, &req.client, now)?;
        let (inode, replaced) = self.ns.create(&p, &req, now_ms())?;
        if let Some(old) = replaced {
            self.drop_file(&old);
        }
        self.leases.add(&req.client, inode.id, now);
        Ok(crate::namespace::file_status(p.to_string(), &inode))
    }

    fn create_request(&self, opts: &CreateOptions) -> Result<CreateRequest, MetaError> {
        if opts.client_name.is_empty() {
            return Err(MetaError::invalid_argument("client_name", "empty"));
        }
        let replication = match opts.replication {
            0 => self.cfg.default_replication,
            r if r > self.cfg.max_replication => {
                return Err(MetaError::invalid_argument(
                    "replication",
                    format!("{r} exceeds replication.max {}", self.cfg.max_replication),
                ))
            }
            r => r,
        };
        let min = self.cfg.min_block_size.bytes();
        let block_size = match opts.block_size {
            0 => self.cfg.default_block_size.bytes(),
            s if s < min || !s.is_multiple_of(512) => {
                return Err(MetaError::invalid_argument(
                    "block_size",
                    format!("{s} must be a multiple of 512 and at least {min}"),
                ))
            }
            s => s,
        };
        Ok(CreateRequest {
            client: opts.client_name.clone(),
            overwrite: opts.overwrite,
            create_parent: opts.create_parent,
            replication,
            block_size,
        })
    }

    /// Forgets a removed file: its blocks (deleted on their DataNodes) and its lease.
    pub(super) fn drop_file(&mut self, inode: &Inode) {
        let Some(f) = inode.file() else {
            return;
        };
        for b in &f.blocks {
            self.blocks.remove(b.id);
            self.recoveries.finish(b.id);
            self.replication.forget(b.id);
        }
        if let Some(w) = &f.writer {
            self.leases.remove(w, inode.id);
        }
    }

    /// The pipeline of a new block: `replication` DataNodes, or as many as there are when
    /// fewer are available but at least `replication.min` (HDFS's `chooseTarget4NewBlock`):
    /// the block starts under-replicated and repair completes it once it is closed and a
    /// DataNode is free. Fewer than `replication.min` is [`MetaError::NotEnoughDatanodes`].
    fn place_new_block(
        &mut self,
        path: &NsPath,
        replication: u16,
        block_size: u64,
        exclude: &[NodeId],
    ) -> Result<Vec<DatanodeId>, MetaError> {
        let req = |count| PlacementRequest {
            count,
            block_size,
            existing: &[],
            exclude,
        };
        match self.place(&req(usize::from(replication))) {
            Err(MetaError::NotEnoughDatanodes { needed, available })
                if available > 0 && available >= u32::from(self.cfg.min_replication) =>
            {
                tracing::warn!(
                    %path, needed, available,
                    "fewer DataNodes than the replication factor: the block starts under-replicated"
                );
                self.place(&req(available as usize))
            }
            r => r,
        }
    }

    /// Commits `previous`, allocates the next block and its pipeline.
    pub fn add_block(
        &mut self,
        path: &str,
        client: &str,
        previous: Option<ExtendedBlock>,
        exclude: &[NodeId],
    ) -> Result<LocatedBlock, MetaError> {
        let p = NsPath::parse(path)?;
        let mut inode = self.open_file(&p, client)?;
        let Some(file) = inode.file() else {
            return Err(MetaError::IsADirectory {
                path: p.to_string(),
            });
        };
        let (replication, block_size) = (file.replication, file.block_size);
        let blocks = file.blocks.clone();
        if let Some(prev) = previous {
            file.check_last_length(prev.num_bytes, "previous")?;
        }
        if let Some(retry) = self.add_block_retry(&blocks, previous) {
            return Ok(retry);
        }
        self.check_previous(&blocks, previous)?;
        let targets = self.place_new_block(&p, replication, block_size, exclude)?;
        let record = BlockRecord {
            id: self.ns.alloc_block_id(),
            gen_stamp: self.ns.alloc_gen_stamp(),
            num_bytes: 0,
            state: BlockState::UnderConstruction,
        };
        let committed = previous.map(|prev| self.committed_state(prev));
        let f = inode.file_mut().ok_or_else(|| MetaError::IsADirectory {
            path: p.to_string(),
        })?;
        if let (Some(prev), Some(state), Some(last)) = (previous, committed, f.blocks.last_mut()) {
            last.num_bytes = prev.num_bytes;
            last.state = state;
        }
        let offset = f.length();
        f.blocks.push(record);
        self.ns.update(&inode)?;
        if let (Some(prev), Some(state)) = (previous, committed) {
            self.apply_commit(prev, state);
        }
        let mut info = BlockInfo::new(inode.id, replication, record.extended(), record.state);
        info.expected = targets.iter().map(|d| d.node_id.clone()).collect();
        self.blocks.insert(record.id, info);
        Ok(LocatedBlock {
            block: record.extended(),
            offset,
            locations: targets,
            corrupt: false,
            token: None,
        })
    }

    /// `previous` must be the file's last block (or absent when the file has none), with its
    /// current generation stamp; the block before it must be complete.
    fn check_previous(
        &mut self,
        blocks: &[BlockRecord],
        previous: Option<ExtendedBlock>,
    ) -> Result<(), MetaError> {
        match (previous, blocks.last()) {
            (None, None) => {}
            (Some(prev), Some(last)) if prev.id == last.id => {
                self.check_commit(last, prev)?;
                if let Some(before) = blocks.len().checked_sub(2).and_then(|i| blocks.get(i)) {
                    if self.try_complete(before.id) != Some(BlockState::Complete) {
                        return Err(MetaError::NotReplicatedYet { block: before.id });
                    }
                }
            }
            (None, Some(last)) => {
                return Err(bad_previous(format!(
                    "must name the last block {}",
                    last.id
                )))
            }
            (Some(prev), last) => {
                return Err(bad_previous(format!(
                    "{} is not the file's last block ({:?})",
                    prev.id,
                    last.map(|b| b.id)
                )))
            }
        }
        Ok(())
    }

    /// A retried `add_block` whose first call allocated the last block: the same answer.
    fn add_block_retry(
        &self,
        blocks: &[BlockRecord],
        previous: Option<ExtendedBlock>,
    ) -> Option<LocatedBlock> {
        let (last, before) = blocks.split_last()?;
        let matches = match (previous, before.last()) {
            (None, None) => true,
            (Some(p), Some(b)) => p.id == b.id,
            _ => false,
        };
        let info = self.blocks.get(last.id)?;
        let untouched = last.state == BlockState::UnderConstruction
            && last.num_bytes == 0
            && info.replicas.is_empty()
            && info.pending_gen_stamp.is_none();
        if !(matches && untouched) {
            return None;
        }
        Some(LocatedBlock {
            block: last.extended(),
            offset: before
                .iter()
                .fold(0u64, |sum, b| sum.saturating_add(b.num_bytes)),
            locations: self.usable_ids(&info.expected),
            corrupt: false,
            token: None,
        })
    }

    /// Checks that `given` may commit the stored `last` block.
    fn check_commit(&self, last: &BlockRecord, given: ExtendedBlock) -> Result<(), MetaError> {
        if given.gen_stamp != last.gen_stamp {
            return Err(MetaError::GenerationStampMismatch {
                block: last.id,
                given: given.gen_stamp,
                current: last.gen_stamp,
            });
        }
        if last.state != BlockState::UnderConstruction && given.num_bytes != last.num_bytes {
            return Err(bad_previous(format!(
                "{} was committed with {} bytes, not {}",
                last.id, last.num_bytes, given.num_bytes
            )));
        }
        Ok(())
    }

    /// The state a block reaches when committed at `given`'s length.
    fn committed_state(&self, given: ExtendedBlock) -> BlockState {
        let Some(info) = self.blocks.get(given.id) else {
            return BlockState::Committed;
        };
        if info.state == BlockState::Complete {
            return BlockState::Complete;
        }
        let mut probe = info.clone();
        probe.num_bytes = given.num_bytes;
        probe.state = BlockState::Committed;
        if probe.finalized_count() >= usize::from(self.cfg.min_replication) {
            BlockState::Complete
        } else {
            BlockState::Committed
        }
    }

    /// Applies a commit to the block map (after the store took it).
    fn apply_commit(&mut self, given: ExtendedBlock, state: BlockState) {
        if let Some(info) = self.blocks.get_mut(given.id) {
            info.num_bytes = given.num_bytes;
            info.state = state;
            info.expected.clear();
            let wrong: Vec<NodeId> = info
                .replicas
                .iter()
                .filter(|(_, r)| {
                    r.gen_stamp == info.gen_stamp
                        && r.state == sluice_common::proto::ReplicaState::Finalized
                        && r.num_bytes != info.num_bytes
                })
                .map(|(n, _)| n.clone())
                .collect();
            info.corrupt.extend(wrong);
        }
    }

    /// Drops the file's last block, whose pipeline could not be set up.
    pub fn abandon_block(
        &mut self,
        path: &str,
        client: &str,
        block: ExtendedBlock,
    ) -> Result<(), MetaError> {
        let p = NsPath::parse(path)?;
        let mut inode = self.open_file(&p, client)?;
        let f = inode.file_mut().ok_or_else(|| MetaError::IsADirectory {
            path: p.to_string(),
        })?;
        match f.blocks.last() {
            Some(last) if last.id == block.id => {
                if last.state != BlockState::UnderConstruction {
                    return Err(MetaError::invalid_argument(
                        "block",
                        format!("{} is committed and cannot be abandoned", block.id),
                    ));
                }
            }
            // Not (or no longer) in the file: an abandon retried after it succeeded.
            _ if !f.blocks.iter().any(|b| b.id == block.id) => return Ok(()),
            _ => {
                return Err(MetaError::invalid_argument(
                    "block",
                    format!("{} is not the file's last block", block.id),
                ))
            }
        }
        f.blocks.pop();
        self.ns.update(&inode)?;
        self.blocks.remove(block.id);
        Ok(())
    }

    /// Commits the last block and closes the file once every block is complete.
    pub fn complete(
        &mut self,
        path: &str,
        client: &str,
        last: Option<ExtendedBlock>,
    ) -> Result<bool, MetaError> {
        let p = NsPath::parse(path)?;
        if self.is_closed_by(&p, client, last)? {
            return Ok(true);
        }
        let mut inode = self.open_file(&p, client)?;
        if let (Some(l), Some(f)) = (last, inode.file()) {
            f.check_last_length(l.num_bytes, "last")?;
        }
        let blocks = inode.file().map(|f| f.blocks.clone()).unwrap_or_default();
        self.check_last(&blocks, last)?;
        let committed = last.map(|l| (l, self.committed_state(l)));
        let others_complete = blocks
            .iter()
            .rev()
            .skip(usize::from(last.is_some()))
            .all(|b| self.try_complete(b.id) == Some(BlockState::Complete));
        let all_complete =
            others_complete && committed.is_none_or(|(_, s)| s == BlockState::Complete);
        let f = inode.file_mut().ok_or_else(|| MetaError::IsADirectory {
            path: p.to_string(),
        })?;
        if let (Some((l, state)), Some(rec)) = (committed, f.blocks.last_mut()) {
            rec.num_bytes = l.num_bytes;
            rec.state = state;
        }
        if all_complete {
            for b in &mut f.blocks {
                b.state = BlockState::Complete;
            }
            f.writer = None;
            f.closed_by = Some(client.to_string());
            inode.mtime_ms = now_ms();
        }
        let changed = all_complete
            || committed.is_some_and(|(l, s)| {
                blocks
                    .last()
                    .is_some_and(|b| b.num_bytes != l.num_bytes || b.state != s)
            });
        if changed {
            self.ns.update(&inode)?;
        }
        if let Some((l, state)) = committed {
            self.apply_commit(l, state);
        }
        if all_complete {
            self.leases.remove(client, inode.id);
        }
        Ok(all_complete)
    }

    /// `last` must name the file's last block (absent only for a file without blocks).
    fn check_last(
        &self,
        blocks: &[BlockRecord],
        last: Option<ExtendedBlock>,
    ) -> Result<(), MetaError> {
        match (last, blocks.last()) {
            (None, None) => Ok(()),
            (Some(l), Some(b)) if l.id == b.id => self.check_commit(b, l),
            (l, b) => Err(MetaError::invalid_argument(
                "last",
                format!(
                    "{:?} is not the file's last block ({:?})",
                    l.map(|x| x.id),
                    b.map(|x| x.id)
                ),
            )),
        }
    }

    /// True if the file is already closed by `client` with `last` as its last block (a
    /// retried `complete`).
    fn is_closed_by(
        &self,
        p: &NsPath,
        client: &str,
        last: Option<ExtendedBlock>,
    ) -> Result<bool, MetaError> {
        let inode = self.file_at(p)?;
        let Some(f) = inode.file() else {
            return Ok(false);
        };
        let same_last = match (last, f.blocks.last()) {
            (None, None) => true,
            (Some(l), Some(b)) => l.id == b.id && l.num_bytes == b.num_bytes,
            _ => false,
        };
        Ok(f.writer.is_none() && same_last && f.closed_by.as_deref() == Some(client))
    }

    /// Records the length the writer hflushed in its last block.
    pub fn fsync(&mut self, path: &str, client: &str, length: u64) -> Result<(), MetaError> {
        let p = NsPath::parse(path)?;
        let mut inode = self.open_file(&p, client)?;
        let f = inode.file_mut().ok_or_else(|| MetaError::IsADirectory {
            path: p.to_string(),
        })?;
        f.check_last_length(length, "last_block_length")?;
        let Some(last) = f.blocks.last_mut() else {
            return Ok(());
        };
        if last.state != BlockState::UnderConstruction || length <= last.num_bytes {
            return Ok(());
        }
        last.num_bytes = length;
        let id = last.id;
        self.ns.update(&inode)?;
        if let Some(info) = self.blocks.get_mut(id) {
            info.num_bytes = length;
        }
        Ok(())
    }
}
