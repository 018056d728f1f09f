//! Bad input on the data port: each gets an error status where one can be sent, then the
//! connection closes; the DataNode keeps serving and stored data does not change.

#![allow(clippy::unwrap_used)]

use crate::support::*;
use bytes::{BufMut, Bytes, BytesMut};
use sluice_common::frame::encode_header;
use sluice_common::proto::*;
use sluice_common::Status;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Sends raw bytes, then returns the status of the `OpResponse` (if any) and whether the
/// DataNode closed the connection afterwards.
async fn raw(addr: std::net::SocketAddr, bytes: &[u8], shutdown: bool) -> (Option<Status>, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    if shutdown {
        s.shutdown().await.unwrap();
    }
    let mut c = {
        let (r, w) = s.into_split();
        let codec = sluice_common::frame::FrameCodec::<Message>::new(16 << 20);
        Client {
            r: tokio_util::codec::FramedRead::new(r, codec.clone()),
            w: tokio_util::codec::FramedWrite::new(w, codec),
        }
    };
    let status = match c.next().await {
        Some(f) => match f.header {
            Message::OpResponse(r) => Some(r.status),
            other => panic!("unexpected {other:?}"),
        },
        None => None,
    };
    let closed = c.next().await.is_none();
    (status, closed)
}

fn frame(header: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_u32((4 + header.len() + payload.len()) as u32);
    b.put_u32(header.len() as u32);
    b.put_slice(header);
    b.put_slice(payload);
    b.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_get_an_error_and_a_closed_connection_and_nothing_else_changes() {
    within(60, async {
        let (meta_addr, _) = fake_meta().await;
        let n = Node::start(meta_addr).await;
        let data = random_bytes(10_000, 7);
        let b = block(10, 1, 0);
        write_block(n.addr(), vec![], b, &data).await;
        let a = n.addr();

        let (s, closed) = raw(a, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false).await;
        assert_eq!(
            (s, closed),
            (Some(Status::ErrorFrameTooLarge), true),
            "garbage"
        );
        let (s, closed) = raw(a, &(5u32 << 20).to_be_bytes(), false).await;
        assert_eq!(
            (s, closed),
            (Some(Status::ErrorFrameTooLarge), true),
            "oversized frame"
        );
        let (s, closed) = raw(a, &[0, 0, 0, 100, 0, 0, 0, 10, 1, 2], true).await;
        assert_eq!(
            (s, closed),
            (Some(Status::ErrorBadFrame), true),
            "truncated frame"
        );
        let (s, closed) = raw(a, &frame(&[0xff, 0xfe, 0xfd], &[]), false).await;
        assert_eq!(
            (s, closed),
            (Some(Status::ErrorBadFrame), true),
            "undecodable header"
        );
        let (s, closed) = raw(a, &[0, 0, 0, 12, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0], false).await;
        assert_eq!(
            (s, closed),
            (Some(Status::ErrorBadFrame), true),
            "header length past the frame"
        );

        let op = Message::Op {
            version: PROTOCOL_VERSION,
            op: Op::ReplicaInfo(ReplicaInfoOp { block: b }),
            token: None,
        };
        let mut h = encode_header(&op).unwrap();
        h[2] = 99; // an op this build does not know
        let (s, closed) = raw(a, &frame(&h, &[]), false).await;
        assert_eq!(
            (s, closed),
            (Some(Status::ErrorBadFrame), true),
            "unknown op"
        );
        let old = Message::Op {
            version: 7,
            op: Op::ReplicaInfo(ReplicaInfoOp { block: b }),
            token: None,
        };
        let (s, _) = raw(a, &frame(&encode_header(&old).unwrap(), &[]), false).await;
        assert_eq!(s, Some(Status::ErrorVersion));
        let ack = Message::Ack(PipelineAck {
            seqno: 0,
            replies: vec![],
        });
        let (s, closed) = raw(a, &frame(&encode_header(&ack).unwrap(), &[]), false).await;
        assert_eq!(
            (s, closed),
            (Some(Status::ErrorInvalid), true),
            "message out of place"
        );

        let (_, got) = read_block(a, b, 0, u64::MAX).await;
        assert_eq!(got, data, "stored data unchanged, node still serving");
        assert!(n.dn().metrics().bad_frames.get() >= 6);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_packets_are_acked_with_the_error_and_change_nothing_acknowledged() {
    within(60, async {
        let (meta_addr, _) = fake_meta().await;
        let (n1, n2) = (Node::start(meta_addr).await, Node::start(meta_addr).await);
        let data = random_bytes(4096, 8);
        for (id, kind) in [(11u64, "checksum"), (12, "length"), (13, "oversized")] {
            let b = block(id, 1, 0);
            let mut c = Client::connect(n1.addr()).await;
            assert_eq!(
                c.op(write_op(b, BlockStage::Create, vec![n2.id()]))
                    .await
                    .status,
                Status::Success
            );
            c.packet(0, 0, &data[..2048], false, false).await;
            let h = PacketHeader {
                seqno: 1,
                offset_in_block: 2048,
                data_len: 2048,
                last: false,
                sync: false,
            };
            let mut payload = sluice_common::checksum::compute(&data[2048..], 512);
            payload.extend_from_slice(&data[2048..]);
            let expected = match kind {
                "checksum" => {
                    payload[20] ^= 0x40;
                    Status::ErrorChecksum
                }
                "length" => {
                    payload.truncate(payload.len() - 1);
                    Status::ErrorInvalid
                }
                _ => Status::ErrorFrameTooLarge,
            };
            if kind == "oversized" {
                // Only the length prefix: the DataNode refuses the frame before buffering it.
                c.w.get_mut()
                    .write_all(&(5u32 << 20).to_be_bytes())
                    .await
                    .unwrap();
            } else {
                c.send(Message::Packet(h), Bytes::from(payload)).await;
            }
            let first = c.ack().await.unwrap();
            assert_eq!(
                (first.seqno, first.replies.clone()),
                (0, vec![Status::Success; 2]),
                "{kind}: earlier packet"
            );
            let bad = c.ack().await.expect("an ack for the bad packet");
            assert_eq!((bad.seqno, bad.replies[0]), (1, expected), "{kind}");
            assert!(c.next().await.is_none(), "{kind}: connection closed");
            for n in [&n1, &n2] {
                // n2, the last DataNode, batches in memory: its writer flushes what it
                // received when the pipeline ends, so its length may still be rising.
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
                loop {
                    let mut q = Client::connect(n.addr()).await;
                    let rep = q
                        .op(Op::ReplicaInfo(ReplicaInfoOp { block: b }))
                        .await
                        .replica
                        .unwrap();
                    assert!(rep.block.num_bytes <= 2048, "{kind}: only the good packet");
                    if rep.block.num_bytes == 2048 {
                        break;
                    }
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "{kind}: never visible"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                let (_, got) = read_block(n.addr(), b, 0, u64::MAX).await;
                assert_eq!(got, &data[..2048]);
            }
        }
    })
    .await
}
