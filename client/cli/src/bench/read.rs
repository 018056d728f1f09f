//! `sluice bench read`: the streaming read (`ReadBlock`, one request per block, DataNode
//! prefetch) against the classic chunk read (`ReadChunk`, one request per 4 MiB), reproducing
//! the two experiments of the Ozone streaming-read article on this machine, both modes in one
//! run:
//!
//! 1. one thread reads a file (1 GiB), warm (every replica file read into the page cache
//!    first) and cold (every replica file evicted first: `fdatasync`, `posix_fadvise
//!    (DONTNEED)`);
//! 2. `--threads` (4) threads each read their own file, aggregate MB/s, warm and cold;
//! 3. the same in stream mode with the DataNodes' prefetch forced to advise the kernel
//!    (`read.prefetch.fadvise = "on"`), reading ahead into buffers only (`"off"`), and with
//!    prefetch off (`read.prefetch.bytes = 0`) — the same cluster restarted with each
//!    configuration — to show what each part of prefetch adds (1 and 2 run with the
//!    configured settings, `"auto"` by default);
//!
//! Before each timed run the benchmark measures, with `mincore`, the fraction of the replica
//! files' pages in the page cache, and prints it for every row (`resident`, the largest any run
//! started with): "cold" and "warm" are verified, not assumed, and a cold run that did not
//! start cold is named in a note. Both modes treat the page cache alike on the DataNode (a
//! read longer than `read.ahead.cache.bytes.threshold` drops its pages behind it, a streaming
//! read and each 4 MiB `ReadChunk` alike), so with `--metadata` neither leaves the other a
//! warm cache.
//!
//! Every (threads, cache) pair is also measured without Sluice in the same runs
//! ([`super::floor::read`]: each reader's share of the replica files, in the same page-cache
//! state, read by one thread in the client's piece size and copied over loopback TCP to
//! another); each row prints Sluice's MB/s and CPU s/GiB (the whole process) next to the
//! floor's and the ratios (JSON: `mb_s`, `cpu_s_per_gib`, `floor_mb_s`,
//! `floor_cpu_s_per_gib`, `mb_s_vs_floor`, `cpu_vs_floor`). Plus a plain tokio socket copy of
//! the same size over loopback, the ceiling the figures should be read against: `--runs`
//! times up front (the `loopback` row), and once just before each run of one warm stream,
//! paired with it (`loopback_runs`, `mb_s_vs_loopback`: the median of the per-run ratios). Each configuration runs `--runs` times (min/median/max); runs of
//! both modes are interleaved so that drift on a shared machine hits both alike.
//!
//! By default the benchmark runs its own embedded cluster ([`sluice_cluster::EmbeddedCluster`])
//! under `--dir`, which it removes afterwards (unless `--keep`), on a tokio runtime of its own
//! ([`super::ClusterRuntime::Own`]: a client never shares one with its DataNodes), restarted
//! after it wrote the files so that every configuration reads from a cluster that only read.
//! With the global `--metadata` it uses that cluster instead: it cannot touch that cluster's
//! page cache or configuration, so it measures both modes with the cache as it is and
//! prefetch as configured, and says so.

mod report;

