//! The hostile-input suite (issue 11): a running MiniCluster, a writer and a reader at work,
//! and every port — DataNode data and HTTP, metadata RPC and HTTP — sent garbage, truncated
//! frames, length prefixes up to 2^32-1, unknown ops, valid frames out of order, packets with
//! bad sequence numbers or offsets past the block, and the destructive messages of the issue
//! without a valid token ([`attacks`]).
//!
//! After each attack ([`Sound::check`]): the connection was closed (after a typed error status
//! where the protocol has one) within a bounded time; every node still serves (a fresh put and
//! get, every HTTP port's `/health`); every pre-existing file reads back byte-exact; no replica
//! file of a pre-existing block changed and no replica appeared for a block nobody allocated;
//! the namespace outside the suite's own directories is as before. At the end the writer's and
//! the reader's bytes are exact. Memory is checked on nodes run as processes, where a process's
//! RSS is the node's own: `hostile_processes`.

mod attacks;

use sluice_client::{FileKind, FileSystem, WriteOptions};
use sluice_common::config::HumanDuration;
use sluice_tests::{random_bytes, read_all, with_timeout, write_all, MiniCluster};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const LIMIT: Duration = Duration::from_secs(120);
const BLOCK: u64 = 64 * 1024;
/// The DataNodes' socket timeout: a silent or truncated data connection is closed after it.
const DN_SOCKET_TIMEOUT: Duration = Duration::from_secs(3);
/// The metadata service's RPC idle timeout.
const RPC_IDLE: Duration = Duration::from_secs(2);
/// Both HTTP ports' request-head, keep-alive and body-idle timeouts.
const HTTP_TIMEOUT: Duration = Duration::from_secs(1);
/// Files written before the attacks, checked byte for byte after each.
const PRE: [(&str, usize); 3] = [("/pre/a", 200_000), ("/pre/b", 5_000), ("/pre/c", 70_000)];
/// The suite's own directories (the live writer, probes, the attacker's own files), left out
/// of the namespace comparison.
const OWN_DIRS: [&str; 3] = ["/live", "/probe", "/own"];

fn opts() -> WriteOptions {
    WriteOptions {
        overwrite: true,
        create_parent: true,
        ..WriteOptions::default()
    }
}

async fn cluster() -> MiniCluster {
    sluice_tests::init_logging();
    MiniCluster::builder()
        .block_size(BLOCK)
        .configure_datanodes(|_, d| {
            d.socket_timeout = HumanDuration(DN_SOCKET_TIMEOUT);
            d.http_request_timeout = HumanDuration(HTTP_TIMEOUT);
            d.http_body_idle_timeout = HumanDuration(HTTP_TIMEOUT);
            d.http_keep_alive_timeout = HumanDuration(HTTP_TIMEOUT);
        })
        .configure_metadata(|m| {
            m.rpc_idle_timeout = HumanDuration(RPC_IDLE);
            m.http_request_timeout = HumanDuration(HTTP_TIMEOUT);
            m.http_body_idle_timeout = HumanDuration(HTTP_TIMEOUT);
            m.http_keep_alive_timeout = HumanDuration(HTTP_TIMEOUT);
        })
        .configure_client(|c| c.rpc_connection_max_idle = HumanDuration(RPC_IDLE / 2))
        .start()
        .await
        .expect("cluster starts")
}

/// Replica files on every DataNode: (DataNode, path inside its volume) → (block id, length,
/// CRC32C of the content).
type Disk = BTreeMap<(usize, String), (u64, u64, u32)>;

