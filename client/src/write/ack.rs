//! The ack queue: every packet sent on a pipeline stays here, still sendable, until the whole
//! pipeline has acknowledged it (HDFS `DataStreamer.ackQueue` + `ResponseProcessor`).
//!
//! Plain logic: [`AckQueue::on_ack`] takes one [`PipelineAck`] and says what it means — a packet
//! acknowledged by every DataNode, a heartbeat, or a [`PipelineFailure`] naming the DataNode to
//! blame (the first non-`SUCCESS` reply). Pipeline recovery re-sends [`AckQueue::drain`]'s
//! packets on a rebuilt pipeline, whose queue [`AckQueue::resume`]s the block's progress.

use super::packet::OutPacket;
use crate::error::PipelineFailure;
use sluice_common::proto::{PipelineAck, HEARTBEAT_SEQNO};
use sluice_common::DatanodeId;
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

    /// Applies one ack from the pipeline `nodes` (in order; never empty).
    pub(crate) fn on_ack(
        &mut self,
        ack: &PipelineAck,
        nodes: &[DatanodeId],
    ) -> Result<AckOutcome, PipelineFailure> {
        let node = |i: usize| {
            nodes
                .get(i)
                .or(nodes.last())
                .cloned()
                .unwrap_or_else(unknown_node)
        };
        if let Some(i) = ack.first_failure() {
            return Err(PipelineFailure::ErrorAck {
                node: node(i),
                seqno: ack.seqno,
                status: ack.replies[i],
            });
        }
        if ack.replies.len() < nodes.len() {
            return Err(PipelineFailure::ShortAck {
                node: node(ack.replies.len()),
                seqno: ack.seqno,
                replies: ack.replies.len(),
                pipeline: nodes.len(),
            });
        }
        if ack.seqno == HEARTBEAT_SEQNO {
            self.heartbeats = self.heartbeats.saturating_sub(1);
            return Ok(AckOutcome::Heartbeat);
        }
        let protocol = |reason: String| PipelineFailure::AckProtocol {
            node: node(0),
            reason,
        };
        let Some(front) = self.queue.front() else {
            return Err(protocol(format!(
                "ack for seqno {} but no packet is in flight",
                ack.seqno
            )));
        };
        if front.packet.header.seqno != ack.seqno {
            return Err(protocol(format!(
                "expected an ack for seqno {}, got seqno {}",
                front.packet.header.seqno, ack.seqno
            )));
        }
        let done = self
            .queue
            .pop_front()
            .ok_or_else(|| protocol("ack queue emptied unexpectedly".into()))?;
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

/// Stands in for the DataNode of an empty pipeline (never built: pipelines have DataNodes).
pub(crate) fn unknown_node() -> DatanodeId {
    DatanodeId {
        node_id: sluice_common::NodeId("?".into()),
        data_addr: "?".into(),
        http_addr: "?".into(),
        rack: String::new(),
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

    fn nodes() -> Vec<DatanodeId> {
        (1..=3)
            .map(|i| DatanodeId {
                node_id: sluice_common::NodeId(format!("dn{i}")),
                data_addr: format!("127.0.0.1:{i}"),
                ..unknown_node()
            })
            .collect()
    }

    fn blamed(f: PipelineFailure) -> String {
        f.node().node_id.0.clone()
    }

    #[test]
    fn in_order_success_pops_and_tracks_acked_length() {
        let mut q = AckQueue::new(0);
        q.push(packet(0, 0, 1024), None);
        q.push(packet(1, 1024, 100), None);
        q.push_heartbeat();
        assert_eq!(q.expected(), 3);
        assert_eq!(
            q.on_ack(&ack(-1, &OK3), &nodes()).ok(),
            Some(AckOutcome::Heartbeat)
        );
        assert_eq!(
            q.on_ack(&ack(0, &OK3), &nodes()).ok(),
            Some(AckOutcome::Acked {
                seqno: 0,
                acked_len: 1024,
                last: false
            })
        );
        assert_eq!(q.len(), 1);
        q.on_ack(&ack(1, &OK3), &nodes()).unwrap();
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
                &nodes(),
            )
            .unwrap_err();
        assert!(
            matches!(&f, PipelineFailure::ErrorAck { node, seqno: 0, status: Status::ErrorChecksum } if node.node_id.0 == "dn2"),
            "{f:?}"
        );
        assert_eq!(f.status(), Some(Status::ErrorChecksum));
        // The downstream-failure form [own, ERROR] blames the second node.
        assert_eq!(
            blamed(
                q.on_ack(&ack(0, &[Status::Success, Status::Error]), &nodes())
                    .unwrap_err()
            ),
            "dn2"
        );
        // A short list of successes blames the first node that did not answer.
        let short = q
            .on_ack(&ack(0, &[Status::Success, Status::Success]), &nodes())
            .unwrap_err();
        assert!(
            matches!(&short, PipelineFailure::ShortAck { node, replies: 2, pipeline: 3, .. } if node.node_id.0 == "dn3"),
            "{short:?}"
        );
        // Out-of-order seqno.
        let out_of_order = q.on_ack(&ack(5, &OK3), &nodes()).unwrap_err();
        assert!(
            matches!(&out_of_order, PipelineFailure::AckProtocol { node, .. } if node.node_id.0 == "dn1"),
            "{out_of_order:?}"
        );
        assert_eq!(q.len(), 1, "a failed packet stays for recovery");
        let drained = q.drain();
        assert_eq!(drained.len(), 1);
        assert_eq!(drained[0].packet.header.seqno, 0);
    }
}
