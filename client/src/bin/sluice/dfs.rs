//! File and directory commands (like `hdfs dfs`): put, get, cat, ls, mkdir, rm, mv, stat.
//! `put` and `get` stream through a fixed buffer; neither loads a whole file in memory.

use crate::format;
use crate::Globals;
use anyhow::{anyhow, bail, Context as _};
use clap::Subcommand;
use sluice_client::{ClientError, FileKind, FileSystem, WriteOptions};
use sluice_common::config::ByteSize;
use sluice_common::MetaError;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes moved per read/write by `put`, `get` and `cat`.
const COPY_BUFFER: usize = 1 << 20;

/// Suffix of a file being copied, renamed into place when complete (as `hdfs dfs -put`).
const COPYING: &str = "._COPYING_";

/// File and directory commands.
#[derive(Debug, Subcommand)]
pub enum DfsCommand {
    /// Copy a local file (`-` for stdin) into the cluster.
    Put {
        /// Local file.
        local: PathBuf,
        /// Destination path (an existing directory receives the file under its own name).
        remote: String,
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
    /// Copy a file from the cluster to a local file (`-` for stdout).
    Get {
        /// Source path.
        remote: String,
        /// Local destination (an existing directory receives the file under its own name).
        local: PathBuf,
        /// Overwrite the local file.
        #[arg(short = 'f', long)]
        force: bool,
    },
    /// Print a file to stdout.
    Cat {
        /// Path.
        remote: String,
    },
    /// List a directory (or a file): type, replication, size, modification time (UTC), path.
    #[command(disable_help_flag = true)]
    Ls {
        /// Recurse into directories.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// Sizes in human units (KiB, MiB, …) instead of bytes.
        #[arg(short = 'h', long)]
        human: bool,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
        /// Path.
        #[arg(default_value = "/")]
        path: String,
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
    /// Rename (move) a file or directory.
    Mv {
        /// Source.
        src: String,
        /// Destination (must not exist; its parent must).
        dst: String,
    },
    /// Show one entry's status.
    Stat {
        /// Path.
        path: String,
    },
}

impl DfsCommand {
    /// The command's name, for error lines.
    pub fn name(&self) -> &'static str {
        match self {
            DfsCommand::Put { .. } => "put",
            DfsCommand::Get { .. } => "get",
            DfsCommand::Cat { .. } => "cat",
            DfsCommand::Ls { .. } => "ls",
            DfsCommand::Mkdir { .. } => "mkdir",
            DfsCommand::Rm { .. } => "rm",
            DfsCommand::Mv { .. } => "mv",
            DfsCommand::Stat { .. } => "stat",
        }
    }
}

/// Runs a file command.
pub async fn run(cmd: &DfsCommand, g: &Globals) -> anyhow::Result<ExitCode> {
    let fs = g.connect().await?;
    match cmd {
        DfsCommand::Put {
            local,
            remote,
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
            put(&fs, local, remote, opts).await?;
        }
        DfsCommand::Get {
            remote,
            local,
            force,
        } => get(&fs, remote, local, *force).await?,
        DfsCommand::Cat { remote } => {
            let mut r = fs.open(remote).await?;
            copy(&mut r, &mut tokio::io::stdout()).await?;
        }
        DfsCommand::Ls {
            recursive,
            human,
            path,
            ..
        } => ls(&fs, path, *recursive, *human).await?,
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
        DfsCommand::Mv { src, dst } => fs.rename(src, dst).await?,
        DfsCommand::Stat { path } => stat(&fs, path).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Copies `from` to `to` through a fixed buffer; returns the bytes copied.
async fn copy<R, W>(from: &mut R, to: &mut W) -> anyhow::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut total = 0u64;
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        to.write_all(&buf[..n]).await?;
        total += n as u64;
    }
    to.flush().await?;
    Ok(total)
}

fn basename(p: &Path) -> anyhow::Result<String> {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| anyhow!("{} has no file name", p.display()))
}

/// The remote destination: `remote`, or `remote/<name>` when it is an existing directory.
async fn remote_target(fs: &FileSystem, remote: &str, name: &str) -> anyhow::Result<String> {
    match fs.stat(remote).await {
        Ok(s) if s.kind == FileKind::Directory => {
            Ok(format!("{}/{name}", remote.trim_end_matches('/')))
        }
        Ok(_) | Err(ClientError::Meta(MetaError::NotFound { .. })) => Ok(remote.to_string()),
        Err(e) => Err(e.into()),
    }
}

