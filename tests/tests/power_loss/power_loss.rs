//! Power cuts on the lazyfs rig (`sluice_tests::power`): nodes lose what they had not synced,
//! restart on the same storage, and every byte and namespace change that was acknowledged as
//! durable must be there, exact and with valid checksums (the client checks every chunk).
//! Every node is its own process ([`ProcessPowerCluster`]): a cut node is killed at once.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_client::{FileSystem, WriteOptions};
use sluice_common::rpc::Health;
use sluice_tests::power::ProcessPowerCluster;
use sluice_tests::process::{Binaries, ProcessCluster};
use sluice_tests::raw::RawConn;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, write_all};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const MIB: usize = 1024 * 1024;

/// A cluster on lazyfs that has been up a while: what start-up wrote is durable (see
/// `a_fresh_metadata_store_survives_a_power_cut` for why that matters).
async fn start(datanodes: usize) -> ProcessPowerCluster {
    let pc = start_fresh(datanodes).await;
    pc.settle().unwrap();
    pc
}

async fn start_fresh(datanodes: usize) -> ProcessPowerCluster {
    sluice_tests::init_logging();
    let builder = ProcessCluster::builder(Binaries::new(env!("CARGO_BIN_EXE_sluice-proc")))
        .metadata_env("SLUICE_METADATA__BLOCK__SIZE__DEFAULT", "1MiB")
        .datanode_env(
            "SLUICE_DATANODE__WRITE__BUFFER__IDLE__FLUSH__TIMEOUT__MS",
            "200",
        );
    ProcessPowerCluster::start(builder, datanodes)
        .await
        .unwrap()
}

/// Recovers `path`'s lease and waits until the file is closed.
async fn recover(fs: &FileSystem, path: &str) {
    wait_until(Duration::from_secs(60), "lease recovery", || async {
        fs.recover_lease(path).await.unwrap_or(false)
    })
    .await;
}

