//! Metadata-side repair end to end: re-replication after a DataNode death
//! (rate-limited), excess replicas when it comes back, corrupt replicas found by a reader or by
//! the block scanner, and lease recovery of abandoned files (hard limit, `recover_lease`, an
//! empty last block, Rwr replicas after restarts, a failed location). Every test reads the data
//! back and ends with `fsck` HEALTHY.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_client::{ClientError, ConnectOptions, FileSystem, WriteOptions};
use sluice_common::config::{ByteSize, HumanDuration};
use sluice_common::rpc::{self, CreateOptions, Health, NodeState};
use sluice_common::MetaError;
use sluice_tests::raw::RawConn;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, write_all, MiniCluster};
use std::collections::HashSet;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(150);
const WAIT: Duration = Duration::from_secs(60);
const BLOCK: u64 = 64 * 1024;

/// `n` DataNodes, replication 3, 64 KiB blocks, stale after 2 s and dead after 4 s.
fn builder(n: usize) -> sluice_tests::MiniClusterBuilder {
    sluice_tests::init_logging();
    MiniCluster::builder()
        .datanodes(n)
        .block_size(BLOCK)
        .liveness(Duration::from_secs(2), Duration::from_secs(4))
}

fn opts() -> WriteOptions {
    WriteOptions {
        create_parent: true,
        ..WriteOptions::default()
    }
}

async fn health(fs: &FileSystem, path: &str) -> Health {
    fs.fsck(path).await.unwrap().health
}

async fn wait_health(fs: &FileSystem, path: &str, want: Health) {
    let what = format!("fsck {path} {want:?}");
    wait_until(WAIT, &what, || async { health(fs, path).await == want }).await;
}

/// Waits until the metadata service sees `n` DataNodes dead.
async fn wait_dead(fs: &FileSystem, n: usize) {
    wait_until(WAIT, "DataNodes declared dead", || async {
        let r = fs.cluster_report().await.unwrap();
        r.datanodes
            .iter()
            .filter(|d| d.state == NodeState::Dead)
            .count()
            == n
    })
    .await;
}

