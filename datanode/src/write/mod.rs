//! The write path: the `WriteBlock` receiver (connection task), its ack responder, the
//! downstream set-up, and the `ReplicaWriter` actor with its sink — direct, or buffered in
//! memory (write-memory batching, HDFS-17973: [`buffered`], its shared resources in
//! [`buffer`], its idle-flush timer in [`idle`]).

pub mod buffer;
pub mod buffered;
pub mod idle;
pub(crate) mod packet;
pub(crate) mod pipeline;
pub(crate) mod receiver;
pub(crate) mod responder;
pub mod sink;
pub mod state;
pub mod writer;

#[cfg(test)]
mod tests;
