//! End-to-end tests of the read path on a MiniCluster: stream and chunk modes, the
//! DataNode's prefetch on and off, the client's bounded buffer (reads and forward seeks inside
//! it send no request), positioned reads that leave the stream alone, the edges (out of range,
//! error statuses, corrupt data, empty files, seeks past the end), a seeded property test of
//! random seeks and reads against a local copy, and failover when the serving DataNode dies or
//! serves corrupt bytes.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use rand::{Rng, SeedableRng};
use sluice_client::{ClientError, FileReader, ReadMode, ReadOptions, WriteOptions};
use sluice_common::config::{ByteSize, HumanDuration, PrefetchAdvice, SendfileMode};
use sluice_common::proto::{Message, Op, ReadBlockOp, ReadChunkOp};
use sluice_common::rpc::Health;
use sluice_common::Status;
use sluice_tests::raw::RawConn;
use sluice_tests::{random_bytes, wait_until, with_timeout, write_all, MiniCluster};
use std::io::SeekFrom;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

const LIMIT: Duration = Duration::from_secs(180);
const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

fn opts(mode: ReadMode) -> ReadOptions {
    ReadOptions {
        mode: Some(mode),
        ..ReadOptions::default()
    }
}

fn wopts(block_size: u64) -> WriteOptions {
    WriteOptions {
        create_parent: true,
        block_size: Some(block_size),
        ..WriteOptions::default()
    }
}

/// The `ClientError` inside an `io::Error` from `AsyncRead`/`AsyncSeek`.
fn client_error(e: &std::io::Error) -> &ClientError {
    e.get_ref()
        .and_then(|e| e.downcast_ref::<ClientError>())
        .unwrap_or_else(|| panic!("not a ClientError: {e:?}"))
}

/// ReadBlock and ReadChunk requests served by every running DataNode.
fn dn_requests(cluster: &MiniCluster) -> (u64, u64) {
    let mut out = (0, 0);
    for i in 0..cluster.datanode_count() {
        if let Some(dn) = cluster.datanode(i) {
            let m = dn.metrics();
            out.0 += m.read_block_ops.get();
            out.1 += m.read_chunk_ops.get();
        }
    }
    out
}

