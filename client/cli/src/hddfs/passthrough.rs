//! The pass-through half of hddfs: which backing path each inode number stands for, where
//! each file lies on the platter, and the open backing files.
//!
//! Inode numbers are the backing file system's (the root is FUSE's 1).

use super::disk::{Disk, Layout};
use fuser::{FileAttr, FileHandle, FileType, INodeNo};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

/// A backing inode the kernel knows.
#[derive(Debug)]
pub(super) struct Node {
    pub(super) path: PathBuf,
    /// The file's first byte on the platter (regular files).
    pub(super) base: Option<u64>,
    /// Whether its requests are charged (its name has the charged prefix).
    pub(super) charged: bool,
    /// Written since its last fsync.
    pub(super) dirty: bool,
}

#[derive(Debug)]
pub(super) struct Table {
    pub(super) root_ino: u64,
    pub(super) nodes: HashMap<u64, Node>,
    pub(super) files: HashMap<u64, Arc<File>>,
    pub(super) next_fh: u64,
    pub(super) layout: Layout,
}

/// The [`Filesystem`] of one mount.
pub struct Hddfs {
    table: Mutex<Table>,
    pub(super) disk: Arc<Disk>,
    prefix: String,
}

impl Hddfs {
    /// A pass-through to `backing` charging `disk` for files whose name starts with `prefix`
    /// (every file if it is empty).
    pub fn new(backing: &Path, disk: Arc<Disk>, prefix: String, capacity: u64) -> io::Result<Self> {
        let meta = std::fs::metadata(backing)?;
        let mut nodes = HashMap::new();
        nodes.insert(
            1,
            Node {
                path: backing.to_path_buf(),
                base: None,
                charged: false,
                dirty: false,
            },
        );
        let table = Table {
            root_ino: meta.ino(),
            nodes,
            files: HashMap::new(),
            next_fh: 1,
            layout: Layout::new(capacity),
        };
        Ok(Hddfs {
            table: Mutex::new(table),
            disk,
            prefix,
        })
    }

    pub(super) fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The backing path of `ino`.
    pub(super) fn path(&self, ino: INodeNo) -> io::Result<PathBuf> {
        let t = self.table();
        t.nodes
            .get(&ino.0)
            .map(|n| n.path.clone())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    /// Stats `path` (the entry `name`) and remembers it; its attributes.
    pub(super) fn remember(&self, path: PathBuf) -> io::Result<FileAttr> {
        let meta = std::fs::symlink_metadata(&path)?;
        let mut t = self.table();
        let ino = fuse_ino(t.root_ino, meta.ino());
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let charged = name.is_some_and(|n| n.starts_with(&self.prefix));
        if let Some(n) = t.nodes.get_mut(&ino) {
            n.path = path;
        } else {
            let base = meta.is_file().then(|| t.layout.place(meta.len()));
            t.nodes.insert(
                ino,
                Node {
                    path,
                    base,
                    charged,
                    dirty: false,
                },
            );
        }
        Ok(attr(ino, &meta))
    }

    pub(super) fn child(&self, parent: INodeNo, name: &OsStr) -> io::Result<PathBuf> {
        Ok(self.path(parent)?.join(name))
    }

    pub(super) fn file(&self, fh: FileHandle) -> io::Result<Arc<File>> {
        self.table()
            .files
            .get(&fh.0)
            .cloned()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    pub(super) fn add_file(&self, f: File) -> FileHandle {
        let mut t = self.table();
        let fh = t.next_fh;
        t.next_fh += 1;
        t.files.insert(fh, Arc::new(f));
        FileHandle(fh)
    }

    /// The platter address of byte `offset` of `ino`, if its requests are charged; marks it
    /// written when `write`.
    pub(super) fn address(&self, ino: INodeNo, offset: u64, write: bool) -> Option<u64> {
        let mut t = self.table();
        let n = t.nodes.get_mut(&ino.0)?;
        if write {
            n.dirty = true;
        }
        n.charged.then_some(n.base?.saturating_add(offset))
    }

    pub(super) fn open_backing(&self, ino: INodeNo, flags: i32) -> io::Result<FileHandle> {
        let path = self.path(ino)?;
        // The kernel reads pages around partial writes with the writeback cache, so a
        // write-only open is opened for reading too; O_APPEND is the kernel's business then.
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(flags & libc::O_NOFOLLOW)
            .open(path)?;
        Ok(self.add_file(f))
    }
}

pub(super) fn fuse_ino(root: u64, ino: u64) -> u64 {
    if ino == root {
        1
    } else {
        ino
    }
}

pub(super) fn attr(ino: u64, meta: &std::fs::Metadata) -> FileAttr {
    let time = |s: i64, ns: i64| {
        UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32)
    };
    FileAttr {
        ino: INodeNo(ino),
        size: meta.len(),
        blocks: meta.blocks(),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        crtime: time(meta.ctime(), meta.ctime_nsec()),
        kind: if meta.is_dir() {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: (meta.mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// Reads up to `len` bytes at `offset` (fewer only at the end of the file).
pub(super) fn read_at(f: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; len];
    let mut done = 0;
    while done < len {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf)
}
