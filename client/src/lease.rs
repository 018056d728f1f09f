//! The lease renewer: one per [`crate::FileSystem`]. While any writer of that file system is
//! open, a task calls `renew_lease(client_name)` every interval (10 s by default, well inside
//! the metadata service's soft limit), as HDFS's `LeaseRenewer` does. The task starts with the
//! first open writer and stops when the last one closes or is dropped. It calls the metadata
//! service through the [`MetadataClient`] it was given, and knows nothing of writers beyond
//! their guards.

use crate::meta::MetadataClient;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, warn};

/// Default interval between renewals.
pub(crate) const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// Counts open writers and runs the renewal task while there are any.
#[derive(Debug)]
pub(crate) struct LeaseRenewer {
    meta: Arc<MetadataClient>,
    interval: Duration,
    state: Mutex<RenewerState>,
}

#[derive(Debug, Default)]
struct RenewerState {
    writers: usize,
    task: Option<AbortOnDropHandle<()>>,
}

impl LeaseRenewer {
    /// A renewer renewing the leases of `meta`'s client name every `interval`.
    pub(crate) fn new(meta: Arc<MetadataClient>, interval: Duration) -> LeaseRenewer {
        LeaseRenewer {
            meta,
            interval,
            state: Mutex::new(RenewerState::default()),
        }
    }

    /// Registers an open writer; the renewal task runs while any guard is alive.
    pub(crate) fn acquire(self: &Arc<Self>) -> LeaseGuard {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.writers += 1;
        if st.task.is_none() {
            let meta = Arc::clone(&self.meta);
            st.task = Some(AbortOnDropHandle::new(tokio::spawn(renew_loop(
                meta,
                self.interval,
            ))));
        }
        LeaseGuard {
            renewer: Some(Arc::clone(self)),
        }
    }

    fn release(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.writers = st.writers.saturating_sub(1);
        if st.writers == 0 {
            st.task = None;
        }
    }
}

/// Keeps the lease renewed while alive (one per open writer).
#[derive(Debug)]
pub(crate) struct LeaseGuard {
    renewer: Option<Arc<LeaseRenewer>>,
}

impl LeaseGuard {
    /// Stops counting this writer now (idempotent).
    pub(crate) fn release(&mut self) {
        if let Some(r) = self.renewer.take() {
            r.release();
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.release();
    }
}

/// Renews every `interval` until aborted (when the last guard goes).
async fn renew_loop(meta: Arc<MetadataClient>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // the first tick is immediate: the lease was just taken
    loop {
        ticker.tick().await;
        match meta.renew_lease().await {
            Ok(()) => debug!(client = %meta.client_name(), "lease renewed"),
            Err(e) => warn!(client = %meta.client_name(), error = %e, "lease renewal failed"),
        }
    }
}
