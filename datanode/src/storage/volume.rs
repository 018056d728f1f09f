//! Volumes: one per data directory. A volume owns its directory tree (see [`super::layout`]),
//! its `VERSION` file and its space figures (`statvfs`).
//!
//! Start-up order per volume: create the tree if missing (each new directory's parent
//! fsynced, see [`layout::create_dir_durable`]) → read or write `VERSION` (written as
//! `VERSION.tmp`, fsynced, renamed, directory fsynced) → empty `tmp/` (Temporary replicas of
//! interrupted transfers are worthless). Every volume of a node carries the same node id; a
//! volume with another id is a start-up error naming the directory.

use super::layout;
use crate::error::{DatanodeError, IoContext, Result};
use sluice_common::NodeId;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Layout version written in `VERSION`.
pub const LAYOUT_VERSION: u32 = 1;

/// One data directory.
#[derive(Debug)]
pub struct Volume {
    /// Position in the node's volume list.
    pub index: usize,
    /// The data directory.
    pub root: PathBuf,
}

/// Space figures of a volume's file system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Space {
    /// Total bytes.
    pub capacity: u64,
    /// Bytes free for unprivileged users.
    pub remaining: u64,
}

impl Volume {
    /// Space of the file system holding this volume (`statvfs`).
    pub fn space(&self) -> Result<Space> {
        crate::sys::statvfs(&self.root)
    }
}

/// The volumes of a node and the choice of a volume for a new replica.
#[derive(Debug)]
pub struct VolumeSet {
    volumes: Vec<Volume>,
    node_id: NodeId,
    next: AtomicUsize,
}

impl VolumeSet {
    /// Opens (creating if needed) every data directory, agreeing on one node id.
    pub fn open(dirs: &[PathBuf]) -> Result<VolumeSet> {
        if dirs.is_empty() {
            return Err(DatanodeError::invalid("no data directory configured"));
        }
        let mut found: Option<(NodeId, PathBuf)> = None;
        for dir in dirs {
            for d in [
                layout::finalized_root(dir),
                layout::rbw_dir(dir),
                layout::tmp_dir(dir),
            ] {
                layout::create_dir_durable(&d)?;
            }
            if let Some(id) = read_version(dir)? {
                match &found {
                    Some((expected, _)) if *expected != id => {
                        return Err(DatanodeError::NodeIdMismatch {
                            dir: dir.clone(),
                            expected: expected.0.clone(),
                            found: id.0,
                        })
                    }
                    Some(_) => {}
                    None => found = Some((id, dir.clone())),
                }
            }
        }
        let node_id = match found {
            Some((id, _)) => id,
            None => new_node_id(),
        };
        let mut volumes = Vec::with_capacity(dirs.len());
        for (index, dir) in dirs.iter().enumerate() {
            if read_version(dir)?.is_none() {
                write_version(dir, &node_id)?;
            }
            empty_tmp(dir)?;
            volumes.push(Volume {
                index,
                root: dir.clone(),
            });
        }
        Ok(VolumeSet {
            volumes,
            node_id,
            next: AtomicUsize::new(0),
        })
    }

    /// The node id every volume carries.
    pub fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// All volumes.
    pub fn volumes(&self) -> &[Volume] {
        &self.volumes
    }

    /// Volume `index`.
    pub fn get(&self, index: usize) -> Option<&Volume> {
        self.volumes.get(index)
    }

    /// Picks a volume for a new replica: round-robin over the volumes with at least
    /// `min_free` bytes free; [`DatanodeError::NoSpace`] if none has.
    pub fn choose(&self, min_free: u64) -> Result<&Volume> {
        let n = self.volumes.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            let v = &self.volumes[(start + i) % n];
            match v.space() {
                Ok(s) if s.remaining >= min_free => return Ok(v),
                Ok(_) => {}
                Err(e) => tracing::warn!(volume = %v.root.display(), "statvfs failed: {e}"),
            }
        }
        Err(DatanodeError::NoSpace)
    }
}

fn new_node_id() -> NodeId {
    use rand::Rng;
    let n: u64 = rand::rng().random();
    NodeId(format!("dn-{n:016x}"))
}

