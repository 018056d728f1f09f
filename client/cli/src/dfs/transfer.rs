//! Commands that move bytes: put, get, cp, cat, tail.
//!
//! A copy into the cluster (put, cp) writes `<dest>._COPYING_` and renames it into place when
//! it is closed, as `hdfs dfs -put`; a failed source, a failed write, Ctrl-C or SIGTERM
//! deletes the `._COPYING_` file (which also ends its lease) before the command exits. A
//! `._COPYING_` file left open by a client that crashed is taken over once its lease soft
//! limit has passed: the metadata service recovers it and the retry overwrites it.
//! A copy out of the cluster (get) writes `<local>._COPYING_` likewise.

use super::local_file::{LocalSink, LocalSource};
use super::progress::Progress;
use super::{child, is_dir, local_target, remote_name, LEASE_RECOVERY_WAIT};
use anyhow::{anyhow, bail, Context as _};
use sluice_client::{ClientError, FileKind, FileReader, FileSystem, FileWriter, WriteOptions};
use sluice_common::MetaError;
use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncSeekExt, AsyncWrite, AsyncWriteExt};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Bytes moved per read/write.
const COPY_BUFFER: usize = 1 << 20;

/// Suffix of a file being copied, renamed into place when complete (as `hdfs dfs -put`).
const COPYING: &str = "._COPYING_";

/// Bytes `tail` prints (as `hdfs dfs -tail`).
const TAIL_BYTES: u64 = 1024;

/// How often `tail -f` looks for new bytes.
const TAIL_POLL: Duration = Duration::from_secs(1);

/// How often a `put` asks again while a crashed client's `._COPYING_` file is recovered.
const LEASE_RETRY: Duration = Duration::from_millis(500);

/// Ctrl-C and SIGTERM, caught so that a copy can clean up before the command exits.
struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        })
    }

    /// Waits for a signal; returns its name.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}

