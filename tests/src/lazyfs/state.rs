//! The plain logic of a lazyfs mount, without FUSE: file data kept until fsync, directory
//! changes kept until the directory's fsync, and the power cut that drops both.
//!
//! Every operation takes the inode numbers the kernel uses and returns an `io::Result` whose
//! error is the errno to answer. While the power is off every operation fails with `EIO`.

use super::journal::{Change, Journal};
use super::pending::Pending;
use super::tree::Tree;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::path::PathBuf;

/// What a crash threw away.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lost {
    /// Files that had unsynced writes or size changes.
    pub files: usize,
    /// Unsynced bytes written to them.
    pub bytes: u64,
    /// Directory changes (create, unlink, rmdir, rename) undone.
    pub dir_changes: usize,
}

/// What is not yet durable (the same counts as [`Lost`]).
pub type Unsynced = Lost;

pub(super) fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// A file's open backing descriptor and its unsynced changes.
#[derive(Debug)]
struct FileData {
    file: File,
    pending: Option<Pending>,
}

/// The state of one mount.
#[derive(Debug)]
pub(super) struct State {
    pub(super) tree: Tree,
    files: HashMap<u64, FileData>,
    handles: HashMap<u64, u64>,
    next_fh: u64,
    pub(super) journal: Journal,
    trash: PathBuf,
    trash_seq: u64,
    powered: bool,
    root: PathBuf,
}

impl State {
    /// A mount of `root`, keeping removed entries in `trash` until they are durable.
    pub(super) fn new(root: PathBuf, trash: PathBuf) -> State {
        State {
            tree: Tree::new(root.clone()),
            files: HashMap::new(),
            handles: HashMap::new(),
            next_fh: 1,
            journal: Journal::default(),
            trash,
            trash_seq: 0,
            powered: true,
            root,
        }
    }

    /// Fails with `EIO` while the power is off.
    pub(super) fn check(&self) -> io::Result<()> {
        if self.powered {
            Ok(())
        } else {
            Err(errno(libc::EIO))
        }
    }

    /// The backing root.
    pub(super) fn root(&self) -> &std::path::Path {
        &self.root
    }

    pub(super) fn next_trash(&mut self) -> PathBuf {
        self.trash_seq += 1;
        self.trash.join(format!("t{}", self.trash_seq))
    }

    fn data(&mut self, ino: u64) -> io::Result<&mut FileData> {
        if !self.files.contains_key(&ino) {
            if self.tree.is_dir(ino) {
                return Err(errno(libc::EISDIR));
            }
            let path = self.tree.path(ino)?;
            let file = OpenOptions::new().read(true).write(true).open(path)?;
            self.files.insert(
                ino,
                FileData {
                    file,
                    pending: None,
                },
            );
        }
        self.files.get_mut(&ino).ok_or_else(|| errno(libc::EIO))
    }

    /// The metadata of `ino` and the size readers see.
    pub(super) fn stat(&mut self, ino: u64) -> io::Result<(Metadata, u64)> {
        self.check()?;
        let meta = std::fs::symlink_metadata(self.tree.path(ino)?)?;
        let size = match self.files.get(&ino).and_then(|f| f.pending.as_ref()) {
            Some(p) => p.size(),
            None => meta.len(),
        };
        Ok((meta, size))
    }

    /// Looks up entry `name` of `parent`.
    pub(super) fn lookup(&mut self, parent: u64, name: &OsStr) -> io::Result<u64> {
        self.check()?;
        let meta = std::fs::symlink_metadata(self.tree.child_path(parent, name)?)?;
        Ok(self.tree.child_or_insert(parent, name, meta.is_dir()))
    }

