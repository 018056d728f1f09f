//! The DataNode's integration tests, one binary: real DataNodes on 127.0.0.1:0 with a fake
//! metadata service and raw framed clients (`support`). One module per area.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod batching;
mod measure;
mod node;
mod pipeline;
mod recovery;
mod robustness;
#[path = "../support/mod.rs"]
mod support;
