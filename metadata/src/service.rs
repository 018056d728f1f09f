//! The state shared by the RPC handlers, the HTTP server and the monitor: the [`State`] behind
//! one lock, the store to flush, and counters.
//!
//! A change runs in three steps: lock, apply (validated, written to the store as batches, then
//! to memory), unlock; then wait until a flush covers the change's last commit number; then
//! answer. Flushing outside the lock lets concurrent changes share one fsync (the store is a
//! [`crate::store::GroupCommit`], whose batches cost no I/O under the lock), and a change is
//! never acknowledged before it is durable. A reader may see a change a moment before it is
//! durable (as in HDFS, whose edit log is synced after the namespace lock is released); what a
//! change sends out (replica deletions, recovery ids) waits for the flush ([`crate::commit`]).
//!
//! A failed flush stops the service (HDFS aborts the NameNode when the edit log cannot be
//! synced): the clock is marked failed so nothing held leaves, every later request fails with
//! `Storage`, and the shutdown token is cancelled. A restart reads the store back, which holds
//! every acknowledged change.

use crate::metrics::Metrics;
use crate::namespace::storage_error;
use crate::state::State;
use crate::store::{MetaStore, StoreError};
use crate::tokens::Tokens;
use sluice_common::MetaError;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Shared by every task of one metadata server.
pub struct Shared {
    state: Mutex<State>,
    store: Arc<dyn MetaStore>,
    /// Cancelled when a flush fails.
    shutdown: CancellationToken,
    /// RPC counters and latencies (`/metrics`).
    pub metrics: Metrics,
    /// When the server started.
    pub started: Instant,
    /// The bound RPC address.
    pub rpc_addr: SocketAddr,
    /// Block access tokens.
    pub tokens: Tokens,
    /// The secret DataNodes must prove (`None`: any host may join).
    pub cluster_secret: Option<sluice_common::auth::ClusterSecret>,
}

/// The answer to every request once a flush failed.
fn stopped() -> MetaError {
    MetaError::Storage {
        message: "a metadata store flush failed: the service stopped".into(),
    }
}

impl Shared {
    /// Wraps an opened state; a failed flush cancels `shutdown`.
    pub fn new(
        state: State,
        rpc_addr: SocketAddr,
        tokens: Tokens,
        shutdown: CancellationToken,
    ) -> Self {
        Shared {
            tokens,
            cluster_secret: None,
            store: state.store(),
            state: Mutex::new(state),
            shutdown,
            metrics: Metrics::default(),
            started: Instant::now(),
            rpc_addr,
        }
    }

    /// Locks the state. A panic while locked cannot leave it half-changed in the store (batches
    /// are atomic), so a poisoned lock is taken over.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a query (or a change of nothing persisted).
    pub fn read<T>(
        &self,
        method: &'static str,
        f: impl FnOnce(&mut State, Instant) -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        self.metrics.call(method);
        let started = Instant::now();
        let res = if self.store.clock().failed() {
            Err(stopped())
        } else {
            f(&mut self.lock(), Instant::now())
        };
        self.metrics.finish(method, started.elapsed(), res.is_err());
        if let Err(e) = &res {
            tracing::debug!(method, error = %e, "request failed");
        }
        res
    }

    /// Makes every change applied so far durable; a failure stops the service.
    pub async fn flush(&self) -> Result<(), MetaError> {
        let target = self.store.clock().applied();
        self.flush_to(target).await
    }

    /// Waits until every batch up to `seq` is durable, flushing if needed.
    async fn flush_to(&self, seq: u64) -> Result<(), MetaError> {
        let clock = self.store.clock();
        if clock.failed() {
            return Err(stopped());
        }
        if clock.durable() >= seq {
            return Ok(());
        }
        match self.store.flush().await {
            Ok(()) if clock.durable() >= seq => Ok(()),
            Ok(()) => Err(self.fail(StoreError::Backend(format!(
                "flush returned with batch {seq} not durable (durable: {})",
                clock.durable()
            )))),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Stops the service after a failed flush (see the module docs).
    fn fail(&self, e: StoreError) -> MetaError {
        self.store.clock().fail();
        tracing::error!(error = %e, "metadata store flush failed: stopping the service; nothing applied since the last good flush is sent out, restart to recover from the store");
        self.shutdown.cancel();
        storage_error(e)
    }

    /// Runs a change and makes it durable before returning. An error of the change itself
    /// (which may still have applied a batch, e.g. a lease recovery started) is returned once
    /// that is durable too.
    pub async fn write<T>(
        &self,
        method: &'static str,
        f: impl FnOnce(&mut State, Instant) -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        self.metrics.call(method);
        let started = Instant::now();
        let (res, seq) = if self.store.clock().failed() {
            (Err(stopped()), 0)
        } else {
            let mut state = self.lock();
            let res = f(&mut state, Instant::now());
            (res, self.store.clock().applied())
        };
        let res = match self.flush_to(seq).await {
            Ok(()) => res,
            Err(e) => Err(e),
        };
        self.metrics.finish(method, started.elapsed(), res.is_err());
        if let Err(e) = &res {
            tracing::debug!(method, error = %e, "request failed");
        }
        res
    }
}