/// Every block of `path` has 3 locations on distinct DataNodes, none in `not_on`, each
/// streaming back exactly the file's bytes with valid checksums, and exactly 3 block files
/// exist on the running DataNodes' disks. The file reads back whole.
async fn check_replicas(cluster: &MiniCluster, path: &str, data: &[u8], not_on: &[usize]) {
    let fs = cluster.client().await.unwrap();
    let located = fs.get_block_locations(path).await.unwrap();
    assert!(!located.under_construction, "{path} still open");
    let mut covered = 0u64;
    for lb in &located.blocks {
        let nodes: HashSet<_> = lb.locations.iter().map(|d| d.node_id.clone()).collect();
        assert_eq!(nodes.len(), 3, "{}: {:?}", lb.block, lb.locations);
        let want = &data[lb.offset as usize..(lb.offset + lb.block.num_bytes) as usize];
        for dn in &lb.locations {
            let i = cluster.datanode_index_by_addr(&dn.data_addr).unwrap();
            assert!(
                !not_on.contains(&i),
                "{} still located on DataNode {i}",
                lb.block
            );
            let mut conn = RawConn::connect(&dn.data_addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            let (bytes, info) = conn.read_replica(lb.block).await.unwrap();
            assert_eq!(info.block.gen_stamp, lb.block.gen_stamp);
            assert!(
                bytes == want,
                "replica bytes of {} on DataNode {i}",
                lb.block
            );
        }
        let files: usize = (0..cluster.datanode_count())
            .filter(|i| cluster.datanode(*i).is_some())
            .map(|i| cluster.replica_files(i, lb.block.id.0).len())
            .sum();
        assert_eq!(files, 3, "block files of {} on running DataNodes", lb.block);
        covered += lb.block.num_bytes;
    }
    assert_eq!(covered, data.len() as u64);
    assert!(
        read_all(&fs, path).await.unwrap() == data,
        "{path} reads back"
    );
}

/// Flips one byte in the middle of DataNode `i`'s block file of the file's first block.
async fn corrupt_first_block(cluster: &MiniCluster, fs: &FileSystem, path: &str, i: usize) {
    let lb = &fs.get_block_locations(path).await.unwrap().blocks[0];
    let files = cluster.replica_files(i, lb.block.id.0);
    assert_eq!(files.len(), 1, "DataNode {i} holds {}", lb.block);
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x5a;
    std::fs::write(&files[0], &bytes).unwrap();
}

/// `GET /metrics` of the metadata service: the value of `name`.
async fn metadata_metric(cluster: &MiniCluster, name: &str) -> u64 {
    let addr = cluster.metadata_http_addr().unwrap();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_replication_after_a_death_then_excess_deleted_when_it_returns() {
    with_timeout(LIMIT, "re-replication and excess", async {
        let mut cluster = builder(5).start().await.unwrap();
        let fs = cluster.client().await.unwrap();
        // Two spares are away while the file is written: every block lands on 0, 1 and 2.
        cluster.stop_datanode(3).await;
        cluster.stop_datanode(4).await;
        wait_dead(&fs, 2).await;
        let data = random_bytes(3 * BLOCK as usize + 12_345, 1);
        write_all(&fs, "/rr/f", &data, opts(), 10_000)
            .await
            .unwrap();
        assert_eq!(health(&fs, "/rr/f").await, Health::Healthy);
        cluster.kill_datanode(0);
        // No spare yet: the blocks stay under-replicated (and readable).
        wait_health(&fs, "/rr/f", Health::UnderReplicated).await;
        assert!(read_all(&fs, "/rr/f").await.unwrap() == data);
        cluster.start_datanode(3).await.unwrap();
        cluster.start_datanode(4).await.unwrap();
        wait_health(&fs, "/rr/f", Health::Healthy).await;
        check_replicas(&cluster, "/rr/f", &data, &[0]).await;
        let mut copies = 0;
        for i in 1..5 {
            let m = cluster.datanode(i).unwrap().metrics();
            assert!(
                m.replication_transfers_peak.get() <= 2,
                "max-streams on DataNode {i}"
            );
            copies += m.replication_transfers.get();
        }
        assert!(copies >= 4, "one copy per block at least, got {copies}");
        // The dead DataNode comes back with its old replicas: the excess copies go.
        cluster.start_datanode(0).await.unwrap();
        wait_until(WAIT, "excess replicas deleted", || async {
            metadata_metric(&cluster, "sluice_metadata_excess_replicas_deleted_total").await >= 4
        })
        .await;
        let located = fs.get_block_locations("/rr/f").await.unwrap();
        wait_until(WAIT, "3 block files per block on disk", || async {
            located.blocks.iter().all(|lb| {
                (0..5)
                    .map(|i| cluster.replica_files(i, lb.block.id.0).len())
                    .sum::<usize>()
                    == 3
            })
        })
        .await;
        wait_health(&fs, "/rr/f", Health::Healthy).await;
        check_replicas(&cluster, "/rr/f", &data, &[]).await;
        cluster.shutdown().await;
    })
    .await
}

/// Fewer live DataNodes than the replication factor (3 DataNodes, one dead): new blocks start
/// on the two there are, as HDFS does (at least `replication.min`), the file closes
/// under-replicated, and repair brings it to 3 when the DataNode returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_on_with_fewer_datanodes_than_the_factor_and_are_repaired_later() {
    with_timeout(LIMIT, "fewer DataNodes than the factor", async {
        let mut cluster = builder(3).start().await.unwrap();
        let fs = cluster.client().await.unwrap();
        cluster.stop_datanode(2).await;
        wait_dead(&fs, 1).await;
        let data = random_bytes(2 * BLOCK as usize + 777, 7);
        write_all(&fs, "/few/f", &data, opts(), 10_000)
            .await
            .unwrap();
        let located = fs.get_block_locations("/few/f").await.unwrap();
        assert_eq!(located.blocks.len(), 3);
        for lb in &located.blocks {
            assert_eq!(lb.locations.len(), 2, "{}: {:?}", lb.block, lb.locations);
        }
        assert_eq!(health(&fs, "/few/f").await, Health::UnderReplicated);
        assert!(read_all(&fs, "/few/f").await.unwrap() == data);
        cluster.start_datanode(2).await.unwrap();
        wait_health(&fs, "/few/f", Health::Healthy).await;
        check_replicas(&cluster, "/few/f", &data, &[]).await;
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_replication_honours_max_streams_per_source() {
    with_timeout(LIMIT, "rate limit", async {
        let mut cluster = builder(5)
            .configure_metadata(|m| {
                m.replication_max_streams = 1;
                m.replication_work_multiplier = 1;
            })
            .start()
            .await
            .unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(16 * BLOCK as usize, 2);
        write_all(&fs, "/rate/f", &data, opts(), 64 * 1024)
            .await
            .unwrap();
        let located = fs.get_block_locations("/rate/f").await.unwrap();
        let victim = cluster.datanode(0).unwrap().node_id().clone();
        let lost = located
            .blocks
            .iter()
            .filter(|lb| lb.locations.iter().any(|d| d.node_id == victim))
            .count() as u64;
        assert!(lost > 0);
        cluster.kill_datanode(0);
        wait_dead(&fs, 1).await;
        wait_health(&fs, "/rate/f", Health::Healthy).await;
        let mut copies = 0;
        for i in 1..5 {
            let m = cluster.datanode(i).unwrap().metrics();
            assert!(
                m.replication_transfers_peak.get() <= 1,
                "DataNode {i} ran {} copies at once",
                m.replication_transfers_peak.get()
            );
            copies += m.replication_transfers.get();
        }
        assert!(copies >= lost, "{copies} copies for {lost} lost replicas");
        assert!(
            metadata_metric(&cluster, "sluice_metadata_replications_scheduled_total").await >= lost
        );
        check_replicas(&cluster, "/rate/f", &data, &[0]).await;
        cluster.shutdown().await;
    })
    .await
}

/// A 4-DataNode cluster whose spare (3) is away while `/c/f` (one block) is written on 0-2.
async fn corrupt_setup(scanner: bool) -> (MiniCluster, FileSystem, Vec<u8>) {
    let mut cluster = builder(4)
        .configure_datanodes(move |_, c| {
            if scanner {
                c.block_scanner_interval = HumanDuration::millis(500);
                c.block_scanner_bytes_per_second = ByteSize::mib(64);
            }
        })
        .start()
        .await
        .unwrap();
    let fs = cluster.client().await.unwrap();
    cluster.stop_datanode(3).await;
    wait_dead(&fs, 1).await;
    let data = random_bytes(50_000, 3);
    write_all(&fs, "/c/f", &data, opts(), 8_000).await.unwrap();
    (cluster, fs, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_replica_found_by_a_reader_is_replaced_and_deleted() {
    with_timeout(LIMIT, "corrupt replica, reader", async {
        let (mut cluster, fs, data) = corrupt_setup(false).await;
        corrupt_first_block(&cluster, &fs, "/c/f", 1).await;
        // Readers get good bytes; the one that hits the bad replica reports it.
        for _ in 0..60 {
            assert!(read_all(&fs, "/c/f").await.unwrap() == data, "read back");
            if health(&fs, "/c/f").await == Health::Corrupt {
                break;
            }
        }
        let fsck = fs.fsck("/c/f").await.unwrap();
        assert_eq!(fsck.health, Health::Corrupt, "{fsck:?}");
        let bad = &fsck.files[0].blocks[0].corrupt_locations;
        assert_eq!(bad.len(), 1);
        assert_eq!(cluster.datanode_index_by_addr(&bad[0].data_addr), Some(1));
        // No spare: it stays so (and is never the source of a copy).
        cluster.start_datanode(3).await.unwrap();
        wait_health(&fs, "/c/f", Health::Healthy).await;
        let id = fs.get_block_locations("/c/f").await.unwrap().blocks[0]
            .block
            .id
            .0;
        wait_until(WAIT, "the corrupt file deleted", || async {
            cluster.replica_files(1, id).is_empty()
        })
        .await;
        check_replicas(&cluster, "/c/f", &data, &[1]).await;
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_replica_found_by_the_block_scanner_is_replaced_and_deleted() {
    with_timeout(LIMIT, "corrupt replica, scanner", async {
        let (mut cluster, fs, data) = corrupt_setup(true).await;
        corrupt_first_block(&cluster, &fs, "/c/f", 2).await;
        // Nobody reads: the scanner finds it.
        wait_health(&fs, "/c/f", Health::Corrupt).await;
        assert!(
            cluster
                .datanode(2)
                .unwrap()
                .metrics()
                .scanner_corrupt_replicas
                .get()
                >= 1
        );
        cluster.start_datanode(3).await.unwrap();
        wait_health(&fs, "/c/f", Health::Healthy).await;
        let id = fs.get_block_locations("/c/f").await.unwrap().blocks[0]
            .block
            .id
            .0;
        wait_until(WAIT, "the corrupt file deleted", || async {
            cluster.replica_files(2, id).is_empty()
        })
        .await;
        assert!(
            metadata_metric(&cluster, "sluice_metadata_corrupt_replicas_deleted_total").await >= 1
        );
        check_replicas(&cluster, "/c/f", &data, &[2]).await;
        cluster.shutdown().await;
    })
    .await
}

/// Lease limits for the lease tests: soft 2 s, hard `hard` s; a block recovery attempt is
/// retried after 3 s.
fn lease_builder(n: usize, hard: u64) -> sluice_tests::MiniClusterBuilder {
    builder(n).configure_metadata(move |m| {
        m.lease_soft_limit = HumanDuration::secs(2);
        m.lease_hard_limit = HumanDuration::secs(hard);
        m.block_recovery_timeout = HumanDuration::secs(3);
    })
}

/// A client whose writers renew their lease every `every`.
async fn client_renewing(cluster: &MiniCluster, every: Duration) -> FileSystem {
    let opts = ConnectOptions {
        lease_renew_interval: every,
    };
    FileSystem::connect_with(cluster.client_config(), opts)
        .await
        .unwrap()
}

fn is_lease_conflict(e: &ClientError) -> bool {
    matches!(e, ClientError::Meta(MetaError::LeaseConflict { .. }))
}

async fn wait_closed(fs: &FileSystem, path: &str) {
    wait_until(WAIT, "the file closed by lease recovery", || async {
        !fs.stat(path).await.unwrap().under_construction
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_file_is_closed_at_its_hflushed_length_after_the_hard_limit() {
    with_timeout(LIMIT, "lease recovery, hard limit", async {
        let cluster = lease_builder(5, 4).start().await.unwrap();
        // The writer never renews: it "disappears" after its hflush.
        let gone = client_renewing(&cluster, Duration::from_secs(3600)).await;
        let data = random_bytes(2 * BLOCK as usize + 20_000, 4);
        let mut w = gone.create("/lease/f", opts()).await.unwrap();
        w.write_all(&data).await.unwrap();
        w.hflush().await.unwrap();
        // Meanwhile another writer is told the file is being created.
        let other = cluster.client().await.unwrap();
        let err = other.create("/lease/f", opts()).await.unwrap_err();
        assert!(is_lease_conflict(&err), "{err}");
        wait_closed(&other, "/lease/f").await;
        let st = other.stat("/lease/f").await.unwrap();
        assert_eq!(st.length, data.len() as u64, "exactly the hflushed bytes");
        assert!(read_all(&other, "/lease/f").await.unwrap() == data);
        // The old writer cannot go on.
        let more = w.write_all(b"late bytes").await;
        let closed = w.close().await;
        assert!(
            more.is_err() || closed.is_err(),
            "the old writer's close fails"
        );
        wait_health(&other, "/lease/f", Health::Healthy).await;
        check_replicas(&cluster, "/lease/f", &data, &[]).await;
        assert!(metadata_metric(&cluster, "sluice_metadata_leases_recovered_total").await >= 1);
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_lease_closes_a_file_whose_writer_is_still_there() {
    with_timeout(LIMIT, "recover_lease", async {
        let cluster = lease_builder(4, 60).start().await.unwrap();
        let writer = client_renewing(&cluster, Duration::from_millis(300)).await;
        let data = random_bytes(BLOCK as usize + 777, 5);
        let mut w = writer.create("/lease/r", opts()).await.unwrap();
        w.write_all(&data).await.unwrap();
        w.hflush().await.unwrap();
        let admin = cluster.client().await.unwrap();
        let mut first = true;
        wait_until(WAIT, "recover_lease returns true", || {
            let admin = admin.clone();
            let was_first = std::mem::replace(&mut first, false);
            async move {
                let done = admin.recover_lease("/lease/r").await.unwrap();
                assert!(!(was_first && done), "the first call starts recovery");
                done
            }
        })
        .await;
        let st = admin.stat("/lease/r").await.unwrap();
        assert_eq!(
            (st.length, st.under_construction),
            (data.len() as u64, false)
        );
        assert!(
            admin.recover_lease("/lease/r").await.unwrap(),
            "closed: true at once"
        );
        let more = w.write_all(&[1u8; 70_000]).await;
        let closed = w.close().await;
        assert!(
            more.is_err() || closed.is_err(),
            "the old writer's close fails"
        );
        assert!(read_all(&admin, "/lease/r").await.unwrap() == data);
        wait_health(&admin, "/lease/r", Health::Healthy).await;
        check_replicas(&cluster, "/lease/r", &data, &[]).await;
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_last_block_is_removed_by_lease_recovery() {
    with_timeout(LIMIT, "empty last block", async {
        let cluster = lease_builder(4, 60).start().await.unwrap();
        // A writer that got a block and a pipeline, then vanished before sending a byte.
        let raw = rpc::connect_client_protocol(cluster.metadata_addr())
            .await
            .unwrap();
        let ctx = || rpc::context_with_timeout(Duration::from_secs(10));
        let create = CreateOptions {
            client_name: "vanished".into(),
            overwrite: false,
            create_parent: true,
            replication: 0,
            block_size: 0,
        };
        raw.create(ctx(), "/lease/empty".into(), create)
            .await
            .unwrap()
            .unwrap();
        let lb = raw
            .add_block(
                ctx(),
                "/lease/empty".into(),
                "vanished".into(),
                None,
                vec![],
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lb.locations.len(), 3);
        let fs = cluster.client().await.unwrap();
        wait_until(WAIT, "recover_lease returns true", || async {
            fs.recover_lease("/lease/empty").await.unwrap()
        })
        .await;
        let st = fs.stat("/lease/empty").await.unwrap();
        assert_eq!(
            (st.length, st.block_count, st.under_construction),
            (0, 0, false)
        );
        assert!(read_all(&fs, "/lease/empty").await.unwrap().is_empty());
        assert_eq!(health(&fs, "/lease/empty").await, Health::Healthy);
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwr_replicas_left_by_restarts_are_recovered() {
    with_timeout(LIMIT, "Rwr recovery", async {
        let mut cluster = lease_builder(4, 60).start().await.unwrap();
        let writer = cluster.client().await.unwrap();
        let data = random_bytes(BLOCK as usize + 30_001, 6);
        let mut w = writer.create("/lease/rwr", opts()).await.unwrap();
        w.write_all(&data).await.unwrap();
        w.hflush().await.unwrap();
        let located = writer.get_block_locations("/lease/rwr").await.unwrap();
        let last = located.blocks.last().unwrap().clone();
        // The writer dies; then every DataNode of the last block restarts mid-write.
        drop(w);
        drop(writer);
        let pipeline: Vec<usize> = last
            .locations
            .iter()
            .map(|d| cluster.datanode_index_by_addr(&d.data_addr).unwrap())
            .collect();
        for &i in &pipeline {
            cluster.restart_datanode(i).await.unwrap();
        }
        for d in &last.locations {
            let mut conn = RawConn::connect(&d.data_addr)
                .await
                .unwrap()
                .with_token(last.token.clone());
            let info = conn
                .replica_info(last.block)
                .await
                .unwrap()
                .replica
                .unwrap();
            assert_eq!(
                info.state,
                sluice_common::proto::ReplicaState::Rwr,
                "on {d}"
            );
        }
        let fs = cluster.client().await.unwrap();
        cluster.wait_live(4).await.unwrap();
        wait_until(WAIT, "recover_lease returns true", || async {
            fs.recover_lease("/lease/rwr").await.unwrap()
        })
        .await;
        assert_eq!(
            fs.stat("/lease/rwr").await.unwrap().length,
            data.len() as u64
        );
        assert!(read_all(&fs, "/lease/rwr").await.unwrap() == data);
        wait_health(&fs, "/lease/rwr", Health::Healthy).await;
        check_replicas(&cluster, "/lease/rwr", &data, &[]).await;
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_goes_on_without_a_dead_location_or_primary() {
    with_timeout(LIMIT, "recovery with a failed DataNode", async {
        // The dead DataNode stays "live" for the metadata service for a minute: it may be
        // picked as primary, and that attempt times out.
        let mut cluster = lease_builder(5, 60)
            .liveness(Duration::from_secs(30), Duration::from_secs(60))
            .start()
            .await
            .unwrap();
        let writer = cluster.client().await.unwrap();
        let data = random_bytes(40_000, 7);
        let mut w = writer.create("/lease/dead", opts()).await.unwrap();
        w.write_all(&data).await.unwrap();
        w.hflush().await.unwrap();
        let lb = writer
            .get_block_locations("/lease/dead")
            .await
            .unwrap()
            .blocks[0]
            .clone();
        drop(w);
        drop(writer);
        let victim = cluster
            .datanode_index_by_addr(&lb.locations[1].data_addr)
            .unwrap();
        cluster.kill_datanode(victim);
        let fs = cluster.client().await.unwrap();
        wait_until(WAIT, "recover_lease returns true", || async {
            fs.recover_lease("/lease/dead").await.unwrap()
        })
        .await;
        assert_eq!(
            fs.stat("/lease/dead").await.unwrap().length,
            data.len() as u64
        );
        assert!(read_all(&fs, "/lease/dead").await.unwrap() == data);
        wait_health(&fs, "/lease/dead", Health::Healthy).await;
        check_replicas(&cluster, "/lease/dead", &data, &[victim]).await;
        cluster.shutdown().await;
    })
    .await
}

/// Re-replication throughput after a death at several `max-streams`, the block scanner's
/// rate, and how long lease recovery takes after the hard limit. Figures in docs/recovery.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: cargo test -p sluice-tests --release --test it -- repair:: --ignored --nocapture"]
async fn measure_repair() {
    for streams in [1u32, 2, 4] {
        measure_re_replication(streams).await;
    }
    measure_scanner().await;
    measure_lease_recovery().await;
}

const MIB: usize = 1024 * 1024;

async fn measure_re_replication(streams: u32) {
    let mut cluster = builder(5)
        .block_size(MIB as u64)
        .configure_metadata(move |m| m.replication_max_streams = streams)
        .start()
        .await
        .unwrap();
    let fs = cluster.client().await.unwrap();
    let data = random_bytes(48 * MIB, 8);
    write_all(&fs, "/m/f", &data, opts(), MIB).await.unwrap();
    let victim = cluster.datanode(0).unwrap().node_id().clone();
    let located = fs.get_block_locations("/m/f").await.unwrap();
    let lost = located
        .blocks
        .iter()
        .filter(|lb| lb.locations.iter().any(|d| d.node_id == victim))
        .count();
    cluster.kill_datanode(0);
    wait_dead(&fs, 1).await;
    let t0 = std::time::Instant::now();
    wait_health(&fs, "/m/f", Health::Healthy).await;
    let took = t0.elapsed().as_secs_f64();
    let peak = (1..5)
        .map(|i| {
            let m = cluster.datanode(i).unwrap().metrics();
            m.replication_transfers_peak.get()
        })
        .max()
        .unwrap();
    eprintln!(
        "max-streams {streams}: {lost} blocks of 1 MiB re-replicated in {took:.2} s ({:.1} MiB/s), peak {peak} copies on one DataNode",
        lost as f64 / took
    );
    cluster.shutdown().await;
}

async fn measure_scanner() {
    let cluster = builder(3)
        .block_size(MIB as u64)
        .configure_datanodes(|_, c| {
            c.block_scanner_interval = HumanDuration::secs(2);
            c.block_scanner_bytes_per_second = ByteSize::mib(8);
        })
        .start()
        .await
        .unwrap();
    let fs = cluster.client().await.unwrap();
    let total = 32 * MIB as u64;
    write_all(&fs, "/m/s", &random_bytes(total as usize, 10), opts(), MIB)
        .await
        .unwrap();
    let m = cluster.datanode(0).unwrap().metrics();
    wait_until(WAIT, "the scanner starts a pass", || async {
        m.scanner_bytes_verified.get() > 0
    })
    .await;
    let (t0, b0) = (std::time::Instant::now(), m.scanner_bytes_verified.get());
    wait_until(WAIT, "the scanner verifies everything", || async {
        m.scanner_bytes_verified.get() >= total
    })
    .await;
    let rate = (m.scanner_bytes_verified.get() - b0) as f64 / t0.elapsed().as_secs_f64();
    eprintln!(
        "block scanner: {:.2} MiB/s verified with block.scanner.bytes.per.second = 8MiB",
        rate / MIB as f64
    );
    cluster.shutdown().await;
}

async fn measure_lease_recovery() {
    let cluster = lease_builder(5, 2).start().await.unwrap();
    let gone = client_renewing(&cluster, Duration::from_secs(3600)).await;
    let t0 = std::time::Instant::now();
    let mut w = gone.create("/m/lease", opts()).await.unwrap();
    w.write_all(&random_bytes(3 * BLOCK as usize / 2, 9))
        .await
        .unwrap();
    w.hflush().await.unwrap();
    let fs = cluster.client().await.unwrap();
    wait_closed(&fs, "/m/lease").await;
    eprintln!(
        "lease recovery: file closed {:.2} s after its create, the last lease renewal (hard limit 2 s)",
        t0.elapsed().as_secs_f64()
    );
    cluster.shutdown().await;
}
