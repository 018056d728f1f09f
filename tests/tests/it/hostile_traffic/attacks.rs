//! The attacks of the hostile-input suite, port by port. Each sends its traffic, checks that the
//! connection ends (after a typed error where the protocol has one) within a bound, and calls
//! [`Sound::check`]. Frames are made with the project's own encoders (`FrameCodec`, the
//! tarpc transport of `sluice_common::rpc`); a malformed frame is a valid one with one byte
//! changed or cut short.

use super::{send_raw, Sound, DN_SOCKET_TIMEOUT, HTTP_TIMEOUT, RPC_IDLE};
use bytes::{Bytes, BytesMut};
use futures::SinkExt;
use sluice_common::frame::{Frame, FrameCodec, PREFIX_LEN};
use sluice_common::proto::{
    BlockStage, InitReplicaRecoveryOp, Message, Op, PacketHeader, PipelineAck, ReadBlockOp,
    ReadEnd, TransferBlockOp, UpdateReplicaOp, WriteBlockOp, PROTOCOL_VERSION,
};
use sluice_common::rpc::{self, CreateOptions, LocatedBlock, CLIENT_PREAMBLE, DATANODE_PREAMBLE};
use sluice_common::{checksum, DatanodeId, ExtendedBlock, GenerationStamp, Status};
use sluice_tests::raw::RawConn;
use sluice_tests::{random_bytes, MiniCluster};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::{Decoder, Encoder};

/// How long a refusal that needs no timeout may take (a loaded 2-core machine included).
const AT_ONCE: Duration = Duration::from_secs(2);

pub(super) async fn all(c: &MiniCluster, sound: &Sound) {
    data_port_malformed(c, sound).await;
    data_port_out_of_order(c, sound).await;
    data_port_bad_packets(c, sound).await;
    data_port_reads_past_the_end(c, sound).await;
    destructive_without_token(c, sound).await;
    metadata_rpc(c, sound).await;
    http_ports(c, sound).await;
}

/// Reads until the peer closes `s`, which must happen within `bound`; what it sent.
async fn closed_within(mut s: TcpStream, bound: Duration, what: &str) -> Vec<u8> {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    if tokio::time::timeout(bound, read).await.is_err() {
        let head = String::from_utf8_lossy(&got[..got.len().min(300)]).to_string();
        panic!("{what}: connection still open after {bound:?}, having answered {head:?}");
    }
    tracing::info!("{what}: closed after {:?}", t0.elapsed());
    got
}

/// The frames a DataNode answered with.
fn frames(answer: &[u8]) -> Vec<Message> {
    let mut codec = FrameCodec::<Message>::default();
    let mut src = BytesMut::from(answer);
    let mut out = Vec::new();
    while let Ok(Some(f)) = codec.decode(&mut src) {
        out.push(f.header);
    }
    out
}

/// The error status a DataNode answered before closing (an `OpResponse`, or an ack naming it).
fn error_status(answer: &[u8], what: &str) -> Status {
    match frames(answer).first() {
        Some(Message::OpResponse(r)) if r.status != Status::Success => r.status,
        Some(Message::Ack(a)) if a.first_failure().is_some() => a.replies[0],
        other => panic!("{what}: expected an error status, got {other:?}"),
    }
}

fn wire(frames: Vec<Frame<Message>>) -> Vec<u8> {
    let mut out = BytesMut::new();
    let mut codec = FrameCodec::<Message>::default();
    for f in frames {
        codec.encode(f, &mut out).unwrap();
    }
    out.to_vec()
}

fn op(op: Op) -> Frame<Message> {
    Frame::new(Message::Op {
        version: PROTOCOL_VERSION,
        op,
        token: None,
    })
}

fn dn_addr(c: &MiniCluster, i: usize) -> String {
    c.datanode(i).unwrap().data_addr().to_string()
}

async fn first_block(c: &MiniCluster, path: &str) -> LocatedBlock {
    let fs = c.client().await.unwrap();
    fs.get_block_locations(path).await.unwrap().blocks[0].clone()
}

