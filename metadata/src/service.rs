//! The state shared by the RPC handlers, the HTTP server and the monitor: the [`State`] behind
//! one lock, the store to flush, and counters.
//!
//! A change runs in three steps: lock, apply (validated, written to the store as one batch,
//! then to memory), unlock; then flush the store; then answer. Flushing outside the lock lets
//! concurrent changes share one fsync (sled flushes everything written before the call), and a
//! change is never acknowledged before it is durable. A reader may see a change a moment before
//! it is durable (as in HDFS, whose edit log is synced after the namespace lock is released).

use crate::metrics::RpcMetrics;
use crate::namespace::storage_error;
use crate::state::State;
use crate::store::MetaStore;
use sluice_common::MetaError;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Shared by every task of one metadata server.
pub struct Shared {
    state: Mutex<State>,
    store: Arc<dyn MetaStore>,
    /// RPC counters.
    pub metrics: RpcMetrics,
    /// When the server started.
    pub started: Instant,
    /// The bound RPC address.
    pub rpc_addr: SocketAddr,
}

impl Shared {
    /// Wraps an opened state.
    pub fn new(state: State, rpc_addr: SocketAddr) -> Self {
        Shared {
            store: state.store(),
            state: Mutex::new(state),
            metrics: RpcMetrics::default(),
            started: Instant::now(),
            rpc_addr,
        }
    }

    /// Locks the state. A panic while locked cannot leave it half-changed in the store (batches
    /// are atomic), so a poisoned lock is taken over.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a query.
    pub fn read<T>(
        &self,
        method: &'static str,
        f: impl FnOnce(&mut State, Instant) -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        self.metrics.call(method);
        let res = f(&mut self.lock(), Instant::now());
        if let Err(e) = &res {
            self.metrics.error(method);
            tracing::debug!(method, error = %e, "request failed");
        }
        res
    }

    /// Makes every change applied so far durable.
    pub async fn flush(&self) -> Result<(), MetaError> {
        self.store.flush().await.map_err(storage_error)
    }

    /// Runs a change and makes it durable before returning.
    pub async fn write<T>(
        &self,
        method: &'static str,
        f: impl FnOnce(&mut State, Instant) -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        let value = self.read(method, f)?;
        if let Err(e) = self.store.flush().await {
            self.metrics.error(method);
            tracing::error!(method, error = %e, "metadata store flush failed");
            return Err(storage_error(e));
        }
        Ok(value)
    }
}
