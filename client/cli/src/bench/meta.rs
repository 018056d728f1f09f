//! `sluice bench meta`: metadata-service throughput, after HDFS's NNThroughputBenchmark.
//!
//! For every `--tasks` count (1, 8, 64), that many client tasks (sharing `--connections`
//! connections) run each operation in turn, `--ops` operations per phase split evenly over
//! the tasks (a phase stops issuing new operations after `--phase-limit`):
//! - `mkdirs` of new directories;
//! - `create` + `close` of an empty file (one operation: acknowledged only once durable);
//! - `stat` and `open` (`get_block_locations`) of those files;
//! - `rename` of each file, then `delete` of each renamed file;
//! - then a create storm: the tasks create files for `--storm` while one more task stats a
//!   path over and over; the stat latencies are the reads' cost under writes.
//!
//! Reported per phase: operations, ops/s, p50 and p99 latency. Each `--group-commit` setting
//! (on, off: the metadata service's `store.group-commit`) gets a fresh embedded cluster under
//! `--dir` (removed unless `--keep`); with the global `--metadata` the benchmark runs once
//! against that cluster as it is configured, under `/bench/meta` (removed afterwards).

use super::report::{print_table, Latencies, Machine};
use super::{embedded_cluster, fresh_dir, ClusterRuntime};
use crate::Globals;
use anyhow::Context as _;
use clap::Args;
use serde::Serialize;
use sluice_client::{FileSystem, WriteOptions};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `sluice bench meta`.
#[derive(Debug, Args)]
pub struct MetaArgs {
    /// Directory for the benchmark's clusters; must be absent or empty. Removed afterwards
    /// unless --keep.
    #[arg(long, default_value = "./sluice-bench-meta", value_name = "DIR")]
    pub dir: PathBuf,
    /// Client task counts to run, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub tasks: Vec<usize>,
    /// Operations per phase, split evenly over the tasks.
    #[arg(long, default_value_t = 20_000)]
    pub ops: usize,
    /// A phase issues no new operation after this long.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub phase_limit: Duration,
    /// Length of the create storm during which stat latencies are measured.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub storm: Duration,
    /// Client connections the tasks share (task i uses connection i mod this).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Group commit settings of the metadata service to compare (on, off).
    #[arg(long, value_delimiter = ',', default_value = "on")]
    pub group_commit: Vec<Switch>,
    /// DataNodes of each embedded cluster.
    #[arg(long, default_value_t = 1)]
    pub datanodes: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Keep the cluster directories.
    #[arg(long)]
    pub keep: bool,
}

/// A setting that is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

impl Switch {
    fn name(self) -> &'static str {
        match self {
            Switch::On => "on",
            Switch::Off => "off",
        }
    }
}

/// One phase of one task count.
#[derive(Debug, Clone, Serialize)]
struct Row {
    group_commit: String,
    tasks: usize,
    op: &'static str,
    ops: usize,
    secs: f64,
    ops_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    machine: Machine,
    settings: String,
    rows: Vec<Row>,
    notes: Vec<String>,
}

/// What one phase measured.
struct Sample {
    ops: usize,
    secs: f64,
    lat: Latencies,
}

/// Root of the benchmark's namespace.
const ROOT: &str = "/bench/meta";

/// Runs `sluice bench meta`.
pub async fn run(args: &MetaArgs, g: &Globals) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !args.tasks.is_empty() && args.tasks.iter().all(|&t| t >= 1),
        "--tasks must name counts of at least 1"
    );
    anyhow::ensure!(args.connections >= 1, "--connections must be at least 1");
    anyhow::ensure!(
        !args.group_commit.is_empty(),
        "--group-commit names no setting"
    );
    if !g.metadata_given {
        // Before the machine is probed: it describes the disk under the directory.
        fresh_dir(&args.dir)?;
    }
    let mut report = Report {
        machine: Machine::probe(if g.metadata_given {
            Path::new(".")
        } else {
            &args.dir
        }),
        settings: format!(
            "{} ops per phase (at most {:?}), create storm {:?}, {} connection(s), {} DataNode(s)",
            args.ops, args.phase_limit, args.storm, args.connections, args.datanodes
        ),
        rows: Vec::new(),
        notes: Vec::new(),
    };
    if g.metadata_given {
        report.machine.disk = "remote cluster (the client's machine is described)".into();
        report
            .notes
            .push("an existing cluster (--metadata): measured as it is configured".into());
        let conns = connect(g, args.connections, &g.config.metadata_address).await?;
        let r = every_task_count(args, &conns, "as configured", &mut report.rows).await;
        let _ = conns[0].delete(ROOT, true).await;
        r?;
    } else {
        let r = embedded(args, g, &mut report.rows).await;
        if !args.keep {
            let _ = std::fs::remove_dir_all(&args.dir);
        }
        r?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(ExitCode::SUCCESS)
}

