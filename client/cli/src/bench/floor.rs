//! The floor: what the same bytes cost without Sluice, measured in the same run as Sluice
//! and the same way (wall time, and the process's CPU time from `getrusage`).
//!
//! - **Write** ([`write`]): the chain a replicated write's bytes take. For each file, a source
//!   thread writes `size` bytes in writes of the client's packet size to the first of
//!   `replicas` relay threads over loopback TCP; each relay reads whole packets, forwards them
//!   to the next relay (if any) over its own loopback socket, writes them to its own file
//!   with one `write` per packet, and at the end `fdatasync`s the file when the DataNodes sync
//!   on close. So: as many loopback hops as replicas, as many file writes, the same write
//!   sizes and fsync policy — and nothing else (no framing, checksums, acks or metadata).
//! - **Read** ([`read`]): for each reader, a server thread reads the bytes from files (the
//!   benchmark's own replica files, in the page-cache state the experiment prepared) in
//!   pieces of the DataNodes' piece size and writes them to a loopback socket; the reader
//!   reads them in the application's read size. One file read and one loopback copy.
//!
//! Plain blocking threads, one per hop (named, joined): the simplest program that moves the
//! bytes, not a tuned one.

use serde::Serialize;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::cache;
use super::report::process_cpu_secs;

/// One timed run of the floor.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FloorSample {
    /// Wall seconds.
    pub secs: f64,
    /// MB/s (10^6 bytes) of file data.
    pub mb_per_s: f64,
    /// Process CPU seconds (user + system) per GiB of file data.
    pub cpu_secs_per_gib: f64,
}

impl FloorSample {
    /// `bytes` moved in `secs` using `cpu` CPU seconds.
    pub fn new(bytes: u64, secs: f64, cpu: f64) -> FloorSample {
        FloorSample {
            secs,
            mb_per_s: bytes as f64 / secs.max(1e-9) / 1e6,
            cpu_secs_per_gib: cpu / (bytes.max(1) as f64 / (1u64 << 30) as f64),
        }
    }
}

/// An experiment's figures next to its floor's (medians over the runs), as every benchmark
/// row carries them (flattened into the row's JSON).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct VsFloor {
    /// Sluice's MB/s of file data.
    pub mb_s: f64,
    /// Sluice's process CPU seconds per GiB of file data.
    pub cpu_s_per_gib: f64,
    /// The floor's MB/s (`None`: not measured, e.g. an existing cluster).
    pub floor_mb_s: Option<f64>,
    /// The floor's CPU seconds per GiB.
    pub floor_cpu_s_per_gib: Option<f64>,
    /// `mb_s / floor_mb_s` (1 = as fast as the floor).
    pub mb_s_vs_floor: Option<f64>,
    /// `cpu_s_per_gib / floor_cpu_s_per_gib` (1 = as cheap as the floor).
    pub cpu_vs_floor: Option<f64>,
}

impl VsFloor {
    /// Sluice's medians against the floor's runs (medians of both).
    pub fn new(mb_s: f64, cpu_s_per_gib: f64, floor: &[FloorSample]) -> VsFloor {
        let median = |f: fn(&FloorSample) -> f64| {
            (!floor.is_empty()).then(|| super::report::Spread::of(floor.iter().map(f)).median)
        };
        let floor_mb_s = median(|s| s.mb_per_s);
        let floor_cpu = median(|s| s.cpu_secs_per_gib);
        VsFloor {
            mb_s,
            cpu_s_per_gib,
            floor_mb_s,
            floor_cpu_s_per_gib: floor_cpu,
            mb_s_vs_floor: floor_mb_s.map(|f| mb_s / f.max(1e-9)),
            cpu_vs_floor: floor_cpu.map(|f| cpu_s_per_gib / f.max(1e-9)),
        }
    }

    /// Table cells: floor MB/s, Sluice/floor MB/s, floor CPU s/GiB, Sluice/floor CPU.
    pub fn cells(&self) -> [String; 4] {
        let o = |v: Option<f64>, d: usize| super::report::opt(v, d);
        [
            o(self.floor_mb_s, 0),
            o(self.mb_s_vs_floor, 2),
            o(self.floor_cpu_s_per_gib, 2),
            o(self.cpu_vs_floor, 2),
        ]
    }
}

/// The write chain's shape.
#[derive(Debug, Clone, Copy)]
pub struct WriteChain {
    /// Loopback hops and files per chain (the replicas of a block).
    pub replicas: usize,
    /// Bytes per socket and file write (the client's packet size).
    pub write_size: usize,
    /// `fdatasync` each file at the end (the DataNodes' `sync.on.close`).
    pub sync: bool,
    /// Drop each file's written pages behind every this many bytes (`posix_fadvise
    /// (DONTNEED)`, which also queues dirty pages for writeback), as the DataNodes' buffered
    /// replicas do with `write.buffer.drop.behind` after each flush; `None`: never.
    pub drop_behind: Option<u64>,
}

