//! [`ClusterBuilder`] and [`EmbeddedCluster`]: start, stop, kill and restart the nodes of an
//! in-process cluster, and wait until its DataNodes are live.

use crate::error::ClusterError;
use sluice_client::{ClientConfig, FileSystem};
use sluice_common::config::{DatanodeConfig, MetadataConfig};
use sluice_common::rpc::NodeState;
use sluice_common::NodeId;
use sluice_datanode::DataNode;
use sluice_metadata::MetadataServer;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long [`ClusterBuilder::start`] waits for the DataNodes by default.
const DEFAULT_LIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the liveness wait asks the metadata service.
const LIVE_POLL: Duration = Duration::from_millis(20);
/// Restarts on a fixed port retry this often while the old listener closes.
const PORT_RETRIES: u32 = 50;
/// The pause between those retries.
const PORT_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Builds an [`EmbeddedCluster`]: the metadata configuration, one configuration per DataNode.
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    metadata: MetadataConfig,
    datanodes: Vec<DatanodeConfig>,
    probe: ClientConfig,
    live_timeout: Duration,
}

impl ClusterBuilder {
    /// A cluster whose metadata service runs with `metadata` (its ports may be 0) and no
    /// DataNodes yet.
    pub fn new(metadata: MetadataConfig) -> ClusterBuilder {
        ClusterBuilder {
            metadata,
            datanodes: Vec::new(),
            probe: ClientConfig::default(),
            live_timeout: DEFAULT_LIVE_TIMEOUT,
        }
    }

    /// Adds one DataNode per configuration; each one's `metadata_address` is set at start.
    pub fn datanodes(mut self, configs: impl IntoIterator<Item = DatanodeConfig>) -> Self {
        self.datanodes.extend(configs);
        self
    }

    /// The client configuration of the liveness probe (its metadata address is set at start).
    /// Default: [`ClientConfig::default`].
    pub fn probe_config(mut self, cfg: ClientConfig) -> Self {
        self.probe = cfg;
        self
    }

    /// How long [`ClusterBuilder::start`] waits for every DataNode to be live. Default 60 s.
    pub fn live_timeout(mut self, limit: Duration) -> Self {
        self.live_timeout = limit;
        self
    }

    /// Starts the metadata service, then the DataNodes, and waits until every DataNode is
    /// live. On failure the nodes already started are cancelled.
    pub async fn start(self) -> Result<EmbeddedCluster, ClusterError> {
        if self.datanodes.is_empty() {
            return Err(ClusterError::NoDataNodes);
        }
        self.metadata.validate()?;
        let mut meta_cfg = self.metadata;
        if meta_cfg.cluster_secret_file.as_os_str().is_empty() {
            // A cluster secret by default, kept next to the metadata directory (the service
            // creates it at its first start).
            let parent = meta_cfg
                .data_dir
                .parent()
                .unwrap_or(std::path::Path::new("."));
            meta_cfg.cluster_secret_file = parent.join("cluster-secret");
        }
        let secret_file = meta_cfg.cluster_secret_file.clone();
        let mut cluster = EmbeddedCluster {
            meta_cfg,
            metadata: None,
            datanodes: Vec::with_capacity(self.datanodes.len()),
            probe: self.probe,
        };
        cluster.start_metadata().await?;
        // Pin the port so that restarts keep the address clients and DataNodes hold.
        cluster.meta_cfg.rpc_port = cluster.metadata_addr().port();
        let metadata_address = cluster.metadata_addr().to_string();
        for cfg in self.datanodes {
            let cluster_secret_file = if cfg.cluster_secret_file.as_os_str().is_empty() {
                secret_file.clone()
            } else {
                cfg.cluster_secret_file.clone()
            };
            cluster.datanodes.push(DnSlot {
                cfg: DatanodeConfig {
                    metadata_address: metadata_address.clone(),
                    cluster_secret_file,
                    ..cfg
                },
                node: None,
                known_id: None,
            });
        }
        for i in 0..cluster.datanodes.len() {
            cluster.start_datanode(i).await?;
        }
        let n = cluster.datanodes.len();
        cluster.wait_live(n, self.live_timeout).await?;
        Ok(cluster)
    }
}

/// A running node and the token that stops it.
struct Running<T> {
    node: T,
    token: CancellationToken,
}

struct DnSlot {
    cfg: DatanodeConfig,
    node: Option<Running<DataNode>>,
    /// The node id, once started (kept while stopped).
    known_id: Option<NodeId>,
}

/// A running in-process cluster. See the crate docs.
pub struct EmbeddedCluster {
    meta_cfg: MetadataConfig,
    metadata: Option<Running<MetadataServer>>,
    datanodes: Vec<DnSlot>,
    probe: ClientConfig,
}

impl EmbeddedCluster {
    /// The metadata service, while it runs.
    pub fn metadata(&self) -> Option<&MetadataServer> {
        self.metadata.as_ref().map(|m| &m.node)
    }

    /// The metadata service's RPC address (kept across its restarts).
    pub fn metadata_addr(&self) -> SocketAddr {
        match &self.metadata {
            Some(m) => m.node.rpc_addr(),
            None => SocketAddr::from(([127, 0, 0, 1], self.meta_cfg.rpc_port)),
        }
    }

    /// The metadata service's configuration (its RPC port pinned after the first start).
    pub fn metadata_config(&self) -> &MetadataConfig {
        &self.meta_cfg
    }

    /// Number of DataNode slots (running or not).
    pub fn datanode_count(&self) -> usize {
        self.datanodes.len()
    }

