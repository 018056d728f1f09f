//! The page cache and the machine, as the benchmarks need them: warm every replica file of
//! their cluster (read it through the cache) or evict it (`fdatasync`, then
//! `posix_fadvise(DONTNEED)`), check what is resident (`mincore`), and describe the CPU,
//! memory and disk the figures come from.

use serde::Serialize;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Every replica file (`blk_<id>` and its `.meta`) under `dir`.
pub fn replica_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    collect(dir, &mut out);
    out.sort();
    out
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("blk_"))
        {
            out.push(p);
        }
    }
}

/// Reads every file through the page cache, so that the next read finds it there.
pub fn warm(files: &[PathBuf]) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 4 << 20];
    let mut total = 0u64;
    for f in files {
        let mut file = File::open(f)?;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
    }
    Ok(total)
}

/// Drops every file's pages from the page cache: written back first (`fdatasync`), since the
/// kernel keeps dirty pages whatever it is advised.
pub fn evict(files: &[PathBuf]) -> std::io::Result<()> {
    for f in files {
        let file = File::open(f)?;
        file.sync_data()?;
        drop_pages(&file, 0, 0)?;
    }
    Ok(())
}

/// `posix_fadvise(DONTNEED)` over `[offset, offset + len)` of `file` (`len` 0: to the end):
/// clean pages leave the page cache, dirty ones are queued for writeback.
#[allow(unsafe_code)] // posix_fadvise: the benchmarks drop their own files' pages
pub fn drop_pages(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    let (offset, len) = (offset as libc::off_t, len as libc::off_t);
    // SAFETY: the fd is open for the duration of the call; fadvise only reads arguments.
    let rc =
        unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// The fraction of the files' pages that are in the page cache (`mincore` over a read-only
/// mapping of each file); 0 when the files hold no bytes. Verifies "cold" and "warm" rather than
/// assuming them.
pub fn resident_fraction(files: &[PathBuf]) -> std::io::Result<f64> {
    let (mut resident, mut total) = (0u64, 0u64);
    for f in files {
        let file = File::open(f)?;
        let pages = sluice_common::memory::resident_pages(&file, file.metadata()?.len())?;
        resident += pages.iter().filter(|r| **r).count() as u64;
        total += pages.len() as u64;
    }
    Ok(if total == 0 {
        0.0
    } else {
        resident as f64 / total as f64
    })
}

/// What the figures were measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPUs available to this process.
    pub cpus: usize,
    /// The CPU model (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// Total memory in GiB.
    pub memory_gib: f64,
    /// The kernel release.
    pub kernel: String,
    /// The block device holding the benchmark directory.
    pub disk: String,
    /// Whether the kernel says that device is rotational (an HDD); `None` when unknown.
    pub rotational: Option<bool>,
    /// The device's own read-ahead in KiB (`queue/read_ahead_kb`); `None` when unknown.
    pub read_ahead_kb: Option<u64>,
}

impl Machine {
    /// Describes this machine and the disk under `dir`.
    pub fn probe(dir: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let (disk, rotational, read_ahead_kb) = disk_of(dir);
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            memory_gib: mem_kib / (1024.0 * 1024.0),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            disk,
            rotational,
            read_ahead_kb,
        }
    }
}

/// The device name under `dir`, its rotational flag and read-ahead, from `/sys/dev/block`.
fn disk_of(dir: &Path) -> (String, Option<bool>, Option<u64>) {
    let Ok(meta) = std::fs::metadata(dir) else {
        return ("unknown".into(), None, None);
    };
    let dev = meta.dev();
    let sys = PathBuf::from(format!(
        "/sys/dev/block/{}:{}",
        libc::major(dev),
        libc::minor(dev)
    ));
    let Ok(real) = std::fs::canonicalize(&sys) else {
        let name = format!("device {}:{}", libc::major(dev), libc::minor(dev));
        return (name, None, None);
    };
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A partition has no queue of its own: its disk's is one level up.
    let queue = |f: &str| {
        [real.join("queue").join(f), real.join("../queue").join(f)]
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok())
            .map(|s| s.trim().to_string())
    };
    let rotational = queue("rotational").map(|s| s == "1");
    let read_ahead = queue("read_ahead_kb").and_then(|s| s.parse().ok());
    (name, rotational, read_ahead)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn residency_is_about_zero_after_eviction_and_about_one_after_a_read() {
        // A temp dir on a disk-backed file system (tmpfs ignores DONTNEED).
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).expect("temp dir");
        let path = dir.path().join("blk_1");
        let mut f = File::create(&path).expect("create");
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
        f.write_all(&data).expect("write");
        f.sync_all().expect("sync");
        let files = replica_files(dir.path());
        assert_eq!(files, vec![path]);
        evict(&files).expect("evict");
        let cold = resident_fraction(&files).expect("mincore");
        assert!(cold < 0.05, "{cold} resident after eviction");
        assert_eq!(warm(&files).expect("warm"), 1 << 20);
        let warm = resident_fraction(&files).expect("mincore");
        assert!(warm > 0.95, "{warm} resident after a read");
        assert_eq!(resident_fraction(&[]).expect("none"), 0.0);
    }
}
