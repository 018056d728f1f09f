//! The dataset: volumes plus the replica map, and every durable replica state change.
//!
//! All methods here block on disk I/O: call them from `spawn_blocking`, never from an actor
//! thread. The state changes of one block are serialised by its lock, one of [`LOCK_STRIPES`]
//! striped by block id (HDFS began with one `FsDatasetImpl` lock and split it, HDFS-15180);
//! data writes take none. Changes to different blocks run side by side, so the directory
//! fsyncs of many replicas created or finalized at once share the file system's journal
//! commits instead of queueing behind one lock. Making a new finalized subdir durable holds a
//! lock of its own (blocks of one subdir hold different locks). Crash-safety order of each change:
//!
//! - **create** (Rbw or Temporary): choose a volume → create `blk_<id>` and
//!   `blk_<id>_<gs>.meta` (header) in `rbw/` or `tmp/` → fsync the directory → insert into the
//!   map. A crash before any ack loses nothing acknowledged; a crash after leaves an Rbw replica
//!   that the scan turns into Rwr.
//! - **finalize** (Rbw → Finalized, Temporary → Finalized/Rbw): the writer has drained its sink
//!   and, with `sync.on.close`, fdatasynced block and meta → a new `finalized/subdirN/` is
//!   created and `finalized/` fsynced → rename the meta file, then the block file, into it →
//!   fsync the destination, then the source directory → update the map → the caller reports
//!   `Received`. A crash in between leaves the pair split or doubly linked across the two
//!   directories: the scan completes the move (roll forward, see `scan::resolve`).
//! - **recover** (new generation stamp): stop the old writer → truncate the block file to the
//!   acknowledged length and the meta file to its checksums, recomputing a partial last chunk's
//!   checksum → fdatasync both → rename the meta file to the new generation stamp → fsync the
//!   directory → update the map. Either meta name survives a crash; both describe the data.
//! - **append** (new generation stamp): a finalized replica of the expected length → rename
//!   the block file into `rbw/`, then the meta file under the new stamp → fsync `rbw/`, then
//!   the finalized directory (a crash between the renames is a cut finalize to the scan: the
//!   finalized replica comes back under its old stamp) → update the map (an Rbw replica again, at its old length). A
//!   retried append finds the replica already in `rbw/` and restamps it as recovery does.
//! - **delete**: remove from the map (readers stop finding it) → unlink meta and block files.
//!   A crash before the unlink brings the replica back in the next report, and the metadata
//!   service deletes it again.

use super::layout;
use super::meta::{self, MetaHeader, MAX_BYTES_PER_CHECKSUM};
use super::replica::{transition, ReplicaEntry, ReplicaLive, Transition};
use super::scan;
use super::volume::{Space, VolumeSet};
use crate::error::{DatanodeError, IoContext, Result};
use crate::metrics::Metrics;
use dashmap::DashMap;
use sluice_common::proto::{BlockStage, ReplicaState};
use sluice_common::rpc::ReplicaReport;
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp, NodeId};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

mod recovery;

/// Locks serialising replica state changes, striped by block id: every change concerns one
/// block, and two blocks share a lock only when their ids are equal modulo this.
pub const LOCK_STRIPES: usize = 64;

/// Free bytes a volume needs to take a new replica.
const MIN_FREE_FOR_NEW_REPLICA: u64 = 1024 * 1024;

/// A replica opened for writing: its map entry and its two files.
#[derive(Debug)]
pub struct OpenReplica {
    /// The map entry (shares its live lengths with the map).
    pub entry: ReplicaEntry,
    /// The block file, read-write.
    pub block: File,
    /// The metadata file, read-write.
    pub meta: File,
    /// The metadata header.
    pub header: MetaHeader,
}

/// A replica opened for reading.
#[derive(Debug)]
pub struct ReadReplica {
    /// The map entry when it was opened.
    pub entry: ReplicaEntry,
    /// The block file.
    pub block: File,
    /// The metadata file.
    pub meta: File,
    /// Its path (for errors).
    pub meta_path: PathBuf,
    /// Its path (for errors).
    pub block_path: PathBuf,
}

