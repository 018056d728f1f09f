//! Fuzz target body for the client's ack parser (cargo feature `fuzzing`; see
//! `docs/security.md`, "Fuzzing"): a DataNode's byte stream on a pipeline with packets in
//! flight, decoded frame by frame and each ack applied to the [`AckQueue`] as the streamer does.
//! The unit test below replays every input kept in `fuzz/regressions/ack/`.

use super::ack::{AckOutcome, AckQueue};
use super::packet::OutPacket;
use bytes::BytesMut;
use sluice_common::frame::{FrameCodec, DEFAULT_MAX_FRAME};
use sluice_common::proto::Message;
use sluice_common::{DatanodeId, NodeId};
use tokio_util::codec::Decoder;

/// `data`: one byte for the pipeline's length (1 to 4 DataNodes), one for the packets in
/// flight (up to 31 of 100 bytes; with the high bit, the last one is the block's empty last packet), then the
/// DataNode's frames. Never panics; an ack completes exactly the oldest packet in flight (the
/// acknowledged length is its end and never shrinks), a refused ack blames a DataNode of the
/// pipeline, and a heartbeat's ack changes no packet.
pub fn acks(data: &[u8]) {
    let [n_nodes, n_packets, stream @ ..] = data else {
        return;
    };
    let nodes: Vec<DatanodeId> = (0..usize::from(n_nodes % 4) + 1)
        .map(|i| DatanodeId {
            node_id: NodeId(format!("dn{i}")),
            data_addr: format!("127.0.0.1:{}", 9000 + i),
            http_addr: String::new(),
            rack: String::new(),
        })
        .collect();
    let mut queue = AckQueue::new(0);
    let count = i64::from(n_packets % 32);
    let ends_with_last = n_packets & 0x80 != 0;
    let mut ends = Vec::new();
    for seqno in 0..count {
        let last = ends_with_last && seqno == count - 1;
        let data: &[u8] = if last { &[] } else { &[7u8; 100] };
        let mut p = OutPacket::data(seqno as u64 * 100, data, 512, false);
        p.header.seqno = seqno;
        p.header.last = last;
        ends.push(p.end_offset());
        queue.push(p, None);
    }
    queue.push_heartbeat();
    let mut next = 0i64;
    let mut codec = FrameCodec::<Message>::new(DEFAULT_MAX_FRAME);
    let mut src = BytesMut::from(stream);
    while let Ok(Some(frame)) = codec.decode(&mut src) {
        // Anything but an ack fails the pipeline before the queue sees it.
        let Message::Ack(ack) = frame.header else {
            return;
        };
        let before = queue.acked_len();
        match queue.on_ack(&ack, &nodes) {
            Ok(AckOutcome::Acked {
                seqno,
                acked_len,
                last,
            }) => {
                assert_eq!(seqno, next, "an ack completed a packet out of order");
                assert_eq!(acked_len, before.max(ends[seqno as usize]));
                assert_eq!(last, ends_with_last && seqno == count - 1);
                next += 1;
            }
            Ok(AckOutcome::Heartbeat) => assert_eq!(queue.acked_len(), before),
            Err(failure) => {
                assert!(nodes.contains(failure.node()), "blamed {}", failure.node());
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ack_regressions_pass() {
        let n = sluice_common::fuzzing::replay(env!("CARGO_MANIFEST_DIR"), "ack", super::acks);
        assert!(n > 0, "no ack inputs kept");
    }
}
