//! An hddfs daemon started by a benchmark: its own process (`sluice hddfs`), its mount, its
//! counters, and a clean stop.

use super::Stats;
use anyhow::Context as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `sluice hddfs` serving `backing` at `mountpoint`. Dropping it stops the daemon
/// (it unmounts); a parent that dies closes the daemon's standard input, which stops it too.
#[derive(Debug)]
pub struct Mount {
    child: Option<Child>,
    mountpoint: PathBuf,
    stats: PathBuf,
}

impl Mount {
    /// Where the file system is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Starts `exe hddfs` (the `sluice` binary) over `backing` (created) at `mountpoint`
    /// (which must exist), charging files whose name starts with `charge`, with a read-ahead
    /// window of `read_ahead_kb` (default: the disk's), and waits until the mount is there.
    pub fn start(
        exe: &Path,
        backing: &Path,
        mountpoint: &Path,
        charge: &str,
        read_ahead_kb: Option<u64>,
    ) -> anyhow::Result<Mount> {
        anyhow::ensure!(
            Path::new("/dev/fuse").exists()
                && std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0),
            "hdd-seek needs root and /dev/fuse"
        );
        std::fs::create_dir_all(backing)
            .with_context(|| format!("creating {}", backing.display()))?;
        let stats = backing.with_extension("stats.json");
        let child = Command::new(exe)
            .arg("hddfs")
            .arg("--backing")
            .arg(backing)
            .arg("--mount")
            .arg(mountpoint)
            .arg("--stats")
            .arg(&stats)
            .arg("--charge")
            .arg(charge)
            .args(read_ahead_kb.map(|kb| format!("--read-ahead-kb={kb}")))
            .stdin(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {} hddfs", exe.display()))?;
        let mut m = Mount {
            child: Some(child),
            mountpoint: mountpoint.to_path_buf(),
            stats,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        // Mounted, and with the read-ahead asked for, which the daemon sets right after.
        let ready = |p: &Path| {
            is_mount(p)
                && read_ahead_kb.is_none_or(|kb| super::read_ahead(p).ok() == Some(kb * 1024))
        };
        while !ready(mountpoint) {
            if let Some(c) = m.child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    anyhow::bail!("sluice hddfs exited before mounting: {status}");
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "hddfs did not mount {} in 10 s",
                mountpoint.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }

    /// The counters the daemon last wrote (zero before its first write).
    pub fn stats(&self) -> Stats {
        std::fs::read_to_string(&self.stats)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or_default()
    }

    /// Stops the daemon (it unmounts) and returns its final counters.
    pub fn stop(mut self) -> anyhow::Result<Stats> {
        self.shut()?;
        Ok(self.stats())
    }

    fn shut(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        drop(child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break Some(s);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        detach(&self.mountpoint);
        anyhow::ensure!(
            status.is_some_and(|s| s.success()),
            "sluice hddfs did not stop cleanly ({status:?})"
        );
        Ok(())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.shut() {
            eprintln!("hddfs: {e:#}");
        }
    }
}

/// Detaches the mount at `p` if there is one (as root: the kernel drops it once unused).
pub fn detach(p: &Path) {
    if is_mount(p) {
        let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// True if `p` is on another device than its parent (a mount point), or answers ENOTCONN
/// (an aborted FUSE mount is still a mount).
pub fn is_mount(p: &Path) -> bool {
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev());
    match (dev(p), p.parent().map(dev)) {
        (Ok(a), Some(Ok(b))) => a != b,
        (Err(e), _) => e.raw_os_error() == Some(libc::ENOTCONN),
        _ => false,
    }
}

/// Waits (up to 10 s) until `p` is (or is no longer) a mount.
pub fn wait_mounted(p: &Path, mounted: bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_mount(p) != mounted {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} still {} after 10 s",
            p.display(),
            if mounted { "not mounted" } else { "mounted" }
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
