//! Seeded random power cuts on the lazyfs rig: 50 crash points (`SLUICE_CRASH_POINTS`), each
//! after a few random operations and during a write and a stream of mkdirs, renames and
//! deletes still running; the metadata service, one DataNode or the whole cluster loses power
//! (its mount is cut and its process killed: every node runs as its own process,
//! [`ProcessPowerCluster`]). After every restart, every
//! acknowledged byte and namespace change must be there and exact, and what was in flight
//! must be absent or an exact prefix. The seed is printed; `SLUICE_CRASH_SEED` replays a run.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_client::{FileSystem, FileWriter, WriteOptions};
use sluice_tests::power::ProcessPowerCluster;
use sluice_tests::process::{Binaries, ProcessCluster};
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, write_all};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const DATANODES: usize = 4;

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn opts() -> WriteOptions {
    WriteOptions {
        create_parent: true,
        ..Default::default()
    }
}

/// What the cluster acknowledged.
#[derive(Default)]
struct Model {
    /// Closed files and their bytes.
    closed: BTreeMap<String, Vec<u8>>,
    /// Files that must not exist (deleted, renamed away).
    absent: Vec<String>,
    /// Open files: writer, the bytes written, how many of them an hsync acknowledged.
    open: Vec<(String, FileWriter, Vec<u8>, usize)>,
    next: u64,
}

impl Model {
    fn name(&mut self) -> String {
        self.next += 1;
        format!("/r/d{}/f{}", self.next % 4, self.next)
    }
}

async fn random_op(fs: &FileSystem, m: &mut Model, rng: &mut StdRng) {
    match rng.random_range(0..10) {
        0..=4 => {
            let (p, data) = (
                m.name(),
                random_bytes(rng.random_range(0..200_000), rng.random()),
            );
            write_all(fs, &p, &data, opts(), 64 * 1024).await.unwrap();
            m.closed.insert(p, data);
        }
        5 if m.open.len() < 2 => {
            let (p, data) = (
                m.name(),
                random_bytes(rng.random_range(1..150_000), rng.random()),
            );
            let mut w = fs.create(&p, opts()).await.unwrap();
            let synced = rng.random_range(0..=data.len());
            w.write_all(&data[..synced]).await.unwrap();
            w.hsync().await.unwrap();
            w.write_all(&data[synced..]).await.unwrap();
            w.hflush().await.unwrap();
            m.open.push((p, w, data, synced));
        }
        6 | 7 if !m.closed.is_empty() => {
            let k = rng.random_range(0..m.closed.len());
            let src = m.closed.keys().nth(k).cloned().unwrap();
            let dst = m.name();
            fs.rename(&src, &dst).await.unwrap();
            let data = m.closed.remove(&src).unwrap();
            m.closed.insert(dst.clone(), data);
            m.absent.retain(|a| *a != dst);
            m.absent.push(src);
        }
        8 if !m.closed.is_empty() => {
            let k = rng.random_range(0..m.closed.len());
            let p = m.closed.keys().nth(k).cloned().unwrap();
            assert!(fs.delete(&p, false).await.unwrap());
            m.closed.remove(&p);
            m.absent.push(p);
        }
        _ => {
            let d = format!("/r/dirs/x{}", rng.random_range(0..20));
            fs.mkdirs(&d, true).await.unwrap();
        }
    }
}

/// A namespace change of the stream that runs through the crash.
#[derive(Debug, Clone)]
enum NsOp {
    Mkdirs(String),
    Rename(String, String),
    Delete(String),
}

/// What the stream had acknowledged when the power went, and the change then in flight.
#[derive(Debug, Default)]
struct NsStream {
    acked: Vec<NsOp>,
    in_flight: Option<NsOp>,
}

impl NsStream {
    /// Every acknowledged change is there; the one in flight is all there or not at all.
    async fn verify(self, fs: &FileSystem, point: u64) -> usize {
        let mut present = std::collections::BTreeSet::new();
        let mut gone = Vec::new();
        for op in &self.acked {
            match op {
                NsOp::Mkdirs(p) => {
                    present.insert(p.clone());
                }
                NsOp::Rename(a, b) => {
                    present.remove(a);
                    present.insert(b.clone());
                    gone.push(a.clone());
                }
                NsOp::Delete(p) => {
                    present.remove(p);
                    gone.push(p.clone());
                }
            }
        }
        let exists = |p: String| async move { fs.stat(&p).await.is_ok() };
        match &self.in_flight {
            Some(NsOp::Rename(a, b)) => {
                let (ea, eb) = (exists(a.clone()).await, exists(b.clone()).await);
                assert!(
                    ea != eb,
                    "point {point}: rename {a} -> {b} half-applied ({ea}, {eb})"
                );
                present.remove(a);
                present.remove(b);
            }
            Some(NsOp::Mkdirs(p) | NsOp::Delete(p)) => {
                present.remove(p);
            }
            None => {}
        }
        for p in present {
            assert!(
                exists(p.clone()).await,
                "point {point}: acknowledged {p} lost"
            );
        }
        for p in gone {
            let in_flight = matches!(&self.in_flight, Some(NsOp::Mkdirs(q)) if *q == p);
            assert!(
                in_flight || !exists(p.clone()).await,
                "point {point}: {p} came back"
            );
        }
        self.acked.len()
    }
}

