//! Fuzz target body for the DataNode's packet parser (cargo feature `fuzzing`; see
//! `docs/security.md`, "Fuzzing"): a peer's byte stream after a `WriteBlock` set-up, decoded
//! frame by frame and each packet checked as the receiver does (its header against the
//! pipeline's sequence and the bytes received, then its checksums). The unit test below replays
//! every input kept in `fuzz/regressions/packet/`.

use crate::storage::meta::MAX_BYTES_PER_CHECKSUM;
use crate::write::packet::{PacketKind, PacketValidator};
use bytes::BytesMut;
use sluice_common::checksum;
use sluice_common::frame::{FrameCodec, DEFAULT_MAX_FRAME};
use sluice_common::proto::Message;
use tokio_util::codec::Decoder;

/// `data`: 2 bytes of bytes-per-checksum, 4 bytes of bytes already received (both big-endian),
/// then the peer's frames. Never panics; an accepted data packet starts on a checksum boundary
/// at or before the bytes received, its payload is exactly its checksums and data, and the
/// bytes received never shrink; after a refusal the receiver ends the pipeline, so nothing
/// further is checked.
pub fn packets(data: &[u8]) {
    let Some((head, stream)) = data.split_at_checked(6) else {
        return;
    };
    let bpc = u32::from(u16::from_be_bytes([head[0], head[1]])) % MAX_BYTES_PER_CHECKSUM + 1;
    let mut received = u64::from(u32::from_be_bytes([head[2], head[3], head[4], head[5]]));
    let mut validator = PacketValidator::new(received, bpc);
    let mut codec = FrameCodec::<Message>::new(DEFAULT_MAX_FRAME);
    let mut src = BytesMut::from(stream);
    while let Ok(Some(frame)) = codec.decode(&mut src) {
        let Message::Packet(h) = frame.header else {
            return;
        };
        let expected = validator.expected_seqno();
        let Ok(kind) = validator.check(&h, frame.payload.len()) else {
            return;
        };
        if kind == PacketKind::Heartbeat {
            assert_eq!(
                validator.expected_seqno(),
                expected,
                "a heartbeat moved the seqno"
            );
            continue;
        }
        assert_eq!(h.seqno, expected, "accepted out of sequence");
        if kind == PacketKind::Last {
            assert_eq!(h.data_len, 0);
            return;
        }
        if h.data_len > 0 {
            assert!(h.offset_in_block <= received, "accepted a hole");
            assert_eq!(h.offset_in_block % u64::from(bpc), 0, "misaligned");
            let end = h
                .offset_in_block
                .checked_add(u64::from(h.data_len))
                .expect("an accepted packet ends within u64");
            received = received.max(end);
        }
        // Step 2 of the receiver: the checksums cover the data exactly.
        let sums_len = checksum::checksum_len(h.data_len as usize, bpc);
        assert_eq!(frame.payload.len(), sums_len + h.data_len as usize);
        let (sums, bytes) = frame.payload.split_at(sums_len);
        if checksum::verify(bytes, sums, bpc, h.offset_in_block).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn packet_regressions_pass() {
        let n =
            sluice_common::fuzzing::replay(env!("CARGO_MANIFEST_DIR"), "packet", super::packets);
        assert!(n > 0, "no packet inputs kept");
    }
}
