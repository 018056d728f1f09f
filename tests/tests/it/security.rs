//! Block access tokens end to end: every block op without a valid token is refused
//! with `ERROR_ACCESS_TOKEN` and changes nothing — including the single destructive messages
//! the issue found (WriteBlock Create with stamp u64::MAX, InitReplicaRecovery +
//! UpdateReplicaUnderRecovery to length 0, TransferBlock to an address the sender chose) — and
//! the client refreshes expired tokens and outlives key roll-overs transparently.

use sluice_client::WriteOptions;
use sluice_common::proto::{
    BlockStage, InitReplicaRecoveryOp, Op, OpResponse, ReadBlockOp, TransferBlockOp,
    UpdateReplicaOp, WriteBlockOp,
};
use sluice_common::rpc::LocatedBlock;
use sluice_common::token::{now_ms, BlockToken};
use sluice_common::{BlockId, DatanodeId, ExtendedBlock, GenerationStamp, NodeId, Status};
use sluice_tests::raw::RawConn;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, write_all, MiniCluster};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(120);
const BLOCK: u64 = 64 * 1024;

async fn cluster(lifetime: Duration) -> MiniCluster {
    sluice_tests::init_logging();
    MiniCluster::builder()
        .block_size(BLOCK)
        .configure_metadata(move |m| {
            m.block_token_lifetime = sluice_common::config::HumanDuration(lifetime);
            m.block_key_update_interval = sluice_common::config::HumanDuration(lifetime);
        })
        .start()
        .await
        .expect("cluster starts")
}

fn opts() -> WriteOptions {
    WriteOptions {
        overwrite: true,
        create_parent: true,
        ..WriteOptions::default()
    }
}

/// One op with `token` on a fresh connection to `dn`; its answer.
async fn op(dn: &DatanodeId, op: Op, token: Option<BlockToken>) -> OpResponse {
    let mut c = RawConn::connect(&dn.data_addr)
        .await
        .unwrap()
        .with_token(token);
    c.send_op(op).await.unwrap();
    c.op_response().await.unwrap()
}

fn refused(r: &OpResponse, what: &str) {
    assert_eq!(r.status, Status::ErrorAccessToken, "{what}: {r:?}");
}

