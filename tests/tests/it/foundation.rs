//! End-to-end tests of the foundation: files written through a real 3-replica pipeline and read
//! back byte for byte, replicas on distinct DataNodes with valid checksums, hflush visibility,
//! concurrent writers, restarts, and malformed input to a DataNode.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_client::WriteOptions;
use sluice_common::rpc::{FileKind, Health};
use sluice_tests::raw::RawConn;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, write_all, MiniCluster};
use std::collections::HashSet;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(120);
const BLOCK: u64 = 64 * 1024;

async fn cluster() -> MiniCluster {
    sluice_tests::init_logging();
    MiniCluster::builder()
        .block_size(BLOCK)
        .start()
        .await
        .expect("cluster starts")
}

/// Checks that every block of `path` has `replicas` replicas on distinct DataNodes, each of
/// which streams back the right bytes with valid stored checksums, and has a block file on disk.
async fn check_replicas(cluster: &MiniCluster, path: &str, data: &[u8], replicas: usize) {
    let fs = cluster.client().await.unwrap();
    let located = fs.get_block_locations(path).await.unwrap();
    assert!(!located.under_construction, "{path} still open");
    let mut covered = 0u64;
    for lb in &located.blocks {
        assert_eq!(lb.offset, covered, "block offsets are contiguous");
        let nodes: HashSet<_> = lb.locations.iter().map(|d| d.node_id.clone()).collect();
        assert_eq!(
            nodes.len(),
            replicas,
            "block {} on distinct nodes: {:?}",
            lb.block,
            lb.locations
        );
        let want = &data[lb.offset as usize..(lb.offset + lb.block.num_bytes) as usize];
        for dn in &lb.locations {
            let mut conn = RawConn::connect(&dn.data_addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            let (bytes, info) = conn.read_replica(lb.block).await.unwrap();
            assert_eq!(
                info.block.num_bytes, lb.block.num_bytes,
                "replica length on {dn}"
            );
            assert!(
                bytes == want,
                "replica bytes of {} on {dn} differ",
                lb.block
            );
            let i = cluster
                .datanode_index_by_addr(&dn.data_addr)
                .expect("location is a cluster DataNode");
            let files = cluster.replica_files(i, lb.block.id.0);
            assert_eq!(
                files.len(),
                1,
                "one block file for {} on DataNode {i}: {files:?}",
                lb.block
            );
            let on_disk = std::fs::metadata(&files[0]).unwrap().len();
            assert_eq!(
                on_disk, lb.block.num_bytes,
                "block file size of {}",
                lb.block
            );
        }
        covered += lb.block.num_bytes;
    }
    assert_eq!(covered, data.len() as u64, "blocks cover the file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_at_every_boundary() {
    with_timeout(LIMIT, "round trips", async {
        let cluster = cluster().await;
        let fs = cluster.client().await.unwrap();
        let sizes = [
            0usize,
            1,
            511,
            512,
            513,
            BLOCK as usize,
            BLOCK as usize + 1,
            3 * BLOCK as usize + 12_345,
        ];
        for (i, size) in sizes.into_iter().enumerate() {
            let path = format!("/rt/file-{size}");
            let data = random_bytes(size, i as u64);
            let opts = WriteOptions {
                create_parent: true,
                ..WriteOptions::default()
            };
            write_all(&fs, &path, &data, opts, 7_000).await.unwrap();
            let st = fs.stat(&path).await.unwrap();
            assert_eq!(st.length, size as u64, "{path} length");
            assert_eq!(st.kind, FileKind::File);
            assert!(!st.under_construction);
            let back = read_all(&fs, &path).await.unwrap();
            assert!(
                back == data,
                "{path}: {} bytes read back differ",
                back.len()
            );
            check_replicas(&cluster, &path, &data, 3).await;
        }
        let fsck = fs.fsck("/rt").await.unwrap();
        assert_eq!(fsck.files.len(), sizes.len());
        assert_eq!(fsck.health, Health::Healthy, "{fsck:?}");
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_file_block_size_and_replication() {
    with_timeout(LIMIT, "per-file options", async {
        let cluster = MiniCluster::builder().datanodes(4).start().await.unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(100_000, 9);
        let opts = WriteOptions {
            block_size: Some(32 * 1024),
            replication: Some(2),
            ..WriteOptions::default()
        };
        write_all(&fs, "/opts", &data, opts, 65536).await.unwrap();
        let st = fs.stat("/opts").await.unwrap();
        assert_eq!(
            (st.block_size, st.replication, st.block_count),
            (32 * 1024, 2, 4)
        );
        check_replicas(&cluster, "/opts", &data, 2).await;
        assert!(read_all(&fs, "/opts").await.unwrap() == data);
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hflush_makes_data_visible_to_new_readers() {
    with_timeout(LIMIT, "hflush visibility", async {
        let cluster = cluster().await;
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(BLOCK as usize + 1000, 3);
        let mut w = fs.create("/hflush", WriteOptions::default()).await.unwrap();
        w.write_all(&data[..700]).await.unwrap();
        w.hflush().await.unwrap();
        let reader_fs = cluster.client().await.unwrap();
        let seen = read_all(&reader_fs, "/hflush").await.unwrap();
        assert!(
            seen == data[..700],
            "after hflush a new reader sees the 700 bytes (saw {})",
            seen.len()
        );
        w.write_all(&data[700..]).await.unwrap();
        w.hflush().await.unwrap();
        let seen = read_all(&reader_fs, "/hflush").await.unwrap();
        assert!(
            seen == data,
            "after the second hflush a new reader sees all (saw {})",
            seen.len()
        );
        w.close().await.unwrap();
        assert!(read_all(&reader_fs, "/hflush").await.unwrap() == data);
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_writers() {
    with_timeout(LIMIT, "concurrent writers", async {
        let cluster = cluster().await;
        let fs = cluster.client().await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..8u64 {
            let fs = fs.clone();
            tasks.push(tokio::spawn(async move {
                let data = random_bytes(150_000 + i as usize * 1_111, 100 + i);
                let path = format!("/concurrent/{i}");
                let opts = WriteOptions {
                    create_parent: true,
                    ..WriteOptions::default()
                };
                write_all(&fs, &path, &data, opts, 4096 + i as usize * 100)
                    .await
                    .unwrap();
                (path, data)
            }));
        }
        for t in tasks {
            let (path, data) = t.await.unwrap();
            assert!(read_all(&fs, &path).await.unwrap() == data, "{path}");
            check_replicas(&cluster, &path, &data, 3).await;
        }
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_restart_keeps_namespace_and_files() {
    with_timeout(LIMIT, "metadata restart", async {
        let mut cluster = cluster().await;
        let fs = cluster.client().await.unwrap();
        fs.mkdirs("/keep/dir", true).await.unwrap();
        let data = random_bytes(200_000, 5);
        write_all(&fs, "/keep/dir/f", &data, WriteOptions::default(), 10_000)
            .await
            .unwrap();
        let before = fs.get_block_locations("/keep/dir/f").await.unwrap();
        cluster.restart_metadata().await.unwrap();
        // Replica locations come back from block reports.
        let fs = cluster.client().await.unwrap();
        wait_until(
            Duration::from_secs(30),
            "block reports after restart",
            || {
                let fs = fs.clone();
                async move {
                    match fs.get_block_locations("/keep/dir/f").await {
                        Ok(lb) => lb.blocks.iter().all(|b| b.locations.len() == 3),
                        Err(_) => false,
                    }
                }
            },
        )
        .await;
        let after = fs.get_block_locations("/keep/dir/f").await.unwrap();
        let ids = |l: &sluice_common::rpc::LocatedBlocks| {
            l.blocks.iter().map(|b| b.block).collect::<Vec<_>>()
        };
        assert_eq!(ids(&before), ids(&after));
        assert_eq!(
            fs.stat("/keep/dir").await.unwrap().kind,
            FileKind::Directory
        );
        assert!(read_all(&fs, "/keep/dir/f").await.unwrap() == data);
        // New writes still work after the restart.
        write_all(
            &fs,
            "/keep/new",
            &data[..1000],
            WriteOptions::default(),
            100,
        )
        .await
        .unwrap();
        assert!(read_all(&fs, "/keep/new").await.unwrap() == data[..1000]);
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datanode_restart_rereports_its_replicas() {
    with_timeout(LIMIT, "datanode restart", async {
        let mut cluster = MiniCluster::builder()
            .block_size(BLOCK)
            .liveness(Duration::from_millis(600), Duration::from_millis(1200))
            .start()
            .await
            .unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(150_000, 8);
        write_all(&fs, "/dnr", &data, WriteOptions::default(), 50_000)
            .await
            .unwrap();
        cluster.stop_datanode(0).await;
        let node0 = cluster.datanode_dirs(0);
        assert!(!node0.is_empty());
        // The metadata service notices the death: blocks lose a location.
        wait_until(
            Duration::from_secs(20),
            "dead DataNode drops out of locations",
            || {
                let fs = fs.clone();
                async move {
                    let lb = fs.get_block_locations("/dnr").await.unwrap();
                    lb.blocks.iter().all(|b| b.locations.len() == 2)
                }
            },
        )
        .await;
        assert_eq!(
            fs.fsck("/dnr").await.unwrap().health,
            Health::UnderReplicated
        );
        // The file is still readable from the two survivors.
        assert!(read_all(&fs, "/dnr").await.unwrap() == data);
        cluster.start_datanode(0).await.unwrap();
        wait_until(
            Duration::from_secs(20),
            "restarted DataNode re-reports its replicas",
            || {
                let fs = fs.clone();
                async move {
                    fs.fsck("/dnr")
                        .await
                        .map(|r| r.health == Health::Healthy)
                        .unwrap_or(false)
                }
            },
        )
        .await;
        check_replicas(&cluster, "/dnr", &data, 3).await;
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_get_an_error_and_the_datanode_keeps_serving() {
    with_timeout(LIMIT, "malformed input", async {
        let cluster = cluster().await;
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(5000, 11);
        write_all(&fs, "/mal", &data, WriteOptions::default(), 5000)
            .await
            .unwrap();
        let dn = cluster.datanode(0).unwrap().datanode_id().data_addr.clone();

        // Garbage: a plausible length followed by bytes that are no header.
        let mut c = RawConn::connect(&dn).await.unwrap();
        c.socket()
            .write_all(&[0, 0, 0, 12, 0, 0, 0, 8, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4])
            .await
            .unwrap();
        expect_error_then_close(&mut c, "garbage header").await;

        // Oversized: a frame length beyond any maximum.
        let mut c = RawConn::connect(&dn).await.unwrap();
        c.socket()
            .write_all(&[0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0])
            .await
            .unwrap();
        expect_error_then_close(&mut c, "oversized frame").await;

        // Truncated: half a frame, then the writer shuts its side.
        let mut c = RawConn::connect(&dn).await.unwrap();
        c.socket()
            .write_all(&[0, 0, 1, 0, 0, 0, 0, 16, 1, 2])
            .await
            .unwrap();
        c.socket().shutdown().await.unwrap();
        let mut rest = Vec::new();
        let _ = with_timeout(
            Duration::from_secs(15),
            "truncated frame closes",
            c.socket().read_to_end(&mut rest),
        )
        .await;

        // Pure random noise.
        let mut c = RawConn::connect(&dn).await.unwrap();
        c.socket().write_all(&random_bytes(4096, 99)).await.unwrap();
        let mut rest = Vec::new();
        let _ = with_timeout(
            Duration::from_secs(15),
            "noise closes",
            c.socket().read_to_end(&mut rest),
        )
        .await;

        // Still serving, data unchanged.
        assert!(read_all(&fs, "/mal").await.unwrap() == data);
        check_replicas(&cluster, "/mal", &data, 3).await;
        cluster.shutdown().await;
    })
    .await
}

async fn expect_error_then_close(c: &mut RawConn, what: &str) {
    let resp = with_timeout(Duration::from_secs(15), what, c.op_response()).await;
    match resp {
        Ok(r) => assert!(
            !r.status.is_success(),
            "{what}: expected an error status, got {r:?}"
        ),
        Err(e) => panic!("{what}: expected an error response, got {e:#}"),
    }
    let next = with_timeout(Duration::from_secs(15), what, c.next()).await;
    assert!(
        matches!(next, Ok(None) | Err(_)),
        "{what}: connection should close, got {next:?}"
    );
}
