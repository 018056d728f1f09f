//! The read path: the `BlockReader` actor for streaming reads, the classic one-chunk read,
//! `ReplicaInfo`, range reading with checksums, and the prefetch hook.

pub mod prefetch;
pub mod range;
pub mod reader;
pub(crate) mod serve;