use super::cache::{self, Machine};
use super::floor::{self, FloorSample};
use super::report::process_cpu_secs;
use crate::Globals;
use anyhow::Context as _;
use clap::Args;
use rand::{RngCore, SeedableRng};
use report::{Report, Row, Sample};
use sluice_client::{FileSystem, ReadMode, ReadOptions, WriteOptions};
use sluice_common::config::{ByteSize, DatanodeConfig, PrefetchAdvice};
use sluice_common::memory::FileMap;
use sluice_common::rpc::Health;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Options of `sluice bench read`.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// Directory for the benchmark's own cluster; must be absent or empty. Removed afterwards
    /// unless --keep.
    #[arg(long, default_value = "./sluice-bench-read", value_name = "DIR")]
    pub dir: PathBuf,
    /// Bytes per file.
    #[arg(long, default_value = "1GiB", value_parser = ByteSize::parse)]
    pub size: ByteSize,
    /// Reader threads of the concurrent experiment, each on its own file.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Runs of each configuration (min/median/max).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Block size of the files.
    #[arg(long, default_value = "256MiB", value_parser = ByteSize::parse)]
    pub block_size: ByteSize,
    /// Replicas per block (a read uses one; more replicas only cost write time and disk).
    #[arg(long, default_value_t = 1)]
    pub replication: u16,
    /// DataNodes of the embedded cluster.
    #[arg(long, default_value_t = 3)]
    pub datanodes: usize,
    /// Bytes per `read` call of the application (Freon's 4 MB buffer).
    #[arg(long, default_value = "4MiB", value_parser = ByteSize::parse)]
    pub read_size: ByteSize,
    /// How the application reads: `bytes` takes the received buffers without copying
    /// (`FileReader::read_bytes`, at most --read-size per call), `buffer` copies into its own
    /// --read-size buffer (`AsyncRead`), one copy more per byte. Both read modes use the same.
    #[arg(long, value_enum, default_value = "bytes")]
    pub read_api: ReadApi,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Keep the cluster directory.
    #[arg(long)]
    pub keep: bool,
    /// The disk the cluster is given.
    #[command(flatten)]
    pub profile: super::disk_profile::ProfileArgs,
}

/// The client API the benchmark reads with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadApi {
    /// `FileReader::read_bytes`: the received buffers themselves.
    Bytes,
    /// `AsyncRead::read` into the application's buffer.
    Buffer,
}

/// How the page cache is prepared before a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CacheState {
    Warm,
    Cold,
    AsIs,
}

impl CacheState {
    fn name(self) -> &'static str {
        match self {
            CacheState::Warm => "warm",
            CacheState::Cold => "cold",
            CacheState::AsIs => "as-is",
        }
    }
}

const FILES_DIR: &str = "/bench/read";

/// Runs `sluice bench read`.
pub async fn run(args: &ReadArgs, g: &Globals) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    anyhow::ensure!(args.threads >= 1, "--threads must be at least 1");
    super::disk_profile::refuse_existing(&args.profile, g.metadata_given)?;
    let report = if g.metadata_given {
        run_existing(args, g).await?
    } else {
        run_embedded(args, g).await?
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report.print_table();
    }
    Ok(ExitCode::SUCCESS)
}

/// The benchmark on its own cluster: warm and cold, prefetch on and off.
async fn run_embedded(args: &ReadArgs, g: &Globals) -> anyhow::Result<Report> {
    let dir = &args.dir;
    super::fresh_dir(dir)?;
    let note = |r: &mut Report, n| r.notes.push(n);
    let r =
        super::disk_profile::within(&args.profile, dir, measure_embedded(args, g, dir), note).await;
    if !args.keep {
        let _ = std::fs::remove_dir_all(dir);
    }
    r
}

async fn measure_embedded(args: &ReadArgs, g: &Globals, dir: &Path) -> anyhow::Result<Report> {
    let mut dn = g.full.datanode.clone();
    if dn.read_prefetch_bytes.bytes() == 0 {
        dn.read_prefetch_bytes = DatanodeConfig::default().read_prefetch_bytes;
    }
    let window = dn.read_prefetch_bytes;
    let fadvise = dn.read_prefetch_fadvise;
    let (cluster, fs) = start_cluster(args, g, dir, &dn).await?;
    let mut report = new_report(args, g, dir);
    report
        .notes
        .push(auto_note(&report.machine, window, fadvise));
    let paths = files(args);
    report.write_mb_per_s = write_files(&fs, args, &paths).await?;
    // Every configuration reads from a cluster and a client that only read: the one that
    // wrote the files is restarted first, as the later configurations' are. Read by the
    // writing cluster, the first rows' single warm stream ran slower than the same setting
    // restarted (docs/benchmarks.md, "Tenth round").
    drop(fs);
    cluster.stop().await;
    let (cluster, fs) = start_cluster(args, g, dir, &dn).await?;
    wait_healthy(&fs).await?;
    report.loopback = loopback(args).await?;
    let caches = [CacheState::Warm, CacheState::Cold];
    let modes = [ReadMode::Stream, ReadMode::Chunk];
    let label = format!("{window},{}", advice_name(fadvise));
    let local = Some(Local {
        dir,
        piece: g.config.read_piece_bytes.as_usize(),
    });
    for threads in thread_counts(args) {
        let set = &paths[..threads];
        let rows = experiment(&fs, args, local, set, &caches, &modes, &label).await?;
        report.rows.extend(rows);
    }
    cluster.stop().await;

    // The same cluster and files, the DataNodes restarted: prefetch with kernel advice, into
    // buffers only, then prefetch off. Stream mode only (chunk mode does not prefetch).
    let configs = [
        (window, PrefetchAdvice::On, format!("{window},advice")),
        (window, PrefetchAdvice::Off, format!("{window},no-advice")),
        (ByteSize(0), PrefetchAdvice::Off, "off".into()),
    ];
    for (bytes, fadvise, label) in configs {
        dn.read_prefetch_bytes = bytes;
        dn.read_prefetch_fadvise = fadvise;
        let (cluster, fs) = start_cluster(args, g, dir, &dn).await?;
        wait_healthy(&fs).await?;
        for threads in thread_counts(args) {
            let set = &paths[..threads];
            let stream = [ReadMode::Stream];
            let rows = experiment(&fs, args, local, set, &caches, &stream, &label).await?;
            report.rows.extend(rows);
        }
        cluster.stop().await;
    }
    report.check_cold();
    report.compute_ratios();
    Ok(report)
}

