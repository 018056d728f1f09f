//! Write-side pipeline recovery end to end: DataNodes killed, restarted,
//! stalled, cut off or fed corrupt packets in the middle of a write, in a MiniCluster of 5
//! DataNodes (replication 3) unless a test says otherwise. Every test reads the file back and
//! compares bytes, and checks the replicas of each block (distinct DataNodes, the bytes and the
//! generation stamp the metadata service records).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_client::{
    ClientError, FileSystem, FileWriter, PipelineFailure, ReplaceFailure, WriteOptions,
};
use sluice_common::config::{ByteSize, HumanDuration, ReplacePolicy};
use sluice_common::rpc::{Health, LocatedBlock};
use sluice_common::{DatanodeId, Status};
use sluice_tests::proxy::{Fault, Link, LinkFaults};
use sluice_tests::raw::RawConn;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, MiniCluster};
use std::collections::HashSet;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const LIMIT: Duration = Duration::from_secs(150);
const WAIT: Duration = Duration::from_secs(60);
const BLOCK: u64 = 1024 * 1024;

/// 5 DataNodes behind link proxies, replication 3, 1 MiB blocks, stale after 2 s, dead after
/// 4 s, and a re-replication whose copy did not arrive rescheduled after 3 s (a copy aimed at
/// a DataNode that was just killed fails): re-replication repairs what recovery left short.
/// Packets of 64 KiB (HDFS's size; the default is 256 KiB): the scenarios fail DataNodes
/// after the first packets of a few hundred KB were sent.
fn builder() -> sluice_tests::MiniClusterBuilder {
    sluice_tests::init_logging();
    MiniCluster::builder()
        .datanodes(5)
        .block_size(BLOCK)
        .configure_client(|c| c.write_packet_size = ByteSize::kib(64))
        .liveness(Duration::from_secs(2), Duration::from_secs(4))
        .configure_metadata(|m| m.replication_pending_timeout = HumanDuration::secs(3))
        .link_proxies(true)
}

fn opts() -> WriteOptions {
    WriteOptions {
        create_parent: true,
        ..WriteOptions::default()
    }
}

/// The writer's pipeline once its first block is set up.
async fn pipeline_of(w: &FileWriter) -> Vec<DatanodeId> {
    wait_until(WAIT, "the pipeline is set up", || async {
        !w.pipeline().is_empty()
    })
    .await;
    w.pipeline()
}

/// Waits until the writer has gone through `n` pipeline recoveries.
async fn wait_recovered(w: &FileWriter, n: u64) {
    let what = format!("{n} pipeline recoveries");
    wait_until(WAIT, &what, || async { w.pipeline_recoveries() >= n }).await;
}

/// The rack of DataNode `i` when DataNode 0 sits alone on its rack, so the rack policy puts
/// it in every pipeline.
fn rack_of(i: usize) -> String {
    if i == 0 { "/r1" } else { "/r2" }.into()
}

/// Applies `fault` to every link into DataNode 0: from the client and from DataNodes 1-4.
fn fault_into_datanode0(faults: &LinkFaults, fault: Fault) {
    faults.set(Link::client_to(0), fault.clone());
    for j in 1..5 {
        faults.set(Link::between(j, 0), fault.clone());
    }
}

/// No block of `blocks` is located on DataNode 0.
fn assert_none_on_datanode0(cluster: &MiniCluster, blocks: &[LocatedBlock]) {
    let dn0 = cluster.datanode(0).unwrap().node_id().clone();
    for lb in blocks {
        assert!(
            lb.locations.iter().all(|d| d.node_id != dn0),
            "{:?}",
            lb.locations
        );
    }
}

fn index_of(cluster: &MiniCluster, dn: &DatanodeId) -> usize {
    cluster
        .datanode_index_by_id(&dn.node_id)
        .unwrap_or_else(|| panic!("{dn} is not a cluster DataNode"))
}

