//! Write-memory batching (HDFS-17973) on real DataNodes with a raw framed client: which
//! replicas are buffered, the visible length against the bytes on disk, the partial-chunk
//! round trip, the idle-flush timer, the memory cap under 64 writers, the per-volume flush
//! bound, flushing on an early end, O_DIRECT, read drop-behind, and every setting wired.

#![allow(clippy::unwrap_used)]

use crate::support::*;
use sluice_common::config::{ByteSize, DatanodeConfig, HumanDuration, Millis, SluiceConfig};
use sluice_common::proto::*;
use sluice_common::{ExtendedBlock, Status};
use sluice_datanode::write::buffer_pool::BufferSettings;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

/// A DataNode with `volumes` fresh volumes and the test config adjusted by `f`.
async fn node_with(meta: SocketAddr, volumes: usize, f: impl FnOnce(&mut DatanodeConfig)) -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = (0..volumes)
        .map(|v| tmp.path().join(format!("v{v}")))
        .collect();
    let mut cfg = config(meta, &dirs);
    f(&mut cfg);
    let mut n = Node::start_on(meta, dirs, Some(cfg)).await;
    n._tmp = Some(tmp);
    n
}

/// Batching with the idle flush off, so nothing reaches the disk before a flush is due.
fn no_idle(c: &mut DatanodeConfig) {
    c.write_buffer_idle_flush_timeout = Millis::new(0);
}

async fn info(addr: SocketAddr, b: ExtendedBlock) -> ReplicaInfo {
    let mut q = Client::connect(addr).await;
    let r = q.op(Op::ReplicaInfo(ReplicaInfoOp { block: b })).await;
    assert_eq!(r.status, Status::Success, "{}", r.message);
    r.replica.unwrap()
}

/// The block file of replica `id` under `dirs` (rbw or finalized).
fn block_file(dirs: &[PathBuf], id: u64) -> PathBuf {
    fn find(dir: &std::path::Path, name: &str) -> Option<PathBuf> {
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                if let Some(f) = find(&p, name) {
                    return Some(f);
                }
            } else if p.file_name().and_then(|n| n.to_str()) == Some(name) {
                return Some(p);
            }
        }
        None
    }
    let name = format!("blk_{id}");
    dirs.iter()
        .find_map(|d| find(d, &name))
        .unwrap_or_else(|| panic!("no block file {name}"))
}

fn file_len(dirs: &[PathBuf], id: u64) -> u64 {
    std::fs::metadata(block_file(dirs, id)).unwrap().len()
}

