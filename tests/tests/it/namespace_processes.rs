//! The metadata service keeps its namespace in memory (loaded from its store at start): after
//! a SIGKILL during a storm of creates, renames, deletes and mkdirs from several clients, the
//! restarted process must answer `stat` and `list` from a copy rebuilt from the store, holding
//! every acknowledged change, nothing half-applied, and handing out no inode twice.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_client::{FileSystem, WriteOptions};
use sluice_common::rpc::FileKind;
use sluice_tests::process::ProcessCluster;
use sluice_tests::with_timeout;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What one client was told (`acked`) and what it was in the middle of (`maybe`).
#[derive(Debug, Default)]
struct Model {
    /// Entries of the client's directory `/t<id>` acknowledged present (names).
    acked: BTreeSet<String>,
    /// Entries whose change was not answered (the service died under it): present or not.
    maybe: BTreeSet<String>,
    /// Names acknowledged gone.
    gone: BTreeSet<String>,
}

async fn create_empty(fs: &FileSystem, path: &str) -> bool {
    match fs.create(path, WriteOptions::default()).await {
        Ok(mut w) => w.close().await.is_ok(),
        Err(_) => false,
    }
}

/// Creates (and every third time renames, every fifth deletes) files and makes directories
/// in `/t<id>` until `stop`, one change at a time.
async fn worker(fs: FileSystem, id: usize, stop: Arc<AtomicBool>) -> Model {
    let dir = format!("/t{id}");
    let mut m = Model::default();
    while fs.mkdirs(&dir, true).await.is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let name = format!("f{n}");
        let (ok, added, removed) = if n.is_multiple_of(7) {
            let name = format!("d{n}");
            let ok = fs.mkdirs(&format!("{dir}/{name}"), false).await.is_ok();
            (ok, Some(name), None)
        } else if n.is_multiple_of(3) && !m.acked.is_empty() {
            let src = m.acked.iter().find(|s| s.starts_with('f')).cloned();
            let Some(src) = src else { continue };
            let dst = format!("r{n}");
            let ok = fs
                .rename(&format!("{dir}/{src}"), &format!("{dir}/{dst}"))
                .await
                .is_ok();
            m.acked.remove(&src);
            (ok, Some(dst), Some(src))
        } else if n.is_multiple_of(5) && !m.acked.is_empty() {
            let victim = m.acked.iter().find(|s| s.starts_with('r')).cloned();
            let Some(victim) = victim else { continue };
            let ok = fs
                .delete(&format!("{dir}/{victim}"), false)
                .await
                .is_ok_and(|existed| existed);
            m.acked.remove(&victim);
            (ok, None, Some(victim))
        } else {
            let ok = create_empty(&fs, &format!("{dir}/{name}")).await;
            (ok, Some(name), None)
        };
        if ok {
            m.acked.extend(added);
            m.gone.extend(removed);
        } else {
            // Unanswered: either side of the change may be what the store holds.
            m.maybe.extend(added);
            m.maybe.extend(removed);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_is_rebuilt_in_memory_after_metadata_kill_9() {
    with_timeout(
        Duration::from_secs(120),
        "metadata kill -9 rebuild",
        async {
            sluice_tests::init_logging();
            let mut cluster = ProcessCluster::builder(crate::binaries())
                .datanodes(1)
                .start()
                .await
                .unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let mut workers = Vec::new();
            for id in 0..8 {
                let fs = cluster.client().await.unwrap();
                workers.push(tokio::spawn(worker(fs, id, stop.clone())));
            }
            // Kill -9 once enough changes went through (the workers keep going while it is down).
            let probe = cluster.client().await.unwrap();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let n = probe.list("/t0").await.map(|l| l.len()).unwrap_or(0);
                if n >= 40 || tokio::time::Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            cluster.kill_metadata().await.unwrap();
            cluster.start_metadata().await.unwrap();
            // A few more changes after the restart, on the rebuilt copy.
            let fs = cluster.client().await.unwrap();
            while probe_create(&fs, "/after/one").await.is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            stop.store(true, Ordering::SeqCst);
            let mut models = Vec::new();
            for w in workers {
                models.push(w.await.unwrap());
            }
            let acked: usize = models.iter().map(|m| m.acked.len() + m.gone.len()).sum();
            assert!(acked >= 40, "only {acked} changes acknowledged");
            for (id, m) in models.iter().enumerate() {
                let dir = format!("/t{id}");
                let listed: BTreeSet<String> = fs
                    .list(&dir)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|s| s.path.rsplit('/').next().unwrap_or_default().to_string())
                    .collect();
                for name in &m.acked {
                    assert!(
                        listed.contains(name),
                        "{dir}/{name} acknowledged, not listed"
                    );
                    let st = fs.stat(&format!("{dir}/{name}")).await.unwrap();
                    let want = if name.starts_with('d') {
                        FileKind::Directory
                    } else {
                        FileKind::File
                    };
                    assert_eq!(st.kind, want, "{dir}/{name}");
                    if want == FileKind::File {
                        assert!(!st.under_construction, "{dir}/{name} closed, yet open");
                    }
                }
                for name in &listed {
                    assert!(
                        m.acked.contains(name) || m.maybe.contains(name),
                        "{dir}/{name} listed, never acknowledged nor attempted"
                    );
                }
                for name in m.gone.iter().filter(|n| !m.maybe.contains(*n)) {
                    assert!(!listed.contains(name), "{dir}/{name} acknowledged gone");
                    assert!(fs.stat(&format!("{dir}/{name}")).await.is_err());
                }
            }
            // New inodes after the restart do not reuse old ids: a new file is its own entry and
            // every old one is still there as it was.
            probe_create(&fs, "/after/two").await.unwrap();
            assert_eq!(fs.list("/after").await.unwrap().len(), 2);
            for (id, m) in models.iter().enumerate() {
                let n = fs.list(&format!("/t{id}")).await.unwrap().len();
                assert!(n >= m.acked.len(), "/t{id} shrank after new creates");
            }
        },
    )
    .await
}

async fn probe_create(fs: &FileSystem, path: &str) -> anyhow::Result<()> {
    let opts = WriteOptions {
        create_parent: true,
        ..WriteOptions::default()
    };
    let mut w = fs.create(path, opts).await?;
    w.close().await?;
    Ok(())
}
