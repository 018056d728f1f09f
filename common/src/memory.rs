//! Process-wide memory settings of the three binaries.

#![allow(unsafe_code)] // two `prctl` calls with integer arguments; each block says why it is sound

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

#[cfg(test)]
mod tests {
    #[test]
    fn huge_pages_are_off_for_the_process_afterwards() {
        super::disable_transparent_huge_pages();
        // SAFETY: PR_GET_THP_DISABLE takes integer arguments only.
        let got = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(got, 1);
    }
}