async fn read_to_end(r: &mut FileReader) -> Vec<u8> {
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_modes_read_exact_bytes_chosen_by_config_or_per_open() {
    with_timeout(LIMIT, "modes", async {
        sluice_tests::init_logging();
        let cluster = MiniCluster::builder().start().await.unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes((3 * 256 * KIB + 12_345) as usize, 1);
        write_all(&fs, "/m/f", &data, wopts(256 * KIB), 100_000)
            .await
            .unwrap();

        // Default: stream. Only ReadBlock requests, one per block.
        let before = dn_requests(&cluster);
        let mut r = fs.open("/m/f").await.unwrap();
        assert_eq!(r.mode(), ReadMode::Stream);
        assert!(read_to_end(&mut r).await == data, "stream mode bytes");
        let after = dn_requests(&cluster);
        assert_eq!(after.0 - before.0, 4, "one ReadBlock per block");
        assert_eq!(after.1, before.1, "no ReadChunk in stream mode");
        assert_eq!(r.stats().requests, 4);

        // Per open: chunk. One ReadChunk per chunk (4 MiB default > block: one per block).
        let mut r = fs.open_with("/m/f", opts(ReadMode::Chunk)).await.unwrap();
        assert!(read_to_end(&mut r).await == data, "chunk mode bytes");
        let after2 = dn_requests(&cluster);
        assert_eq!(after2.0, after.0, "no ReadBlock in chunk mode");
        assert_eq!(after2.1 - after.1, 4);

        // By configuration: read.mode = chunk, with 64 KiB chunks.
        let fs_chunk = cluster
            .client_with(|c| {
                c.read_mode = ReadMode::Chunk;
                c.read_chunk_size = ByteSize::kib(64);
            })
            .await
            .unwrap();
        let mut r = fs_chunk.open("/m/f").await.unwrap();
        assert_eq!(r.mode(), ReadMode::Chunk);
        assert!(read_to_end(&mut r).await == data);
        let chunks = data.len().div_ceil(64 * KIB as usize) as u64;
        assert_eq!(r.stats().requests, chunks, "one request per 64 KiB chunk");
        assert_eq!(dn_requests(&cluster).1 - after2.1, chunks);
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datanode_prefetch_advises_and_reads_ahead_and_can_be_turned_off() {
    with_timeout(LIMIT, "prefetch", async {
        sluice_tests::init_logging();
        // DataNode 0 prefetches (the default 8 MiB) with kernel advice, 1 without advice (read
        // ahead into buffers only), 2 not at all.
        let cluster = MiniCluster::builder()
            .configure_datanodes(|i, c| match i {
                0 => c.read_prefetch_fadvise = PrefetchAdvice::On,
                1 => c.read_prefetch_fadvise = PrefetchAdvice::Off,
                _ => c.read_prefetch_bytes = ByteSize(0),
            })
            .start()
            .await
            .unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes((6 * MIB + 7) as usize, 2);
        write_all(&fs, "/p/f", &data, wopts(8 * MIB), 1 << 20)
            .await
            .unwrap();
        let lb = fs.get_block_locations("/p/f").await.unwrap().blocks[0].clone();
        for i in 0..3 {
            let m = cluster.datanode(i).unwrap().metrics();
            let (advised, pieces) = (m.prefetch_advised_bytes.get(), m.pieces_sent.get());
            let dn = cluster.datanode(i).unwrap().datanode_id();
            let mut conn = RawConn::connect(&dn.data_addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            let (got, _) = conn.read_replica(lb.block).await.unwrap();
            assert!(got == data, "DataNode {i} streams the exact bytes");
            let advised = m.prefetch_advised_bytes.get() - advised;
            assert_eq!(m.pieces_sent.get() - pieces, 7, "1 MiB pieces");
            if i == 0 {
                assert!(advised >= 6 * MIB, "WILLNEED over the range: {advised}");
            } else {
                assert_eq!(advised, 0, "no advice on DataNode {i}");
            }
            assert!(
                m.dropbehind_bytes.get() > 0,
                "a 6 MiB read drops pages behind it"
            );
        }
        cluster.shutdown().await;
    })
    .await
}

/// The first block of `path`, the index of the DataNode first in its locations, and that
/// replica's block and metadata files.
async fn first_replica(
    cluster: &MiniCluster,
    fs: &sluice_client::FileSystem,
    path: &str,
) -> (
    sluice_common::rpc::LocatedBlock,
    usize,
    Vec<std::path::PathBuf>,
) {
    let lb = fs.get_block_locations(path).await.unwrap().blocks[0].clone();
    let node = &lb.locations[0].node_id;
    let i = (0..cluster.datanode_count())
        .find(|&i| &cluster.datanode(i).unwrap().datanode_id().node_id == node)
        .unwrap();
    let files = replica_and_meta(cluster, i, lb.block.id.0);
    (lb, i, files)
}

/// The block file and the metadata file of replica `id` on DataNode `i`.
fn replica_and_meta(cluster: &MiniCluster, i: usize, id: u64) -> Vec<std::path::PathBuf> {
    let block_file = cluster.replica_files(i, id).remove(0);
    let meta_name = format!("blk_{id}_");
    let mut files = vec![block_file.clone()];
    for e in std::fs::read_dir(block_file.parent().unwrap()).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with(&meta_name) && name.ends_with(".meta") {
            files.push(p);
        }
    }
    assert_eq!(files.len(), 2, "block and metadata file: {files:?}");
    files
}

/// Which pages of `file` are in the page cache.
fn resident_pages(file: &std::path::Path) -> Vec<bool> {
    let f = std::fs::File::open(file).unwrap();
    sluice_common::memory::resident_pages(&f, f.metadata().unwrap().len()).unwrap()
}

/// Reads `file` from `off` to its end (into the page cache).
fn read_from(file: &std::path::Path, off: u64) {
    use std::io::{Read, Seek};
    let mut f = std::fs::File::open(file).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    std::io::copy(&mut f.by_ref(), &mut std::io::sink()).unwrap();
}

/// The page-cache state of every file of a replica: read whole (warm) or written back and
/// dropped (`fdatasync`, `posix_fadvise(DONTNEED)`: cold).
#[allow(unsafe_code)] // posix_fadvise: the test drops its own replica files' pages
fn set_cache(files: &[std::path::PathBuf], warm: bool) {
    use std::os::fd::AsRawFd;
    for f in files {
        if warm {
            std::fs::read(f).unwrap();
        } else {
            let file = std::fs::File::open(f).unwrap();
            file.sync_data().unwrap();
            // SAFETY: a valid fd for the call; fadvise only reads its arguments.
            let rc =
                unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            assert_eq!(rc, 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_pieces_are_sent_by_the_connection_and_the_rest_by_the_prefetching_reader() {
    with_timeout(LIMIT, "cached pieces", async {
        sluice_tests::init_logging();
        for how in [CachedSend::Sendfile, CachedSend::Mapped, CachedSend::Buffer] {
            cached_and_cold_reads(how).await;
        }
    })
    .await
}

/// How a DataNode is configured to send the data of cached pieces to a loopback reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CachedSend {
    /// `read.sendfile = on`.
    Sendfile,
    /// `read.sendfile = auto` (never for loopback peers), `read.mmap.enabled = true`.
    Mapped,
    /// `read.sendfile = off`, `read.mmap.enabled = false`: read into a buffer.
    Buffer,
}

impl CachedSend {
    fn configure(self, c: &mut sluice_common::config::DatanodeConfig) {
        (c.read_sendfile, c.read_mmap) = match self {
            CachedSend::Sendfile => (SendfileMode::On, false),
            CachedSend::Mapped => (SendfileMode::Auto, true),
            CachedSend::Buffer => (SendfileMode::Off, false),
        };
    }
}

/// A warm and a cold `ReadBlock` of one replica, cached pieces sent `how`: which path each
/// piece took.
async fn cached_and_cold_reads(how: CachedSend) {
    let cluster = MiniCluster::builder()
        .configure_datanodes(move |_, c| how.configure(c))
        .start()
        .await
        .unwrap();
    let fs = cluster.client().await.unwrap();
    // Nine 1 MiB pieces and one of 7 bytes: two 8 MiB mapping windows when mapped.
    let data = random_bytes((9 * MIB + 7) as usize, 9);
    write_all(&fs, "/c/f", &data, wopts(16 * MIB), 1 << 20)
        .await
        .unwrap();
    let (lb, i, files) = first_replica(&cluster, &fs, "/c/f").await;
    let dn = lb.locations[0].clone();
    let m = cluster.datanode(i).unwrap().metrics();
    let counts = || {
        [
            m.stream_pieces_cached.get(),
            m.stream_pieces_sendfile.get(),
            m.stream_pieces_mapped.get(),
            m.stream_pieces_holes.get(),
            m.prefetch_hits.get() + m.prefetch_misses.get(),
        ]
    };
    // `hole`: the first 64 KiB of the block evicted after warming it.
    let read = async |warm: bool, hole: bool| {
        // Read-ahead still pending from an earlier read can bring pages back after they were
        // dropped: set the state until the block file's residency shows it.
        let hole_end = if hole { MIB } else { 0 };
        wait_until(Duration::from_secs(20), "page-cache state", || {
            if hole {
                // Dropped whole, then read from the end of the hole on (a part of a large
                // folio cannot be dropped alone).
                set_cache(&files, false);
                read_from(&files[0], hole_end);
                std::fs::read(&files[1]).unwrap();
            } else {
                set_cache(&files, warm);
            }
            let pages = resident_pages(&files[0]);
            let want = |i: usize| warm && i as u64 * 4096 >= hole_end;
            async move { pages.iter().enumerate().all(|(i, &r)| r == want(i)) }
        })
        .await;
        let before = counts();
        let mut conn = RawConn::connect(&dn.data_addr)
            .await
            .unwrap()
            .with_token(lb.token.clone());
        let (got, _) = conn.read_replica(lb.block).await.unwrap();
        assert!(got == data, "exact bytes (warm: {warm}, {how:?})");
        let after = counts();
        std::array::from_fn::<u64, 5, _>(|k| after[k] - before[k])
    };
    const WHAT: &str = "(cached, with sendfile, from a mapping, holes, through the reader)";
    // All ten pieces in the page cache, all read and sent by the connection task: with
    // sendfile, from a mapping, or through a buffer.
    let expect = |cached: u64| match how {
        CachedSend::Sendfile => [cached, cached, 0],
        CachedSend::Mapped => [cached, 0, cached],
        CachedSend::Buffer => [cached, 0, 0],
    };
    let [c, sf, mp] = expect(10);
    assert_eq!(
        read(true, false).await,
        [c, sf, mp, 0, 0],
        "warm, {how:?}: {WHAT}"
    );
    // A hole at the start of a cached block (its first piece not cached): that piece from the
    // disk on the blocking pool, the nine after it still cached, none through the reader.
    let [c, sf, mp] = expect(9);
    assert_eq!(
        read(true, true).await,
        [c, sf, mp, 1, 0],
        "hole, {how:?}: {WHAT}"
    );
    // Nothing cached: the first piece already goes to the reader task, which keeps the rest.
    assert_eq!(
        read(false, false).await,
        [0, 0, 0, 0, 10],
        "cold, {how:?}: {WHAT}"
    );
    cluster.shutdown().await;
}

/// `read.o.direct.enabled`: a cold stream's pieces are read with O_DIRECT, past the page
/// cache — the bytes exact (the last piece's length not a multiple of 4 KiB), the block file
/// left with no page in the cache. The same read through the page cache, drop-behind off,
/// leaves the block file resident: the residency check can tell the two apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_pieces_are_read_with_o_direct_past_the_page_cache() {
    with_timeout(LIMIT, "O_DIRECT reads", async {
        sluice_tests::init_logging();
        for direct in [true, false] {
            cold_read_with_o_direct(direct).await;
        }
    })
    .await
}

async fn cold_read_with_o_direct(direct: bool) {
    let cluster = MiniCluster::builder()
        .configure_datanodes(move |_, c| {
            c.read_o_direct = direct;
            // No drop-behind: a read through the page cache leaves its pages there.
            c.read_ahead_cache_threshold = ByteSize::gib(1);
        })
        .start()
        .await
        .unwrap();
    let fs = cluster.client().await.unwrap();
    let data = random_bytes((3 * MIB + 1000) as usize, 17);
    write_all(&fs, "/d/f", &data, wopts(16 * MIB), 1 << 20)
        .await
        .unwrap();
    let (lb, i, files) = first_replica(&cluster, &fs, "/d/f").await;
    let dn = lb.locations[0].clone();
    // Where the file system refuses O_DIRECT (tmpfs on older kernels) the stream reads
    // through the page cache, and only that fallback can be checked.
    let supported = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&files[0])
        .is_ok();
    if direct && !supported {
        eprintln!("this file system refuses O_DIRECT; the test checks the fallback only");
    }
    wait_until(
        Duration::from_secs(20),
        "the block file out of the page cache",
        || {
            set_cache(&files, false);
            let none = resident_pages(&files[0]).iter().all(|&r| !r);
            async move { none }
        },
    )
    .await;
    let m = cluster.datanode(i).unwrap().metrics();
    let before = m.stream_pieces_direct.get();
    let mut conn = RawConn::connect(&dn.data_addr)
        .await
        .unwrap()
        .with_token(lb.token.clone());
    let (got, _) = conn.read_replica(lb.block).await.unwrap();
    assert!(got == data, "exact bytes (direct: {direct})");
    let pieces = m.stream_pieces_direct.get() - before;
    let resident = resident_pages(&files[0]).iter().filter(|&&r| r).count();
    if direct && supported {
        assert_eq!(
            pieces, 4,
            "three 1 MiB pieces and one of 1000 bytes, all O_DIRECT"
        );
        assert_eq!(
            resident, 0,
            "nothing of the block file put in the page cache"
        );
    } else {
        assert_eq!(pieces, 0, "no O_DIRECT read (direct: {direct})");
        assert!(
            resident > 0,
            "a read through the page cache leaves pages there"
        );
    }
    cluster.shutdown().await;
}

/// A block file that cannot be mapped (failpoint `dn::map`) costs the stream nothing but the
/// mapping: its cached pieces go through a buffer, the bytes exact.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_file_that_cannot_be_mapped_is_sent_through_a_buffer() {
    with_timeout(LIMIT, "map failure", async {
        sluice_tests::init_logging();
        let cluster = MiniCluster::builder()
            .datanodes(1)
            .replication(1)
            .configure_datanodes(|_, c| CachedSend::Mapped.configure(c))
            .start()
            .await
            .unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes((3 * MIB + 7) as usize, 4);
        write_all(&fs, "/m/f", &data, wopts(8 * MIB), 1 << 20)
            .await
            .unwrap();
        let lb = fs.get_block_locations("/m/f").await.unwrap().blocks[0].clone();
        let files = replica_and_meta(&cluster, 0, lb.block.id.0);
        let m = cluster.datanode(0).unwrap().metrics();
        let port = cluster.datanode(0).unwrap().data_addr().port();
        fail::cfg("dn::map", &format!("return({port}:error)")).unwrap();
        let (cached, mapped) = (m.stream_pieces_cached.get(), m.stream_pieces_mapped.get());
        set_cache(&files, true);
        let mut conn = RawConn::connect(&lb.locations[0].data_addr)
            .await
            .unwrap()
            .with_token(lb.token.clone());
        let got = conn.read_replica(lb.block).await;
        fail::remove("dn::map");
        assert!(got.unwrap().0 == data, "exact bytes");
        assert_eq!(m.stream_pieces_cached.get() - cached, 4, "cached pieces");
        assert_eq!(
            m.stream_pieces_mapped.get() - mapped,
            0,
            "none from a mapping"
        );
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_forward_seeks_inside_the_buffer_send_no_request() {
    with_timeout(LIMIT, "buffer", async {
        sluice_tests::init_logging();
        let cluster = MiniCluster::builder()
            .configure_client(|c| {
                c.read_buffer_bytes = ByteSize::kib(512);
                c.read_piece_bytes = ByteSize::kib(64);
            })
            .start()
            .await
            .unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes((4 * MIB) as usize, 3);
        write_all(&fs, "/b/f", &data, wopts(8 * MIB), 1 << 20)
            .await
            .unwrap();
        let mut r = fs.open("/b/f").await.unwrap();
        let mut buf = vec![0u8; 1000];
        r.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, data[..1000]);
        // The stream fills the buffer up to its bound, then backpressure stops it.
        wait_until(Duration::from_secs(20), "buffer filled", || {
            let s = r.stats();
            async move { s.buffered >= 512 * KIB - 64 * KIB }
        })
        .await;
        let s = r.stats();
        assert!(s.buffered <= 512 * KIB, "bounded: {s:?}");
        assert!(
            s.bytes_received <= 1000 + 512 * KIB,
            "nothing beyond the bound: {s:?}"
        );
        let requests = dn_requests(&cluster);
        // Forward seeks and reads inside what is buffered: no request anywhere.
        for pos in [5_000u64, 100_000, 300_000, 450_000] {
            r.seek(SeekFrom::Start(pos)).await.unwrap();
            r.read_exact(&mut buf).await.unwrap();
            assert!(buf == data[pos as usize..pos as usize + 1000], "at {pos}");
        }
        assert_eq!(dn_requests(&cluster), requests, "no DataNode request");
        assert_eq!(r.stats().requests, 1);
        // Positioned reads use requests of their own and leave the stream alone.
        let mut pbuf = vec![0u8; 3000];
        assert_eq!(r.read_at(2 * MIB, &mut pbuf).await.unwrap(), 3000);
        assert!(pbuf == data[2 * MIB as usize..2 * MIB as usize + 3000]);
        assert_eq!(r.position(), 451_000);
        let s = r.stats();
        assert_eq!((s.requests, s.positioned_requests), (1, 1));
        r.read_exact(&mut buf).await.unwrap();
        assert!(buf == data[451_000..452_000], "the stream goes on");
        assert_eq!(r.stats().requests, 1);
        // Buffers are released as the reader moves on: what was read is gone.
        let s = r.stats();
        assert!(s.buffered <= 512 * KIB && s.bytes_received - s.buffered >= 452_000);
        // A seek behind the buffer restarts the stream at the new offset.
        r.seek(SeekFrom::Start(10)).await.unwrap();
        r.read_exact(&mut buf).await.unwrap();
        assert!(buf == data[10..1010]);
        assert_eq!(r.stats().requests, 2);
        // So does a seek far ahead; the bytes skipped are never fetched.
        let received = r.stats().bytes_received;
        r.seek(SeekFrom::Start(3 * MIB)).await.unwrap();
        r.read_exact(&mut buf).await.unwrap();
        assert!(buf == data[3 * MIB as usize..3 * MIB as usize + 1000]);
        let s = r.stats();
        assert_eq!(s.requests, 3);
        let fetched = s.bytes_received - received;
        assert!(
            fetched <= 3 * MIB / 2,
            "skipped bytes not fetched: {fetched}"
        );
        // At the end nothing is held.
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.unwrap();
        assert!(rest == data[3 * MIB as usize + 1000..]);
        assert_eq!(r.stats().buffered, 0);
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_and_error_statuses_fail_at_once_with_their_cause() {
    with_timeout(LIMIT, "edges", async {
        sluice_tests::init_logging();
        let cluster = MiniCluster::builder()
            .configure_datanodes(|_, c| c.socket_timeout = HumanDuration::secs(60))
            .configure_client(|c| c.socket_timeout = HumanDuration::secs(60))
            .start()
            .await
            .unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(100_000, 4);
        write_all(&fs, "/e/f", &data, wopts(MIB), 1 << 20)
            .await
            .unwrap();
        let lb = fs.get_block_locations("/e/f").await.unwrap().blocks[0].clone();
        // Offset at or past the block end: ERROR_OUT_OF_RANGE at once, for both ops; the
        // connection takes the next op.
        let mut conn = RawConn::connect(&lb.locations[0].data_addr)
            .await
            .unwrap()
            .with_token(lb.token.clone());
        for offset in [100_000u64, 100_001, u64::MAX] {
            let started = Instant::now();
            let read_block = ReadBlockOp {
                block: lb.block,
                offset,
                length: 10,
                piece_size: 0,
            };
            conn.send_op(Op::ReadBlock(read_block)).await.unwrap();
            let resp = conn.op_response().await.unwrap();
            assert_eq!(resp.status, Status::ErrorOutOfRange, "{resp:?}");
            let read_chunk = ReadChunkOp {
                block: lb.block,
                offset,
                length: 10,
            };
            conn.send_op(Op::ReadChunk(read_chunk)).await.unwrap();
            let resp = conn.op_response().await.unwrap();
            assert_eq!(resp.status, Status::ErrorOutOfRange, "{resp:?}");
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no timeout wait"
            );
        }
        // An error status reaches the reader at once with its cause: every replica's block
        // file is gone, so each DataNode answers ERROR_IO naming the file.
        for i in 0..3 {
            for f in cluster.replica_files(i, lb.block.id.0) {
                std::fs::remove_file(f).unwrap();
            }
        }
        for mode in [ReadMode::Stream, ReadMode::Chunk] {
            let started = Instant::now();
            let mut r = fs.open_with("/e/f", opts(mode)).await.unwrap();
            let mut buf = [0u8; 10];
            let err = r.read(&mut buf).await.expect_err("no replica readable");
            match client_error(&err) {
                ClientError::Datanode {
                    status, message, ..
                } => {
                    assert_eq!(*status, Status::ErrorIo, "{mode:?}");
                    assert!(message.contains("blk_"), "names the file: {message}");
                }
                other => panic!("{mode:?}: {other:?}"),
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no timeout wait"
            );
            assert_eq!(r.stats().reported_bad, 0, "an I/O error is not corruption");
            let err = r.read_at(5, &mut buf).await.expect_err("read_at too");
            assert!(matches!(err, ClientError::Datanode { .. }), "{err:?}");
        }
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_files_seeks_past_the_end_and_corrupt_replicas_everywhere() {
    with_timeout(LIMIT, "eof and corruption", async {
        sluice_tests::init_logging();
        let cluster = MiniCluster::builder().start().await.unwrap();
        let fs = cluster.client().await.unwrap();
        write_all(&fs, "/z/empty", &[], wopts(MIB), 1)
            .await
            .unwrap();
        let data = random_bytes(300_000, 5);
        write_all(&fs, "/z/f", &data, wopts(MIB), 1 << 20)
            .await
            .unwrap();
        for mode in [ReadMode::Stream, ReadMode::Chunk] {
            let mut r = fs.open_with("/z/empty", opts(mode)).await.unwrap();
            assert!(r.is_empty());
            let mut buf = [0u8; 10];
            assert_eq!(r.read(&mut buf).await.unwrap(), 0, "EOF at once");
            assert_eq!(r.read_at(0, &mut buf).await.unwrap(), 0);
            assert_eq!(r.stats().requests, 0, "an empty file asks no DataNode");

            let mut r = fs.open_with("/z/f", opts(mode)).await.unwrap();
            r.seek(SeekFrom::Start(1234)).await.unwrap();
            for bad in [
                SeekFrom::Start(300_001),
                SeekFrom::End(1),
                SeekFrom::Current(-2000),
            ] {
                let err = r.seek(bad).await.expect_err("outside the file");
                assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
                assert!(matches!(
                    client_error(&err),
                    ClientError::SeekOutOfRange { .. }
                ));
                assert_eq!(r.position(), 1234, "position unchanged");
            }
            r.read_exact(&mut buf).await.unwrap();
            assert_eq!(buf, data[1234..1244]);
            assert_eq!(r.seek(SeekFrom::End(0)).await.unwrap(), 300_000);
            assert_eq!(r.read(&mut buf).await.unwrap(), 0);
        }
        // Every replica corrupt: a checksum error naming the block, the chunk and the
        // replica; each replica reported, and fsck shows them.
        let lb = fs.get_block_locations("/z/f").await.unwrap().blocks[0].clone();
        for i in 0..3 {
            corrupt_byte(&cluster, i, lb.block.id.0, 200_000);
        }
        let mut r = fs.open("/z/f").await.unwrap();
        r.seek(SeekFrom::Start(199_000)).await.unwrap();
        let mut buf = vec![0u8; 5000];
        let err = r.read_exact(&mut buf).await.expect_err("all corrupt");
        match client_error(&err) {
            ClientError::Checksum {
                block,
                offset,
                node,
                ..
            } => {
                assert_eq!(*block, lb.block.id);
                assert_eq!(*offset, 200_000 / 512 * 512, "the chunk holding the byte");
                assert!(
                    lb.locations.iter().any(|d| d.to_string() == *node),
                    "{node}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.stats().reported_bad, 3);
        let fsck = fs.fsck("/z/f").await.unwrap();
        assert_eq!(
            fsck.files[0].blocks[0].corrupt_locations.len(),
            3,
            "{fsck:?}"
        );
        cluster.shutdown().await;
    })
    .await
}

/// Flips one byte of DataNode `i`'s replica of block `id` on disk.
fn corrupt_byte(cluster: &MiniCluster, i: usize, id: u64, at: u64) {
    use std::os::unix::fs::FileExt;
    let files = cluster.replica_files(i, id);
    assert_eq!(files.len(), 1, "{files:?}");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&files[0])
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, at).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_seeks_reads_and_positioned_reads_match_a_local_copy() {
    with_timeout(LIMIT, "property", async {
        sluice_tests::init_logging();
        let block = 128 * KIB;
        let cluster = MiniCluster::builder()
            .configure_client(|c| {
                c.read_piece_bytes = ByteSize::kib(8);
                c.read_buffer_bytes = ByteSize::kib(32);
                c.read_chunk_size = ByteSize::kib(16);
            })
            .start()
            .await
            .unwrap();
        let fs = cluster.client().await.unwrap();
        let len = (3 * block + 4321) as usize;
        let data = random_bytes(len, 6);
        write_all(&fs, "/prop/f", &data, wopts(block), 50_000)
            .await
            .unwrap();
        for (mode, seed) in [(ReadMode::Stream, 11u64), (ReadMode::Chunk, 12)] {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut r = fs.open_with("/prop/f", opts(mode)).await.unwrap();
            for step in 0..250 {
                random_step(&mut r, &mut rng, &data).await;
                assert!(r.position() <= len as u64, "{mode:?} step {step}");
            }
        }
        cluster.shutdown().await;
    })
    .await
}

/// One random operation on `r`, checked against `data`.
async fn random_step(r: &mut FileReader, rng: &mut impl Rng, data: &[u8]) {
    let len = data.len() as u64;
    let pos = r.position();
    match rng.random_range(0..7) {
        0 => {
            let to = rng.random_range(0..=len);
            assert_eq!(r.seek(SeekFrom::Start(to)).await.unwrap(), to);
        }
        1 => {
            // A short forward seek, often inside the buffer.
            let d = rng.random_range(0..40_000u64).min(len - pos);
            r.seek(SeekFrom::Current(d as i64)).await.unwrap();
        }
        2 => {
            let past = len + rng.random_range(1..1000);
            assert!(r.seek(SeekFrom::Start(past)).await.is_err());
            assert_eq!(r.position(), pos, "a failed seek keeps the position");
        }
        3 => {
            let at = rng.random_range(0..=len);
            let mut buf = vec![0u8; rng.random_range(0..300_000)];
            let n = r.read_at(at, &mut buf).await.unwrap();
            let want = (len - at).min(buf.len() as u64) as usize;
            assert_eq!(n, want, "read_at {at}");
            assert!(
                buf[..n] == data[at as usize..at as usize + n],
                "read_at {at}+{n}"
            );
            assert_eq!(r.position(), pos, "read_at leaves the position");
        }
        4 => {
            // The zero-copy read: at most `max`, never more than a received piece (8 KiB
            // pieces, 16 KiB chunks here), empty only at the end.
            let max = rng.random_range(1..200_000);
            let b = r.read_bytes(max).await.unwrap();
            assert!(
                b.len() <= max && b.len() <= 16 * 1024,
                "read_bytes gave {}",
                b.len()
            );
            assert_eq!(b.is_empty(), pos == len, "read_bytes at {pos}");
            assert!(
                b[..] == data[pos as usize..pos as usize + b.len()],
                "read_bytes at {pos}"
            );
            assert_eq!(r.position(), pos + b.len() as u64);
        }
        _ => {
            let mut buf = vec![0u8; rng.random_range(1..200_000)];
            let want = (len - pos).min(buf.len() as u64) as usize;
            let mut got = 0;
            while got < want {
                let n = r.read(&mut buf[got..]).await.unwrap();
                assert!(n > 0, "early EOF at {}", pos + got as u64);
                got += n;
            }
            assert!(
                buf[..got] == data[pos as usize..pos as usize + got],
                "read at {pos}"
            );
            assert_eq!(r.position(), pos + got as u64);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_serving_datanode_mid_read_fails_over_with_exact_bytes() {
    with_timeout(LIMIT, "kill failover", async {
        sluice_tests::init_logging();
        let mut cluster = MiniCluster::builder()
            .configure_client(|c| {
                c.read_buffer_bytes = ByteSize::kib(256);
                c.read_piece_bytes = ByteSize::kib(64);
            })
            .start()
            .await
            .unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes((40 * MIB) as usize, 7);
        write_all(&fs, "/k/f", &data, wopts(64 * MIB), 1 << 20)
            .await
            .unwrap();
        for mode in [ReadMode::Stream, ReadMode::Chunk] {
            let mut r = fs.open_with("/k/f", opts(mode)).await.unwrap();
            let mut got = vec![0u8; 64 * KIB as usize];
            r.read_exact(&mut got).await.unwrap();
            let serving = r.stats().datanode.unwrap();
            let i = cluster.datanode_index_by_addr(&serving.data_addr).unwrap();
            cluster.kill_datanode(i);
            let mut rest = Vec::new();
            r.read_to_end(&mut rest).await.unwrap();
            got.extend_from_slice(&rest);
            assert!(got == data, "{mode:?}: exact bytes after the kill");
            let s = r.stats();
            assert_eq!(s.excluded, vec![serving.node_id.clone()], "{mode:?}: {s:?}");
            assert_ne!(s.datanode.as_ref().unwrap().node_id, serving.node_id);
            assert_eq!(s.reported_bad, 0, "a dead node is not corruption");
            cluster.start_datanode(i).await.unwrap();
            cluster.wait_live(3).await.unwrap();
        }
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_replica_on_disk_is_read_around_reported_and_marked_corrupt() {
    with_timeout(LIMIT, "corrupt failover", async {
        sluice_tests::init_logging();
        // The (cached, corrupt) bytes sent through a buffer, with sendfile and from a mapping
        // must be caught the same way.
        for how in [CachedSend::Buffer, CachedSend::Sendfile, CachedSend::Mapped] {
            corrupt_replica_read_around(how).await;
        }
    })
    .await
}

/// The corrupt-replica read of both modes, cached pieces sent `how`.
async fn corrupt_replica_read_around(how: CachedSend) {
    let cluster = MiniCluster::builder()
        .configure_datanodes(move |_, c| how.configure(c))
        .start()
        .await
        .unwrap();
    let fs = cluster.client().await.unwrap();
    let data = random_bytes((2 * MIB + 5) as usize, 8);
    for (n, mode) in [ReadMode::Stream, ReadMode::Chunk].into_iter().enumerate() {
        let path = format!("/c/f{n}");
        write_all(&fs, &path, &data, wopts(4 * MIB), 1 << 20)
            .await
            .unwrap();
        let mut r = fs.open_with(&path, opts(mode)).await.unwrap();
        // The replica the reader tries first is the corrupt one.
        let lb = r.blocks()[0].clone();
        let first = &lb.locations[0];
        let i = cluster.datanode_index_by_addr(&first.data_addr).unwrap();
        corrupt_byte(&cluster, i, lb.block.id.0, MIB + 17);
        // In the page cache, corrupt byte included: what sendfile sends from.
        set_cache(&replica_and_meta(&cluster, i, lb.block.id.0), true);
        let m = cluster.datanode(i).unwrap().metrics();
        let zero_copy = || {
            let sent = m.stream_pieces_sendfile.get() + m.chunks_sendfile.get();
            (sent, m.stream_pieces_mapped.get())
        };
        let before = zero_copy();
        assert!(read_to_end(&mut r).await == data, "{mode:?}: exact bytes");
        let after = zero_copy();
        let (sendfile, mapped) = (after.0 - before.0, after.1 - before.1);
        assert_eq!(
            (sendfile > 0, mapped > 0),
            (
                how == CachedSend::Sendfile,
                how == CachedSend::Mapped && mode == ReadMode::Stream
            ),
            "{mode:?}, {how:?}: {sendfile} pieces or chunks sent with sendfile, {mapped} \
             from a mapping"
        );
        let s = r.stats();
        assert_eq!(s.reported_bad, 1, "{mode:?}");
        assert_eq!(s.excluded, vec![first.node_id.clone()]);
        let fsck = fs.fsck(&path).await.unwrap();
        let b = &fsck.files[0].blocks[0];
        let corrupt: Vec<_> = b.corrupt_locations.iter().map(|d| &d.node_id).collect();
        assert_eq!(corrupt, vec![&first.node_id], "{fsck:?}");
        assert_eq!(fsck.health, Health::Corrupt);
    }
    cluster.shutdown().await;
}

/// A frame-level check that the pieces of a stream are aligned to checksum chunks and carry
/// at most the piece size asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_pieces_are_chunk_aligned_and_sized_as_asked() {
    with_timeout(LIMIT, "pieces", async {
        sluice_tests::init_logging();
        let cluster = MiniCluster::builder().start().await.unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(200_000, 9);
        write_all(&fs, "/a/f", &data, wopts(MIB), 1 << 20)
            .await
            .unwrap();
        let lb = fs.get_block_locations("/a/f").await.unwrap().blocks[0].clone();
        let mut conn = RawConn::connect(&lb.locations[0].data_addr)
            .await
            .unwrap()
            .with_token(lb.token.clone());
        let op = ReadBlockOp {
            block: lb.block,
            offset: 1000,
            length: 150_000,
            piece_size: 40_000,
        };
        conn.send_op(Op::ReadBlock(op)).await.unwrap();
        assert_eq!(conn.op_response().await.unwrap().status, Status::Success);
        let mut at = 512u64; // 1000 rounded down to a chunk
        loop {
            match conn.next().await.unwrap().unwrap().header {
                Message::Chunk(h) => {
                    assert_eq!(h.offset, at);
                    assert!(h.data_len <= 40_000 && h.offset.is_multiple_of(512));
                    at += u64::from(h.data_len);
                }
                Message::ReadEnd(e) => {
                    assert_eq!(e.status, Status::Success);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(at, 151_000, "up to offset + length");
        cluster.shutdown().await;
    })
    .await
}
