//! The FUSE face of hddfs: a pass-through to the backing directory whose data requests
//! (read, write, fsync) wait for the [`Head`] before they are answered.
//!
//! Inode numbers are the backing file system's (the root is FUSE's 1). Entries and attributes
//! are cached by the kernel for [`TTL`]: nothing but this mount changes the backing directory.
//! Files are opened with `FOPEN_KEEP_CACHE`, so a file's cached pages survive its reopening,
//! and the connection asks for the writeback cache, so buffered writes stay in the kernel's
//! page cache until the kernel writes them back (flusher, fsync, reclaim, unmount) — those
//! write-backs are the write requests the model sees.

use super::disk::Op;
use super::passthrough::Hddfs;
use super::passthrough::{attr, fuse_ino, read_at};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::{DirBuilderExt, DirEntryExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::time::{Duration, Instant, SystemTime};

/// How long the kernel may trust an entry or attributes.
const TTL: Duration = Duration::from_secs(1);

fn entry(reply: ReplyEntry, r: io::Result<FileAttr>) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(Errno::from(e)),
    }
}

/// Answers with the attributes of `ino` from `r`'s metadata, or its error.
fn attr_reply(reply: ReplyAttr, ino: INodeNo, r: io::Result<std::fs::Metadata>) {
    match r {
        Ok(m) => reply.attr(&TTL, &attr(ino.0, &m)),
        Err(e) => reply.error(Errno::from(e)),
    }
}

fn empty(reply: ReplyEmpty, r: io::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(Errno::from(e)),
    }
}

impl Filesystem for Hddfs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Write-backs of up to 1 MiB; read-ahead as large as the kernel allows (it caps it
        // at its own `max_readahead`); a queue as deep as a drive's NCQ (32).
        let _ = config.set_max_write(1 << 20);
        let _ = config
            .set_max_readahead(1 << 20)
            .or_else(|max| config.set_max_readahead(max));
        let _ = config.set_max_background(32);
        let _ = config.set_congestion_threshold(24);
        config
            .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
            .map_err(|_| io::Error::other("the kernel has no FUSE writeback cache"))?;
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.child(parent, name).and_then(|p| self.remember(p));
        entry(reply, r);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        attr_reply(
            reply,
            ino,
            self.path(ino).and_then(std::fs::symlink_metadata),
        );
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = self.path(ino).and_then(|path| {
            if let Some(size) = size {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)?
                    .set_len(size)?;
            }
            if let Some(mode) = mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))?;
            }
            std::fs::symlink_metadata(&path)
        });
        attr_reply(reply, ino, r);
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let r = self.child(parent, name).and_then(|p| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode & !umask & 0o7777)
                .open(&p)?;
            self.remember(p)
        });
        entry(reply, r);
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.child(parent, name).and_then(|p| {
            std::fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(&p)?;
            self.remember(p)
        });
        entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            reply,
            self.child(parent, name).and_then(std::fs::remove_file),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            reply,
            self.child(parent, name).and_then(std::fs::remove_dir),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return reply.error(Errno::EINVAL);
        }
        let r = (|| {
            let from = self.child(parent, name)?;
            let to = self.child(newparent, newname)?;
            if flags.contains(RenameFlags::RENAME_NOREPLACE) && to.symlink_metadata().is_ok() {
                return Err(io::Error::from_raw_os_error(libc::EEXIST));
            }
            std::fs::rename(&from, &to)?;
            // Every known path under the old name moves with it (a directory's children).
            let mut t = self.table();
            for n in t.nodes.values_mut() {
                if let Ok(rest) = n.path.strip_prefix(&from) {
                    n.path = if rest.as_os_str().is_empty() {
                        to.clone()
                    } else {
                        to.join(rest)
                    };
                }
            }
            Ok(())
        })();
        empty(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_backing(ino, flags.0) {
            Ok(fh) => reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let arrived = Instant::now();
        let r = self
            .file(fh)
            .and_then(|f| read_at(&f, offset, size as usize));
        match r {
            Ok(data) => {
                if let (Some(addr), false) = (self.address(ino, offset, false), data.is_empty()) {
                    self.disk.charge(addr, Op::Read, data.len() as u64, arrived);
                }
                reply.data(&data)
            }
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let arrived = Instant::now();
        match self.file(fh).and_then(|f| f.write_all_at(data, offset)) {
            Ok(()) => {
                if let Some(addr) = self.address(ino, offset, true) {
                    self.disk
                        .charge(addr, Op::Write, data.len() as u64, arrived);
                }
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() costs the disk nothing. ENOSYS: the kernel never sends a flush again, so a
        // closing thread never waits on this process (lazyfs answers the same).
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.table().files.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // The backing file is not synced: it stands for the platter, whose time is charged.
        // The kernel sent this file's dirty pages as writes before this fsync; those were
        // charged. Only an fsync with nothing written since the last one costs a turn (the
        // drive's cache flush); otherwise it is free.
        let flush = {
            let mut t = self.table();
            t.nodes.get_mut(&ino.0).and_then(|n| {
                let was = std::mem::replace(&mut n.dirty, false);
                n.charged.then_some((was, n.base.unwrap_or(0)))
            })
        };
        match flush {
            Some((false, base)) => self.disk.charge(base, Op::Flush, 0, Instant::now()),
            Some((true, _)) => self.disk.lock().free_fsync(),
            None => {}
        }
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.path(ino) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let list = (|| {
            let dir = self.path(ino)?;
            let root = self.table().root_ino;
            let mut out = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            for e in std::fs::read_dir(dir)? {
                let e = e?;
                let kind = if e.file_type()?.is_dir() {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                out.push((fuse_ino(root, e.ino()), kind, e.file_name()));
            }
            Ok::<_, io::Error>(out)
        })();
        let list = match list {
            Ok(l) => l,
            Err(e) => return reply.error(Errno::from(e)),
        };
        for (i, (child, kind, name)) in list.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Directory entries are metadata: not modelled (the journal's business).
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let root = self.table().nodes.get(&1).map(|n| n.path.clone());
        let r = root
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
            .and_then(|p| nix::sys::statvfs::statvfs(&p).map_err(io::Error::from));
        match r {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                255,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        // No extended attributes (the kernel asks for security.capability on every write).
        reply.error(Errno::from_i32(libc::ENODATA));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        empty(reply, self.path(ino).map(|_| ()));
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = (|| {
            let p = self.child(parent, name)?;
            let mut o = std::fs::OpenOptions::new();
            o.read(true)
                .write(true)
                .mode(mode & !umask & 0o7777)
                .truncate(flags & libc::O_TRUNC != 0);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            } else {
                o.create(true);
            }
            let f = o.open(&p)?;
            let a = self.remember(p)?;
            Ok::<_, io::Error>((a, self.add_file(f)))
        })();
        match r {
            Ok((a, fh)) => reply.created(&TTL, &a, Generation(0), fh, FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Only plain allocation, which is a size change (the platter space is reserved at
        // creation).
        if mode != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let r = self.file(fh).and_then(|f| {
            let end = offset.saturating_add(length);
            if end > f.metadata()?.len() {
                f.set_len(end)?;
            }
            Ok(())
        });
        empty(reply, r);
    }
}