/// `files` chains at once, each moving `size` bytes (copies of `data`) into `replicas` files
/// under `dir` (removed afterwards). Blocking: run it off the async runtime.
pub fn write(
    dir: &Path,
    files: usize,
    size: u64,
    chain: WriteChain,
    data: Arc<Vec<u8>>,
) -> io::Result<FloorSample> {
    std::fs::create_dir_all(dir)?;
    let bytes = files as u64 * size;
    let r = timed(files, bytes, |f| {
        start_chain(dir, f, size, chain, data.clone())
    });
    let _ = std::fs::remove_dir_all(dir);
    r
}

/// Starts `groups` groups of threads with `start`, joins them all, and times the whole:
/// wall time and process CPU time for `bytes` of file data.
fn timed(
    groups: usize,
    bytes: u64,
    mut start: impl FnMut(usize) -> io::Result<Vec<Worker>>,
) -> io::Result<FloorSample> {
    let cpu = process_cpu_secs();
    let started = Instant::now();
    let mut threads = Vec::new();
    let mut result = Ok(());
    for i in 0..groups {
        match start(i) {
            Ok(t) => threads.extend(t),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    for t in threads {
        let r = t
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("a floor thread panicked")));
        result = result.and(r);
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = process_cpu_secs() - cpu;
    result?;
    Ok(FloorSample::new(bytes, secs, cpu))
}

type Worker = JoinHandle<io::Result<()>>;

fn spawn(name: String, f: impl FnOnce() -> io::Result<()> + Send + 'static) -> io::Result<Worker> {
    std::thread::Builder::new().name(name).spawn(f)
}

/// The relays of one chain (last first, so each knows where to forward) and its source.
fn start_chain(
    dir: &Path,
    file: usize,
    size: u64,
    chain: WriteChain,
    data: Arc<Vec<u8>>,
) -> io::Result<Vec<Worker>> {
    let mut threads = Vec::new();
    let mut next: Option<std::net::SocketAddr> = None;
    for r in (0..chain.replicas.max(1)).rev() {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let path = dir.join(format!("floor-{file}-{r}"));
        let downstream = next;
        threads.push(spawn(format!("floor-relay-{file}-{r}"), move || {
            relay(&listener, downstream, &path, chain)
        })?);
        next = Some(addr);
    }
    let first = next.ok_or_else(|| io::Error::other("no relay"))?;
    threads.push(spawn(format!("floor-source-{file}"), move || {
        let mut s = TcpStream::connect(first)?;
        let write = chain.write_size.clamp(1, data.len().max(1));
        let mut left = size;
        let mut at = 0usize;
        while left > 0 {
            let n = (left.min(write as u64) as usize).min(data.len() - at);
            s.write_all(&data[at..at + n])?;
            at = (at + n) % data.len();
            left -= n as u64;
        }
        s.shutdown(Shutdown::Write)
    })?);
    Ok(threads)
}

/// One hop: accept the upstream, forward each packet downstream, write it to the file.
fn relay(
    listener: &TcpListener,
    downstream: Option<std::net::SocketAddr>,
    path: &Path,
    chain: WriteChain,
) -> io::Result<()> {
    let (mut up, _) = listener.accept()?;
    let mut down = downstream.map(TcpStream::connect).transpose()?;
    let mut file = File::create(path)?;
    let mut buf = vec![0u8; chain.write_size.max(1)];
    let (mut written, mut dropped) = (0u64, 0u64);
    loop {
        let n = fill(&mut up, &mut buf)?;
        if n == 0 {
            break;
        }
        if let Some(d) = down.as_mut() {
            d.write_all(&buf[..n])?;
        }
        file.write_all(&buf[..n])?;
        written += n as u64;
        if let Some(step) = chain.drop_behind.filter(|s| written - dropped >= 2 * s) {
            // As a buffered replica: the stretch before the last one, which the kernel has
            // had a stretch's time to write back.
            cache::drop_pages(&file, dropped, step)?;
            dropped += step;
        }
    }
    if let Some(d) = down {
        d.shutdown(Shutdown::Write)?;
    }
    if chain.sync {
        file.sync_data()?;
    }
    if chain.drop_behind.is_some() {
        cache::drop_pages(&file, 0, 0)?;
    }
    Ok(())
}

/// Reads until `buf` is full or the stream ends; the bytes read.
fn fill(s: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A stretch of a file.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The file.
    pub path: PathBuf,
    /// Where the stretch starts.
    pub offset: u64,
    /// Its length.
    pub len: u64,
}

/// Cuts the concatenation of `files` into `readers` runs of `size` bytes each; an error when
/// the files hold fewer than `readers * size` bytes.
pub fn segments(files: &[PathBuf], readers: usize, size: u64) -> io::Result<Vec<Vec<Segment>>> {
    let mut out = vec![Vec::new(); readers];
    let mut reader = 0;
    let mut need = size;
    for path in files {
        let len = std::fs::metadata(path)?.len();
        let mut offset = 0;
        while offset < len && reader < readers {
            let take = need.min(len - offset);
            out[reader].push(Segment {
                path: path.clone(),
                offset,
                len: take,
            });
            offset += take;
            need -= take;
            if need == 0 {
                reader += 1;
                need = size;
            }
        }
    }
    if reader < readers && size > 0 {
        return Err(io::Error::other(format!(
            "the files hold fewer than {readers} x {size} bytes"
        )));
    }
    Ok(out)
}

/// Every reader at once: a server thread reads its segments in `piece` bytes and writes them
/// to a loopback socket, the reader reads them `read_size` at a time.
pub fn read(readers: &[Vec<Segment>], piece: usize, read_size: usize) -> io::Result<FloorSample> {
    let bytes: u64 = readers.iter().flatten().map(|s| s.len).sum();
    timed(readers.len(), bytes, |i| {
        start_reader(i, readers[i].clone(), piece, read_size)
    })
}

fn start_reader(
    i: usize,
    segs: Vec<Segment>,
    piece: usize,
    read_size: usize,
) -> io::Result<Vec<Worker>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let want: u64 = segs.iter().map(|s| s.len).sum();
    let server = spawn(format!("floor-server-{i}"), move || {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; piece.max(1)];
        for seg in segs {
            let mut f = File::open(&seg.path)?;
            f.seek(SeekFrom::Start(seg.offset))?;
            let mut left = seg.len;
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                let n = fill(&mut f, &mut buf[..want])?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "a replica file shrank",
                    ));
                }
                s.write_all(&buf[..n])?;
                left -= n as u64;
            }
        }
        s.shutdown(Shutdown::Write)
    })?;
    let client = spawn(format!("floor-reader-{i}"), move || {
        let mut s = TcpStream::connect(addr)?;
        let mut buf = vec![0u8; read_size.max(1)];
        let mut got = 0u64;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        if got != want {
            return Err(io::Error::other(format!("read {got} of {want} bytes")));
        }
        Ok(())
    })?;
    Ok(vec![server, client])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_write_chain_writes_every_byte_into_every_replica_file() {
        let tmp = tempfile::tempdir().unwrap();
        let data: Arc<Vec<u8>> = Arc::new((0..100_000u32).map(|i| (i % 251) as u8).collect());
        let chain = WriteChain {
            replicas: 3,
            write_size: 64 << 10,
            sync: true,
            drop_behind: Some(128 << 10),
        };
        // `write` removes its files: look at one chain's files by running it directly.
        let s = write(&tmp.path().join("w"), 2, 1 << 20, chain, data.clone()).unwrap();
        assert!(s.mb_per_s > 0.0 && s.cpu_secs_per_gib >= 0.0, "{s:?}");
        assert!(
            !tmp.path().join("w").exists(),
            "the floor's files are removed"
        );
        let threads = start_chain(tmp.path(), 0, 300_000, chain, data.clone()).unwrap();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        for r in 0..3 {
            let got = std::fs::read(tmp.path().join(format!("floor-0-{r}"))).unwrap();
            let want: Vec<u8> = data
                .iter()
                .chain(data.iter())
                .chain(data.iter())
                .copied()
                .collect();
            assert_eq!(got, want, "replica {r}");
        }
    }

    #[test]
    fn the_read_floor_moves_each_readers_share_of_the_files() {
        let tmp = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> = (0..3)
            .map(|i| {
                let p = tmp.path().join(format!("blk_{i}"));
                std::fs::write(&p, vec![i as u8; 700]).unwrap();
                p
            })
            .collect();
        let segs = segments(&files, 2, 1000).unwrap();
        assert_eq!(segs[0].iter().map(|s| s.len).sum::<u64>(), 1000);
        assert_eq!(segs[1].iter().map(|s| s.len).sum::<u64>(), 1000);
        assert_eq!((segs[1][0].offset, segs[1][0].len), (300, 400));
        assert!(
            segments(&files, 3, 1000).is_err(),
            "2100 bytes are not 3 x 1000"
        );
        let s = read(&segs, 256, 100).unwrap();
        assert!(s.mb_per_s > 0.0, "{s:?}");
    }
}
