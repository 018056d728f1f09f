//! Process-wide memory settings of the three binaries, which pages of a file are in the page
//! cache, and read-only file mappings sent with `send(2)` ([`FileMap`]).

#![allow(unsafe_code)] // `prctl` with integer arguments, `mmap`/`mincore`/`send`; each block says why

/// Turns transparent huge pages off for this process (`prctl(PR_SET_THP_DISABLE)`: later
/// faults map 4 KiB pages, whatever `madvise(MADV_HUGEPAGE)` mimalloc gives its arenas).
///
/// mimalloc returns idle memory to the kernel after a few milliseconds and faults it in again
/// when a burst of writes needs it; with huge pages each such fault zeroes 2 MiB however
/// little of it is used. In `bench write`'s 32 × 8 MiB experiment that zeroing was 27.6 % of
/// the samples, and with huge pages off the experiment ran 1.45× faster at 0.55× the CPU
/// (docs/benchmarks.md, "Seventh round"). Hadoop's own deployment guides say the same of
/// HDFS DataNodes. Errors are ignored: a kernel without the call keeps its defaults.
pub fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and touches no memory of ours.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// Which pages of `[0, len)` of `file` are in the page cache, one entry per page (`mincore`
/// over a read-only mapping that is never read). For benchmarks and tests that check "warm"
/// and "cold" rather than assume them.
pub fn resident_pages(file: &std::fs::File, len: u64) -> std::io::Result<Vec<bool>> {
    let len = usize::try_from(len).map_err(|_| std::io::Error::other("file too large to map"))?;
    if len == 0 {
        return Ok(Vec::new());
    }
    let map = FileMap::new(file, 0, len)?;
    let mut vec = vec![0u8; map.len.div_ceil(page_size() as usize)];
    // SAFETY: the mapping is page-aligned and `map.len` bytes long, and `vec` has one byte
    // per page of it; mincore only writes into `vec`.
    let rc = unsafe { libc::mincore(map.addr.as_ptr(), map.len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(vec.iter().map(|b| b & 1 == 1).collect())
}

/// A read-only shared mapping of part of a file that user space never reads: its bytes reach
/// a socket through [`FileMap::send`], so the only copy is the socket's own (a DataNode's
/// cached piece needs no `pread` into a buffer first), and the receiver gets ordinary socket
/// buffers (with `sendfile` it gets the page-cache pages themselves, dearer to copy out of on
/// the same host). The DataNode sends cached stream pieces with it; `sluice bench read` sends
/// the replica files' bytes with it in its loopback copy of the file's bytes.
///
/// Why this is safe where a mapping usually is not: a file truncated under a mapping, or a
/// page the disk fails to read, raises `SIGBUS` only for an access from user space. Here the
/// kernel alone touches the mapping, inside `send(2)`, and a fault it cannot resolve there
/// fails the call with `EFAULT` (the test `a_mapping_of_a_truncated_file_fails_the_send`).
/// Callers send only ranges they found in the page cache, as for `sendfile`: a page evicted
/// since would be read from the disk inside the call.
#[derive(Debug)]
pub struct FileMap {
    addr: std::ptr::NonNull<libc::c_void>,
    /// Bytes mapped.
    len: usize,
    /// File offset of `addr` (a page boundary).
    start: u64,
}

// SAFETY: the mapping is read-only and never dereferenced by this process: sharing the
// address between threads shares nothing user space reads.
unsafe impl Send for FileMap {}
// SAFETY: as for `Send`.
unsafe impl Sync for FileMap {}

impl FileMap {
    /// Maps `[off, off + len)` of `file` (from the page boundary at or below `off`), read-only.
    pub fn new(file: &std::fs::File, off: u64, len: usize) -> std::io::Result<FileMap> {
        let page = page_size();
        let start = off / page * page;
        let len = usize::try_from(off - start)
            .ok()
            .and_then(|head| head.checked_add(len))
            .filter(|&l| l > 0)
            .ok_or_else(|| std::io::Error::other(format!("cannot map {len} bytes at {off}")))?;
        let at = libc::off_t::try_from(start).map_err(std::io::Error::other)?;
        // SAFETY: a new read-only shared mapping of a valid fd at a page-aligned offset; the
        // kernel picks the address. The file may be closed after: the mapping keeps its own
        // reference.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(file),
                at,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let addr = std::ptr::NonNull::new(addr)
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(FileMap { addr, len, start })
    }

    /// True if `[off, off + len)` of the file lies within the mapping.
    pub fn covers(&self, off: u64, len: usize) -> bool {
        off >= self.start && off + len as u64 <= self.start + self.len as u64
    }

    /// `send(2)` of up to `len` bytes at file offset `off` (within the mapping) to the socket
    /// `sock`: the bytes sent; on a non-blocking socket `WouldBlock` when it is full (a
    /// blocking one waits); `EFAULT` when the file no longer holds them.
    pub fn send(&self, sock: std::os::fd::RawFd, off: u64, len: usize) -> std::io::Result<usize> {
        if !self.covers(off, len) {
            return Err(std::io::Error::other(format!(
                "{len} bytes at {off} are outside the mapping of {} bytes at {}",
                self.len, self.start
            )));
        }
        let at = (off - self.start) as usize;
        // SAFETY: `[at, at + len)` lies within the live mapping (checked above); only the
        // kernel reads it, and a fault there fails the call instead of raising a signal.
        // MSG_NOSIGNAL: a closed peer is an EPIPE, not a SIGPIPE. Blocking or not is the
        // socket's own mode (the DataNode's sockets are non-blocking).
        let n = unsafe {
            libc::send(
                sock,
                self.addr.as_ptr().cast::<u8>().add(at).cast(),
                len,
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: unmapping this mapping, once; nothing holds a pointer into it.
        unsafe { libc::munmap(self.addr.as_ptr(), self.len) };
    }
}

/// The size of a memory page.
fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::FileMap;
    use std::io::Write;

    /// A connected pair of loopback sockets (the sender non-blocking) for the mapping tests.
    fn socket_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        tx.set_nonblocking(true).unwrap();
        (tx, rx)
    }

    #[test]
    fn a_mapping_sends_the_file_bytes_it_covers() {
        use std::io::Read;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        // From an offset that is not a page boundary: the mapping starts at the page below.
        let map = FileMap::new(f.as_file(), 5000, 20_000).unwrap();
        assert!(map.covers(4096, 20_904) && !map.covers(4095, 10) && !map.covers(5000, 20_001));
        let (tx, mut rx) = socket_pair();
        assert_eq!(
            map.send(std::os::fd::AsRawFd::as_raw_fd(&tx), 5000, 20_000)
                .unwrap(),
            20_000
        );
        assert!(
            map.send(std::os::fd::AsRawFd::as_raw_fd(&tx), 24_000, 2000)
                .is_err(),
            "outside the mapping"
        );
        let mut got = vec![0u8; 20_000];
        rx.read_exact(&mut got).unwrap();
        assert_eq!(got, data[5000..25_000]);
    }

    #[test]
    fn a_mapping_of_a_truncated_file_fails_the_send() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; 256 * 1024]).unwrap();
        let map = FileMap::new(f.as_file(), 0, 256 * 1024).unwrap();
        f.as_file().set_len(4096).unwrap();
        let (tx, _rx) = socket_pair();
        // Bytes past the new end: the kernel's fault fails the call (this process would
        // have died of SIGBUS had user space read them).
        let e = map
            .send(std::os::fd::AsRawFd::as_raw_fd(&tx), 64 * 1024, 64 * 1024)
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        assert_eq!(
            map.send(std::os::fd::AsRawFd::as_raw_fd(&tx), 0, 4096)
                .unwrap(),
            4096,
            "what is left"
        );
    }

    #[test]
    fn huge_pages_are_off_for_the_process_afterwards() {
        super::disable_transparent_huge_pages();
        // SAFETY: PR_GET_THP_DISABLE takes integer arguments only.
        let got = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(got, 1);
    }

    #[test]
    fn a_file_just_read_is_resident_and_an_empty_one_has_no_pages() {
        use std::io::Write;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![1u8; 3 * 4096 + 1]).unwrap();
        std::fs::read(f.path()).unwrap();
        let pages = super::resident_pages(f.as_file(), 3 * 4096 + 1).unwrap();
        assert_eq!(pages, vec![true; 4]);
        assert!(super::resident_pages(f.as_file(), 0).unwrap().is_empty());
    }
}
