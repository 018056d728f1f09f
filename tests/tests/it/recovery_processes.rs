//! Recovery with real processes: large files written with the `sluice` command line while
//! DataNode processes are killed with SIGKILL and restarted at random (seeded) moments (every
//! file whose `put` succeeded is compared byte for byte, and the cluster must repair itself
//! back to full replication, fsck HEALTHY); and three clients creating, writing, renaming and
//! deleting files and making directories while the metadata service and DataNodes are
//! killed with SIGKILL in turn (every acknowledged change and byte is checked afterwards).
//!
//! The services and the command line run from `sluice-proc`, which cargo builds for this test
//! binary (see `sluice_tests::process`). The seed is printed; set `SLUICE_CHAOS_SEED` to replay
//! a run.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_client::{FileSystem, WriteOptions};
use sluice_common::rpc::{FileKind, Health};
use sluice_tests::process::ProcessCluster;
use sluice_tests::{random_bytes, read_all, with_timeout, write_all};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const FILES: usize = 4;
const FILE_BYTES: usize = 40 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_put_survives_datanode_processes_killed_and_restarted_at_random() {
    with_timeout(Duration::from_secs(400), "chaos put", async {
        sluice_tests::init_logging();
        let seed = std::env::var("SLUICE_CHAOS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5_1u64 << 32 | 0xce);
        eprintln!("chaos seed {seed} (SLUICE_CHAOS_SEED to replay)");
        let mut rng = StdRng::seed_from_u64(seed);
        let mut cluster = ProcessCluster::builder(crate::binaries())
            .datanodes(5)
            .start()
            .await
            .unwrap();
        let local = tempfile::tempdir().unwrap();
        let (mut kills, mut recoveries) = (0, 0);
        let mut written = Vec::new();
        for f in 0..FILES {
            let data = random_bytes(FILE_BYTES, seed ^ f as u64);
            let src = local.path().join(format!("f{f}"));
            std::fs::write(&src, &data).unwrap();
            let dst = format!("/chaos/f{f}");
            let mut put = cluster.sluice();
            put.env("RUST_LOG", "warn")
                .args(["put", "--block-size", "2MiB"])
                .arg(&src)
                .arg(&dst)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let child = put.spawn().unwrap();
            let output = tokio::spawn(child.wait_with_output());
            // While the put runs: kill a running DataNode (never more than one down), then
            // restart it, each after a random pause.
            let mut down: Option<usize> = None;
            while !output.is_finished() {
                let pause = Duration::from_millis(rng.random_range(50..400));
                tokio::time::sleep(pause).await;
                match down.take() {
                    Some(i) => cluster.start_datanode(i).await.unwrap(),
                    None => {
                        let i = rng.random_range(0..cluster.datanode_count());
                        cluster.kill_datanode(i).await.unwrap();
                        kills += 1;
                        down = Some(i);
                    }
                }
            }
            if let Some(i) = down {
                cluster.start_datanode(i).await.unwrap();
            }
            let out = output.await.unwrap().unwrap();
            assert!(
                out.status.success(),
                "sluice put {dst} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            let log = String::from_utf8_lossy(&out.stderr);
            recoveries += log.matches("pipeline failed").count();
            written.push((dst, data));
        }
        eprintln!("{kills} DataNode processes killed, {recoveries} pipeline failures recovered during {FILES} puts");
        assert!(kills >= FILES, "the chaos did kill DataNodes ({kills})");
        cluster.wait_live(5).await.unwrap();
        let fs = cluster.client().await.unwrap();
        for (path, data) in &written {
            let back = read_all(&fs, path).await.unwrap();
            assert!(back == *data, "{path}: read {} bytes back", back.len());
        }
        // Re-replication (and deletion of stale replicas) brings everything back to three.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let report = fs.fsck("/chaos").await.unwrap();
            if report.health == Health::Healthy {
                break;
            }
            assert!(Instant::now() < deadline, "not HEALTHY: {report:#?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for (path, data) in &written {
            assert!(read_all(&fs, path).await.unwrap() == *data, "{path}");
        }
    })
    .await
}

/// What a worker knows of its directory: acknowledged changes only; a failed call leaves its
/// paths in doubt (the change may or may not have been made) and they are not checked.
#[derive(Default)]
struct Model {
    /// Closed files and their bytes.
    files: BTreeMap<String, Vec<u8>>,
    /// Acknowledged directories.
    dirs: Vec<String>,
    /// Paths acknowledged gone (deleted, or renamed away); names are never reused.
    gone: Vec<String>,
    acked: usize,
    failed: usize,
}

/// Creates, writes, renames, deletes and makes directories under `/w<id>` until `stop`.
async fn namespace_worker(fs: FileSystem, id: usize, seed: u64, stop: Arc<AtomicBool>) -> Model {
    let mut rng = StdRng::seed_from_u64(seed ^ (id as u64) << 8);
    let mut m = Model::default();
    let base = format!("/w{id}");
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let roll = rng.random_range(0..10);
        let ok = if roll < 5 || m.files.is_empty() {
            let path = format!("{base}/f{n}");
            let data = random_bytes(rng.random_range(1..192 * 1024), seed ^ n << 16 ^ id as u64);
            let opts = WriteOptions {
                create_parent: true,
                ..WriteOptions::default()
            };
            let ok = write_all(&fs, &path, &data, opts, 64 * 1024).await.is_ok();
            if ok {
                m.files.insert(path, data);
            }
            ok
        } else if roll < 7 {
            let i = rng.random_range(0..m.files.len());
            let src = m.files.keys().nth(i).cloned().unwrap_or_default();
            let data = m.files.remove(&src).unwrap_or_default();
            let dst = format!("{base}/r{n}");
            let ok = fs.rename(&src, &dst).await.is_ok();
            if ok {
                m.gone.push(src);
                m.files.insert(dst, data);
            }
            ok
        } else if roll < 9 {
            let i = rng.random_range(0..m.files.len());
            let path = m.files.keys().nth(i).cloned().unwrap_or_default();
            m.files.remove(&path);
            let ok = fs.delete(&path, false).await.is_ok_and(|existed| existed);
            if ok {
                m.gone.push(path);
            }
            ok
        } else {
            let path = format!("{base}/d{n}/e");
            let ok = fs.mkdirs(&path, true).await.is_ok();
            if ok {
                m.dirs.push(path);
            }
            ok
        };
        if ok {
            m.acked += 1;
        } else {
            m.failed += 1;
            // The service is down or restarting: try again shortly.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_namespace_changes_and_bytes_survive_metadata_and_datanode_kill_9() {
    with_timeout(Duration::from_secs(120), "kill -9 namespace chaos", async {
        sluice_tests::init_logging();
        let seed = std::env::var("SLUICE_CHAOS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x9e7a);
        eprintln!("chaos seed {seed} (SLUICE_CHAOS_SEED to replay)");
        let mut rng = StdRng::seed_from_u64(seed);
        let mut cluster = ProcessCluster::builder(crate::binaries())
            .datanodes(4)
            .start()
            .await
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for id in 0..3 {
            let fs = cluster.client().await.unwrap();
            workers.push(tokio::spawn(namespace_worker(fs, id, seed, stop.clone())));
        }
        // Kill -9 the metadata service and a DataNode in turn while the workers run, each
        // restarted at once on its directory and port.
        let (mut meta_kills, mut dn_kills) = (0, 0);
        for round in 0..8 {
            let pause = Duration::from_millis(rng.random_range(700..1500));
            tokio::time::sleep(pause).await;
            if round % 2 == 0 {
                cluster.kill_metadata().await.unwrap();
                cluster.start_metadata().await.unwrap();
                meta_kills += 1;
            } else {
                let i = rng.random_range(0..cluster.datanode_count());
                cluster.kill_datanode(i).await.unwrap();
                cluster.start_datanode(i).await.unwrap();
                dn_kills += 1;
            }
        }
        // Let the workers get changes through the last restart, then stop them.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        stop.store(true, Ordering::SeqCst);
        let mut models = Vec::new();
        for w in workers {
            models.push(w.await.unwrap());
        }
        let acked: usize = models.iter().map(|m| m.acked).sum();
        let failed: usize = models.iter().map(|m| m.failed).sum();
        eprintln!(
            "{meta_kills} metadata and {dn_kills} DataNode kill -9s; {acked} changes \
             acknowledged, {failed} failed"
        );
        assert!(
            failed > 0,
            "the kills did interrupt the workers (else the test checks nothing)"
        );
        assert!(acked >= 30, "only {acked} changes acknowledged");
        cluster.wait_live(4).await.unwrap();
        let fs = cluster.client().await.unwrap();
        for m in &models {
            for (path, data) in &m.files {
                // Replicas are reported to the restarted service by the DataNodes.
                let mut back = read_all(&fs, path).await;
                let deadline = Instant::now() + Duration::from_secs(30);
                while back.is_err() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    back = read_all(&fs, path).await;
                }
                let back = back.unwrap_or_else(|e| panic!("acknowledged {path} unreadable: {e:#}"));
                assert!(
                    back == *data,
                    "{path}: {} bytes back of {}",
                    back.len(),
                    data.len()
                );
            }
            for path in &m.gone {
                assert!(
                    fs.stat(path).await.is_err(),
                    "{path} was deleted or renamed away, yet it is there"
                );
            }
            for path in &m.dirs {
                let st = fs.stat(path).await;
                assert!(
                    st.as_ref().is_ok_and(|s| s.kind == FileKind::Directory),
                    "acknowledged directory {path}: {st:?}"
                );
            }
        }
    })
    .await
}