/// Creates, renames and deletes directories under `base` until the power goes.
async fn ns_stream(fs: FileSystem, base: String, state: Arc<Mutex<NsStream>>) {
    for i in 0..1000 {
        let p = format!("{base}-c{i}");
        let mut ops = vec![NsOp::Mkdirs(p.clone())];
        match i % 3 {
            1 => ops.push(NsOp::Rename(p.clone(), format!("{p}-r"))),
            2 => ops.push(NsOp::Delete(p.clone())),
            _ => {}
        }
        for op in ops {
            state.lock().unwrap().in_flight = Some(op.clone());
            let ok = match &op {
                NsOp::Mkdirs(p) => fs.mkdirs(p, true).await.is_ok(),
                NsOp::Rename(a, b) => fs.rename(a, b).await.is_ok(),
                NsOp::Delete(p) => fs.delete(p, true).await.unwrap_or(false),
            };
            if !ok {
                return;
            }
            let mut st = state.lock().unwrap();
            st.in_flight = None;
            st.acked.push(op);
        }
    }
}

/// A write that runs through the crash: acknowledged nothing, so afterwards its file is
/// absent or an exact prefix.
fn in_flight_write(fs: FileSystem, path: String, data: Vec<u8>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Ok(mut w) = fs.create(&path, opts()).await else {
            return;
        };
        for piece in data.chunks(16 * 1024) {
            if w.write_all(piece).await.is_err() || w.hflush().await.is_err() {
                return;
            }
        }
        let _ = w.close().await;
    })
}

async fn check_prefix(fs: &FileSystem, path: &str, data: &[u8], min: usize) -> Vec<u8> {
    wait_until(Duration::from_secs(60), "lease recovery", || async {
        fs.recover_lease(path).await.unwrap_or(false)
    })
    .await;
    let got = read_all(fs, path).await.unwrap();
    assert!(
        got.len() >= min && got.len() <= data.len() && got[..] == data[..got.len()],
        "{path}: {} bytes, acknowledged {min} of {}",
        got.len(),
        data.len()
    );
    got
}

async fn verify(fs: &FileSystem, m: &mut Model) {
    for (p, data) in &m.closed {
        // After a restart the replicas are known again once the DataNodes have reported.
        let slot = Mutex::new(None);
        let slot_ref = &slot;
        let what = format!("closed file {p} readable again");
        wait_until(Duration::from_secs(30), &what, || async move {
            let got = read_all(fs, p).await.ok();
            let ok = got.is_some();
            *slot_ref.lock().unwrap() = got;
            ok
        })
        .await;
        let got = slot.into_inner().unwrap().unwrap();
        assert!(
            got == *data,
            "{p}: {} bytes, want {}",
            got.len(),
            data.len()
        );
    }
    for p in &m.absent {
        assert!(fs.stat(p).await.is_err(), "{p} came back");
    }
    for (p, w, data, synced) in std::mem::take(&mut m.open) {
        drop(w);
        let got = check_prefix(fs, &p, &data, synced).await;
        m.closed.insert(p, got);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_power_cuts_never_lose_what_was_acknowledged() {
    let points = env_or("SLUICE_CRASH_POINTS", 50);
    with_timeout(Duration::from_secs(600), "random power cuts", async {
        sluice_tests::init_logging();
        let seed = env_or("SLUICE_CRASH_SEED", 0x1a2f_5eed);
        eprintln!("crash seed {seed} (SLUICE_CRASH_SEED to replay), {points} crash points");
        let mut rng = StdRng::seed_from_u64(seed);
        // Every node its own process: a cut node is killed with everything it was doing.
        let builder = ProcessCluster::builder(Binaries::new(env!("CARGO_BIN_EXE_sluice-proc")))
            .metadata_env("SLUICE_METADATA__BLOCK__SIZE__DEFAULT", "128KiB")
            .datanode_env(
                "SLUICE_DATANODE__WRITE__BUFFER__IDLE__FLUSH__TIMEOUT__MS",
                "200",
            );
        let mut pc = ProcessPowerCluster::start(builder, DATANODES)
            .await
            .unwrap();
        // A cluster that has been up a while (see power_loss.rs on the store directory).
        pc.settle().unwrap();
        let mut m = Model::default();
        let mut ns_changes = 0;
        let fs = pc.cluster().client().await.unwrap();
        for d in 0..4 {
            fs.mkdirs(&format!("/r/d{d}"), true).await.unwrap();
        }
        for point in 0..points {
            let fs = pc.cluster().client().await.unwrap();
            for _ in 0..rng.random_range(1..4) {
                random_op(&fs, &mut m, &mut rng).await;
            }
            let (wp, wdata) = (m.name(), random_bytes(300_000, rng.random()));
            let writer = in_flight_write(fs.clone(), wp.clone(), wdata.clone());
            let stream = Arc::new(Mutex::new(NsStream::default()));
            let creator = tokio::spawn(ns_stream(fs.clone(), m.name(), stream.clone()));
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..60))).await;
            let target = rng.random_range(0..=DATANODES + 1);
            tracing::info!(point, target, "power cut");
            match target {
                0 => drop(pc.crash_metadata().await.unwrap()),
                t if t <= DATANODES => {
                    pc.crash_datanode(t - 1).await.unwrap();
                    pc.restart_datanode(t - 1).await.unwrap();
                }
                _ => drop(pc.crash_all().await.unwrap()),
            }
            writer.abort();
            let _ = writer.await;
            creator.abort();
            let _ = creator.await;
            pc.cluster().wait_live(DATANODES).await.unwrap();
            let fs = pc.cluster().client().await.unwrap();
            verify(&fs, &mut m).await;
            let stream = std::mem::take(&mut *stream.lock().unwrap());
            ns_changes += stream.verify(&fs, point).await;
            if fs.stat(&wp).await.is_ok() {
                check_prefix(&fs, &wp, &wdata, 0).await;
                fs.delete(&wp, false).await.unwrap();
            }
        }
        eprintln!(
            "{points} power cuts; {} files and {ns_changes} acknowledged changes of the \
             in-flight namespace stream checked",
            m.closed.len()
        );
    })
    .await
}