/// Where the bytes of a copy into the cluster come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    Stdin,
    Local(&'a Path),
    Remote(&'a str),
}

/// `put LOCAL... DEST`.
pub async fn put_all(
    fs: &FileSystem,
    srcs: &[String],
    dst: &str,
    opts: WriteOptions,
) -> anyhow::Result<()> {
    let mut signals = Signals::install()?;
    if srcs.len() == 1 && srcs[0] == "-" {
        return copy_in(fs, Source::Stdin, dst, &opts, &mut signals).await;
    }
    if srcs.iter().any(|s| s == "-") {
        bail!("- (stdin) must be the only source");
    }
    let into_dir = is_dir(fs, dst).await?;
    if srcs.len() > 1 && !into_dir {
        bail!("{dst}: is not a directory (several sources need one)");
    }
    for src in srcs {
        let local = Path::new(src);
        let target = if into_dir {
            let name = local
                .file_name()
                .ok_or_else(|| anyhow!("{src} has no file name"))?;
            child(dst, &name.to_string_lossy())
        } else {
            dst.to_string()
        };
        copy_in(fs, Source::Local(local), &target, &opts, &mut signals).await?;
    }
    Ok(())
}

/// `cp SRC... DEST` within the cluster.
pub async fn cp_all(
    fs: &FileSystem,
    srcs: &[String],
    dst: &str,
    force: bool,
) -> anyhow::Result<()> {
    let mut signals = Signals::install()?;
    let opts = WriteOptions {
        overwrite: force,
        create_parent: false,
        ..WriteOptions::default()
    };
    for (src, to) in super::targets(fs, srcs, dst).await? {
        if is_dir(fs, src).await? {
            bail!("{src}: is a directory (cp copies files)");
        }
        copy_in(fs, Source::Remote(src), &to, &opts, &mut signals).await?;
    }
    Ok(())
}

/// Copies `src` to `<dst>._COPYING_`, then renames it to `dst`; on any failure or signal the
/// `._COPYING_` file is deleted.
async fn copy_in(
    fs: &FileSystem,
    src: Source<'_>,
    dst: &str,
    opts: &WriteOptions,
    signals: &mut Signals,
) -> anyhow::Result<()> {
    if !opts.overwrite && fs.stat(dst).await.is_ok() {
        return Err(ClientError::Meta(MetaError::AlreadyExists { path: dst.into() }).into());
    }
    let tmp = format!("{dst}{COPYING}");
    let mut w = create_copying(fs, &tmp, opts).await?;
    let written = tokio::select! {
        r = write_source(fs, src, &mut w, dst) => r,
        sig = signals.recv() => Err(anyhow!("interrupted by {sig}")),
    };
    let closed = match written {
        Ok(()) => tokio::select! {
            r = w.close() => r.map_err(anyhow::Error::from),
            sig = signals.recv() => Err(anyhow!("interrupted by {sig}")),
        },
        Err(e) => Err(e),
    };
    if let Err(e) = closed {
        drop(w); // stops the streamer
        if let Err(d) = fs.delete(&tmp, false).await {
            return Err(e.context(format!("{tmp} could not be deleted: {d}")));
        }
        return Err(e);
    }
    if opts.overwrite {
        fs.delete(dst, false).await?;
    }
    fs.rename(&tmp, dst).await?;
    Ok(())
}

/// Creates (overwrites) a `._COPYING_` file. When another client holds it, its lease has
/// passed the soft limit and the metadata service has started recovering it (the holder
/// turns into the recovery holder), waits for the recovery to close it, then takes it.
async fn create_copying(
    fs: &FileSystem,
    tmp: &str,
    opts: &WriteOptions,
) -> anyhow::Result<FileWriter> {
    let opts = WriteOptions {
        overwrite: true,
        ..opts.clone()
    };
    let first_holder = match fs.create(tmp, opts.clone()).await {
        Ok(w) => return Ok(w),
        Err(ClientError::Meta(MetaError::LeaseConflict { holder, .. })) => holder,
        Err(e) => return Err(e.into()),
    };
    let deadline = tokio::time::Instant::now() + LEASE_RECOVERY_WAIT;
    loop {
        match fs.create(tmp, opts.clone()).await {
            Ok(w) => return Ok(w),
            Err(ClientError::Meta(MetaError::LeaseConflict { holder, .. }))
                if holder == first_holder =>
            {
                bail!(
                    "{tmp} is being written by {holder} (retry once its lease soft limit has \
                     passed)"
                );
            }
            Err(ClientError::Meta(MetaError::LeaseConflict { .. }))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(LEASE_RETRY).await;
            }
            Err(e) => {
                return Err(anyhow::Error::from(e).context(format!(
                    "{tmp}: recovery of the crashed writer's file did not finish"
                )))
            }
        }
    }
}

async fn write_source(
    fs: &FileSystem,
    src: Source<'_>,
    w: &mut FileWriter,
    dst: &str,
) -> anyhow::Result<()> {
    match src {
        Source::Stdin => {
            let bar = Progress::start(dst, None);
            let mut src = LocalSource::stdin(COPY_BUFFER).context("stdin")?;
            copy_local(&mut src, w, &bar).await.context("stdin")?;
        }
        Source::Local(p) => {
            let f = tokio::fs::File::open(p)
                .await
                .with_context(|| p.display().to_string())?
                .into_std()
                .await;
            let len = f.metadata().ok().map(|m| m.len());
            let bar = Progress::start(dst, len);
            copy_local(&mut LocalSource::new(f, COPY_BUFFER), w, &bar)
                .await
                .with_context(|| p.display().to_string())?;
        }
        Source::Remote(p) => {
            let mut r = fs.open(p).await?;
            let bar = Progress::start(dst, Some(r.len()));
            copy_file(&mut r, w, &bar)
                .await
                .with_context(|| p.to_string())?;
        }
    }
    Ok(())
}

