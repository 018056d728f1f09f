//! Directory operations of a lazyfs mount: applied to the backing directory at once and
//! recorded in the journal so that a crash can undo them.

use super::journal::Change;
use super::state::{errno, State};
use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};

/// One entry of a directory listing.
#[derive(Debug, Clone)]
pub(super) struct DirEntry {
    pub(super) ino: u64,
    pub(super) dir: bool,
    pub(super) name: std::ffi::OsString,
}

impl State {
    /// `mkdir`.
    pub(super) fn mkdir(&mut self, parent: u64, name: &OsStr, mode: u32) -> io::Result<u64> {
        self.check()?;
        let path = self.tree.child_path(parent, name)?;
        std::fs::DirBuilder::new().mode(mode).create(&path)?;
        let ino = self.tree.insert(parent, name, true);
        self.record(Change::Created { ino, parent });
        Ok(ino)
    }

    /// `creat`/`open(O_CREAT)` and `mknod` of a regular file; `excl` for `O_EXCL`.
    pub(super) fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        excl: bool,
    ) -> io::Result<u64> {
        self.check()?;
        let path = self.tree.child_path(parent, name)?;
        if path.symlink_metadata().is_ok() {
            if excl {
                return Err(errno(libc::EEXIST));
            }
            return self.lookup(parent, name);
        }
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)?;
        let ino = self.tree.insert(parent, name, false);
        self.record(Change::Created { ino, parent });
        Ok(ino)
    }

    /// `unlink` (`dir` false) or `rmdir` (`dir` true).
    pub(super) fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> io::Result<()> {
        self.check()?;
        let path = self.tree.child_path(parent, name)?;
        let meta = path.symlink_metadata()?;
        match (dir, meta.is_dir()) {
            (false, true) => return Err(errno(libc::EISDIR)),
            (true, false) => return Err(errno(libc::ENOTDIR)),
            (true, true) if std::fs::read_dir(&path)?.next().is_some() => {
                return Err(errno(libc::ENOTEMPTY))
            }
            _ => {}
        }
        let ino = self.tree.child_or_insert(parent, name, dir);
        let trash = self.next_trash();
        std::fs::rename(&path, &trash)?;
        self.tree.move_to_trash(ino, &trash);
        self.record(Change::Removed {
            ino,
            parent,
            name: name.to_os_string(),
            trash,
        });
        Ok(())
    }

    /// `rename`; `noreplace` for `RENAME_NOREPLACE`.
    pub(super) fn rename(
        &mut self,
        from: (u64, &OsStr),
        to: (u64, &OsStr),
        noreplace: bool,
    ) -> io::Result<()> {
        self.check()?;
        let src = self.tree.child_path(from.0, from.1)?;
        let dst = self.tree.child_path(to.0, to.1)?;
        let src_meta = src.symlink_metadata()?;
        if src == dst {
            return Ok(());
        }
        let ino = self.tree.child_or_insert(from.0, from.1, src_meta.is_dir());
        let mut replaced = None;
        if let Ok(dm) = dst.symlink_metadata() {
            if noreplace {
                return Err(errno(libc::EEXIST));
            }
            match (src_meta.is_dir(), dm.is_dir()) {
                (false, true) => return Err(errno(libc::EISDIR)),
                (true, false) => return Err(errno(libc::ENOTDIR)),
                (true, true) if std::fs::read_dir(&dst)?.next().is_some() => {
                    return Err(errno(libc::ENOTEMPTY))
                }
                _ => {}
            }
            let rino = self.tree.child_or_insert(to.0, to.1, dm.is_dir());
            let trash = self.next_trash();
            std::fs::rename(&dst, &trash)?;
            self.tree.move_to_trash(rino, &trash);
            replaced = Some((rino, trash));
        }
        std::fs::rename(&src, &dst)?;
        self.tree.move_to(ino, to.0, to.1);
        self.record(Change::Renamed {
            ino,
            from: (from.0, from.1.to_os_string()),
            to: (to.0, to.1.to_os_string()),
            replaced,
        });
        Ok(())
    }

    /// Every entry of directory `ino` (without `.` and `..`).
    pub(super) fn list(&mut self, ino: u64) -> io::Result<Vec<DirEntry>> {
        self.check()?;
        let path = self.tree.path(ino)?;
        let mut out = Vec::new();
        for e in std::fs::read_dir(&path)? {
            let e = e?;
            let dir = e.file_type()?.is_dir();
            let name = e.file_name();
            let child = self.tree.child_or_insert(ino, &name, dir);
            out.push(DirEntry {
                ino: child,
                dir,
                name,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}
