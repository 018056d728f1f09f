//! Where a replica's files live inside a volume (HDFS-like):
//!
//! ```text
//! <data dir>/
//!   VERSION                       node id and layout version (one per volume, same node id)
//!   current/rbw/                  replicas being written (Rbw, and Rwr after a restart)
//!     blk_<id>                    block data
//!     blk_<id>_<genstamp>.meta    header + one CRC32C per chunk
//!   current/finalized/subdir<N>/  finished replicas, N = (id >> 8) & 0xff
//!   tmp/                          Temporary replicas of transfers; emptied at start
//! ```
//!
//! Every function here is pure path arithmetic plus the durable directory creation.

use crate::error::Result;
use crate::sys;
use sluice_common::{BlockId, GenerationStamp};
use std::path::{Path, PathBuf};

/// Subdirectory of a finalized replica.
pub fn finalized_subdir(root: &Path, id: BlockId) -> PathBuf {
    finalized_root(root).join(format!("subdir{}", (id.0 >> 8) & 0xff))
}

/// `current/finalized`.
pub fn finalized_root(root: &Path) -> PathBuf {
    root.join("current").join("finalized")
}

/// `current/rbw`.
pub fn rbw_dir(root: &Path) -> PathBuf {
    root.join("current").join("rbw")
}

/// `tmp`.
pub fn tmp_dir(root: &Path) -> PathBuf {
    root.join("tmp")
}

/// `VERSION`.
pub fn version_file(root: &Path) -> PathBuf {
    root.join("VERSION")
}

/// The block file name `blk_<id>`.
pub fn block_file_name(id: BlockId) -> String {
    format!("blk_{}", id.0)
}

/// The metadata file name `blk_<id>_<genstamp>.meta`.
pub fn meta_file_name(id: BlockId, gs: GenerationStamp) -> String {
    format!("blk_{}_{}.meta", id.0, gs.0)
}

/// What a file name in a replica directory denotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaFile {
    /// `blk_<id>`.
    Block(BlockId),
    /// `blk_<id>_<genstamp>.meta`.
    Meta(BlockId, GenerationStamp),
}

/// Parses a replica file name; anything else is `None`.
pub fn parse_file_name(name: &str) -> Option<ReplicaFile> {
    let rest = name.strip_prefix("blk_")?;
    if let Some(meta) = rest.strip_suffix(".meta") {
        let (id, gs) = meta.split_once('_')?;
        return Some(ReplicaFile::Meta(
            BlockId(id.parse().ok()?),
            GenerationStamp(gs.parse().ok()?),
        ));
    }
    if rest.bytes().all(|b| b.is_ascii_digit()) && !rest.is_empty() {
        return Some(ReplicaFile::Block(BlockId(rest.parse().ok()?)));
    }
    None
}

/// Creates `dir` and any missing ancestors durably: each directory made is followed by an
/// fsync of its parent, so its entry survives a power cut before anything is put in it.
/// Returns whether anything was created.
pub fn create_dir_durable(dir: &Path) -> Result<bool> {
    if dir.is_dir() {
        return Ok(false);
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_durable(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        // Made by someone else in between: synced below all the same.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
        Err(e) => return Err(crate::error::DatanodeError::io("create directory", dir, e)),
    }
    match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sys::sync_dir(parent)?,
        None => sys::sync_dir(Path::new("."))?,
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let (id, gs) = (BlockId(1 << 40 | 513), GenerationStamp(1001));
        assert_eq!(
            parse_file_name(&block_file_name(id)),
            Some(ReplicaFile::Block(id))
        );
        assert_eq!(
            parse_file_name(&meta_file_name(id, gs)),
            Some(ReplicaFile::Meta(id, gs))
        );
        assert_eq!(parse_file_name("blk_12.tmp"), None);
        assert_eq!(parse_file_name("blk_"), None);
        assert_eq!(parse_file_name("VERSION"), None);
        assert!(finalized_subdir(Path::new("/d"), BlockId(0x1234))
            .ends_with("current/finalized/subdir18"));
    }
}
