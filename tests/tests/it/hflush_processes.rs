//! hflush'ed bytes survive the loss of the buffering DataNode, with real processes: a client
//! hflushes into a pipeline whose last DataNode batches in memory, that DataNode is SIGKILLed
//! (its buffer dies with it), the client dies, the other DataNodes are SIGKILLed as well, all
//! restart (every replica is then Rwr, the last one shorter than the others), and the lease is
//! recovered: the file keeps at least the hflushed length, byte for byte.
//!
//! The services run from `sluice-proc`, which cargo builds for this test binary (see
//! `sluice_tests::process`).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_client::{FileSystem, WriteOptions};
use sluice_tests::process::ProcessCluster;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const MIB: usize = 1024 * 1024;
/// More than one buffer (1 MiB): the last replica flushed its first MiB and holds the rest of
/// the hflushed bytes in memory only.
const HFLUSHED: usize = MIB + MIB / 2 + 1000;
const PATH: &str = "/hflush/file";

/// Writes `data` and hflushes it, in a runtime of its own; returns the writer, its file
/// system and that runtime, so the caller can kill the client by dropping the runtime.
#[allow(clippy::disallowed_methods)] // a test's own thread, joined by the test
fn hflush_in_own_runtime(
    cfg: sluice_client::ClientConfig,
    data: Vec<u8>,
) -> (
    FileSystem,
    sluice_client::FileWriter,
    tokio::runtime::Runtime,
) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (fs, w) = rt.block_on(async move {
            let fs = FileSystem::connect(cfg).await.unwrap();
            let opts = WriteOptions {
                create_parent: true,
                block_size: Some(8 * MIB as u64),
                ..WriteOptions::default()
            };
            let mut w = fs.create(PATH, opts).await.unwrap();
            w.write_all(&data).await.unwrap();
            w.hflush().await.unwrap();
            (fs, w)
        });
        (fs, w, rt)
    })
    .join()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hflushed_bytes_survive_a_sigkill_of_the_buffering_datanode_and_every_restart() {
    with_timeout(
        Duration::from_secs(240),
        "hflush + SIGKILL, all restarted",
        lose_the_buffer(true),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hflushed_bytes_survive_a_sigkill_of_the_buffering_datanode_the_others_running() {
    with_timeout(
        Duration::from_secs(240),
        "hflush + SIGKILL, others run",
        lose_the_buffer(false),
    )
    .await
}

/// The scenario; `restart_others`: the first two DataNodes are SIGKILLed and restarted too
/// (all three replicas Rwr), else they keep running (two Rbw, one Rwr).
async fn lose_the_buffer(restart_others: bool) {
    sluice_tests::init_logging();
    let mut cluster = ProcessCluster::builder(crate::binaries())
        .datanode_env("SLUICE_DATANODE__WRITE__MEMORY__BUFFER__ENABLED", "true")
        .datanode_env("SLUICE_DATANODE__WRITE__BUFFER__SIZE__BYTES", "1MiB")
        .datanode_env(
            "SLUICE_DATANODE__WRITE__BUFFER__IDLE__FLUSH__TIMEOUT__MS",
            "0",
        )
        .start()
        .await
        .unwrap();
    let data = random_bytes(HFLUSHED, 0x4f1u64);
    let (fs, w, rt) = hflush_in_own_runtime(cluster.client_config(), data.clone());
    let fs2 = cluster.client().await.unwrap();
    let located = fs2.get_block_locations(PATH).await.unwrap();
    let lb = located.blocks.last().cloned().unwrap();
    let index_of = |addr: &str| {
        (0..cluster.datanode_count())
            .find(|&i| addr.ends_with(&format!(":{}", cluster.datanode_port(i))))
            .unwrap()
    };
    let pipeline: Vec<usize> = lb
        .locations
        .iter()
        .map(|l| index_of(&l.data_addr))
        .collect();
    assert_eq!(pipeline.len(), 3, "{pipeline:?}");
    // The buffering DataNode dies first, with the bytes past its first MiB in memory;
    // then the client, before it can notice; then the others.
    cluster.kill_datanode(pipeline[2]).await.unwrap();
    rt.shutdown_background();
    drop((w, fs));
    let restarted = if restart_others {
        &pipeline[..]
    } else {
        &pipeline[2..]
    };
    for &i in &restarted[..restarted.len() - 1] {
        cluster.kill_datanode(i).await.unwrap();
    }
    for &i in restarted {
        cluster.start_datanode(i).await.unwrap();
    }
    cluster.wait_live(3).await.unwrap();
    wait_until(
        Duration::from_secs(120),
        "the lease is recovered",
        || async { fs2.recover_lease(PATH).await.unwrap_or(false) },
    )
    .await;
    let st = fs2.stat(PATH).await.unwrap();
    assert!(
        st.length >= HFLUSHED as u64,
        "the recovered file keeps every hflushed byte: {} < {HFLUSHED}",
        st.length
    );
    let back = read_all(&fs2, PATH).await.unwrap();
    assert!(
        back[..HFLUSHED] == data[..],
        "the hflushed bytes read back exact ({} bytes read)",
        back.len()
    );
}
