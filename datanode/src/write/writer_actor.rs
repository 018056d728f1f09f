//! The `ReplicaWriter` actor: one per replica being written, a thin shell around
//! [`WriterCore`]. Each message runs its blocking disk work on the blocking pool and the actor
//! answers with an [`AtomicResponse`], so the next message is not started before the previous
//! one is done: packets reach the file in the order they were sent. Connection tasks use
//! `addr.send(..).await` (bounded mailbox of 16), never `do_send`.
//!
//! The receiver may also write a packet itself ([`write_inline`]): when the write is only a
//! copy into the page cache (a direct sink, no hsync), handing it to the actor and the blocking
//! pool costs more in thread wake-ups than the copy. The state is shared ([`SharedCore`]) and
//! locked for each write either way; the receiver awaits every message it sends before the next
//! packet, so its packets still reach the file in order.
//!
//! A buffered writer also runs the idle-flush timer ([`IdleFlush`] decides; the actor arms one
//! actix timer). Its flush runs like a message: while it runs (`ctx.wait`), no packet is taken.

use super::idle::{IdleAction, IdleFlush};
use super::writer_core::WriterCore;
use crate::error::{DatanodeError, Result};
use crate::metrics::Metrics;
use crate::storage::replica::ReplicaEntry;
use actix::prelude::*;
use bytes::Bytes;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Write one packet (and fsync it when `sync`).
#[derive(Debug, Message)]
#[rtype(result = "Result<()>")]
pub struct WritePacket {
    /// Block offset of `data` (a chunk boundary).
    pub offset: u64,
    /// The packet's data.
    pub data: Bytes,
    /// The packet's checksums.
    pub checksums: Bytes,
    /// hsync: durable before the answer.
    pub sync: bool,
}

/// Finalize the replica (last packet).
#[derive(Debug, Message)]
#[rtype(result = "Result<ReplicaEntry>")]
pub struct Finalize;

/// Flush what was received and release the sink (the pipeline ended early).
#[derive(Debug, Message)]
#[rtype(result = "Result<()>")]
pub struct Stop;

/// Hand buffered bytes to the file (the buffered sink's idle-flush timer sends this).
#[derive(Debug, Message)]
#[rtype(result = "Result<()>")]
pub struct Flush;

/// A writer's state, shared by its actor and the receiver's inline writes.
pub type SharedCore = Arc<Mutex<WriterCore>>;

/// Writes `m` on the receiver's thread when that is only a copy into the page cache: no
/// hsync, an unbuffered sink ([`WriterCore::writes_in_memory`]; a buffered writer's packets go
/// to the actor, whose idle-flush timer must see each), the state not busy with an actor job.
/// `None`: send it to the actor. Never waits for the lock.
pub fn write_inline(state: &SharedCore, m: &WritePacket) -> Option<Result<()>> {
    let mut s = state.try_lock().ok()?;
    if s.is_buffered() {
        return None;
    }
    in_memory(&mut s, m)
}

/// `m` written at once when that is a memory copy only; `None` otherwise.
fn in_memory(s: &mut WriterCore, m: &WritePacket) -> Option<Result<()>> {
    if m.sync || !s.writes_in_memory(m.data.len()) {
        return None;
    }
    Some(s.write_packet(m.offset, &m.data, &m.checksums, false))
}

/// The actor.
#[derive(Debug)]
pub struct ReplicaWriter {
    state: SharedCore,
    io: tokio::runtime::Handle,
    idle: Option<IdleFlush>,
    timer: Option<SpawnHandle>,
    metrics: Arc<Metrics>,
}

impl ReplicaWriter {
    /// A writer around `state`; blocking work runs on `io`'s blocking pool. A buffered state
    /// gets the idle-flush timer of `idle_flush` (zero: none).
    pub fn new(
        state: SharedCore,
        io: tokio::runtime::Handle,
        idle_flush: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        let buffered = state.lock().map(|s| s.is_buffered()).unwrap_or(false);
        let idle = if buffered {
            IdleFlush::new(idle_flush)
        } else {
            None
        };
        ReplicaWriter {
            state,
            io,
            idle,
            timer: None,
            metrics,
        }
    }

    /// Runs `f` on the state, off the actor thread, holding the actor until it is done.
    fn run<T, F>(&self, f: F) -> AtomicResponse<Self, Result<T>>
    where
        T: Send + 'static,
        F: FnOnce(&mut WriterCore) -> Result<T> + Send + 'static,
    {
        AtomicResponse::new(self.job(f))
    }

