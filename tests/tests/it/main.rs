//! Sluice's end-to-end tests, one binary: MiniClusters (in-process, real sockets and files),
//! process clusters (the service binaries, SIGKILL), the FUSE power-loss rig and the WebHDFS
//! gateway. One module per area. The tests that cut the power under a metadata store have
//! binaries of their own (`power_loss`, `power_loss_random`, `power_failpoints`): see there.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod append;
mod batching;
mod data_limits;
mod foundation;
mod hflush_processes;
mod hostile;
mod hostile_processes;
mod hostile_traffic;
mod lazyfs;
mod metrics;
mod namespace_processes;
mod read;
mod read_stamp;
mod recovery;
mod recovery_processes;
mod repair;
mod security;
mod security_switch;
mod webhdfs;
mod webhdfs_data;
mod webui;

/// The commands of the process tests (`hflush_processes`, `recovery_processes`): this package's
/// `sluice-proc` binary, which cargo builds for these tests.
pub fn binaries() -> sluice_tests::process::Binaries {
    sluice_tests::process::Binaries::new(env!("CARGO_BIN_EXE_sluice-proc"))
}
