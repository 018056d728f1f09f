//! The FUSE face of a lazyfs mount: each kernel request becomes one [`State`] call.
//!
//! Entry and attribute timeouts are zero, so the kernel asks again for every path walk and
//! `stat`, and no kernel cache outlives a crash. Files are opened without `FOPEN_KEEP_CACHE`,
//! so the kernel drops a file's cached pages at every open.

use super::state::State;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const TTL: Duration = Duration::ZERO;

/// The [`Filesystem`] serving one mount.
pub(super) struct LazyFuse {
    pub(super) state: Arc<Mutex<State>>,
}

impl LazyFuse {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn attr(ino: u64, meta: &std::fs::Metadata, size: u64) -> FileAttr {
    let time = |s: i64, ns: i64| {
        UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32)
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
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

fn stat(st: &mut State, ino: u64) -> io::Result<FileAttr> {
    let (meta, size) = st.stat(ino)?;
    Ok(attr(ino, &meta, size))
}

fn entry(reply: ReplyEntry, r: io::Result<FileAttr>) {
    match r {
        Ok(a) => reply.entry(&TTL, &a, Generation(0)),
        Err(e) => reply.error(Errno::from(e)),
    }
}

fn empty(reply: ReplyEmpty, r: io::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(Errno::from(e)),
    }
}

impl Filesystem for LazyFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Larger writes, fewer round trips; the kernel keeps its own limit if it is lower.
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.state();
        let r = st.lookup(parent.0, name).and_then(|ino| stat(&mut st, ino));
        entry(reply, r);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match stat(&mut self.state(), ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(Errno::from(e)),
        }
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
        let mut st = self.state();
        let r = (|| {
            if let Some(size) = size {
                st.truncate(ino.0, size)?;
            }
            if let Some(mode) = mode {
                let path = st.tree.path(ino.0)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777))?;
            }
            stat(&mut st, ino.0)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(Errno::from(e)),
        }
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
        let mut st = self.state();
        let r = st
            .create(parent.0, name, mode & !umask & 0o7777, true)
            .and_then(|ino| stat(&mut st, ino));
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
        let mut st = self.state();
        let r = st
            .mkdir(parent.0, name, mode & !umask & 0o7777)
            .and_then(|ino| stat(&mut st, ino));
        entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.state().remove(parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.state().remove(parent.0, name, true));
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
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let r = self
            .state()
            .rename((parent.0, name), (newparent.0, newname), noreplace);
        empty(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().open(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
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
        let mut st = self.state();
        let r = st
            .handle(fh.0, ino.0)
            .and_then(|()| st.read(ino.0, offset, u64::from(size)));
        match r {
            Ok(data) => reply.data(&data),
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
        let mut st = self.state();
        let r = st
            .handle(fh.0, ino.0)
            .and_then(|()| st.write(ino.0, offset, data));
        match r {
            Ok(()) => reply.written(data.len() as u32),
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
        // close() makes nothing durable. ENOSYS tells the kernel never to send a flush again:
        // a test process killed while its files on the mount are open would otherwise hang
        // for ever at exit, its closing thread waiting for a flush answer from its own dead
        // FUSE thread (and the mount would never be cleaned up).
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
        self.state().release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state();
        let r = st.handle(fh.0, ino.0).and_then(|()| st.fsync(ino.0));
        empty(reply, r);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.state().open(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut st = self.state();
        let list = match st.handle(fh.0, ino.0).and_then(|()| st.list(ino.0)) {
            Ok(l) => l,
            Err(e) => return reply.error(Errno::from(e)),
        };
        let dots = [
            (ino.0, true, OsStr::new(".")),
            (ino.0, true, OsStr::new("..")),
        ];
        let all = dots
            .into_iter()
            .chain(list.iter().map(|e| (e.ino, e.dir, e.name.as_os_str())));
        for (i, (child, dir, name)) in all.enumerate().skip(offset as usize) {
            let kind = if dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            if reply.add(INodeNo(child), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.state().release(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state();
        let r = st.handle(fh.0, ino.0).and_then(|()| st.fsync_dir(ino.0));
        empty(reply, r);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let st = self.state();
        let r = st
            .check()
            .and_then(|()| nix::sys::statvfs::statvfs(st.root()).map_err(io::Error::from));
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
        empty(reply, self.state().stat(ino.0).map(|_| ()));
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
        let mut st = self.state();
        let excl = flags & libc::O_EXCL != 0;
        let r = st
            .create(parent.0, name, mode & !umask & 0o7777, excl)
            .and_then(|ino| {
                if flags & libc::O_TRUNC != 0 {
                    st.truncate(ino, 0)?;
                }
                let fh = st.open(ino)?;
                Ok((stat(&mut st, ino)?, fh))
            });
        match r {
            Ok((a, fh)) => {
                reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::empty())
            }
            Err(e) => reply.error(Errno::from(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Only plain allocation, which is a size change: recorded like a truncate.
        if mode != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let mut st = self.state();
        let r = st.handle(fh.0, ino.0).and_then(|()| {
            let (_, size) = st.stat(ino.0)?;
            let end = offset.saturating_add(length);
            if end > size {
                st.truncate(ino.0, end)?;
            }
            Ok(())
        });
        empty(reply, r);
    }
}