/// Asks every running DataNode for every block of `path` directly: each either refuses it or
/// serves exactly the file's bytes with valid checksums (`read_replica` checks every chunk);
/// at least the replication factor serve it. A replica that lost a tail must never answer.
async fn every_served_replica_is_exact(
    pc: &ProcessPowerCluster,
    fs: &FileSystem,
    path: &str,
    data: &[u8],
) {
    for lb in fs.get_block_locations(path).await.unwrap().blocks {
        let want = &data[lb.offset as usize..(lb.offset + lb.block.num_bytes) as usize];
        let mut served = 0;
        for i in 0..pc.cluster().datanode_count() {
            let Some(addr) = pc.cluster().datanode_data_addr(i) else {
                continue;
            };
            let addr = addr.to_string();
            let mut conn = RawConn::connect(&addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            if let Ok((bytes, info)) = conn.read_replica(lb.block).await {
                assert!(
                    bytes == want && info.block.num_bytes == lb.block.num_bytes,
                    "DataNode {i} serves {} bytes of {} (want {})",
                    bytes.len(),
                    lb.block,
                    want.len()
                );
                served += 1;
            }
        }
        assert!(served >= 3, "{} served by {served} DataNodes", lb.block);
    }
}

fn opts() -> WriteOptions {
    WriteOptions {
        create_parent: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_acknowledged_by_close_or_hsync_survive_a_power_cut_of_the_whole_cluster() {
    with_timeout(Duration::from_secs(180), "whole-cluster power cut", async {
        let mut pc = start(3).await;
        let fs = pc.cluster().client().await.unwrap();
        let closed = random_bytes(MIB + MIB / 2, 1);
        write_all(&fs, "/p/closed", &closed, opts(), 64 * 1024)
            .await
            .unwrap();
        let synced = random_bytes(400_000, 2);
        let mut w = fs.create("/p/synced", opts()).await.unwrap();
        w.write_all(&synced[..300_000]).await.unwrap();
        w.hsync().await.unwrap();
        w.write_all(&synced[300_000..]).await.unwrap();
        w.hflush().await.unwrap();
        let flushed = random_bytes(200_000, 3);
        let mut w2 = fs.create("/p/flushed", opts()).await.unwrap();
        w2.write_all(&flushed).await.unwrap();
        w2.hflush().await.unwrap();

        let lost = pc.crash_all().await.unwrap();
        assert!(
            lost[1..].iter().any(|l| l.bytes >= 100_000),
            "the DataNodes lost unsynced tails: {lost:?}"
        );
        drop((w, w2));
        pc.cluster().wait_live(3).await.unwrap();
        let fs = pc.cluster().client().await.unwrap();
        assert!(read_all(&fs, "/p/closed").await.unwrap() == closed);
        recover(&fs, "/p/synced").await;
        let got = read_all(&fs, "/p/synced").await.unwrap();
        assert!(got.len() >= 300_000, "hsync'ed length kept: {}", got.len());
        assert!(got[..] == synced[..got.len()], "and exact");
        every_served_replica_is_exact(&pc, &fs, "/p/closed", &closed).await;
        every_served_replica_is_exact(&pc, &fs, "/p/synced", &got).await;
        recover(&fs, "/p/flushed").await;
        let got = read_all(&fs, "/p/flushed").await.unwrap();
        assert!(
            got[..] == flushed[..got.len()],
            "hflush'ed bytes: a prefix at most"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_namespace_changes_survive_a_metadata_power_cut() {
    with_timeout(Duration::from_secs(120), "metadata power cut", async {
        let mut pc = start(3).await;
        let fs = pc.cluster().client().await.unwrap();
        fs.mkdirs("/ns/a/b", true).await.unwrap();
        for i in 0..6 {
            let data = random_bytes(1000 + i, i as u64);
            write_all(&fs, &format!("/ns/a/b/f{i}"), &data, opts(), 4096)
                .await
                .unwrap();
        }
        fs.rename("/ns/a/b/f1", "/ns/a/f1-moved").await.unwrap();
        assert!(fs.delete("/ns/a/b/f2", false).await.unwrap());
        fs.mkdirs("/ns/c", false).await.unwrap();
        let lost = pc.crash_metadata().await.unwrap();
        tracing::info!(?lost, "metadata crash");
        let fs = pc.cluster().client().await.unwrap();
        wait_until(
            Duration::from_secs(30),
            "block reports after the restart",
            || async {
                fs.fsck("/ns")
                    .await
                    .is_ok_and(|r| r.health == Health::Healthy)
            },
        )
        .await;
        for i in [0usize, 3, 4, 5] {
            let data = random_bytes(1000 + i, i as u64);
            assert!(read_all(&fs, &format!("/ns/a/b/f{i}")).await.unwrap() == data);
        }
        assert!(read_all(&fs, "/ns/a/f1-moved").await.unwrap() == random_bytes(1001, 1));
        assert!(
            fs.stat("/ns/a/b/f1").await.is_err(),
            "no half-applied rename"
        );
        assert!(fs.stat("/ns/a/b/f2").await.is_err(), "the delete stays");
        assert!(fs.stat("/ns/c").await.is_ok());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datanode_that_lost_an_unsynced_tail_is_recovered_around_and_never_served() {
    with_timeout(Duration::from_secs(180), "one DataNode power cut", async {
        let mut pc = start(4).await;
        let fs = pc.cluster().client().await.unwrap();
        let data = random_bytes(700_000, 9);
        let mut w = fs.create("/one/f", opts()).await.unwrap();
        w.write_all(&data[..300_000]).await.unwrap();
        w.hflush().await.unwrap();
        let victim = pc
            .cluster()
            .datanode_index_by_addr(&w.pipeline()[2].data_addr)
            .unwrap();
        let lost = pc.crash_datanode(victim).await.unwrap();
        assert!(
            lost.bytes > 0,
            "the last DataNode had unsynced bytes: {lost:?}"
        );
        w.write_all(&data[300_000..]).await.unwrap();
        w.close().await.unwrap();
        assert!(w.pipeline_recoveries() >= 1);
        pc.restart_datanode(victim).await.unwrap();
        pc.cluster().wait_live(4).await.unwrap();
        assert!(read_all(&fs, "/one/f").await.unwrap() == data);
        wait_until(Duration::from_secs(60), "HEALTHY after repair", || async {
            fs.fsck("/one").await.unwrap().health == Health::Healthy
        })
        .await;
        // The restarted DataNode's short replica (old stamp) is refused, or was replaced.
        every_served_replica_is_exact(&pc, &fs, "/one/f", &data).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_metadata_store_survives_a_power_cut() {
    with_timeout(Duration::from_secs(120), "fresh store power cut", async {
        let mut pc = start_fresh(3).await;
        let fs = pc.cluster().client().await.unwrap();
        fs.mkdirs("/fresh/d", true).await.unwrap();
        pc.crash_metadata().await.unwrap();
        let fs = pc.cluster().client().await.unwrap();
        assert!(
            fs.stat("/fresh/d").await.is_ok(),
            "an acknowledged mkdirs is lost"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_files_survive_a_power_cut_of_datanodes_that_just_started() {
    with_timeout(
        Duration::from_secs(120),
        "fresh DataNodes power cut",
        async {
            // No settle: the volume trees the DataNodes made at start-up must be durable by
            // themselves (parent directories synced), and so must every finalized/subdirN.
            let mut pc = start_fresh(3).await;
            let fs = pc.cluster().client().await.unwrap();
            let data = random_bytes(2 * MIB + 1000, 5);
            write_all(&fs, "/fresh/f", &data, opts(), 64 * 1024)
                .await
                .unwrap();
            for i in 0..3 {
                pc.crash_datanode(i).await.unwrap();
            }
            for i in 0..3 {
                pc.restart_datanode(i).await.unwrap();
            }
            pc.cluster().wait_live(3).await.unwrap();
            wait_until(
                Duration::from_secs(30),
                "every replica reported",
                || async {
                    fs.fsck("/fresh")
                        .await
                        .is_ok_and(|r| r.health == Health::Healthy)
                },
            )
            .await;
            assert!(read_all(&fs, "/fresh/f").await.unwrap() == data);
        },
    )
    .await
}
