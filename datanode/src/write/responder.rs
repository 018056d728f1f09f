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
use futures::Stream;
use sluice_common::frame::Frame;
use sluice_common::framed;
use sluice_common::proto::{Message, PipelineAck};
use sluice_common::{FrameError, Status};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long the downstream's socket is still read for an ack once forwarding to it failed.
/// The ack may already be in the socket (sent just before the downstream closed) while the
/// reactor has not yet reported it readable; a peer that is gone answers within it with
/// end-of-stream or a reset.
const FORWARD_FAILED_GRACE: Duration = Duration::from_secs(1);

/// What reading the downstream ack of one packet gave.
#[derive(Debug)]
pub(crate) enum DownstreamAck {
    /// A frame (checked by the caller).
    Frame(Frame<Message>),
    /// The downstream closed the connection between frames.
    Closed,
    /// Reading failed or timed out.
    Failed(framed::TimedError),
    /// Forwarding to the downstream failed and no ack came within the grace.
    ForwardFailed,
}

/// Reads the next downstream ack within `limit`, or gives up once forwarding downstream
/// failed (`lost`). An ack already sent wins over a failed forward: the downstream may have
/// acked (naming a node further down as bad) and closed before this node's next forward, and
/// blaming the downstream for that would take the wrong DataNode out of the pipeline. So
/// after `lost` the socket is still read for [`FORWARD_FAILED_GRACE`].
pub(crate) async fn next_downstream_ack<S>(
    reader: &mut S,
    limit: Duration,
    lost: &CancellationToken,
) -> DownstreamAck
where
    S: Stream<Item = Result<Frame<Message>, FrameError>> + Unpin,
{
    let got = tokio::select! {
        biased;
        r = framed::recv_within(reader, limit) => Some(r),
        _ = lost.cancelled() => None,
    };
    let got = match got {
        Some(r) => r,
        None => match framed::recv_within(reader, limit.min(FORWARD_FAILED_GRACE)).await {
            Ok(Some(f)) => Ok(Some(f)),
            _ => return DownstreamAck::ForwardFailed,
        },
    };
    match got {
        Ok(Some(f)) => DownstreamAck::Frame(f),
        Ok(None) => DownstreamAck::Closed,
        Err(e) => DownstreamAck::Failed(e),
    }
}

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
        match next_downstream_ack(reader, t, &self.downstream_lost).await {
            DownstreamAck::Frame(f) => match f.header {
                Message::Ack(a) if a.seqno == seqno && !a.replies.is_empty() => {
                    let mut out = Vec::with_capacity(a.replies.len() + 1);
                    out.push(Status::Success);
                    out.extend(a.replies);
                    return out;
                }
                other => tracing::warn!(seqno, "downstream answered {other:?}"),
            },
            DownstreamAck::Closed => tracing::warn!(seqno, "downstream closed the connection"),
            DownstreamAck::Failed(e) => tracing::warn!(seqno, "downstream ack: {e}"),
            DownstreamAck::ForwardFailed => tracing::warn!(seqno, "forwarding downstream failed"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// Yields its frames, but answers the first poll `Pending` (waking itself at once), as a
    /// socket does whose data has arrived before the reactor reported it readable.
    struct LateReady {
        polled: bool,
        frames: Vec<Frame<Message>>,
    }

    impl Stream for LateReady {
        type Item = Result<Frame<Message>, FrameError>;

        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            if !self.polled {
                self.polled = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(self.frames.pop().map(Ok))
        }
    }

    fn ack(seqno: i64) -> Frame<Message> {
        Frame::new(Message::Ack(PipelineAck {
            seqno,
            replies: vec![Status::Success, Status::Error],
        }))
    }

    #[tokio::test]
    async fn an_ack_sent_before_a_failed_forward_is_still_read() {
        // The forward of a later packet failed before this ack was seen: the ack (which blames
        // a node further down) must win, or the healthy downstream is taken out instead.
        let lost = CancellationToken::new();
        lost.cancel();
        let mut reader = LateReady {
            polled: false,
            frames: vec![ack(1)],
        };
        let got = next_downstream_ack(&mut reader, Duration::from_secs(5), &lost).await;
        match got {
            DownstreamAck::Frame(f) => assert!(matches!(f.header, Message::Ack(a) if a.seqno == 1)),
            other => panic!("the ack was lost: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_failed_forward_without_an_ack_blames_the_downstream_within_the_grace() {
        let lost = CancellationToken::new();
        lost.cancel();
        let mut reader = futures::stream::pending::<Result<Frame<Message>, FrameError>>();
        let started = Instant::now();
        let got = next_downstream_ack(&mut reader, Duration::from_secs(30), &lost).await;
        assert!(matches!(got, DownstreamAck::ForwardFailed), "{got:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_closed_downstream_is_reported_as_closed() {
        let lost = CancellationToken::new();
        let mut reader = futures::stream::empty::<Result<Frame<Message>, FrameError>>();
        let got = next_downstream_ack(&mut reader, Duration::from_secs(5), &lost).await;
        assert!(matches!(got, DownstreamAck::Closed), "{got:?}");
    }
}
