//! Block recovery and the block scanner with real DataNodes and a fake metadata service: a
//! `RecoverBlock` command makes the DataNode the primary of a recovery (InitReplicaRecovery /
//! UpdateReplicaUnderRecovery to every location, then `commit_block_synchronization`); the
//! scanner reports a replica corrupted on disk.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use crate::support::*;
use sluice_common::config::{ByteSize, HumanDuration};
use sluice_common::proto::*;
use sluice_common::rpc::{BlockSync, DatanodeCommand, RecoveringBlock, ReplicaEvent};
use sluice_common::{BlockId, DatanodeId, GenerationStamp, Status};
use std::collections::HashSet;
use std::time::Duration;

fn recover(
    b: sluice_common::ExtendedBlock,
    id: u64,
    locations: Vec<DatanodeId>,
) -> DatanodeCommand {
    DatanodeCommand::RecoverBlock(RecoveringBlock {
        block: b,
        recovery_id: GenerationStamp(id),
        locations,
        token: None,
    })
}

async fn next_sync(meta: &FakeMeta) -> BlockSync {
    wait_for(
        Duration::from_secs(20),
        "commit_block_synchronization",
        || !meta.log.lock().unwrap().syncs.is_empty(),
    )
    .await;
    meta.log.lock().unwrap().syncs.remove(0)
}

