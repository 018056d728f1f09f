//! `sluice bench write`: write-memory batching (HDFS-17973) off against on, in two write
//! patterns, both sides in one run:
//!
//! 1. one writer, one large file (`--single-size`, 1 GiB);
//! 2. `--writers` (32) writers at once, `--writer-size` (8 MiB) each.
//!
//! Files are written in packets of the client's `write.packet.size` (256 KiB by default) and
//! closed, which fsyncs every replica (`sync.on.close`). Reported per configuration: MB/s of
//! file data, CPU seconds per GiB (the whole process: client, DataNodes and metadata service of the embedded
//! cluster), per-file write latency, and — from the DataNodes' own counters — block-file write
//! calls per MiB on a buffered replica and on an unbuffered one.
//!
//! Every experiment is also measured without Sluice in the same run ([`super::floor`]): the
//! same bytes through as many loopback hops and file writes as replicas, with the same write
//! size and fsync policy, by plain threads; each row prints Sluice's MB/s and CPU s/GiB next
//! to the floor's and the ratios (JSON: `mb_s`, `cpu_s_per_gib`, `floor_mb_s`,
//! `floor_cpu_s_per_gib`, `mb_s_vs_floor`, `cpu_vs_floor`).
//!
//! After each experiment its files are deleted and the benchmark waits, untimed, until the
//! DataNodes have unlinked the replicas, as the floor removes its files before it returns.
//!
//! Each configuration (`--configs`, default `off,last`) gets a fresh embedded cluster under
//! `--dir`, removed afterwards unless `--keep`; `--runs` repeats everything, cycling through
//! the configurations so that drift on a shared machine hits all alike. With the global
//! `--metadata` the benchmark writes to that cluster instead, as it is configured.

use super::floor::{self, FloorSample, VsFloor, WriteChain};
use super::report::{
    opt, print_table, process_cpu_secs, replica_counts, scrape, Latencies, Machine, Spread,
    WriteCounters,
};
use super::{embedded_cluster, fresh_dir, Batching, ClusterRuntime};
use crate::Globals;
use clap::Args;
use rand::{RngCore, SeedableRng};
use serde::Serialize;
use sluice_client::{FileSystem, WriteOptions};
use sluice_common::config::ByteSize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::AsyncWriteExt;

