//! Power cuts at exact protocol points (DataNode failpoints; run with `--features failpoints`,
//! which `--all-features` enables). The test holds `crate::scenario()`: the `fail` registry is global.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_client::{FileSystem, WriteOptions};
use sluice_tests::power::PowerCluster;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, MiniCluster};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

async fn recovered(fs: &FileSystem, path: &str) -> Vec<u8> {
    wait_until(Duration::from_secs(60), "lease recovery", || async {
        fs.recover_lease(path).await.unwrap_or(false)
    })
    .await;
    read_all(fs, path).await.unwrap()
}

/// Writes `data`, hsyncs the first `synced` bytes, then fails at `point` on every DataNode
/// (`drop`: connections closed, nothing sent) during a second hsync or the close, cuts the
/// power of the whole cluster and checks that every acknowledged byte is there, exact, and
/// nothing beyond what was written.
async fn cut_at(pc: &mut PowerCluster, point: &str, path: &str, hsync_again: bool) {
    let fs = pc.cluster().client().await.unwrap();
    let data = random_bytes(300_000, path.len() as u64);
    let synced = 120_000;
    let mut w = fs
        .create(
            path,
            WriteOptions {
                create_parent: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    w.write_all(&data[..synced]).await.unwrap();
    w.hsync().await.unwrap();
    w.write_all(&data[synced..]).await.unwrap();
    fail::cfg(point, "return(*:drop)").unwrap();
    let end = if hsync_again {
        w.hsync().await
    } else {
        w.close().await
    };
    // Close may still succeed through close recovery: then every byte is acknowledged.
    let acked = if end.is_ok() { data.len() } else { synced };
    fail::remove(point);
    drop(w);
    pc.crash_all().await.unwrap();
    pc.cluster().wait_live(3).await.unwrap();
    let fs = pc.cluster().client().await.unwrap();
    let got = recovered(&fs, path).await;
    assert!(
        got.len() >= acked && got[..] == data[..got.len()],
        "{point}: {} bytes after the power cut, {acked} acknowledged",
        got.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_before_an_fsync_and_at_finalize_keep_the_hsynced_bytes() {
    let _failpoints = crate::scenario();
    with_timeout(Duration::from_secs(240), "failpoint power cuts", async {
        sluice_tests::init_logging();
        let builder = MiniCluster::builder().block_size(1024 * 1024);
        let mut pc = PowerCluster::start(builder, 3).await.unwrap();
        pc.settle().unwrap();
        // Mid-packet: the packet reached the DataNodes but was never written.
        cut_at(&mut pc, "dn::before_write", "/fp/mid-packet", true).await;
        // The second hsync's fsync never ran.
        cut_at(&mut pc, "dn::before_fsync", "/fp/before-fsync", true).await;
        // Close: the replicas were never finalized.
        cut_at(&mut pc, "dn::finalize", "/fp/finalize", false).await;
    })
    .await
}