fn created(n: &Node) -> u64 {
    n.dn().metrics().buffered_replicas_created.get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_replica_only_buffers_one_of_three_and_off_buffers_all_three() {
    within(60, async {
        let (meta, _) = fake_meta().await;
        let data = random_bytes(200_000, 1);
        let mut last_only = Vec::new();
        for _ in 0..3 {
            last_only.push(node_with(meta, 1, |_| {}).await);
        }
        let [a, b, c] = [&last_only[0], &last_only[1], &last_only[2]];
        write_block(a.addr(), vec![b.id(), c.id()], block(1, 1, 0), &data).await;
        assert_eq!(
            [created(a), created(b), created(c)],
            [0, 0, 1],
            "only the last"
        );
        let mut all = Vec::new();
        for _ in 0..4 {
            all.push(node_with(meta, 1, |c| c.write_buffer_last_replica_only = false).await);
        }
        let [a, b, c, d] = [&all[0], &all[1], &all[2], &all[3]];
        write_block(a.addr(), vec![b.id(), c.id()], block(2, 1, 0), &data).await;
        assert_eq!(
            [created(a), created(b), created(c)],
            [1, 1, 1],
            "every replica"
        );
        for n in [a, b, c] {
            let (_, got) = read_block(n.addr(), block(2, 1, 0), 0, u64::MAX).await;
            assert!(got == data, "buffered replica reads back exact");
        }
        // A transfer writes directly, even where every Create replica is buffered.
        let mut q = Client::connect(a.addr()).await;
        let op = TransferBlockOp {
            block: block(2, 1, data.len() as u64),
            targets: vec![d.id()],
            stage: BlockStage::TransferFinalized,
            client_name: "t".into(),
        };
        let r = q.op(Op::TransferBlock(op)).await;
        assert_eq!(r.status, Status::Success, "{}", r.message);
        assert_eq!(created(d), 0, "transfer target not buffered");
        // So does a pipeline recovery.
        let mut w = Client::connect(d.addr()).await;
        assert_eq!(
            w.op(write_op(block(3, 1, 0), BlockStage::Create, vec![]))
                .await
                .status,
            Status::Success
        );
        let seq = send_data(&mut w, &data[..100_000], 0, 0).await;
        expect_acks(&mut w, seq as usize, 1).await;
        drop(w);
        let dm = d.dn().metrics();
        wait_for(Duration::from_secs(10), "the first writer ends", || {
            dm.buffered_replicas.get() == 0
        })
        .await;
        let mut op = write_op(block(3, 1, 100_000), BlockStage::StreamingRecovery, vec![]);
        if let Op::WriteBlock(o) = &mut op {
            o.latest_gen_stamp = sluice_common::GenerationStamp(2);
        }
        let mut w = Client::connect(d.addr()).await;
        let r = w.op(op).await;
        assert_eq!(r.status, Status::Success, "{}", r.message);
        let seq = send_data(&mut w, &data, 99_840, 0).await;
        w.packet(seq, data.len() as u64, &[], true, false).await;
        expect_acks(&mut w, seq as usize + 1, 1).await;
        assert_eq!(created(d), 1, "only the Create writer was buffered");
        let (_, got) = read_block(d.addr(), block(3, 2, 0), 0, u64::MAX).await;
        assert!(got == data);
        // Batching off: nothing buffered.
        let off = node_with(meta, 1, |c| c.write_buffer_enabled = false).await;
        write_block(off.addr(), vec![], block(4, 1, 0), &data).await;
        assert_eq!(created(&off), 0);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_hflush_the_visible_length_never_passes_the_bytes_on_disk() {
    within(60, async {
        let (meta, _) = fake_meta().await;
        let n = node_with(meta, 1, no_idle).await;
        let data = random_bytes(256 * KIB, 2);
        let b = block(10, 1, 0);
        let mut c = Client::connect(n.addr()).await;
        assert_eq!(
            c.op(write_op(b, BlockStage::Create, vec![])).await.status,
            Status::Success
        );
        let seq = send_data(&mut c, &data, 0, 0).await;
        expect_acks(&mut c, seq as usize, 1).await; // the hflush returned
        let r = info(n.addr(), b).await;
        assert_eq!(r.bytes_on_disk, 0, "still in the buffer");
        assert!(r.block.num_bytes <= r.bytes_on_disk, "{r:?}");
        assert_eq!(file_len(&n.dirs, 10), 0, "the block file holds nothing yet");
        let (resp, _) = read_block(n.addr(), b, 0, u64::MAX).await;
        assert_eq!(
            resp.status,
            Status::ErrorOutOfRange,
            "no read past the file's end"
        );
        // hsync: drained and durable, then visible.
        c.packet(seq, data.len() as u64, &[], false, true).await;
        expect_acks(&mut c, 1, 1).await;
        let r = info(n.addr(), b).await;
        assert_eq!(
            (r.bytes_on_disk, r.block.num_bytes),
            (data.len() as u64, data.len() as u64)
        );
        assert_eq!(file_len(&n.dirs, 10), data.len() as u64);
        let (_, got) = read_block(n.addr(), b, 0, u64::MAX).await;
        assert!(got == data);
        c.packet(seq + 1, data.len() as u64, &[], true, false).await;
        expect_acks(&mut c, 1, 1).await;
        let (blk, meta_file) = finalized_files(&n.dirs, 10).unwrap();
        assert_valid_files(&blk, &meta_file, &data);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unaligned_700_then_1300_bytes_round_trip_exactly() {
    within(60, async {
        let (meta, _) = fake_meta().await;
        let n = node_with(meta, 1, no_idle).await;
        let data = random_bytes(2000, 3);
        // Without and with an hsync after the first 700 bytes (which puts the partial chunk's
        // checksum in the file, to be rewritten by the next packet).
        for (id, sync) in [(20u64, false), (21, true)] {
            let b = block(id, 1, 0);
            let mut c = Client::connect(n.addr()).await;
            assert_eq!(
                c.op(write_op(b, BlockStage::Create, vec![])).await.status,
                Status::Success
            );
            c.packet(0, 0, &data[..700], false, sync).await;
            expect_acks(&mut c, 1, 1).await;
            c.packet(1, 512, &data[512..2000], false, false).await;
            expect_acks(&mut c, 1, 1).await;
            c.packet(2, 2000, &[], true, false).await;
            expect_acks(&mut c, 1, 1).await;
            let (r, got) = read_block(n.addr(), b, 0, u64::MAX).await;
            assert_eq!(r.replica.unwrap().block.num_bytes, 2000);
            assert!(got == data, "byte-exact (sync after 700: {sync})");
            let (blk, meta_file) = finalized_files(&n.dirs, id).unwrap();
            assert_valid_files(&blk, &meta_file, &data);
        }
        assert_eq!(created(&n), 2);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timer_flushes_a_silent_writer_and_re_arms() {
    within(60, async {
        let (meta, _) = fake_meta().await;
        let n = node_with(meta, 1, |c| {
            c.write_buffer_idle_flush_timeout = Millis::new(300)
        })
        .await;
        let m = n.dn().metrics();
        let data = random_bytes(640 * KIB, 4);
        let b = block(30, 1, 0);
        let mut c = Client::connect(n.addr()).await;
        assert_eq!(
            c.op(write_op(b, BlockStage::Create, vec![])).await.status,
            Status::Success
        );
        c.packet(0, 0, &data[..64 * KIB], false, false).await;
        expect_acks(&mut c, 1, 1).await;
        let addr = n.addr();
        let on_disk = |want: u64| async move { info(addr, b).await.bytes_on_disk == want };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !on_disk(64 * KIB as u64).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "silent writer never flushed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(m.idle_flushes.get() >= 1);
        // Writes spaced below the timeout (pacing, not waiting), then a stall.
        for i in 1..10 {
            let off = i * 64 * KIB;
            c.packet(
                i as i64,
                off as u64,
                &data[off..off + 64 * KIB],
                false,
                false,
            )
            .await;
            expect_acks(&mut c, 1, 1).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !on_disk(data.len() as u64).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the stall was never flushed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(file_len(&n.dirs, 30), data.len() as u64);
        c.packet(10, data.len() as u64, &[], true, false).await;
        expect_acks(&mut c, 1, 1).await;
        let (_, got) = read_block(n.addr(), b, 0, u64::MAX).await;
        assert!(got == data);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_writers_never_pass_the_memory_cap() {
    within(180, async {
        let (meta, _) = fake_meta().await;
        let n = node_with(meta, 1, |c| {
            no_idle(c);
            c.write_buffer_size = ByteSize::mib(1);
            c.write_buffer_max_capacity_mb = 4;
            c.socket_timeout = HumanDuration::secs(60);
        })
        .await;
        let m = n.dn().metrics();
        let wb = n.dn().write_buffers();
        assert_eq!(wb.available_permits(), Some(4));
        let data = Arc::new(random_bytes(MIB + 256 * KIB, 5));
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let (data, addr, mut rx) = (data.clone(), n.addr(), rx.clone());
            tasks.push(tokio::spawn(async move {
                let b = block(100 + i, 1, 0);
                let mut c = Client::connect(addr).await;
                let r = c.op(write_op(b, BlockStage::Create, vec![])).await;
                assert_eq!(r.status, Status::Success, "{}", r.message);
                while !*rx.borrow_and_update() {
                    rx.changed().await.unwrap();
                }
                let seq = send_data(&mut c, &data, 0, 0).await;
                c.packet(seq, data.len() as u64, &[], true, false).await;
                expect_acks(&mut c, seq as usize + 1, 1).await;
            }));
        }
        // Writers past the fourth wait for a permit in their set-up.
        wait_for(
            Duration::from_secs(60),
            "a writer waits for a permit",
            || m.write_buffer_permit_waits.get() > 0,
        )
        .await;
        tx.send(true).unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert!(
            m.write_buffer_bytes_peak.get() >= MIB as i64,
            "buffers were used"
        );
        assert!(
            m.write_buffer_bytes_peak.get() <= 4 * MIB as i64,
            "peak {}",
            m.write_buffer_bytes_peak.get()
        );
        assert_eq!(
            m.buffered_replicas_created.get() + m.write_buffer_permit_timeouts.get(),
            64,
            "each writer buffered, or wrote directly after waiting too long"
        );
        assert_eq!(wb.available_permits(), Some(4), "every permit back");
        assert_eq!(m.buffered_replicas.get(), 0);
        for i in [0u64, 31, 63] {
            let (_, got) = read_block(n.addr(), block(100 + i, 1, 0), 0, u64::MAX).await;
            assert!(got == *data, "writer {i}");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_flushes_per_volume_are_bounded_by_the_flush_budget() {
    within(180, async {
        let (meta, _) = fake_meta().await;
        for (volumes, budget_mb, limit) in [(1usize, 1u64, 1usize), (2, 2, 2)] {
            let n = node_with(meta, volumes, |c| {
                no_idle(c);
                c.write_buffer_size = ByteSize::mib(1);
                c.concurrent_flush_mb_per_volume = budget_mb;
            })
            .await;
            let wb = n.dn().write_buffers();
            for v in 0..volumes {
                assert_eq!(wb.flush_gate(v).unwrap().limit(), limit);
            }
            let data = Arc::new(random_bytes(3 * MIB, 6));
            let tasks: Vec<_> = (0..8u64)
                .map(|i| {
                    let (data, addr) = (data.clone(), n.addr());
                    tokio::spawn(async move {
                        write_block(addr, vec![], block(200 + i, 1, 0), &data).await
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            let m = n.dn().metrics();
            let peak = m.flushes_in_progress_peak.get();
            assert!(
                peak >= 1 && peak as usize <= limit * volumes,
                "peak {peak} with {volumes} volumes of {limit}"
            );
            assert!(m.buffer_flushes.get() >= 8 * 3, "full buffers flushed");
            let (_, got) = read_block(n.addr(), block(203, 1, 0), 0, u64::MAX).await;
            assert!(got == *data);
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_upstream_or_a_stop_flushes_what_was_received() {
    within(60, async {
        let (meta, _) = fake_meta().await;
        let n1 = node_with(meta, 1, no_idle).await;
        let n2 = node_with(meta, 1, no_idle).await;
        let data = random_bytes(40 * 64 * KIB, 7);
        let b = block(40, 1, 0);
        let mut c = Client::connect(n1.addr()).await;
        assert_eq!(
            c.op(write_op(b, BlockStage::Create, vec![n2.id()]))
                .await
                .status,
            Status::Success
        );
        let seq = send_data(&mut c, &data, 0, 0).await;
        expect_acks(&mut c, seq as usize, 2).await;
        assert_eq!(
            info(n2.addr(), b).await.bytes_on_disk,
            0,
            "n2 (last) holds it in memory"
        );
        drop(c); // the client dies
        let m2 = n2.dn().metrics();
        wait_for(Duration::from_secs(20), "n2's writer ends", || {
            m2.buffered_replicas.get() == 0
        })
        .await;
        assert_eq!(
            file_len(&n2.dirs, 40),
            data.len() as u64,
            "every packet n2 received"
        );
        assert_eq!(std::fs::read(block_file(&n2.dirs, 40)).unwrap(), data);
        assert_eq!(info(n2.addr(), b).await.bytes_on_disk, data.len() as u64);

        // A graceful stop flushes too; the restarted node finds the bytes.
        let mut n3 = node_with(meta, 1, no_idle).await;
        let b = block(41, 1, 0);
        let mut c = Client::connect(n3.addr()).await;
        assert_eq!(
            c.op(write_op(b, BlockStage::Create, vec![])).await.status,
            Status::Success
        );
        let seq = send_data(&mut c, &data[..MIB], 0, 0).await;
        expect_acks(&mut c, seq as usize, 1).await;
        let dirs = n3.dirs.clone();
        let tmp = n3._tmp.take();
        n3.stop().await;
        assert_eq!(file_len(&dirs, 41), MIB as u64);
        let n3 = Node::start_on(
            meta,
            dirs.clone(),
            Some({
                let mut cfg = config(meta, &dirs);
                no_idle(&mut cfg);
                cfg
            }),
        )
        .await;
        let r = info(n3.addr(), b).await;
        assert_eq!((r.state, r.bytes_on_disk), (ReplicaState::Rwr, MIB as u64));
        drop(tmp);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_buffered_node_keeps_only_what_it_flushed() {
    within(60, async {
        let (meta, _) = fake_meta().await;
        let mut n = node_with(meta, 1, |c| {
            no_idle(c);
            c.write_buffer_size = ByteSize::mib(1);
        })
        .await;
        let data = random_bytes(MIB + 128 * KIB, 8);
        let b = block(50, 1, 0);
        let mut c = Client::connect(n.addr()).await;
        assert_eq!(
            c.op(write_op(b, BlockStage::Create, vec![])).await.status,
            Status::Success
        );
        let seq = send_data(&mut c, &data, 0, 0).await;
        expect_acks(&mut c, seq as usize, 1).await;
        let tmp = n._tmp.take();
        n.dn.take().unwrap().kill();
        // The trade-off of batching: acknowledged bytes still in memory die with the process.
        // With last-replica-only the other replicas of the pipeline wrote them directly.
        let n = Node::start_on(meta, n.dirs.clone(), None).await;
        let r = info(n.addr(), b).await;
        assert_eq!(
            (r.state, r.bytes_on_disk),
            (ReplicaState::Rwr, MIB as u64),
            "the one full-buffer flush"
        );
        drop(tmp);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o_direct_flushes_read_back_exact() {
    within(60, async {
        let (meta, _) = fake_meta().await;
        let n = node_with(meta, 1, |c| {
            no_idle(c);
            c.write_buffer_size = ByteSize::mib(1);
            c.write_o_direct = true;
        })
        .await;
        let data = random_bytes(2 * MIB + 333, 9);
        let b = block(60, 1, 0);
        let mut c = Client::connect(n.addr()).await;
        assert_eq!(
            c.op(write_op(b, BlockStage::Create, vec![])).await.status,
            Status::Success
        );
        c.packet(0, 0, &data[..700], false, true).await; // an unaligned hsync first
        expect_acks(&mut c, 1, 1).await;
        let seq = send_data(&mut c, &data, 512, 1).await;
        c.packet(seq, data.len() as u64, &[], true, false).await;
        expect_acks(&mut c, seq as usize, 1).await;
        let (_, got) = read_block(n.addr(), b, 0, u64::MAX).await;
        assert!(got == data, "O_DIRECT round trip");
        let (blk, meta_file) = finalized_files(&n.dirs, 60).unwrap();
        assert_valid_files(&blk, &meta_file, &data);
        assert!(
            n.dn().metrics().direct_io_bytes.get() >= MIB as u64,
            "aligned middles went O_DIRECT"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_longer_than_the_threshold_drop_the_pages_behind_them() {
    within(60, async {
        let (meta, _) = fake_meta().await;
        let n = node_with(meta, 1, |c| c.write_buffer_enabled = false).await;
        let m = n.dn().metrics();
        let big = random_bytes(MIB, 10);
        write_block(n.addr(), vec![], block(70, 1, 0), &big).await;
        let small = random_bytes(100 * KIB, 11);
        write_block(n.addr(), vec![], block(71, 1, 0), &small).await;
        let (_, got) = read_block(n.addr(), block(71, 1, 0), 0, u64::MAX).await;
        assert!(got == small);
        assert_eq!(
            m.dropbehind_bytes.get(),
            0,
            "100 KiB < 256 KiB threshold: pages kept"
        );
        let (_, got) = read_block(n.addr(), block(70, 1, 0), 0, u64::MAX).await;
        assert!(got == big);
        assert!(
            m.dropbehind_bytes.get() > 0,
            "1 MiB > 256 KiB: pages dropped behind"
        );
    })
    .await
}

#[test]
fn every_batching_setting_comes_from_the_environment() {
    let env: Vec<(String, String)> = [
        ("SLUICE_DATANODE__WRITE__MEMORY__BUFFER__ENABLED", "false"),
        (
            "SLUICE_DATANODE__WRITE__MEMORY__BUFFER__LAST_REPLICA_ONLY",
            "false",
        ),
        (
            "SLUICE_DATANODE__WRITE__MEMORY__BUFFER__MAX__CAPACITY__MB",
            "64",
        ),
        ("SLUICE_DATANODE__WRITE__MEMORY__BUFFER__MIN__VOLUMES", "2"),
        ("SLUICE_DATANODE__WRITE__BUFFER__SIZE__BYTES", "4MiB"),
        (
            "SLUICE_DATANODE__WRITE__BUFFER__IDLE__FLUSH__TIMEOUT__MS",
            "750",
        ),
        ("SLUICE_DATANODE__CONCURRENT__FLUSH__MB__PER__VOLUME", "8"),
        (
            "SLUICE_DATANODE__READ__AHEAD__CACHE__BYTES__THRESHOLD",
            "1MiB",
        ),
        ("SLUICE_DATANODE__WRITE__O__DIRECT__ENABLED", "true"),
        ("SLUICE_DATANODE__WRITE__BUFFER__DROP__BEHIND", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let cfg = SluiceConfig::load_with_env(None, env).unwrap().datanode;
    assert_eq!(cfg.read_ahead_cache_threshold, ByteSize::mib(1));
    let s = BufferSettings::from_config(&cfg);
    assert_eq!(
        s,
        BufferSettings {
            enabled: false,
            last_replica_only: false,
            min_volumes: 2,
            buffer_size: 4 * MIB,
            idle_flush: Duration::from_millis(750),
            permits: Some(16),
            flushes_per_volume: Some(2),
            o_direct: true,
            drop_behind: false,
        }
    );
}
