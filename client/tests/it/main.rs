//! The client's integration tests, one binary: the client against a fake metadata service and
//! fake DataNodes on real sockets (`support`, `sluice-testkit`). One module per area.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod read;
mod stamp;
mod support;
mod throughput;
mod write;
