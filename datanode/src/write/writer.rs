//! The `ReplicaWriter` actor: one per replica being written, a thin shell around
//! [`WriteState`]. Each message runs its blocking disk work on the blocking pool and the actor
//! answers with an [`AtomicResponse`], so the next message is not started before the previous
//! one is done: packets reach the file in the order they were sent. Connection tasks use
//! `addr.send(..).await` (bounded mailbox of 16), never `do_send`.

use super::state::WriteState;
use crate::error::{DatanodeError, Result};
use crate::storage::replica::ReplicaEntry;
use actix::prelude::*;
use bytes::Bytes;
use std::sync::{Arc, Mutex};

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

/// The actor.
#[derive(Debug)]
pub struct ReplicaWriter {
    state: Arc<Mutex<WriteState>>,
    io: tokio::runtime::Handle,
}

impl ReplicaWriter {
    /// A writer around `state`; blocking work runs on `io`'s blocking pool.
    pub fn new(state: WriteState, io: tokio::runtime::Handle) -> Self {
        ReplicaWriter {
            state: Arc::new(Mutex::new(state)),
            io,
        }
    }

    /// Runs `f` on the state, off the actor thread, holding the actor until it is done.
    fn run<T, F>(&self, f: F) -> AtomicResponse<Self, Result<T>>
    where
        T: Send + 'static,
        F: FnOnce(&mut WriteState) -> Result<T> + Send + 'static,
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
        AtomicResponse::new(Box::pin(fut.into_actor(self)))
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

    fn handle(&mut self, m: WritePacket, _ctx: &mut Self::Context) -> Self::Result {
        self.run(move |s| s.write_packet(m.offset, &m.data, &m.checksums, m.sync))
    }
}

impl Handler<Finalize> for ReplicaWriter {
    type Result = AtomicResponse<Self, Result<ReplicaEntry>>;

    fn handle(&mut self, _m: Finalize, _ctx: &mut Self::Context) -> Self::Result {
        self.run(|s| s.finalize())
    }
}

impl Handler<Stop> for ReplicaWriter {
    type Result = AtomicResponse<Self, Result<()>>;

    fn handle(&mut self, _m: Stop, _ctx: &mut Self::Context) -> Self::Result {
        self.run(|s| s.stop())
    }
}

impl Handler<Flush> for ReplicaWriter {
    type Result = AtomicResponse<Self, Result<()>>;

    fn handle(&mut self, _m: Flush, _ctx: &mut Self::Context) -> Self::Result {
        self.run(|s| s.flush())
    }
}
