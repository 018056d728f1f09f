//! [`ClusterError`]: why an embedded cluster did not start or a node did not (re)start.

use std::time::Duration;

/// An embedded cluster's failure, naming the node it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A configuration was refused before anything started.
    #[error("invalid configuration: {0}")]
    Config(#[from] sluice_common::config::ConfigError),
    /// The metadata service did not start.
    #[error("starting the metadata service: {0}")]
    Metadata(#[from] sluice_metadata::MetadataError),
    /// A DataNode did not start.
    #[error("starting DataNode {index}: {source}")]
    DataNode {
        /// The DataNode's index in the cluster.
        index: usize,
        /// Why.
        #[source]
        source: sluice_datanode::DatanodeError,
    },
    /// The metadata service could not be asked which DataNodes are live.
    #[error("asking the metadata service for live DataNodes: {0}")]
    Client(#[from] sluice_client::ClientError),
    /// Fewer DataNodes than wanted were live when the wait ended.
    #[error("only {live} of {wanted} DataNodes live after {after:?}")]
    NotLive {
        /// Live DataNodes at the end of the wait.
        live: usize,
        /// DataNodes waited for.
        wanted: usize,
        /// How long the wait lasted.
        after: Duration,
    },
    /// The cluster has no DataNode with this index.
    #[error("no DataNode {0}")]
    NoSuchDataNode(usize),
    /// DataNode `index` is already running.
    #[error("DataNode {0} is running")]
    Running(usize),
    /// The cluster was built without any DataNode.
    #[error("an embedded cluster needs at least one DataNode")]
    NoDataNodes,
}