/// The reader counts of the experiments: one, then `--threads` (once when that is one).
fn thread_counts(args: &ReadArgs) -> Vec<usize> {
    if args.threads > 1 {
        vec![1, args.threads]
    } else {
        vec![1]
    }
}

fn advice_name(a: PrefetchAdvice) -> &'static str {
    match a {
        PrefetchAdvice::Auto => "auto",
        PrefetchAdvice::On => "advice",
        PrefetchAdvice::Off => "no-advice",
    }
}

/// What `read.prefetch.fadvise = "auto"` does on the disk under the benchmark.
fn auto_note(m: &cache::Machine, window: ByteSize, configured: PrefetchAdvice) -> String {
    let advises = m.read_ahead_kb.is_none_or(|kb| kb * 1024 < window.bytes());
    format!(
        "the first rows use read.prefetch.fadvise = \"{}\"; \"auto\" {} on this disk (its own \
         read-ahead {} KiB, the prefetch window {window})",
        match configured {
            PrefetchAdvice::Auto => "auto",
            PrefetchAdvice::On => "on",
            PrefetchAdvice::Off => "off",
        },
        if advises {
            "advises"
        } else {
            "does not advise"
        },
        m.read_ahead_kb
            .map_or("unknown".into(), |kb| kb.to_string()),
    )
}

/// The benchmark on the cluster at `--metadata`: page cache as it is, prefetch as configured.
async fn run_existing(args: &ReadArgs, g: &Globals) -> anyhow::Result<Report> {
    let fs = g.connect().await?;
    let mut report = new_report(args, g, Path::new("."));
    report.machine.disk = "remote cluster (the client's machine is described)".into();
    report.notes.push(
        "an existing cluster (--metadata): its page cache cannot be controlled (cache \"as-is\") \
         and its prefetch setting not changed, and its replica files are not here to measure \
         the floor; run without --metadata for warm/cold, prefetch on/off and the floor"
            .into(),
    );
    let paths = files(args);
    report.write_mb_per_s = write_files(&fs, args, &paths).await?;
    report.loopback = loopback(args).await?;
    let modes = [ReadMode::Stream, ReadMode::Chunk];
    for threads in thread_counts(args) {
        let set = &paths[..threads];
        let caches = [CacheState::AsIs];
        let rows = experiment(&fs, args, None, set, &caches, &modes, "as configured");
        report.rows.extend(rows.await?);
    }
    let _ = fs.delete(FILES_DIR, true).await;
    report.compute_ratios();
    Ok(report)
}

