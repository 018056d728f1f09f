//! `sluice bench mixed`: the upstream benchmark of write-memory batching (HDFS-17973) — writers
//! and readers at once, 80 % of the bytes read and 20 % written — for batching off, on the last
//! replica only, and on every replica, all in one run.
//!
//! For `--duration` (60 s) per configuration:
//! - `--writers` (16) writers each write `--file-size` (128 MiB, one block) files one after
//!   the other in 64 KiB packets, closing each (fsync at close), then deleting it;
//!   a file's time from create to close is its block's write latency;
//! - `--readers` (8) readers re-read a read set written before the clock starts
//!   (`--read-files` files of `--file-size`) with positioned reads of `--read-size` (4 MiB) at
//!   random offsets; each read's time is a read latency;
//! - a governor keeps the bytes near `--read-share` (0.8) read: whichever side is ahead
//!   waits, so both run as fast as the mix allows.
//!
//! Reported per configuration: aggregate, read and write MB/s (write bytes are the ones every
//! DataNode acknowledged), write latency p50/p99 per block, read latency p50/p99, the read
//! share reached, CPU seconds per GiB moved (the whole process), and block-file write calls
//! per MiB on buffered and unbuffered replicas (the DataNodes' counters).
//!
//! Each configuration gets a fresh embedded cluster under `--dir` (removed unless `--keep`).
//! With `--cold` the read set is evicted from the page cache before the clock starts. With
//! the global `--metadata` the benchmark runs once per run against that cluster as it is.

use super::report::{
    opt, print_table, process_cpu_secs, scrape, Latencies, Machine, Spread, WriteCounters, MIB,
};
use super::write::random_block;
use super::{embedded_cluster, fresh_dir, Batching, ClusterRuntime};
use crate::Globals;
use clap::Args;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sluice_client::{FileSystem, WriteOptions};
use sluice_common::config::ByteSize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Options of `sluice bench mixed`.
#[derive(Debug, Args)]
pub struct MixedArgs {
    /// Directory for the benchmark's clusters; must be absent or empty. Removed afterwards
    /// unless --keep.
    #[arg(long, default_value = "./sluice-bench-mixed", value_name = "DIR")]
    pub dir: PathBuf,
    /// Concurrent writers.
    #[arg(long, default_value_t = 16)]
    pub writers: usize,
    /// Size of every file (written and read), one block each.
    #[arg(long, default_value = "128MiB", value_parser = ByteSize::parse)]
    pub file_size: ByteSize,
    /// Concurrent readers.
    #[arg(long, default_value_t = 8)]
    pub readers: usize,
    /// Files in the read set, written before the clock starts.
    #[arg(long, default_value_t = 8)]
    pub read_files: usize,
    /// Bytes per positioned read.
    #[arg(long, default_value = "4MiB", value_parser = ByteSize::parse)]
    pub read_size: ByteSize,
    /// Share of the bytes moved that are read.
    #[arg(long, default_value_t = 0.8)]
    pub read_share: f64,
    /// Timed phase of each configuration.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Batching configurations to compare (off, last, all).
    #[arg(long, value_delimiter = ',', default_value = "off,last,all")]
    pub configs: Vec<Batching>,
    /// Runs of every configuration, cycling through them.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// DataNodes of each embedded cluster.
    #[arg(long, default_value_t = 3)]
    pub datanodes: usize,
    /// Evict the read set from the page cache before the clock starts.
    #[arg(long)]
    pub cold: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Keep the cluster directories.
    #[arg(long)]
    pub keep: bool,
    /// The disk the clusters are given.
    #[command(flatten)]
    pub profile: super::disk_profile::ProfileArgs,
}

