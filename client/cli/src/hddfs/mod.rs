//! `sluice hddfs` (hidden): a FUSE pass-through that charges a 7,200 rpm disk's time — the
//! disk model of `--disk-profile hdd-seek` (docs/benchmarks.md, "Seek profile").
//!
//! It serves a backing directory at a mount point and answers each data request only after
//! the time a disk would take for it:
//!
//! - **What reaches it is what the kernel really sends.** The mount uses the kernel's FUSE
//!   writeback cache: buffered writes land in the page cache, and the model sees the writes
//!   the kernel writes back (flusher threads, fsync, memory-pressure reclaim, O_DIRECT), in
//!   the sizes and order the kernel chooses (up to 1 MiB, `max_write`); reads are page-cache
//!   misses and read-ahead (`max_readahead` as large as the kernel allows); cached pages
//!   survive reopening (`FOPEN_KEEP_CACHE`).
//! - **Where bytes are** ([`disk::Layout`]): each file's bytes lie contiguously from a base
//!   address given when the mount first sees it, files one after another in that order, each
//!   reserving max(size, 136 MiB), on a 1 TB platter.
//! - **One head, one request at a time** ([`disk::Head`]): service = seek (1 ms track to
//!   track + 15 ms × √(distance / capacity)) + 4.17 ms half a turn + transfer at 150 MB/s;
//!   a request continuing forward within one track (1.25 MB) costs only the turn over the gap
//!   and its transfer. Waiting requests are served in C-LOOK order (a drive's NCQ and the
//!   I/O scheduler, which FUSE requests bypass); reads and writes share the head. An fsync
//!   costs nothing when its file was written since its last one (those writes were charged),
//!   else half a turn.
//! - **Not modelled:** metadata (lookups, creates, renames, directories: the journal), files
//!   whose name lacks the charged prefix (`--charge`, the bench charges `blk_` replica and
//!   checksum files only: the metadata service would have disks of its own), zones (one rate
//!   for the whole platter), the drive's write cache, and the backing directory's own costs
//!   (it is never synced; it stands for the platter).
//!
//! - **The FUSE path's own limits:** the mount's read-ahead window is set to that of the disk
//!   holding the backing directory (FUSE's `init` can only lower the kernel's default); the
//!   kernel gives a FUSE mount a writeback device with `strict_limit` and `max_ratio` 1 %, so
//!   its dirty pages are capped far lower (~48 MB on a 23 GiB machine) than ext4's on a real
//!   disk. Left as the kernel sets it: it applies to both sides of a comparison alike.
//!
//! The daemon runs as its own process, so the page cache of the backing files and its CPU
//! are not the benchmark's. It writes its counters ([`Stats`]) as JSON to `--stats` twice a
//! second and at exit, and stops — unmounting — when its standard input closes (its parent
//! died or let it go) or on SIGTERM/SIGINT. The mount is made through `fusermount3` with
//! `auto_unmount`, so a killed daemon leaves no mount behind.

pub mod disk;
mod fs;
pub mod mount;
mod passthrough;

pub use disk::Stats;
pub use mount::Mount;

use anyhow::Context as _;
use clap::Args;
use disk::{Geometry, Head};
use fuser::{Config, MountOption, SessionACL};

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// `sluice hddfs`: serve `--backing` at `--mount` as a seeking disk.
#[derive(Debug, Clone, Args)]
pub struct HddfsArgs {
    /// The directory whose files are served (it stands for the platter).
    #[arg(long)]
    pub backing: PathBuf,
    /// Where to mount it (an existing directory).
    #[arg(long)]
    pub mount: PathBuf,
    /// A file the counters are written to as JSON, twice a second and at exit.
    #[arg(long)]
    pub stats: Option<PathBuf>,
    /// Charge only files whose name starts with this (all files when empty).
    #[arg(long, default_value = "")]
    pub charge: String,
    /// FUSE threads: requests the model can hold at once (a drive's queue is 32 deep).
    #[arg(long, default_value_t = 32)]
    pub threads: usize,
    /// The mount's read-ahead window in KiB (default: the read-ahead of the disk holding
    /// --backing).
    #[arg(long)]
    pub read_ahead_kb: Option<u64>,
}

/// Runs the daemon until its standard input closes or it is told to stop.
pub fn run(args: &HddfsArgs) -> anyhow::Result<ExitCode> {
    let (session, disk) = serve(
        &args.backing,
        &args.mount,
        &args.charge,
        args.threads,
        args.read_ahead_kb,
    )?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = args
        .stats
        .clone()
        .map(|path| {
            let (disk, stop) = (disk.clone(), stop.clone());
            std::thread::Builder::new()
                .name("hddfs-stats".into())
                .spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        write_stats(&path, &disk);
                        std::thread::sleep(Duration::from_millis(500));
                    }
                })
        })
        .transpose()?;
    wait_for_stop()?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(w) = writer {
        let _ = w.join();
    }
    drop(session);
    mount::detach(&args.mount);
    if let Some(path) = &args.stats {
        write_stats(path, &disk);
    }
    Ok(ExitCode::SUCCESS)
}

