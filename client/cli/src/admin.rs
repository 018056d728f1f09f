//! Administration commands: `fsck` (like `hdfs fsck PATH -files -blocks -locations`) and
//! `report` (like `hdfs dfsadmin -report`).

use crate::format;
use crate::Globals;
use clap::Subcommand;
use sluice_client::{ClusterReport, FsckReport, Health};
use sluice_common::config::units::human_bytes;
use sluice_common::rpc::{FsckFile, NodeState};
use std::process::ExitCode;

/// Administration commands.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Check the blocks of every file at or under a path. Exit code 1 when the verdict is
    /// CORRUPT or MISSING.
    Fsck {
        /// Path.
        #[arg(default_value = "/")]
        path: String,
        /// Print the report as JSON (the `FsckReport` structure; a stable interface).
        #[arg(long)]
        json: bool,
    },
    /// Show the cluster's DataNodes and block totals.
    Report {
        /// Print the report as JSON (the `ClusterReport` structure).
        #[arg(long)]
        json: bool,
    },
}

impl AdminCommand {
    /// The command's name, for error lines.
    pub fn name(&self) -> &'static str {
        match self {
            AdminCommand::Fsck { .. } => "fsck",
            AdminCommand::Report { .. } => "report",
        }
    }
}

/// Runs an administration command.
pub async fn run(cmd: &AdminCommand, g: &Globals) -> anyhow::Result<ExitCode> {
    let fs = g.connect().await?;
    match cmd {
        AdminCommand::Fsck { path, json } => {
            let report = fs.fsck(path).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_fsck(&report);
            }
            Ok(match report.health {
                Health::Corrupt | Health::Missing => ExitCode::FAILURE,
                Health::Healthy | Health::UnderReplicated => ExitCode::SUCCESS,
            })
        }
        AdminCommand::Report { json } => {
            let report = fs.cluster_report().await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_report(&report);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_fsck(r: &FsckReport) {
    println!("Connecting to the metadata service for path {}", r.path);
    for f in &r.files {
        print_fsck_file(f);
    }
    let blocks: usize = r.files.iter().map(|f| f.blocks.len()).sum();
    let bytes: u64 = r.files.iter().map(|f| f.length).sum();
    let count = |h: Health| {
        r.files
            .iter()
            .flat_map(|f| &f.blocks)
            .filter(|b| b.health == h)
            .count()
    };
    println!();
    println!("Status: {}", format::health(r.health));
    println!(" Total size:\t{bytes} B");
    println!(" Total files:\t{}", r.files.len());
    println!(" Total blocks:\t{blocks}");
    println!(
        " Under-replicated blocks:\t{}",
        count(Health::UnderReplicated)
    );
    println!(" Corrupt blocks:\t{}", count(Health::Corrupt));
    println!(" Missing blocks:\t{}", count(Health::Missing));
    println!();
    println!(
        "The filesystem under path '{}' is {}",
        r.path,
        format::health(r.health)
    );
}

fn print_fsck_file(f: &FsckFile) {
    let uc = if f.under_construction {
        " (under construction)"
    } else {
        ""
    };
    println!(
        "{} {} bytes, replication={}, {} block(s){uc}:  {}",
        f.path,
        f.length,
        f.replication,
        f.blocks.len(),
        format::health(f.health)
    );
    for (i, b) in f.blocks.iter().enumerate() {
        let locs: Vec<String> = b.locations.iter().map(|d| d.to_string()).collect();
        let mut line = format!(
            "{i}. {}_{} len={} Live_repl={}/{} [{}]",
            b.block.id,
            b.block.gen_stamp,
            b.block.num_bytes,
            b.locations.len(),
            b.expected_replicas,
            locs.join(", ")
        );
        if !b.corrupt_locations.is_empty() {
            let bad: Vec<String> = b.corrupt_locations.iter().map(|d| d.to_string()).collect();
            line.push_str(&format!(" corrupt=[{}]", bad.join(", ")));
        }
        println!("{line} {}", format::health(b.health));
    }
}

fn print_report(r: &ClusterReport) {
    let live = r
        .datanodes
        .iter()
        .filter(|d| d.state == NodeState::Live)
        .count();
    let t = r.totals();
    println!(
        "Configured Capacity: {} ({})",
        t.capacity,
        human_bytes(t.capacity)
    );
    println!("DFS Used: {} ({})", t.used, human_bytes(t.used));
    println!(
        "Non DFS Used: {} ({})",
        t.non_dfs_used,
        human_bytes(t.non_dfs_used)
    );
    println!(
        "DFS Remaining: {} ({})",
        t.remaining,
        human_bytes(t.remaining)
    );
    println!("DFS Used%: {:.2}%", t.used_percent());
    println!(
        "Files: {}  Directories: {}  Blocks: {}",
        r.files, r.directories, r.blocks
    );
    println!("Under replicated blocks: {}", r.under_replicated_blocks);
    println!("Blocks with corrupt replicas: {}", r.corrupt_blocks);
    println!("Missing blocks: {}", r.missing_blocks);
    println!();
    println!("-------------------------------------------------");
    println!("DataNodes: {} ({live} live)", r.datanodes.len());
    for d in &r.datanodes {
        println!();
        println!("Name: {} ({})", d.id.data_addr, d.id.node_id);
        println!("Rack: {}", d.id.rack);
        println!("HTTP: {}", d.id.http_addr);
        println!("State: {:?}", d.state);
        println!(
            "Configured Capacity: {} ({})",
            d.capacity,
            human_bytes(d.capacity)
        );
        println!("DFS Used: {} ({})", d.used, human_bytes(d.used));
        println!(
            "Non DFS Used: {} ({})",
            d.non_dfs_used(),
            human_bytes(d.non_dfs_used())
        );
        println!(
            "DFS Remaining: {} ({})",
            d.remaining,
            human_bytes(d.remaining)
        );
        let pct = if d.capacity == 0 {
            0.0
        } else {
            d.used as f64 * 100.0 / d.capacity as f64
        };
        println!("DFS Used%: {pct:.2}%");
        println!("Blocks: {}", d.blocks);
        println!("Last contact: {} ms ago", d.last_heartbeat_ms_ago);
    }
}
