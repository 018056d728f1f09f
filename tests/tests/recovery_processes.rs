//! Pipeline recovery with real processes: large files written with the `sluice` command line
//! while DataNode processes are killed with SIGKILL and restarted at random (seeded) moments.
//! Every file whose `put` succeeded is compared byte for byte, and the cluster must repair
//! itself back to full replication (fsck HEALTHY).
//!
//! The binaries come from `target/<profile>/` (see `sluice_tests::process`): `cargo test
//! --workspace` builds them; otherwise the harness runs `cargo build --bins` first. The seed is
//! printed; set `SLUICE_CHAOS_SEED` to replay a run.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_common::rpc::Health;
use sluice_tests::process::ProcessCluster;
use sluice_tests::{random_bytes, read_all, with_timeout};
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
        let mut cluster = ProcessCluster::builder()
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