async fn embedded(args: &MetaArgs, g: &Globals, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    for setting in &args.group_commit {
        let dir = args.dir.join(format!("group-commit-{}", setting.name()));
        std::fs::create_dir_all(&dir)?;
        let mut g2 = Globals {
            config: g.config.clone(),
            full: g.full.clone(),
            metadata_given: false,
        };
        g2.full.metadata.group_commit = *setting == Switch::On;
        let (cluster, _fs) = embedded_cluster(
            &dir,
            args.datanodes,
            &g2,
            &g.full.datanode,
            ClusterRuntime::Shared,
        )
        .await?;
        let addr = cluster.metadata_addr().to_string();
        let r = match connect(g, args.connections, &addr).await {
            Ok(conns) => every_task_count(args, &conns, setting.name(), rows).await,
            Err(e) => Err(e),
        };
        cluster.stop().await;
        if !args.keep {
            let _ = std::fs::remove_dir_all(&dir);
        }
        r?;
    }
    Ok(())
}

async fn connect(g: &Globals, n: usize, addr: &str) -> anyhow::Result<Vec<FileSystem>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let cfg = sluice_client::ClientConfig {
            metadata_address: addr.to_string(),
            ..g.config.clone()
        };
        conns.push(FileSystem::connect(cfg).await?);
    }
    Ok(conns)
}

async fn every_task_count(
    args: &MetaArgs,
    conns: &[FileSystem],
    setting: &str,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    for &tasks in &args.tasks {
        for (op, s) in task_count(args, conns, tasks).await? {
            rows.push(Row {
                group_commit: setting.to_string(),
                tasks,
                op,
                ops: s.ops,
                secs: s.secs,
                ops_per_s: if s.secs > 0.0 {
                    s.ops as f64 / s.secs
                } else {
                    0.0
                },
                p50_ms: s.lat.percentile_ms(50.0),
                p99_ms: s.lat.percentile_ms(99.0),
            });
        }
    }
    Ok(())
}

/// Every phase with `tasks` tasks, under `ROOT/t<tasks>`.
async fn task_count(
    args: &MetaArgs,
    conns: &[FileSystem],
    tasks: usize,
) -> anyhow::Result<Vec<(&'static str, Sample)>> {
    let base = format!("{ROOT}/t{tasks}");
    let fs = &conns[0];
    for sub in ["dirs", "files", "renamed", "storm"] {
        for i in 0..tasks {
            fs.mkdirs(&format!("{base}/{sub}/{i}"), true).await?;
        }
    }
    let all = vec![args.ops.div_ceil(tasks).max(1); tasks];
    let limit = args.phase_limit;
    let mut out = Vec::new();
    let b = base.clone();
    let (s, _) = phase(conns, &all, limit, move |fs, i, j| {
        let p = format!("{b}/dirs/{i}/{j}");
        async move { fs.mkdirs(&p, false).await.map_err(Into::into) }
    })
    .await?;
    out.push(("mkdirs", s));
    let b = base.clone();
    let (s, created) = phase(conns, &all, limit, move |fs, i, j| {
        let p = format!("{b}/files/{i}/{j}");
        async move { create_empty(&fs, &p).await }
    })
    .await?;
    out.push(("create+close", s));
    // The later phases use the files each task created (a phase may have stopped early).
    let c = Arc::new(created.clone());
    for op in ["stat", "open"] {
        let (b, c) = (base.clone(), c.clone());
        let (s, _) = phase(conns, &all, limit, move |fs, i, j| {
            let p = format!("{b}/files/{i}/{}", j % c[i].max(1));
            async move {
                match op {
                    "stat" => fs.stat(&p).await.map(|_| ())?,
                    _ => fs.get_block_locations(&p).await.map(|_| ())?,
                }
                Ok(())
            }
        })
        .await?;
        out.push((op, s));
    }
    let b = base.clone();
    let (s, renamed) = phase(conns, &created, limit, move |fs, i, j| {
        let (from, to) = (format!("{b}/files/{i}/{j}"), format!("{b}/renamed/{i}/{j}"));
        async move { fs.rename(&from, &to).await.map_err(Into::into) }
    })
    .await?;
    out.push(("rename", s));
    let b = base.clone();
    let (s, _) = phase(conns, &renamed, limit, move |fs, i, j| {
        let p = format!("{b}/renamed/{i}/{j}");
        async move {
            fs.delete(&p, false).await?;
            Ok(())
        }
    })
    .await?;
    out.push(("delete", s));
    let (stats, creates) = storm(conns, tasks, &base, args.storm).await?;
    out.push(("stat under create storm", stats));
    out.push(("create+close (storm)", creates));
    fs.delete(&base, true).await?;
    Ok(out)
}