/// A single-node replica of `b` holding `data` (acknowledged), its writer gone (Rbw).
async fn rbw_replica(n: &Node, b: sluice_common::ExtendedBlock, data: &[u8]) {
    let mut c = Client::connect(n.addr()).await;
    let r = c.op(write_op(b, BlockStage::Create, vec![])).await;
    assert_eq!(r.status, Status::Success, "{}", r.message);
    let next = send_data(&mut c, data, 0, 0).await;
    expect_acks(&mut c, next as usize, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_stops_the_writer_and_finalizes_every_replica_at_the_acked_length() {
    within(60, async {
        let (meta_addr, meta) = fake_meta().await;
        let nodes = [
            Node::start(meta_addr).await,
            Node::start(meta_addr).await,
            Node::start(meta_addr).await,
        ];
        let data = random_bytes(10_000, 7);
        let b = block(1, 3, 0);
        let mut writer = Client::connect(nodes[0].addr()).await;
        let r = writer
            .op(write_op(
                b,
                BlockStage::Create,
                vec![nodes[1].id(), nodes[2].id()],
            ))
            .await;
        assert_eq!(r.status, Status::Success, "{}", r.message);
        writer.packet(0, 0, &data, false, false).await;
        expect_acks(&mut writer, 1, 3).await;
        // The writer is still connected when its lease is recovered.
        let locations: Vec<DatanodeId> = nodes.iter().map(Node::id).collect();
        meta.command(&nodes[1].node_id(), recover(b, 9, locations));
        let sync = next_sync(&meta).await;
        assert_eq!(
            (
                sync.new_gen_stamp,
                sync.new_length,
                sync.close_file,
                sync.delete_block
            ),
            (GenerationStamp(9), 10_000, true, false)
        );
        let targets: HashSet<_> = sync.new_targets.into_iter().collect();
        assert_eq!(targets, nodes.iter().map(Node::node_id).collect());
        assert!(
            writer.next().await.is_none(),
            "the old writer's pipeline is closed"
        );
        let recovered = block(1, 9, 10_000);
        for n in &nodes {
            let (blk, meta_file) = finalized_files(&n.dirs, 1).expect("finalized");
            assert!(
                meta_file.ends_with("blk_1_9.meta"),
                "{}",
                meta_file.display()
            );
            assert_eq!(std::fs::metadata(blk).unwrap().len(), 10_000);
            let (r, got) = read_block(n.addr(), recovered, 0, u64::MAX).await;
            assert_eq!(r.replica.unwrap().state, ReplicaState::Finalized);
            assert_eq!(got, data);
            let id = n.node_id();
            wait_for(
                Duration::from_secs(10),
                "Received at the recovery id",
                || {
                    meta.log.lock().unwrap().events.iter().any(|(who, e)| {
                        *who == id && matches!(e, ReplicaEvent::Received(x) if *x == recovered)
                    })
                },
            )
            .await;
            assert_eq!(n.dn().metrics().replicas_recovered.get(), 1);
        }
        // The old writer cannot come back with its old generation stamp.
        let mut late = Client::connect(nodes[0].addr()).await;
        let mut stale = b;
        stale.num_bytes = 10_000;
        let r = late
            .op(Op::WriteBlock(WriteBlockOp {
                block: stale,
                stage: BlockStage::StreamingRecovery,
                targets: vec![],
                client_name: "old".into(),
                bytes_per_checksum: 512,
                latest_gen_stamp: GenerationStamp(4),
            }))
            .await;
        assert_ne!(r.status, Status::Success);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_of_different_lengths_agree_on_the_shortest() {
    within(60, async {
        let (meta_addr, meta) = fake_meta().await;
        let nodes = [
            Node::start(meta_addr).await,
            Node::start(meta_addr).await,
            Node::start(meta_addr).await,
        ];
        let data = random_bytes(5_000, 8);
        let b = block(2, 3, 0);
        rbw_replica(&nodes[0], b, &data[..3_001]).await;
        rbw_replica(&nodes[1], b, &data).await;
        // nodes[2] never got the block.
        let locations: Vec<DatanodeId> = nodes.iter().map(Node::id).collect();
        meta.command(&nodes[2].node_id(), recover(b, 10, locations));
        let sync = next_sync(&meta).await;
        assert_eq!((sync.new_length, sync.delete_block), (3_001, false));
        let targets: HashSet<_> = sync.new_targets.into_iter().collect();
        assert_eq!(
            targets,
            HashSet::from([nodes[0].node_id(), nodes[1].node_id()])
        );
        let recovered = block(2, 10, 3_001);
        for n in &nodes[..2] {
            let (_, got) = read_block(n.addr(), recovered, 0, u64::MAX).await;
            assert_eq!(got, &data[..3_001], "truncated to the agreed length");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_nodes_rwr_replica_is_recovered() {
    within(60, async {
        let (meta_addr, meta) = fake_meta().await;
        let mut n = Node::start(meta_addr).await;
        let data = random_bytes(4_000, 9);
        let b = block(3, 3, 0);
        rbw_replica(&n, b, &data).await;
        let dirs = n.dirs.clone();
        let tmp = n._tmp.take();
        n.stop().await;
        let n = Node::start_on(meta_addr, dirs, None).await;
        let mut q = Client::connect(n.addr()).await;
        let info = q.op(Op::ReplicaInfo(ReplicaInfoOp { block: b })).await;
        assert_eq!(info.replica.unwrap().state, ReplicaState::Rwr);
        meta.command(&n.node_id(), recover(b, 11, vec![n.id()]));
        let sync = next_sync(&meta).await;
        assert_eq!(
            (sync.new_length, sync.new_targets),
            (4_000, vec![n.node_id()])
        );
        let (_, got) = read_block(n.addr(), block(3, 11, 4_000), 0, u64::MAX).await;
        assert_eq!(got, data);
        drop(tmp);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_data_anywhere_asks_to_delete_the_block() {
    within(60, async {
        let (meta_addr, meta) = fake_meta().await;
        let (a, b_node) = (Node::start(meta_addr).await, Node::start(meta_addr).await);
        let b = block(4, 3, 0);
        rbw_replica(&a, b, &[]).await;
        meta.command(&a.node_id(), recover(b, 12, vec![a.id(), b_node.id()]));
        let sync = next_sync(&meta).await;
        assert!(sync.delete_block);
        assert!(sync.new_targets.is_empty());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_block_scanner_reports_a_replica_corrupted_on_disk() {
    within(60, async {
        let (meta_addr, meta) = fake_meta().await;
        let tmp = tempfile::tempdir().unwrap();
        let dirs = vec![tmp.path().join("d")];
        let mut cfg = config(meta_addr, &dirs);
        cfg.block_scanner_interval = HumanDuration::millis(300);
        cfg.block_scanner_bytes_per_second = ByteSize::mib(64);
        let n = Node::start_on(meta_addr, dirs.clone(), Some(cfg)).await;
        let (good, bad) = (block(5, 3, 0), block(6, 3, 0));
        let data = random_bytes(100_000, 10);
        write_block(n.addr(), vec![], good, &data).await;
        write_block(n.addr(), vec![], bad, &data).await;
        let m = n.dn().metrics();
        wait_for(Duration::from_secs(20), "both replicas verified", || {
            m.scanner_replicas_verified.get() >= 2
        })
        .await;
        let (blk, _) = finalized_files(&dirs, 6).unwrap();
        let mut bytes_on_disk = std::fs::read(&blk).unwrap();
        bytes_on_disk[70_000] ^= 0x40;
        std::fs::write(&blk, &bytes_on_disk).unwrap();
        let id = n.node_id();
        wait_for(Duration::from_secs(20), "a Corrupt report", || {
            meta.log.lock().unwrap().events.iter().any(|(who, e)| {
                *who == id && matches!(e, ReplicaEvent::Corrupt(x) if x.id == BlockId(6))
            })
        })
        .await;
        assert!(!meta
            .log
            .lock()
            .unwrap()
            .events
            .iter()
            .any(|(_, e)| matches!(e, ReplicaEvent::Corrupt(x) if x.id == BlockId(5))));
        assert!(m.scanner_corrupt_replicas.get() >= 1);
        assert!(m.scanner_bytes_verified.get() >= 200_000);
    })
    .await
}