async fn data_port_malformed(c: &MiniCluster, sound: &Sound) {
    let dn = dn_addr(c, 0);
    let silent = DN_SOCKET_TIMEOUT + AT_ONCE;
    let lb = first_block(c, "/pre/a").await;
    let read = wire(vec![op(Op::ReadBlock(ReadBlockOp {
        block: lb.block,
        offset: 0,
        length: u64::MAX,
        piece_size: 0,
    }))]);

    let s = send_raw(&dn, &random_bytes(4096, 99), false).await;
    closed_within(s, silent, "data: garbage").await;
    sound.check(c, "data: garbage").await;

    for announced in [u32::MAX, (16 << 20) + 1] {
        let mut bytes = announced.to_be_bytes().to_vec();
        bytes.extend_from_slice(&random_bytes(1000, 5));
        let what = format!("data: a prefix announcing {announced} bytes");
        let answer = closed_within(send_raw(&dn, &bytes, false).await, AT_ONCE, &what).await;
        let status = error_status(&answer, &what);
        assert_eq!(status, Status::ErrorFrameTooLarge, "{what}");
        sound.check(c, &what).await;
    }

    // 16 MiB announced (the maximum), 64 KiB sent, then nothing.
    let mut bytes = (16u32 << 20).to_be_bytes().to_vec();
    bytes.extend_from_slice(&[0u8; 64 << 10]);
    let s = send_raw(&dn, &bytes, false).await;
    closed_within(s, silent, "data: a 16 MiB frame cut short").await;
    sound.check(c, "data: a 16 MiB frame cut short").await;

    let cut = &read[..read.len() - 5];
    let what = "data: a truncated op, then end of stream";
    let answer = closed_within(send_raw(&dn, cut, true).await, AT_ONCE, what).await;
    assert_eq!(error_status(&answer, what), Status::ErrorBadFrame, "{what}");
    sound.check(c, what).await;
    let s = send_raw(&dn, cut, false).await;
    closed_within(s, silent, "data: a truncated op, then silence").await;
    sound.check(c, "data: a truncated op, then silence").await;

    // One header byte changed: an unknown message, an unknown op.
    for (at, what) in [(0, "data: an unknown message"), (2, "data: an unknown op")] {
        let mut bad = read.clone();
        bad[PREFIX_LEN + at] = 0x7f;
        let answer = closed_within(send_raw(&dn, &bad, false).await, AT_ONCE, what).await;
        assert_eq!(error_status(&answer, what), Status::ErrorBadFrame, "{what}");
        sound.check(c, what).await;
    }
}

async fn data_port_out_of_order(c: &MiniCluster, sound: &Sound) {
    let dn = dn_addr(c, 1);
    let lb = first_block(c, "/pre/b").await;
    let packet = PacketHeader {
        seqno: 0,
        offset_in_block: 0,
        data_len: 0,
        last: true,
        sync: false,
    };
    let cases = [
        (
            "data: a packet before any set-up",
            Frame::new(Message::Packet(packet)),
            Status::ErrorInvalid,
        ),
        (
            "data: an ack where an op is expected",
            Frame::new(Message::Ack(PipelineAck {
                seqno: 0,
                replies: vec![Status::Success],
            })),
            Status::ErrorInvalid,
        ),
        (
            "data: an answer where an op is expected",
            Frame::new(Message::ReadEnd(ReadEnd {
                status: Status::Success,
                message: String::new(),
            })),
            Status::ErrorInvalid,
        ),
        (
            "data: another protocol version",
            Frame::new(Message::Op {
                version: PROTOCOL_VERSION + 100,
                op: Op::ReplicaInfo(sluice_common::proto::ReplicaInfoOp { block: lb.block }),
                token: lb.token.clone(),
            }),
            Status::ErrorVersion,
        ),
    ];
    for (what, frame, status) in cases {
        let s = send_raw(&dn, &wire(vec![frame]), false).await;
        let answer = closed_within(s, AT_ONCE, what).await;
        assert_eq!(error_status(&answer, what), status, "{what}");
        sound.check(c, what).await;
    }
}

/// A file of the attacker's own (any client may make one) and its first block, with a genuine
/// write token: the way to a pipeline whose packets the attacker then gets wrong.
async fn own_block(c: &MiniCluster, sound: &Sound, name: &str) -> LocatedBlock {
    let meta = rpc::connect_client_protocol(c.metadata_addr())
        .await
        .unwrap();
    let ctx = || rpc::context_with_timeout(Duration::from_secs(10));
    let path = format!("/own/{name}");
    let opts = CreateOptions {
        client_name: "attacker".into(),
        overwrite: true,
        create_parent: true,
        replication: 0,
        block_size: 0,
    };
    meta.create(ctx(), path.clone(), opts)
        .await
        .unwrap()
        .unwrap();
    let lb = meta
        .add_block(ctx(), path, "attacker".into(), None, vec![])
        .await
        .unwrap()
        .unwrap();
    sound.own_block(lb.block.id.0);
    lb
}

