//! Directory changes not yet made durable by an fsync of the directory, and how to undo them.
//!
//! Every create, unlink, rmdir and rename is applied to the backing directory at once (so
//! that it is visible), and recorded here with the directories it touched. `fsync` of a
//! directory makes every recorded change touching it durable, together with the earlier
//! changes of the same inodes (a file created in `rbw/` and renamed into `finalized/` is
//! durable once `finalized/` is synced, as on a journalling file system). A crash undoes the
//! rest, newest first. A rename is atomic: it is durable once either directory is synced.

use std::ffi::OsString;
use std::path::PathBuf;

/// One namespace change.
#[derive(Debug, Clone)]
pub(super) enum Change {
    /// `ino` was created (file or directory) in `parent`.
    Created { ino: u64, parent: u64 },
    /// Entry `name` of `parent` (inode `ino`) was removed; its bytes wait at `trash`.
    Removed {
        ino: u64,
        parent: u64,
        name: OsString,
        trash: PathBuf,
    },
    /// `ino` moved from `from` to `to`; what `to` named before waits at `replaced`'s path.
    Renamed {
        ino: u64,
        from: (u64, OsString),
        to: (u64, OsString),
        replaced: Option<(u64, PathBuf)>,
    },
}

impl Change {
    fn ino(&self) -> u64 {
        match self {
            Change::Created { ino, .. }
            | Change::Removed { ino, .. }
            | Change::Renamed { ino, .. } => *ino,
        }
    }

    fn touches(&self, dir: u64) -> bool {
        match self {
            Change::Created { parent, .. } | Change::Removed { parent, .. } => *parent == dir,
            Change::Renamed { from, to, .. } => from.0 == dir || to.0 == dir,
        }
    }

    /// The trash path this change holds, deleted once the change is durable.
    pub(super) fn trash(&self) -> Option<&PathBuf> {
        match self {
            Change::Removed { trash, .. } => Some(trash),
            Change::Renamed {
                replaced: Some((_, t)),
                ..
            } => Some(t),
            _ => None,
        }
    }
}

/// The changes not yet durable, oldest first.
#[derive(Debug, Default)]
pub(super) struct Journal {
    changes: Vec<Change>,
}

impl Journal {
    /// Records a change.
    pub(super) fn push(&mut self, c: Change) {
        self.changes.push(c);
    }

    /// Number of changes not yet durable.
    pub(super) fn len(&self) -> usize {
        self.changes.len()
    }

    /// An fsync of directory `dir`: takes out the changes it makes durable.
    pub(super) fn sync_dir(&mut self, dir: u64) -> Vec<Change> {
        let mut durable = vec![false; self.changes.len()];
        for i in (0..self.changes.len()).rev() {
            if self.changes[i].touches(dir) {
                durable[i] = true;
            }
            // An earlier change of an inode with a durable later change is durable too.
            let ino = self.changes[i].ino();
            if (i + 1..self.changes.len()).any(|j| durable[j] && self.changes[j].ino() == ino) {
                durable[i] = true;
            }
        }
        let mut out = Vec::new();
        let mut kept = Vec::new();
        for (c, d) in self.changes.drain(..).zip(durable) {
            if d {
                out.push(c);
            } else {
                kept.push(c);
            }
        }
        self.changes = kept;
        out
    }

    /// Takes out every change, oldest first.
    pub(super) fn take_all(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created(ino: u64, parent: u64) -> Change {
        Change::Created { ino, parent }
    }

    #[test]
    fn a_directory_sync_takes_its_changes_and_the_history_of_their_inodes() {
        let mut j = Journal::default();
        j.push(created(10, 2)); // file 10 created in dir 2
        j.push(created(11, 2)); // file 11 created in dir 2
        j.push(Change::Renamed {
            ino: 10,
            from: (2, "a".into()),
            to: (3, "a".into()),
            replaced: None,
        });
        let durable = j.sync_dir(3);
        assert_eq!(durable.len(), 2, "the rename into 3 and the creation of 10");
        assert_eq!(j.len(), 1, "the creation of 11 still waits for dir 2");
        assert_eq!(j.sync_dir(4).len(), 0);
        assert_eq!(j.sync_dir(2).len(), 1);
    }
}