fn disk(c: &MiniCluster) -> Disk {
    fn walk(dn: usize, root: &Path, dir: &Path, out: &mut Disk) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(dn, root, &path, out);
                continue;
            }
            let name = e.file_name().to_string_lossy().to_string();
            let Some(id) = name
                .strip_prefix("blk_")
                .and_then(|rest| rest.split(['_', '.']).next())
                .and_then(|id| id.parse::<u64>().ok())
            else {
                continue;
            };
            // A file may go between listing and reading (a probe's replica deleted).
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .display()
                .to_string();
            out.insert((dn, rel), (id, bytes.len() as u64, crc32c::crc32c(&bytes)));
        }
    }
    let mut out = Disk::new();
    for dn in 0..c.datanode_count() {
        for vol in c.datanode_dirs(dn) {
            walk(dn, &vol, &vol, &mut out);
        }
    }
    out
}

/// Every entry of the namespace outside [`OWN_DIRS`], with what a change would show.
async fn namespace(fs: &FileSystem) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec!["/".to_string()];
    while let Some(dir) = dirs.pop() {
        for st in fs.list(&dir).await.expect("list") {
            if OWN_DIRS.contains(&st.path.as_str()) {
                continue;
            }
            if st.kind == FileKind::Directory {
                dirs.push(st.path.clone());
            }
            out.push(format!(
                "{} {:?} len={} blocks={} mtime={} uc={}",
                st.path,
                st.kind,
                st.length,
                st.block_count,
                st.modification_time_ms,
                st.under_construction
            ));
        }
    }
    out.sort();
    out
}

/// What must hold after every attack.
struct Sound {
    pre: Vec<(String, Vec<u8>)>,
    pre_blocks: BTreeSet<u64>,
    /// The replica files of the pre-existing blocks.
    pre_disk: Disk,
    namespace: Vec<String>,
    /// Blocks allocated by the suite's own writers (probes, the attacker's own files).
    own_blocks: Mutex<BTreeSet<u64>>,
    probes: AtomicU64,
}

impl Sound {
    async fn take(c: &MiniCluster, fs: &FileSystem, pre: Vec<(String, Vec<u8>)>) -> Sound {
        let mut pre_blocks = BTreeSet::new();
        for (path, _) in &pre {
            for lb in fs.get_block_locations(path).await.unwrap().blocks {
                pre_blocks.insert(lb.block.id.0);
            }
        }
        let pre_disk = disk(c)
            .into_iter()
            .filter(|(_, (id, ..))| pre_blocks.contains(id))
            .collect();
        Sound {
            namespace: namespace(fs).await,
            pre,
            pre_blocks,
            pre_disk,
            own_blocks: Mutex::new(BTreeSet::new()),
            probes: AtomicU64::new(0),
        }
    }

    fn own_block(&self, id: u64) {
        self.own_blocks.lock().unwrap().insert(id);
    }

    async fn check(&self, c: &MiniCluster, what: &str) {
        let fs = c.client().await.unwrap();
        // Every node serves: a fresh put and get through all three DataNodes, every /health.
        let n = self.probes.fetch_add(1, Ordering::Relaxed);
        let probe = format!("/probe/{n}");
        let data = random_bytes(3000, 7000 + n);
        write_all(&fs, &probe, &data, opts(), 1000)
            .await
            .unwrap_or_else(|e| panic!("after {what}: a fresh put fails: {e:#}"));
        for lb in fs.get_block_locations(&probe).await.unwrap().blocks {
            self.own_block(lb.block.id.0);
        }
        assert!(
            read_all(&fs, &probe).await.unwrap() == data,
            "after {what}: probe"
        );
        let mut http = vec![c.metadata_http_addr().unwrap()];
        http.extend((0..c.datanode_count()).map(|i| c.datanode(i).unwrap().http_addr()));
        for addr in http {
            let r = sluice_tests::http::request("GET", &format!("http://{addr}/health"), b"")
                .await
                .unwrap_or_else(|e| panic!("after {what}: {addr}/health: {e:#}"));
            assert_eq!(r.status, 200, "after {what}: {addr}/health");
        }
        // Pre-existing files exact, their replicas untouched, no replica nobody allocated.
        for (path, want) in &self.pre {
            let got = read_all(&fs, path).await.unwrap();
            assert!(&got == want, "after {what}: {path} changed");
        }
        let now = disk(c);
        let pre_now: Disk = now
            .iter()
            .filter(|(_, (id, ..))| self.pre_blocks.contains(id))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        assert_eq!(
            pre_now, self.pre_disk,
            "after {what}: replica files changed"
        );
        // The live writer's blocks, read after the disk so that none it allocated is missed.
        let live: BTreeSet<u64> = fs
            .get_block_locations("/live/w")
            .await
            .map(|l| l.blocks.iter().map(|b| b.block.id.0).collect())
            .unwrap_or_default();
        let own = self.own_blocks.lock().unwrap().clone();
        for ((dn, file), (id, ..)) in &now {
            let known = self.pre_blocks.contains(id) || own.contains(id) || live.contains(id);
            assert!(
                known,
                "after {what}: DataNode {dn} holds {file} of no allocated block"
            );
        }
        assert_eq!(
            namespace(&fs).await,
            self.namespace,
            "after {what}: namespace changed"
        );
    }
}

