//! Memory under hostile connections, measured on nodes run as processes (the in-process
//! MiniCluster shares one RSS with the test and its client): a DataNode and the metadata service
//! are held by hundreds of connections sending partial oversized frames, prefixes of 2^32-1,
//! write set-ups without a token followed by data, RPC frames announcing 200 MiB and unfinished
//! HTTP heads; each process's peak RSS (`VmHWM`) stays within a bound, every connection is
//! closed within the timeouts, and the cluster serves afterwards.

use sluice_client::WriteOptions;
use sluice_common::frame::{Frame, FrameCodec};
use sluice_common::proto::{BlockStage, Message, Op, PacketHeader, WriteBlockOp, PROTOCOL_VERSION};
use sluice_common::rpc::CLIENT_PREAMBLE;
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp};
use sluice_tests::process::{memory, ProcessCluster};
use sluice_tests::{random_bytes, read_all, with_timeout, write_all};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Encoder;

const LIMIT: Duration = Duration::from_secs(90);
const MIB: u64 = 1024 * 1024;
/// Most a node's peak RSS may grow under the whole attack. What the traffic may legitimately
/// cost: 64 connections × (256 KiB received + one 64 KiB growth step) of partial frames on the
/// DataNode (≈ 24 MiB with allocator slack), nothing on the refused ones.
const BOUND: u64 = 96 * MIB;

/// A token-less `WriteBlock Create` followed by a 64 KiB packet, as one write.
fn setup_and_packet(i: u64) -> Vec<u8> {
    let mut out = bytes::BytesMut::new();
    let mut codec = FrameCodec::<Message>::default();
    let op = Message::Op {
        version: PROTOCOL_VERSION,
        op: Op::WriteBlock(WriteBlockOp {
            block: ExtendedBlock::new(BlockId((1 << 40) + i), GenerationStamp(1), 0),
            stage: BlockStage::Create,
            targets: vec![],
            client_name: "attacker".into(),
            bytes_per_checksum: 512,
            latest_gen_stamp: GenerationStamp(1),
        }),
        token: None,
    };
    codec.encode(Frame::new(op), &mut out).unwrap();
    let data = random_bytes(64 << 10, i);
    let mut payload = sluice_common::checksum::compute(&data, 512);
    payload.extend_from_slice(&data);
    let packet = Message::Packet(PacketHeader {
        seqno: 0,
        offset_in_block: 0,
        data_len: data.len() as u32,
        last: false,
        sync: false,
    });
    codec
        .encode(Frame::with_payload(packet, payload.into()), &mut out)
        .unwrap();
    out.to_vec()
}

/// Opens a connection to `addr` and sends `bytes` (the peer may close before taking them all).
async fn hold(addr: &str, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(bytes).await;
    s
}

/// Waits until the peer has closed every connection of `held`.
async fn all_closed(held: Vec<TcpStream>) {
    let reads = held.into_iter().map(|mut s| async move {
        let mut buf = [0u8; 4096];
        while !matches!(s.read(&mut buf).await, Ok(0) | Err(_)) {}
    });
    futures::future::join_all(reads).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_memory_stays_bounded_under_hostile_connections() {
    with_timeout(LIMIT, "memory under hostile connections", async {
        sluice_tests::init_logging();
        let c = ProcessCluster::builder(crate::binaries())
            .datanodes(1)
            .datanode_env("SLUICE_DATANODE__SOCKET__TIMEOUT", "3s")
            .datanode_env("SLUICE_DATANODE__HTTP__REQUEST__TIMEOUT", "2s")
            .start()
            .await
            .unwrap();
        let fs = c.client().await.unwrap();
        let opts = WriteOptions {
            create_parent: true,
            ..WriteOptions::default()
        };
        let data = random_bytes(4 << 20, 1);
        write_all(&fs, "/warm", &data, opts.clone(), 64 << 10)
            .await
            .unwrap();
        assert!(read_all(&fs, "/warm").await.unwrap() == data);
        let (dn_pid, meta_pid) = (c.datanode_pid(0).unwrap(), c.metadata_pid().unwrap());
        let (dn_before, meta_before) = (memory(dn_pid).unwrap(), memory(meta_pid).unwrap());

        let dn = c.datanode_data_addr(0).unwrap().to_string();
        let meta = c.metadata_addr().to_string();
        let mut held = Vec::new();
        for i in 0..64 {
            let mut partial = (16u32 << 20).to_be_bytes().to_vec();
            partial.extend_from_slice(&random_bytes(256 << 10, i));
            held.push(hold(&dn, &partial).await);
            held.push(hold(&dn, &u32::MAX.to_be_bytes()).await);
            let mut rpc = CLIENT_PREAMBLE.to_vec();
            rpc.extend_from_slice(&(200u32 << 20).to_be_bytes());
            rpc.extend_from_slice(&random_bytes(256 << 10, 100 + i));
            held.push(hold(&meta, &rpc).await);
        }
        for i in 0..32 {
            held.push(hold(&dn, &setup_and_packet(i)).await);
        }
        let http = c.root().join("dn0.1.ready");
        let http = std::fs::read_to_string(http).unwrap();
        let http = http
            .lines()
            .find_map(sluice_common::ready::Ready::parse)
            .and_then(|r| r.addresses.get("http").copied())
            .unwrap()
            .to_string();
        let head = format!("GET /health HTTP/1.1\r\nX-Big: {}", "a".repeat(100 << 10));
        for _ in 0..32 {
            held.push(hold(&http, head.as_bytes()).await);
        }
        // Every connection ends within the socket and request timeouts; by then the nodes
        // have read all they were going to.
        all_closed(held).await;

        let (dn_after, meta_after) = (memory(dn_pid).unwrap(), memory(meta_pid).unwrap());
        tracing::info!(
            ?dn_before,
            ?dn_after,
            ?meta_before,
            ?meta_after,
            "node memory"
        );
        let grew = |after: u64, before: u64| after.saturating_sub(before);
        assert!(
            grew(dn_after.peak, dn_before.peak) < BOUND,
            "DataNode peak RSS {} MiB -> {} MiB",
            dn_before.peak / MIB,
            dn_after.peak / MIB
        );
        assert!(
            grew(meta_after.peak, meta_before.peak) < BOUND,
            "metadata peak RSS {} MiB -> {} MiB",
            meta_before.peak / MIB,
            meta_after.peak / MIB
        );
        // Both still serve, and the warm-up file is exact.
        let fs = c.client().await.unwrap();
        write_all(&fs, "/after", &data[..100_000], opts, 10_000)
            .await
            .unwrap();
        assert!(read_all(&fs, "/after").await.unwrap() == data[..100_000]);
        assert!(read_all(&fs, "/warm").await.unwrap() == data);
    })
    .await
}
