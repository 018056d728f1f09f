//! The ack queue: every packet sent on a pipeline stays here, still sendable, until the whole
//! pipeline has acknowledged it (HDFS `DataStreamer.ackQueue` + `ResponseProcessor`).
//!
//! Plain logic: [`AckQueue::on_ack`] takes one [`PipelineAck`] and says what it means — a packet
//! acknowledged by every DataNode, a heartbeat, or a failure naming the DataNode to blame (the
//! index of the first non-`SUCCESS` reply). Pipeline recovery re-sends [`AckQueue::drain`]'s
//! packets on a rebuilt pipeline, whose queue [`AckQueue::resume`]s the block's progress.

use super::packet::OutPacket;
use sluice_common::proto::{PipelineAck, HEARTBEAT_SEQNO};
use std::collections::VecDeque;
use tokio::sync::OwnedSemaphorePermit;

/// A packet sent and not yet acknowledged by the whole pipeline.
#[derive(Debug)]
pub(crate) struct InFlight {
    /// The packet as sent (with its seqno).
    pub packet: OutPacket,
    /// The writer's window permit, released (dropped) when the packet is acknowledged.
    #[allow(dead_code)] // held for its Drop
    pub permit: Option<OwnedSemaphorePermit>,
}

/// What an ack meant.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AckOutcome {
    /// The oldest packet was acknowledged by every DataNode.
    Acked {
        /// Its seqno.
        seqno: i64,
        /// Bytes of the block acknowledged so far (the packet's end offset).
        acked_len: u64,
        /// It was the block's last packet.
        last: bool,
    },
    /// A heartbeat's ack.
    Heartbeat,
}

/// A failed pipeline: which DataNode to blame and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AckFailure {
    /// Position of the blamed DataNode in the pipeline (0 = first).
    pub bad_index: usize,
    /// What happened.
    pub reason: String,
}

/// Packets in flight on one pipeline, oldest first.
#[derive(Debug, Default)]
pub(crate) struct AckQueue {
    queue: VecDeque<InFlight>,
    heartbeats: usize,
    acked_len: u64,
    /// Packets of the block acknowledged so far, across rebuilt pipelines (recovery progress).
    acked_packets: u64,
}

impl AckQueue {
    /// An empty queue; `acked_len` is the block length already acknowledged.
    pub(crate) fn new(acked_len: u64) -> AckQueue {
        AckQueue::resume(acked_len, 0)
    }

    /// An empty queue for a rebuilt pipeline: `acked_len` bytes and `acked_packets` packets of
    /// the block were acknowledged before.
    pub(crate) fn resume(acked_len: u64, acked_packets: u64) -> AckQueue {
        AckQueue {
            queue: VecDeque::new(),
            heartbeats: 0,
            acked_len,
            acked_packets,
        }
    }

    /// Packets of the block acknowledged so far.
    pub(crate) fn acked_packets(&self) -> u64 {
        self.acked_packets
    }

    /// Records a packet just sent.
    pub(crate) fn push(&mut self, packet: OutPacket, permit: Option<OwnedSemaphorePermit>) {
        self.queue.push_back(InFlight { packet, permit });
    }

    /// Records a heartbeat just sent.
    pub(crate) fn push_heartbeat(&mut self) {
        self.heartbeats += 1;
    }

    /// Packets awaiting their ack.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// True when no packet awaits an ack.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Acks expected (packets and heartbeats).
    pub(crate) fn expected(&self) -> usize {
        self.queue.len() + self.heartbeats
    }

    /// Bytes of the block acknowledged by the whole pipeline.
    pub(crate) fn acked_len(&self) -> u64 {
        self.acked_len
    }

    /// Takes every unacknowledged packet, oldest first, for re-sending (pipeline recovery).
    pub(crate) fn drain(&mut self) -> Vec<InFlight> {
        self.heartbeats = 0;
        self.queue.drain(..).collect()
    }

