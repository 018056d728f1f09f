//! Every OS call of the DataNode below `std`, each in one function, and the only module with
//! `unsafe` code (the crate denies `unsafe_code` everywhere else): the directory fsync that
//! makes entries created, renamed or removed in a directory durable, `pwrite` of a whole
//! buffer, opening a block file with `O_DIRECT` and the buffers aligned for it,
//! `posix_fadvise`, `statvfs` and the host name. (Read-only block-file mappings sent with
//! `send(2)` are `sluice_common::memory::FileMap`, shared with the benchmarks.)
#![allow(unsafe_code)] // the one place for it; each block says why it is sound

use crate::error::{DatanodeError, IoContext, Result};
use crate::storage::volume::Space;
use std::alloc::Layout;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::Path;
use std::ptr::NonNull;

/// Alignment of buffer addresses, file offsets and lengths of O_DIRECT writes.
pub const DIRECT_IO_ALIGN: usize = 4096;

/// fsyncs directory `dir`, so that the entries created, renamed or removed in it survive a
/// power cut (the files' own data needs their own fsync).
pub fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(test)]
    record::push(dir);
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx("fsync directory", dir)
}

/// `pwrite`s all of `buf` at `pos`, retrying short writes and `EINTR`; `each_call` runs
/// before every call (the write counters).
pub(crate) fn write_all_at(
    file: &File,
    mut buf: &[u8],
    mut pos: u64,
    mut each_call: impl FnMut(),
) -> std::io::Result<()> {
    while !buf.is_empty() {
        each_call();
        match file.write_at(buf, pos) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                pos += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a block file is opened with O_DIRECT for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DirectFor {
    /// A buffered replica's flushes (`write.o.direct.enabled`).
    Write,
    /// A stream's pieces not in the page cache (`read.o.direct.enabled`).
    Read,
}

/// Opens `path` with O_DIRECT; `None` where the file system refuses O_DIRECT, and the caller
/// goes through the page cache (a flush with a warning, once per replica; a read quietly,
/// once per stream).
pub(crate) fn open_direct(path: &Path, what: DirectFor) -> Result<Option<File>> {
    let mut opts = File::options();
    match what {
        DirectFor::Write => opts.write(true),
        DirectFor::Read => opts.read(true),
    };
    match opts.custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if refuses_direct_io(&e) => {
            match what {
                DirectFor::Write => {
                    tracing::warn!(path = %path.display(), "the file system refuses O_DIRECT: flushing through the page cache")
                }
                DirectFor::Read => {
                    tracing::debug!(path = %path.display(), "the file system refuses O_DIRECT: reading through the page cache")
                }
            }
            Ok(None)
        }
        Err(e) => Err(DatanodeError::io("open (O_DIRECT)", path, e)),
    }
}

/// Reads at least `want` bytes of `file` (opened with O_DIRECT) at `pos` into `buf`, whose
/// address, length and `pos` are multiples of [`DIRECT_IO_ALIGN`]; returns the bytes read,
/// fewer than `want` only where the file ends. Each call reads whole aligned blocks; a
/// shorter one is the end of the file.
pub(crate) fn read_direct_at(
    file: &File,
    buf: &mut [u8],
    pos: u64,
    want: usize,
) -> std::io::Result<usize> {
    let mut done = 0;
    while done < want {
        match file.read_at(&mut buf[done..], pos + done as u64) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                if n % DIRECT_IO_ALIGN != 0 {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// True when `e` is the file system refusing O_DIRECT (`EINVAL`).
pub(crate) fn refuses_direct_io(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

/// What `posix_fadvise` tells the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Advice {
    /// `POSIX_FADV_WILLNEED`: read these pages ahead.
    WillNeed,
    /// `POSIX_FADV_DONTNEED`: drop these pages from the cache.
    DontNeed,
    /// `POSIX_FADV_RANDOM`: no read-ahead by the kernel on this open file (the range is
    /// ignored: it applies to the whole open file description).
    Random,
}

/// `posix_fadvise` over `[off, off + len)` (`len` 0: to the end). A hint: failures are
/// logged at debug and ignored.
pub(crate) fn fadvise(file: &File, off: u64, len: u64, advice: Advice) {
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
        return;
    };
    let advice_flag = match advice {
        Advice::WillNeed => libc::POSIX_FADV_WILLNEED,
        Advice::DontNeed => libc::POSIX_FADV_DONTNEED,
        Advice::Random => libc::POSIX_FADV_RANDOM,
    };
    // SAFETY: the fd is valid for the life of `file`; fadvise only reads its arguments.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), off, len, advice_flag) };
    if rc != 0 {
        tracing::debug!(rc, ?advice, "posix_fadvise failed (ignored)");
    }
}

/// Fills `buf` from `file` at `pos` only from the page cache (`preadv2(RWF_NOWAIT)`): `true`
/// when every byte was there, `false` when the read would have waited for the disk (or the
/// file ended, or the file system does not take the flag) — the caller then reads the
/// ordinary, blocking way, which names any real error. Never blocks on the disk, so it may
/// run on a runtime thread.
pub(crate) fn pread_cached(file: &File, buf: &mut [u8], pos: u64) -> bool {
    let mut done = 0usize;
    while done < buf.len() {
        let Ok(at) = libc::off_t::try_from(pos + done as u64) else {
            return false;
        };
        let rest = &mut buf[done..];
        let iov = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        // SAFETY: the fd is valid for the life of `file`; the iovec points into `rest`, which
        // is borrowed mutably for the call and holds `iov_len` bytes.
        let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) };
        match n {
            n if n > 0 => done += n as usize,
            0 => return false,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => return false,
        }
    }
    true
}

/// `cachestat(2)` (Linux 6.5): how many pages of `[off, off + len)` of `file` are in the page
/// cache, and how many pages the range spans; `None` when the kernel does not have the call
/// (the caller then does without it).
pub(crate) fn cached_pages(file: &File, off: u64, len: u64) -> Option<(u64, u64)> {
    /// The call's number, the same on every architecture (new calls share one table).
    const SYS_CACHESTAT: libc::c_long = 451;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    if len == 0 {
        return Some((0, 0));
    }
    let range = Range { off, len };
    let mut stat = Stat::default();
    // SAFETY: the fd is valid for the life of `file`; both structs are #[repr(C)] as the
    // kernel's `cachestat_range` and `cachestat`, live for the call; flags must be 0.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0,
        )
    };
    if rc != 0 {
        return None;
    }
    let pages = (off + len).div_ceil(4096) - off / 4096;
    Some((stat.nr_cache, pages))
}