    /// Opens `ino`: a new file handle.
    pub(super) fn open(&mut self, ino: u64) -> io::Result<u64> {
        self.check()?;
        if !self.tree.is_dir(ino) {
            self.data(ino)?;
        }
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, ino);
        Ok(fh)
    }

    /// Closes file handle `fh`.
    pub(super) fn release(&mut self, fh: u64) {
        self.handles.remove(&fh);
    }

    /// A handle opened before a crash is dead.
    pub(super) fn handle(&self, fh: u64, ino: u64) -> io::Result<()> {
        self.check()?;
        match self.handles.get(&fh) {
            Some(&i) if i == ino => Ok(()),
            _ => Err(errno(libc::EIO)),
        }
    }

    /// Reads through the unsynced changes.
    pub(super) fn read(&mut self, ino: u64, off: u64, len: u64) -> io::Result<Vec<u8>> {
        self.check()?;
        let d = self.data(ino)?;
        match &d.pending {
            Some(p) => p.read(&d.file, off, len),
            None => Pending::new(d.file.metadata()?.len()).read(&d.file, off, len),
        }
    }

    fn pending(&mut self, ino: u64) -> io::Result<&mut Pending> {
        let d = self.data(ino)?;
        if d.pending.is_none() {
            d.pending = Some(Pending::new(d.file.metadata()?.len()));
        }
        d.pending.as_mut().ok_or_else(|| errno(libc::EIO))
    }

    /// Writes into memory only.
    pub(super) fn write(&mut self, ino: u64, off: u64, data: &[u8]) -> io::Result<()> {
        self.check()?;
        tracing::trace!(ino, off, len = data.len(), "lazyfs: write");
        self.pending(ino)?.write(off, data);
        Ok(())
    }

    /// Truncates (or extends) in memory only.
    pub(super) fn truncate(&mut self, ino: u64, size: u64) -> io::Result<()> {
        self.check()?;
        self.pending(ino)?.truncate(size);
        Ok(())
    }

    /// `fsync`/`fdatasync` of a file: its data is durable.
    pub(super) fn fsync(&mut self, ino: u64) -> io::Result<()> {
        self.check()?;
        tracing::debug!(ino, path = ?self.tree.path(ino).ok(), "lazyfs: fsync");
        if let Some(d) = self.files.get_mut(&ino) {
            if let Some(p) = d.pending.take() {
                p.apply(&d.file)?;
            }
        }
        Ok(())
    }

    /// `fsync` of a directory: the changes of its entries are durable.
    pub(super) fn fsync_dir(&mut self, ino: u64) -> io::Result<()> {
        self.check()?;
        for c in self.journal.sync_dir(ino) {
            forget_trash(&c);
        }
        Ok(())
    }

    /// Makes everything durable (`sync(1)`).
    pub(super) fn sync_all(&mut self) -> io::Result<()> {
        self.check()?;
        let inos: Vec<u64> = self.files.keys().copied().collect();
        for ino in inos {
            self.fsync(ino)?;
        }
        for c in self.journal.take_all() {
            forget_trash(&c);
        }
        Ok(())
    }

    /// What is not durable yet.
    pub(super) fn unsynced(&self) -> Unsynced {
        let pending: Vec<&Pending> = self
            .files
            .values()
            .filter_map(|f| f.pending.as_ref())
            .collect();
        Lost {
            files: pending.len(),
            bytes: pending.iter().map(|p| p.bytes()).sum(),
            dir_changes: self.journal.len(),
        }
    }

    /// The power cut: every unsynced change is dropped, the backing directory is left as a
    /// power cut would leave it, and every operation fails until [`State::power_on`].
    pub(super) fn crash(&mut self) -> Lost {
        let lost = self.unsynced();
        self.powered = false;
        self.files.clear();
        self.handles.clear();
        for c in self.journal.take_all().into_iter().rev() {
            if let Err(e) = self.undo(&c) {
                tracing::warn!(?c, "lazyfs: undoing a change failed: {e}");
            }
        }
        self.tree.reset();
        lost
    }

    /// Serves operations again after a crash.
    pub(super) fn power_on(&mut self) {
        self.powered = true;
    }

    /// Records a directory change.
    pub(super) fn record(&mut self, c: Change) {
        self.journal.push(c);
    }

    /// Undoes one change on the backing directory and in the inode table.
    fn undo(&mut self, c: &Change) -> io::Result<()> {
        match c {
            Change::Created { ino, .. } => {
                let path = self.tree.path(*ino)?;
                let dir = self.tree.is_dir(*ino);
                self.tree.remove(*ino);
                remove_any(&path, dir)
            }
            Change::Removed {
                ino,
                parent,
                name,
                trash,
            } => {
                let back = self.tree.child_path(*parent, name)?;
                if back.symlink_metadata().is_err() {
                    std::fs::rename(trash, &back)?;
                    self.tree.move_to(*ino, *parent, name);
                }
                Ok(())
            }
            Change::Renamed {
                ino,
                from,
                to,
                replaced,
            } => {
                let cur = self.tree.path(*ino)?;
                std::fs::rename(&cur, self.tree.child_path(from.0, &from.1)?)?;
                self.tree.move_to(*ino, from.0, &from.1);
                if let Some((rino, trash)) = replaced {
                    std::fs::rename(trash, self.tree.child_path(to.0, &to.1)?)?;
                    self.tree.move_to(*rino, to.0, &to.1);
                }
                Ok(())
            }
        }
    }
}

/// Removes a file or a whole directory tree.
pub(super) fn remove_any(path: &std::path::Path, dir: bool) -> io::Result<()> {
    if dir || path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

/// A durable removal: the trashed bytes go for good.
fn forget_trash(c: &Change) {
    if let Some(t) = c.trash() {
        if let Err(e) = remove_any(t, false) {
            tracing::debug!(trash = %t.display(), "lazyfs: trash already gone: {e}");
        }
    }
}
