//! The lease renewer: one per [`crate::FileSystem`]. While any writer of that file system is
//! open, a task calls `renew_lease(client_name)` every interval (10 s by default, well inside
//! the metadata service's soft limit), as HDFS's `LeaseRenewer` does. The task starts with the
//! first open writer and stops when the last one closes or is dropped.

use crate::filesystem::FsInner;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, warn};

/// Default interval between renewals.
pub(crate) const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// Counts open writers and runs the renewal task while there are any.
#[derive(Debug)]
pub(crate) struct LeaseRenewer {
    interval: Duration,
    state: Mutex<RenewerState>,
}

#[derive(Debug, Default)]
struct RenewerState {
    writers: usize,
    task: Option<AbortOnDropHandle<()>>,
}

impl LeaseRenewer {
    /// A renewer renewing every `interval`.
    pub(crate) fn new(interval: Duration) -> LeaseRenewer {
        LeaseRenewer {
            interval,
            state: Mutex::new(RenewerState::default()),
        }
    }

    /// Registers an open writer; the renewal task runs while any guard is alive.
    pub(crate) fn acquire(self: &Arc<Self>, fs: Weak<FsInner>) -> LeaseGuard {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.writers += 1;
        if st.task.is_none() {
            let interval = self.interval;
            st.task = Some(AbortOnDropHandle::new(tokio::spawn(renew_loop(
                fs, interval,
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

async fn renew_loop(fs: Weak<FsInner>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // the first tick is immediate: the lease was just taken
    loop {
        ticker.tick().await;
        let Some(fs) = fs.upgrade() else { return };
        let client = fs.client_name.clone();
        let r = fs
            .call("renew_lease", true, |c, ctx| {
                let client = client.clone();
                async move { c.renew_lease(ctx, client).await }
            })
            .await;
        match r {
            Ok(()) => debug!(client = %fs.client_name, "lease renewed"),
            Err(e) => warn!(client = %fs.client_name, error = %e, "lease renewal failed"),
        }
    }
}