/// One configuration over its runs.
#[derive(Debug, Clone, Serialize)]
struct Row {
    batching: String,
    aggregate_mb_per_s: Spread,
    read_mb_per_s: Spread,
    write_mb_per_s: Spread,
    read_share: Spread,
    blocks_written: usize,
    write_latency_p50_ms: f64,
    write_latency_p99_ms: f64,
    reads: usize,
    read_latency_p50_ms: f64,
    read_latency_p99_ms: f64,
    cpu_secs_per_gib: Spread,
    buffered_calls_per_mib: Option<f64>,
    direct_calls_per_mib: Option<f64>,
    counters: WriteCounters,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    machine: Machine,
    settings: String,
    rows: Vec<Row>,
    notes: Vec<String>,
}

/// One timed phase.
struct Sample {
    read_bytes: u64,
    write_bytes: u64,
    secs: f64,
    cpu: f64,
    write_lat: Latencies,
    read_lat: Latencies,
    counters: WriteCounters,
    /// What the `hdd-seek` disk model charged during the timed part.
    disk: Option<crate::hddfs::Stats>,
}

/// Keeps the bytes near the read share: a side that is ahead waits.
struct Governor {
    read: AtomicU64,
    written: AtomicU64,
    acked: AtomicU64,
    ratio: f64,
    slack: f64,
    deadline: Instant,
}

