//! The starting inputs of every fuzz target, made with the project's own encoders
//! (`FrameCodec`, `encode_header`, the checksums), so that the fuzzer starts from valid traffic
//! and the seeds follow the wire format as it changes: `scripts/fuzz` writes them out (the
//! `seeds` binary of `fuzz/`), and [`super::replay`] runs them with the kept regressions.

use crate::checksum;
use crate::frame::{encode_header, Frame, FrameCodec};
use crate::proto::{
    BlockStage, ChunkHeader, Message, Op, OpResponse, PacketHeader, PipelineAck, ReadBlockOp,
    ReadEnd, WriteBlockOp, HEARTBEAT_SEQNO, PROTOCOL_VERSION,
};
use crate::token::{AccessMode, AccessModes, BlockKey, TokenIdentifier, KEY_LEN};
use crate::{BlockId, DatanodeId, ExtendedBlock, GenerationStamp, NodeId, Status};
use bytes::{BufMut, Bytes, BytesMut};
use tokio_util::codec::Encoder;

fn wire(frames: Vec<Frame<Message>>) -> Vec<u8> {
    let mut out = BytesMut::new();
    let mut codec = FrameCodec::<Message>::default();
    for f in frames {
        codec.encode(f, &mut out).expect("encodes");
    }
    out.to_vec()
}

fn packet(seqno: i64, offset: u64, data: &[u8], last: bool) -> Frame<Message> {
    let mut payload = checksum::compute(data, 512);
    payload.extend_from_slice(data);
    Frame::with_payload(
        Message::Packet(PacketHeader {
            seqno,
            offset_in_block: offset,
            data_len: data.len() as u32,
            last,
            sync: seqno == 1,
        }),
        Bytes::from(payload),
    )
}

fn ack(seqno: i64, n: usize) -> Frame<Message> {
    Frame::new(Message::Ack(PipelineAck {
        seqno,
        replies: vec![Status::Success; n],
    }))
}

fn token(key_id: u32) -> Vec<u8> {
    let key = BlockKey {
        id: key_id,
        secret: [0x5a; KEY_LEN],
    };
    let ident = TokenIdentifier {
        key_id,
        expiry_ms: 1_700_000_000_000,
        block: BlockId(1 << 30),
        gen_stamp: GenerationStamp(1001),
        modes: AccessModes::of(&[AccessMode::Write, AccessMode::Read]),
        targets: vec![dn(1)],
    };
    encode_header(&key.sign(ident).expect("signs")).expect("encodes")
}

fn dn(i: u16) -> DatanodeId {
    DatanodeId {
        node_id: NodeId(format!("dn{i}")),
        data_addr: format!("127.0.0.1:{}", 9866 + i),
        http_addr: format!("127.0.0.1:{}", 9864 + i),
        rack: "/default-rack".into(),
    }
}

/// The starting inputs: (target, name, bytes).
pub fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let data = vec![0x42u8; 700];
    let block = ExtendedBlock::new(BlockId(1 << 30), GenerationStamp(1001), 0);
    let op = Message::Op {
        version: PROTOCOL_VERSION,
        op: Op::WriteBlock(WriteBlockOp {
            block,
            stage: BlockStage::Create,
            targets: vec![dn(1), dn(2)],
            client_name: "seed".into(),
            bytes_per_checksum: 512,
            latest_gen_stamp: GenerationStamp(1001),
        }),
        token: None,
    };
    let read = Message::Op {
        version: PROTOCOL_VERSION,
        op: Op::ReadBlock(ReadBlockOp {
            block,
            offset: 0,
            length: u64::MAX,
            piece_size: 0,
        }),
        token: None,
    };
    let mut chunk = checksum::compute(&data, 512);
    chunk.extend_from_slice(&data);
    vec![
        (
            "frame",
            "write-pipeline",
            wire(vec![
                Frame::new(op),
                packet(0, 0, &data, false),
                ack(0, 3),
                Frame::new(Message::OpResponse(OpResponse::ok())),
            ]),
        ),
        (
            "frame",
            "read",
            wire(vec![
                Frame::new(read),
                Frame::with_payload(
                    Message::Chunk(ChunkHeader {
                        block: block.id,
                        gen_stamp: block.gen_stamp,
                        offset: 0,
                        data_len: 700,
                        bytes_per_checksum: 512,
                    }),
                    Bytes::from(chunk),
                ),
                Frame::new(Message::ReadEnd(ReadEnd {
                    status: Status::Success,
                    message: String::new(),
                })),
            ]),
        ),
        ("packet", "block", {
            let mut v = BytesMut::new();
            v.put_u16(512);
            v.put_u32(0);
            v.put_slice(&wire(vec![
                packet(0, 0, &data, false),
                packet(HEARTBEAT_SEQNO, 0, &[], false),
                packet(1, 512, &data, false),
                packet(2, 1212, &[], true),
            ]));
            v.to_vec()
        }),
        ("ack", "pipeline", {
            let mut v = vec![2u8, 3 | 0x80];
            v.extend(wire(vec![
                ack(0, 3),
                ack(HEARTBEAT_SEQNO, 3),
                ack(1, 3),
                ack(2, 3),
            ]));
            v
        }),
        ("token", "signed", token(7)),
        ("token", "other-key", token(8)),
        ("path", "plain", b"/a/b/c".to_vec()),
        ("path", "webhdfs", b"/webhdfs/v1/a%20b/c%2Fd/".to_vec()),
        ("path", "dots", b"/a/./b/../c//d".to_vec()),
    ]
}
