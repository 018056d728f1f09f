//! What every task and actor of one DataNode shares: configuration, identity, the dataset,
//! metrics, the write-memory batching resources, the actor arbiter, the blocking pool, the
//! report queue and the stop signals.

use crate::error::{DatanodeError, Result};
use crate::failpoint::FailScope;
use crate::heartbeat::queue::EventQueue;
use crate::metrics::Metrics;
use crate::storage::dataset::Dataset;
use crate::write::buffer_pool::WriteBuffers;
use actix::ArbiterHandle;
use sluice_common::config::DatanodeConfig;
use sluice_common::frame::FrameCodec;
use sluice_common::proto::Message;
use sluice_common::{DatanodeId, NodeId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Shared state of one DataNode.
#[derive(Debug)]
pub(crate) struct NodeContext {
    pub cfg: DatanodeConfig,
    pub node_id: NodeId,
    pub id: DatanodeId,
    pub dataset: Arc<Dataset>,
    pub metrics: Arc<Metrics>,
    /// Write-memory batching: memory permits, buffer pool, per-volume flush gates.
    pub buffers: Arc<WriteBuffers>,
    /// The read-buffer memory budget (`read.buffer.max.bytes`).
    pub read_memory: crate::read::memory::ReadMemory,
    pub arbiter: ArbiterHandle,
    pub io: tokio::runtime::Handle,
    pub events: Arc<EventQueue>,
    /// Graceful stop: finish what is running, flushing writers.
    pub shutdown: CancellationToken,
    /// Abrupt stop: drop everything at the next await point.
    pub kill: CancellationToken,
    pub scope: FailScope,
    pub registered: AtomicBool,
    /// Whether ops need a block access token, and the keys (set by registration and
    /// heartbeats).
    pub gate: tokio::sync::watch::Sender<crate::server::access::Gate>,
}

impl NodeContext {
    /// A frame codec with the configured maximum frame size.
    pub fn codec(&self) -> FrameCodec<Message> {
        FrameCodec::new(self.cfg.max_frame_bytes.as_usize())
    }

    /// `socket.timeout`.
    pub fn socket_timeout(&self) -> Duration {
        self.cfg.socket_timeout.get()
    }

    /// Runs blocking disk work on the blocking pool.
    pub async fn blocking<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        self.io
            .spawn_blocking(f)
            .await
            .map_err(|_| DatanodeError::ShuttingDown)?
    }

    /// True once registered with the metadata service.
    pub fn is_registered(&self) -> bool {
        self.registered.load(Ordering::Relaxed)
    }

    /// Follows the metadata service's block keys (from a register or heartbeat reply).
    pub fn set_block_keys(&self, keys: Option<sluice_common::token::KeySet>) {
        let gate = crate::server::access::Gate::from_keys(keys);
        self.gate.send_if_modified(|g| {
            let changed = *g != gate;
            *g = gate;
            changed
        });
    }

    pub fn set_registered(&self, v: bool) {
        self.registered.store(v, Ordering::Relaxed);
    }
}

/// A shared context handle.
pub(crate) type Ctx = Arc<NodeContext>;