/// Appends 4 KiB pieces to `/live/w`, hflushing every 8, until `stop`; returns what it wrote.
async fn live_writer(fs: FileSystem, stop: Arc<AtomicBool>) -> Vec<u8> {
    let mut w = fs.create("/live/w", opts()).await.unwrap();
    let mut all = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) || i < 16 {
        let piece = random_bytes(4096, 100 + i);
        w.write_all(&piece).await.unwrap();
        all.extend_from_slice(&piece);
        if i % 8 == 7 {
            w.hflush().await.unwrap();
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w.close().await.unwrap();
    all
}

/// Reads the pre-existing files over and over until `stop`, checking every byte; returns how
/// many files it read.
async fn live_reader(fs: FileSystem, pre: Vec<(String, Vec<u8>)>, stop: Arc<AtomicBool>) -> u64 {
    let mut reads = 0;
    while !stop.load(Ordering::Relaxed) || reads == 0 {
        for (path, want) in &pre {
            let got = read_all(&fs, path).await.unwrap();
            assert!(
                &got == want,
                "the concurrent reader got other bytes of {path}"
            );
            reads += 1;
        }
    }
    reads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_port_survives_hostile_traffic_while_a_writer_and_a_reader_run() {
    with_timeout(LIMIT, "the hostile-input suite", async {
        let c = cluster().await;
        let fs = c.client().await.unwrap();
        let mut pre = Vec::new();
        for (i, (path, len)) in PRE.iter().enumerate() {
            let data = random_bytes(*len, 1 + i as u64);
            write_all(&fs, path, &data, opts(), 10_000).await.unwrap();
            pre.push((path.to_string(), data));
        }
        for dir in OWN_DIRS {
            fs.mkdirs(dir, true).await.unwrap();
        }
        let sound = Sound::take(&c, &fs, pre.clone()).await;
        let stop = Arc::new(AtomicBool::new(false));
        let writer = tokio::spawn(live_writer(c.client().await.unwrap(), stop.clone()));
        let reader = tokio::spawn(live_reader(c.client().await.unwrap(), pre, stop.clone()));

        attacks::all(&c, &sound).await;

        stop.store(true, Ordering::Relaxed);
        let written = writer.await.expect("the concurrent writer");
        let reads = reader.await.expect("the concurrent reader");
        assert!(reads > 0);
        assert!(
            read_all(&fs, "/live/w").await.unwrap() == written,
            "the concurrent writer's file"
        );
        sound.check(&c, "the end").await;
        c.shutdown().await;
    })
    .await
}

/// Sends `bytes` on a fresh connection to `addr` (and, with `eof`, closes the sending side).
async fn send_raw(addr: &str, bytes: &[u8], eof: bool) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The peer may close before taking everything: that is one of the answers tested for.
    let _ = s.write_all(bytes).await;
    if eof {
        let _ = s.shutdown().await;
    }
    s
}
