//! The `sluice-metadata` command: runs the metadata service until SIGINT or SIGTERM. Once its
//! sockets are bound it prints a [`sluice_common::ready::Ready`] line to stdout (logs go to
//! stderr). The binary's `main` calls [`main`]; the process tests run it from a test binary.

use crate::MetadataServer;
use anyhow::Context;
use clap::Parser;
use sluice_common::config::SluiceConfig;
use sluice_common::ready::Ready;
use std::ffi::OsString;
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

/// Parses `args` (the first is the program name), runs the service until SIGINT or SIGTERM.
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
    let mut cfg = all.metadata;
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
    Ready::new("metadata")
        .address("rpc", server.rpc_addr())
        .address("http", server.http_addr())
        .announce()
        .context("writing the ready line to stdout")?;
    tokio::select! {
        r = wait_for_signal() => r?,
        // A failed flush stops the service (see docs/metadata.md, "Durability").
        _ = shutdown.cancelled() => {}
    }
    tracing::info!("shutting down");
    shutdown.cancel();
    let failed = server.failed();
    server.wait().await;
    if failed {
        anyhow::bail!("a metadata store flush failed: the service stopped (restart to recover)");
    }
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
