//! The ack responder of one write connection (HDFS's `PacketResponder`): a task fed, through a
//! bounded queue, with each packet's local outcome in sequence order. For each, it waits for
//! the downstream ack of the same seqno (within the socket timeout, extended per DataNode below,
//! see [`sluice_common::proto::ack_timeout`]), raises the replica's
//! acknowledged length if all succeeded, then sends upstream
//! `Ack { seqno, [own status, downstream replies...] }`. So an ack goes upstream only when the local write is done (it was queued after it)
//! AND the downstream acked.
//!
//! Failures: a local error is acked `[own error]`; a downstream that is lost, silent past the
//! timeout, out of order, or reports a failure makes this and every later queued packet
//! `[own, ERROR]`. Either way the responder cancels `broken`, which stops the connection task;
//! it keeps answering queued packets until the queue closes.

use crate::context::Ctx;
use crate::failpoint::FailAction;
use crate::storage::replica::ReplicaLive;
use crate::wire::{self, FrameReader, FrameWriter};
use bytes::Bytes;
use sluice_common::proto::{Message, PipelineAck};
use sluice_common::Status;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One packet's local outcome, queued for acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingAck {
    /// Its seqno.
    pub seqno: i64,
    /// Local outcome.
    pub status: Status,
    /// Block offset just past its data (0 for heartbeats).
    pub end: u64,
    /// The block's last packet.
    pub last: bool,
    /// When a data packet arrived (`None` for heartbeats, the last packet and errors): its
    /// ack's latency goes to `packet_ack_seconds`.
    pub received: Option<Instant>,
}

/// How the responder ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponderEnd {
    /// Acked the last packet with every status SUCCESS.
    Completed,
    /// The queue closed (the connection task stopped) before the last packet.
    Closed,
    /// A failure was acknowledged or the upstream could not be written.
    Failed,
}

/// The responder's inputs.
pub struct Responder {
    pub(crate) ctx: Ctx,
    pub(crate) upstream: FrameWriter,
    pub(crate) downstream: Option<FrameReader>,
    /// DataNodes below this one: the downstream ack waits `ack_timeout(socket, this)`.
    pub(crate) downstream_nodes: usize,
    pub(crate) queue: mpsc::Receiver<PendingAck>,
    pub(crate) live: Arc<ReplicaLive>,
    /// Cancelled by the responder when the pipeline must stop.
    pub(crate) broken: CancellationToken,
    /// Cancelled by the connection task when forwarding downstream failed.
    pub(crate) downstream_lost: CancellationToken,
}

impl Responder {
    /// Runs until the last packet is acked, the queue closes, or a failure.
    pub async fn run(mut self) -> ResponderEnd {
        let mut failed = false;
        while let Some(p) = self.queue.recv().await {
            let replies = if p.status != Status::Success {
                vec![p.status]
            } else if failed {
                vec![Status::Success, Status::Error]
            } else {
                self.downstream_replies(p.seqno).await
            };
            let ok = replies.iter().all(|s| s.is_success());
            if ok && p.end > 0 {
                // Raised before the ack leaves, so that once the writer has its ack (an hflush
                // returned) every new reader sees the bytes. HDFS's PacketResponder does the same.
                self.live.ack_up_to(p.end);
            }
            if !self.send_ack(p.seqno, replies).await {
                self.broken.cancel();
                return ResponderEnd::Failed;
            }
            if let (true, Some(at)) = (ok, p.received) {
                self.ctx.metrics.packet_ack_seconds.observe(at.elapsed());
            }
            if ok {
                if p.last {
                    return ResponderEnd::Completed;
                }
            } else {
                failed = true;
                self.broken.cancel();
                if p.status != Status::Success {
                    return ResponderEnd::Failed;
                }
            }
        }
        if failed {
            ResponderEnd::Failed
        } else {
            ResponderEnd::Closed
        }
    }

    /// `[SUCCESS, downstream replies...]`, or `[SUCCESS, ERROR]` if the downstream failed.
    async fn downstream_replies(&mut self, seqno: i64) -> Vec<Status> {
        let Some(reader) = self.downstream.as_mut() else {
            return vec![Status::Success];
        };
        let t = sluice_common::proto::ack_timeout(self.ctx.socket_timeout(), self.downstream_nodes);
        // An ack already received wins over a failed forward: the downstream may have acked
        // (naming a node further down as bad) and closed before this node's next forward, and
        // blaming the downstream for that would take the wrong DataNode out of the pipeline.
        let got = tokio::select! {
            biased;
            r = wire::recv(reader, t, "the downstream ack") => Some(r),
            _ = self.downstream_lost.cancelled() => None,
        };
        match got {
            Some(Ok(Some(f))) => match f.header {
                Message::Ack(a) if a.seqno == seqno && !a.replies.is_empty() => {
                    let mut out = Vec::with_capacity(a.replies.len() + 1);
                    out.push(Status::Success);
                    out.extend(a.replies);
                    return out;
                }
                other => tracing::warn!(seqno, "downstream answered {other:?}"),
            },
            Some(Ok(None)) => tracing::warn!(seqno, "downstream closed the connection"),
            Some(Err(e)) => tracing::warn!(seqno, "downstream ack: {e}"),
            None => tracing::warn!(seqno, "forwarding downstream failed"),
        }
        self.downstream = None;
        vec![Status::Success, Status::Error]
    }

    async fn send_ack(&mut self, seqno: i64, replies: Vec<Status>) -> bool {
        match self.ctx.scope.check("dn::before_ack") {
            Some(FailAction::Drop) => return false,
            Some(FailAction::Error) => {
                let _ = self.send_ack_raw(seqno, vec![Status::Error]).await;
                return false;
            }
            None => {}
        }
        self.send_ack_raw(seqno, replies).await
    }

    async fn send_ack_raw(&mut self, seqno: i64, replies: Vec<Status>) -> bool {
        let msg = Message::Ack(PipelineAck { seqno, replies });
        match wire::send(
            &mut self.upstream,
            msg,
            Bytes::new(),
            self.ctx.socket_timeout(),
        )
        .await
        {
            Ok(()) => {
                self.ctx.metrics.acks_sent.inc();
                true
            }
            Err(e) => {
                tracing::warn!(seqno, "cannot ack upstream: {e}");
                false
            }
        }
    }
}
