//! The `sluice-datanode` command: runs one DataNode until SIGINT/SIGTERM, then stops
//! gracefully. Once its sockets are bound it prints a [`sluice_common::ready::Ready`] line to
//! stdout (logs go to stderr). The binary's `main` calls [`main`]; the process tests run it from
//! a test binary.
//!
//! Flags override the config file (`--config`, itself overridden by `SLUICE_DATANODE__...`
//! environment variables), which overrides the defaults.

use crate::DataNode;
use anyhow::Context as _;
use clap::Parser;
use sluice_common::config::{PathList, SluiceConfig};
use sluice_common::ready::Ready;
use std::ffi::OsString;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

/// Sluice DataNode: stores block replicas and serves the data-transfer protocol.
#[derive(Debug, Parser)]
#[command(name = "sluice-datanode", version)]
struct Args {
    /// Configuration file (TOML, `[datanode]` section).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Metadata service RPC address.
    #[arg(long, value_name = "HOST:PORT")]
    metadata: Option<String>,
    /// Data-transfer port (0: any free port).
    #[arg(long, value_name = "P")]
    port: Option<u16>,
    /// HTTP port (0: any free port).
    #[arg(long = "http-port", value_name = "H")]
    http_port: Option<u16>,
    /// Data directories, comma-separated.
    #[arg(long, value_name = "DIR[,DIR...]")]
    data: Option<String>,
    /// Address to bind.
    #[arg(long, value_name = "HOST")]
    bind: Option<String>,
    /// Host name or address to register with the metadata service (`@ip`: this machine's IP
    /// address, for containers).
    #[arg(long, value_name = "HOST")]
    advertise: Option<String>,
}

/// Parses `args` (the first is the program name), runs the DataNode until SIGINT or SIGTERM.
pub fn main<I>(args: I) -> anyhow::Result<()>
where
    I: IntoIterator,
    I::Item: Into<OsString> + Clone,
{
    let args = Args::parse_from(args);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let all = SluiceConfig::load(args.config.as_deref()).context("loading the configuration")?;
    // After the configuration: its `[log]` section says how to log.
    sluice_common::telemetry::init_with("info", &all.log);
    let mut cfg = all.datanode;
    if let Some(m) = args.metadata {
        cfg.metadata_address = m;
    }
    if let Some(p) = args.port {
        cfg.port = p;
    }
    if let Some(p) = args.http_port {
        cfg.http_port = p;
    }
    if let Some(d) = args.data {
        cfg.data_dirs = PathList::parse(&d);
    }
    if let Some(b) = args.bind {
        cfg.bind_host = b;
    }
    if let Some(a) = args.advertise {
        cfg.advertised_host = a;
    }
    cfg.validate().context("invalid configuration")?;
    let shutdown = CancellationToken::new();
    let dn = DataNode::start(cfg, shutdown.clone())
        .await
        .context("starting the DataNode")?;
    tracing::info!(
        node = %dn.node_id(),
        data = %dn.data_addr(),
        http = %dn.http_addr(),
        advertised = %dn.datanode_id().data_addr,
        "serving"
    );
    Ready::new("datanode")
        .node(dn.node_id())
        .address("data", dn.data_addr())
        .address("http", dn.http_addr())
        .announce()
        .context("writing the ready line to stdout")?;
    wait_for_signal().await;
    tracing::info!("stopping");
    shutdown.cancel();
    dn.wait().await;
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
