//! [`MiniCluster`]: a metadata service and DataNodes in one process, on real sockets and files.

use crate::proxy::{self, DnProxy, LinkFaults};
use anyhow::Context;
use sluice_client::FileSystem;
use sluice_common::config::{
    ByteSize, ClientConfig, DatanodeConfig, HumanDuration, MetadataConfig, Millis, PathList,
};
use sluice_common::rpc::NodeState;
use sluice_datanode::DataNode;
use sluice_metadata::MetadataServer;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

type DnHook = Arc<dyn Fn(usize, &mut DatanodeConfig) + Send + Sync>;
type MetaHook = Arc<dyn Fn(&mut MetadataConfig) + Send + Sync>;
type ClientHook = Arc<dyn Fn(&mut ClientConfig) + Send + Sync>;

/// Builds a [`MiniCluster`]. Every setter documents its default.
#[derive(Clone)]
pub struct MiniClusterBuilder {
    datanodes: usize,
    volumes: usize,
    block_size: u64,
    replication: u16,
    heartbeat: Duration,
    stale: Duration,
    dead: Duration,
    dn_hook: Option<DnHook>,
    meta_hook: Option<MetaHook>,
    client_hook: Option<ClientHook>,
    link_proxies: bool,
}

impl Default for MiniClusterBuilder {
    fn default() -> Self {
        Self {
            datanodes: 3,
            volumes: 1,
            block_size: 1024 * 1024,
            replication: 3,
            heartbeat: Duration::from_millis(100),
            stale: Duration::from_secs(3),
            dead: Duration::from_secs(10),
            dn_hook: None,
            meta_hook: None,
            client_hook: None,
            link_proxies: false,
        }
    }
}

impl MiniClusterBuilder {
    /// Number of DataNodes. Default 3.
    pub fn datanodes(mut self, n: usize) -> Self {
        self.datanodes = n;
        self
    }
    /// Volumes (data directories) per DataNode. Default 1.
    pub fn volumes_per_datanode(mut self, n: usize) -> Self {
        self.volumes = n.max(1);
        self
    }
    /// Default block size of new files. Default 1 MiB, so that modest test files span blocks.
    pub fn block_size(mut self, bytes: u64) -> Self {
        self.block_size = bytes;
        self
    }
    /// Default replication factor. Default 3.
    pub fn replication(mut self, r: u16) -> Self {
        self.replication = r;
        self
    }
    /// DataNode heartbeat interval. Default 100 ms.
    pub fn heartbeat(mut self, d: Duration) -> Self {
        self.heartbeat = d;
        self
    }
    /// Stale and dead intervals of the metadata service. Default 3 s and 10 s.
    pub fn liveness(mut self, stale: Duration, dead: Duration) -> Self {
        self.stale = stale;
        self.dead = dead;
        self
    }
    /// Adjusts each DataNode's configuration (called with its index). Default: none.
    pub fn configure_datanodes(
        mut self,
        f: impl Fn(usize, &mut DatanodeConfig) + Send + Sync + 'static,
    ) -> Self {
        self.dn_hook = Some(Arc::new(f));
        self
    }
    /// Adjusts the metadata service's configuration. Default: none.
    pub fn configure_metadata(
        mut self,
        f: impl Fn(&mut MetadataConfig) + Send + Sync + 'static,
    ) -> Self {
        self.meta_hook = Some(Arc::new(f));
        self
    }
    /// Adjusts the configuration of clients made by [`MiniCluster::client`]. Default: none.
    pub fn configure_client(
        mut self,
        f: impl Fn(&mut ClientConfig) + Send + Sync + 'static,
    ) -> Self {
        self.client_hook = Some(Arc::new(f));
        self
    }

    /// Puts a per-link TCP proxy in front of every DataNode so that tests can cut, stall, delay
    /// or corrupt the traffic between the client and a DataNode or between two DataNodes (see
    /// [`crate::proxy`] and [`MiniCluster::link_faults`]). DataNode `i` then binds
    /// `127.0.0.<i+2>`. Default off.
    pub fn link_proxies(mut self, on: bool) -> Self {
        self.link_proxies = on;
        self
    }

    /// Starts the metadata service and the DataNodes and waits until every DataNode is live.
    pub async fn start(self) -> anyhow::Result<MiniCluster> {
        let dir = tempfile::Builder::new().prefix("sluice-mini-").tempdir()?;
        let mut meta_cfg = MetadataConfig {
            bind_host: "127.0.0.1".into(),
            rpc_port: 0,
            http_port: 0,
            data_dir: dir.path().join("metadata"),
            default_replication: self.replication,
            min_replication: 1,
            default_block_size: ByteSize(self.block_size),
            min_block_size: ByteSize(512),
            stale_interval: HumanDuration(self.stale),
            dead_interval: HumanDuration(self.dead),
            monitor_interval: HumanDuration::millis(100),
            ..MetadataConfig::default()
        };
        if let Some(hook) = &self.meta_hook {
            hook(&mut meta_cfg);
        }
        let faults = self.link_proxies.then(LinkFaults::default);
        let mut cluster = MiniCluster {
            dir,
            builder: self,
            meta_cfg,
            metadata: None,
            datanodes: Vec::new(),
            faults,
        };
        cluster.start_metadata().await?;
        // Pin the port so that restarts keep the address clients and DataNodes hold.
        cluster.meta_cfg.rpc_port = cluster.metadata_addr().port();
        for i in 0..cluster.builder.datanodes {
            let mut cfg = cluster.datanode_config(i);
            let proxy = match &cluster.faults {
                Some(faults) => Some(put_behind_proxy(i, &mut cfg, faults).await?),
                None => None,
            };
            cluster.datanodes.push(DnSlot {
                cfg,
                node: None,
                proxy,
                known_id: None,
            });
            cluster.start_datanode(i).await?;
        }
        cluster.wait_live(cluster.builder.datanodes).await?;
        Ok(cluster)
    }
}

