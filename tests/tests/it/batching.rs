//! Write-memory batching (HDFS-17973) end to end: files written through the client into a
//! MiniCluster whose DataNodes batch in memory. Which replicas are buffered (metrics), the
//! visible length after hflush against the bytes in the block files, the unaligned hflush
//! round trip, the idle flush, the memory cap with 64 writers, a client killed mid-block,
//! O_DIRECT, and (feature `failpoints`) an fsync or flush failure failing hsync and close.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_client::{FileSystem, WriteOptions};
use sluice_common::config::{ByteSize, DatanodeConfig, Millis};
use sluice_common::rpc::LocatedBlock;
use sluice_tests::raw::RawConn;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, write_all, MiniCluster};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const LIMIT: Duration = Duration::from_secs(180);
const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

async fn cluster(f: impl Fn(&mut DatanodeConfig) + Send + Sync + 'static) -> MiniCluster {
    sluice_tests::init_logging();
    MiniCluster::builder()
        .block_size(MIB as u64)
        .configure_datanodes(move |_, c| f(c))
        .start()
        .await
        .expect("cluster starts")
}

fn no_idle(c: &mut DatanodeConfig) {
    c.write_buffer_idle_flush_timeout = Millis::new(0);
}

/// Buffered replicas created on each DataNode.
fn buffered_per_node(c: &MiniCluster) -> Vec<u64> {
    (0..c.datanode_count())
        .map(|i| {
            c.datanode(i)
                .map_or(0, |d| d.metrics().buffered_replicas_created.get())
        })
        .collect()
}

/// (visible length, bytes on disk) of `block` on the DataNode at `addr`.
async fn lengths(addr: &str, lb: &LocatedBlock) -> (u64, u64) {
    let mut conn = RawConn::connect(addr)
        .await
        .unwrap()
        .with_token(lb.token.clone());
    let info = conn.replica_info(lb.block).await.unwrap().replica.unwrap();
    (info.block.num_bytes, info.bytes_on_disk)
}

