//! The start-up scan: rebuilds the replica map from the volumes.
//!
//! - `finalized/subdir*/`: a block file with a metadata file that covers it exactly is a
//!   Finalized replica (length = file length). A metadata file that does not cover the block
//!   file, or does not parse, marks a corrupt replica: it is logged, counted
//!   (`corrupt_replicas_skipped`) and left out of the map, never served.
//!   A finalized metadata file whose block file is still in `rbw/` is an interrupted finalize:
//!   the block file is moved in (roll forward).
//! - `rbw/`: Rbw replicas of the previous run become Rwr (HDFS "replica waiting to be
//!   recovered"). Their length is the bytes covered by valid checksums: the bytes the metadata
//!   file covers, capped by the file, minus the last chunk if its checksum does not match.
//!   Nothing of an Rwr replica is visible to readers (its acknowledged length is unknown) until
//!   a recovery sets it.
//! - The same block found twice keeps the newest generation stamp (a Finalized replica wins a
//!   tie); the older copy's files are removed.

use super::layout::{self, ReplicaFile};
use super::meta::{self, MetaHeader};
use super::replica::{transition, ReplicaEntry, ReplicaLive, Transition};
use super::volume::{Volume, VolumeSet};
use crate::error::{IoContext, Result};
use crate::metrics::Metrics;
use sluice_common::checksum;
use sluice_common::proto::ReplicaState;
use sluice_common::{BlockId, GenerationStamp};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Files of one block found in one directory.
#[derive(Default)]
struct Found {
    block: Option<u64>,
    metas: Vec<GenerationStamp>,
}

/// Scans every volume; returns one entry per block.
pub fn scan(volumes: &VolumeSet, metrics: &Metrics) -> Result<Vec<ReplicaEntry>> {
    let mut best: HashMap<BlockId, ReplicaEntry> = HashMap::new();
    for vol in volumes.volumes() {
        for entry in scan_volume(vol, metrics)? {
            match best.get(&entry.id) {
                Some(cur) if !newer(&entry, cur) => remove_files(&entry),
                Some(cur) => {
                    remove_files(cur);
                    best.insert(entry.id, entry);
                }
                None => {
                    best.insert(entry.id, entry);
                }
            }
        }
    }
    Ok(best.into_values().collect())
}

fn newer(a: &ReplicaEntry, b: &ReplicaEntry) -> bool {
    (a.gen_stamp, a.state == ReplicaState::Finalized)
        > (b.gen_stamp, b.state == ReplicaState::Finalized)
}

fn remove_files(e: &ReplicaEntry) {
    tracing::warn!(block = %e.id, gs = %e.gen_stamp, dir = %e.dir.display(), "removing a duplicate replica with an older generation stamp");
    for p in [e.meta_path(), e.block_path()] {
        if let Err(err) = std::fs::remove_file(&p) {
            tracing::warn!(path = %p.display(), "cannot remove: {err}");
        }
    }
}

fn list(dir: &Path) -> Result<HashMap<BlockId, Found>> {
    let mut out: HashMap<BlockId, Found> = HashMap::new();
    for item in std::fs::read_dir(dir).ctx("list", dir)? {
        let item = item.ctx("list", dir)?;
        let name = item.file_name();
        let Some(f) = name.to_str().and_then(layout::parse_file_name) else {
            continue;
        };
        match f {
            ReplicaFile::Block(id) => {
                let len = item.metadata().ctx("stat", &item.path())?.len();
                out.entry(id).or_default().block = Some(len);
            }
            ReplicaFile::Meta(id, gs) => out.entry(id).or_default().metas.push(gs),
        }
    }
    Ok(out)
}

fn scan_volume(vol: &Volume, metrics: &Metrics) -> Result<Vec<ReplicaEntry>> {
    let rbw_dir = layout::rbw_dir(&vol.root);
    let mut rbw = list(&rbw_dir)?;
    let mut out = Vec::new();
    let fin_root = layout::finalized_root(&vol.root);
    for sub in std::fs::read_dir(&fin_root).ctx("list", &fin_root)? {
        let dir = sub.ctx("list", &fin_root)?.path();
        if !dir.is_dir() {
            continue;
        }
        for (id, mut found) in list(&dir)? {
            let Some(gs) = found.metas.iter().max().copied() else {
                tracing::warn!(block = %id, dir = %dir.display(), "finalized block file without a metadata file: skipped");
                metrics.corrupt_replicas_skipped.inc();
                continue;
            };
            if found.block.is_none() {
                found.block = roll_forward(id, &rbw_dir, &dir, &mut rbw)?;
            }
            let Some(len) = found.block else {
                tracing::warn!(block = %id, dir = %dir.display(), "metadata file without a block file: skipped");
                continue;
            };
            match finalized_entry(vol, &dir, id, gs, len) {
                Ok(e) => out.push(e),
                Err(reason) => {
                    tracing::error!(block = %id, dir = %dir.display(), "corrupt finalized replica, not served: {reason}");
                    metrics.corrupt_replicas_skipped.inc();
                }
            }
        }
    }
    for (id, found) in rbw {
        let (Some(len), Some(gs)) = (found.block, found.metas.iter().max().copied()) else {
            tracing::warn!(block = %id, "incomplete replica in rbw/ (block or metadata file missing): skipped");
            continue;
        };
        match rwr_entry(vol, &rbw_dir, id, gs, len) {
            Ok(e) => out.push(e),
            Err(reason) => {
                tracing::error!(block = %id, "unreadable replica in rbw/, skipped: {reason}");
                metrics.corrupt_replicas_skipped.inc();
            }
        }
    }
    Ok(out)
}

