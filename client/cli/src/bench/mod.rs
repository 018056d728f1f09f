//! `sluice bench`: benchmarks that measure Sluice's two designs side by side, each on its own
//! embedded cluster (or, with `--metadata`, on an existing one). One module per benchmark:
//! [`read`] (streaming read), [`write`] and [`mixed`] (write-memory batching), [`meta`]
//! (metadata-service throughput); [`disk_profile`] gives a benchmark's cluster the costs of a
//! hard disk (`--disk-profile hdd`, cgroup throttles, or `hdd-seek`, the `hddfs` seek model);
//! [`floor`] measures what the same bytes cost without Sluice (loopback hops and file writes or
//! reads by plain threads); [`report`] holds
//! what the write-path benchmarks measure and print; [`cache`] warms and evicts the page
//! cache of a cluster's replica files and describes the machine; the helpers below start a cluster.

pub mod cache;
pub mod disk_profile;
pub mod floor;
pub mod meta;
pub mod mixed;
pub mod read;
pub mod report;
pub mod write;

use crate::Globals;
use anyhow::Context as _;
use clap::Subcommand;
use sluice_client::{ClientConfig, FileSystem};
use sluice_cluster::EmbeddedCluster;
use sluice_common::config::DatanodeConfig;
use std::path::Path;
use std::process::ExitCode;

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Streaming read (ReadBlock, DataNode prefetch) against chunk read (ReadChunk): one
    /// thread and several, warm and cold page cache, prefetch on and off, with the loopback
    /// TCP ceiling.
    Read(read::ReadArgs),
    /// Write-memory batching off and on: one writer of a large file and many writers of
    /// small ones (fsync at close); MB/s, CPU, and block-file write calls per MiB on buffered
    /// and unbuffered replicas.
    Write(write::WriteArgs),
    /// Writers of 128 MiB files and readers re-reading existing files (80 % of the bytes read)
    /// for a fixed time, batching off, last replica only, all replicas: MB/s and latencies.
    Mixed(mixed::MixedArgs),
    /// Metadata-service throughput (HDFS NNThroughputBenchmark): 1, 8 and 64 client tasks
    /// doing mkdirs, create+close of empty files, stat, open (get_block_locations), rename and
    /// delete, then stat latency under a create storm; ops/s and p50/p99 per operation, with
    /// group commit on (and off, to compare).
    Meta(meta::MetaArgs),
}

impl BenchCommand {
    /// The command's name in error messages.
    pub fn name(&self) -> &'static str {
        match self {
            BenchCommand::Read(_) => "bench read",
            BenchCommand::Write(_) => "bench write",
            BenchCommand::Mixed(_) => "bench mixed",
            BenchCommand::Meta(_) => "bench meta",
        }
    }
}

/// Runs a benchmark.
pub async fn run(c: &BenchCommand, g: &Globals) -> anyhow::Result<ExitCode> {
    match c {
        BenchCommand::Read(args) => read::run(args, g).await,
        BenchCommand::Write(args) => write::run(args, g).await,
        BenchCommand::Mixed(args) => mixed::run(args, g).await,
        BenchCommand::Meta(args) => meta::run(args, g).await,
    }
}

/// Write-memory batching as a write-path benchmark configures the DataNodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Batching {
    /// `write.memory.buffer.enabled = false`: every replica written packet by packet.
    Off,
    /// Batching on the last DataNode of each pipeline only (Sluice's default).
    Last,
    /// Batching on every replica (`last-replica-only = false`).
    All,
}

impl Batching {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Batching::Off => "off",
            Batching::Last => "last-replica",
            Batching::All => "all-replicas",
        }
    }

    /// `dn` with this configuration.
    pub fn apply(self, dn: &DatanodeConfig) -> DatanodeConfig {
        DatanodeConfig {
            write_buffer_enabled: self != Batching::Off,
            write_buffer_last_replica_only: self != Batching::All,
            ..dn.clone()
        }
    }
}