/// Every replica of every block of `path` reads back `data` with valid stored checksums, and
/// its block file holds exactly the block's bytes.
async fn check_replicas(c: &MiniCluster, fs: &FileSystem, path: &str, data: &[u8]) {
    let located = fs.get_block_locations(path).await.unwrap();
    assert!(!located.under_construction);
    for lb in &located.blocks {
        let want = &data[lb.offset as usize..(lb.offset + lb.block.num_bytes) as usize];
        for dn in &lb.locations {
            let mut conn = RawConn::connect(&dn.data_addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            let (bytes, _) = conn.read_replica(lb.block).await.unwrap();
            assert!(bytes == want, "replica of {} on {dn}", lb.block);
            let i = c.datanode_index_by_addr(&dn.data_addr).unwrap();
            let files = c.replica_files(i, lb.block.id.0);
            assert_eq!(files.len(), 1);
            let len = std::fs::metadata(&files[0]).unwrap().len();
            assert_eq!(len, lb.block.num_bytes, "block file of {}", lb.block);
        }
    }
}

async fn last_block(fs: &FileSystem, path: &str) -> LocatedBlock {
    let located = fs.get_block_locations(path).await.unwrap();
    located.blocks.last().cloned().unwrap()
}

fn opts() -> WriteOptions {
    WriteOptions {
        create_parent: true,
        ..WriteOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_in_three_is_buffered_by_default_and_all_three_without_last_replica_only() {
    with_timeout(LIMIT, "replicas buffered", async {
        let c = cluster(|_| {}).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(2 * MIB + 300 * KIB, 1);
        write_all(&fs, "/b/default", &data, opts(), 100_000)
            .await
            .unwrap();
        let counts = buffered_per_node(&c);
        assert_eq!(
            counts.iter().sum::<u64>(),
            3,
            "one per block of three: {counts:?}"
        );
        assert!(read_all(&fs, "/b/default").await.unwrap() == data);
        check_replicas(&c, &fs, "/b/default", &data).await;
        c.shutdown().await;

        let c = cluster(|d| d.write_buffer_last_replica_only = false).await;
        let fs = c.client().await.unwrap();
        write_all(&fs, "/b/all", &data, opts(), 100_000)
            .await
            .unwrap();
        let counts = buffered_per_node(&c);
        assert_eq!(counts.iter().sum::<u64>(), 9, "every replica: {counts:?}");
        check_replicas(&c, &fs, "/b/all", &data).await;
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_hflush_no_replica_is_visible_past_its_block_file_and_close_is_exact() {
    with_timeout(LIMIT, "visible length", async {
        let c = cluster(no_idle).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(256 * KIB, 2);
        let mut w = fs.create("/v/file", opts()).await.unwrap();
        w.write_all(&data).await.unwrap();
        w.hflush().await.unwrap();
        let lb = last_block(&fs, "/v/file").await;
        assert_eq!(lb.locations.len(), 3);
        for (i, dn) in lb.locations.iter().enumerate() {
            let (visible, on_disk) = lengths(&dn.data_addr, &lb).await;
            assert!(
                visible <= on_disk,
                "{dn}: visible {visible} > on disk {on_disk}"
            );
            let idx = c.datanode_index_by_addr(&dn.data_addr).unwrap();
            let file = std::fs::metadata(&c.replica_files(idx, lb.block.id.0)[0]).unwrap();
            assert!(visible <= file.len(), "{dn}: visible past the block file");
            if i == 2 {
                assert_eq!(
                    on_disk, 0,
                    "the last replica still holds the bytes in memory"
                );
            } else {
                assert_eq!(visible, data.len() as u64, "direct replicas see the hflush");
            }
        }
        // A reader opened after the hflush reads everything (from a direct replica).
        assert!(read_all(&fs, "/v/file").await.unwrap() == data);
        w.close().await.unwrap();
        assert!(read_all(&fs, "/v/file").await.unwrap() == data);
        check_replicas(&c, &fs, "/v/file", &data).await;
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaligned_hflushes_round_trip_byte_exact() {
    with_timeout(LIMIT, "700 + 1300", async {
        // Every replica buffered, so the partial chunk's CRC is rewritten in memory and on disk.
        let c = cluster(|d| {
            d.write_buffer_last_replica_only = false;
            d.write_buffer_idle_flush_timeout = Millis::new(50);
        })
        .await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(2000, 3);
        let mut w = fs.create("/u/file", opts()).await.unwrap();
        w.write_all(&data[..700]).await.unwrap();
        w.hflush().await.unwrap();
        let lb = last_block(&fs, "/u/file").await;
        let addr = lb.locations[2].data_addr.clone();
        wait_until(
            Duration::from_secs(30),
            "the idle flush of 700 bytes",
            || {
                let (addr, lb) = (addr.clone(), lb.clone());
                async move { lengths(&addr, &lb).await.1 == 700 }
            },
        )
        .await;
        w.write_all(&data[700..]).await.unwrap();
        w.hflush().await.unwrap();
        w.close().await.unwrap();
        let st = fs.stat("/u/file").await.unwrap();
        assert_eq!(st.length, 2000);
        assert!(read_all(&fs, "/u/file").await.unwrap() == data);
        check_replicas(&c, &fs, "/u/file", &data).await;
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timer_puts_a_silent_writers_bytes_on_disk() {
    with_timeout(LIMIT, "idle flush", async {
        let c = cluster(|d| d.write_buffer_idle_flush_timeout = Millis::new(200)).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(300 * KIB, 4);
        let mut w = fs.create("/i/file", opts()).await.unwrap();
        w.write_all(&data).await.unwrap();
        w.hflush().await.unwrap();
        let lb = last_block(&fs, "/i/file").await;
        let addr = lb.locations[2].data_addr.clone();
        let want = (data.len() as u64, data.len() as u64);
        wait_until(Duration::from_secs(30), "the idle flush", || {
            let (addr, lb) = (addr.clone(), lb.clone());
            async move { lengths(&addr, &lb).await == want }
        })
        .await;
        let idle: u64 = (0..3)
            .map(|i| c.datanode(i).unwrap().metrics().idle_flushes.get())
            .sum();
        assert!(idle >= 1);
        w.close().await.unwrap();
        check_replicas(&c, &fs, "/i/file", &data).await;
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_writers_stay_under_each_datanodes_memory_cap() {
    with_timeout(LIMIT, "64 writers", async {
        let c = cluster(|d| {
            no_idle(d);
            d.write_buffer_size = ByteSize::mib(1);
            d.write_buffer_max_capacity_mb = 4;
        })
        .await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(300 * KIB, 5);
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let (fs, data) = (fs.clone(), data.clone());
                tokio::spawn(async move {
                    write_all(&fs, &format!("/cap/{i}"), &data, opts(), 64 * KIB).await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let mut created = 0;
        for i in 0..3 {
            let m = c.datanode(i).unwrap().metrics();
            let peak = m.write_buffer_bytes_peak.get();
            assert!(
                peak <= 4 * MIB as i64,
                "DataNode {i}: {peak} bytes of buffers"
            );
            assert_eq!(m.buffered_replicas.get(), 0);
            assert_eq!(
                c.datanode(i).unwrap().write_buffers().available_permits(),
                Some(4)
            );
            created += m.buffered_replicas_created.get() + m.write_buffer_permit_timeouts.get();
        }
        assert_eq!(
            created, 64,
            "one buffered (or timed-out) last replica per file"
        );
        for i in [0, 63] {
            assert!(read_all(&fs, &format!("/cap/{i}")).await.unwrap() == data);
        }
        c.shutdown().await;
    })
    .await
}

#[allow(clippy::disallowed_methods)] // a test's own thread, joined by the test
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_killed_mid_block_leaves_every_received_packet_in_the_last_replica() {
    with_timeout(LIMIT, "client killed", async {
        let c = cluster(no_idle).await;
        let cfg = c.client_config();
        let packet = cfg.write_packet_size.as_usize();
        let data = random_bytes(MIB - 64 * KIB, 6);
        // The client lives in its own runtime, shut down below: all its tasks and connections
        // die at once, as in a crash.
        let d = data.clone();
        let (fs, w, rt) = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let (fs, w) = rt.block_on(async move {
                let fs = FileSystem::connect(cfg).await.unwrap();
                let mut w = fs.create("/k/file", opts()).await.unwrap();
                w.write_all(&d[..512 * KIB]).await.unwrap();
                w.hflush().await.unwrap();
                w.write_all(&d[512 * KIB..]).await.unwrap();
                (fs, w)
            });
            (fs, w, rt)
        })
        .join()
        .unwrap();
        let fs2 = c.client().await.unwrap();
        let lb = last_block(&fs2, "/k/file").await;
        let last = c
            .datanode_index_by_addr(&lb.locations[2].data_addr)
            .unwrap();
        rt.shutdown_background();
        drop((w, fs));
        let m = c.datanode(last).unwrap().metrics();
        assert_eq!(m.buffered_replicas_created.get(), 1);
        wait_until(
            Duration::from_secs(60),
            "the last replica's writer ends",
            || async { m.buffered_replicas.get() == 0 },
        )
        .await;
        let received = m.packets_received.get() as usize * packet;
        assert!(received >= 512 * KIB, "the hflushed bytes at least");
        let file = std::fs::read(&c.replica_files(last, lb.block.id.0)[0]).unwrap();
        assert_eq!(
            file.len(),
            received,
            "every packet received is in the block file"
        );
        assert!(file == data[..received], "and they are the bytes sent");
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o_direct_flushes_round_trip_through_the_client() {
    with_timeout(LIMIT, "O_DIRECT", async {
        let c = cluster(|d| {
            d.write_buffer_size = ByteSize::mib(1);
            d.write_o_direct = true;
        })
        .await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(2 * MIB + 12_345, 7);
        let mut w = fs.create("/d/file", opts()).await.unwrap();
        for piece in data.chunks(700_001) {
            w.write_all(piece).await.unwrap();
            w.hflush().await.unwrap();
        }
        w.close().await.unwrap();
        assert!(read_all(&fs, "/d/file").await.unwrap() == data);
        check_replicas(&c, &fs, "/d/file", &data).await;
        let direct: u64 = (0..3)
            .map(|i| c.datanode(i).unwrap().metrics().direct_io_bytes.get())
            .sum();
        assert!(direct > 0, "aligned parts of the flushes went O_DIRECT");
        c.shutdown().await;
    })
    .await
}

/// One DataNode, replication 1: the only replica is the last one, buffered. A failure injected
/// on it fails the hsync or the close, which the client reports.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_fsync_or_flush_failure_fails_hsync_and_close() {
    with_timeout(LIMIT, "failpoints", async {
        sluice_tests::init_logging();
        let c = MiniCluster::builder()
            .datanodes(1)
            .replication(1)
            .configure_datanodes(|_, d| no_idle(d))
            .start()
            .await
            .unwrap();
        let port = c.datanode(0).unwrap().data_addr().port();
        let fs = c.client().await.unwrap();
        let data = random_bytes(100 * KIB, 8);
        let scoped = format!("return({port}:error)");

        fail::cfg("dn::before_fsync", &scoped).unwrap();
        let mut w = fs.create("/f/hsync", opts()).await.unwrap();
        w.write_all(&data).await.unwrap();
        assert!(w.hsync().await.is_err(), "hsync must fail when fsync fails");
        let mut w = fs.create("/f/close", opts()).await.unwrap();
        w.write_all(&data).await.unwrap();
        assert!(w.close().await.is_err(), "close must fail when fsync fails");
        fail::remove("dn::before_fsync");

        fail::cfg("dn::flush", &scoped).unwrap();
        let mut w = fs.create("/f/flush", opts()).await.unwrap();
        w.write_all(&data).await.unwrap();
        assert!(
            w.close().await.is_err(),
            "close must fail when the flush fails"
        );
        fail::remove("dn::flush");

        write_all(&fs, "/f/ok", &data, opts(), 64 * KIB)
            .await
            .unwrap();
        assert!(read_all(&fs, "/f/ok").await.unwrap() == data);
        c.shutdown().await;
    })
    .await
}