/// Space figures of the whole node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeSpace {
    /// Total bytes of the volumes' file systems.
    pub capacity: u64,
    /// Bytes held by replicas.
    pub used: u64,
    /// Bytes free.
    pub remaining: u64,
}

/// Volumes and replicas of one DataNode.
#[derive(Debug)]
pub struct Dataset {
    volumes: VolumeSet,
    map: DashMap<BlockId, ReplicaEntry>,
    locks: Box<[Mutex<()>]>,
    /// Held while a finalized subdir is made: a subdir another block's finalize is still
    /// making durable must not look ready (`create_dir_durable` skips a directory it sees).
    subdirs: Mutex<()>,
    metrics: Arc<Metrics>,
}

impl Dataset {
    /// Opens the volumes and scans them for replicas.
    pub fn open(dirs: &[PathBuf], metrics: Arc<Metrics>) -> Result<Dataset> {
        let volumes = VolumeSet::open(dirs)?;
        let map = DashMap::new();
        for entry in scan::scan(&volumes, &metrics)? {
            map.insert(entry.id, entry);
        }
        Ok(Dataset {
            volumes,
            map,
            locks: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            subdirs: Mutex::new(()),
            metrics,
        })
    }

    /// The node id stored in the volumes.
    pub fn node_id(&self) -> &NodeId {
        self.volumes.node_id()
    }

    /// The volumes.
    pub fn volumes(&self) -> &VolumeSet {
        &self.volumes
    }

    /// The replica of `id`, if any.
    pub fn get(&self, id: BlockId) -> Option<ReplicaEntry> {
        self.map.get(&id).map(|e| e.value().clone())
    }

