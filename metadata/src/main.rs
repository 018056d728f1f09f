//! `sluice-metadata`: runs the metadata service until SIGINT or SIGTERM.

use anyhow::Context;
use clap::Parser;
use sluice_common::config::SluiceConfig;
use sluice_metadata::MetadataServer;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

/// Sluice metadata service. Flags override the config file, which overrides the defaults
/// (`SLUICE_METADATA__<KEY>` environment variables override the file).
#[derive(Debug, Parser)]
#[command(name = "sluice-metadata", version)]
struct Args {
    /// Configuration file (TOML, with a [metadata] section).
    #[arg(long)]
    config: Option<PathBuf>,
    /// RPC port (0: any free port).
    #[arg(long)]
    port: Option<u16>,
    /// HTTP port (0: any free port).
    #[arg(long = "http-port")]
    http_port: Option<u16>,
    /// Directory of the namespace store.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Address to bind to.
    #[arg(long)]
    bind: Option<String>,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    sluice_common::telemetry::init("info");
    let args = Args::parse();
    let mut cfg = SluiceConfig::load(args.config.as_deref())
        .context("loading the configuration")?
        .metadata;
    if let Some(p) = args.port {
        cfg.rpc_port = p;
    }
    if let Some(p) = args.http_port {
        cfg.http_port = p;
    }
    if let Some(d) = args.data {
        cfg.data_dir = d;
    }
    if let Some(b) = args.bind {
        cfg.bind_host = b;
    }
    let shutdown = CancellationToken::new();
    let server = MetadataServer::start(cfg, shutdown.clone()).await?;
    tracing::info!(rpc = %server.rpc_addr(), http = %server.http_addr(), "sluice-metadata listening");
    wait_for_signal().await?;
    tracing::info!("shutting down");
    shutdown.cancel();
    server.wait().await;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
        _ = term.recv() => {}
    }
    Ok(())
}