/// Appends each local file (or stdin) to `remote` through one writer; a missing `remote` is
/// created first (with its parents, as `hdfs dfs -appendToFile`).
pub async fn append_to_file(
    fs: &FileSystem,
    locals: &[PathBuf],
    remote: &str,
) -> anyhow::Result<()> {
    if locals
        .iter()
        .filter(|l| l.as_path() == Path::new("-"))
        .count()
        > 1
    {
        bail!("stdin (-) can be appended only once");
    }
    let mut w = match fs.stat(remote).await {
        Ok(s) if s.kind == FileKind::Directory => {
            return Err(ClientError::Meta(MetaError::IsADirectory {
                path: remote.to_string(),
            })
            .into())
        }
        Ok(_) => fs.append(remote).await?,
        Err(ClientError::Meta(MetaError::NotFound { .. })) => {
            let opts = WriteOptions {
                create_parent: true,
                ..WriteOptions::default()
            };
            fs.create(remote, opts).await?
        }
        Err(e) => return Err(e.into()),
    };
    for local in locals {
        let copied = if local.as_path() == Path::new("-") {
            match LocalSource::stdin(COPY_BUFFER) {
                Ok(mut src) => copy_local(&mut src, &mut w, &Progress::none()).await,
                Err(e) => Err(anyhow!(e)),
            }
            .context("stdin")
        } else {
            match tokio::fs::File::open(local).await {
                Ok(f) => {
                    let mut src = LocalSource::new(f.into_std().await, COPY_BUFFER);
                    copy_local(&mut src, &mut w, &Progress::none()).await
                }
                Err(e) => Err(anyhow!(e)),
            }
            .with_context(|| local.display().to_string())
        };
        if let Err(e) = copied {
            // What was acknowledged stays: close the file with it (as an HDFS writer would).
            let _ = w.close().await;
            return Err(e);
        }
    }
    w.close().await?;
    Ok(())
}

/// `get SRC... LOCALDEST` (`-`: stdout).
pub async fn get_all(
    fs: &FileSystem,
    srcs: &[String],
    dst: &str,
    force: bool,
) -> anyhow::Result<()> {
    if dst == "-" {
        return cat(fs, srcs).await;
    }
    let local = Path::new(dst);
    if srcs.len() > 1 && !local.is_dir() {
        bail!("{dst}: is not a directory (several sources need one)");
    }
    let mut signals = Signals::install()?;
    for src in srcs {
        get_one(fs, src, &local_target(local, src), force, &mut signals).await?;
    }
    Ok(())
}

async fn get_one(
    fs: &FileSystem,
    remote: &str,
    target: &Path,
    force: bool,
    signals: &mut Signals,
) -> anyhow::Result<()> {
    let mut r = fs.open(remote).await?;
    if is_special(target) {
        // A device, a FIFO or a socket (`/dev/null`, a pipe to another program): written in
        // place, as `cp` does. The copy-then-rename below would put a regular file in its
        // place (`/dev/null` replaced, for root).
        let bar = Progress::start(remote_name(remote), Some(r.len()));
        let work = async {
            let f = tokio::fs::OpenOptions::new()
                .write(true)
                .open(target)
                .await
                .with_context(|| target.display().to_string())?;
            let mut f = LocalSink::new(f.into_std().await);
            let name = target.display().to_string();
            copy_file_local(&mut r, &mut f, &name, &bar).await?;
            f.finish(false).await.context(name)
        };
        return tokio::select! {
            r = work => r,
            sig = signals.recv() => Err(anyhow!("interrupted by {sig}")),
        };
    }
    if target.exists() && !force {
        bail!("{}: file exists (use -f to overwrite)", target.display());
    }
    let mut tmp = target.as_os_str().to_owned();
    tmp.push(COPYING);
    let tmp = std::path::PathBuf::from(tmp);
    let bar = Progress::start(remote_name(remote), Some(r.len()));
    let work = async {
        let f = tokio::fs::File::create(&tmp)
            .await
            .with_context(|| tmp.display().to_string())?;
        let mut f = LocalSink::new(f.into_std().await);
        let name = tmp.display().to_string();
        copy_file_local(&mut r, &mut f, &name, &bar).await?;
        f.finish(true).await.context(name)?;
        tokio::fs::rename(&tmp, target)
            .await
            .with_context(|| target.display().to_string())
    };
    let result = tokio::select! {
        r = work => r,
        sig = signals.recv() => Err(anyhow!("interrupted by {sig}")),
    };
    if result.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    result
}