    /// Applies one ack from a pipeline of `pipeline_len` DataNodes.
    pub(crate) fn on_ack(
        &mut self,
        ack: &PipelineAck,
        pipeline_len: usize,
    ) -> Result<AckOutcome, AckFailure> {
        if let Some(i) = ack.first_failure() {
            return Err(AckFailure {
                bad_index: i,
                reason: format!(
                    "ack for seqno {} reports {} at pipeline position {i}",
                    ack.seqno, ack.replies[i]
                ),
            });
        }
        if ack.replies.len() < pipeline_len {
            return Err(AckFailure {
                bad_index: ack.replies.len(),
                reason: format!(
                    "ack for seqno {} has {} replies for a pipeline of {pipeline_len}",
                    ack.seqno,
                    ack.replies.len()
                ),
            });
        }
        if ack.seqno == HEARTBEAT_SEQNO {
            self.heartbeats = self.heartbeats.saturating_sub(1);
            return Ok(AckOutcome::Heartbeat);
        }
        let Some(front) = self.queue.front() else {
            return Err(AckFailure {
                bad_index: 0,
                reason: format!("ack for seqno {} but no packet is in flight", ack.seqno),
            });
        };
        if front.packet.header.seqno != ack.seqno {
            return Err(AckFailure {
                bad_index: 0,
                reason: format!(
                    "expected an ack for seqno {}, got seqno {}",
                    front.packet.header.seqno, ack.seqno
                ),
            });
        }
        let done = self.queue.pop_front().ok_or_else(|| AckFailure {
            bad_index: 0,
            reason: "ack queue emptied unexpectedly".into(),
        })?;
        let end = done.packet.end_offset();
        self.acked_len = self.acked_len.max(end);
        self.acked_packets += 1;
        Ok(AckOutcome::Acked {
            seqno: ack.seqno,
            acked_len: self.acked_len,
            last: done.packet.header.last,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_common::Status;

    fn packet(seqno: i64, off: u64, len: usize) -> OutPacket {
        let mut p = OutPacket::data(off, &vec![1u8; len], 512, false);
        p.header.seqno = seqno;
        p
    }

    fn ack(seqno: i64, replies: &[Status]) -> PipelineAck {
        PipelineAck {
            seqno,
            replies: replies.to_vec(),
        }
    }

    const OK3: [Status; 3] = [Status::Success; 3];

    #[test]
    fn in_order_success_pops_and_tracks_acked_length() {
        let mut q = AckQueue::new(0);
        q.push(packet(0, 0, 1024), None);
        q.push(packet(1, 1024, 100), None);
        q.push_heartbeat();
        assert_eq!(q.expected(), 3);
        assert_eq!(q.on_ack(&ack(-1, &OK3), 3), Ok(AckOutcome::Heartbeat));
        assert_eq!(
            q.on_ack(&ack(0, &OK3), 3),
            Ok(AckOutcome::Acked {
                seqno: 0,
                acked_len: 1024,
                last: false
            })
        );
        assert_eq!(q.len(), 1);
        q.on_ack(&ack(1, &OK3), 3).unwrap();
        assert!(q.is_empty());
        assert_eq!(q.acked_len(), 1124);
        assert_eq!(q.acked_packets(), 2, "heartbeats are not progress");
    }

    #[test]
    fn failures_name_the_first_bad_datanode_and_keep_the_packets() {
        let mut q = AckQueue::new(0);
        q.push(packet(0, 0, 512), None);
        let f = q
            .on_ack(
                &ack(
                    0,
                    &[Status::Success, Status::ErrorChecksum, Status::Success],
                ),
                3,
            )
            .unwrap_err();
        assert_eq!(f.bad_index, 1);
        assert!(f.reason.contains("ERROR_CHECKSUM"), "{}", f.reason);
        // The downstream-failure form [own, ERROR] blames the second node.
        assert_eq!(
            q.on_ack(&ack(0, &[Status::Success, Status::Error]), 3)
                .unwrap_err()
                .bad_index,
            1
        );
        // A short list of successes blames the first node that did not answer.
        assert_eq!(
            q.on_ack(&ack(0, &[Status::Success, Status::Success]), 3)
                .unwrap_err()
                .bad_index,
            2
        );
        // Out-of-order seqno.
        assert_eq!(q.on_ack(&ack(5, &OK3), 3).unwrap_err().bad_index, 0);
        assert_eq!(q.len(), 1, "a failed packet stays for recovery");
        let drained = q.drain();
        assert_eq!(drained.len(), 1);
        assert_eq!(drained[0].packet.header.seqno, 0);
    }
}
