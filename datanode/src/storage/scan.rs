//! The start-up scan: rebuilds the replica map from the volumes.
//!
//! Per volume, the files of each block in `rbw/` and in `finalized/subdir*/` are resolved
//! together ([`resolve`]: stale metadata files, half-done renames in either order, duplicates,
//! orphans), then the chosen pair is validated:
//!
//! - a `finalized/` pair is a Finalized replica (length = file length) when its metadata file
//!   covers the block file exactly; otherwise (or if it does not parse) it is a corrupt replica:
//!   logged, counted (`corrupt_replicas_skipped`), left on disk and never served. Chunk CRCs
//!   themselves are verified by every reader and by the block scanner.
//! - an `rbw/` pair is an Rbw replica of the previous run and becomes Rwr (HDFS "replica
//!   waiting to be recovered"). Its length is the bytes covered by valid checksums: the bytes
//!   the metadata file covers, capped by the file, cut at the first chunk whose checksum does
//!   not match (every chunk is verified). Nothing of an Rwr replica is visible to readers (its
//!   acknowledged length is unknown) until a recovery sets it.
//! - The same block found on two volumes keeps the newest generation stamp (a Finalized
//!   replica wins a tie); the older copy's files are removed.

mod resolve;

use super::layout::{self, ReplicaFile};
use super::meta::{self, MetaHeader};
use super::replica::{transition, ReplicaEntry, ReplicaLive, Transition};
use super::volume::{Volume, VolumeSet};
use crate::error::{IoContext, Result};
use crate::metrics::Metrics;
use resolve::{BlockFile, Candidate, Found, Kind, MetaFile, Place, Plan};
use sluice_common::checksum;
use sluice_common::proto::ReplicaState;
use sluice_common::{BlockId, GenerationStamp};
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
        remove(&p, "duplicate");
    }
}

fn remove(path: &Path, why: &str) {
    tracing::warn!(path = %path.display(), "removing {why} replica file");
    if let Err(err) = std::fs::remove_file(path) {
        if err.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), "cannot remove: {err}");
        }
    }
}

/// The replica files of a directory, by block. Other names are left alone.
fn list(dir: &Path) -> Result<HashMap<BlockId, Found>> {
    let mut out: HashMap<BlockId, Found> = HashMap::new();
    for item in std::fs::read_dir(dir).ctx("list", dir)? {
        let item = item.ctx("list", dir)?;
        let name = item.file_name();
        let Some(f) = name.to_str().and_then(layout::parse_file_name) else {
            continue;
        };
        let md = item.metadata().ctx("stat", &item.path())?;
        let ino = (md.dev(), md.ino());
        match f {
            ReplicaFile::Block(id) => {
                out.entry(id).or_default().block = Some(BlockFile { len: md.len(), ino })
            }
            ReplicaFile::Meta(id, gs) => {
                out.entry(id).or_default().metas.push(MetaFile { gs, ino })
            }
        }
    }
    Ok(out)
}

/// The two directories a block's files can be in.
struct Dirs {
    rbw: PathBuf,
    fin: PathBuf,
}

impl Dirs {
    fn dir(&self, place: Place) -> &Path {
        match place {
            Place::Rbw => &self.rbw,
            Place::Finalized => &self.fin,
        }
    }

    fn path(&self, id: BlockId, place: Place, kind: Kind) -> PathBuf {
        self.dir(place).join(name(id, kind))
    }
}

fn name(id: BlockId, kind: Kind) -> String {
    match kind {
        Kind::Block => layout::block_file_name(id),
        Kind::Meta(gs) => layout::meta_file_name(id, gs),
    }
}

fn scan_volume(vol: &Volume, metrics: &Metrics) -> Result<Vec<ReplicaEntry>> {
    let rbw_dir = layout::rbw_dir(&vol.root);
    let mut rbw = list(&rbw_dir)?;
    let mut fin: HashMap<BlockId, (PathBuf, Found)> = HashMap::new();
    let fin_root = layout::finalized_root(&vol.root);
    for sub in std::fs::read_dir(&fin_root).ctx("list", &fin_root)? {
        let dir = sub.ctx("list", &fin_root)?.path();
        if !dir.is_dir() {
            continue;
        }
        for (id, found) in list(&dir)? {
            if fin.contains_key(&id) {
                tracing::warn!(block = %id, dir = %dir.display(), "block also in another subdir: ignored");
                continue;
            }
            fin.insert(id, (dir.clone(), found));
        }
    }
    let ids: BTreeSet<BlockId> = fin.keys().chain(rbw.keys()).copied().collect();
    let mut out = Vec::new();
    for id in ids {
        let (fin_dir, f) = fin
            .remove(&id)
            .unwrap_or_else(|| (layout::finalized_subdir(&vol.root, id), Found::default()));
        let r = rbw.remove(&id).unwrap_or_default();
        let dirs = Dirs {
            rbw: rbw_dir.clone(),
            fin: fin_dir,
        };
        if let Some(e) = resolve_block(vol, id, &dirs, &resolve::plan(&f, &r), metrics)? {
            out.push(e);
        }
    }
    Ok(out)
}

