//! `--disk-profile hdd`: the benchmark cluster's IO given the costs of a 7,200 rpm disk, with
//! the kernel's cgroup v1 controllers (see docs/benchmarks.md, "HDD profile").
//!
//! The benchmark process, which runs the embedded DataNodes, moves itself (every thread:
//! `cgroup.procs`) into a fresh cgroup named per run (`sluice-bench-<pid>`), created under
//! `blkio` (at the root) and under `memory` (below the process's own memory cgroup, so any
//! limit above still applies), and moves back and removes both when the benchmark ends:
//!
//! - `blkio.throttle.{read,write}_iops_device` = [`HDD_IOPS`] and `..._bps_device` =
//!   [`HDD_BPS`] on the whole disk holding `--dir`: every request costs at least 1/170 s and
//!   the bandwidth is capped, so many small or interleaved requests cost more than few large
//!   ones. Charged: reads (the reading thread submits them, readahead included) and writes
//!   the process submits itself (O_DIRECT, and the writeback an `fsync` starts). Not charged:
//!   writeback by the kernel's flusher threads (cgroup v1 has no writeback attribution) and
//!   the journal. The benchmark prints what was charged, so a reader sees the share.
//! - `memory.limit_in_bytes` = `--disk-profile-memory` (1 GiB): the page cache the DataNodes
//!   may keep, with the process's own memory, is small, so written data evicts data readers
//!   need.
//!
//! Why the whole process and not DataNode processes: the bench client does no block IO (it
//! talks to the DataNodes over loopback sockets), so the throttle charges exactly the
//! DataNodes' IO; the client's memory (its buffers, tens of MiB) is charged to the memory
//! limit and shown in the summary. Both sides of each comparison run in the same process,
//! under the same cgroup and limits, one after the other. `scripts/hdd-profile.sh` gives a
//! process cluster (`sluice local`, `sluice-datanode`) the same limits; docker-compose.hdd.yml
//! gives them to the compose cluster.

use anyhow::Context as _;
use clap::Args;
use sluice_common::config::ByteSize;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// Requests per second of a 7,200 rpm disk: 8.5 ms average seek plus 4.2 ms half a rotation
/// is ~12.7 ms, ~80 random requests/s; with a queue and short seeks 150-200. Read and write.
pub const HDD_IOPS: u64 = 170;
/// Bytes per second of its outer-to-middle tracks (150 MB/s). Read and write.
pub const HDD_BPS: u64 = 150_000_000;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const PREFIX: &str = "sluice-bench-";

/// The disk a benchmark cluster is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DiskProfile {
    /// The machine's disk as it is.
    None,
    /// A 7,200 rpm disk: 170 requests/s, 150 MB/s, a small page cache.
    Hdd,
    /// A 7,200 rpm disk modelled by a FUSE layer that charges seek, rotation and transfer by
    /// where each request lands (`sluice hddfs`), with the same small page cache.
    HddSeek,
}

/// The profile flags every cluster benchmark takes.
#[derive(Debug, Clone, Args)]
pub struct ProfileArgs {
    /// Disk profile of the benchmark's own cluster (docs/benchmarks.md, "HDD profile").
    #[arg(long, value_enum, default_value = "none")]
    pub disk_profile: DiskProfile,
    /// Memory (page cache included) of the benchmark process under --disk-profile hdd.
    #[arg(long, default_value = "1GiB", value_parser = ByteSize::parse)]
    pub disk_profile_memory: ByteSize,
    /// The kernel's read-ahead window on the hdd-seek mount (default: the read-ahead of the
    /// disk under --dir, as under `hdd`). A SATA disk's default is 128KiB.
    #[arg(long, value_parser = ByteSize::parse)]
    pub disk_profile_read_ahead: Option<ByteSize>,
}

/// Runs `fut` (a benchmark on its own cluster under `dir`, which exists) inside the profile
/// `args` names, then adds the profile's note (its limits, what it was charged) to the
/// result with `note`. Without a profile, just `fut`.
pub async fn within<R>(
    args: &ProfileArgs,
    dir: &Path,
    fut: impl std::future::Future<Output = anyhow::Result<R>>,
    note: impl FnOnce(&mut R, String),
) -> anyhow::Result<R> {
    let Some(active) = enter(args, dir)? else {
        return fut.await;
    };
    let mut r = fut.await?;
    let n = active.note();
    eprintln!("{}", active.charged());
    drop(active);
    note(&mut r, n);
    Ok(r)
}

/// Refuses a profile for an existing cluster (`--metadata`): its processes are not ours to
/// move; run them under `scripts/hdd-profile.sh` instead.
pub fn refuse_existing(args: &ProfileArgs, existing: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        !(existing && args.disk_profile != DiskProfile::None),
        "--disk-profile applies to the benchmark's own cluster; start an existing cluster \
         under scripts/hdd-profile.sh instead"
    );
    Ok(())
}

