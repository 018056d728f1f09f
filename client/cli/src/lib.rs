//! `sluice`: the command line of a Sluice cluster (like `hdfs dfs` and `hdfs dfsadmin`).
//!
//! The commands come in groups, one module each: [`dfs`] (files and directories) and
//! [`admin`] (fsck, cluster report). A new group (e.g. `local`, `bench`) is a new module with
//! its own `Subcommand` enum, flattened into [`Command`], plus one arm in [`run`].
//!
//! Errors are printed as one line, `sluice: <command>: <error>`, with exit code 1.
//!
//! The `sluice` binary's `main` calls [`main`]; the process tests run it from a test binary.

#![allow(clippy::print_stdout)] // a command line prints its results

mod admin;
mod bench;
mod dfs;
mod format;
mod hddfs;
mod health;
mod local;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use sluice_client::{ClientConfig, FileSystem};
use sluice_common::config::SluiceConfig;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// Command line of a Sluice cluster.
#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "Sluice replicated block store: files, admin"
)]
struct Cli {
    /// Metadata service RPC address (default: the config file's `client.metadata.address`,
    /// else 127.0.0.1:8020).
    #[arg(long, global = true, env = "SLUICE_METADATA", value_name = "HOST:PORT")]
    metadata: Option<String>,
    /// Configuration file (its `[client]` section is used); `SLUICE_CLIENT__<KEY>` variables
    /// override it.
    #[arg(long, global = true, env = "SLUICE_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// Every command, grouped by module.
#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Dfs(dfs::DfsCommand),
    #[command(flatten)]
    Admin(admin::AdminCommand),
    /// Run a metadata service and DataNodes in this process (a development cluster).
    Local(local::LocalArgs),
    /// Benchmarks, on an embedded cluster (or the one at --metadata).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Probe a service's HTTP endpoint; exit 0 if healthy, 1 if not (container healthchecks).
    Health(health::HealthArgs),
    /// The seeking-disk model of `bench --disk-profile hdd-seek` (a FUSE daemon the
    /// benchmark starts; docs/benchmarks.md).
    #[command(hide = true)]
    Hddfs(hddfs::HddfsArgs),
}

impl Command {
    fn name(&self) -> &'static str {
        match self {
            Command::Dfs(c) => c.name(),
            Command::Admin(c) => c.name(),
            Command::Local(_) => "local",
            Command::Bench(c) => c.name(),
            Command::Health(_) => "health",
            Command::Hddfs(_) => "hddfs",
        }
    }
}

/// What every command may use: the configuration and a way to connect.
pub struct Globals {
    /// The client configuration (file, environment, then `--metadata`).
    pub config: ClientConfig,
    /// The whole configuration (file and environment), for commands that run services.
    pub full: SluiceConfig,
    /// True when `--metadata` (or `SLUICE_METADATA`) named a cluster on the command line.
    pub metadata_given: bool,
}

impl Globals {
    fn load(cli: &Cli) -> anyhow::Result<Globals> {
        let all = SluiceConfig::load(cli.config.as_deref()).context("loading the configuration")?;
        let mut config = all.client.clone();
        if let Some(addr) = &cli.metadata {
            config.metadata_address = addr.clone();
        }
        Ok(Globals {
            config,
            full: all,
            metadata_given: cli.metadata.is_some(),
        })
    }

    /// Connects to the metadata service.
    pub async fn connect(&self) -> anyhow::Result<FileSystem> {
        Ok(FileSystem::connect(self.config.clone()).await?)
    }
}

async fn run(cli: &Cli) -> anyhow::Result<ExitCode> {
    // A probe needs no configuration: a broken config must not make a healthy service look sick.
    if let Command::Health(args) = &cli.command {
        return health::run(args).await;
    }
    let globals = Globals::load(cli)?;
    match &cli.command {
        Command::Dfs(c) => dfs::run(c, &globals).await,
        Command::Admin(c) => admin::run(c, &globals).await,
        Command::Local(args) => local::run(args, &globals).await,
        Command::Bench(c) => bench::run(c, &globals).await,
        Command::Health(_) => Ok(ExitCode::SUCCESS), // answered above
        Command::Hddfs(_) => anyhow::bail!("hddfs runs outside the runtime"), // see main
    }
}

/// The error and its causes on one line, skipping causes its message already shows.
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.replace('\n', " ")
}

/// Parses `args` (the first is the program name) and runs the command.
pub fn main<I>(args: I) -> ExitCode
where
    I: IntoIterator,
    I::Item: Into<OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    // Only errors by default, so that a failure is one line on stderr; RUST_LOG shows more.
    // `local` runs services, whose start-up and warnings an operator wants to see.
    let default_level = if matches!(cli.command, Command::Local(_)) {
        "info"
    } else {
        "error"
    };
    // The `[log]` section of the configuration (a broken file is reported by the command
    // itself, or ignored by `health`, which needs none).
    let log = SluiceConfig::load(cli.config.as_deref())
        .map(|c| c.log)
        .unwrap_or_default();
    sluice_common::telemetry::init_with(default_level, &log);
    // The disk model's daemon blocks on its FUSE session: no runtime of ours around it.
    if let Command::Hddfs(args) = &cli.command {
        return hddfs::run(args).unwrap_or_else(|e| {
            eprintln!("sluice: hddfs: {}", one_line(&e));
            ExitCode::FAILURE
        });
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(run(&cli));
    // A read of stdin blocks a runtime thread until input comes; an interrupted `put -` must
    // not wait for it.
    rt.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sluice: {}: {}", cli.command.name(), one_line(&e));
            ExitCode::FAILURE
        }
    }
}