/// Options of `sluice bench write`.
#[derive(Debug, Args)]
pub struct WriteArgs {
    /// Directory for the benchmark's clusters; must be absent or empty. Removed afterwards
    /// unless --keep.
    #[arg(long, default_value = "./sluice-bench-write", value_name = "DIR")]
    pub dir: PathBuf,
    /// Size of the single writer's file.
    #[arg(long, default_value = "1GiB", value_parser = ByteSize::parse)]
    pub single_size: ByteSize,
    /// Writers of the concurrent experiment.
    #[arg(long, default_value_t = 32)]
    pub writers: usize,
    /// Size of each concurrent writer's file.
    #[arg(long, default_value = "8MiB", value_parser = ByteSize::parse)]
    pub writer_size: ByteSize,
    /// Block size of the files.
    #[arg(long, default_value = "128MiB", value_parser = ByteSize::parse)]
    pub block_size: ByteSize,
    /// Batching configurations to compare (off, last, all).
    #[arg(long, value_delimiter = ',', default_value = "off,last")]
    pub configs: Vec<Batching>,
    /// Runs of every configuration (min/median/max).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// DataNodes of each embedded cluster.
    #[arg(long, default_value_t = 3)]
    pub datanodes: usize,
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

/// One experiment in one configuration, over the runs.
#[derive(Debug, Clone, Serialize)]
struct Row {
    experiment: String,
    batching: String,
    mb_per_s: Spread,
    cpu_secs_per_gib: Spread,
    file_latency_p50_ms: f64,
    file_latency_p99_ms: f64,
    buffered_calls_per_mib: Option<f64>,
    direct_calls_per_mib: Option<f64>,
    counters: WriteCounters,
    /// Medians against the floor's (flattened: `mb_s`, `floor_mb_s`, ...).
    #[serde(flatten)]
    vs_floor: VsFloor,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
struct Report {
    machine: Machine,
    settings: String,
    rows: Vec<Row>,
    notes: Vec<String>,
}

/// One timed run of one experiment.
struct Sample {
    mb_per_s: f64,
    cpu_per_gib: f64,
    latencies: Latencies,
    counters: WriteCounters,
}

#[derive(Debug, Clone, Copy)]
enum Experiment {
    Single,
    Many,
}

/// Runs `sluice bench write`.
pub async fn run(args: &WriteArgs, g: &Globals) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    anyhow::ensure!(args.writers >= 1, "--writers must be at least 1");
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

fn new_report(args: &WriteArgs, g: &Globals, dir: &Path) -> Report {
    let dn = &g.full.datanode;
    Report {
        machine: Machine::probe(dir),
        settings: format!(
            "block {}, packet {}, sync.on.close {}, write.buffer.size {}, idle flush {:?}, \
             flush budget {} MiB/volume, O_DIRECT {}, drop-behind {}",
            args.block_size,
            g.config.write_packet_size,
            dn.sync_on_close,
            dn.write_buffer_size,
            dn.write_buffer_idle_flush_timeout.get(),
            dn.concurrent_flush_mb_per_volume,
            dn.write_o_direct,
            dn.write_buffer_drop_behind
        ),
        rows: Vec::new(),
        notes: Vec::new(),
    }
}

async fn embedded(args: &WriteArgs, g: &Globals) -> anyhow::Result<Report> {
    let mut report = new_report(args, g, &args.dir);
    let n = args.configs.len();
    let mut samples: Vec<[Vec<Sample>; 2]> = (0..n).map(|_| [Vec::new(), Vec::new()]).collect();
    let mut floors: [Vec<FloorSample>; 2] = [Vec::new(), Vec::new()];
    for run in 0..args.runs {
        for (ei, exp) in [Experiment::Single, Experiment::Many]
            .into_iter()
            .enumerate()
        {
            let dir = args.dir.join(format!("floor-{run}"));
            floors[ei].push(measure_floor(args, g, exp, dir).await?);
        }
        for (ci, config) in args.configs.iter().enumerate() {
            let dir = args.dir.join(format!("{}-{run}", config.name()));
            std::fs::create_dir_all(&dir)?;
            let dn = config.apply(&g.full.datanode);
            let (cluster, fs) =
                embedded_cluster(&dir, args.datanodes, g, &dn, ClusterRuntime::Shared).await?;
            let single = measure(&fs, args, Experiment::Single).await;
            let many = measure(&fs, args, Experiment::Many).await;
            cluster.stop().await;
            if !args.keep {
                let _ = std::fs::remove_dir_all(&dir);
            }
            samples[ci][0].push(single?);
            samples[ci][1].push(many?);
        }
    }
    for (ci, config) in args.configs.iter().enumerate() {
        for (ei, s) in std::mem::take(&mut samples[ci]).into_iter().enumerate() {
            let exp = [Experiment::Single, Experiment::Many][ei];
            report
                .rows
                .push(row(args, exp, config.name(), s, &floors[ei]));
        }
    }
    Ok(report)
}

async fn existing(args: &WriteArgs, g: &Globals) -> anyhow::Result<Report> {
    let fs = g.connect().await?;
    let mut report = new_report(args, g, Path::new("."));
    report.machine.disk = "remote cluster (the client's machine is described)".into();
    report.notes.push(
        "an existing cluster (--metadata): measured once per run as it is configured, without \
         the floor (its disks are not here); run without --metadata to compare batching off \
         and on and to measure the floor"
            .into(),
    );
    let mut single = Vec::new();
    let mut many = Vec::new();
    for _ in 0..args.runs {
        single.push(measure(&fs, args, Experiment::Single).await?);
        many.push(measure(&fs, args, Experiment::Many).await?);
    }
    let _ = fs.delete(FILES_DIR, true).await;
    report
        .rows
        .push(row(args, Experiment::Single, "as configured", single, &[]));
    report
        .rows
        .push(row(args, Experiment::Many, "as configured", many, &[]));
    Ok(report)
}

const FILES_DIR: &str = "/bench/write";

/// Writes the experiment's files once, timed, with the DataNodes' counters around it.
async fn measure(fs: &FileSystem, args: &WriteArgs, exp: Experiment) -> anyhow::Result<Sample> {
    let (files, size) = match exp {
        Experiment::Single => (1, args.single_size.bytes()),
        Experiment::Many => (args.writers, args.writer_size.bytes()),
    };
    let data = Arc::new(random_block(4 << 20));
    let before = scrape(fs).await?;
    let replicas_before = replica_counts(fs).await?;
    let cpu = process_cpu_secs();
    let started = Instant::now();
    let tasks: Vec<_> = (0..files)
        .map(|i| {
            let (fs, data) = (fs.clone(), data.clone());
            let path = format!("{FILES_DIR}/{exp:?}-{i}");
            let block = args.block_size.bytes();
            tokio::spawn(async move { write_file(&fs, &path, size, block, &data).await })
        })
        .collect();
    let mut latencies = Latencies::default();
    for t in tasks {
        latencies.push(t.await??);
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = process_cpu_secs() - cpu;
    let counters = scrape(fs).await?.since(&before);
    let bytes = files as u64 * size;
    let _ = fs.delete(FILES_DIR, true).await;
    replicas_gone(fs, replicas_before).await;
    Ok(Sample {
        mb_per_s: bytes as f64 / secs.max(1e-9) / 1e6,
        cpu_per_gib: cpu / (bytes as f64 / (1u64 << 30) as f64),
        latencies,
        counters,
    })
}

/// Waits (untimed, at most a minute) until the DataNodes have deleted as many replicas as
/// they finalized since `before`: the metadata service sends deletions with the DataNodes'
/// heartbeats, and unlinking gigabytes of replica files while the next experiment runs would
/// charge it for this one's clean-up (the floor removes its files before it returns).
async fn replicas_gone(fs: &FileSystem, before: (u64, u64)) {
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while Instant::now() < deadline {
        match replica_counts(fs).await {
            Ok((fin, del)) if del.saturating_sub(before.1) >= fin.saturating_sub(before.0) => {
                return;
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("bench: reading the DataNodes' replica counters: {e:#}");
                return;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!("bench: the DataNodes did not delete the experiment's replicas within 60 s");
}

/// The experiment's bytes without Sluice ([`floor::write`]): as many hops and files as the
/// cluster's replication, the client's packet size, fsync at the end when the DataNodes sync
/// on close, and every file's pages dropped behind per `write.buffer.size` when buffered
/// replicas drop theirs (`write.buffer.drop.behind`: the cheapest page-cache policy of the
/// data path, given to every file of the floor); its files under `dir`, removed afterwards.
async fn measure_floor(
    args: &WriteArgs,
    g: &Globals,
    exp: Experiment,
    dir: PathBuf,
) -> anyhow::Result<FloorSample> {
    let (files, size) = match exp {
        Experiment::Single => (1, args.single_size.bytes()),
        Experiment::Many => (args.writers, args.writer_size.bytes()),
    };
    let dn = &g.full.datanode;
    let chain = WriteChain {
        replicas: usize::from(match g.config.replication {
            0 => g.full.metadata.default_replication,
            r => r,
        })
        .min(args.datanodes),
        write_size: g.config.write_packet_size.as_usize(),
        sync: dn.sync_on_close,
        drop_behind: dn
            .write_buffer_drop_behind
            .then(|| dn.effective_write_buffer_size()),
    };
    let data = Arc::new(random_block(4 << 20));
    let s = tokio::task::spawn_blocking(move || floor::write(&dir, files, size, chain, data));
    Ok(s.await??)
}

/// Creates `path`, writes `size` bytes (copies of `data`) and closes it; returns the time.
async fn write_file(
    fs: &FileSystem,
    path: &str,
    size: u64,
    block: u64,
    data: &[u8],
) -> anyhow::Result<std::time::Duration> {
    let opts = WriteOptions {
        overwrite: true,
        create_parent: true,
        replication: None,
        block_size: Some(block),
    };
    let started = Instant::now();
    let mut w = fs.create(path, opts).await?;
    let mut left = size;
    while left > 0 {
        let n = left.min(data.len() as u64) as usize;
        w.write_all(&data[..n]).await?;
        left -= n as u64;
    }
    w.close().await?;
    Ok(started.elapsed())
}

/// Pseudo-random bytes (generated before the clock starts).
pub fn random_block(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(17).fill_bytes(&mut v);
    v
}

fn row(
    args: &WriteArgs,
    exp: Experiment,
    batching: &str,
    samples: Vec<Sample>,
    floor: &[FloorSample],
) -> Row {
    let experiment = match exp {
        Experiment::Single => format!("1 x {}", args.single_size),
        Experiment::Many => format!("{} x {}", args.writers, args.writer_size),
    };
    let mut lat = Latencies::default();
    let mut counters = WriteCounters::default();
    for s in &samples {
        lat.extend(s.latencies.clone());
    }
    if let Some(s) = samples.last() {
        counters = s.counters;
    }
    let mb_per_s = Spread::of(samples.iter().map(|s| s.mb_per_s));
    let cpu_secs_per_gib = Spread::of(samples.iter().map(|s| s.cpu_per_gib));
    Row {
        experiment,
        batching: batching.into(),
        vs_floor: VsFloor::new(mb_per_s.median, cpu_secs_per_gib.median, floor),
        mb_per_s,
        cpu_secs_per_gib,
        file_latency_p50_ms: lat.percentile_ms(50.0),
        file_latency_p99_ms: lat.percentile_ms(99.0),
        buffered_calls_per_mib: counters.buffered_calls_per_mib(),
        direct_calls_per_mib: counters.direct_calls_per_mib(),
        counters,
    }
}

fn print_report(r: &Report) {
    println!("sluice bench write — write-memory batching off vs on");
    println!("machine: {}", r.machine.line());
    println!("settings: {}", r.settings);
    println!();
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| {
            let [floor_mb, mb_x, floor_cpu, cpu_x] = row.vs_floor.cells();
            vec![
                row.experiment.clone(),
                row.batching.clone(),
                row.mb_per_s.show(1),
                floor_mb,
                mb_x,
                row.cpu_secs_per_gib.show(2),
                floor_cpu,
                cpu_x,
                format!("{:.0}", row.file_latency_p50_ms),
                format!("{:.0}", row.file_latency_p99_ms),
                opt(row.buffered_calls_per_mib, 2),
                opt(row.direct_calls_per_mib, 2),
                row.counters.buffer_flushes.to_string(),
                row.counters.fsyncs.to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "experiment",
            "batching",
            "MB/s median (min-max)",
            "floor MB/s",
            "x floor",
            "CPU s/GiB",
            "floor CPU",
            "x floor",
            "file p50 ms",
            "file p99 ms",
            "writes/MiB buffered",
            "writes/MiB direct",
            "flushes",
            "fsyncs",
        ],
        &rows,
    );
    println!();
    println!(
        "writes/MiB: write/pwrite calls on block files per MiB written, from the DataNodes' \
         counters (last run), on buffered replicas and on unbuffered ones. CPU: the whole \
         process (client and embedded cluster) per GiB of file data. floor: the same bytes \
         without Sluice in the same run (plain threads relaying the packets over one loopback \
         hop per replica, one file write per packet and replica, fdatasync at close as \
         configured; medians); x floor: Sluice / floor (MB/s: higher is better, CPU: lower)."
    );
    for n in &r.notes {
        println!("note: {n}");
    }
}
