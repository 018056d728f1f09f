//! `sluice bench`: benchmarks that measure Sluice's two designs side by side, each on its own
//! embedded cluster (or, with `--metadata`, on an existing one). One module per benchmark.

pub mod read;

use crate::Globals;
use clap::Subcommand;
use std::process::ExitCode;

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Streaming read (ReadBlock, DataNode prefetch) against chunk read (ReadChunk): one
    /// thread and several, warm and cold page cache, prefetch on and off, with the loopback
    /// TCP ceiling.
    Read(read::ReadArgs),
}

impl BenchCommand {
    /// The command's name in error messages.
    pub fn name(&self) -> &'static str {
        match self {
            BenchCommand::Read(_) => "bench read",
        }
    }
}

/// Runs a benchmark.
pub async fn run(c: &BenchCommand, g: &Globals) -> anyhow::Result<ExitCode> {
    match c {
        BenchCommand::Read(args) => read::run(args, g).await,
    }
}