    /// Holds the lock of `id`'s state changes (tests).
    #[cfg(test)]
    pub(crate) fn hold_lock(&self, id: BlockId) -> MutexGuard<'_, ()> {
        self.guard(id)
    }

    /// The lock of `id`'s state changes.
    fn guard(&self, id: BlockId) -> MutexGuard<'_, ()> {
        let lock = &self.locks[(id.0 % LOCK_STRIPES as u64) as usize];
        // A panic while holding the lock cannot leave the map inconsistent (every change is
        // one insert/remove), so a poisoned lock is taken over.
        lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a new replica: Rbw for `Create`, Temporary for transfers. An older replica of
    /// the block (whose writer the caller has stopped) is replaced; a replica with the same or
    /// a newer generation stamp is [`DatanodeError::ReplicaExists`].
    pub fn create(
        &self,
        id: BlockId,
        gs: GenerationStamp,
        bpc: u32,
        stage: BlockStage,
    ) -> Result<OpenReplica> {
        check_bpc(bpc)?;
        let t = if stage.is_transfer() {
            Transition::BeginTransfer
        } else {
            Transition::Create
        };
        let state = transition(None, t)
            .ok_or_else(|| DatanodeError::invalid(format!("stage {stage:?} does not create")))?;
        let _g = self.guard(id);
        if let Some(old) = self.get(id) {
            // A Temporary replica is a failed or abandoned transfer: always replaceable.
            if old.gen_stamp >= gs && old.state != ReplicaState::Temporary {
                return Err(DatanodeError::ReplicaExists {
                    block: id,
                    gen_stamp: old.gen_stamp,
                    state: old.state,
                });
            }
            tracing::info!(block = %id, old = %old.gen_stamp, new = %gs, "replacing an older replica");
            self.remove_files(&old);
            self.map.remove(&id);
        }
        let vol = self.volumes.choose(MIN_FREE_FOR_NEW_REPLICA)?;
        let dir = match state {
            ReplicaState::Temporary => layout::tmp_dir(&vol.root),
            _ => layout::rbw_dir(&vol.root),
        };
        let entry = ReplicaEntry {
            id,
            gen_stamp: gs,
            state,
            volume: vol.index,
            dir: dir.clone(),
            bytes_per_checksum: bpc,
            live: ReplicaLive::new(0, 0),
        };
        let header = MetaHeader {
            bytes_per_checksum: bpc,
        };
        let (block, meta) = create_files(&entry, header)?;
        crate::sys::sync_dir(&dir)?;
        self.map.insert(id, entry.clone());
        self.metrics.replicas_created.inc();
        Ok(OpenReplica {
            entry,
            block,
            meta,
            header,
        })
    }

    /// Pipeline recovery: the replica must have a generation stamp from `block.gen_stamp` to
    /// `latest` (an earlier, failed recovery attempt may have restamped it) and at least
    /// `block.num_bytes` bytes; it is truncated to that length and takes `latest`. With
    /// `close`, it is then finalized (CloseRecovery) and `None` is returned; otherwise the
    /// replica is returned open for the packets that follow. The caller has stopped the old
    /// writer.
    pub fn recover(
        &self,
        block: ExtendedBlock,
        latest: GenerationStamp,
        close: bool,
    ) -> Result<Option<OpenReplica>> {
        let _g = self.guard(block.id);
        let old = self
            .get(block.id)
            .ok_or(DatanodeError::ReplicaNotFound { block: block.id })?;
        check_recoverable(&old, block, latest, close)?;
        if old.state == ReplicaState::Finalized {
            return self.recover_finalized(old, block, latest).map(|()| None);
        }
        let open = self.truncate_and_restamp(&old, block.num_bytes, latest)?;
        if !close {
            return Ok(Some(open));
        }
        // The truncation was fdatasynced: the final length is durable.
        let entry = open.entry.clone();
        drop(open);
        let entry = self.move_to_finalized_locked(&entry)?;
        entry.live.reset(block.num_bytes);
        self.map.insert(block.id, entry);
        Ok(None)
    }

    /// Append (HDFS `append`, and `recoverAppend` for a retried set-up): the replica must be
    /// finalized with exactly `block.num_bytes` bytes under `block`'s generation stamp — or
    /// already reopened by an earlier attempt (Rbw/Rwr, stamp in `[block's, latest]`, at least
    /// `block.num_bytes` bytes) — and `latest` must be newer than `block`'s stamp. It becomes
    /// an Rbw replica under `latest`, open for packets continuing at `block.num_bytes`. Readers
    /// that opened the finalized replica keep reading their open files.
    pub fn append(&self, block: ExtendedBlock, latest: GenerationStamp) -> Result<OpenReplica> {
        let _g = self.guard(block.id);
        let id = block.id;
        let old = self
            .get(id)
            .ok_or(DatanodeError::ReplicaNotFound { block: id })?;
        let invalid = |reason: String| DatanodeError::InvalidReplica { block: id, reason };
        if latest <= block.gen_stamp {
            return Err(invalid(format!(
                "append stamp {latest} is not newer than the block's {}",
                block.gen_stamp
            )));
        }
        if old.gen_stamp < block.gen_stamp {
            return Err(DatanodeError::StaleGenStamp {
                block: id,
                requested: block.gen_stamp,
                have: old.gen_stamp,
            });
        }
        if old.gen_stamp > latest {
            return Err(invalid(format!(
                "generation stamp {} is newer than the append's {latest}",
                old.gen_stamp
            )));
        }
        if transition(Some(old.state), Transition::Append).is_none() {
            return Err(invalid(format!(
                "cannot append to a {:?} replica",
                old.state
            )));
        }
        let on_disk = old.live.bytes_on_disk();
        if old.state != ReplicaState::Finalized {
            // An earlier attempt reopened it: continue from the expected length.
            if on_disk < block.num_bytes {
                return Err(invalid(format!(
                    "holds {on_disk} bytes, fewer than the {} to append to",
                    block.num_bytes
                )));
            }
            return self.truncate_and_restamp(&old, block.num_bytes, latest);
        }
        if old.gen_stamp != block.gen_stamp || on_disk != block.num_bytes {
            // HDFS: "Corrupted replica ... with a length of ... expected length is ...".
            return Err(invalid(format!(
                "finalized with {on_disk} bytes under {}, not {} bytes under {}",
                old.gen_stamp, block.num_bytes, block.gen_stamp
            )));
        }
        let rbw = layout::rbw_dir(&self.volume_root(&old)?);
        let new = ReplicaEntry {
            gen_stamp: latest,
            state: ReplicaState::Rbw,
            dir: rbw,
            live: ReplicaLive::new(on_disk, on_disk),
            ..old.clone()
        };
        // Block file first: a crash between the renames leaves the meta file (old stamp) in
        // finalized/ and the block file in rbw/, which the start-up scan resolves as a cut
        // finalize, back to the finalized replica as the metadata service knows it.
        let (mp, bp) = (old.meta_path(), old.block_path());
        std::fs::rename(&bp, new.block_path()).ctx("rename", &bp)?;
        std::fs::rename(&mp, new.meta_path()).ctx("rename", &mp)?;
        crate::sys::sync_dir(&new.dir)?;
        crate::sys::sync_dir(&old.dir)?;
        let (block_file, meta_file, header) = open_rw(&new)?;
        self.map.insert(id, new.clone());
        Ok(OpenReplica {
            entry: new,
            block: block_file,
            meta: meta_file,
            header,
        })
    }

    /// Truncates an Rbw/Rwr replica to `len`, syncs it, and gives it generation stamp `gs`.
    fn truncate_and_restamp(
        &self,
        old: &ReplicaEntry,
        len: u64,
        gs: GenerationStamp,
    ) -> Result<OpenReplica> {
        let (block_file, meta_file, header) = open_rw(old)?;
        let (bp, mp) = (old.block_path(), old.meta_path());
        meta::truncate_replica(&block_file, &bp, &meta_file, &mp, header, len)?;
        let timer = self.metrics.fsync_seconds.start_timer();
        block_file.sync_data().ctx("fdatasync", &bp)?;
        meta_file.sync_data().ctx("fdatasync", &mp)?;
        drop(timer);
        self.metrics.fsyncs.add(2);
        let entry = ReplicaEntry {
            gen_stamp: gs,
            state: ReplicaState::Rbw,
            live: ReplicaLive::new(len, len),
            ..old.clone()
        };
        if gs != old.gen_stamp {
            std::fs::rename(&mp, entry.meta_path()).ctx("rename", &mp)?;
            crate::sys::sync_dir(&entry.dir)?;
        }
        self.map.insert(entry.id, entry.clone());
        Ok(OpenReplica {
            entry,
            block: block_file,
            meta: meta_file,
            header,
        })
    }

    fn recover_finalized(
        &self,
        old: ReplicaEntry,
        block: ExtendedBlock,
        latest: GenerationStamp,
    ) -> Result<()> {
        let len = old.live.bytes_on_disk();
        if len != block.num_bytes {
            return Err(DatanodeError::InvalidReplica {
                block: block.id,
                reason: format!(
                    "finalized with {len} bytes, not the {} asked",
                    block.num_bytes
                ),
            });
        }
        if old.gen_stamp != latest {
            let new = ReplicaEntry {
                gen_stamp: latest,
                ..old.clone()
            };
            std::fs::rename(old.meta_path(), new.meta_path()).ctx("rename", &old.meta_path())?;
            crate::sys::sync_dir(&new.dir)?;
            self.map.insert(block.id, new);
        }
        Ok(())
    }

    /// Finalizes the replica whose writer holds `live`, at `len` bytes: Rbw → Finalized,
    /// Temporary → Finalized or Rbw (per `stage`). The sink has been drained (and synced).
    pub fn finalize(
        &self,
        id: BlockId,
        live: &Arc<ReplicaLive>,
        len: u64,
        stage: BlockStage,
    ) -> Result<ReplicaEntry> {
        let _g = self.guard(id);
        let cur = self
            .get(id)
            .filter(|e| Arc::ptr_eq(&e.live, live))
            .ok_or_else(|| DatanodeError::InvalidReplica {
                block: id,
                reason: "the replica was replaced or deleted while being written".into(),
            })?;
        let t = match cur.state {
            ReplicaState::Temporary => Transition::CompleteTransfer(stage),
            _ => Transition::Finalize,
        };
        let to = transition(Some(cur.state), t).ok_or_else(|| DatanodeError::InvalidReplica {
            block: id,
            reason: format!("cannot {t:?} a {:?} replica", cur.state),
        })?;
        live.reset(len);
        let entry = if to == ReplicaState::Finalized {
            self.move_to_finalized_locked(&cur)?
        } else {
            self.move_to_locked(&cur, layout::rbw_dir(&self.volume_root(&cur)?), to)?
        };
        self.map.insert(id, entry.clone());
        if to == ReplicaState::Finalized {
            self.metrics.replicas_finalized.inc();
        }
        Ok(entry)
    }

    fn volume_root(&self, e: &ReplicaEntry) -> Result<PathBuf> {
        self.volumes
            .get(e.volume)
            .map(|v| v.root.clone())
            .ok_or_else(|| DatanodeError::invalid(format!("volume {} does not exist", e.volume)))
    }

    fn move_to_finalized_locked(&self, e: &ReplicaEntry) -> Result<ReplicaEntry> {
        let dest = layout::finalized_subdir(&self.volume_root(e)?, e.id);
        // A new subdir's entry is made durable before anything is moved into it. Blocks of one
        // subdir hold different locks, so the subdir lock keeps a second finalize from seeing
        // the directory before the first has fsynced its parent.
        let made = self.subdirs.lock().unwrap_or_else(|p| p.into_inner());
        layout::create_dir_durable(&dest)?;
        drop(made);
        self.move_to_locked(e, dest, ReplicaState::Finalized)
    }

    /// Renames meta then block file into `dest`, then fsyncs both directories.
    fn move_to_locked(
        &self,
        e: &ReplicaEntry,
        dest: PathBuf,
        state: ReplicaState,
    ) -> Result<ReplicaEntry> {
        let moved = ReplicaEntry {
            dir: dest,
            state,
            ..e.clone()
        };
        let (mp, bp) = (e.meta_path(), e.block_path());
        std::fs::rename(&mp, moved.meta_path()).ctx("rename", &mp)?;
        std::fs::rename(&bp, moved.block_path()).ctx("rename", &bp)?;
        crate::sys::sync_dir(&moved.dir)?;
        crate::sys::sync_dir(&e.dir)?;
        Ok(moved)
    }

    /// Deletes the replica of `block` unless its generation stamp is newer. Returns the
    /// deleted replica.
    pub fn delete(&self, block: ExtendedBlock) -> Result<Option<ExtendedBlock>> {
        let _g = self.guard(block.id);
        let Some(e) = self.get(block.id) else {
            return Ok(None);
        };
        if e.gen_stamp > block.gen_stamp {
            tracing::info!(block = %block.id, have = %e.gen_stamp, asked = %block.gen_stamp, "not deleting a newer replica");
            return Ok(None);
        }
        self.map.remove(&block.id);
        if let Some(w) = e.live.writer() {
            w.stop.cancel();
        }
        let reported = e.block();
        for p in [e.meta_path(), e.block_path()] {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(DatanodeError::io("remove", p, err)),
            }
        }
        self.metrics.replicas_deleted.inc();
        Ok(Some(reported))
    }

    /// Removes the Temporary replica of `id` whose writer holds `live` (a transfer that
    /// failed), if it is still there.
    pub fn delete_temporary(&self, id: BlockId, live: &Arc<ReplicaLive>) -> Result<()> {
        let _g = self.guard(id);
        match self.get(id) {
            Some(e) if e.state == ReplicaState::Temporary && Arc::ptr_eq(&e.live, live) => {
                self.map.remove(&id);
                self.remove_files(&e);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn remove_files(&self, e: &ReplicaEntry) {
        for p in [e.meta_path(), e.block_path()] {
            if let Err(err) = std::fs::remove_file(&p) {
                if err.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %p.display(), "cannot remove a replaced replica: {err}");
                }
            }
        }
    }

    /// Opens the replica of `id` for reading. Retries when a finalize moved the files between
    /// the map lookup and the open.
    pub fn open_read(&self, id: BlockId) -> Result<ReadReplica> {
        let mut last_err = None;
        for _ in 0..3 {
            let entry = self
                .get(id)
                .ok_or(DatanodeError::ReplicaNotFound { block: id })?;
            let (bp, mp) = (entry.block_path(), entry.meta_path());
            match (File::open(&bp), File::open(&mp)) {
                (Ok(block), Ok(meta)) => {
                    return Ok(ReadReplica {
                        entry,
                        block,
                        meta,
                        meta_path: mp,
                        block_path: bp,
                    })
                }
                (Err(e), _) => last_err = Some(DatanodeError::io("open", bp, e)),
                (_, Err(e)) => last_err = Some(DatanodeError::io("open", mp, e)),
            }
        }
        Err(last_err.unwrap_or(DatanodeError::ReplicaNotFound { block: id }))
    }

    /// Every replica except Temporary ones, for a full block report.
    pub fn report(&self) -> Vec<ReplicaReport> {
        self.map
            .iter()
            .filter(|e| e.state != ReplicaState::Temporary)
            .map(|e| ReplicaReport {
                block: e.block(),
                state: e.state,
            })
            .collect()
    }

    /// Replica counts by state.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for e in self.map.iter() {
            *out.entry(format!("{:?}", e.state)).or_insert(0) += 1;
        }
        out
    }

    /// Bytes held by replicas on volume `index`.
    pub fn used_on(&self, index: usize) -> u64 {
        self.map
            .iter()
            .filter(|e| e.volume == index)
            .map(|e| e.live.bytes_on_disk())
            .sum()
    }

    /// Capacity, used and remaining bytes over all volumes.
    pub fn space(&self) -> NodeSpace {
        let mut s = NodeSpace::default();
        for v in self.volumes.volumes() {
            let Space {
                capacity,
                remaining,
            } = v.space().unwrap_or_default();
            s.capacity += capacity;
            s.remaining += remaining;
        }
        s.used = self.map.iter().map(|e| e.live.bytes_on_disk()).sum();
        s
    }
}

