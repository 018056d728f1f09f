//! The metadata service's integration tests, one binary: a server on 127.0.0.1:0 driven over
//! its client and DataNode protocols (`client_rpc`, `service`), its group commit
//! (`group_commit`) and its durability (`durability`).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod client_rpc;
mod durability;
mod group_commit;
mod service;
mod support;
