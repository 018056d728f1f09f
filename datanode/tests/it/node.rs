//! The DataNode as a service: HTTP endpoints, life without a metadata service, kill and
//! restart, and recovery taking over from a writer that is still connected.

#![allow(clippy::unwrap_used)]

use crate::support::*;
use sluice_common::config::DatanodeConfig;
use sluice_common::proto::*;
use sluice_common::{BlockId, GenerationStamp, Status};
use sluice_datanode::DataNode;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Compile-time check: a `DataNode` can be held across awaits and its start future spawned.
#[allow(dead_code)]
fn datanode_and_its_start_future_are_send() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: &T) {}
    send(&DataNode::start(Default::default(), Default::default()));
    let _ = |d: &DataNode| send_sync(d);
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reports_health_status_and_metrics() {
    within(30, async {
        let (meta_addr, _) = fake_meta().await;
        let n = Node::start(meta_addr).await;
        write_block(n.addr(), vec![], block(30, 1, 0), &random_bytes(3000, 1)).await;
        let h = n.dn().http_addr();
        assert_eq!(http_get(h, "/health").await.0, 200);
        let (code, body) = http_get(h, "/status").await;
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_str(&body).expect("status is JSON");
        assert_eq!(v["node_id"], n.node_id().0.as_str());
        assert_eq!(v["volumes"].as_array().map(Vec::len), Some(2));
        assert_eq!(v["replicas"]["Finalized"], 1);
        let (code, body) = http_get(h, "/metrics").await;
        assert_eq!(code, 200);
        assert!(
            body.contains("sluice_datanode_written_bytes_total 3000\n"),
            "{body}"
        );
        assert!(body.contains("# TYPE sluice_datanode_block_file_writes_total counter"));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_node_refuses_ops_until_it_registers_then_serves_and_reports() {
    within(30, async {
        let spot = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let meta_addr = spot.local_addr().unwrap();
        drop(spot);
        let n = Node::start(meta_addr).await;
        // Without a metadata service the node cannot know whether tokens are demanded: an op
        // waits (socket timeout, 5 s) for the first registration, then is refused.
        let mut c = Client::connect(n.addr()).await;
        let r = c
            .op(write_op(block(31, 1, 0), BlockStage::Create, vec![]))
            .await;
        assert_eq!(r.status, Status::ErrorAccessToken, "{r:?}");
        // An op waiting when the metadata service appears (handing out no keys: tokens off)
        // is served once the node registers.
        let mut c = Client::connect(n.addr()).await;
        let waiting = tokio::spawn(async move {
            let r = c
                .op(write_op(block(30, 1, 0), BlockStage::Create, vec![]))
                .await;
            r.status
        });
        let (_, meta) = fake_meta_on(meta_addr).await;
        assert_eq!(waiting.await.unwrap(), Status::Success);
        let data = random_bytes(9000, 2);
        write_block(n.addr(), vec![], block(31, 1, 0), &data).await;
        let (_, got) = read_block(n.addr(), block(31, 1, 0), 0, u64::MAX).await;
        assert_eq!(got, data, "the data path works once registered");
        let id = n.node_id();
        wait_for(
            Duration::from_secs(15),
            "registration and a block report",
            || meta.last_report(&id).is_some(),
        )
        .await;
        wait_for(Duration::from_secs(10), "the Received event", || {
            meta.received(&id, BlockId(31))
        })
        .await;
        assert!(meta
            .log
            .lock()
            .unwrap()
            .registered
            .iter()
            .any(|d| d.node_id == id));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_leaves_files_as_they_are_and_a_restart_finds_them() {
    within(30, async {
        let (meta_addr, _) = fake_meta().await;
        // The direct sink: every acknowledged packet is in the block file when the node dies.
        // (A buffered replica keeps only what it flushed: see tests/batching.rs.)
        let tmp = tempfile::tempdir().unwrap();
        let dirs = vec![tmp.path().join("d1")];
        let cfg = DatanodeConfig {
            write_buffer_enabled: false,
            ..config(meta_addr, &dirs)
        };
        let mut n = Node::start_on(meta_addr, dirs, Some(cfg)).await;
        let data = random_bytes(100_000, 3);
        write_block(n.addr(), vec![], block(32, 1, 0), &data).await;
        let mut c = Client::connect(n.addr()).await;
        assert_eq!(
            c.op(write_op(block(33, 1, 0), BlockStage::Create, vec![]))
                .await
                .status,
            Status::Success
        );
        let seq = send_data(&mut c, &data[..70_000], 0, 0).await;
        expect_acks(&mut c, seq as usize, 1).await;
        n.dn.take().unwrap().kill();
        assert!(
            c.next().await.is_none(),
            "the killed node's connections close"
        );
        let n = Node::start_on(meta_addr, n.dirs.clone(), None).await;
        let (_, got) = read_block(n.addr(), block(32, 1, 0), 0, u64::MAX).await;
        assert_eq!(got, data);
        let mut q = Client::connect(n.addr()).await;
        let rep = q
            .op(Op::ReplicaInfo(ReplicaInfoOp {
                block: block(33, 1, 0),
            }))
            .await
            .replica
            .unwrap();
        assert_eq!((rep.state, rep.bytes_on_disk), (ReplicaState::Rwr, 70_000));
        drop(tmp);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_recovery_stops_a_still_connected_writer_and_continues() {
    within(30, async {
        let (meta_addr, meta) = fake_meta().await;
        let n = Node::start(meta_addr).await;
        let data = random_bytes(200_000, 4);
        let mut old = Client::connect(n.addr()).await;
        assert_eq!(old.op(write_op(block(34, 1, 0), BlockStage::Create, vec![])).await.status, Status::Success);
        let seq = send_data(&mut old, &data[..100_000], 0, 0).await;
        expect_acks(&mut old, seq as usize, 1).await;
        // The old pipeline is still connected when the writer rebuilds it under gs 2.
        let mut op = write_op(block(34, 1, 100_000), BlockStage::StreamingRecovery, vec![]);
        if let Op::WriteBlock(ref mut o) = op {
            o.latest_gen_stamp = GenerationStamp(2);
        }
        let mut c = Client::connect(n.addr()).await;
        let r = c.op(op).await;
        assert_eq!(r.status, Status::Success, "{}", r.message);
        assert!(old.next().await.is_none(), "the old writer was stopped");
        let start = 100_000 / 512 * 512;
        let seq = send_data(&mut c, &data, start, 0).await;
        c.packet(seq, data.len() as u64, &[], true, false).await;
        expect_acks(&mut c, seq as usize + 1, 1).await;
        let (_, got) = read_block(n.addr(), block(34, 2, 0), 0, u64::MAX).await;
        assert_eq!(got, data);
        let id = n.node_id();
        wait_for(Duration::from_secs(10), "Received with the new generation stamp", || {
            meta.log.lock().unwrap().events.iter().any(|(who, e)| {
                *who == id
                    && matches!(e, sluice_common::rpc::ReplicaEvent::Received(b)
                        if b.id == BlockId(34) && b.gen_stamp == GenerationStamp(2) && b.num_bytes == 200_000)
            })
        })
        .await;
        let mut q = Client::connect(n.addr()).await;
        let stale = q.op(Op::ReadBlock(ReadBlockOp { block: block(34, 3, 0), offset: 0, length: 1, piece_size: 0 })).await;
        assert_eq!(stale.status, Status::ErrorStaleGenStamp);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_is_prompt_with_a_stalled_reader_and_flushes_an_open_writer() {
    within(40, async {
        let (meta_addr, _) = fake_meta().await;
        let tmp = tempfile::tempdir().unwrap();
        let dirs = vec![tmp.path().join("d")];
        let mut cfg = config(meta_addr, &dirs);
        cfg.socket_timeout = sluice_common::config::HumanDuration::secs(30);
        let mut n = Node::start_on(meta_addr, dirs.clone(), Some(cfg.clone())).await;
        let big = random_bytes(48 << 20, 5);
        write_block(n.addr(), vec![], block(35, 1, 0), &big).await;
        // A streaming reader that never reads: the DataNode blocks on a full socket.
        let mut stalled = Client::connect(n.addr()).await;
        let r = stalled
            .op(Op::ReadBlock(ReadBlockOp {
                block: block(35, 1, 0),
                offset: 0,
                length: u64::MAX,
                piece_size: 0,
            }))
            .await;
        assert_eq!(r.status, Status::Success);
        // A writer in the middle of its block.
        let mut w = Client::connect(n.addr()).await;
        assert_eq!(
            w.op(write_op(block(36, 1, 0), BlockStage::Create, vec![]))
                .await
                .status,
            Status::Success
        );
        let seq = send_data(&mut w, &big[..300_000], 0, 0).await;
        expect_acks(&mut w, seq as usize, 1).await;
        // Wait until the stream is stuck on the full socket (no piece sent for a while).
        let m = n.dn().metrics();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let before = m.pieces_sent.get();
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            if before > 0 && m.pieces_sent.get() == before {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the stream never stalled"
            );
        }
        let t = std::time::Instant::now();
        n.stop().await;
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "stop took {:?}",
            t.elapsed()
        );
        let n = Node::start_on(meta_addr, dirs, Some(cfg)).await;
        let mut q = Client::connect(n.addr()).await;
        let rep = q
            .op(Op::ReplicaInfo(ReplicaInfoOp {
                block: block(36, 1, 0),
            }))
            .await
            .replica
            .unwrap();
        assert_eq!((rep.state, rep.bytes_on_disk), (ReplicaState::Rwr, 300_000));
        drop(tmp);
    })
    .await
}