/// Reads the file back (exact bytes), then checks every block: its replicas sit on distinct
/// DataNodes, each streams back the block's bytes with valid checksums and carries the
/// generation stamp and length the metadata service records. Returns the located blocks.
async fn check_file(fs: &FileSystem, path: &str, data: &[u8]) -> Vec<LocatedBlock> {
    let back = read_all(fs, path).await.unwrap();
    assert!(
        back == data,
        "{path}: read {} bytes, wrote {}",
        back.len(),
        data.len()
    );
    let located = fs.get_block_locations(path).await.unwrap();
    assert!(!located.under_construction, "{path} is still open");
    let mut covered = 0u64;
    for lb in &located.blocks {
        let nodes: HashSet<_> = lb.locations.iter().map(|d| &d.node_id).collect();
        assert_eq!(
            nodes.len(),
            lb.locations.len(),
            "{} on distinct nodes",
            lb.block
        );
        assert!(!lb.locations.is_empty(), "{} has no replica", lb.block);
        let want = &data[lb.offset as usize..(lb.offset + lb.block.num_bytes) as usize];
        for dn in &lb.locations {
            let mut conn = RawConn::connect(&dn.data_addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            let (bytes, info) = conn.read_replica(lb.block).await.unwrap();
            assert_eq!(info.block, lb.block, "replica of {} on {dn}", lb.block);
            assert!(
                bytes == want,
                "replica bytes of {} on {dn} differ",
                lb.block
            );
        }
        covered += lb.block.num_bytes;
    }
    assert_eq!(covered, data.len() as u64, "blocks cover {path}");
    located.blocks
}

async fn wait_healthy(fs: &FileSystem, path: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let report = fs.fsck(path).await.unwrap();
        if report.health == Health::Healthy {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "fsck {path} not HEALTHY within {WAIT:?}: {report:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `dn` holds no replica of `current`'s block under an older generation stamp: the
/// stale replica it kept from a failed pipeline was deleted (re-replication may since have put
/// a current copy there).
async fn wait_stale_replica_gone(dn: &DatanodeId, located: &LocatedBlock) {
    let current = located.block;
    let what = format!("the stale replica of {} on {dn} is deleted", current.id);
    wait_until(WAIT, &what, || async {
        let Ok(conn) = RawConn::connect(&dn.data_addr).await else {
            return false;
        };
        let mut conn = conn.with_token(located.token.clone());
        match conn.replica_info(current).await {
            Ok(r) if r.status == Status::ErrorNotFound => true,
            Ok(r) => r
                .replica
                .is_some_and(|info| info.block.gen_stamp >= current.gen_stamp),
            Err(_) => false,
        }
    })
    .await;
}

/// Writes 300 KB, kills the DataNode at `position` of the pipeline, writes the rest (2.5 MiB
/// in all, three blocks) and closes: the file is exact, the first block lives on the two
/// survivors under a newer generation stamp, the killed node's replica is deleted once it is
/// back, and re-replication brings the file to HEALTHY.
async fn kill_mid_stream(position: usize) {
    let mut cluster = builder().start().await.unwrap();
    let fs = cluster.client().await.unwrap();
    let data = random_bytes(5 * BLOCK as usize / 2, 10 + position as u64);
    let path = format!("/kill/{position}");
    let mut w = fs.create(&path, opts()).await.unwrap();
    w.write_all(&data[..300_000]).await.unwrap();
    let pipeline = pipeline_of(&w).await;
    assert_eq!(pipeline.len(), 3);
    let before = fs.get_block_locations(&path).await.unwrap().blocks[0].block;
    let victim = index_of(&cluster, &pipeline[position]);
    cluster.kill_datanode(victim);
    w.write_all(&data[300_000..900_000]).await.unwrap();
    // The recovery happens while packets stream, before any hflush (which would change the
    // DEFAULT policy's answer).
    wait_recovered(&w, 1).await;
    w.hflush().await.unwrap();
    assert_eq!(w.pipeline_recoveries(), 1, "one recovery");
    // DEFAULT policy, no hflush before the failure, two of three survive: no replacement.
    let rebuilt = w.pipeline();
    let survivors: Vec<_> = pipeline
        .iter()
        .filter(|d| **d != pipeline[position])
        .collect();
    assert_eq!(
        rebuilt.iter().collect::<Vec<_>>(),
        survivors,
        "the survivors, in order"
    );
    w.write_all(&data[900_000..]).await.unwrap();
    w.close().await.unwrap();
    assert_eq!(w.bytes_acked(), data.len() as u64);
    let blocks = check_file(&fs, &path, &data).await;
    let first = &blocks[0];
    assert_eq!(first.block.id, before.id);
    assert!(
        first.block.gen_stamp > before.gen_stamp,
        "new generation stamp"
    );
    assert!(
        first
            .locations
            .iter()
            .all(|d| d.node_id != pipeline[position].node_id),
        "the killed node holds no current replica"
    );
    for lb in &blocks[1..] {
        assert_eq!(lb.locations.len(), 3, "later blocks have full pipelines");
    }
    // The killed DataNode comes back with its old replica: the metadata service has it
    // deleted (older generation stamp), and re-replication restores the third copy.
    cluster.start_datanode(victim).await.unwrap();
    wait_stale_replica_gone(&pipeline[position], first).await;
    wait_healthy(&fs, &path).await;
    check_file(&fs, &path, &data).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_first_datanode_mid_stream_keeps_every_byte() {
    with_timeout(LIMIT, "kill first", kill_mid_stream(0)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_middle_datanode_mid_stream_keeps_every_byte() {
    with_timeout(LIMIT, "kill middle", kill_mid_stream(1)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_last_datanode_mid_stream_keeps_every_byte() {
    with_timeout(LIMIT, "kill last", kill_mid_stream(2)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_two_datanodes_at_once_recovers_on_the_third() {
    with_timeout(LIMIT, "kill middle and last", async {
        let mut cluster = builder().start().await.unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(700_000, 11);
        let mut w = fs.create("/two", opts()).await.unwrap();
        w.write_all(&data[..200_000]).await.unwrap();
        let pipeline = pipeline_of(&w).await;
        // The first survivor is restamped by a recovery attempt that then fails at the second
        // dead node; the next attempt must still accept it.
        for dn in &pipeline[1..] {
            cluster.kill_datanode(index_of(&cluster, dn));
        }
        w.write_all(&data[200_000..]).await.unwrap();
        w.close().await.unwrap();
        let blocks = check_file(&fs, "/two", &data).await;
        // Down to one DataNode, DEFAULT replaces: the pipeline was rebuilt to at least two.
        assert!(blocks[0].locations.len() >= 2, "{:?}", blocks[0].locations);
        assert!(blocks[0]
            .locations
            .iter()
            .any(|d| d.node_id == pipeline[0].node_id));
        wait_healthy(&fs, "/two").await;
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_datanode_after_hflush_brings_the_pipeline_back_to_three() {
    with_timeout(LIMIT, "kill after hflush", async {
        let mut cluster = builder().start().await.unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(600_000, 12);
        let mut w = fs.create("/hflushed", opts()).await.unwrap();
        w.write_all(&data[..250_000]).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        let victim = index_of(&cluster, &pipeline[1]);
        cluster.kill_datanode(victim);
        w.write_all(&data[250_000..]).await.unwrap();
        w.hflush().await.unwrap();
        // After the hflush the rebuilt pipeline already has three DataNodes again.
        let rebuilt = w.pipeline();
        assert_eq!(rebuilt.len(), 3, "{rebuilt:?}");
        assert!(rebuilt.iter().all(|d| d.node_id != pipeline[1].node_id));
        w.close().await.unwrap();
        assert_eq!(w.pipeline_recoveries(), 1);
        let blocks = check_file(&fs, "/hflushed", &data).await;
        let lb = &blocks[0];
        assert_eq!(
            lb.locations.len(),
            3,
            "replacement added: {:?}",
            lb.locations
        );
        let survivors: HashSet<_> = [&pipeline[0], &pipeline[2]]
            .iter()
            .map(|d| d.node_id.clone())
            .collect();
        let new_nodes: Vec<_> = lb
            .locations
            .iter()
            .filter(|d| !survivors.contains(&d.node_id))
            .collect();
        assert_eq!(new_nodes.len(), 1, "one replacement: {:?}", lb.locations);
        // On disk: one block file per holder, of the block's length.
        for dn in &lb.locations {
            let i = index_of(&cluster, dn);
            let files = cluster.replica_files(i, lb.block.id.0);
            assert_eq!(files.len(), 1, "{files:?}");
            let len = std::fs::metadata(&files[0]).unwrap().len();
            assert_eq!(len, lb.block.num_bytes, "block file on {dn}");
        }
        wait_healthy(&fs, "/hflushed").await;
        cluster.shutdown().await;
    })
    .await
}

/// Three DataNodes only (no spare).
fn no_spare() -> sluice_tests::MiniClusterBuilder {
    builder().datanodes(3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spare_and_default_policy_goes_on_with_two_without_hflush() {
    with_timeout(LIMIT, "no spare, no hflush", async {
        let mut cluster = no_spare().start().await.unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(500_000, 13);
        let mut w = fs.create("/nospare", opts()).await.unwrap();
        w.write_all(&data[..100_000]).await.unwrap();
        let pipeline = pipeline_of(&w).await;
        cluster.kill_datanode(index_of(&cluster, &pipeline[2]));
        w.write_all(&data[100_000..]).await.unwrap();
        wait_recovered(&w, 1).await;
        w.hflush().await.unwrap();
        assert_eq!(
            w.pipeline().len(),
            2,
            "no spare, and DEFAULT does not ask for one"
        );
        w.close().await.unwrap();
        let blocks = check_file(&fs, "/nospare", &data).await;
        assert_eq!(blocks[0].locations.len(), 2);
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spare_and_default_policy_after_hflush_fails_and_keeps_the_hflushed_bytes() {
    with_timeout(LIMIT, "no spare, hflushed", async {
        let mut cluster = no_spare().start().await.unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(500_000, 14);
        let mut w = fs.create("/nospare-h", opts()).await.unwrap();
        w.write_all(&data[..120_000]).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        cluster.kill_datanode(index_of(&cluster, &pipeline[1]));
        let r = async {
            w.write_all(&data[120_000..]).await?;
            w.hflush().await?;
            Ok::<_, std::io::Error>(())
        }
        .await;
        // HDFS's documented outcome: after an hflush a replacement is required, and there is
        // none to be had.
        let err = r.expect_err("no replacement DataNode exists");
        let err = client_error(err);
        match &err {
            ClientError::ReplaceDatanode {
                policy,
                survivors,
                reason,
                ..
            } => {
                assert_eq!((policy.as_str(), *survivors), ("DEFAULT", 2));
                assert!(
                    matches!(**reason, ReplaceFailure::NoMoreDatanodes { .. }),
                    "{reason:?}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(w.close().await.unwrap_err().to_string(), err.to_string());
        assert_eq!(
            w.bytes_acked(),
            120_000,
            "nothing past the last ack is claimed"
        );
        // A new reader sees exactly the hflushed bytes.
        let seen = read_all(&fs, "/nospare-h").await.unwrap();
        assert!(seen == data[..120_000], "read {} bytes", seen.len());
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_policy_goes_on_with_fewer_even_with_spares() {
    with_timeout(LIMIT, "policy NEVER", async {
        let mut cluster = builder().start().await.unwrap();
        let fs = cluster
            .client_with(|c| c.replace_policy = ReplacePolicy::Never)
            .await
            .unwrap();
        let data = random_bytes(400_000, 15);
        let mut w = fs.create("/never", opts()).await.unwrap();
        w.write_all(&data[..100_000]).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        cluster.kill_datanode(index_of(&cluster, &pipeline[0]));
        w.write_all(&data[100_000..]).await.unwrap();
        w.hflush().await.unwrap();
        assert_eq!(
            w.pipeline(),
            pipeline[1..].to_vec(),
            "no replacement under NEVER"
        );
        w.close().await.unwrap();
        check_file(&fs, "/never", &data).await;
        wait_healthy(&fs, "/never").await;
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_effort_goes_on_when_no_replacement_exists() {
    with_timeout(LIMIT, "best effort", async {
        let mut cluster = no_spare().start().await.unwrap();
        let fs = cluster
            .client_with(|c| c.replace_best_effort = true)
            .await
            .unwrap();
        let data = random_bytes(400_000, 16);
        let mut w = fs.create("/best-effort", opts()).await.unwrap();
        w.write_all(&data[..100_000]).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        cluster.kill_datanode(index_of(&cluster, &pipeline[1]));
        w.write_all(&data[100_000..]).await.unwrap();
        w.hflush().await.unwrap();
        assert_eq!(w.pipeline().len(), 2);
        w.close().await.unwrap();
        let blocks = check_file(&fs, "/best-effort", &data).await;
        assert_eq!(blocks[0].locations.len(), 2);
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_while_closing_finishes_the_block_with_the_survivors() {
    with_timeout(LIMIT, "failure during close", async {
        // Full block reports every second, so that the cut-off DataNode reports its stale
        // replica (a replica being written is reported only in full reports).
        let cluster = builder()
            .configure_datanodes(|_, c| c.block_report_interval = HumanDuration::secs(1))
            .start()
            .await
            .unwrap();
        let faults = cluster.link_faults().unwrap().clone();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(300_000, 17);
        let mut w = fs.create("/closing", opts()).await.unwrap();
        w.write_all(&data).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        let (first, second) = (
            index_of(&cluster, &pipeline[0]),
            index_of(&cluster, &pipeline[1]),
        );
        // Every data packet is acknowledged; the last packet never reaches the second node.
        let link = Link::between(first, second);
        faults.set(link, Fault::CutAtLastPacket);
        w.close().await.unwrap();
        assert_eq!(faults.fired(link), 1, "the last packet was cut");
        assert_eq!(w.pipeline_recoveries(), 1);
        faults.clear_all();
        let blocks = check_file(&fs, "/closing", &data).await;
        let lb = &blocks[0];
        let holders: HashSet<_> = lb.locations.iter().map(|d| d.node_id.clone()).collect();
        for dn in [&pipeline[0], &pipeline[2]] {
            assert!(
                holders.contains(&dn.node_id),
                "close recovery finalized {dn}"
            );
        }
        // The cut-off DataNode still holds a replica under the old generation stamp: it is
        // rejected for the new one, and deleted once reported.
        let mut conn = RawConn::connect(&pipeline[1].data_addr)
            .await
            .unwrap()
            .with_token(lb.token.clone());
        let resp = conn.replica_info(lb.block).await.unwrap();
        if resp.status == Status::Success {
            let info = resp.replica.unwrap();
            assert!(info.block.gen_stamp < lb.block.gen_stamp, "{info:?}");
            let mut conn = RawConn::connect(&pipeline[1].data_addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            assert!(
                conn.read_replica(lb.block).await.is_err(),
                "stale replica refused"
            );
        }
        wait_stale_replica_gone(&pipeline[1], lb).await;
        wait_healthy(&fs, "/closing").await;
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_pipeline_datanodes_dead_fails_the_write_and_claims_nothing_more() {
    with_timeout(LIMIT, "all dead", async {
        let mut cluster = no_spare().start().await.unwrap();
        let fs = cluster
            .client_with(|c| c.replace_best_effort = true)
            .await
            .unwrap();
        let data = random_bytes(300_000, 18);
        let mut w = fs.create("/all-dead", opts()).await.unwrap();
        w.write_all(&data[..150_000]).await.unwrap();
        w.hsync().await.unwrap();
        let pipeline = w.pipeline();
        for i in 0..3 {
            cluster.kill_datanode(i);
        }
        let r = async {
            w.write_all(&data[150_000..]).await?;
            w.hflush().await?;
            Ok::<_, std::io::Error>(())
        }
        .await;
        let err = client_error(r.expect_err("every DataNode is dead"));
        match &err {
            ClientError::AllDatanodesBad { nodes, .. } => {
                assert_eq!(nodes.len(), 3, "{nodes:?}");
                for dn in &pipeline {
                    assert!(
                        nodes.iter().any(|n| n.node_id == dn.node_id),
                        "{dn} named in {nodes:?}"
                    );
                }
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("are bad"), "{err}");
        let closed = w.close().await.unwrap_err();
        assert_eq!(closed.to_string(), err.to_string());
        assert_eq!(w.bytes_acked(), 150_000, "the acked length is what it was");
        let st = fs.stat("/all-dead").await.unwrap();
        assert!(st.under_construction);
        assert_eq!(
            st.length, 150_000,
            "the metadata service has the hsynced length"
        );
        // The DataNodes come back; lease recovery closes the file at a length the replicas
        // agree on: every hsynced byte is there, and nothing that was not written.
        for i in 0..3 {
            cluster.start_datanode(i).await.unwrap();
        }
        cluster.wait_live(3).await.unwrap();
        let other = cluster.client().await.unwrap();
        wait_until(WAIT, "lease recovery closes the file", || async {
            other.recover_lease("/all-dead").await.unwrap_or(false)
        })
        .await;
        let seen = read_all(&other, "/all-dead").await.unwrap();
        assert!(seen.len() >= 150_000, "read {} bytes", seen.len());
        assert!(seen == data[..seen.len()], "a prefix of what was written");
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_up_failure_moves_the_block_elsewhere() {
    with_timeout(LIMIT, "set-up failure", async {
        // DataNode 0 alone on its rack: the rack policy puts it in every pipeline.
        let cluster = builder()
            .configure_datanodes(|i, c| c.rack = rack_of(i))
            .start()
            .await
            .unwrap();
        let faults = cluster.link_faults().unwrap().clone();
        fault_into_datanode0(&faults, Fault::Cut);
        let cuts = || -> u64 {
            std::iter::once(Link::client_to(0))
                .chain((1..5).map(|j| Link::between(j, 0)))
                .map(|l| faults.fired(l))
                .sum()
        };
        let data = random_bytes(2 * BLOCK as usize + 5000, 19);
        // Without the exclusion cache every block tries DataNode 0 first; with it (the
        // default, HDFS's excludedNodes) only the first block does.
        for (path, expiry, expect) in [("/setup-nocache", 0, 3), ("/setup", 600, 1)] {
            let fs = cluster
                .client_with(move |c| c.exclude_nodes_expiry = HumanDuration::secs(expiry))
                .await
                .unwrap();
            let before = cuts();
            let mut w = fs.create(path, opts()).await.unwrap();
            w.write_all(&data).await.unwrap();
            w.close().await.unwrap();
            assert_eq!(
                w.pipeline_recoveries(),
                0,
                "set-up failures are not recoveries"
            );
            let cut = cuts() - before;
            assert_eq!(cut, expect, "{path}: set-ups that tried DataNode 0");
            let blocks = check_file(&fs, path, &data).await;
            assert!(blocks.iter().all(|lb| lb.locations.len() == 3));
            assert_none_on_datanode0(&cluster, &blocks);
        }
        cluster.shutdown().await;
    })
    .await
}

/// The writer's exclusion cache is a hint: when the DataNodes it excludes plus the one that
/// just failed leave none to place a block on, the cached ones are tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excluded_datanodes_are_tried_again_when_no_other_is_left() {
    with_timeout(LIMIT, "exclusion cache fallback", async {
        let cluster = builder().datanodes(2).replication(2).start().await.unwrap();
        let faults = cluster.link_faults().unwrap().clone();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(BLOCK as usize + 3000, 25);
        // Block 1: DataNode 0 unreachable, so the block goes to DataNode 1 alone and the
        // writer caches DataNode 0 as excluded.
        faults.set(Link::client_to(0), Fault::Cut);
        faults.set(Link::between(1, 0), Fault::Cut);
        let mut w = fs.create("/fallback", opts()).await.unwrap();
        w.write_all(&data[..BLOCK as usize]).await.unwrap();
        w.hflush().await.unwrap();
        // Block 2: now DataNode 1 is unreachable and DataNode 0 is back.
        faults.clear_all();
        faults.set(Link::client_to(1), Fault::Cut);
        faults.set(Link::between(0, 1), Fault::Cut);
        w.write_all(&data[BLOCK as usize..]).await.unwrap();
        w.close().await.unwrap();
        faults.clear_all();
        let blocks = check_file(&fs, "/fallback", &data).await;
        let ids: Vec<_> = (0..2)
            .map(|i| cluster.datanode(i).unwrap().node_id().clone())
            .collect();
        assert_eq!(blocks.len(), 2);
        assert!(
            blocks[1].locations.iter().any(|d| d.node_id == ids[0]),
            "block 2 went to the cached DataNode 0: {:?}",
            blocks[1].locations
        );
        cluster.shutdown().await;
    })
    .await
}

/// The exclusion cache never costs a block a replica: a DataNode that failed the first
/// block's set-up and then came back is in the next block's pipeline again, because a
/// pipeline the cache made shorter than the replication is allocated again without it. (Seen
/// in the process chaos test: a restarted DataNode left out of every new block of a 3-node
/// cluster for the cache's 10 minutes, so each block was written to fewer DataNodes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_exclusions_do_not_shorten_a_later_pipeline() {
    with_timeout(LIMIT, "exclusion cache and short pipelines", async {
        let cluster = builder().datanodes(3).start().await.unwrap();
        let faults = cluster.link_faults().unwrap().clone();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(BLOCK as usize + 3000, 26);
        // Block 1: DataNode 0 unreachable, so its set-up fails, the block goes to the other
        // two and the writer caches DataNode 0 as excluded.
        faults.set(Link::client_to(0), Fault::Cut);
        for j in 1..3 {
            faults.set(Link::between(j, 0), Fault::Cut);
        }
        let mut w = fs.create("/short", opts()).await.unwrap();
        let part = BLOCK as usize - 1000;
        w.write_all(&data[..part]).await.unwrap();
        w.hflush().await.unwrap();
        assert_eq!(w.pipeline().len(), 2, "block 1 without DataNode 0");
        // Block 2: DataNode 0 is back, still in the writer's cache.
        faults.clear_all();
        w.write_all(&data[part..]).await.unwrap();
        w.hflush().await.unwrap();
        let second = w.pipeline();
        w.close().await.unwrap();
        assert_eq!(second.len(), 3, "block 2's pipeline: {second:?}");
        let dn0 = cluster.datanode(0).unwrap().node_id().clone();
        assert!(second.iter().any(|d| d.node_id == dn0));
        check_file(&fs, "/short", &data).await;
        cluster.shutdown().await;
    })
    .await
}

/// A hung DataNode (connections accepted, nothing answered) in every new pipeline, with the
/// same socket timeout on the client and the DataNodes: set-up waits grow upstream like ack
/// waits, so the DataNode right above the hung one names it (`first_bad_link`) before anyone
/// above times out, and one retry per block is enough. Blaming a healthy DataNode instead
/// would leave the hung one in the retry's pipeline (the rack policy keeps choosing it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_datanode_at_set_up_is_named_by_the_one_above_it() {
    with_timeout(LIMIT, "hung at set-up", async {
        let t = HumanDuration::secs(2);
        let cluster = builder()
            .configure_datanodes(move |i, c| {
                c.rack = rack_of(i);
                c.socket_timeout = t;
            })
            .start()
            .await
            .unwrap();
        let faults = cluster.link_faults().unwrap().clone();
        fault_into_datanode0(&faults, Fault::Stall);
        let fs = cluster
            .client_with(move |c| {
                c.socket_timeout = t;
                c.block_write_retries = 1;
                // Every block meets the hung DataNode (no exclusion across blocks).
                c.exclude_nodes_expiry = HumanDuration::secs(0);
            })
            .await
            .unwrap();
        let data = random_bytes(2 * BLOCK as usize + 5000, 24);
        let mut w = fs.create("/hung", opts()).await.unwrap();
        w.write_all(&data).await.unwrap();
        w.close().await.unwrap();
        faults.clear_all();
        let blocks = check_file(&fs, "/hung", &data).await;
        assert_none_on_datanode0(&cluster, &blocks);
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_packet_corrupted_between_two_datanodes_is_caught_and_recovered() {
    with_timeout(LIMIT, "wire corruption", async {
        let cluster = builder().start().await.unwrap();
        let faults = cluster.link_faults().unwrap().clone();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(700_000, 20);
        let mut w = fs.create("/corrupt", opts()).await.unwrap();
        w.write_all(&data[..100_000]).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        let (first, second) = (
            index_of(&cluster, &pipeline[0]),
            index_of(&cluster, &pipeline[1]),
        );
        let link = Link::between(first, second);
        faults.set(link, Fault::CorruptNextPacket);
        w.write_all(&data[100_000..600_000]).await.unwrap();
        w.hflush().await.unwrap();
        assert_eq!(faults.fired(link), 1, "one packet corrupted on the wire");
        let errors = cluster
            .datanode(second)
            .unwrap()
            .metrics()
            .checksum_errors
            .get();
        assert!(errors >= 1, "the second DataNode verified the packet");
        assert_eq!(w.pipeline_recoveries(), 1);
        let rebuilt = w.pipeline();
        assert_eq!(
            rebuilt.len(),
            3,
            "hflushed: a replacement joined {rebuilt:?}"
        );
        assert!(rebuilt.iter().all(|d| d.node_id != pipeline[1].node_id));
        w.write_all(&data[600_000..]).await.unwrap();
        w.close().await.unwrap();
        check_file(&fs, "/corrupt", &data).await;
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datanode_stalled_past_the_ack_timeout_is_taken_out() {
    with_timeout(LIMIT, "stall", async {
        let cluster = builder().start().await.unwrap();
        let faults = cluster.link_faults().unwrap().clone();
        let fs = cluster
            .client_with(|c| c.socket_timeout = HumanDuration::secs(2))
            .await
            .unwrap();
        let data = random_bytes(600_000, 21);
        let mut w = fs.create("/stall", opts()).await.unwrap();
        w.write_all(&data[..100_000]).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        let (first, second) = (
            index_of(&cluster, &pipeline[0]),
            index_of(&cluster, &pipeline[1]),
        );
        // The first DataNode hangs: nothing in or out, sockets open.
        faults.set(Link::client_to(first), Fault::Stall);
        faults.set(Link::between(first, second), Fault::Stall);
        w.write_all(&data[100_000..]).await.unwrap();
        w.hflush().await.unwrap();
        assert!(
            faults.fired(Link::client_to(first)) >= 1,
            "the stall held packets"
        );
        assert_eq!(w.pipeline_recoveries(), 1);
        assert!(w
            .pipeline()
            .iter()
            .all(|d| d.node_id != pipeline[0].node_id));
        w.close().await.unwrap();
        faults.clear_all();
        let blocks = check_file(&fs, "/stall", &data).await;
        assert!(blocks[0]
            .locations
            .iter()
            .all(|d| d.node_id != pipeline[0].node_id));
        cluster.shutdown().await;
    })
    .await
}

/// With the same socket timeout everywhere, a stalled last DataNode must be the one taken out:
/// ack timeouts grow upstream (HDFS's READ_TIMEOUT_EXTENSION), so the middle DataNode gives
/// up on it first and names it, before the first DataNode or the client time out and blame a
/// healthy node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_last_datanode_is_blamed_not_the_nodes_above_it() {
    with_timeout(LIMIT, "stall last", async {
        let t = HumanDuration::secs(2);
        let cluster = builder()
            .configure_datanodes(move |_, d| d.socket_timeout = t)
            .start()
            .await
            .unwrap();
        let faults = cluster.link_faults().unwrap().clone();
        let fs = cluster.client_with(|c| c.socket_timeout = t).await.unwrap();
        let data = random_bytes(600_000, 23);
        let mut w = fs.create("/stall-last", opts()).await.unwrap();
        w.write_all(&data[..100_000]).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        let (second, third) = (
            index_of(&cluster, &pipeline[1]),
            index_of(&cluster, &pipeline[2]),
        );
        // The last DataNode hangs: its upstream's connection stays open, nothing moves.
        faults.set(Link::between(second, third), Fault::Stall);
        w.write_all(&data[100_000..]).await.unwrap();
        w.hflush().await.unwrap();
        assert_eq!(w.pipeline_recoveries(), 1);
        let rebuilt = w.pipeline();
        assert!(
            rebuilt.iter().all(|d| d.node_id != pipeline[2].node_id),
            "the stalled node is out: {rebuilt:?}"
        );
        for healthy in &pipeline[..2] {
            assert!(
                rebuilt.iter().any(|d| d.node_id == healthy.node_id),
                "{healthy} stays in the pipeline: {rebuilt:?}"
            );
        }
        w.close().await.unwrap();
        faults.clear_all();
        let blocks = check_file(&fs, "/stall-last", &data).await;
        // The stalled DataNode is alive and never restarts: the metadata service asks it to
        // delete its stale replica when the pipeline is rebuilt, not at a full block report.
        let id = blocks[0].block.id.0;
        wait_until(Duration::from_secs(20), "stale replica deleted", || async {
            cluster.replica_files(third, id).is_empty()
        })
        .await;
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datanode_restarted_mid_write_is_left_out_and_its_old_replica_deleted() {
    with_timeout(LIMIT, "restart", async {
        let mut cluster = builder().start().await.unwrap();
        let fs = cluster.client().await.unwrap();
        let data = random_bytes(800_000, 22);
        let mut w = fs.create("/restart", opts()).await.unwrap();
        w.write_all(&data[..300_000]).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        let victim = index_of(&cluster, &pipeline[1]);
        let block = fs.get_block_locations("/restart").await.unwrap().blocks[0].block;
        cluster.restart_datanode(victim).await.unwrap();
        w.write_all(&data[300_000..600_000]).await.unwrap();
        w.hflush().await.unwrap();
        assert_eq!(w.pipeline_recoveries(), 1);
        let rebuilt = w.pipeline();
        assert_eq!(rebuilt.len(), 3, "{rebuilt:?}");
        assert!(rebuilt.iter().all(|d| d.node_id != pipeline[1].node_id));
        w.write_all(&data[600_000..]).await.unwrap();
        w.close().await.unwrap();
        let blocks = check_file(&fs, "/restart", &data).await;
        assert!(blocks[0].block.gen_stamp > block.gen_stamp);
        // Back with a replica under the old generation stamp: reported, then deleted.
        wait_stale_replica_gone(&pipeline[1], &blocks[0]).await;
        wait_healthy(&fs, "/restart").await;
        cluster.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_packet_failing_recovery_more_than_five_times_fails_the_write() {
    with_timeout(LIMIT, "recovery limit", async {
        // Six DataNodes, ALWAYS replace (best effort): each failure takes a DataNode out and
        // adds one, so the sixth failure of the same packet comes before the DataNodes run out.
        let cluster = builder().datanodes(6).start().await.unwrap();
        let faults = cluster.link_faults().unwrap().clone();
        let fs = cluster
            .client_with(|c| {
                c.replace_policy = ReplacePolicy::Always;
                c.replace_best_effort = true;
            })
            .await
            .unwrap();
        let data = random_bytes(300_000, 23);
        let mut w = fs.create("/limit", opts()).await.unwrap();
        w.write_all(&data[..100_000]).await.unwrap();
        w.hflush().await.unwrap();
        // Every client connection dies as it carries a data packet; set-ups and the
        // DataNodes' copies pass.
        for i in 0..6 {
            faults.set(Link::client_to(i), Fault::CutAtDataPacket);
        }
        let r = async {
            w.write_all(&data[100_000..]).await?;
            w.hflush().await?;
            Ok::<_, std::io::Error>(())
        }
        .await;
        let err = client_error(r.expect_err("the packet keeps failing"));
        // The last failure: the connection to the first DataNode, cut under a data packet.
        match &err {
            ClientError::RecoveryLimit { attempts, last, .. } => {
                assert_eq!(*attempts, 5);
                assert!(
                    matches!(**last, PipelineFailure::Connection { .. }),
                    "{last:?}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            err.to_string().contains("tried pipeline recovery 5 times"),
            "{err}"
        );
        assert_eq!(w.pipeline_recoveries(), 5);
        assert_eq!(w.bytes_acked(), 100_000);
        faults.clear_all();
        let seen = read_all(&fs, "/limit").await.unwrap();
        assert!(seen.len() >= 100_000, "read {} bytes", seen.len());
        assert!(seen == data[..seen.len()], "a prefix of what was written");
        cluster.shutdown().await;
    })
    .await
}

fn client_error(e: std::io::Error) -> ClientError {
    e.get_ref()
        .and_then(|r| r.downcast_ref::<ClientError>())
        .cloned()
        .unwrap_or_else(|| panic!("the io::Error carries a ClientError: {e}"))
}
