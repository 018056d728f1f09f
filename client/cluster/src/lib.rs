//! Sluice's embedded cluster: a metadata service and N DataNodes in one process, on real
//! sockets and files. The one place that starts such a cluster and waits until its DataNodes
//! are live; `sluice local`, every `sluice bench` and the test MiniCluster use it.
//!
//! [`ClusterBuilder`] takes the metadata configuration and one configuration per DataNode
//! (their `metadata_address` is filled in once the metadata service is bound), starts
//! everything and waits for the DataNodes to register and heartbeat. [`EmbeddedCluster`] then
//! stops, kills and restarts single nodes on the same storage and ports, and stops the whole
//! cluster gracefully. Dropping it cancels every node.
//!
//! ```no_run
//! # async fn demo(meta: sluice_common::config::MetadataConfig,
//! #               dn: sluice_common::config::DatanodeConfig) -> Result<(), sluice_cluster::ClusterError> {
//! let cluster = sluice_cluster::ClusterBuilder::new(meta)
//!     .datanodes((0..3).map(|_| dn.clone()))
//!     .start()
//!     .await?;
//! println!("metadata at {}", cluster.metadata_addr());
//! cluster.stop().await;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod cluster;
mod error;

pub use cluster::{ClusterBuilder, EmbeddedCluster};
pub use error::ClusterError;
