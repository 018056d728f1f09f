//! What one [`super::FileReader`] has done: requests sent, bytes received, what it buffers,
//! which DataNode serves it and which it excluded. For diagnostics, the benchmark, and tests
//! that check reads inside the buffer stay off the network.

use sluice_common::{DatanodeId, NodeId};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters shared by a reader's cursor, streams and positioned reads.
#[derive(Debug, Default)]
pub(crate) struct ReadCounters {
    requests: AtomicU64,
    positioned_requests: AtomicU64,
    bytes_received: AtomicU64,
    reported_bad: AtomicU64,
    stamp_mismatches: AtomicU64,
}

impl ReadCounters {
    /// A `ReadBlock` or `ReadChunk` sent for sequential reads.
    pub(crate) fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A `ReadBlock` or `ReadChunk` sent for a positioned read.
    pub(crate) fn positioned_request(&self) {
        self.positioned_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Data bytes received.
    pub(crate) fn received(&self, n: usize) {
        self.bytes_received.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A replica reported to the metadata service.
    pub(crate) fn reported_bad(&self) {
        self.reported_bad.fetch_add(1, Ordering::Relaxed);
    }

    /// A replica refused for its generation stamp ([`crate::ClientError::GenStampMismatch`]).
    pub(crate) fn stamp_mismatch(&self) {
        self.stamp_mismatches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ReadStats {
        ReadStats {
            requests: self.requests.load(Ordering::Relaxed),
            positioned_requests: self.positioned_requests.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
            reported_bad: self.reported_bad.load(Ordering::Relaxed),
            stamp_mismatches: self.stamp_mismatches.load(Ordering::Relaxed),
            ..ReadStats::default()
        }
    }
}

/// A snapshot of a reader's activity ([`super::FileReader::stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// `ReadBlock` (stream mode) or `ReadChunk` (chunk mode) requests sent for sequential
    /// reads. Reads and seeks inside the buffer send none.
    pub requests: u64,
    /// Requests sent by positioned reads (`read_at`).
    pub positioned_requests: u64,
    /// Data bytes received from DataNodes, all requests included.
    pub bytes_received: u64,
    /// Bytes received and not yet read, held for the current block (at most
    /// `read.buffer.bytes` in stream mode, one chunk in chunk mode).
    pub buffered: u64,
    /// Index of the current block in the file, if one is open.
    pub block_index: Option<usize>,
    /// The DataNode serving the current block.
    pub datanode: Option<DatanodeId>,
    /// DataNodes excluded for the current block after they failed.
    pub excluded: Vec<NodeId>,
    /// Replicas reported to the metadata service as corrupt.
    pub reported_bad: u64,
    /// Answers refused because the replica carried another generation stamp than the
    /// metadata service gave ([`crate::ClientError::GenStampMismatch`]): refused by the
    /// DataNode, or served and dropped by the reader.
    pub stamp_mismatches: u64,
}