    /// DataNode `i`, if running.
    pub fn datanode(&self, i: usize) -> Option<&DataNode> {
        self.datanodes
            .get(i)
            .and_then(|s| s.node.as_ref())
            .map(|r| &r.node)
    }

    /// The running DataNodes with their indexes.
    pub fn running_datanodes(&self) -> impl Iterator<Item = (usize, &DataNode)> {
        (0..self.datanodes.len()).filter_map(|i| self.datanode(i).map(|n| (i, n)))
    }

    /// DataNode `i`'s configuration (its ports pinned after its first start).
    pub fn datanode_config(&self, i: usize) -> Option<&DatanodeConfig> {
        self.datanodes.get(i).map(|s| &s.cfg)
    }

    /// Index of the DataNode with this node id (running or not, once started).
    pub fn datanode_index_by_id(&self, id: &NodeId) -> Option<usize> {
        self.datanodes
            .iter()
            .position(|s| s.known_id.as_ref() == Some(id))
    }

    /// Starts the metadata service (again) on its store and, after a first start, its port.
    pub async fn start_metadata(&mut self) -> Result<(), ClusterError> {
        let token = CancellationToken::new();
        let node = MetadataServer::start(self.meta_cfg.clone(), token.clone()).await?;
        self.metadata = Some(Running { node, token });
        Ok(())
    }

    /// Stops the metadata service gracefully (its store stays).
    pub async fn stop_metadata(&mut self) {
        if let Some(m) = self.metadata.take() {
            m.token.cancel();
            m.node.wait().await;
        }
    }

    /// Stops the metadata service gracefully and starts it again on the same store and port.
    pub async fn restart_metadata(&mut self) -> Result<(), ClusterError> {
        self.stop_metadata().await;
        self.start_metadata().await
    }

    /// Starts DataNode `i` (again) on its directories and, after a first start, its ports.
    pub async fn start_datanode(&mut self, i: usize) -> Result<&DataNode, ClusterError> {
        let slot = self
            .datanodes
            .get_mut(i)
            .ok_or(ClusterError::NoSuchDataNode(i))?;
        if slot.node.is_some() {
            return Err(ClusterError::Running(i));
        }
        let token = CancellationToken::new();
        // After a kill the old listener closes a moment later: retry the same port briefly.
        let mut attempt = 0;
        let node = loop {
            match DataNode::start(slot.cfg.clone(), token.clone()).await {
                Ok(node) => break node,
                Err(e) if attempt < PORT_RETRIES && slot.cfg.port != 0 => {
                    attempt += 1;
                    tracing::debug!(error = %e, "DataNode {i} restart: port busy, retrying");
                    tokio::time::sleep(PORT_RETRY_PAUSE).await;
                }
                Err(source) => return Err(ClusterError::DataNode { index: i, source }),
            }
        };
        slot.cfg.port = node.data_addr().port();
        slot.cfg.http_port = node.http_addr().port();
        slot.known_id = Some(node.node_id().clone());
        let running = slot.node.insert(Running { node, token });
        Ok(&running.node)
    }

    /// Stops DataNode `i` gracefully: writers flush what they received.
    pub async fn stop_datanode(&mut self, i: usize) {
        if let Some(r) = self.datanodes.get_mut(i).and_then(|s| s.node.take()) {
            r.token.cancel();
            r.node.wait().await;
        }
    }

    /// Kills DataNode `i` abruptly: no flush, no finalize; its files stay as they are.
    pub fn kill_datanode(&mut self, i: usize) {
        if let Some(r) = self.datanodes.get_mut(i).and_then(|s| s.node.take()) {
            r.token.cancel();
            r.node.kill();
        }
    }

    /// Stops DataNode `i` gracefully and starts it again on the same storage and ports.
    pub async fn restart_datanode(&mut self, i: usize) -> Result<&DataNode, ClusterError> {
        self.stop_datanode(i).await;
        self.start_datanode(i).await
    }

    /// Live DataNodes as the metadata service reports them.
    pub async fn live_datanodes(&self) -> Result<usize, ClusterError> {
        let fs = self.probe().await?;
        live_count(&fs).await
    }

    /// Waits until the metadata service reports at least `n` live DataNodes, for up to
    /// `limit`.
    pub async fn wait_live(&self, n: usize, limit: Duration) -> Result<(), ClusterError> {
        let fs = self.probe().await?;
        let deadline = Instant::now() + limit;
        loop {
            let live = live_count(&fs).await?;
            if live >= n {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::NotLive {
                    live,
                    wanted: n,
                    after: limit,
                });
            }
            tokio::time::sleep(LIVE_POLL).await;
        }
    }

    /// Stops every node gracefully (DataNodes first) and waits for them.
    pub async fn stop(mut self) {
        for i in 0..self.datanodes.len() {
            self.stop_datanode(i).await;
        }
        self.stop_metadata().await;
    }

    async fn probe(&self) -> Result<FileSystem, ClusterError> {
        let cfg = ClientConfig {
            metadata_address: self.metadata_addr().to_string(),
            ..self.probe.clone()
        };
        Ok(FileSystem::connect(cfg).await?)
    }
}

async fn live_count(fs: &FileSystem) -> Result<usize, ClusterError> {
    let report = fs.cluster_report().await?;
    Ok(report
        .datanodes
        .iter()
        .filter(|d| d.state == NodeState::Live)
        .count())
}

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        for slot in &mut self.datanodes {
            if let Some(r) = slot.node.take() {
                r.token.cancel();
                r.node.kill();
            }
        }
        if let Some(m) = self.metadata.take() {
            m.token.cancel();
        }
    }
}
