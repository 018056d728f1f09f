//! Commands that look: ls, stat, du, df, count, test, checksum (output as `hdfs dfs` prints
//! it; `--json` where scripts want a stable form).

use crate::format;
use anyhow::bail;
use serde::Serialize;
use sluice_client::{ClientError, FileKind, FileStatus, FileSystem};
use sluice_common::MetaError;

/// How `ls` lists.
#[derive(Debug, Clone, Copy)]
pub struct LsOptions {
    /// Recurse into directories (`-R`).
    pub recursive: bool,
    /// Directories as plain entries (`-d`).
    pub directory: bool,
    /// Human sizes (`-h`).
    pub human: bool,
    /// A JSON array of file statuses.
    pub json: bool,
}

/// `ls [-R] [-d] [-h] [--json] PATH...`.
pub async fn ls(fs: &FileSystem, paths: &[String], how: LsOptions) -> anyhow::Result<()> {
    let mut all = Vec::new();
    for path in paths {
        let entries = if how.directory {
            vec![fs.stat(path).await?]
        } else if how.recursive {
            walk(fs, path).await?
        } else {
            fs.list(path).await?
        };
        if how.json {
            all.extend(entries);
            continue;
        }
        if !how.directory && !how.recursive && fs.stat(path).await?.kind == FileKind::Directory {
            println!("Found {} items", entries.len());
        }
        for e in &entries {
            println!("{}", format::ls_line(e, how.human));
        }
    }
    if how.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    Ok(())
}

/// Every entry under `path` (not `path` itself), depth first in name order.
pub(super) async fn walk(fs: &FileSystem, path: &str) -> anyhow::Result<Vec<FileStatus>> {
    let mut out = Vec::new();
    let mut stack: Vec<_> = fs.list(path).await?.into_iter().rev().collect();
    while let Some(e) = stack.pop() {
        if e.kind == FileKind::Directory && e.path != path {
            let children = fs.list(&e.path).await?;
            stack.extend(children.into_iter().rev());
        }
        out.push(e);
    }
    Ok(out)
}

/// `stat [--json] PATH`.
pub async fn stat(fs: &FileSystem, path: &str, json: bool) -> anyhow::Result<()> {
    let s = fs.stat(path).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
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

/// Totals under a path (HDFS's content summary).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The path.
    pub path: String,
    /// Directories, the path itself included when it is one.
    pub directories: u64,
    /// Files.
    pub files: u64,
    /// Bytes of the files.
    pub length: u64,
    /// Bytes of the files times their replication.
    pub space_consumed: u64,
}

/// The totals of `path` and everything under it.
async fn summarize(fs: &FileSystem, path: &str) -> anyhow::Result<Summary> {
    let top = fs.stat(path).await?;
    let mut sum = Summary {
        path: path.to_string(),
        ..Summary::default()
    };
    let mut entries = vec![top.clone()];
    if top.kind == FileKind::Directory {
        entries.extend(walk(fs, path).await?);
    }
    for e in &entries {
        match e.kind {
            FileKind::Directory => sum.directories += 1,
            FileKind::File => {
                sum.files += 1;
                sum.length += e.length;
                sum.space_consumed += e.length * u64::from(e.replication);
            }
        }
    }
    Ok(sum)
}

/// `du [-s] [-h] [--json] PATH...`: `size  size-with-replicas  path` for each entry of each
/// directory (each file given), or one total line per path with `-s`.
pub async fn du(
    fs: &FileSystem,
    paths: &[String],
    summary: bool,
    human: bool,
    json: bool,
) -> anyhow::Result<()> {
    let mut lines = Vec::new();
    for path in paths {
        if summary || fs.stat(path).await?.kind == FileKind::File {
            lines.push(summarize(fs, path).await?);
            continue;
        }
        for e in fs.list(path).await? {
            lines.push(summarize(fs, &e.path).await?);
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&lines)?);
        return Ok(());
    }
    for s in &lines {
        println!(
            "{:<10}  {:<10}  {}",
            format::size(s.length, human),
            format::size(s.space_consumed, human),
            s.path
        );
    }
    Ok(())
}

/// `df [-h] [--json]`: the cluster's size, used, available and use%, over its DataNodes that
/// are not dead (as `sluice report` sums them).
pub async fn df(fs: &FileSystem, human: bool, json: bool) -> anyhow::Result<()> {
    let t = fs.cluster_report().await?.totals();
    let name = format!("sluice://{}", fs.config().metadata_address);
    let pct = t.used_percent();
    if json {
        let v = serde_json::json!({
            "filesystem": name,
            "size": t.capacity,
            "used": t.used,
            "available": t.remaining,
            "non_dfs_used": t.non_dfs_used,
            "use_percent": pct,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let size = format::size(t.capacity, human);
    let used = format::size(t.used, human);
    let avail = format::size(t.remaining, human);
    let w = name.len().max(10);
    println!(
        "{:<w$}  {:>12}  {:>12}  {:>12}  {:>4}",
        "Filesystem", "Size", "Used", "Available", "Use%"
    );
    println!(
        "{name:<w$}  {size:>12}  {used:>12}  {avail:>12}  {:>4}",
        format!("{}%", pct.round() as u64)
    );
    Ok(())
}

/// `count [-q] [-h] PATH...`: `DIR_COUNT FILE_COUNT CONTENT_SIZE PATHNAME`, with `-q` first
/// `QUOTA REM_QUOTA SPACE_QUOTA REM_SPACE_QUOTA` (Sluice has no quotas: `none inf none inf`).
pub async fn count(
    fs: &FileSystem,
    paths: &[String],
    quota: bool,
    human: bool,
) -> anyhow::Result<()> {
    for path in paths {
        let s = summarize(fs, path).await?;
        let q = if quota {
            format!("{:>12} {:>15} {:>15} {:>15} ", "none", "inf", "none", "inf")
        } else {
            String::new()
        };
        println!(
            "{q}{:>12} {:>12} {:>18} {}",
            s.directories,
            s.files,
            format::size(s.length, human),
            s.path
        );
    }
    Ok(())
}

/// `checksum PATH...`: `path  COMPOSITE-CRC32C  hex`, tab-separated as HDFS prints it.
pub async fn checksum(fs: &FileSystem, paths: &[String]) -> anyhow::Result<()> {
    for path in paths {
        if fs.stat(path).await?.kind == FileKind::Directory {
            bail!("{path}: is a directory");
        }
        let sum = fs.file_checksum(path).await?;
        println!("{path}\t{}\t{}", sum.algorithm(), sum.hex());
    }
    Ok(())
}

/// What `test` checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// `-e`: exists.
    Exists,
    /// `-d`: is a directory.
    Directory,
    /// `-f`: is a file.
    File,
    /// `-z`: is zero bytes long.
    Zero,
    /// `-s`: is not empty (a file with bytes, a directory with entries).
    NonEmpty,
}

/// `test -e|-d|-f|-z|-s PATH`: whether the check holds (a missing path fails every check).
pub async fn test(fs: &FileSystem, path: &str, check: Check) -> anyhow::Result<bool> {
    let s = match fs.stat(path).await {
        Ok(s) => s,
        Err(ClientError::Meta(MetaError::NotFound { .. })) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    Ok(match check {
        Check::Exists => true,
        Check::Directory => s.kind == FileKind::Directory,
        Check::File => s.kind == FileKind::File,
        Check::Zero => s.length == 0,
        Check::NonEmpty => match s.kind {
            FileKind::File => s.length > 0,
            FileKind::Directory => !fs.list(path).await?.is_empty(),
        },
    })
}
