//! Bounded resources (issue 11) on a DataNode's data port — connections per peer address, idle
//! write set-ups holding write-buffer permits, read-buffer memory — and connections per peer
//! on the metadata RPC port. Each limit is a config key with a default checked here, and a
//! test that fails without its mechanism.

use sluice_common::config::{ByteSize, DatanodeConfig, HumanDuration};
use sluice_common::proto::{
    BlockStage, Message, Op, PacketHeader, ReadBlockOp, ReadChunkOp, WriteBlockOp, HEARTBEAT_SEQNO,
};
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp, Status};
use sluice_tests::raw::RawConn;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, write_all, MiniCluster};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn the_data_port_limits_have_their_documented_defaults() {
    let d = DatanodeConfig::default();
    assert_eq!(d.data_connections_per_peer_max, 1024);
    assert_eq!(d.write_setup_idle_timeout, HumanDuration::secs(10));
    assert_eq!(d.max_transfer_threads, 4096);
    assert_eq!(d.read_buffer_max_bytes, ByteSize::gib(1));
    let m = sluice_common::config::MetadataConfig::default();
    assert_eq!(m.rpc_connections_per_peer_max, 1024);
    assert_eq!(m.rpc_connections_max, 4096);
}

/// A connection to `to` from the local address `from` (any 127.x address is this host's).
async fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from((from, 0))).unwrap();
    s.connect(to).await.unwrap()
}

