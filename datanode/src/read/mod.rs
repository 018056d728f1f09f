//! The read path: the `BlockReader` task for streaming reads with its read-ahead window and
//! kernel advice, the classic one-chunk read, `ReplicaInfo`, and range reading with checksums.

pub mod prefetch;
pub mod range;
pub mod reader;
pub(crate) mod serve;
pub mod window;