/// Reads `VERSION`: `None` if the volume has none yet.
fn read_version(dir: &Path) -> Result<Option<NodeId>> {
    let path = layout::version_file(dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DatanodeError::io("read", &path, e)),
    };
    let bad = |reason: String| DatanodeError::BadVersionFile {
        path: path.clone(),
        reason,
    };
    let mut node_id = None;
    let mut layout_version = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match line.split_once('=') {
            Some(("node_id", v)) if !v.trim().is_empty() => node_id = Some(v.trim().to_string()),
            Some(("layout_version", v)) => {
                layout_version = Some(
                    v.trim()
                        .parse::<u32>()
                        .map_err(|_| bad(format!("layout_version {v:?}")))?,
                )
            }
            _ => return Err(bad(format!("unexpected line {line:?}"))),
        }
    }
    match (node_id, layout_version) {
        (Some(id), Some(LAYOUT_VERSION)) => Ok(Some(NodeId(id))),
        (Some(_), Some(v)) => Err(bad(format!(
            "layout version {v}, this build reads {LAYOUT_VERSION}"
        ))),
        _ => Err(bad("node_id or layout_version missing".into())),
    }
}

/// Writes `VERSION` crash-safely: temp file, fsync, rename, fsync the directory.
fn write_version(dir: &Path, id: &NodeId) -> Result<()> {
    use std::io::Write;
    let path = layout::version_file(dir);
    let tmp = dir.join("VERSION.tmp");
    let text = format!("node_id={}\nlayout_version={LAYOUT_VERSION}\n", id.0);
    let mut f = std::fs::File::create(&tmp).ctx("create", &tmp)?;
    f.write_all(text.as_bytes()).ctx("write", &tmp)?;
    f.sync_all().ctx("fsync", &tmp)?;
    std::fs::rename(&tmp, &path).ctx("rename", &path)?;
    crate::sys::sync_dir(dir)
}

fn empty_tmp(dir: &Path) -> Result<()> {
    let tmp = layout::tmp_dir(dir);
    for entry in std::fs::read_dir(&tmp).ctx("list", &tmp)? {
        let path = entry.ctx("list", &tmp)?.path();
        let res = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        res.ctx("remove", &path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_is_created_once_and_shared() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
        let first = VolumeSet::open(&dirs).unwrap().node_id().clone();
        std::fs::write(layout::tmp_dir(a.path()).join("blk_1"), b"x").unwrap();
        let again = VolumeSet::open(&dirs).unwrap();
        assert_eq!(again.node_id(), &first);
        assert_eq!(
            std::fs::read_dir(layout::tmp_dir(a.path()))
                .unwrap()
                .count(),
            0
        );
        assert!(again.volumes()[0].space().unwrap().capacity > 0);
    }

    #[test]
    fn a_new_volume_tree_is_durable() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("vol");
        crate::sys::record::take();
        VolumeSet::open(std::slice::from_ref(&root)).unwrap();
        let synced = crate::sys::record::take();
        for made in [
            root.clone(),
            root.join("current"),
            layout::finalized_root(&root),
            layout::rbw_dir(&root),
            layout::tmp_dir(&root),
        ] {
            let parent = made.parent().unwrap();
            assert!(
                synced.iter().any(|d| d == parent),
                "{} made but {} not fsynced: {synced:?}",
                made.display(),
                parent.display()
            );
        }
        VolumeSet::open(std::slice::from_ref(&root)).unwrap();
        assert!(
            crate::sys::record::take().is_empty(),
            "an existing tree costs no fsync"
        );
    }

    #[test]
    fn mismatched_node_id_names_the_dir() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        VolumeSet::open(&[a.path().to_path_buf()]).unwrap();
        VolumeSet::open(&[b.path().to_path_buf()]).unwrap();
        let err = VolumeSet::open(&[a.path().to_path_buf(), b.path().to_path_buf()]).unwrap_err();
        match &err {
            DatanodeError::NodeIdMismatch { dir, .. } => assert_eq!(dir, b.path()),
            other => panic!("expected a mismatch, got {other}"),
        }
        assert!(err.to_string().contains(&b.path().display().to_string()));
    }

    #[test]
    fn garbage_version_file_is_a_typed_error() {
        let a = tempfile::tempdir().unwrap();
        std::fs::write(a.path().join("VERSION"), "hello\n").unwrap();
        let err = VolumeSet::open(&[a.path().to_path_buf()]).unwrap_err();
        assert!(matches!(err, DatanodeError::BadVersionFile { .. }), "{err}");
    }
}
