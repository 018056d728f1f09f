//! Protocol tests with real sockets: three DataNodes and a raw framed client.

use crate::support::*;
use sluice_common::proto::*;
use sluice_common::rpc::DatanodeCommand;
use sluice_common::{BlockId, Status};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_node_pipeline_with_hflush_overlap_and_sync_reads_back_everywhere() {
    within(60, async {
        let (meta_addr, meta) = fake_meta().await;
        let (n1, n2, n3) = (
            Node::start(meta_addr).await,
            Node::start(meta_addr).await,
            Node::start(meta_addr).await,
        );
        let data = random_bytes(200_001, 1);
        let b = block(1, 1, 0);
        let mut c = Client::connect(n1.addr()).await;
        let r = c
            .op(write_op(b, BlockStage::Create, vec![n2.id(), n3.id()]))
            .await;
        assert_eq!(r.status, Status::Success, "{}", r.message);
        // 700 bytes then an hflush (ack awaited); the next packet restarts at chunk 512 and
        // carries 188 bytes again.
        c.packet(0, 0, &data[..700], false, false).await;
        expect_acks(&mut c, 1, 3).await;
        let info = ReplicaInfoOp { block: b };
        // The last DataNode batches in memory (write-memory batching, idle flush 2 s): its
        // visible length stays at the bytes in its block file, none yet.
        let mut q = Client::connect(n3.addr()).await;
        let rep = q
            .op(Op::ReplicaInfo(info))
            .await
            .replica
            .expect("replica info");
        assert!(rep.block.num_bytes <= rep.bytes_on_disk, "{rep:?}");
        for n in [&n1, &n2] {
            let mut q = Client::connect(n.addr()).await;
            let r = q.op(Op::ReplicaInfo(info)).await;
            let rep = r.replica.expect("replica info");
            assert_eq!(
                (rep.state, rep.block.num_bytes),
                (ReplicaState::Rbw, 700),
                "hflushed bytes visible"
            );
            let (_, got) = read_block(n.addr(), b, 0, 700).await;
            assert_eq!(
                got,
                &data[..700],
                "a reader of an Rbw replica sees the hflushed bytes"
            );
        }
        c.packet(1, 512, &data[512..61_440], false, true).await; // hsync
        let next = send_data(&mut c, &data, 61_440, 2).await;
        c.packet(next, data.len() as u64, &[], true, false).await;
        expect_acks(&mut c, next as usize, 3).await;
        for n in [&n1, &n2, &n3] {
            let nid = n.node_id();
            wait_for(Duration::from_secs(10), "block_received", || {
                meta.received(&nid, BlockId(1))
            })
            .await;
            let (r, got) = read_block(n.addr(), b, 0, u64::MAX).await;
            assert_eq!(r.replica.unwrap().block.num_bytes, data.len() as u64);
            assert_eq!(got, data, "streamed bytes");
            let (_, mid) = read_block(n.addr(), b, 100_000, 1000).await;
            assert_eq!(
                mid,
                &data[99_840..101_000],
                "from the chunk holding the offset"
            );
            let mut q = Client::connect(n.addr()).await;
            let mut all = Vec::new();
            while (all.len() as u64) < data.len() as u64 {
                let (r, piece) = read_chunk(&mut q, b, all.len() as u64, 65_536).await;
                assert_eq!(r.status, Status::Success);
                all.extend(piece);
            }
            assert_eq!(all, data, "classic chunk reads on one connection");
            let (blk, meta_file) = finalized_files(&n.dirs, 1).expect("finalized files");
            assert_valid_files(&blk, &meta_file, &data);
            assert!(n.dn().metrics().block_file_writes.get() > 0);
        }
        // The direct-sink replicas took every packet on the receiving task except the hsync
        // one (its fsync goes to the blocking pool); the buffered last replica none.
        for n in [&n1, &n2] {
            let m = n.dn().metrics();
            let (received, inline) = (m.packets_received.get(), m.packets_written_inline.get());
            assert!(received > 2, "{received}");
            assert_eq!(
                inline,
                received - 1,
                "every packet but the hsync one inline"
            );
        }
        let m3 = n3.dn().metrics();
        assert_eq!(m3.packets_written_inline.get(), 0);
        // The buffered one copied them into its buffer on the actor's thread (the hsync packet
        // and the finalize still go to the blocking pool).
        assert_eq!(
            m3.packets_buffered_on_actor.get(),
            m3.packets_received.get() - 1
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_out_of_range_not_found_and_stale_fail_at_once() {
    within(30, async {
        let (meta_addr, _) = fake_meta().await;
        let n = Node::start(meta_addr).await;
        let data = random_bytes(5000, 2);
        write_block(n.addr(), vec![], block(2, 5, 0), &data).await;
        let mut c = Client::connect(n.addr()).await;
        let rb = |b, offset| {
            Op::ReadBlock(ReadBlockOp {
                block: b,
                offset,
                length: 10,
                piece_size: 0,
            })
        };
        let r = c.op(rb(block(2, 5, 0), 5000)).await;
        assert_eq!(r.status, Status::ErrorOutOfRange, "{}", r.message);
        let r = c.op(rb(block(99, 5, 0), 0)).await;
        assert_eq!(r.status, Status::ErrorNotFound);
        let r = c.op(rb(block(2, 6, 0), 0)).await;
        assert_eq!(r.status, Status::ErrorStaleGenStamp);
        let r = c
            .op(Op::ReadChunk(ReadChunkOp {
                block: block(2, 5, 0),
                offset: 9000,
                length: 1,
            }))
            .await;
        assert_eq!(r.status, Status::ErrorOutOfRange);
        let r = c
            .op(Op::ReadChunk(ReadChunkOp {
                block: block(2, 5, 0),
                offset: 0,
                length: 64 << 20,
            }))
            .await;
        assert_eq!(r.status, Status::Success, "clamped to the visible length");
        let f = c.next().await.unwrap();
        let Message::Chunk(h) = f.header else {
            panic!("chunk")
        };
        assert_eq!(h.data_len, 5000);
        let r = c
            .op(Op::ReplicaInfo(ReplicaInfoOp {
                block: block(99, 1, 0),
            }))
            .await;
        assert_eq!(
            r.status,
            Status::ErrorNotFound,
            "the connection survived every error"
        );
        let (r, tail) = read_block(n.addr(), block(2, 5, 0), 4999, 1).await;
        assert_eq!(r.status, Status::Success);
        assert_eq!(tail, &data[4608..5000]);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_that_dies_mid_stream_is_acked_as_error() {
    within(30, async {
        let (meta_addr, _) = fake_meta().await;
        let n1 = Node::start(meta_addr).await;
        let mut n2 = Node::start(meta_addr).await;
        let data = random_bytes(300_000, 3);
        let b = block(3, 1, 0);
        let mut c = Client::connect(n1.addr()).await;
        let r = c.op(write_op(b, BlockStage::Create, vec![n2.id()])).await;
        assert_eq!(r.status, Status::Success);
        c.packet(0, 0, &data[..65_536], false, false).await;
        expect_acks(&mut c, 1, 2).await;
        n2.dn.take().unwrap().kill();
        let _ = send_data(&mut c, &data[..131_072], 65_536, 1).await;
        let a = c.ack().await.expect("an ack naming the failed downstream");
        assert_eq!(a.seqno, 1);
        assert_eq!(a.replies, vec![Status::Success, Status::Error]);
        // DN1 then closes the connection; its replica keeps the bytes received, in rbw.
        while c.ack().await.is_some() {}
        let mut q = Client::connect(n1.addr()).await;
        let r = q.op(Op::ReplicaInfo(ReplicaInfoOp { block: b })).await;
        let rep = r.replica.unwrap();
        assert_eq!(rep.state, ReplicaState::Rbw);
        assert_eq!(
            rep.block.num_bytes, 65_536,
            "only the fully acked packet is visible"
        );
        assert_eq!(rep.bytes_on_disk, 131_072);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_copies_a_finalized_replica_and_the_command_does_too() {
    within(40, async {
        let (meta_addr, meta) = fake_meta().await;
        let (n1, n2, n3) = (
            Node::start(meta_addr).await,
            Node::start(meta_addr).await,
            Node::start(meta_addr).await,
        );
        let data = random_bytes(150_007, 4);
        let b = block(4, 2, data.len() as u64);
        write_block(n1.addr(), vec![], b, &data).await;
        let mut c = Client::connect(n1.addr()).await;
        let op = TransferBlockOp {
            block: b,
            targets: vec![n2.id()],
            stage: BlockStage::TransferFinalized,
            client_name: "t".into(),
        };
        let r = c.op(Op::TransferBlock(op)).await;
        assert_eq!(r.status, Status::Success, "{}", r.message);
        let n2id = n2.node_id();
        wait_for(Duration::from_secs(10), "n2 reports the copy", || {
            meta.received(&n2id, BlockId(4))
        })
        .await;
        let (_, got) = read_block(n2.addr(), b, 0, u64::MAX).await;
        assert_eq!(got, data);
        meta.command(
            &n1.node_id(),
            DatanodeCommand::Transfer {
                block: b,
                targets: vec![n3.id()],
                token: None,
            },
        );
        let n3id = n3.node_id();
        wait_for(Duration::from_secs(10), "n3 reports the copy", || {
            meta.received(&n3id, BlockId(4))
        })
        .await;
        let (blk, mf) = finalized_files(&n3.dirs, 4).unwrap();
        assert_valid_files(&blk, &mf, &data);
        // Delete command: the replica goes, and the deletion is reported.
        meta.command(&n3id, DatanodeCommand::Delete { blocks: vec![b] });
        wait_for(Duration::from_secs(10), "n3 reports the delete", || {
            meta.deleted(&n3id, BlockId(4))
        })
        .await;
        let mut q = Client::connect(n3.addr()).await;
        assert_eq!(
            q.op(Op::ReplicaInfo(ReplicaInfoOp { block: b }))
                .await
                .status,
            Status::ErrorNotFound
        );
        assert!(finalized_files(&n3.dirs, 4).is_none());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_on_the_same_dirs_rediscovers_and_reports_replicas() {
    within(40, async {
        let (meta_addr, meta) = fake_meta().await;
        let mut n = Node::start(meta_addr).await;
        let tmp = n._tmp.take().unwrap();
        let id = n.node_id();
        let data = random_bytes(70_000, 5);
        write_block(n.addr(), vec![], block(5, 1, 0), &data).await;
        // A second block left half written: the writer goes away without a last packet.
        let mut c = Client::connect(n.addr()).await;
        assert_eq!(
            c.op(write_op(block(6, 1, 0), BlockStage::Create, vec![]))
                .await
                .status,
            Status::Success
        );
        c.packet(0, 0, &data[..1000], false, true).await;
        expect_acks(&mut c, 1, 1).await;
        drop(c);
        n.stop().await;
        let n = Node::start_on(meta_addr, n.dirs.clone(), None).await;
        assert_eq!(n.node_id(), id, "same node id from VERSION");
        let (_, got) = read_block(n.addr(), block(5, 1, 0), 0, u64::MAX).await;
        assert_eq!(got, data);
        let mut q = Client::connect(n.addr()).await;
        let r = q
            .op(Op::ReplicaInfo(ReplicaInfoOp {
                block: block(6, 1, 0),
            }))
            .await;
        let rep = r.replica.unwrap();
        assert_eq!((rep.state, rep.bytes_on_disk), (ReplicaState::Rwr, 1000));
        wait_for(
            Duration::from_secs(10),
            "a block report after the restart",
            || meta.last_report(&id).is_some_and(|r| r.len() == 2),
        )
        .await;
        // Recovery brings the Rwr replica back into a pipeline under a new generation stamp.
        let mut w = Client::connect(n.addr()).await;
        let mut op = write_op(block(6, 1, 1000), BlockStage::StreamingRecovery, vec![]);
        if let Op::WriteBlock(ref mut o) = op {
            o.latest_gen_stamp = sluice_common::GenerationStamp(2);
        }
        assert_eq!(w.op(op).await.status, Status::Success);
        w.packet(0, 512, &data[512..4000], false, false).await;
        w.packet(1, 4000, &[], true, false).await;
        expect_acks(&mut w, 2, 1).await;
        let (_, got) = read_block(n.addr(), block(6, 2, 0), 0, u64::MAX).await;
        assert_eq!(got, &data[..4000]);
        drop(tmp);
    })
    .await
}

fn with_gs(op: Op, latest: u64) -> Op {
    match op {
        Op::WriteBlock(mut o) => {
            o.latest_gen_stamp = sluice_common::GenerationStamp(latest);
            Op::WriteBlock(o)
        }
        other => other,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_repair_transfer_rbw_then_streaming_and_close_recovery() {
    within(40, async {
        let (meta_addr, meta) = fake_meta().await;
        let (n1, n2, n3) = (Node::start(meta_addr).await, Node::start(meta_addr).await, Node::start(meta_addr).await);
        let data = random_bytes(250_000, 6);
        // The writer's pipeline lost its other nodes: n1 alone holds 100 000 acked bytes.
        let mut w = Client::connect(n1.addr()).await;
        assert_eq!(w.op(write_op(block(7, 1, 0), BlockStage::Create, vec![])).await.status, Status::Success);
        let seq = send_data(&mut w, &data[..100_000], 0, 0).await;
        expect_acks(&mut w, seq as usize, 1).await;
        drop(w);
        // Copy the acked bytes of the rbw replica to a replacement node.
        let mut c = Client::connect(n1.addr()).await;
        let op = TransferBlockOp { block: block(7, 1, 100_000), targets: vec![n2.id()], stage: BlockStage::TransferRbw, client_name: "w".into() };
        let r = c.op(Op::TransferBlock(op)).await;
        assert_eq!(r.status, Status::Success, "{}", r.message);
        let mut q = Client::connect(n2.addr()).await;
        let rep = q.op(Op::ReplicaInfo(ReplicaInfoOp { block: block(7, 1, 0) })).await.replica.unwrap();
        assert_eq!((rep.state, rep.block.num_bytes), (ReplicaState::Rbw, 100_000));
        // Rebuild the pipeline n1 -> n2 under gs 2 and continue from the acked length.
        let mut w = Client::connect(n1.addr()).await;
        let r = w.op(with_gs(write_op(block(7, 1, 100_000), BlockStage::StreamingRecovery, vec![n2.id()]), 2)).await;
        assert_eq!(r.status, Status::Success, "{}", r.message);
        let seq = send_data(&mut w, &data[..200_000], 99_840, 0).await;
        expect_acks(&mut w, seq as usize, 2).await;
        drop(w);
        // Closing fails; close recovery finalizes both at the acked length under gs 3.
        let mut w = Client::connect(n1.addr()).await;
        let r = w.op(with_gs(write_op(block(7, 2, 200_000), BlockStage::CloseRecovery, vec![n2.id()]), 3)).await;
        assert_eq!(r.status, Status::Success, "{}", r.message);
        for n in [&n1, &n2] {
            let id = n.node_id();
            wait_for(Duration::from_secs(10), "Received at gs 3", || {
                meta.log.lock().unwrap().events.iter().any(|(who, e)| {
                    *who == id && matches!(e, sluice_common::rpc::ReplicaEvent::Received(b) if b.gen_stamp.0 == 3 && b.num_bytes == 200_000)
                })
            })
            .await;
            let (r, got) = read_block(n.addr(), block(7, 3, 0), 0, u64::MAX).await;
            assert_eq!(r.replica.unwrap().state, ReplicaState::Finalized);
            assert_eq!(got, &data[..200_000]);
        }
        // A replica at an older generation stamp cannot be recovered from a newer one.
        let mut w = Client::connect(n3.addr()).await;
        let r = w.op(with_gs(write_op(block(7, 1, 0), BlockStage::StreamingRecovery, vec![]), 2)).await;
        assert_eq!(r.status, Status::ErrorNotFound);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_corruption_reaches_the_reader_as_a_checksum_mismatch() {
    within(30, async {
        let (meta_addr, _) = fake_meta().await;
        let n = Node::start(meta_addr).await;
        let data = random_bytes(3000, 9);
        let b = block(8, 1, 0);
        write_block(n.addr(), vec![], b, &data).await;
        let (blk, _) = finalized_files(&n.dirs, 8).unwrap();
        let mut bad = data.clone();
        bad[100] ^= 1; // chunk 0
        bad[1100] ^= 1; // chunk 2, which a read of [1024, 1200) ends inside
        std::fs::write(&blk, &bad).unwrap();
        let mut c = Client::connect(n.addr()).await;
        for (offset, len, bad_chunk) in [(0u64, 3000u64, 0u64), (1100, 100, 1024)] {
            let r = c
                .op(Op::ReadChunk(ReadChunkOp {
                    block: b,
                    offset,
                    length: len,
                }))
                .await;
            assert_eq!(r.status, Status::Success);
            let f = c.next().await.unwrap();
            let Message::Chunk(h) = f.header else {
                panic!("chunk")
            };
            let (sums, got) = split_payload(&f.payload, h.data_len, h.bytes_per_checksum);
            match sluice_common::checksum::verify(got, sums, h.bytes_per_checksum, h.offset) {
                Err(sluice_common::ChecksumError::Mismatch { offset, .. }) => {
                    assert_eq!(offset, bad_chunk)
                }
                other => panic!("corruption at {bad_chunk} not detected: {other:?}"),
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunk_reads_reuse_one_buffer_per_connection_and_drop_their_pages_behind() {
    within(30, async {
        let (meta_addr, _) = fake_meta().await;
        let n = Node::start(meta_addr).await;
        let chunk = 512u64 << 10; // above read.ahead.cache.bytes.threshold (256 KiB)
        let data = random_bytes(4 * chunk as usize, 7);
        let b = block(7, 1, 0);
        write_block(n.addr(), vec![], b, &data).await;
        let m = n.dn().metrics();
        let (allocated, dropped) = (m.chunk_buffers_allocated.get(), m.dropbehind_bytes.get());
        let mut c = Client::connect(n.addr()).await;
        let mut all = Vec::new();
        for i in 0..4 {
            let (r, got) = read_chunk(&mut c, b, i * chunk, chunk).await;
            assert_eq!(r.status, Status::Success, "{}", r.message);
            all.extend_from_slice(&got);
        }
        assert_eq!(
            all, data,
            "the reused buffer carries each chunk's own bytes"
        );
        assert_eq!(
            m.chunk_buffers_allocated.get() - allocated,
            1,
            "four chunks on one connection, one buffer"
        );
        assert_eq!(
            m.dropbehind_bytes.get() - dropped,
            4 * chunk,
            "each chunk past the threshold dropped behind, as a streaming read does"
        );
        // A short chunk and then a full one again on the same buffer.
        let (_, got) = read_chunk(&mut c, b, 0, 1000).await;
        assert_eq!(got, &data[..1000]);
        let (_, got) = read_chunk(&mut c, b, chunk, chunk).await;
        assert_eq!(got, &data[chunk as usize..2 * chunk as usize]);
        assert_eq!(m.chunk_buffers_allocated.get() - allocated, 1);
        let mut c2 = Client::connect(n.addr()).await;
        let (_, got) = read_chunk(&mut c2, b, 0, chunk).await;
        assert_eq!(got, &data[..chunk as usize]);
        assert_eq!(
            m.chunk_buffers_allocated.get() - allocated,
            2,
            "one per connection"
        );
    })
    .await
}
