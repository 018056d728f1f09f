//! What a [`super::FileWriter`] and its streamer task share: the write's first error, the
//! in-flight window, and what the writer reports (bytes acknowledged, the current pipeline,
//! pipeline recoveries).

use crate::error::ClientError;
use sluice_common::DatanodeId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

/// State shared by the writer and its streamer: the first error, the in-flight window, and
/// what the writer can report (bytes acknowledged, the pipeline, recoveries).
#[derive(Debug)]
pub(crate) struct WriterShared {
    error: Mutex<Option<ClientError>>,
    /// One permit per packet not yet acknowledged; closed when the writer fails.
    pub window: Arc<Semaphore>,
    path: String,
    acked: AtomicU64,
    recoveries: AtomicU64,
    pipeline: Mutex<Vec<DatanodeId>>,
}

impl WriterShared {
    /// Shared state with a window of `window` packets.
    pub(crate) fn new(path: &str, window: usize) -> WriterShared {
        WriterShared {
            error: Mutex::new(None),
            window: Arc::new(Semaphore::new(window)),
            path: path.to_string(),
            acked: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            pipeline: Mutex::new(Vec::new()),
        }
    }

    /// Bytes of the file acknowledged by every DataNode of their pipelines.
    pub(crate) fn acked(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }

    /// Counts one pipeline recovery.
    pub(crate) fn count_recovery(&self) {
        self.recoveries.fetch_add(1, Ordering::AcqRel);
    }

    /// Pipeline recoveries so far.
    pub(crate) fn recoveries(&self) -> u64 {
        self.recoveries.load(Ordering::Acquire)
    }

    /// The current block's pipeline (empty between blocks).
    pub(crate) fn pipeline(&self) -> Vec<DatanodeId> {
        self.pipeline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Raises the bytes acknowledged (never lowers them).
    pub(crate) fn set_acked(&self, bytes: u64) {
        self.acked.fetch_max(bytes, Ordering::AcqRel);
    }

    /// Records the current pipeline.
    pub(crate) fn set_pipeline(&self, nodes: &[DatanodeId]) {
        *self.pipeline.lock().unwrap_or_else(|p| p.into_inner()) = nodes.to_vec();
    }

    /// Records the first error and closes the window so that blocked writers wake up.
    pub(crate) fn fail(&self, e: &ClientError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e.clone());
        }
        self.window.close();
    }

    /// The first error, if any.
    pub(crate) fn error(&self) -> Option<ClientError> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The first error, or "writer closed" when the streamer is gone without one.
    pub(crate) fn error_or_closed(&self) -> ClientError {
        self.error().unwrap_or_else(|| ClientError::WriterClosed {
            path: self.path.clone(),
        })
    }
}