/// Creates and closes an empty file.
async fn create_empty(fs: &FileSystem, path: &str) -> anyhow::Result<()> {
    let mut w = fs.create(path, WriteOptions::default()).await?;
    w.close().await?;
    Ok(())
}

/// Runs `op(fs, i, j)` for j in 0..counts[i] in task i, one task per entry of `counts`, none
/// started after `limit`. Returns the sample and how many each task completed; the first
/// failed operation fails the phase.
async fn phase<F, Fut>(
    conns: &[FileSystem],
    counts: &[usize],
    limit: Duration,
    op: F,
) -> anyhow::Result<(Sample, Vec<usize>)>
where
    F: Fn(FileSystem, usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let start = Instant::now();
    let deadline = start + limit;
    let handles: Vec<_> = counts
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let (fs, op) = (conns[i % conns.len()].clone(), op.clone());
            tokio::spawn(async move {
                let mut lat = Latencies::default();
                for j in 0..n {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let t = Instant::now();
                    op(fs.clone(), i, j).await?;
                    lat.push(t.elapsed());
                }
                anyhow::Ok(lat)
            })
        })
        .collect();
    let mut lat = Latencies::default();
    let mut done = Vec::with_capacity(counts.len());
    for h in handles {
        let l = h.await.context("a benchmark task panicked")??;
        done.push(l.len());
        lat.extend(l);
    }
    let secs = start.elapsed().as_secs_f64();
    let ops = done.iter().sum();
    Ok((Sample { ops, secs, lat }, done))
}

/// `tasks` tasks create files for `length` while one more stats a directory over and over.
async fn storm(
    conns: &[FileSystem],
    tasks: usize,
    base: &str,
    length: Duration,
) -> anyhow::Result<(Sample, Sample)> {
    let start = Instant::now();
    let deadline = start + length;
    let creators: Vec<_> = (0..tasks)
        .map(|i| {
            let fs = conns[i % conns.len()].clone();
            let dir = format!("{base}/storm/{i}");
            tokio::spawn(async move {
                let mut lat = Latencies::default();
                let mut j = 0;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    create_empty(&fs, &format!("{dir}/{j}")).await?;
                    lat.push(t.elapsed());
                    j += 1;
                }
                anyhow::Ok(lat)
            })
        })
        .collect();
    // The prober has a connection of its own, as a separate client would.
    let prober = conns[tasks % conns.len()].clone();
    let target = format!("{base}/dirs/0");
    let mut stat_lat = Latencies::default();
    while Instant::now() < deadline {
        let t = Instant::now();
        prober.stat(&target).await?;
        stat_lat.push(t.elapsed());
    }
    let stat_secs = start.elapsed().as_secs_f64();
    let mut create_lat = Latencies::default();
    for c in creators {
        create_lat.extend(c.await.context("a benchmark task panicked")??);
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((
        Sample {
            ops: stat_lat.len(),
            secs: stat_secs,
            lat: stat_lat,
        },
        Sample {
            ops: create_lat.len(),
            secs,
            lat: create_lat,
        },
    ))
}

fn print_report(r: &Report) {
    println!("sluice bench meta: {}", r.machine.line());
    println!("{}", r.settings);
    println!();
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| {
            vec![
                row.group_commit.clone(),
                row.tasks.to_string(),
                row.op.to_string(),
                row.ops.to_string(),
                format!("{:.0}", row.ops_per_s),
                format!("{:.2}", row.p50_ms),
                format!("{:.2}", row.p99_ms),
            ]
        })
        .collect();
    print_table(
        &[
            "group commit",
            "tasks",
            "op",
            "ops",
            "ops/s",
            "p50 ms",
            "p99 ms",
        ],
        &rows,
    );
    for n in &r.notes {
        println!("note: {n}");
    }
}