fn new_report(args: &ReadArgs, g: &Globals, dir: &Path) -> Report {
    let c = &g.config;
    Report {
        machine: Machine::probe(dir),
        file_bytes: args.size.bytes(),
        block_bytes: args.block_size.bytes(),
        replication: args.replication,
        read_bytes: args.read_size.bytes(),
        client: format!(
            "read.buffer.bytes {}, read.piece.bytes {}, read.chunk.size {}, read api {}",
            c.read_buffer_bytes,
            c.read_piece_bytes,
            c.read_chunk_size,
            match args.read_api {
                ReadApi::Bytes => "bytes (FileReader::read_bytes, no copy)",
                ReadApi::Buffer => "buffer (AsyncRead into the application's buffer)",
            }
        ),
        write_mb_per_s: 0.0,
        loopback: Row::new(1, "tcp", "-", "-".into(), Vec::new()),
        rows: Vec::new(),
        ratios: Vec::new(),
        notes: Vec::new(),
    }
}

fn files(args: &ReadArgs) -> Vec<String> {
    (0..args.threads.max(1))
        .map(|i| format!("{FILES_DIR}/f{i}"))
        .collect()
}

/// Starts the embedded cluster on `dir` and connects once every DataNode is live.
async fn start_cluster(
    args: &ReadArgs,
    g: &Globals,
    dir: &Path,
    dn: &DatanodeConfig,
) -> anyhow::Result<(super::BenchCluster, FileSystem)> {
    super::embedded_cluster(dir, args.datanodes, g, dn, super::ClusterRuntime::Own).await
}

async fn wait_healthy(fs: &FileSystem) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let fsck = fs.fsck(FILES_DIR).await?;
        if fsck.health == Health::Healthy {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the files are {:?} 120 s after the restart",
            fsck.health
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes the files (pseudo-random bytes) one after the other; returns the write MB/s.
async fn write_files(fs: &FileSystem, args: &ReadArgs, paths: &[String]) -> anyhow::Result<f64> {
    let opts = WriteOptions {
        overwrite: true,
        create_parent: true,
        replication: Some(args.replication),
        block_size: Some(args.block_size.bytes()),
    };
    let started = Instant::now();
    let mut buf = vec![0u8; 4 << 20];
    for (i, path) in paths.iter().enumerate() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
        let mut w = fs.create(path, opts.clone()).await?;
        let mut left = args.size.bytes();
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            rng.fill_bytes(&mut buf[..n]);
            w.write_all(&buf[..n]).await?;
            left -= n as u64;
        }
        w.close().await?;
    }
    let bytes = args.size.bytes() * paths.len() as u64;
    Ok(Sample::new(bytes, started.elapsed().as_secs_f64()).mb_per_s)
}

/// The embedded cluster's directory (its replica files are prepared before each run and
/// read by the floor) and the piece size the floor reads them in.
#[derive(Debug, Clone, Copy)]
struct Local<'a> {
    dir: &'a Path,
    piece: usize,
}

/// Runs every (cache, mode) pair `--runs` times over `paths` read concurrently, interleaved,
/// and, on a local cluster, the floor of each cache state in the same runs.
async fn experiment(
    fs: &FileSystem,
    args: &ReadArgs,
    local: Option<Local<'_>>,
    paths: &[String],
    caches: &[CacheState],
    modes: &[ReadMode],
    prefetch: &str,
) -> anyhow::Result<Vec<Row>> {
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); caches.len() * modes.len()];
    let mut copies: Vec<Vec<Sample>> = vec![Vec::new(); caches.len() * modes.len()];
    let mut file_copies: Vec<Vec<Sample>> = vec![Vec::new(); caches.len() * modes.len()];
    let mut floors: Vec<Vec<FloorSample>> = vec![Vec::new(); caches.len()];
    for _ in 0..args.runs {
        for (ci, cache) in caches.iter().enumerate() {
            if let Some(l) = local {
                prepare(l.dir, *cache).await?;
                floors[ci].push(floor_read(l, args, paths.len()).await?);
            }
            for (mi, mode) in modes.iter().enumerate() {
                // One warm stream's ceiling, paired: the loopback copies just before each
                // run, so that the ratio does not depend on what the machine did minutes
                // earlier (the files are warm: prepared for the floor above).
                if paths.len() == 1 && *cache == CacheState::Warm && *mode == ReadMode::Stream {
                    let i = ci * modes.len() + mi;
                    copies[i].push(loopback_once(args.size.bytes()).await?);
                    if let Some(l) = local {
                        let segs = replica_segments(l.dir, 1, args.size.bytes())?;
                        let segs = segs.into_iter().flatten().collect();
                        file_copies[i].push(loopback_file_once(segs).await?);
                    }
                }
                let resident = match local {
                    Some(l) => prepare(l.dir, *cache).await?,
                    None => None,
                };
                let mut s = timed_read(fs, args, paths, *mode).await?;
                s.resident = resident;
                samples[ci * modes.len() + mi].push(s);
            }
        }
    }
    let mut rows = Vec::new();
    for (ci, cache) in caches.iter().enumerate() {
        for (mi, mode) in modes.iter().enumerate() {
            let runs = std::mem::take(&mut samples[ci * modes.len() + mi]);
            let name = match mode {
                ReadMode::Stream => "stream",
                ReadMode::Chunk => "chunk",
            };
            let row = Row::new(paths.len(), name, cache.name(), prefetch.into(), runs);
            let copies = std::mem::take(&mut copies[ci * modes.len() + mi]);
            let file_copies = std::mem::take(&mut file_copies[ci * modes.len() + mi]);
            let row = row.with_floor(floors[ci].clone());
            rows.push(row.with_loopback(copies, file_copies));
        }
    }
    Ok(rows)
}