/// `sendfile(2)`: up to `len` bytes of `file` at `*off` to the socket `sock`, advancing
/// `*off`; the bytes sent (0 at the end of the file). The socket is non-blocking, so
/// `WouldBlock` when it is full; the file is read from the page cache, so callers make sure
/// the range is cached ([`cached_pages`]) before calling it on a runtime thread.
pub(crate) fn sendfile(
    sock: RawFd,
    file: &File,
    off: &mut u64,
    len: usize,
) -> std::io::Result<usize> {
    let mut at = libc::off_t::try_from(*off).map_err(std::io::Error::other)?;
    // SAFETY: both fds are valid for the call (the socket's owner holds it across the call);
    // `at` is a live off_t the kernel updates.
    let n = unsafe { libc::sendfile(sock, file.as_raw_fd(), &mut at, len) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    *off = at as u64;
    Ok(n as usize)
}

/// Space of the file system holding `path` (`statvfs`).
pub(crate) fn statvfs(path: &Path) -> Result<Space> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| DatanodeError::invalid(format!("path {} holds a NUL", path.display())))?;
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized, writable struct;
    // statvfs only writes into `st`.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(DatanodeError::io(
            "statvfs",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    let frsize = st.f_frsize as u64;
    Ok(Space {
        capacity: (st.f_blocks as u64).saturating_mul(frsize),
        remaining: (st.f_bavail as u64).saturating_mul(frsize),
    })
}

/// This machine's host name (`gethostname`), `None` when it is unset or unreadable.
pub(crate) fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length, which is what we pass.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

/// A heap buffer whose start is aligned to [`DIRECT_IO_ALIGN`], zeroed at allocation.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its allocation exclusively; nothing else points into it.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// `len` zeroed bytes (`None` if `len` is 0 or the allocation fails).
    pub fn zeroed(len: usize) -> Option<AlignedBuf> {
        let layout = Layout::from_size_align(len, DIRECT_IO_ALIGN).ok()?;
        if len == 0 {
            return None;
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(ptr).map(|ptr| AlignedBuf { ptr, len })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised (zeroed) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a buffer is never empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Ok(layout) = Layout::from_size_align(self.len, DIRECT_IO_ALIGN) {
            // SAFETY: allocated in `zeroed` with this very layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Test seam: the directories fsynced by this thread, in order, so unit tests can check that
/// a change syncs the directories it must (and fail when a sync is removed).
#[cfg(test)]
pub(crate) mod record {
    use std::cell::RefCell;
    use std::path::{Path, PathBuf};

    thread_local! {
        static SYNCED: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn push(dir: &Path) {
        SYNCED.with(|s| s.borrow_mut().push(dir.to_path_buf()));
    }

    /// The directories fsynced by this thread since the last call.
    pub(crate) fn take() -> Vec<PathBuf> {
        SYNCED.with(|s| std::mem::take(&mut *s.borrow_mut()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_cached_read_fills_the_buffer_or_says_it_would_wait() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let file = f.as_file();
        let mut buf = vec![0u8; 8192];
        assert!(pread_cached(file, &mut buf, 4096), "just written: cached");
        assert_eq!(buf, data[4096..4096 + 8192]);
        let mut past = vec![0u8; 8192];
        assert!(
            !pread_cached(file, &mut past, 60 * 1024),
            "a read past the end is left to the blocking read, which names the error"
        );
        file.sync_data().unwrap();
        fadvise(file, 0, 0, Advice::DontNeed);
        let resident = sluice_common::memory::resident_pages(file, data.len() as u64).unwrap();
        if resident.iter().all(|r| !r) {
            // Where the file system drops pages (not tmpfs), nothing is read from the disk.
            assert!(!pread_cached(file, &mut buf, 4096), "evicted: would wait");
        }
    }
}
