//! File and directory commands, as `hdfs dfs` users know them.
//!
//! - [`transfer`]: commands that move bytes — put, appendToFile, get, cat, cp, tail — streaming through a
//!   fixed buffer (none loads a whole file in memory), with a progress bar on a terminal.
//! - [`inspect`]: commands that look — ls, stat, du, df, count, test, checksum.
//! - here: the argument parsing, and the namespace changes (mkdir, rm, mv, touchz, setrep).
//!
//! Several sources go into a destination that must be an existing directory (as HDFS); a
//! single source into an existing directory lands under its own name.

mod inspect;
mod local_file;
mod progress;
mod transfer;

use crate::Globals;
use anyhow::{bail, Context as _};
use clap::Subcommand;
use sluice_client::{ClientError, FileKind, FileSystem, WriteOptions};
use sluice_common::config::ByteSize;
use sluice_common::MetaError;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// File and directory commands.
#[derive(Debug, Subcommand)]
pub enum DfsCommand {
    /// Copy local files (`-` for stdin) into the cluster: `put LOCAL... DEST`.
    Put {
        /// Local files, then the destination (a directory when there are several sources).
        #[arg(required = true, num_args = 2.., value_name = "PATH")]
        paths: Vec<String>,
        /// Block size, e.g. 8MiB (default: the configuration's, else the service's).
        #[arg(long, value_parser = ByteSize::parse)]
        block_size: Option<ByteSize>,
        /// Replication factor.
        #[arg(long)]
        replication: Option<u16>,
        /// Overwrite the destination.
        #[arg(short = 'f', long)]
        force: bool,
    },
    /// Append local files (`-` for stdin) to a file in the cluster, in order, creating it
    /// if it does not exist (as `hdfs dfs -appendToFile`).
    #[command(name = "appendToFile", alias = "append-to-file")]
    AppendToFile {
        /// Local files (`-` for stdin), appended in this order.
        #[arg(required = true, num_args = 1..)]
        local: Vec<PathBuf>,
        /// The file to append to.
        remote: String,
    },
    /// Copy files from the cluster to local files (`-` for stdout): `get SRC... LOCALDEST`.
    Get {
        /// Sources, then the local destination (a directory when there are several sources).
        #[arg(required = true, num_args = 2.., value_name = "PATH")]
        paths: Vec<String>,
        /// Overwrite local files.
        #[arg(short = 'f', long)]
        force: bool,
    },
    /// Copy files within the cluster: `cp SRC... DEST`.
    Cp {
        /// Sources, then the destination (a directory when there are several sources).
        #[arg(required = true, num_args = 2.., value_name = "PATH")]
        paths: Vec<String>,
        /// Overwrite the destination.
        #[arg(short = 'f', long)]
        force: bool,
    },
    /// Print files to stdout, one after the other.
    Cat {
        /// Paths.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Print the last kilobyte of a file; with -f, keep printing what is appended.
    Tail {
        /// Follow the file as it grows (until interrupted).
        #[arg(short = 'f', long)]
        follow: bool,
        /// Path.
        path: String,
    },
    /// List directories (or files): type, replication, size, modification time (UTC), path.
    #[command(disable_help_flag = true)]
    Ls {
        /// Recurse into directories.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// List directories as plain entries, not their contents.
        #[arg(short = 'd', long)]
        directory: bool,
        /// Sizes in human units (KiB, MiB, …) instead of bytes.
        #[arg(short = 'h', long)]
        human: bool,
        /// Print the entries as a JSON array of file statuses.
        #[arg(long)]
        json: bool,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
        /// Paths.
        #[arg(default_value = "/")]
        paths: Vec<String>,
    },
    /// Create directories.
    Mkdir {
        /// Create missing parents; no error if it exists.
        #[arg(short = 'p', long)]
        parents: bool,
        /// Paths.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Delete files (and, with -r, directories with their contents).
    Rm {
        /// Delete directories recursively.
        #[arg(short = 'r', short_alias = 'R', long)]
        recursive: bool,
        /// Paths.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Rename (move) files or directories: `mv SRC... DEST`.
    Mv {
        /// Sources, then the destination (an existing directory receives them by name).
        #[arg(required = true, num_args = 2.., value_name = "PATH")]
        paths: Vec<String>,
    },
    /// Create empty files (an existing empty file is left as it is).
    Touchz {
        /// Paths.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Show one entry's status.
    Stat {
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
        /// Path.
        path: String,
    },
    /// Space used: bytes and bytes with all replicas, per entry (or in total with -s).
    #[command(disable_help_flag = true)]
    Du {
        /// One total line per path argument.
        #[arg(short = 's', long)]
        summary: bool,
        /// Sizes in human units.
        #[arg(short = 'h', long)]
        human: bool,
        /// Print JSON (`[{path, length, space_consumed}]`).
        #[arg(long)]
        json: bool,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
        /// Paths.
        #[arg(default_value = "/")]
        paths: Vec<String>,
    },
    /// Capacity, used, available and use% of the cluster (its live DataNodes).
    #[command(disable_help_flag = true)]
    Df {
        /// Sizes in human units.
        #[arg(short = 'h', long)]
        human: bool,
        /// Print JSON (`{filesystem, size, used, available, use_percent}`).
        #[arg(long)]
        json: bool,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
        /// Path (the whole cluster answers, as HDFS).
        #[arg(default_value = "/")]
        path: String,
    },
    /// Directories, files and bytes under each path.
    #[command(disable_help_flag = true)]
    Count {
        /// Show quotas first (Sluice has none: `none inf none inf`).
        #[arg(short = 'q')]
        quota: bool,
        /// Sizes in human units.
        #[arg(short = 'h', long)]
        human: bool,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
        /// Paths.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Set the replication factor of files (every file under a directory); the metadata
    /// service copies or deletes replicas to match. With -w, wait until every block has it.
    Setrep {
        /// Wait until every block has exactly that many replicas.
        #[arg(short = 'w')]
        wait: bool,
        /// Replicas per block.
        replication: u16,
        /// Paths.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// A file's checksum (COMPOSITE-CRC32C: equal for equal contents, whatever the block size).
    Checksum {
        /// Paths.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Exit 0 if the check holds, 1 if not (prints nothing).
    #[command(group(clap::ArgGroup::new("check").required(true).multiple(false)))]
    Test {
        /// The path exists.
        #[arg(short = 'e', group = "check")]
        exists: bool,
        /// The path is a directory.
        #[arg(short = 'd', group = "check")]
        dir: bool,
        /// The path is a file.
        #[arg(short = 'f', group = "check")]
        file: bool,
        /// The path is zero bytes long.
        #[arg(short = 'z', group = "check")]
        zero: bool,
        /// The path is not empty.
        #[arg(short = 's', group = "check")]
        nonempty: bool,
        /// Path.
        path: String,
    },
}

impl DfsCommand {
    /// The command's name, for error lines.
    pub fn name(&self) -> &'static str {
        match self {
            DfsCommand::Put { .. } => "put",
            DfsCommand::AppendToFile { .. } => "appendToFile",
            DfsCommand::Get { .. } => "get",
            DfsCommand::Cp { .. } => "cp",
            DfsCommand::Cat { .. } => "cat",
            DfsCommand::Tail { .. } => "tail",
            DfsCommand::Ls { .. } => "ls",
            DfsCommand::Mkdir { .. } => "mkdir",
            DfsCommand::Rm { .. } => "rm",
            DfsCommand::Mv { .. } => "mv",
            DfsCommand::Touchz { .. } => "touchz",
            DfsCommand::Stat { .. } => "stat",
            DfsCommand::Du { .. } => "du",
            DfsCommand::Df { .. } => "df",
            DfsCommand::Count { .. } => "count",
            DfsCommand::Checksum { .. } => "checksum",
            DfsCommand::Setrep { .. } => "setrep",
            DfsCommand::Test { .. } => "test",
        }
    }
}

/// Runs a file command.
pub async fn run(cmd: &DfsCommand, g: &Globals) -> anyhow::Result<ExitCode> {
    let fs = g.connect().await?;
    match cmd {
        DfsCommand::Put {
            paths,
            block_size,
            replication,
            force,
        } => {
            let opts = WriteOptions {
                overwrite: *force,
                create_parent: true, // as Hadoop's FileSystem.create: parents are made
                replication: *replication,
                block_size: block_size.map(|b| b.bytes()),
            };
            let (srcs, dst) = split_last(paths)?;
            transfer::put_all(&fs, srcs, dst, opts).await?;
        }
        DfsCommand::AppendToFile { local, remote } => {
            transfer::append_to_file(&fs, local, remote).await?
        }
        DfsCommand::Get { paths, force } => {
            let (srcs, dst) = split_last(paths)?;
            transfer::get_all(&fs, srcs, dst, *force).await?;
        }
        DfsCommand::Cp { paths, force } => {
            let (srcs, dst) = split_last(paths)?;
            transfer::cp_all(&fs, srcs, dst, *force).await?;
        }
        DfsCommand::Cat { paths } => transfer::cat(&fs, paths).await?,
        DfsCommand::Tail { follow, path } => transfer::tail(&fs, path, *follow).await?,
        DfsCommand::Ls {
            recursive,
            directory,
            human,
            json,
            paths,
            ..
        } => {
            let how = inspect::LsOptions {
                recursive: *recursive,
                directory: *directory,
                human: *human,
                json: *json,
            };
            inspect::ls(&fs, paths, how).await?
        }
        DfsCommand::Mkdir { parents, paths } => {
            for p in paths {
                fs.mkdirs(p, *parents).await?;
            }
        }
        DfsCommand::Rm { recursive, paths } => {
            for p in paths {
                if !fs.delete(p, *recursive).await? {
                    bail!("{p}: no such file or directory");
                }
            }
        }
        DfsCommand::Mv { paths } => {
            let (srcs, dst) = split_last(paths)?;
            for (src, to) in targets(&fs, srcs, dst).await? {
                fs.rename(src, &to).await?;
            }
        }
        DfsCommand::Touchz { paths } => {
            for p in paths {
                touchz(&fs, p).await?;
            }
        }
        DfsCommand::Stat { json, path } => inspect::stat(&fs, path, *json).await?,
        DfsCommand::Du {
            summary,
            human,
            json,
            paths,
            ..
        } => inspect::du(&fs, paths, *summary, *human, *json).await?,
        DfsCommand::Df { human, json, .. } => inspect::df(&fs, *human, *json).await?,
        DfsCommand::Count {
            quota,
            human,
            paths,
            ..
        } => inspect::count(&fs, paths, *quota, *human).await?,
        DfsCommand::Checksum { paths } => inspect::checksum(&fs, paths).await?,
        DfsCommand::Setrep {
            wait,
            replication,
            paths,
        } => setrep(&fs, *replication, paths, *wait).await?,
        DfsCommand::Test {
            exists,
            dir,
            file,
            zero,
            path,
            ..
        } => {
            let check = match (exists, dir, file, zero) {
                (true, ..) => inspect::Check::Exists,
                (_, true, ..) => inspect::Check::Directory,
                (_, _, true, _) => inspect::Check::File,
                (.., true) => inspect::Check::Zero,
                _ => inspect::Check::NonEmpty,
            };
            return Ok(if inspect::test(&fs, path, check).await? {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The sources and the destination of `cmd SRC... DEST`.
fn split_last(paths: &[String]) -> anyhow::Result<(&[String], &str)> {
    match paths.split_last() {
        Some((dst, srcs)) if !srcs.is_empty() => Ok((srcs, dst.as_str())),
        _ => bail!("needs a source and a destination"),
    }
}

/// The last component of a cluster path.
pub(crate) fn remote_name(path: &str) -> &str {
    let p = path.trim_end_matches('/');
    p.rsplit('/').next().unwrap_or(p)
}

/// `dir/name` for a cluster directory.
pub(crate) fn child(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// True if `path` is an existing directory of the cluster.
pub(crate) async fn is_dir(fs: &FileSystem, path: &str) -> anyhow::Result<bool> {
    match fs.stat(path).await {
        Ok(s) => Ok(s.kind == FileKind::Directory),
        Err(ClientError::Meta(MetaError::NotFound { .. })) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Where each cluster source goes: into `dst` by name when it is an existing directory, else
/// to `dst` itself (one source only, as HDFS: several need a directory).
async fn targets<'a>(
    fs: &FileSystem,
    srcs: &'a [String],
    dst: &str,
) -> anyhow::Result<Vec<(&'a str, String)>> {
    let into_dir = is_dir(fs, dst).await?;
    if srcs.len() > 1 && !into_dir {
        bail!("{dst}: is not a directory (several sources need one)");
    }
    Ok(srcs
        .iter()
        .map(|s| {
            let to = if into_dir {
                child(dst, remote_name(s))
            } else {
                dst.to_string()
            };
            (s.as_str(), to)
        })
        .collect())
}

/// `touchz`: an empty file, closed at once; an existing empty file is fine, a non-empty one
/// (or a directory) is an error, as HDFS.
async fn touchz(fs: &FileSystem, path: &str) -> anyhow::Result<()> {
    match fs.stat(path).await {
        Ok(s) if s.kind == FileKind::Directory => bail!("{path}: is a directory"),
        Ok(s) if s.length > 0 => bail!("{path}: not a zero-length file"),
        Ok(_) => return Ok(()),
        Err(ClientError::Meta(MetaError::NotFound { .. })) => {}
        Err(e) => return Err(e.into()),
    }
    let opts = WriteOptions {
        create_parent: false, // as `hdfs dfs -touchz`: the parent must exist
        ..WriteOptions::default()
    };
    let mut w = fs.create(path, opts).await?;
    w.close().await.with_context(|| path.to_string())?;
    Ok(())
}

/// How often `setrep -w` looks at the replicas again.
const SETREP_POLL: Duration = Duration::from_millis(500);

/// `setrep [-w] N PATH...` (as `hdfs dfs -setrep`): sets the factor of each file, of every
/// file under a directory; with `wait`, then waits until each block of each has N replicas.
async fn setrep(fs: &FileSystem, n: u16, paths: &[String], wait: bool) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for p in paths {
        if is_dir(fs, p).await? {
            let under = inspect::walk(fs, p).await?;
            files.extend(
                under
                    .into_iter()
                    .filter(|e| e.kind == FileKind::File)
                    .map(|e| e.path),
            );
        } else {
            files.push(p.clone());
        }
    }
    for f in &files {
        fs.set_replication(f, n).await?;
        println!("Replication {n} set: {f}");
    }
    if !wait {
        return Ok(());
    }
    for f in &files {
        print!("Waiting for {f} ...");
        loop {
            let report = fs.fsck(f).await?;
            let done = report.files.iter().all(|file| {
                file.blocks
                    .iter()
                    .all(|b| b.locations.len() == usize::from(n))
            });
            if done {
                break;
            }
            tokio::time::sleep(SETREP_POLL).await;
        }
        println!(" done");
    }
    Ok(())
}

/// How long a `put` waits for the metadata service to recover a `._COPYING_` file left open
/// by a crashed client, once that client's lease soft limit has passed.
pub(crate) const LEASE_RECOVERY_WAIT: Duration = Duration::from_secs(30);

/// The local destination of a `get` source: into `dst` when it is a directory.
pub(crate) fn local_target(dst: &std::path::Path, src: &str) -> PathBuf {
    if dst.is_dir() {
        dst.join(remote_name(src))
    } else {
        dst.to_path_buf()
    }
}