/// Mounts `backing` at `mountpoint` served by threads of this process, charging files whose
/// name starts with `charge`, with a read-ahead window of `read_ahead_kb` (default: the
/// disk's); the session (dropping it unmounts) and the disk.
pub fn serve(
    backing: &Path,
    mountpoint: &Path,
    charge: &str,
    threads: usize,
    read_ahead_kb: Option<u64>,
) -> anyhow::Result<(fuser::BackgroundSession, Arc<disk::Disk>)> {
    anyhow::ensure!(
        Path::new("/dev/fuse").exists(),
        "hddfs needs /dev/fuse (and root, and fusermount3 from Debian fuse3)"
    );
    let geometry = Geometry::default();
    let disk = Arc::new(disk::Disk::new(Head::new(geometry)));
    let fs = passthrough::Hddfs::new(backing, disk.clone(), charge.to_string(), geometry.capacity)
        .with_context(|| format!("backing directory {}", backing.display()))?;
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("hddfs".into()),
        MountOption::AutoUnmount,
        MountOption::NoAtime,
    ];
    // auto_unmount needs allow_other, which root may use without user_allow_other.
    config.acl = SessionACL::All;
    config.n_threads = Some(threads.max(1));
    let session = fuser::spawn_mount(fs, mountpoint, &config).with_context(|| {
        format!(
            "mounting hddfs at {} (needs root, /dev/fuse and fusermount3)",
            mountpoint.display()
        )
    })?;
    mount::wait_mounted(mountpoint, true)?;
    let set = match read_ahead_kb {
        Some(kb) => set_read_ahead(mountpoint, kb),
        None => match_read_ahead(mountpoint, backing),
    };
    if let Err(e) = set {
        eprintln!("hddfs: read-ahead left at the kernel's FUSE default: {e:#}");
    }
    Ok((session, disk))
}

/// Gives the mount the read-ahead window of the disk holding `backing` (FUSE's `init` can
/// only lower the kernel's 128 KiB default; the mount's bdi, `0:<minor>`, can be raised), so
/// that `hdd` and `hdd-seek` read ahead alike. Requests stay at most 1 MiB (`max_pages`).
fn match_read_ahead(mountpoint: &Path, backing: &Path) -> anyhow::Result<()> {
    let disk = crate::bench::disk_profile::whole_disk(backing)?;
    let kb = std::fs::read_to_string(format!("/sys/dev/block/{disk}/queue/read_ahead_kb"))?;
    let kb = kb.trim().parse().context("the disk's read_ahead_kb")?;
    set_read_ahead(mountpoint, kb)
}

/// Sets the read-ahead window of the FUSE mount at `mountpoint` to `kb` KiB.
pub fn set_read_ahead(mountpoint: &Path, kb: u64) -> anyhow::Result<()> {
    let bdi = read_ahead_file(mountpoint)?;
    std::fs::write(&bdi, kb.to_string()).with_context(|| format!("writing {bdi}"))?;
    Ok(())
}

/// The read-ahead window of the FUSE mount at `mountpoint`, in bytes.
pub fn read_ahead(mountpoint: &Path) -> anyhow::Result<u64> {
    let bdi = read_ahead_file(mountpoint)?;
    let kb = std::fs::read_to_string(&bdi).with_context(|| format!("reading {bdi}"))?;
    Ok(kb.trim().parse::<u64>().context("read_ahead_kb")? * 1024)
}

/// The mount's bdi (`0:<minor>`) file holding its read-ahead in KiB.
fn read_ahead_file(mountpoint: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::MetadataExt as _;
    let dev = std::fs::metadata(mountpoint)?.dev();
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    Ok(format!("/sys/class/bdi/0:{minor}/read_ahead_kb"))
}

/// Writes the counters to `path` whole (a temporary file renamed over it).
fn write_stats(path: &Path, disk: &disk::Disk) {
    let stats = disk.lock().stats().clone();
    let Ok(text) = serde_json::to_string(&stats) else {
        return;
    };
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Blocks until standard input reaches its end or SIGTERM/SIGINT arrives.
fn wait_for_stop() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        use tokio::io::AsyncReadExt as _;
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let stdin = async {
            let mut input = tokio::io::stdin();
            let mut buf = [0u8; 64];
            while input.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            () = stdin => {}
        }
        Ok::<_, anyhow::Error>(())
    })?;
    // tokio's stdin reader is a blocking thread that may be waiting: do not wait for it.
    rt.shutdown_background();
    Ok(())
}
