//! `sluice local`: a whole cluster in one process — a metadata service and N DataNodes on this
//! machine, data under one directory — for trying Sluice out and for development. It runs until
//! Ctrl-C (or SIGTERM), then stops every node gracefully. Restarting it on the same directory
//! brings the namespace and the replicas back.
//!
//! The `[metadata]` and `[datanode]` sections of `--config` (and `SLUICE_METADATA__...`,
//! `SLUICE_DATANODE__...` variables) apply, except for the addresses and directories this
//! command sets: everything binds to 127.0.0.1, the metadata service on `--port` /
//! `--http-port`, DataNodes on free ports.

use crate::Globals;
use anyhow::Context as _;
use clap::Args;
use sluice_common::config::{DatanodeConfig, MetadataConfig, PathList};
use sluice_datanode::DataNode;
use sluice_metadata::MetadataServer;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

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

/// A running embedded cluster.
pub struct LocalCluster {
    /// The metadata service.
    pub metadata: MetadataServer,
    /// The DataNodes.
    pub datanodes: Vec<DataNode>,
    /// Cancelling it stops every node.
    pub shutdown: CancellationToken,
}

impl LocalCluster {
    /// Starts a metadata service and `datanodes` DataNodes under `data`, from the given base
    /// configurations (ports and directories are set here).
    pub async fn start(
        data: &Path,
        datanodes: usize,
        mut meta: MetadataConfig,
        dn_base: &DatanodeConfig,
        port: u16,
        http_port: u16,
    ) -> anyhow::Result<LocalCluster> {
        anyhow::ensure!(datanodes >= 1, "--datanodes must be at least 1");
        let shutdown = CancellationToken::new();
        meta.bind_host = "127.0.0.1".into();
        meta.rpc_port = port;
        meta.http_port = http_port;
        meta.data_dir = data.join("metadata");
        if usize::from(meta.default_replication) > datanodes {
            // A one- or two-node development cluster still accepts writes.
            meta.default_replication = datanodes as u16;
            meta.min_replication = meta.min_replication.min(meta.default_replication);
        }
        meta.validate()?;
        let metadata = MetadataServer::start(meta, shutdown.child_token())
            .await
            .context("starting the metadata service")?;
        let mut nodes = Vec::with_capacity(datanodes);
        for i in 0..datanodes {
            let cfg = DatanodeConfig {
                metadata_address: metadata.rpc_addr().to_string(),
                bind_host: "127.0.0.1".into(),
                port: 0,
                http_port: 0,
                advertised_host: String::new(),
                data_dirs: PathList(vec![data.join(format!("datanode-{i}"))]),
                ..dn_base.clone()
            };
            cfg.validate()?;
            let node = DataNode::start(cfg, shutdown.child_token())
                .await
                .with_context(|| format!("starting DataNode {i}"))?;
            nodes.push(node);
        }
        Ok(LocalCluster {
            metadata,
            datanodes: nodes,
            shutdown,
        })
    }

    /// Stops every node gracefully and waits for them.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for node in self.datanodes {
            node.wait().await;
        }
        self.metadata.wait().await;
    }
}

/// Runs `sluice local` until Ctrl-C.
pub async fn run(args: &LocalArgs, g: &Globals) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("creating {}", args.data.display()))?;
    let cluster = LocalCluster::start(
        &args.data,
        args.datanodes,
        g.full.metadata.clone(),
        &g.full.datanode,
        args.port,
        args.http_port,
    )
    .await?;
    let rpc = cluster.metadata.rpc_addr();
    println!("Sluice local cluster ready");
    println!("  metadata RPC   {rpc}    (sluice --metadata {rpc} ...)");
    println!(
        "  metadata HTTP  http://{}/status",
        cluster.metadata.http_addr()
    );
    for (i, dn) in cluster.datanodes.iter().enumerate() {
        println!(
            "  datanode {i}     {} (http {})  {}",
            dn.data_addr(),
            dn.http_addr(),
            dn.node_id()
        );
    }
    println!("  data           {}", args.data.display());
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
