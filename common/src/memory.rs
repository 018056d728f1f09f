//! Process-wide memory settings of the three binaries, and which pages of a file are in the
//! page cache.

#![allow(unsafe_code)] // `prctl` with integer arguments, `mmap`/`mincore`; each block says why

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
    use std::os::fd::AsRawFd;
    let len = usize::try_from(len).map_err(|_| std::io::Error::other("file too large to map"))?;
    if len == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: sysconf only reads its argument.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = usize::try_from(page)
        .ok()
        .filter(|p| *p > 0)
        .unwrap_or(4096);
    // SAFETY: a fresh shared read-only mapping of an open file; its memory is never
    // dereferenced, only passed to mincore, and it is unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `addr` is page-aligned (mmap), maps `len` bytes, and `vec` has one byte per page.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: unmaps exactly the mapping made above, once.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(err);
    }
    Ok(vec.iter().map(|b| b & 1 == 1).collect())
}

#[cfg(test)]
mod tests {
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