/// True when the DataNode closes `s` within `within` (it sends nothing unasked).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(within, s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holds_at_most_its_share_of_the_data_port() {
    with_timeout(LIMIT, "per-peer connections", async {
        sluice_tests::init_logging();
        let c = MiniCluster::builder()
            .datanodes(1)
            .replication(1)
            .configure_datanodes(|_, d| d.data_connections_per_peer_max = 4)
            .start()
            .await
            .unwrap();
        c.wait_live(1).await.unwrap();
        let dn = c.datanode(0).unwrap();
        let addr = dn.data_addr();
        let refused = || dn.metrics().connections_refused_per_peer.get();
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(connect_from([127, 0, 0, 2], addr).await);
        }
        // The fifth from the same peer is closed at once, and counted.
        let mut fifth = connect_from([127, 0, 0, 2], addr).await;
        assert!(closed_within(&mut fifth, Duration::from_secs(5)).await);
        assert_eq!(refused(), 1);
        // The four held are still served (open), and another peer is not affected: a client
        // on 127.0.0.1 writes and reads a file through the same DataNode.
        for s in &mut held {
            assert!(!closed_within(s, Duration::from_millis(50)).await);
        }
        let fs = c.client().await.unwrap();
        let data = random_bytes(200_000, 51);
        let opts = sluice_client::WriteOptions {
            replication: Some(1),
            ..Default::default()
        };
        write_all(&fs, "/peer", &data, opts, 10_000).await.unwrap();
        assert!(read_all(&fs, "/peer").await.unwrap() == data);
        // A connection closed gives its place back.
        drop(held.pop());
        wait_until(
            Duration::from_secs(10),
            "the place is given back",
            || async {
                let mut s = connect_from([127, 0, 0, 2], addr).await;
                !closed_within(&mut s, Duration::from_millis(200)).await
            },
        )
        .await;
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_write_set_up_gives_its_write_buffer_back() {
    with_timeout(LIMIT, "idle set-up", async {
        sluice_tests::init_logging();
        // One write buffer (8 MiB of 8 MiB buffers); tokens off, so that a raw set-up needs
        // no metadata service.
        let c = MiniCluster::builder()
            .datanodes(1)
            .replication(1)
            .configure_metadata(|m| m.block_token_enable = false)
            .configure_datanodes(|_, d| {
                d.write_buffer_max_capacity_mb = 8;
                d.write_setup_idle_timeout = HumanDuration::secs(1);
                d.socket_timeout = HumanDuration::secs(60);
            })
            .start()
            .await
            .unwrap();
        c.wait_live(1).await.unwrap();
        let dn = c.datanode(0).unwrap();
        let buffers = dn.write_buffers();
        assert_eq!(buffers.available_permits(), Some(1));
        let mut conn = RawConn::connect(&dn.data_addr().to_string()).await.unwrap();
        conn.send_op(Op::WriteBlock(WriteBlockOp {
            block: ExtendedBlock::new(BlockId(1 << 41), GenerationStamp(7), 0),
            stage: BlockStage::Create,
            targets: vec![],
            client_name: "idle".into(),
            bytes_per_checksum: 512,
            latest_gen_stamp: GenerationStamp(7),
        }))
        .await
        .unwrap();
        let r = conn.op_response().await.unwrap();
        assert_eq!(r.status, Status::Success, "{r:?}");
        assert_eq!(
            buffers.available_permits(),
            Some(0),
            "the set-up holds the buffer"
        );
        // Heartbeats only: they keep the socket alive but are no data.
        let beat = Message::Packet(PacketHeader {
            seqno: HEARTBEAT_SEQNO,
            offset_in_block: 0,
            data_len: 0,
            last: false,
            sync: false,
        });
        conn.send_frame(beat, bytes::Bytes::new()).await.unwrap();
        wait_until(
            Duration::from_secs(10),
            "the idle set-up's permit is back",
            || async { buffers.available_permits() == Some(1) },
        )
        .await;
        assert_eq!(dn.metrics().idle_setups_closed.get(), 1);
        // The connection was closed (after the heartbeat's ack).
        let end = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match conn.next().await {
                    Ok(Some(_)) => continue,
                    _ => return,
                }
            }
        })
        .await;
        assert!(end.is_ok(), "the pipeline was closed");
        // A real write takes the buffer and completes (its first packet comes at once).
        let fs = c.client().await.unwrap();
        let data = random_bytes(300_000, 52);
        let opts = sluice_client::WriteOptions {
            replication: Some(1),
            ..Default::default()
        };
        write_all(&fs, "/w", &data, opts, 100_000).await.unwrap();
        assert!(read_all(&fs, "/w").await.unwrap() == data);
        assert_eq!(dn.metrics().idle_setups_closed.get(), 1);
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_past_the_read_buffer_cap_are_answered_busy_and_the_client_waits_them_out() {
    with_timeout(LIMIT, "read buffer cap", async {
        sluice_tests::init_logging();
        // Room for two one-piece windows (1 MiB pieces), not for a third nor for read-ahead.
        let c = MiniCluster::builder()
            .datanodes(1)
            .replication(1)
            .block_size(8 << 20)
            .configure_datanodes(|_, d| d.read_buffer_max_bytes = ByteSize::kib(2560))
            .start()
            .await
            .unwrap();
        c.wait_live(1).await.unwrap();
        let fs = c.client().await.unwrap();
        let data = random_bytes(6 << 20, 53);
        let opts = sluice_client::WriteOptions {
            replication: Some(1),
            ..Default::default()
        };
        write_all(&fs, "/big", &data, opts, 1 << 20).await.unwrap();
        let lb = fs.get_block_locations("/big").await.unwrap().blocks[0].clone();
        let dn = c.datanode(0).unwrap();
        let addr = dn.data_addr().to_string();
        let read = Op::ReadBlock(ReadBlockOp {
            block: lb.block,
            offset: 0,
            length: u64::MAX,
            piece_size: 0,
        });
        // Two streams that stop reading hold their windows.
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut conn = RawConn::connect(&addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            conn.send_op(read.clone()).await.unwrap();
            assert_eq!(conn.op_response().await.unwrap().status, Status::Success);
            held.push(conn);
        }
        let gauge = || dn.metrics().read_buffer_bytes.get();
        assert!(gauge() > 2 << 20, "{}", gauge());
        // A third stream and a 1 MiB chunk read are refused at once with ERROR_BUSY.
        let chunk = Op::ReadChunk(ReadChunkOp {
            block: lb.block,
            offset: 0,
            length: 1 << 20,
        });
        for op in [read.clone(), chunk] {
            let mut conn = RawConn::connect(&addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            conn.send_op(op).await.unwrap();
            let r = tokio::time::timeout(Duration::from_secs(5), conn.op_response())
                .await
                .expect("answered at once, not stalled")
                .unwrap();
            assert_eq!(r.status, Status::ErrorBusy, "{r:?}");
            assert!(r.message.contains("read.buffer.max.bytes"), "{}", r.message);
        }
        let busy = dn.metrics().reads_busy.get();
        assert!(busy >= 2, "{busy}");
        // A client read meets a busy DataNode, waits, and completes once the streams go.
        let reader = {
            let fs = c.client().await.unwrap();
            tokio::spawn(async move { read_all(&fs, "/big").await.unwrap() })
        };
        wait_until(
            Duration::from_secs(10),
            "the client met ERROR_BUSY",
            || async { dn.metrics().reads_busy.get() > busy },
        )
        .await;
        drop(held);
        let got = reader.await.unwrap();
        assert!(got == data, "bytes differ");
        wait_until(
            Duration::from_secs(10),
            "read buffers given back",
            || async { gauge() == 0 },
        )
        .await;
        c.shutdown().await;
    })
    .await
}

/// A client-protocol connection from `from`: the preamble sent; true when the service echoed it
/// (admitted), false when it closed the connection.
async fn rpc_admitted(from: [u8; 4], to: SocketAddr, keep: &mut Vec<TcpStream>) -> bool {
    use tokio::io::AsyncWriteExt;
    let mut s = connect_from(from, to).await;
    if s.write_all(&sluice_common::rpc::CLIENT_PREAMBLE)
        .await
        .is_err()
    {
        return false;
    }
    let mut echo = [0u8; 4];
    let r = tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut echo)).await;
    let ok = matches!(r, Ok(Ok(_))) && echo == sluice_common::rpc::CLIENT_PREAMBLE;
    keep.push(s);
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holds_at_most_its_share_of_the_metadata_rpc_port() {
    with_timeout(LIMIT, "rpc per-peer connections", async {
        sluice_tests::init_logging();
        let c = MiniCluster::builder()
            .datanodes(1)
            .replication(1)
            .configure_metadata(|m| m.rpc_connections_per_peer_max = 3)
            .start()
            .await
            .unwrap();
        c.wait_live(1).await.unwrap();
        let addr = c.metadata_addr();
        let mut held = Vec::new();
        for i in 0..3 {
            assert!(
                rpc_admitted([127, 0, 0, 2], addr, &mut held).await,
                "connection {i}"
            );
        }
        assert!(
            !rpc_admitted([127, 0, 0, 2], addr, &mut held).await,
            "a fourth from the same peer is closed"
        );
        // Another peer (the client and the DataNode on 127.0.0.1) is not affected.
        let fs = c.client().await.unwrap();
        fs.mkdirs("/rpc-peer", true).await.unwrap();
        // A closed connection gives its place back.
        held.clear();
        wait_until(
            Duration::from_secs(10),
            "the place is given back",
            || async {
                let mut keep = Vec::new();
                rpc_admitted([127, 0, 0, 2], addr, &mut keep).await
            },
        )
        .await;
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holds_at_most_its_share_of_each_http_port() {
    with_timeout(LIMIT, "http per-peer connections", async {
        sluice_tests::init_logging();
        assert_eq!(DatanodeConfig::default().http_connections_per_peer_max, 256);
        let meta_default = sluice_common::config::MetadataConfig::default();
        assert_eq!(meta_default.http_connections_per_peer_max, 256);
        let c = MiniCluster::builder()
            .datanodes(1)
            .replication(1)
            .configure_metadata(|m| m.http_connections_per_peer_max = 3)
            .configure_datanodes(|_, d| d.http_connections_per_peer_max = 3)
            .start()
            .await
            .unwrap();
        c.wait_live(1).await.unwrap();
        let ports = [
            ("metadata", c.metadata_http_addr().unwrap()),
            ("datanode", c.datanode(0).unwrap().http_addr()),
        ];
        for (name, addr) in ports {
            let mut held = Vec::new();
            for i in 0..3 {
                let status = http_status([127, 0, 0, 2], addr, &mut held).await;
                assert_eq!(status.as_deref(), Some("200"), "{name}: connection {i}");
            }
            let status = http_status([127, 0, 0, 2], addr, &mut held).await;
            assert_eq!(
                status.as_deref(),
                Some("503"),
                "{name}: a fourth from the same peer is refused"
            );
            // The refused connection is closed after its answer.
            let mut rest = Vec::new();
            let closed = tokio::time::timeout(
                Duration::from_secs(5),
                held.last_mut().unwrap().read_to_end(&mut rest),
            )
            .await;
            assert!(closed.is_ok(), "{name}: the refused connection is closed");
            // Another peer is not affected.
            let mut other = Vec::new();
            let status = http_status([127, 0, 0, 3], addr, &mut other).await;
            assert_eq!(status.as_deref(), Some("200"), "{name}: another peer");
            // Closed connections give their places back.
            held.clear();
            wait_until(Duration::from_secs(10), "places given back", || async {
                let mut keep = Vec::new();
                http_status([127, 0, 0, 2], addr, &mut keep)
                    .await
                    .as_deref()
                    == Some("200")
            })
            .await;
        }
        c.shutdown().await;
    })
    .await
}

/// `GET /health` on a connection from `from`; the status code of the answer (the connection
/// kept in `keep`), `None` if the connection closed first.
async fn http_status(from: [u8; 4], to: SocketAddr, keep: &mut Vec<TcpStream>) -> Option<String> {
    use tokio::io::AsyncWriteExt;
    let mut s = connect_from(from, to).await;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: sluice\r\n\r\n")
        .await
        .ok()?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n") {
        let r = tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut byte)).await;
        if !matches!(r, Ok(Ok(_))) {
            return None;
        }
        head.push(byte[0]);
    }
    keep.push(s);
    let line = String::from_utf8_lossy(&head).to_string();
    line.split_whitespace().nth(1).map(str::to_string)
}