/// The floor of `readers` readers ([`floor::read`]): each reads `--size` bytes of the replica
/// files under the cluster's directory (data files only, in name order, each reader its own
/// stretch), in the page-cache state the caller prepared.
async fn floor_read(l: Local<'_>, args: &ReadArgs, readers: usize) -> anyhow::Result<FloorSample> {
    let segs = replica_segments(l.dir, readers, args.size.bytes())?;
    let (piece, read) = (l.piece, args.read_size.as_usize());
    Ok(tokio::task::spawn_blocking(move || floor::read(&segs, piece, read)).await??)
}

/// The replica data files under `dir` (not the `.meta` files), in name order, cut into
/// `readers` stretches of `size` bytes ([`floor::segments`]).
fn replica_segments(
    dir: &Path,
    readers: usize,
    size: u64,
) -> anyhow::Result<Vec<Vec<floor::Segment>>> {
    let files: Vec<PathBuf> = cache::replica_files(dir)
        .into_iter()
        .filter(|p| p.extension().is_none_or(|e| e != "meta"))
        .collect();
    Ok(floor::segments(&files, readers, size)?)
}

/// Warms or evicts every replica file under `dir`; the fraction of their pages resident
/// afterwards (`mincore`), `None` for the cache as it is (an existing cluster's files).
async fn prepare(dir: &Path, cache: CacheState) -> anyhow::Result<Option<f64>> {
    if cache == CacheState::AsIs {
        return Ok(None);
    }
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let files = cache::replica_files(&dir);
        anyhow::ensure!(
            !files.is_empty(),
            "no replica files under {}",
            dir.display()
        );
        match cache {
            CacheState::Warm => cache::warm(&files).map(|_| ()),
            _ => cache::evict(&files),
        }
        .context("preparing the page cache")?;
        let resident = cache::resident_fraction(&files).context("mincore over the replicas")?;
        Ok(Some(resident))
    })
    .await?
}

