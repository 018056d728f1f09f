//! `sluice bench`: benchmarks that measure Sluice's two designs side by side, each on its own
//! embedded cluster (or, with `--metadata`, on an existing one). One module per benchmark:
//! [`read`] (streaming read), [`write`] and [`mixed`] (write-memory batching); [`report`] holds
//! what the write-path benchmarks measure and print; the helpers below start a cluster.

pub mod mixed;
pub mod read;
pub mod report;
pub mod write;

use crate::local::LocalCluster;
use crate::Globals;
use anyhow::Context as _;
use clap::Subcommand;
use sluice_client::{ClientConfig, FileSystem};
use sluice_common::config::DatanodeConfig;
use sluice_common::rpc::NodeState;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

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
}

impl BenchCommand {
    /// The command's name in error messages.
    pub fn name(&self) -> &'static str {
        match self {
            BenchCommand::Read(_) => "bench read",
            BenchCommand::Write(_) => "bench write",
            BenchCommand::Mixed(_) => "bench mixed",
        }
    }
}

/// Runs a benchmark.
pub async fn run(c: &BenchCommand, g: &Globals) -> anyhow::Result<ExitCode> {
    match c {
        BenchCommand::Read(args) => read::run(args, g).await,
        BenchCommand::Write(args) => write::run(args, g).await,
        BenchCommand::Mixed(args) => mixed::run(args, g).await,
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

/// Starts an embedded cluster of `datanodes` DataNodes configured as `dn` under `dir`, and
/// connects once every DataNode is live.
pub async fn embedded_cluster(
    dir: &Path,
    datanodes: usize,
    g: &Globals,
    dn: &DatanodeConfig,
) -> anyhow::Result<(LocalCluster, FileSystem)> {
    let cluster = LocalCluster::start(dir, datanodes, g.full.metadata.clone(), dn, 0, 0).await?;
    let cfg = ClientConfig {
        metadata_address: cluster.metadata.rpc_addr().to_string(),
        ..g.config.clone()
    };
    let fs = FileSystem::connect(cfg).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let report = fs.cluster_report().await?;
        let live = report
            .datanodes
            .iter()
            .filter(|d| d.state == NodeState::Live)
            .count();
        if live >= datanodes {
            return Ok((cluster, fs));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {live} DataNodes live after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
