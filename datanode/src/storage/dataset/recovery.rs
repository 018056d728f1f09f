//! Block recovery on the dataset (HDFS's `initReplicaRecovery` / `updateReplicaUnderRecovery`):
//! the disk side of the two data-transfer ops a recovery's primary sends to every location.
//!
//! - **init**: the replica (its writer already stopped by the caller) is put under recovery —
//!   state Rur with a [`RecoveryMark`] (original state, recovery id) — and reported as it was.
//!   Nothing changes on disk: a crash forgets the mark, the scan finds the replica as before
//!   (Rbw becomes Rwr), and the next recovery attempt starts over.
//! - **update**: truncate the block file to the agreed length and the meta file to its
//!   checksums (a partial last chunk's checksum recomputed) → fdatasync both → rename the meta
//!   file to the recovery id → fsync the directory → move to `finalized/` (meta, then block
//!   file, then both directories fsynced) → update the map. The same order as pipeline close
//!   recovery, so a crash at any step leaves a replica the scan understands.

use super::Dataset;
use crate::error::{DatanodeError, IoContext, Result};
use crate::storage::replica::{transition, RecoveryMark, ReplicaEntry, Transition};
use sluice_common::proto::{ReplicaInfo, ReplicaState};
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp};

impl Dataset {
    /// Puts the replica of `block.id` under recovery `recovery_id`; returns it as it was before
    /// (generation stamp, length on disk, original state). The replica must not be older than
    /// `block`, must be older than the recovery, and its writer must have been stopped.
    pub fn init_replica_recovery(
        &self,
        block: ExtendedBlock,
        recovery_id: GenerationStamp,
    ) -> Result<ReplicaInfo> {
        let _g = self.guard(block.id);
        let id = block.id;
        let e = self
            .get(id)
            .ok_or(DatanodeError::ReplicaNotFound { block: id })?;
        let invalid = |reason: String| DatanodeError::InvalidReplica { block: id, reason };
        if e.state == ReplicaState::Temporary {
            return Err(DatanodeError::ReplicaNotFound { block: id });
        }
        if e.gen_stamp < block.gen_stamp {
            return Err(DatanodeError::StaleGenStamp {
                block: id,
                requested: block.gen_stamp,
                have: e.gen_stamp,
            });
        }
        if e.gen_stamp >= recovery_id {
            return Err(invalid(format!(
                "generation stamp {} is not older than the recovery id {recovery_id}",
                e.gen_stamp
            )));
        }
        let original = match e.live.recovery() {
            Some(m) if m.recovery_id > recovery_id => {
                return Err(invalid(format!(
                    "already under a newer recovery {} (asked {recovery_id})",
                    m.recovery_id
                )))
            }
            Some(m) => m.original,
            None => e.state,
        };
        if e.live.writer().is_some() {
            return Err(invalid("a writer is still attached".into()));
        }
        let to = transition(Some(e.state), Transition::InitRecovery)
            .ok_or_else(|| invalid(format!("cannot recover a {:?} replica", e.state)))?;
        e.live.set_recovery(RecoveryMark {
            original,
            recovery_id,
        });
        let len = e.live.bytes_on_disk();
        self.map.insert(
            id,
            ReplicaEntry {
                state: to,
                ..e.clone()
            },
        );
        Ok(ReplicaInfo {
            block: ExtendedBlock::new(id, e.gen_stamp, len),
            state: original,
            bytes_on_disk: len,
        })
    }

    /// Finishes the recovery of the replica of `id`: it must be under recovery `recovery_id`
    /// and hold at least `new_length` bytes (a finalized one exactly that many); it is truncated
    /// to `new_length`, restamped `recovery_id` and finalized. Returns the finalized replica.
    pub fn update_replica_under_recovery(
        &self,
        id: BlockId,
        recovery_id: GenerationStamp,
        new_length: u64,
    ) -> Result<ReplicaEntry> {
        let _g = self.guard(id);
        let e = self
            .get(id)
            .ok_or(DatanodeError::ReplicaNotFound { block: id })?;
        let invalid = |reason: String| DatanodeError::InvalidReplica { block: id, reason };
        let mark = match (e.state, e.live.recovery()) {
            (ReplicaState::Rur, Some(m)) if m.recovery_id == recovery_id => m,
            (state, m) => {
                return Err(invalid(format!(
                    "not under recovery {recovery_id} ({state:?}, {:?})",
                    m.map(|m| m.recovery_id)
                )))
            }
        };
        transition(Some(e.state), Transition::CommitRecovery)
            .ok_or_else(|| invalid("cannot finalize".into()))?;
        let on_disk = e.live.bytes_on_disk();
        if on_disk < new_length
            || (mark.original == ReplicaState::Finalized && on_disk != new_length)
        {
            return Err(invalid(format!(
                "holds {on_disk} bytes ({:?}), cannot take the agreed {new_length}",
                mark.original
            )));
        }
        let entry = if mark.original == ReplicaState::Finalized {
            self.restamp_finalized(&e, recovery_id)?
        } else {
            let open = self.truncate_and_restamp(&e, new_length, recovery_id)?;
            let rbw = open.entry.clone();
            drop(open);
            let fin = self.move_to_finalized_locked(&rbw)?;
            fin.live.reset(new_length);
            fin
        };
        self.map.insert(id, entry.clone());
        self.metrics.replicas_finalized.inc();
        Ok(entry)
    }

    /// A finalized replica takes a new generation stamp: its meta file is renamed.
    fn restamp_finalized(&self, e: &ReplicaEntry, gs: GenerationStamp) -> Result<ReplicaEntry> {
        let new = ReplicaEntry {
            gen_stamp: gs,
            state: ReplicaState::Finalized,
            live: crate::storage::replica::ReplicaLive::new(
                e.live.bytes_on_disk(),
                e.live.bytes_on_disk(),
            ),
            ..e.clone()
        };
        std::fs::rename(e.meta_path(), new.meta_path()).ctx("rename", &e.meta_path())?;
        crate::sys::sync_dir(&new.dir)?;
        Ok(new)
    }
}