/// A finalize that crashed between its two renames: the meta file is in `finalized/`, the block
/// file still in `rbw/`. Completes the move and returns the block file's length.
fn roll_forward(
    id: BlockId,
    rbw_dir: &Path,
    dest: &Path,
    rbw: &mut HashMap<BlockId, Found>,
) -> Result<Option<u64>> {
    let Some(found) = rbw.get(&id) else {
        return Ok(None);
    };
    if !found.metas.is_empty() || found.block.is_none() {
        return Ok(None);
    }
    let name = layout::block_file_name(id);
    let from = rbw_dir.join(&name);
    std::fs::rename(&from, dest.join(&name)).ctx("rename", &from)?;
    layout::sync_dir(dest)?;
    layout::sync_dir(rbw_dir)?;
    tracing::info!(block = %id, "completed an interrupted finalize");
    Ok(rbw.remove(&id).and_then(|f| f.block))
}

fn open_meta(path: &Path) -> std::result::Result<(File, MetaHeader, u64), String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    let header = meta::read_header(&f, path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    Ok((f, header, len))
}

fn finalized_entry(
    vol: &Volume,
    dir: &Path,
    id: BlockId,
    gs: GenerationStamp,
    len: u64,
) -> std::result::Result<ReplicaEntry, String> {
    let entry = entry(vol, dir.to_path_buf(), id, gs, ReplicaState::Finalized, 0);
    let (_, header, meta_len) = open_meta(&entry.meta_path())?;
    if meta_len != header.meta_len(len) {
        return Err(format!(
            "metadata file of {meta_len} bytes does not cover a block file of {len} bytes (needs {})",
            header.meta_len(len)
        ));
    }
    entry.live.reset(len);
    Ok(ReplicaEntry {
        bytes_per_checksum: header.bytes_per_checksum,
        ..entry
    })
}

fn rwr_entry(
    vol: &Volume,
    dir: &Path,
    id: BlockId,
    gs: GenerationStamp,
    len: u64,
) -> std::result::Result<ReplicaEntry, String> {
    let state =
        transition(Some(ReplicaState::Rbw), Transition::Restart).unwrap_or(ReplicaState::Rwr);
    let e = entry(vol, dir.to_path_buf(), id, gs, state, 0);
    let (meta_file, header, meta_len) = open_meta(&e.meta_path())?;
    let covered = valid_length(
        &e,
        &meta_file,
        header,
        header.covered_len(meta_len).min(len),
    )?;
    e.live.set_bytes_on_disk(covered);
    Ok(ReplicaEntry {
        bytes_per_checksum: header.bytes_per_checksum,
        ..e
    })
}

fn entry(
    vol: &Volume,
    dir: PathBuf,
    id: BlockId,
    gs: GenerationStamp,
    state: ReplicaState,
    len: u64,
) -> ReplicaEntry {
    ReplicaEntry {
        id,
        gen_stamp: gs,
        state,
        volume: vol.index,
        dir,
        bytes_per_checksum: 0,
        live: ReplicaLive::new(len, 0),
    }
}

/// The longest length up to `covered` whose last chunk matches its stored checksum: a torn
/// write may have left the last chunk's data and checksum out of step.
fn valid_length(
    e: &ReplicaEntry,
    meta_file: &File,
    header: MetaHeader,
    covered: u64,
) -> std::result::Result<u64, String> {
    let bpc = header.bytes_per_checksum as u64;
    if covered == 0 {
        return Ok(0);
    }
    let start = (covered - 1) / bpc * bpc;
    let block = File::open(e.block_path()).map_err(|err| err.to_string())?;
    let mut data = vec![0u8; (covered - start) as usize];
    meta::read_exact_at(&block, &mut data, start, &e.block_path())
        .map_err(|err| err.to_string())?;
    let mut stored = [0u8; 4];
    let pos = MetaHeader::checksum_pos(start / bpc);
    meta::read_exact_at(meta_file, &mut stored, pos, &e.meta_path())
        .map_err(|err| err.to_string())?;
    let stored = u32::from_be_bytes(stored);
    let good = (1..=data.len())
        .rev()
        .find(|&n| checksum::crc(&data[..n]) == stored);
    Ok(start + good.unwrap_or(0) as u64)
}