impl Governor {
    fn over(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Reads may go on while read ≤ ratio × written + slack.
    fn may_read(&self) -> bool {
        let (r, w) = (
            self.read.load(Ordering::Relaxed),
            self.written.load(Ordering::Relaxed),
        );
        r as f64 <= self.ratio * w as f64 + self.slack
    }

    /// Writes may go on while ratio × written ≤ read + slack.
    fn may_write(&self) -> bool {
        let (r, w) = (
            self.read.load(Ordering::Relaxed),
            self.written.load(Ordering::Relaxed),
        );
        self.ratio * w as f64 <= r as f64 + self.slack
    }

    /// Waits until `ok` or the deadline; false at the deadline.
    async fn wait(&self, ok: impl Fn(&Governor) -> bool) -> bool {
        while !ok(self) {
            if self.over() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        !self.over()
    }
}

const READ_DIR: &str = "/bench/mixed/read";
const WRITE_DIR: &str = "/bench/mixed/write";

/// Runs `sluice bench mixed`.
pub async fn run(args: &MixedArgs, g: &Globals) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    anyhow::ensure!(
        args.read_share > 0.0 && args.read_share < 1.0,
        "--read-share must be between 0 and 1"
    );
    anyhow::ensure!(
        args.writers >= 1 && args.readers >= 1 && args.read_files >= 1,
        "--writers, --readers and --read-files must be at least 1"
    );
    anyhow::ensure!(
        args.read_size.bytes() >= 1 && args.read_size.bytes() <= args.file_size.bytes(),
        "--read-size must be between 1 byte and --file-size"
    );
    anyhow::ensure!(!args.configs.is_empty(), "--configs names no configuration");
    super::disk_profile::refuse_existing(&args.profile, g.metadata_given)?;
    let report = if g.metadata_given {
        existing(args, g).await?
    } else {
        fresh_dir(&args.dir)?;
        let note = |r: &mut Report, n| r.notes.push(n);
        let r =
            super::disk_profile::within(&args.profile, &args.dir, embedded(args, g), note).await;
        if !args.keep {
            let _ = std::fs::remove_dir_all(&args.dir);
        }
        r?
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn new_report(args: &MixedArgs, g: &Globals, dir: &Path) -> Report {
    let dn = &g.full.datanode;
    Report {
        machine: Machine::probe(dir),
        settings: format!(
            "{} writers x {} files, {} readers x {} reads over {} files, read share {}, {:?} per \
             configuration{}, packet {}, write.buffer.size {}, idle flush {:?}, flush budget {} \
             MiB/volume, O_DIRECT {}, drop-behind {}",
            args.writers,
            args.file_size,
            args.readers,
            args.read_size,
            args.read_files,
            args.read_share,
            args.duration,
            if args.cold {
                ", read set cold at start"
            } else {
                ""
            },
            g.config.write_packet_size,
            dn.write_buffer_size,
            dn.write_buffer_idle_flush_timeout.get(),
            dn.concurrent_flush_mb_per_volume,
            dn.write_o_direct,
            dn.write_buffer_drop_behind,
        ),
        rows: Vec::new(),
        notes: Vec::new(),
    }
}

async fn embedded(args: &MixedArgs, g: &Globals) -> anyhow::Result<Report> {
    let mut report = new_report(args, g, &args.dir);
    let mut samples: Vec<Vec<Sample>> = args.configs.iter().map(|_| Vec::new()).collect();
    for run in 0..args.runs {
        for (ci, config) in args.configs.iter().enumerate() {
            let dir = args.dir.join(format!("{}-{run}", config.name()));
            std::fs::create_dir_all(&dir)?;
            let dn = config.apply(&g.full.datanode);
            let (cluster, fs) =
                embedded_cluster(&dir, args.datanodes, g, &dn, ClusterRuntime::Shared).await?;
            let s = phase(&fs, args, Some(&dir)).await;
            cluster.stop().await;
            if !args.keep {
                let _ = std::fs::remove_dir_all(&dir);
            }
            let s = s?;
            if let Some(d) = &s.disk {
                report.notes.push(format!(
                    "hdd-seek, {} run {run}, timed part ({:.0} s): {}",
                    config.name(),
                    s.secs,
                    d.line()
                ));
            }
            samples[ci].push(s);
        }
    }
    for (ci, config) in args.configs.iter().enumerate() {
        report
            .rows
            .push(row(config.name(), std::mem::take(&mut samples[ci])));
    }
    Ok(report)
}

async fn existing(args: &MixedArgs, g: &Globals) -> anyhow::Result<Report> {
    let fs = g.connect().await?;
    let mut report = new_report(args, g, Path::new("."));
    report.machine.disk = "remote cluster (the client's machine is described)".into();
    report.notes.push(
        "an existing cluster (--metadata): measured as it is configured, page cache as it is; \
         run without --metadata to compare batching off, last replica and all replicas"
            .into(),
    );
    let mut samples = Vec::new();
    for _ in 0..args.runs {
        samples.push(phase(&fs, args, None).await?);
    }
    let _ = fs.delete("/bench/mixed", true).await;
    report.rows.push(row("as configured", samples));
    Ok(report)
}

/// Writes the read set, then runs writers and readers for the duration.
async fn phase(fs: &FileSystem, args: &MixedArgs, dir: Option<&Path>) -> anyhow::Result<Sample> {
    let data = Arc::new(random_block(4 << 20));
    let read_set = write_read_set(fs, args, &data).await?;
    if let (true, Some(dir)) = (args.cold, dir) {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            super::cache::evict(&super::cache::replica_files(&dir))
        })
        .await??;
    }
    let before = scrape(fs).await?;
    let disk_before = super::disk_profile::seek_counters(&args.profile, &args.dir);
    let cpu = process_cpu_secs();
    let ratio = args.read_share / (1.0 - args.read_share);
    let gov = Arc::new(Governor {
        read: AtomicU64::new(0),
        written: AtomicU64::new(0),
        acked: AtomicU64::new(0),
        ratio,
        slack: 64.0 * MIB,
        deadline: Instant::now() + args.duration,
    });
    let started = Instant::now();
    let writers: Vec<_> = (0..args.writers)
        .map(|i| {
            let (fs, data, gov) = (fs.clone(), data.clone(), gov.clone());
            let size = args.file_size.bytes();
            tokio::spawn(async move { writer(&fs, i, size, &data, &gov).await })
        })
        .collect();
    let readers: Vec<_> = (0..args.readers)
        .map(|i| {
            let (fs, gov, set) = (fs.clone(), gov.clone(), read_set.clone());
            let (size, file) = (args.read_size.as_usize(), args.file_size.bytes());
            tokio::spawn(async move { reader(&fs, i as u64, &set, file, size, &gov).await })
        })
        .collect();
    let mut write_lat = Latencies::default();
    for w in writers {
        write_lat.extend(w.await??);
    }
    let mut read_lat = Latencies::default();
    for r in readers {
        read_lat.extend(r.await??);
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = process_cpu_secs() - cpu;
    let counters = scrape(fs).await?.since(&before);
    let disk = disk_before.and_then(|b| {
        super::disk_profile::seek_counters(&args.profile, &args.dir).map(|a| a.since(&b))
    });
    let _ = fs.delete("/bench/mixed", true).await;
    Ok(Sample {
        read_bytes: gov.read.load(Ordering::Relaxed),
        write_bytes: gov.acked.load(Ordering::Relaxed),
        secs,
        cpu,
        write_lat,
        read_lat,
        counters,
        disk,
    })
}

/// Writes the read set (all files at once); returns their paths.
async fn write_read_set(
    fs: &FileSystem,
    args: &MixedArgs,
    data: &Arc<Vec<u8>>,
) -> anyhow::Result<Arc<Vec<String>>> {
    let paths: Vec<String> = (0..args.read_files)
        .map(|i| format!("{READ_DIR}/r{i}"))
        .collect();
    let tasks: Vec<_> = paths
        .iter()
        .map(|p| {
            let (fs, data, p) = (fs.clone(), data.clone(), p.clone());
            let size = args.file_size.bytes();
            tokio::spawn(async move {
                let mut w = fs.create(&p, options(size)).await?;
                let mut left = size;
                while left > 0 {
                    let n = left.min(data.len() as u64) as usize;
                    w.write_all(&data[..n]).await?;
                    left -= n as u64;
                }
                w.close().await?;
                anyhow::Ok(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(Arc::new(paths))
}

fn options(size: u64) -> WriteOptions {
    WriteOptions {
        overwrite: true,
        create_parent: true,
        replication: None,
        // One block per file; block sizes are multiples of 512 bytes.
        block_size: Some(size.div_ceil(512).max(1) * 512),
    }
}

/// One writer: files one after the other until the deadline; the latency of each completed
/// file (one block).
async fn writer(
    fs: &FileSystem,
    id: usize,
    size: u64,
    data: &[u8],
    gov: &Governor,
) -> anyhow::Result<Latencies> {
    let mut lat = Latencies::default();
    let mut n = 0u64;
    loop {
        n += 1;
        let path = format!("{WRITE_DIR}/w{id}-{n}");
        let started = Instant::now();
        let mut w = fs.create(&path, options(size)).await?;
        let (mut left, mut acked) = (size, 0u64);
        while left > 0 {
            if !gov.wait(Governor::may_write).await {
                return Ok(lat); // the deadline: this file is abandoned
            }
            let len = left.min(1 << 20).min(data.len() as u64) as usize;
            w.write_all(&data[..len]).await?;
            left -= len as u64;
            gov.written.fetch_add(len as u64, Ordering::Relaxed);
            let now = w.bytes_acked();
            gov.acked
                .fetch_add(now.saturating_sub(acked), Ordering::Relaxed);
            acked = acked.max(now);
        }
        w.close().await?;
        gov.acked
            .fetch_add(size.saturating_sub(acked), Ordering::Relaxed);
        if gov.over() {
            return Ok(lat); // finished after the deadline: not a sample of the mix
        }
        lat.push(started.elapsed());
        // Written and durable: removed at once, so that the disk holds at most one file per
        // writer.
        fs.delete(&path, false).await?;
    }
}

/// One reader: positioned reads at random offsets of random read-set files until the deadline.
async fn reader(
    fs: &FileSystem,
    seed: u64,
    set: &[String],
    file: u64,
    size: usize,
    gov: &Governor,
) -> anyhow::Result<Latencies> {
    let mut files = Vec::with_capacity(set.len());
    for p in set {
        files.push(fs.open(p).await?);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let slots = (file / size as u64).max(1);
    let mut buf = vec![0u8; size];
    let mut lat = Latencies::default();
    while gov.wait(Governor::may_read).await {
        let f = &files[rng.random_range(0..files.len())];
        let pos = rng.random_range(0..slots) * size as u64;
        let started = Instant::now();
        let n = f.read_at(pos, &mut buf).await?;
        lat.push(started.elapsed());
        gov.read.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(lat)
}

fn row(batching: &str, samples: Vec<Sample>) -> Row {
    let mb = |b: u64, s: f64| b as f64 / s.max(1e-9) / 1e6;
    let mut write_lat = Latencies::default();
    let mut read_lat = Latencies::default();
    for s in &samples {
        write_lat.extend(s.write_lat.clone());
        read_lat.extend(s.read_lat.clone());
    }
    let counters = samples.last().map(|s| s.counters).unwrap_or_default();
    Row {
        batching: batching.into(),
        aggregate_mb_per_s: Spread::of(
            samples
                .iter()
                .map(|s| mb(s.read_bytes + s.write_bytes, s.secs)),
        ),
        read_mb_per_s: Spread::of(samples.iter().map(|s| mb(s.read_bytes, s.secs))),
        write_mb_per_s: Spread::of(samples.iter().map(|s| mb(s.write_bytes, s.secs))),
        read_share: Spread::of(
            samples
                .iter()
                .map(|s| s.read_bytes as f64 / ((s.read_bytes + s.write_bytes) as f64).max(1.0)),
        ),
        blocks_written: write_lat.len(),
        write_latency_p50_ms: write_lat.percentile_ms(50.0),
        write_latency_p99_ms: write_lat.percentile_ms(99.0),
        reads: read_lat.len(),
        read_latency_p50_ms: read_lat.percentile_ms(50.0),
        read_latency_p99_ms: read_lat.percentile_ms(99.0),
        cpu_secs_per_gib: Spread::of(samples.iter().map(|s| {
            s.cpu / (((s.read_bytes + s.write_bytes) as f64) / (1u64 << 30) as f64).max(1e-9)
        })),
        buffered_calls_per_mib: counters.buffered_calls_per_mib(),
        direct_calls_per_mib: counters.direct_calls_per_mib(),
        counters,
    }
}

fn print_report(r: &Report) {
    println!("sluice bench mixed — writers and readers, write-memory batching off / last replica / all replicas");
    println!("machine: {}", r.machine.line());
    println!("settings: {}", r.settings);
    println!();
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|x| {
            vec![
                x.batching.clone(),
                x.aggregate_mb_per_s.show(1),
                x.read_mb_per_s.show(1),
                x.write_mb_per_s.show(1),
                format!("{:.2}", x.read_share.median),
                format!("{:.0}", x.write_latency_p50_ms),
                format!("{:.0}", x.write_latency_p99_ms),
                x.blocks_written.to_string(),
                format!("{:.1}", x.read_latency_p50_ms),
                format!("{:.1}", x.read_latency_p99_ms),
                x.cpu_secs_per_gib.show(2),
                opt(x.buffered_calls_per_mib, 2),
                opt(x.direct_calls_per_mib, 2),
            ]
        })
        .collect();
    print_table(
        &[
            "batching",
            "total MB/s",
            "read MB/s",
            "write MB/s",
            "read share",
            "block write p50 ms",
            "p99 ms",
            "blocks",
            "read p50 ms",
            "p99 ms",
            "CPU s/GiB",
            "writes/MiB buffered",
            "writes/MiB direct",
        ],
        &rows,
    );
    println!();
    println!(
        "write MB/s counts bytes acknowledged by every DataNode; block write latency is create \
         to close (fsync) of one one-block file; read latency is one positioned read. \
         writes/MiB: block-file write calls per MiB (DataNode counters, last run)."
    );
    for n in &r.notes {
        println!("note: {n}");
    }
}