/// Whether `old` may be recovered from `block` to `latest` (protocol.md "Stages").
fn check_recoverable(
    old: &ReplicaEntry,
    block: ExtendedBlock,
    latest: GenerationStamp,
    close: bool,
) -> Result<()> {
    let id = block.id;
    if old.gen_stamp < block.gen_stamp {
        return Err(DatanodeError::StaleGenStamp {
            block: id,
            requested: block.gen_stamp,
            have: old.gen_stamp,
        });
    }
    let invalid = |reason: String| Err(DatanodeError::InvalidReplica { block: id, reason });
    // Any stamp in [block's, latest] is accepted (HDFS `recoverRbw`): an earlier recovery
    // attempt that failed part way may have restamped this replica to an intermediate one.
    if old.gen_stamp > latest {
        return invalid(format!(
            "generation stamp {} is newer than the recovery's {latest}",
            old.gen_stamp
        ));
    }
    let t = if close {
        Transition::RecoverClose
    } else {
        Transition::Recover
    };
    if transition(Some(old.state), t).is_none() {
        return invalid(format!("cannot {t:?} a {:?} replica", old.state));
    }
    let on_disk = old.live.bytes_on_disk();
    if old.state != ReplicaState::Finalized && on_disk < block.num_bytes {
        return invalid(format!(
            "holds {on_disk} bytes, fewer than the {} acknowledged",
            block.num_bytes
        ));
    }
    Ok(())
}

fn check_bpc(bpc: u32) -> Result<()> {
    if bpc == 0 || bpc > MAX_BYTES_PER_CHECKSUM {
        return Err(DatanodeError::invalid(format!(
            "bytes_per_checksum {bpc} must be in 1..={MAX_BYTES_PER_CHECKSUM}"
        )));
    }
    Ok(())
}

fn create_files(e: &ReplicaEntry, header: MetaHeader) -> Result<(File, File)> {
    let open = |p: &Path| {
        File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(p)
            .ctx("create", p)
    };
    let (bp, mp) = (e.block_path(), e.meta_path());
    let block = open(&bp)?;
    let meta = open(&mp)?;
    meta::write_header(&meta, header, &mp)?;
    Ok((block, meta))
}

fn open_rw(e: &ReplicaEntry) -> Result<(File, File, MetaHeader)> {
    let open = |p: &Path| {
        File::options()
            .read(true)
            .write(true)
            .open(p)
            .ctx("open", p)
    };
    let (bp, mp) = (e.block_path(), e.meta_path());
    let block = open(&bp)?;
    let meta = open(&mp)?;
    let header = meta::read_header(&meta, &mp)?;
    Ok((block, meta, header))
}
