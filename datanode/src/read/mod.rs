//! The read path: the `BlockReader` task for streaming reads with its read-ahead window and
//! kernel advice, the classic one-chunk read, `ReplicaInfo`, range reading with checksums, and
//! the node-wide read-buffer memory cap.

pub(crate) mod memory;
pub mod prefetch;
pub mod range;
pub mod reader;
pub(crate) mod serve;
pub mod window;