struct MetaSlot {
    server: MetadataServer,
    token: CancellationToken,
}

struct DnSlot {
    cfg: DatanodeConfig,
    node: Option<(DataNode, CancellationToken)>,
    proxy: Option<DnProxy>,
    /// The node id, once started (kept while stopped).
    known_id: Option<sluice_common::NodeId>,
}

/// Starts DataNode `i`'s proxy and makes the DataNode bind its own address and advertise the
/// proxy.
async fn put_behind_proxy(
    i: usize,
    cfg: &mut DatanodeConfig,
    faults: &LinkFaults,
) -> anyhow::Result<DnProxy> {
    let ip = proxy::datanode_ip(i)?;
    let proxy = DnProxy::start(ip, i, faults.clone()).await?;
    cfg.bind_host = ip.to_string();
    cfg.advertised_host = ip.to_string();
    cfg.advertised_port = proxy.addr().port();
    Ok(proxy)
}

/// A running in-process cluster. See the module docs.
pub struct MiniCluster {
    dir: tempfile::TempDir,
    builder: MiniClusterBuilder,
    meta_cfg: MetadataConfig,
    metadata: Option<MetaSlot>,
    datanodes: Vec<DnSlot>,
    faults: Option<LinkFaults>,
}

impl MiniCluster {
    /// A builder with the documented defaults.
    pub fn builder() -> MiniClusterBuilder {
        MiniClusterBuilder::default()
    }

    /// The metadata service's RPC address.
    pub fn metadata_addr(&self) -> SocketAddr {
        match &self.metadata {
            Some(m) => m.server.rpc_addr(),
            None => SocketAddr::from(([127, 0, 0, 1], self.meta_cfg.rpc_port)),
        }
    }

    /// The metadata service's HTTP address (while it runs).
    pub fn metadata_http_addr(&self) -> Option<SocketAddr> {
        self.metadata.as_ref().map(|m| m.server.http_addr())
    }

    /// The client configuration of this cluster (after the builder's client hook).
    pub fn client_config(&self) -> ClientConfig {
        let mut cfg = ClientConfig {
            metadata_address: self.metadata_addr().to_string(),
            socket_timeout: HumanDuration::secs(10),
            rpc_timeout: HumanDuration::secs(10),
            ..ClientConfig::default()
        };
        if let Some(hook) = &self.builder.client_hook {
            hook(&mut cfg);
        }
        cfg
    }

    /// A connected client.
    pub async fn client(&self) -> anyhow::Result<FileSystem> {
        Ok(FileSystem::connect(self.client_config()).await?)
    }

    /// A connected client with a custom configuration (its metadata address is filled in).
    pub async fn client_with(
        &self,
        f: impl FnOnce(&mut ClientConfig),
    ) -> anyhow::Result<FileSystem> {
        let mut cfg = self.client_config();
        f(&mut cfg);
        Ok(FileSystem::connect(cfg).await?)
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
            .map(|(n, _)| n)
    }

    /// Index of the running DataNode whose data address is `addr` (as registered).
    pub fn datanode_index_by_addr(&self, addr: &str) -> Option<usize> {
        self.datanodes.iter().position(|s| {
            s.node
                .as_ref()
                .is_some_and(|(n, _)| n.datanode_id().data_addr == addr)
        })
    }

    /// The per-link faults, when the cluster runs with
    /// [`MiniClusterBuilder::link_proxies`].
    pub fn link_faults(&self) -> Option<&LinkFaults> {
        self.faults.as_ref()
    }

    /// Index of the DataNode with this node id (running or not).
    pub fn datanode_index_by_id(&self, id: &sluice_common::NodeId) -> Option<usize> {
        self.datanodes
            .iter()
            .position(|s| s.known_id.as_ref() == Some(id))
    }

    /// The volume directories of DataNode `i`.
    pub fn datanode_dirs(&self, i: usize) -> Vec<PathBuf> {
        self.datanodes
            .get(i)
            .map(|s| s.cfg.data_dirs.0.clone())
            .unwrap_or_default()
    }