    /// `f` on the state, on the blocking pool, as an actor future.
    fn job<T, F>(&self, f: F) -> ResponseActFuture<Self, Result<T>>
    where
        T: Send + 'static,
        F: FnOnce(&mut WriterCore) -> Result<T> + Send + 'static,
    {
        let state = self.state.clone();
        let job = self.io.spawn_blocking(move || {
            let mut s = state.lock().map_err(|_| DatanodeError::ActorGone {
                actor: "replica writer (poisoned)",
            })?;
            f(&mut s)
        });
        let fut = async move {
            job.await.map_err(|_| DatanodeError::ActorGone {
                actor: "replica writer I/O task",
            })?
        };
        Box::pin(fut.into_actor(self))
    }

    /// A packet came: arms the idle timer if it is not armed.
    fn on_packet(&mut self, ctx: &mut Context<Self>) {
        if let Some(delay) = self.idle.as_mut().and_then(|i| i.on_packet(Instant::now())) {
            self.arm(ctx, delay);
        }
    }

    fn arm(&mut self, ctx: &mut Context<Self>, delay: Duration) {
        self.timer = Some(ctx.run_later(delay, |act, ctx| act.on_timer(ctx)));
    }

    /// The idle timer fired: flush a silent writer, re-arm, or sleep until the next packet.
    fn on_timer(&mut self, ctx: &mut Context<Self>) {
        self.timer = None;
        // No job runs now (jobs hold the actor), so the state is free; if it were not,
        // assume something is pending: the flush then waits its turn.
        let pending = self.state.try_lock().map(|s| s.pending()).unwrap_or(true);
        let Some(idle) = self.idle.as_mut() else {
            return;
        };
        match idle.on_timer(Instant::now(), pending) {
            IdleAction::Rearm(delay) => self.arm(ctx, delay),
            IdleAction::Sleep => {}
            IdleAction::Flush => {
                self.metrics.idle_flushes.inc();
                let fut = self.job(|s| s.flush()).map(|res, _act, _ctx| match res {
                    Ok(()) => tracing::debug!("idle-flushed the write buffer"),
                    Err(e) => tracing::warn!("idle flush of the write buffer failed: {e}"),
                });
                ctx.wait(fut);
            }
        }
    }

    /// The writer is ending: no more idle flushes.
    fn cancel_timer(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        if let Some(i) = self.idle.as_mut() {
            i.disarm();
        }
    }
}

impl Actor for ReplicaWriter {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        // Never block the actor thread: if an I/O job still holds the state, the state's Drop
        // releases the sink when that job ends.
        if let Ok(mut s) = self.state.try_lock() {
            s.release();
        }
    }
}

impl Handler<WritePacket> for ReplicaWriter {
    type Result = AtomicResponse<Self, Result<()>>;

    fn handle(&mut self, m: WritePacket, ctx: &mut Self::Context) -> Self::Result {
        self.on_packet(ctx);
        // A copy into the write buffer that leaves room is done here, on the actor's thread:
        // a round trip through the blocking pool costs more than the copy.
        let done = self
            .state
            .try_lock()
            .ok()
            .and_then(|mut s| in_memory(&mut s, &m));
        if let Some(res) = done {
            self.metrics.packets_buffered_on_actor.inc();
            return AtomicResponse::new(Box::pin(actix::fut::ready(res)));
        }
        self.run(move |s| s.write_packet(m.offset, &m.data, &m.checksums, m.sync))
    }
}

impl Handler<Finalize> for ReplicaWriter {
    type Result = AtomicResponse<Self, Result<ReplicaEntry>>;

    fn handle(&mut self, _m: Finalize, ctx: &mut Self::Context) -> Self::Result {
        self.cancel_timer(ctx);
        self.run(|s| s.finalize())
    }
}

impl Handler<Stop> for ReplicaWriter {
    type Result = AtomicResponse<Self, Result<()>>;

    fn handle(&mut self, _m: Stop, ctx: &mut Self::Context) -> Self::Result {
        self.cancel_timer(ctx);
        self.run(|s| s.stop())
    }
}

impl Handler<Flush> for ReplicaWriter {
    type Result = AtomicResponse<Self, Result<()>>;

    fn handle(&mut self, _m: Flush, _ctx: &mut Self::Context) -> Self::Result {
        self.run(|s| s.flush())
    }
}
