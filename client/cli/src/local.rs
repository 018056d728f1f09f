//! `sluice local`: a whole cluster in one process — a metadata service and N DataNodes on this
//! machine, data under one directory — for trying Sluice out and for development. It runs until
//! Ctrl-C (or SIGTERM), then stops every node gracefully. Restarting it on the same directory
//! brings the namespace and the replicas back.
//!
//! The `[metadata]` and `[datanode]` sections of `--config` (and `SLUICE_METADATA__...`,
//! `SLUICE_DATANODE__...` variables) apply, except for the addresses and directories this
//! command sets: everything binds to 127.0.0.1, the metadata service on `--port` /
//! `--http-port`, DataNodes on free ports. Once ready it prints, after the human-readable
//! summary, one JSON ready line (`common::ready`): `{"ready":"local","addresses":{"rpc":...,
//! "http":...,"datanode-<i>-http":...}}`, for scripts that start it with `--port 0`.

use crate::Globals;
use anyhow::Context as _;
use clap::Args;
use sluice_cluster::{ClusterBuilder, EmbeddedCluster};
use sluice_common::config::{DatanodeConfig, MetadataConfig, PathList};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Options of `sluice local`.
#[derive(Debug, Args)]
pub struct LocalArgs {
    /// Directory holding the metadata store and every DataNode's volumes.
    #[arg(long, default_value = "./sluice-data", value_name = "DIR")]
    pub data: PathBuf,
    /// Number of DataNodes.
    #[arg(long, default_value_t = 3)]
    pub datanodes: usize,
    /// Metadata RPC port (0: any free port).
    #[arg(long, default_value_t = 8020)]
    pub port: u16,
    /// Metadata HTTP port (0: any free port).
    #[arg(long, default_value_t = 9870)]
    pub http_port: u16,
}

/// Starts an embedded cluster ([`sluice_cluster`]) of `datanodes` DataNodes under `data`: the
/// metadata store in `data/metadata`, DataNode `i` in `data/datanode-<i>`, everything on
/// 127.0.0.1, the metadata service on `port` / `http_port` (0: any free port), DataNodes on
/// free ports; the rest from `meta` and `dn_base`. Returns once every DataNode is live.
pub async fn start_cluster(
    data: &Path,
    datanodes: usize,
    mut meta: MetadataConfig,
    dn_base: &DatanodeConfig,
    port: u16,
    http_port: u16,
) -> anyhow::Result<EmbeddedCluster> {
    anyhow::ensure!(datanodes >= 1, "--datanodes must be at least 1");
    meta.bind_host = "127.0.0.1".into();
    meta.rpc_port = port;
    meta.http_port = http_port;
    meta.data_dir = data.join("metadata");
    if usize::from(meta.default_replication) > datanodes {
        // A one- or two-node development cluster still accepts writes.
        meta.default_replication = datanodes as u16;
        meta.min_replication = meta.min_replication.min(meta.default_replication);
    }
    let nodes = (0..datanodes).map(|i| DatanodeConfig {
        bind_host: "127.0.0.1".into(),
        port: 0,
        http_port: 0,
        advertised_host: String::new(),
        data_dirs: PathList(vec![data.join(format!("datanode-{i}"))]),
        ..dn_base.clone()
    });
    Ok(ClusterBuilder::new(meta).datanodes(nodes).start().await?)
}

/// Runs `sluice local` until Ctrl-C.
pub async fn run(args: &LocalArgs, g: &Globals) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("creating {}", args.data.display()))?;
    let cluster = start_cluster(
        &args.data,
        args.datanodes,
        g.full.metadata.clone(),
        &g.full.datanode,
        args.port,
        args.http_port,
    )
    .await?;
    let rpc = cluster.metadata_addr();
    println!("Sluice local cluster ready");
    println!("  metadata RPC   {rpc}    (sluice --metadata {rpc} ...)");
    if let Some(m) = cluster.metadata() {
        println!("  metadata HTTP  http://{}/status", m.http_addr());
    }
    for (i, dn) in cluster.running_datanodes() {
        println!(
            "  datanode {i}     {} (http {})  {}",
            dn.data_addr(),
            dn.http_addr(),
            dn.node_id()
        );
    }
    println!("  data           {}", args.data.display());
    // One machine-readable line for scripts that start it on port 0 (common::ready).
    let mut ready = sluice_common::ready::Ready::new("local").address("rpc", rpc);
    if let Some(m) = cluster.metadata() {
        ready = ready.address("http", m.http_addr());
    }
    for (i, dn) in cluster.running_datanodes() {
        ready = ready.address(&format!("datanode-{i}-http"), dn.http_addr());
    }
    ready.announce().context("writing the ready line")?;
    println!("Press Ctrl-C to stop.");
    wait_for_signal().await;
    println!("Stopping...");
    cluster.stop().await;
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