/// Creates `dir`, which must be absent or empty (a benchmark removes what it creates).
pub fn fresh_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        anyhow::bail!(
            "{} is not empty: choose another --dir or remove it",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Starts an embedded cluster of `datanodes` DataNodes configured as `dn` under `dir` (see
/// [`crate::local::start_cluster`]) on the runtime `on` says ([`BenchCluster`]) and connects
/// to it once every DataNode is live.
pub async fn embedded_cluster(
    dir: &Path,
    datanodes: usize,
    g: &Globals,
    dn: &DatanodeConfig,
    on: ClusterRuntime,
) -> anyhow::Result<(BenchCluster, FileSystem)> {
    let (meta, dir, dn) = (g.full.metadata.clone(), dir.to_path_buf(), dn.clone());
    let start = async move { crate::local::start_cluster(&dir, datanodes, meta, &dn, 0, 0).await };
    let mut cluster = BenchCluster {
        cluster: None,
        rt: None,
    };
    cluster.cluster = Some(match on {
        ClusterRuntime::Shared => start.await?,
        ClusterRuntime::Own => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("sluice-cluster")
                .build()
                .context("starting the cluster's runtime")?;
            let started = rt.spawn(start);
            cluster.rt = Some(rt);
            started.await.context("the cluster's runtime")??
        }
    });
    let cfg = ClientConfig {
        metadata_address: cluster.metadata_addr().to_string(),
        ..g.config.clone()
    };
    let fs = FileSystem::connect(cfg).await?;
    Ok((cluster, fs))
}

/// Where a benchmark's embedded cluster runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterRuntime {
    /// On the command's runtime, beside the benchmark's client (`bench write`, `mixed`,
    /// `meta`).
    Shared,
    /// On a tokio runtime of its own (threads `sluice-cluster`, one worker per core), as a
    /// deployed client never shares one with the DataNodes it reads from (`bench read`).
    ///
    /// On a shared runtime a DataNode's sending task and the client's receiving task woke each
    /// other on one worker (tokio runs a task woken from a worker next on that same worker),
    /// so on two cores they often ran in turn instead of side by side. For one warm stream the
    /// own runtime measured 2,235–3,915 MB/s (median 3,003) against 1,772–3,961 (2,854) over
    /// three alternated pairs of `bench read --threads 1`; for `bench write` it measured no
    /// better (32 × 8 MiB 272–337 MB/s against 345–358, two pairs), so the write benchmarks
    /// keep sharing. See docs/benchmarks.md, "Tenth round".
    Own,
}

/// A benchmark's embedded cluster, and its own runtime if it has one ([`ClusterRuntime`]).
pub struct BenchCluster {
    cluster: Option<EmbeddedCluster>,
    rt: Option<tokio::runtime::Runtime>,
}

impl BenchCluster {
    /// The metadata service's RPC address.
    pub fn metadata_addr(&self) -> std::net::SocketAddr {
        match &self.cluster {
            Some(c) => c.metadata_addr(),
            None => std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }

    /// Stops every node (on the cluster's own runtime, if it has one), then that runtime.
    pub async fn stop(mut self) {
        match (self.cluster.take(), self.rt.as_ref()) {
            (Some(cluster), Some(rt)) => drop(rt.spawn(cluster.stop()).await),
            (Some(cluster), None) => cluster.stop().await,
            (None, _) => {}
        }
    }
}

impl Drop for BenchCluster {
    fn drop(&mut self) {
        // Not `drop(rt)`: that waits for the runtime's blocking threads, which must not
        // happen on a runtime thread of the caller. Nodes not stopped are dropped with it.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_common::config::SluiceConfig;
    use std::time::{Duration, Instant};
    use tokio::io::AsyncWriteExt;

    /// The threads of this process named `name`, and the CPU ticks (user + system) they used.
    fn threads_named(name: &str) -> (usize, u64) {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return (0, 0);
        };
        let stats = tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok());
        // `pid (comm) state ...`: utime and stime are the 12th and 13th fields after `comm`.
        let ours = stats.filter_map(|st| {
            let (head, rest) = st.rsplit_once(") ")?;
            let comm = head.split_once(" (")?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
            (comm == name).then_some(ticks)
        });
        ours.fold((0, 0), |(n, t), ticks| (n + 1, t + ticks))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster_on_its_own_runtime_runs_on_its_own_threads_until_stopped() {
        let tmp = tempfile::tempdir().unwrap();
        let g = Globals {
            config: ClientConfig::default(),
            full: SluiceConfig::default(),
            metadata_given: false,
        };
        let limit = Duration::from_secs(60);
        for on in [ClusterRuntime::Shared, ClusterRuntime::Own] {
            let dir = tmp.path().join(format!("{on:?}"));
            let start = embedded_cluster(&dir, 1, &g, &g.full.datanode, on);
            let (cluster, fs) = tokio::time::timeout(limit, start).await.unwrap().unwrap();
            let (threads, before) = threads_named("sluice-cluster");
            assert_eq!(
                threads > 0,
                on == ClusterRuntime::Own,
                "{on:?}: {threads} threads"
            );
            // The cluster serves 32 MiB written and read back, and does that work on its own
            // threads: they used CPU time meanwhile (the DataNode checks, writes and sends).
            let data: Vec<u8> = (0..32u32 << 20).map(|i| (i % 251) as u8).collect();
            let mut w = fs.create("/f", Default::default()).await.unwrap();
            w.write_all(&data).await.unwrap();
            w.close().await.unwrap();
            let mut r = fs.open("/f").await.unwrap();
            let mut got = Vec::new();
            loop {
                let b = r.read_bytes(4 << 20).await.unwrap();
                if b.is_empty() {
                    break;
                }
                got.extend_from_slice(&b);
            }
            assert!(got == data, "{on:?}: the bytes read back differ");
            let used = threads_named("sluice-cluster").1 - before;
            assert_eq!(used > 0, on == ClusterRuntime::Own, "{on:?}: {used} ticks");
            drop((r, fs));
            tokio::time::timeout(limit, cluster.stop()).await.unwrap();
            let deadline = Instant::now() + limit;
            while threads_named("sluice-cluster").0 > 0 {
                assert!(
                    Instant::now() < deadline,
                    "{on:?}: the runtime's threads stayed"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