/// Every replica of every block of `path` still streams exactly `data`.
async fn replicas_intact(c: &MiniCluster, path: &str, data: &[u8]) {
    let fs = c.client().await.unwrap();
    let located = fs.get_block_locations(path).await.unwrap();
    for lb in &located.blocks {
        let want = &data[lb.offset as usize..(lb.offset + lb.block.num_bytes) as usize];
        for dn in &lb.locations {
            let mut conn = RawConn::connect(&dn.data_addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            let (bytes, info) = conn.read_replica(lb.block).await.unwrap();
            assert_eq!(info.block, lb.block, "replica on {dn}");
            assert!(bytes == want, "replica bytes of {} on {dn}", lb.block);
        }
    }
    assert!(read_all(&fs, path).await.unwrap() == data);
}

async fn first_block(c: &MiniCluster, path: &str) -> LocatedBlock {
    let fs = c.client().await.unwrap();
    fs.get_block_locations(path).await.unwrap().blocks[0].clone()
}

fn read_op(block: ExtendedBlock) -> Op {
    Op::ReadBlock(ReadBlockOp {
        block,
        offset: 0,
        length: u64::MAX,
        piece_size: 0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_need_a_token_for_their_block_and_stamp() {
    with_timeout(LIMIT, "read tokens", async {
        let c = cluster(Duration::from_secs(3600)).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(3 * BLOCK as usize, 1);
        write_all(&fs, "/s/f", &data, opts(), 10_000).await.unwrap();
        let located = fs.get_block_locations("/s/f").await.unwrap();
        let (lb, other) = (&located.blocks[0], &located.blocks[1]);
        let dn = &lb.locations[0];
        assert!(lb.token.is_some(), "located blocks carry tokens");

        refused(
            &op(dn, read_op(lb.block), None).await,
            "ReadBlock without a token",
        );
        let r = op(dn, read_op(lb.block), other.token.clone()).await;
        refused(&r, "ReadBlock with another block's token");
        let mut stamp0 = lb.block;
        stamp0.gen_stamp = GenerationStamp(0);
        let r = op(dn, read_op(stamp0), lb.token.clone()).await;
        refused(&r, "ReadBlock naming stamp 0");
        let mut forged = lb.token.clone().unwrap();
        forged.ident.block = other.block.id;
        let r = op(dn, read_op(other.block), Some(forged)).await;
        refused(&r, "a token whose identifier was changed");
        let chunk = Op::ReadChunk(sluice_common::proto::ReadChunkOp {
            block: lb.block,
            offset: 0,
            length: 512,
        });
        refused(&op(dn, chunk, None).await, "ReadChunk without a token");
        let info = Op::ReplicaInfo(sluice_common::proto::ReplicaInfoOp { block: lb.block });
        refused(
            &op(dn, info.clone(), None).await,
            "ReplicaInfo without a token",
        );
        // The right token works.
        let r = op(dn, info, lb.token.clone()).await;
        assert_eq!(r.status, Status::Success, "{r:?}");
        replicas_intact(&c, "/s/f", &data).await;
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destructive_single_messages_fail_without_a_valid_token() {
    with_timeout(LIMIT, "destructive messages", async {
        let c = cluster(Duration::from_secs(3600)).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(BLOCK as usize + 5000, 2);
        write_all(&fs, "/d/f", &data, opts(), 10_000).await.unwrap();
        let lb = first_block(&c, "/d/f").await;
        let read_token = lb.token.clone();
        for dn in &lb.locations {
            // WriteBlock Create with stamp u64::MAX: would replace the finalized replica.
            let create = |targets: Vec<DatanodeId>| {
                Op::WriteBlock(WriteBlockOp {
                    block: ExtendedBlock::new(lb.block.id, GenerationStamp(u64::MAX), 0),
                    stage: BlockStage::Create,
                    targets,
                    client_name: "attacker".into(),
                    bytes_per_checksum: 512,
                    latest_gen_stamp: GenerationStamp(u64::MAX),
                })
            };
            refused(
                &op(dn, create(vec![]), None).await,
                "Create u64::MAX, no token",
            );
            let r = op(dn, create(vec![]), read_token.clone()).await;
            refused(&r, "Create u64::MAX with a read token");
            // Stamp raised by 1,000 (the replica replacement).
            let raise = Op::WriteBlock(WriteBlockOp {
                block: lb.block,
                stage: BlockStage::StreamingRecovery,
                targets: vec![],
                client_name: "attacker".into(),
                bytes_per_checksum: 512,
                latest_gen_stamp: GenerationStamp(lb.block.gen_stamp.0 + 1000),
            });
            refused(&op(dn, raise, read_token.clone()).await, "stamp + 1000");
            // Replica recovery to length 0.
            let rid = GenerationStamp(lb.block.gen_stamp.0 + 1);
            let init = Op::InitReplicaRecovery(InitReplicaRecoveryOp {
                block: lb.block,
                recovery_id: rid,
            });
            refused(&op(dn, init.clone(), None).await, "InitReplicaRecovery");
            refused(
                &op(dn, init, read_token.clone()).await,
                "InitReplicaRecovery, read token",
            );
            let update = Op::UpdateReplicaUnderRecovery(UpdateReplicaOp {
                block: lb.block,
                recovery_id: rid,
                new_length: 0,
            });
            refused(&op(dn, update, None).await, "UpdateReplicaUnderRecovery(0)");
        }
        // TransferBlock to an address the sender chose: refused, and nothing is dialled.
        let trap = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let attacker = DatanodeId {
            node_id: NodeId("attacker".into()),
            data_addr: trap.local_addr().unwrap().to_string(),
            http_addr: String::new(),
            rack: "/default-rack".into(),
        };
        let transfer = Op::TransferBlock(TransferBlockOp {
            block: lb.block,
            targets: vec![attacker.clone()],
            stage: BlockStage::TransferFinalized,
            client_name: "attacker".into(),
        });
        let dn = &lb.locations[0];
        refused(
            &op(dn, transfer.clone(), None).await,
            "TransferBlock, no token",
        );
        refused(
            &op(dn, transfer, read_token.clone()).await,
            "TransferBlock, read token",
        );
        // A write token names its pipeline: forwarding elsewhere is refused too.
        let mut w = fs.create("/d/g", opts()).await.unwrap();
        w.write_all(b"x").await.unwrap();
        w.hflush().await.unwrap();
        let g = first_block(&c, "/d/g").await;
        let mut evil_pipeline = Op::WriteBlock(WriteBlockOp {
            block: ExtendedBlock::new(BlockId(g.block.id.0 + 1), g.block.gen_stamp, 0),
            stage: BlockStage::Create,
            targets: vec![attacker],
            client_name: "attacker".into(),
            bytes_per_checksum: 512,
            latest_gen_stamp: g.block.gen_stamp,
        });
        refused(
            &op(dn, evil_pipeline.clone(), g.token.clone()).await,
            "another block's write",
        );
        if let Op::WriteBlock(wb) = &mut evil_pipeline {
            wb.block.id = g.block.id;
        }
        refused(
            &op(dn, evil_pipeline, g.token.clone()).await,
            "forwarding to an unnamed target",
        );
        let dialled = tokio::time::timeout(Duration::from_millis(300), trap.accept()).await;
        assert!(
            dialled.is_err(),
            "a DataNode dialled the attacker's address"
        );
        w.write_all(b"yz").await.unwrap();
        w.close().await.unwrap();
        assert_eq!(read_all(&fs, "/d/g").await.unwrap(), b"xyz");
        replicas_intact(&c, "/d/f", &data).await;
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_tokens_are_refused_and_readers_refresh_them_across_key_roll_overs() {
    with_timeout(LIMIT, "token expiry and refresh", async {
        let life = Duration::from_secs(2);
        let c = cluster(life).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(4 * BLOCK as usize, 3);
        write_all(&fs, "/e/f", &data, opts(), 10_000).await.unwrap();
        let lb = first_block(&c, "/e/f").await;
        let expiry = lb.token.as_ref().unwrap().ident.expiry_ms;
        // A reader opened now reads one block, then pauses past two key roll-overs.
        let mut reader = fs.open("/e/f").await.unwrap();
        let mut head = vec![0u8; BLOCK as usize];
        reader.read_exact(&mut head).await.unwrap();
        let rolled_twice = expiry + 2 * life.as_millis() as u64 + 500;
        wait_until(LIMIT, "two key roll-overs", || async {
            now_ms() > rolled_twice
        })
        .await;
        // The old token is refused (expired, and its key rolled out) ...
        let r = op(&lb.locations[0], read_op(lb.block), lb.token.clone()).await;
        refused(&r, "an expired token");
        // ... while the open reader goes on: it re-fetches the tokens of the next blocks.
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await.unwrap();
        head.extend_from_slice(&rest);
        assert!(head == data, "the reader's bytes");
        // A positioned read on the same reader, on the first block again.
        let mut at = vec![0u8; 1000];
        reader.read_at(10, &mut at).await.unwrap();
        assert!(at[..] == data[10..1010]);
        // A long write across roll-overs: one block per roll-over interval.
        let mut w = fs.create("/e/long", opts()).await.unwrap();
        let long = random_bytes(3 * BLOCK as usize, 4);
        for (i, piece) in long.chunks(BLOCK as usize / 2).enumerate() {
            w.write_all(piece).await.unwrap();
            if i % 2 == 1 {
                let until = now_ms() + life.as_millis() as u64 + 200;
                wait_until(LIMIT, "a key roll-over", || async { now_ms() > until }).await;
            }
        }
        w.close().await.unwrap();
        assert!(read_all(&fs, "/e/long").await.unwrap() == long);
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_holders_of_the_cluster_secret_may_speak_the_datanode_protocol() {
    use sluice_common::auth::ClusterSecret;
    use sluice_common::rpc::{self, Heartbeat};
    with_timeout(LIMIT, "cluster secret", async {
        let c = cluster(Duration::from_secs(3600)).await;
        let addr = c.metadata_addr();
        // The embedded cluster generated a secret next to the metadata directory.
        let secret = ClusterSecret::read_file(&c.root().join("cluster-secret")).unwrap();
        let stranger = rpc::connect_datanode_protocol(addr).await;
        assert!(stranger.is_err(), "no secret: refused before any RPC");
        let wrong = ClusterSecret::generate();
        let r = rpc::connect_datanode_protocol_with(addr, Some(&wrong)).await;
        assert!(r.is_err(), "a wrong secret is refused");
        // A member gets in, and its heartbeat answer carries the block keys.
        let member = rpc::connect_datanode_protocol_with(addr, Some(&secret))
            .await
            .unwrap();
        let node = c.datanode(0).unwrap().datanode_id().node_id.clone();
        let hb = Heartbeat {
            node,
            capacity: 1,
            used: 0,
            remaining: 1,
            active_transfers: 0,
            transfers_in_progress: 0,
            active_pipelines: 0,
            buffered_replicas: 0,
        };
        let resp = member
            .heartbeat(rpc::context_with_timeout(Duration::from_secs(10)), hb)
            .await
            .unwrap()
            .unwrap();
        assert!(resp.block_keys.is_some());
        // The client protocol needs no secret.
        let fs = c.client().await.unwrap();
        fs.mkdirs("/ok", true).await.unwrap();
        c.shutdown().await;
    })
    .await
}
