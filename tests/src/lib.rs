//! Sluice's in-process test cluster and the helpers its tests share.
//!
//! [`MiniCluster`] runs a metadata service and N DataNodes in the test's own process, each on
//! `127.0.0.1:0` with its own temporary directory, talking over real sockets and writing real
//! files. Nodes can be stopped, killed and restarted on the same storage (and the same ports, so
//! addresses held by clients stay valid). Dropping the cluster cancels every node and removes
//! its directories. Modelled on HDFS's `MiniDFSCluster` and TiKV's test cluster.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let cluster = sluice_tests::MiniCluster::builder().datanodes(3).start().await?;
//! let fs = cluster.client().await?;
//! # Ok(()) }
//! ```

mod cluster;
pub(crate) mod data;
pub mod http;
pub mod lazyfs;
pub mod power;
pub mod process;
pub mod proxy;
pub mod raw;

pub use cluster::{MiniCluster, MiniClusterBuilder};
pub use data::{read_all, write_all};
pub use sluice_testkit::{random_bytes, wait_for, wait_until, with_timeout, within};

/// Holds the process-wide `fail` registry for one failpoint test: waits for the previous test
/// to end, clears every failpoint now and again when dropped (even when the test panics).
pub fn failpoint_scenario() -> fail::FailScenario<'static> {
    fail::FailScenario::setup()
}

/// Installs a test log subscriber once (level from `RUST_LOG`, default `warn`).
pub fn init_logging() {
    sluice_common::telemetry::init("warn");
}