    /// The cluster's temporary root directory.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    fn datanode_config(&self, i: usize) -> DatanodeConfig {
        let vols = (0..self.builder.volumes)
            .map(|v| {
                self.dir
                    .path()
                    .join(format!("dn{i}"))
                    .join(format!("vol{v}"))
            })
            .collect();
        let mut cfg = DatanodeConfig {
            metadata_address: self.metadata_addr().to_string(),
            bind_host: "127.0.0.1".into(),
            port: 0,
            http_port: 0,
            data_dirs: PathList(vols),
            heartbeat_interval: HumanDuration(self.builder.heartbeat),
            socket_timeout: HumanDuration::secs(10),
            // Tests check exact bytes on disk after close, not timing: keep the idle flush
            // short so silent writers reach disk quickly.
            write_buffer_idle_flush_timeout: Millis::new(200),
            ..DatanodeConfig::default()
        };
        if let Some(hook) = &self.builder.dn_hook {
            hook(i, &mut cfg);
        }
        cfg
    }

    async fn start_metadata(&mut self) -> anyhow::Result<()> {
        let token = CancellationToken::new();
        let server = MetadataServer::start(self.meta_cfg.clone(), token.clone())
            .await
            .context("starting the metadata service")?;
        self.metadata = Some(MetaSlot { server, token });
        Ok(())
    }

    /// Stops the metadata service gracefully and starts it again on the same store and port.
    pub async fn restart_metadata(&mut self) -> anyhow::Result<()> {
        self.stop_metadata().await;
        self.start_metadata().await
    }

    /// Stops the metadata service gracefully (its store stays).
    pub async fn stop_metadata(&mut self) {
        if let Some(m) = self.metadata.take() {
            m.token.cancel();
            m.server.wait().await;
        }
    }

    /// Starts DataNode `i` (again) on its directories and, after a first start, its ports.
    pub async fn start_datanode(&mut self, i: usize) -> anyhow::Result<()> {
        let slot = self
            .datanodes
            .get_mut(i)
            .with_context(|| format!("no DataNode {i}"))?;
        anyhow::ensure!(slot.node.is_none(), "DataNode {i} is running");
        let token = CancellationToken::new();
        // After a kill the old listener closes a moment later: retry the same port briefly.
        let mut attempt = 0;
        let node = loop {
            match DataNode::start(slot.cfg.clone(), token.clone()).await {
                Ok(node) => break node,
                Err(e) if attempt < 50 && slot.cfg.port != 0 => {
                    attempt += 1;
                    tracing::debug!(error = %e, "DataNode {i} restart: port busy, retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e).context(format!("starting DataNode {i}")))
                }
            }
        };
        slot.cfg.port = node.data_addr().port();
        if let Some(p) = &slot.proxy {
            p.set_target(node.data_addr());
        }
        slot.known_id = Some(node.node_id().clone());
        slot.cfg.http_port = node.http_addr().port();
        slot.node = Some((node, token));
        Ok(())
    }

    /// Stops DataNode `i` gracefully: writers flush what they received.
    pub async fn stop_datanode(&mut self, i: usize) {
        if let Some((node, token)) = self.datanodes.get_mut(i).and_then(|s| s.node.take()) {
            token.cancel();
            node.wait().await;
        }
    }

    /// Kills DataNode `i` abruptly: no flush, no finalize; its files stay as they are.
    pub fn kill_datanode(&mut self, i: usize) {
        if let Some((node, token)) = self.datanodes.get_mut(i).and_then(|s| s.node.take()) {
            token.cancel();
            node.kill();
        }
    }

    /// Stops DataNode `i` gracefully and starts it again on the same storage and ports.
    pub async fn restart_datanode(&mut self, i: usize) -> anyhow::Result<()> {
        self.stop_datanode(i).await;
        self.start_datanode(i).await
    }

    /// Waits until the metadata service reports at least `n` live DataNodes.
    pub async fn wait_live(&self, n: usize) -> anyhow::Result<()> {
        let fs = self.client().await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let report = fs.cluster_report().await?;
            let live = report
                .datanodes
                .iter()
                .filter(|d| d.state == NodeState::Live)
                .count();
            if live >= n {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "only {live} of {n} DataNodes live after 20 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every replica block file `blk_<id>` of `block_id` on DataNode `i` (any state).
    pub fn replica_files(&self, i: usize, block_id: u64) -> Vec<PathBuf> {
        let name = format!("blk_{block_id}");
        let mut out = Vec::new();
        for dir in self.datanode_dirs(i) {
            find_files(&dir, &name, &mut out);
        }
        out
    }

    /// Stops everything gracefully and removes the directories.
    pub async fn shutdown(mut self) {
        for i in 0..self.datanodes.len() {
            self.stop_datanode(i).await;
        }
        self.stop_metadata().await;
    }
}

fn find_files(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            find_files(&p, name, out);
        } else if p.file_name().and_then(|n| n.to_str()) == Some(name) {
            out.push(p);
        }
    }
}

impl Drop for MiniCluster {
    fn drop(&mut self) {
        for slot in &mut self.datanodes {
            if let Some((node, token)) = slot.node.take() {
                token.cancel();
                node.kill();
            }
        }
        if let Some(m) = self.metadata.take() {
            m.token.cancel();
        }
    }
}