/// Carries out `plan` for block `id`; returns the replica, if a candidate validated.
fn resolve_block(
    vol: &Volume,
    id: BlockId,
    dirs: &Dirs,
    plan: &Plan,
    metrics: &Metrics,
) -> Result<Option<ReplicaEntry>> {
    for &(place, kind) in &plan.unlink {
        remove(&dirs.path(id, place, kind), "stale or doubly linked");
    }
    if let Some(kind) = plan.roll_forward {
        roll_forward(id, dirs, kind)?;
    }
    for &(place, kind) in &plan.orphans {
        remove(&dirs.path(id, place, kind), "orphan");
    }
    let mut winner = None;
    for c in &plan.candidates {
        if c.place == Place::Rbw && never_synced(&dirs.path(id, c.place, Kind::Meta(c.gs))) {
            // Created, then a power cut before any hsync: nothing of it was durable.
            tracing::info!(
                block = %id,
                "rbw replica whose metadata header never reached the disk: removed"
            );
            for (place, kind) in Plan::files_of(c) {
                remove(&dirs.path(id, place, kind), "never synced");
            }
            continue;
        }
        match validate(vol, dirs, id, c) {
            Ok(e) => {
                winner = Some((*c, e));
                break;
            }
            Err(reason) => {
                tracing::error!(block = %id, place = ?c.place, "corrupt replica, not served: {reason}");
                metrics.corrupt_replicas_skipped.inc();
            }
        }
    }
    let Some((won, entry)) = winner else {
        return Ok(None);
    };
    for c in plan.candidates.iter().filter(|c| **c != won) {
        for (place, kind) in Plan::files_of(c) {
            remove(&dirs.path(id, place, kind), "superseded");
        }
    }
    Ok(Some(entry))
}

/// A metadata file shorter than its header: its replica was created (the directory entry is
/// fsynced at create) but never hsynced, and a power cut took the header.
fn never_synced(meta_path: &Path) -> bool {
    std::fs::metadata(meta_path).is_ok_and(|m| m.len() < meta::HEADER_LEN)
}

fn validate(
    vol: &Volume,
    dirs: &Dirs,
    id: BlockId,
    c: &Candidate,
) -> std::result::Result<ReplicaEntry, String> {
    match c.place {
        Place::Finalized => finalized_entry(vol, dirs.dir(c.place), id, c.gs, c.len),
        Place::Rbw => rwr_entry(vol, dirs.dir(c.place), id, c.gs, c.len),
    }
}

/// A finalize cut between its two renames: one file of the pair is in `finalized/`, the other
/// still in `rbw/`. Completes the move: rename, fsync the destination, then the source.
fn roll_forward(id: BlockId, dirs: &Dirs, kind: Kind) -> Result<()> {
    let (from, to) = (
        dirs.path(id, Place::Rbw, kind),
        dirs.path(id, Place::Finalized, kind),
    );
    std::fs::rename(&from, &to).ctx("rename", &from)?;
    crate::sys::sync_dir(&dirs.fin)?;
    crate::sys::sync_dir(&dirs.rbw)?;
    tracing::info!(block = %id, "completed an interrupted finalize");
    Ok(())
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

/// Bytes of an rbw replica verified per read at the scan.
const VERIFY_PIECE: u64 = 1 << 20;

/// The longest length up to `covered` whose every chunk matches its stored checksum, the last
/// good chunk possibly a prefix (an hflush's partial chunk): a kill can leave the last chunk's
/// data and checksum out of step, and a power cut any chunk not yet fsynced, so every chunk is
/// checked, not only the last (rbw replicas are few: the blocks being written).
fn valid_length(
    e: &ReplicaEntry,
    meta_file: &File,
    header: MetaHeader,
    covered: u64,
) -> std::result::Result<u64, String> {
    let bpc = header.bytes_per_checksum as u64;
    let block = File::open(e.block_path()).map_err(|err| err.to_string())?;
    let piece = (VERIFY_PIECE / bpc).max(1) * bpc;
    let mut pos = 0;
    while pos < covered {
        let n = (covered - pos).min(piece);
        let mut data = vec![0u8; n as usize];
        meta::read_exact_at(&block, &mut data, pos, &e.block_path())
            .map_err(|err| err.to_string())?;
        let mut sums = vec![0u8; n.div_ceil(bpc) as usize * 4];
        let at = MetaHeader::checksum_pos(pos / bpc);
        meta::read_exact_at(meta_file, &mut sums, at, &e.meta_path())
            .map_err(|err| err.to_string())?;
        let chunks = data.chunks(bpc as usize).zip(sums.chunks_exact(4));
        for (i, (chunk, sum)) in chunks.enumerate() {
            let stored = u32::from_be_bytes([sum[0], sum[1], sum[2], sum[3]]);
            if checksum::crc(chunk) != stored {
                let good = (1..chunk.len())
                    .rev()
                    .find(|&k| checksum::crc(&chunk[..k]) == stored);
                return Ok(pos + i as u64 * bpc + good.unwrap_or(0) as u64);
            }
        }
        pos += n;
    }
    Ok(covered)
}

#[cfg(test)]
mod tests;
