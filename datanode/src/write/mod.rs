//! The write path: the `WriteBlock` receiver (connection task), its ack responder, the
//! downstream set-up, and the `ReplicaWriter` actor with its sink.

pub(crate) mod packet;
pub(crate) mod pipeline;
pub(crate) mod receiver;
pub(crate) mod responder;
pub mod sink;
pub mod state;
pub mod writer;