/// Writes to `<dst>._COPYING_`, then renames it into place, so that a failed put never
/// leaves a partial file under the destination name.
async fn put(
    fs: &FileSystem,
    local: &Path,
    remote: &str,
    opts: WriteOptions,
) -> anyhow::Result<()> {
    let stdin = local == Path::new("-");
    let dst = if stdin {
        remote.to_string()
    } else {
        remote_target(fs, remote, &basename(local)?).await?
    };
    if !opts.overwrite && fs.stat(&dst).await.is_ok() {
        return Err(ClientError::Meta(MetaError::AlreadyExists { path: dst }).into());
    }
    let tmp = format!("{dst}{COPYING}");
    let mut w = fs
        .create(
            &tmp,
            WriteOptions {
                overwrite: true,
                ..opts.clone()
            },
        )
        .await?;
    let copied = if stdin {
        copy(&mut tokio::io::stdin(), &mut w).await
    } else {
        match tokio::fs::File::open(local).await {
            Ok(mut f) => copy(&mut f, &mut w).await,
            Err(e) => Err(anyhow!(e).context(format!("{}", local.display()))),
        }
    };
    let closed = match copied {
        Ok(_) => w.close().await.map_err(anyhow::Error::from),
        Err(e) => Err(e),
    };
    if let Err(e) = closed {
        let _ = fs.delete(&tmp, false).await;
        return Err(e);
    }
    if opts.overwrite {
        fs.delete(&dst, false).await?;
    }
    fs.rename(&tmp, &dst).await?;
    Ok(())
}

async fn get(fs: &FileSystem, remote: &str, local: &Path, force: bool) -> anyhow::Result<()> {
    let mut r = fs.open(remote).await?;
    if local == Path::new("-") {
        copy(&mut r, &mut tokio::io::stdout()).await?;
        return Ok(());
    }
    let name = remote.rsplit('/').next().unwrap_or(remote);
    let target = if local.is_dir() {
        local.join(name)
    } else {
        local.to_path_buf()
    };
    if target.exists() && !force {
        bail!("{}: file exists (use -f to overwrite)", target.display());
    }
    let mut tmp = target.clone().into_os_string();
    tmp.push(COPYING);
    let tmp = PathBuf::from(tmp);
    let result = async {
        let mut f = tokio::fs::File::create(&tmp)
            .await
            .with_context(|| tmp.display().to_string())?;
        copy(&mut r, &mut f).await?;
        f.sync_all().await?;
        tokio::fs::rename(&tmp, &target)
            .await
            .with_context(|| target.display().to_string())
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    result
}

async fn ls(fs: &FileSystem, path: &str, recursive: bool, human: bool) -> anyhow::Result<()> {
    let entries = fs.list(path).await?;
    if !recursive {
        let is_dir = fs.stat(path).await?.kind == FileKind::Directory;
        if is_dir {
            println!("Found {} items", entries.len());
        }
        for e in &entries {
            println!("{}", format::ls_line(e, human));
        }
        return Ok(());
    }
    let mut stack: Vec<_> = entries.into_iter().rev().collect();
    while let Some(e) = stack.pop() {
        println!("{}", format::ls_line(&e, human));
        if e.kind == FileKind::Directory && e.path != path {
            let children = fs.list(&e.path).await?;
            stack.extend(children.into_iter().rev());
        }
    }
    Ok(())
}

async fn stat(fs: &FileSystem, path: &str) -> anyhow::Result<()> {
    let s = fs.stat(path).await?;
    let kind = match s.kind {
        FileKind::File => "file",
        FileKind::Directory => "directory",
    };
    println!("path: {}", s.path);
    println!("type: {kind}");
    println!("length: {}", s.length);
    println!("replication: {}", s.replication);
    println!("block size: {}", s.block_size);
    println!("blocks: {}", s.block_count);
    println!("under construction: {}", s.under_construction);
    println!(
        "modified: {} UTC",
        format::date_time(s.modification_time_ms)
    );
    Ok(())
}
