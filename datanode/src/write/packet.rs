//! Step 1 of the receiver's packet order: checking a packet header against the pipeline's
//! sequence, the bytes received so far and the payload size (protocol.md "Packets").

use crate::error::{DatanodeError, Result};
use sluice_common::checksum;
use sluice_common::proto::{PacketHeader, HEARTBEAT_SEQNO};

/// What a valid packet is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketKind {
    /// Keeps an idle pipeline alive; no data.
    Heartbeat,
    /// Data (possibly empty, e.g. an hsync with nothing new).
    Data,
    /// The last packet of the block (no data).
    Last,
}

/// Checks each packet of one pipeline.
#[derive(Clone, Debug)]
pub struct PacketValidator {
    next_seqno: Option<i64>,
    received: u64,
    bpc: u32,
}

impl PacketValidator {
    /// A validator for a replica holding `received` bytes with `bpc` bytes per checksum.
    pub fn new(received: u64, bpc: u32) -> Self {
        PacketValidator {
            next_seqno: None,
            received,
            bpc,
        }
    }

    /// The seqno the next data packet must carry (0 before the first).
    pub fn expected_seqno(&self) -> i64 {
        self.next_seqno.unwrap_or(0)
    }

    /// Checks `h` whose frame carried `payload_len` bytes, and advances.
    pub fn check(&mut self, h: &PacketHeader, payload_len: usize) -> Result<PacketKind> {
        let bad = |reason: String| {
            Err(DatanodeError::invalid(format!(
                "packet {}: {reason}",
                h.seqno
            )))
        };
        if h.seqno == HEARTBEAT_SEQNO {
            if h.data_len != 0 || payload_len != 0 || h.last {
                return bad("a heartbeat carries no data and is not last".into());
            }
            return Ok(PacketKind::Heartbeat);
        }
        if h.seqno < 0 {
            return bad("negative seqno".into());
        }
        // Consecutive from 0 within one pipeline (every sender, client or DataNode, numbers a
        // new pipeline's packets from 0), the first packet included.
        let n = self.expected_seqno();
        if h.seqno != n {
            return bad(format!("out of sequence, expected {n}"));
        }
        let data_len = h.data_len as usize;
        let want = checksum::checksum_len(data_len, self.bpc) + data_len;
        if payload_len != want {
            return bad(format!(
                "payload of {payload_len} bytes, but {data_len} data bytes need {want} with checksums"
            ));
        }
        if h.last && data_len != 0 {
            return bad("the last packet carries data".into());
        }
        if data_len > 0 {
            if !h.offset_in_block.is_multiple_of(self.bpc as u64) {
                return bad(format!(
                    "offset {} is not a multiple of {}",
                    h.offset_in_block, self.bpc
                ));
            }
            if h.offset_in_block > self.received {
                return bad(format!(
                    "offset {} leaves a hole after the {} bytes received",
                    h.offset_in_block, self.received
                ));
            }
            self.received = self.received.max(h.offset_in_block + data_len as u64);
        }
        self.next_seqno = Some(h.seqno.saturating_add(1));
        Ok(if h.last {
            PacketKind::Last
        } else {
            PacketKind::Data
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(seqno: i64, offset: u64, data_len: u32, last: bool) -> PacketHeader {
        PacketHeader {
            seqno,
            offset_in_block: offset,
            data_len,
            last,
            sync: false,
        }
    }

    fn len(data: usize) -> usize {
        checksum::checksum_len(data, 512) + data
    }

    #[test]
    fn accepts_a_block_with_an_overlapping_resend_and_heartbeats() {
        let mut v = PacketValidator::new(0, 512);
        assert_eq!(
            v.check(&p(0, 0, 700, false), len(700)).unwrap(),
            PacketKind::Data
        );
        assert_eq!(
            v.check(&p(-1, 0, 0, false), 0).unwrap(),
            PacketKind::Heartbeat
        );
        // hflush ended inside chunk 1: the next packet restarts at 512.
        assert_eq!(
            v.check(&p(1, 512, 1000, false), len(1000)).unwrap(),
            PacketKind::Data
        );
        assert_eq!(v.check(&p(2, 1512, 0, true), 0).unwrap(), PacketKind::Last);
    }

    #[test]
    fn rejects_holes_misalignment_bad_lengths_and_sequence_gaps() {
        let mut v = PacketValidator::new(0, 512);
        v.check(&p(0, 0, 512, false), len(512)).unwrap();
        assert!(v.check(&p(1, 1024, 512, false), len(512)).is_err(), "hole");
        assert!(
            v.check(&p(1, 100, 512, false), len(512)).is_err(),
            "misaligned"
        );
        assert!(
            v.check(&p(1, 512, 512, false), len(512) - 1).is_err(),
            "short payload"
        );
        assert!(
            v.check(&p(2, 512, 512, false), len(512)).is_err(),
            "seqno gap"
        );
        assert!(
            v.check(&p(1, 512, 10, true), len(10)).is_err(),
            "last with data"
        );
        assert!(
            v.check(&p(-1, 0, 5, false), len(5)).is_err(),
            "heartbeat with data"
        );
        assert!(v.check(&p(-7, 0, 0, false), 0).is_err(), "negative seqno");
        assert_eq!(v.expected_seqno(), 1);
    }

    #[test]
    fn the_first_packet_must_be_seqno_0() {
        // Found by the `packet` fuzz target (fuzz/regressions/packet/first-packet-seqno-76).
        let mut v = PacketValidator::new(0, 512);
        assert!(v.check(&p(76, 0, 512, false), len(512)).is_err());
        assert!(v.check(&p(1, 0, 512, false), len(512)).is_err());
        v.check(&p(0, 0, 512, false), len(512)).unwrap();
    }
}