/// One controller's cgroup: the one created and the one the process came from.
#[derive(Debug)]
struct Group {
    created: PathBuf,
    origin: PathBuf,
}

/// The process inside the profile's cgroups (and, for `hdd-seek`, the cluster's directory
/// on hddfs) until dropped.
#[derive(Debug)]
pub struct Active {
    /// `hdd` only.
    blkio: Option<Group>,
    memory: Group,
    device: String,
    /// `hdd-seek` only.
    seek: Option<SeekDisk>,
}

/// The hddfs mount of `hdd-seek`: the daemon and its backing directory.
#[derive(Debug)]
struct SeekDisk {
    mount: Option<crate::hddfs::Mount>,
    backing: PathBuf,
}

impl SeekDisk {
    /// The mount's read-ahead window in bytes, as the kernel has it.
    fn read_ahead(&self) -> Option<u64> {
        crate::hddfs::read_ahead(self.mount.as_ref()?.mountpoint()).ok()
    }
}

impl Drop for SeekDisk {
    fn drop(&mut self) {
        if let Some(m) = self.mount.take() {
            if let Err(e) = m.stop() {
                eprintln!("disk profile: {e:#}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.backing);
        let _ = std::fs::remove_file(self.backing.with_extension("stats.json"));
    }
}

/// The hddfs counters of the `hdd-seek` mount at `dir` so far (as its daemon last wrote
/// them, at most half a second ago); `None` without that profile.
pub fn seek_counters(args: &ProfileArgs, dir: &Path) -> Option<crate::hddfs::Stats> {
    if args.disk_profile != DiskProfile::HddSeek {
        return None;
    }
    let mut name = dir.file_name()?.to_os_string();
    name.push(".stats.json");
    let text = std::fs::read_to_string(dir.with_file_name(name)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Mounts hddfs at `dir` (empty), backed by a sibling directory `<dir>.hddfs-backing`,
/// charging the replica files (`blk_*`: block data and checksums) only; with `read_ahead`,
/// the mount's read-ahead window is set to it.
fn mount_seek_disk(dir: &Path, read_ahead: Option<ByteSize>) -> anyhow::Result<SeekDisk> {
    let mut name = dir
        .file_name()
        .context("--dir needs a final component for hdd-seek")?
        .to_os_string();
    name.push(".hddfs-backing");
    let backing = dir.with_file_name(name);
    anyhow::ensure!(
        !backing.exists(),
        "{} exists (a killed run?): remove it first",
        backing.display()
    );
    let exe = std::env::current_exe().context("finding the sluice binary for hddfs")?;
    let mut seek = SeekDisk {
        mount: None,
        backing,
    };
    seek.mount = Some(crate::hddfs::Mount::start(
        &exe,
        &seek.backing,
        dir,
        "blk_",
        read_ahead.map(|ra| ra.bytes() / 1024),
    )?);
    Ok(seek)
}

/// Moves this process into a fresh HDD cgroup when `args` asks for one; `dir` is on the disk
/// to throttle. `None` without a profile.
pub fn enter(args: &ProfileArgs, dir: &Path) -> anyhow::Result<Option<Active>> {
    if args.disk_profile == DiskProfile::None {
        return Ok(None);
    }
    let device = whole_disk(dir)?;
    let name = format!("{PREFIX}{}", std::process::id());
    // The daemon starts before this process enters the memory cgroup, so that its own page
    // cache (the backing files) and memory are not charged to the benchmark.
    anyhow::ensure!(
        args.disk_profile_read_ahead.is_none() || args.disk_profile == DiskProfile::HddSeek,
        "--disk-profile-read-ahead is for --disk-profile hdd-seek (under hdd the read-ahead is \
         the device's, shared with the whole machine)"
    );
    let seek = match args.disk_profile {
        DiskProfile::HddSeek => Some(mount_seek_disk(dir, args.disk_profile_read_ahead)?),
        _ => None,
    };
    let blkio = match args.disk_profile {
        DiskProfile::Hdd => Some(group("blkio", &name)?),
        _ => None,
    };
    let memory = group("memory", &name).inspect_err(|_| {
        if let Some(b) = &blkio {
            remove(b)
        }
    })?;
    let active = Active {
        blkio,
        memory,
        device,
        seek,
    };
    active.configure(args.disk_profile_memory)?;
    eprintln!("disk profile: {}", active.describe());
    Ok(Some(active))
}

impl Active {
    fn configure(&self, memory: ByteSize) -> anyhow::Result<()> {
        let pid = std::process::id().to_string();
        let m = &self.memory.created;
        write(
            &m.join("memory.limit_in_bytes"),
            &memory.bytes().to_string(),
        )?;
        let Some(blkio) = &self.blkio else {
            return write(&m.join("cgroup.procs"), &pid);
        };
        let b = &blkio.created;
        let d = &self.device;
        write(
            &b.join("blkio.throttle.read_iops_device"),
            &format!("{d} {HDD_IOPS}"),
        )?;
        write(
            &b.join("blkio.throttle.write_iops_device"),
            &format!("{d} {HDD_IOPS}"),
        )?;
        write(
            &b.join("blkio.throttle.read_bps_device"),
            &format!("{d} {HDD_BPS}"),
        )?;
        write(
            &b.join("blkio.throttle.write_bps_device"),
            &format!("{d} {HDD_BPS}"),
        )?;
        write(&b.join("cgroup.procs"), &pid)?;
        write(&m.join("cgroup.procs"), &pid)
    }

    /// The cgroups, the device and the limits, in one line.
    pub fn describe(&self) -> String {
        let limit = std::fs::read_to_string(self.memory.created.join("memory.limit_in_bytes"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map_or_else(|| "?".into(), |b| ByteSize(b).to_string());
        let Some(blkio) = &self.blkio else {
            return format!(
                "hdd-seek: hddfs (a 7,200 rpm disk: 1-16 ms seek by distance, 4.17 ms half \
                 a turn, 150 MB/s, one head, C-LOOK) serving the cluster's directory from \
                 {}, charging blk_* files, kernel read-ahead {}; memory {} (pid {}) limit \
                 {limit}",
                self.seek
                    .as_ref()
                    .map_or_else(|| "?".into(), |s| s.backing.display().to_string()),
                self.seek
                    .as_ref()
                    .and_then(|s| s.read_ahead())
                    .map_or_else(|| "?".into(), |b| ByteSize(b).to_string()),
                self.memory.created.display(),
                std::process::id(),
            );
        };
        format!(
            "hdd: blkio {} and memory {} (pid {}): device {} throttled to {HDD_IOPS} IOPS and \
             {} MB/s read and write, memory limit {limit}",
            blkio.created.display(),
            self.memory.created.display(),
            std::process::id(),
            self.device,
            HDD_BPS / 1_000_000,
        )
    }

    /// What the cgroup was charged so far: bytes and requests read and written on the
    /// device, and the memory high-water mark.
    pub fn charged(&self) -> String {
        let peak = std::fs::read_to_string(self.memory.created.join("memory.max_usage_in_bytes"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let Some(blkio) = &self.blkio else {
            let s = self
                .seek
                .as_ref()
                .and_then(|s| s.mount.as_ref())
                .map(|m| m.stats())
                .unwrap_or_default();
            return format!(
                "disk profile charged: {}, queue up to {}, memory peak {}",
                s.line(),
                s.max_queue,
                ByteSize(peak),
            );
        };
        let b = &blkio.created;
        let bytes = io_stat(&b.join("blkio.throttle.io_service_bytes"), &self.device);
        let reqs = io_stat(&b.join("blkio.throttle.io_serviced"), &self.device);
        format!(
            "disk profile charged: read {:.1} MB in {} requests, written {:.1} MB in {} \
             requests (writeback by the kernel's flushers is not charged), memory peak {}",
            bytes.0 as f64 / 1e6,
            reqs.0,
            bytes.1 as f64 / 1e6,
            reqs.1,
            ByteSize(peak),
        )
    }

    /// A note for a report: the profile and what it was charged.
    pub fn note(&self) -> String {
        format!("disk profile {}; {}", self.describe(), self.charged())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let pid = std::process::id().to_string();
        for g in self.blkio.iter().chain([&self.memory]) {
            let _ = write(&g.origin.join("cgroup.procs"), &pid);
            remove(g);
        }
        // Then the hddfs mount, if any (SeekDisk's drop: the daemon stops and unmounts).
        drop(self.seek.take());
    }
}

/// The `(Read, Write)` totals of a `blkio.throttle.io_*` file for `device`.
fn io_stat(file: &Path, device: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut out = (0, 0);
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(dev), Some(op), Some(v)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let v: u64 = v.parse().unwrap_or(0);
        match (dev == device, op) {
            (true, "Read") => out.0 += v,
            (true, "Write") => out.1 += v,
            _ => {}
        }
    }
    out
}

fn write(path: &Path, value: &str) -> anyhow::Result<()> {
    std::fs::write(path, value).with_context(|| format!("writing {value:?} to {}", path.display()))
}

fn remove(g: &Group) {
    if let Err(e) = std::fs::remove_dir(&g.created) {
        eprintln!(
            "disk profile: could not remove {}: {e}",
            g.created.display()
        );
    }
}

/// Creates `name` under this process's cgroup of `controller` (blkio: at its root, as blkio
/// throttling is per cgroup and not hierarchical in v1), removing stale empty ones of earlier
/// runs first.
fn group(controller: &str, name: &str) -> anyhow::Result<Group> {
    let mount = Path::new(CGROUP_ROOT).join(controller);
    anyhow::ensure!(
        mount.join("cgroup.procs").exists(),
        "--disk-profile needs the cgroup v1 {controller} controller at {} (not mounted here)",
        mount.display()
    );
    let own = own_cgroup(controller)?;
    let origin = mount.join(own.trim_start_matches('/'));
    let parent = if controller == "blkio" {
        mount.clone()
    } else {
        origin.clone()
    };
    remove_stale(&parent);
    let created = parent.join(name);
    std::fs::create_dir(&created).with_context(|| {
        format!(
            "creating cgroup {} (--disk-profile needs root)",
            created.display()
        )
    })?;
    Ok(Group { created, origin })
}

/// This process's cgroup path under `controller` (`/proc/self/cgroup`).
fn own_cgroup(controller: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    text.lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            ctrls
                .split(',')
                .any(|c| c == controller)
                .then(|| path.to_string())
        })
        .with_context(|| format!("this process is in no {controller} cgroup"))
}

/// Removes the empty `sluice-bench-*` cgroups under `parent` (a run that was killed).
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let ours = e.file_name().to_string_lossy().starts_with(PREFIX);
        let empty = std::fs::read_to_string(p.join("cgroup.procs")).is_ok_and(|s| s.is_empty());
        if ours && empty {
            let _ = std::fs::remove_dir(&p);
        }
    }
}

/// `major:minor` of the whole disk holding `dir` (throttling a partition's number does not
/// throttle its disk's requests).
pub fn whole_disk(dir: &Path) -> anyhow::Result<String> {
    let dev = std::fs::metadata(dir)
        .with_context(|| format!("stat {}", dir.display()))?
        .dev();
    let (major, minor) = split_dev(dev);
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    anyhow::ensure!(
        sys.exists(),
        "{} is on device {major}:{minor}, not a block device: --disk-profile needs the \
         directory on a disk (not tmpfs or overlay)",
        dir.display()
    );
    if !sys.join("partition").exists() {
        return Ok(format!("{major}:{minor}"));
    }
    let disk = std::fs::canonicalize(&sys)?.join("..").join("dev");
    let text =
        std::fs::read_to_string(&disk).with_context(|| format!("reading {}", disk.display()))?;
    Ok(text.trim().to_string())
}

/// Linux's `major`/`minor` of a device number.
fn split_dev(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_split_like_the_kernel() {
        assert_eq!(split_dev(0xfe00), (254, 0));
        assert_eq!(split_dev(0x0803), (8, 3));
        // A minor above 255 (the 12-bit split).
        assert_eq!(split_dev((259 << 8) | (0x12 << 20) | 0x34), (259, 0x1234));
    }

    #[test]
    fn the_script_and_the_compose_override_give_the_same_limits() {
        let script = include_str!("../../../../scripts/hdd-profile.sh");
        assert!(script.contains(&format!("\nIOPS={HDD_IOPS}\n")));
        assert!(script.contains(&format!("\nBPS={HDD_BPS}\n")));
        let default = ByteSize::parse("1GiB").unwrap().bytes();
        assert!(script.contains(&format!("SLUICE_HDD_MEMORY:-{default}}}")));
        let compose = include_str!("../../../../docker-compose.hdd.yml");
        assert_eq!(compose.matches(&format!("rate: {HDD_IOPS} }}")).count(), 2);
        assert_eq!(compose.matches(&format!("rate: {HDD_BPS} }}")).count(), 2);
        assert!(compose.contains("SLUICE_HDD_MEMORY:-1g}"));
    }

    #[test]
    fn an_existing_cluster_is_refused_the_profile() {
        let mut args = ProfileArgs {
            disk_profile: DiskProfile::Hdd,
            disk_profile_memory: ByteSize(1 << 30),
            disk_profile_read_ahead: None,
        };
        assert!(refuse_existing(&args, true).is_err());
        assert!(refuse_existing(&args, false).is_ok());
        args.disk_profile = DiskProfile::None;
        assert!(refuse_existing(&args, true).is_ok());
    }

    #[test]
    fn io_stat_sums_the_device_lines_only() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s");
        std::fs::write(
            &f,
            "254:0 Read 100\n254:0 Write 7\n254:0 Sync 3\n8:0 Read 50\nTotal 160\n",
        )
        .unwrap();
        assert_eq!(io_stat(&f, "254:0"), (100, 7));
    }
}