/// Reads every file of `paths` at once, one task each; the aggregate rate.
async fn timed_read(
    fs: &FileSystem,
    args: &ReadArgs,
    paths: &[String],
    mode: ReadMode,
) -> anyhow::Result<Sample> {
    let cpu = process_cpu_secs();
    let started = Instant::now();
    let tasks: Vec<_> = paths
        .iter()
        .map(|p| {
            let (fs, p) = (fs.clone(), p.clone());
            let (read_size, api) = (args.read_size.as_usize().max(1), args.read_api);
            tokio::spawn(async move { read_file(&fs, &p, mode, read_size, api).await })
        })
        .collect();
    let mut total = 0u64;
    for t in tasks {
        total += t.await??;
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = process_cpu_secs() - cpu;
    let want = args.size.bytes() * paths.len() as u64;
    anyhow::ensure!(total == want, "read {total} bytes, expected {want}");
    Ok(Sample::with_cpu(total, secs, cpu))
}

async fn read_file(
    fs: &FileSystem,
    path: &str,
    mode: ReadMode,
    read_size: usize,
    api: ReadApi,
) -> anyhow::Result<u64> {
    let opts = ReadOptions {
        mode: Some(mode),
        ..ReadOptions::default()
    };
    let mut r = fs.open_with(path, opts).await?;
    let mut total = 0u64;
    if api == ReadApi::Bytes {
        loop {
            let b = r.read_bytes(read_size).await?;
            if b.is_empty() {
                return Ok(total);
            }
            total += b.len() as u64;
        }
    }
    let mut buf = vec![0u8; read_size];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

/// A plain tokio socket copy of `--size` bytes over loopback, `--runs` times.
async fn loopback(args: &ReadArgs) -> anyhow::Result<Row> {
    let mut runs = Vec::new();
    for _ in 0..args.runs {
        runs.push(loopback_once(args.size.bytes()).await?);
    }
    Ok(Row::new(1, "tcp", "-", "-".into(), runs))
}

async fn loopback_once(bytes: u64) -> anyhow::Result<Sample> {
    timed_copy(bytes, move |mut s| async move {
        let buf = vec![0xa5u8; COPY_SIZE];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            s.write_all(&buf[..n]).await?;
            left -= n as u64;
        }
        s.shutdown().await
    })
    .await
}

/// The same copy of the file's own bytes: `segs` of the (warm) replica files sent from a
/// mapping of them (`send(2)` straight from the page cache, as the DataNode sends a cached
/// piece) in the same 1 MiB sends, instead of one buffer sent over and over. The copy above
/// never leaves the CPU caches; this one reads each byte from memory once, as any read of
/// the file must.
async fn loopback_file_once(segs: Vec<floor::Segment>) -> anyhow::Result<Sample> {
    let bytes = segs.iter().map(|s| s.len).sum();
    let mut maps = Vec::new();
    for seg in segs {
        let file = std::fs::File::open(&seg.path)
            .with_context(|| format!("opening {}", seg.path.display()))?;
        let len = usize::try_from(seg.len).context("a segment larger than memory")?;
        let map = FileMap::new(&file, seg.offset, len)
            .with_context(|| format!("mapping {}", seg.path.display()))?;
        maps.push((map, seg));
    }
    timed_copy(bytes, move |mut s| async move {
        use std::os::fd::AsRawFd as _;
        for (map, seg) in &maps {
            let failed = |e: std::io::Error| {
                std::io::Error::new(e.kind(), format!("sending {}: {e}", seg.path.display()))
            };
            let mut at = 0u64;
            while at < seg.len {
                let n = (seg.len - at).min(COPY_SIZE as u64) as usize;
                s.writable().await?;
                let sent = s.try_io(tokio::io::Interest::WRITABLE, || {
                    map.send(s.as_raw_fd(), seg.offset + at, n)
                });
                match sent {
                    Ok(0) => return Err(failed(std::io::Error::other("the file shrank"))),
                    Ok(k) => at += k as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(failed(e)),
                }
            }
        }
        s.shutdown().await
    })
    .await
}

/// Bytes per send and per receive of the loopback copies.
const COPY_SIZE: usize = 1 << 20;

/// Times a loopback copy: `send` writes `bytes` to the accepted socket; the receiver reads
/// them `COPY_SIZE` at a time into one buffer.
async fn timed_copy<F, Fut>(bytes: u64, send: F) -> anyhow::Result<Sample>
where
    F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<()>> + Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let sender = tokio::spawn(async move {
        let (s, _) = listener.accept().await?;
        send(s).await
    });
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    let cpu = process_cpu_secs();
    let started = Instant::now();
    let mut buf = vec![0u8; COPY_SIZE];
    let mut got = 0u64;
    loop {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    sender.await??;
    let cpu = process_cpu_secs() - cpu;
    anyhow::ensure!(got == bytes, "loopback copy moved {got} of {bytes} bytes");
    Ok(Sample::with_cpu(got, secs, cpu))
}