/// True if `path` exists and is neither a regular file nor a directory (a device, a FIFO, a
/// socket), following symlinks.
fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// `cat PATH...`: each file in turn to stdout.
pub async fn cat(fs: &FileSystem, paths: &[String]) -> anyhow::Result<()> {
    let mut out = LocalSink::stdout().context("stdout")?;
    for p in paths {
        let mut r = fs.open(p).await?;
        copy_file_local(&mut r, &mut out, "stdout", &Progress::none())
            .await
            .with_context(|| p.clone())?;
    }
    out.finish(false).await.context("stdout")
}

/// `tail [-f] PATH`: the last kilobyte; with `follow`, then every byte that is added (the
/// readable length of a file being written grows with each hflush and finished block).
pub async fn tail(fs: &FileSystem, path: &str, follow: bool) -> anyhow::Result<()> {
    if fs.stat(path).await?.kind == FileKind::Directory {
        bail!("{path}: is a directory");
    }
    let mut out = LocalSink::stdout().context("stdout")?;
    let mut r = fs.open(path).await?;
    let mut pos = r.len().saturating_sub(TAIL_BYTES);
    loop {
        if r.len() > pos {
            r.seek(SeekFrom::Start(pos)).await?;
            pos += copy_file_local(&mut r, &mut out, "stdout", &Progress::none()).await?;
        }
        if !follow {
            return Ok(());
        }
        tokio::time::sleep(TAIL_POLL).await;
        r = fs.open(path).await?;
    }
}

/// Copies the rest of Sluice file `from` to `to` with the reader's own buffers (no copy into
/// a buffer of ours: `FileReader::read_bytes`); returns the bytes copied.
async fn copy_file<W>(from: &mut FileReader, to: &mut W, bar: &Progress) -> anyhow::Result<u64>
where
    W: AsyncWrite + Unpin,
{
    let mut total = 0u64;
    loop {
        let b = from.read_bytes(COPY_BUFFER).await?;
        if b.is_empty() {
            break;
        }
        to.write_all(&b).await?;
        total += b.len() as u64;
        bar.advance(b.len() as u64);
    }
    to.flush().await?;
    Ok(total)
}

/// Copies the rest of Sluice file `from` to a local file or stdout (`name`, for errors), the
/// reader's buffers handed to the writing thread as they are (see [`LocalSink`]); returns the
/// bytes copied, all written when it returns.
async fn copy_file_local(
    from: &mut FileReader,
    to: &mut LocalSink,
    name: &str,
    bar: &Progress,
) -> anyhow::Result<u64> {
    let mut total = 0u64;
    loop {
        let b = from.read_bytes(COPY_BUFFER).await?;
        if b.is_empty() {
            break;
        }
        let n = b.len() as u64;
        to.write(b).await.with_context(|| name.to_string())?;
        total += n;
        bar.advance(n);
    }
    to.flush().await.with_context(|| name.to_string())?;
    Ok(total)
}

/// Copies the rest of local file `from` into Sluice file `to`; returns the bytes copied.
async fn copy_local(
    from: &mut LocalSource,
    to: &mut FileWriter,
    bar: &Progress,
) -> anyhow::Result<u64> {
    let mut total = 0u64;
    loop {
        let b = from.next().await?;
        if b.is_empty() {
            break;
        }
        to.write_all(b).await?;
        total += b.len() as u64;
        bar.advance(b.len() as u64);
    }
    to.flush().await?;
    Ok(total)
}
