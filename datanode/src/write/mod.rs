//! The write path: the `WriteBlock` receiver (connection task), its ack responder, the
//! downstream set-up, and the `ReplicaWriter` actor with its sink — direct, or buffered in
//! memory (write-memory batching, HDFS-17973: [`buffered_sink`], its shared resources in
//! [`buffer_pool`], its idle-flush timer in [`idle`]).

pub mod buffer_pool;
pub(crate) mod buffered_sink;
pub(crate) mod idle;
pub(crate) mod packet;
pub(crate) mod pipeline;
pub(crate) mod receiver;
pub(crate) mod responder;
pub(crate) mod sink;
pub(crate) mod writer_actor;
pub(crate) mod writer_core;

#[cfg(test)]
mod tests;