fn data_packet(seqno: i64, offset: u64, data: &[u8]) -> Frame<Message> {
    let mut payload = checksum::compute(data, 512);
    payload.extend_from_slice(data);
    Frame::with_payload(
        Message::Packet(PacketHeader {
            seqno,
            offset_in_block: offset,
            data_len: data.len() as u32,
            last: false,
            sync: false,
        }),
        Bytes::from(payload),
    )
}

async fn data_port_bad_packets(c: &MiniCluster, sound: &Sound) {
    let data = random_bytes(1024, 11);
    let mut corrupt = data_packet(1, 1024, &data);
    corrupt.payload = {
        let mut p = corrupt.payload.to_vec();
        *p.last_mut().unwrap() ^= 1;
        Bytes::from(p)
    };
    let cases = [
        (
            "data: a packet out of sequence",
            data_packet(5, 1024, &data),
        ),
        (
            "data: a packet past the bytes received",
            data_packet(1, 1 << 30, &data),
        ),
        (
            "data: a packet at offset u64::MAX",
            data_packet(1, u64::MAX - 511, &data),
        ),
        ("data: a packet whose checksum is wrong", corrupt),
    ];
    for (i, (what, bad)) in cases.into_iter().enumerate() {
        let lb = own_block(c, sound, &format!("p{i}")).await;
        let mut conn = RawConn::connect(&lb.locations[0].data_addr)
            .await
            .unwrap()
            .with_token(lb.token.clone());
        conn.send_op(Op::WriteBlock(WriteBlockOp {
            block: lb.block,
            stage: BlockStage::Create,
            targets: vec![],
            client_name: "attacker".into(),
            bytes_per_checksum: 512,
            latest_gen_stamp: lb.block.gen_stamp,
        }))
        .await
        .unwrap();
        let r = conn.op_response().await.unwrap();
        assert_eq!(r.status, Status::Success, "{what}: set-up {r:?}");
        let first = wire(vec![data_packet(0, 0, &data), bad]);
        conn.socket().write_all(&first).await.unwrap();
        let mut answer = Vec::new();
        let t0 = Instant::now();
        conn.socket().read_to_end(&mut answer).await.ok();
        assert!(
            t0.elapsed() < AT_ONCE,
            "{what}: closed after {:?}",
            t0.elapsed()
        );
        let acks = frames(&answer);
        let refused = acks
            .iter()
            .any(|m| matches!(m, Message::Ack(a) if a.seqno != 0 && a.first_failure().is_some()));
        assert!(refused, "{what}: no error ack, got {acks:?}");
        sound.check(c, what).await;
    }
}

/// Reads with a genuine token, past the end of the replica: a typed error (or, for a length
/// past the end, only what is there), and the DataNode serves the next op on the same
/// connection.
async fn data_port_reads_past_the_end(c: &MiniCluster, sound: &Sound) {
    let lb = first_block(c, "/pre/b").await;
    let read = |offset, length| {
        Op::ReadBlock(ReadBlockOp {
            block: lb.block,
            offset,
            length,
            piece_size: 0,
        })
    };
    let chunk = |offset, length| {
        Op::ReadChunk(sluice_common::proto::ReadChunkOp {
            block: lb.block,
            offset,
            length,
        })
    };
    let past = Status::ErrorOutOfRange;
    let cases = [
        ("data: ReadBlock at 2^40", read(1 << 40, u64::MAX), past),
        (
            "data: ReadBlock at u64::MAX",
            read(u64::MAX, u64::MAX),
            past,
        ),
        (
            "data: ReadChunk at u64::MAX - 10",
            chunk(u64::MAX - 10, u64::MAX),
            past,
        ),
        ("data: ReadChunk at 2^40", chunk(1 << 40, 512), past),
        // Clipped to the replica: one chunk of what is there.
        (
            "data: ReadChunk of u64::MAX bytes",
            chunk(0, u64::MAX),
            Status::Success,
        ),
    ];
    for (what, op, status) in cases {
        for dn in &lb.locations {
            let mut conn = RawConn::connect(&dn.data_addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            conn.send_op(op.clone()).await.unwrap();
            let r = tokio::time::timeout(AT_ONCE, conn.op_response())
                .await
                .unwrap_or_else(|_| panic!("{what}: no answer within {AT_ONCE:?}"))
                .unwrap_or_else(|e| panic!("{what}: {e:#}"));
            assert_eq!(r.status, status, "{what}: {r:?}");
            if status == Status::Success {
                match conn.next().await.unwrap().map(|f| f.header) {
                    Some(Message::Chunk(h)) => {
                        assert!(u64::from(h.data_len) <= lb.block.num_bytes, "{what}: {h:?}")
                    }
                    other => panic!("{what}: expected a chunk, got {other:?}"),
                }
            }
            let info = tokio::time::timeout(AT_ONCE, conn.replica_info(lb.block)).await;
            match info {
                Ok(Ok(r)) => assert_eq!(r.status, Status::Success, "{what}: then {r:?}"),
                // Or the connection was closed after the error: both are fine.
                Ok(Err(_)) => {}
                Err(_) => panic!("{what}: neither answered nor closed"),
            }
        }
        sound.check(c, what).await;
    }
}

async fn refused(addr: &str, frame: Frame<Message>, what: &str) {
    let s = send_raw(addr, &wire(vec![frame]), false).await;
    let answer = closed_within(s, AT_ONCE, what).await;
    assert_eq!(
        error_status(&answer, what),
        Status::ErrorAccessToken,
        "{what}"
    );
}

async fn destructive_without_token(c: &MiniCluster, sound: &Sound) {
    let lb = first_block(c, "/pre/a").await;
    for dn in &lb.locations {
        let create = op(Op::WriteBlock(WriteBlockOp {
            block: ExtendedBlock::new(lb.block.id, GenerationStamp(u64::MAX), 0),
            stage: BlockStage::Create,
            targets: vec![],
            client_name: "attacker".into(),
            bytes_per_checksum: 512,
            latest_gen_stamp: GenerationStamp(u64::MAX),
        }));
        refused(&dn.data_addr, create, "WriteBlock Create, stamp u64::MAX").await;
        let rid = GenerationStamp(lb.block.gen_stamp.0 + 1);
        let init = op(Op::InitReplicaRecovery(InitReplicaRecoveryOp {
            block: lb.block,
            recovery_id: rid,
        }));
        refused(&dn.data_addr, init, "InitReplicaRecovery").await;
        let update = op(Op::UpdateReplicaUnderRecovery(UpdateReplicaOp {
            block: lb.block,
            recovery_id: rid,
            new_length: 0,
        }));
        refused(&dn.data_addr, update, "UpdateReplicaUnderRecovery(0)").await;
    }
    sound.check(c, "destructive ops on a finalized block").await;

    // The live writer's block: recovery would stop the writer.
    let fs = c.client().await.unwrap();
    let live = fs.get_block_locations("/live/w").await.unwrap();
    if let Some(last) = live.blocks.last() {
        for dn in &last.locations {
            let init = op(Op::InitReplicaRecovery(InitReplicaRecoveryOp {
                block: last.block,
                recovery_id: GenerationStamp(last.block.gen_stamp.0 + 1),
            }));
            refused(&dn.data_addr, init, "InitReplicaRecovery of a live block").await;
        }
    }
    sound.check(c, "recovery of the live writer's block").await;

    // A copy of everything to an address the attacker chose.
    let (trap, attacker) = sluice_tests::raw::trap("attacker").await.unwrap();
    let mut all = lb.block;
    all.num_bytes = u64::MAX;
    let transfer = op(Op::TransferBlock(TransferBlockOp {
        block: all,
        targets: vec![attacker],
        stage: BlockStage::TransferFinalized,
        client_name: "attacker".into(),
    }));
    refused(
        &lb.locations[0].data_addr,
        transfer,
        "TransferBlock to the attacker",
    )
    .await;
    let dialled = sluice_tests::raw::dialled(&trap, Duration::from_millis(300)).await;
    assert!(!dialled, "a DataNode dialled the attacker's address");
    sound
        .check(c, "TransferBlock(u64::MAX) to the attacker")
        .await;

    // A registration for an existing node id, without the cluster secret.
    let before = fs.cluster_report().await.unwrap().datanodes;
    let r = rpc::connect_datanode_protocol(c.metadata_addr()).await;
    assert!(
        r.is_err(),
        "a DataNode-protocol connection without the secret"
    );
    let mut forged = DATANODE_PREAMBLE.to_vec();
    forged.extend_from_slice(&random_bytes(100, 13));
    let s = send_raw(&c.metadata_addr().to_string(), &forged, false).await;
    closed_within(s, AT_ONCE, "rpc: a forged DataNode proof").await;
    let after = fs.cluster_report().await.unwrap().datanodes;
    let ids = |r: &[sluice_common::rpc::DatanodeReport]| -> Vec<DatanodeId> {
        r.iter().map(|d| d.id.clone()).collect()
    };
    assert_eq!(
        ids(&after),
        ids(&before),
        "a DataNode's registration changed"
    );
    sound.check(c, "register without the secret").await;
}

async fn metadata_rpc(c: &MiniCluster, sound: &Sound) {
    let addr = c.metadata_addr().to_string();
    let silent = RPC_IDLE * 2 + AT_ONCE;
    let with_preamble = |rest: &[u8]| {
        let mut v = CLIENT_PREAMBLE.to_vec();
        v.extend_from_slice(rest);
        v
    };
    let mut garbage_frame = 100u32.to_be_bytes().to_vec();
    garbage_frame.extend_from_slice(&[0xff; 100]);
    let mut max = u32::MAX.to_be_bytes().to_vec();
    max.extend_from_slice(&random_bytes(1000, 17));
    let cases: [(&str, Vec<u8>, Duration); 5] = [
        ("rpc: garbage", random_bytes(4096, 15), AT_ONCE),
        (
            "rpc: a frame of garbage",
            with_preamble(&garbage_frame),
            AT_ONCE,
        ),
        (
            "rpc: a prefix announcing 2^32-1 bytes",
            with_preamble(&max),
            AT_ONCE,
        ),
        (
            "rpc: a second preamble where a frame is expected",
            with_preamble(&CLIENT_PREAMBLE),
            AT_ONCE,
        ),
        (
            "rpc: a truncated frame, then silence",
            with_preamble(&garbage_frame[..50]),
            silent,
        ),
    ];
    for (what, bytes, bound) in cases {
        closed_within(send_raw(&addr, &bytes, false).await, bound, what).await;
        sound.check(c, what).await;
    }

    // A well-formed tarpc request naming an op the service does not have.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&CLIENT_PREAMBLE).await.unwrap();
    let mut echo = [0u8; 4];
    s.read_exact(&mut echo).await.unwrap();
    let mut t = rpc::transport::<_, tarpc::Response<u32>, tarpc::ClientMessage<u32>>(s, 1 << 20);
    let request = tarpc::ClientMessage::Request(tarpc::Request {
        context: rpc::context_with_timeout(Duration::from_secs(10)),
        id: 1,
        message: u32::MAX,
    });
    t.send(request).await.unwrap();
    let what = "rpc: an unknown op";
    let next = tokio::time::timeout(silent, futures::StreamExt::next(&mut t)).await;
    assert!(
        matches!(next, Ok(None | Some(Err(_)))),
        "{what}: answered or still open: {next:?}"
    );
    sound.check(c, what).await;
}

async fn http_ports(c: &MiniCluster, sound: &Sound) {
    let meta = c.metadata_http_addr().unwrap().to_string();
    let dn = c.datanode(2).unwrap().http_addr().to_string();
    let silent = HTTP_TIMEOUT * 2 + AT_ONCE;
    let huge_header = format!(
        "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(200 << 10)
    );
    let cases: [(&str, Vec<u8>, Duration); 4] = [
        ("http: garbage", random_bytes(4096, 19), silent),
        (
            "http: a truncated request head, then silence",
            b"GET /health HTTP/1.1\r\nHost:".to_vec(),
            silent,
        ),
        (
            "http: a body announcing 2^32-1 bytes, cut short",
            b"PUT /webhdfs/v1/own/h?op=CREATE HTTP/1.1\r\nHost: x\r\nContent-Length: 4294967295\r\n\r\nabc"
                .to_vec(),
            silent,
        ),
        ("http: a 200 KiB header", huge_header.into_bytes(), silent),
    ];
    for addr in [&meta, &dn] {
        for (what, bytes, bound) in &cases {
            let what = format!("{what} on {addr}");
            closed_within(send_raw(addr, bytes, false).await, *bound, &what).await;
            sound.check(c, &what).await;
        }
        let url = format!("http://{addr}/webhdfs/v1/pre/a?op=FROBNICATE");
        let r = sluice_tests::http::request("GET", &url, b"").await.unwrap();
        assert_eq!(r.status, 400, "an unknown WebHDFS op on {addr}");
        sound
            .check(c, &format!("http: an unknown op on {addr}"))
            .await;
    }
}
