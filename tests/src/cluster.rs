//! [`MiniCluster`]: a metadata service and DataNodes in one process, on real sockets and files
//! ([`sluice_cluster::EmbeddedCluster`]), with temporary directories, per-test configuration hooks
//! and optional per-link fault proxies.

use crate::proxy::{self, DnProxy, LinkFaults};
use sluice_client::FileSystem;
use sluice_cluster::{ClusterBuilder, EmbeddedCluster};
use sluice_common::config::{
    ByteSize, ClientConfig, DatanodeConfig, HumanDuration, MetadataConfig, Millis, PathList,
};
use sluice_datanode::DataNode;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long the MiniCluster waits for DataNodes to be live.
const LIVE_TIMEOUT: Duration = Duration::from_secs(20);

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

    /// Starts the metadata service and the DataNodes ([`sluice_cluster::ClusterBuilder`]) and
    /// waits until every DataNode is live.
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
        let mut configs = Vec::with_capacity(self.datanodes);
        let mut proxies = Vec::with_capacity(self.datanodes);
        for i in 0..self.datanodes {
            let mut cfg = self.datanode_config(dir.path(), i);
            proxies.push(match &faults {
                Some(faults) => Some(put_behind_proxy(i, &mut cfg, faults).await?),
                None => None,
            });
            configs.push(cfg);
        }
        let cluster = ClusterBuilder::new(meta_cfg)
            .datanodes(configs)
            .probe_config(self.client_config(""))
            .live_timeout(LIVE_TIMEOUT)
            .start()
            .await?;
        let mini = MiniCluster {
            dir,
            builder: self,
            cluster,
            proxies,
            faults,
        };
        for i in 0..mini.datanode_count() {
            mini.aim_proxy(i);
        }
        Ok(mini)
    }

    /// The configuration of this cluster's clients (after the client hook).
    fn client_config(&self, metadata_address: &str) -> ClientConfig {
        let mut cfg = ClientConfig {
            metadata_address: metadata_address.to_string(),
            socket_timeout: HumanDuration::secs(10),
            rpc_timeout: HumanDuration::secs(10),
            ..ClientConfig::default()
        };
        if let Some(hook) = &self.client_hook {
            hook(&mut cfg);
        }
        cfg
    }

    /// DataNode `i`'s configuration under `root` (after the DataNode hook).
    fn datanode_config(&self, root: &Path, i: usize) -> DatanodeConfig {
        let vols = (0..self.volumes)
            .map(|v| root.join(format!("dn{i}")).join(format!("vol{v}")))
            .collect();
        let mut cfg = DatanodeConfig {
            bind_host: "127.0.0.1".into(),
            port: 0,
            http_port: 0,
            data_dirs: PathList(vols),
            heartbeat_interval: HumanDuration(self.heartbeat),
            socket_timeout: HumanDuration::secs(10),
            // Tests check exact bytes on disk after close, not timing: keep the idle flush
            // short so silent writers reach disk quickly.
            write_buffer_idle_flush_timeout: Millis::new(200),
            ..DatanodeConfig::default()
        };
        if let Some(hook) = &self.dn_hook {
            hook(i, &mut cfg);
        }
        cfg
    }
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
    cluster: EmbeddedCluster,
    /// DataNode `i`'s link proxy, with [`MiniClusterBuilder::link_proxies`].
    proxies: Vec<Option<DnProxy>>,
    faults: Option<LinkFaults>,
}

impl MiniCluster {
    /// A builder with the documented defaults.
    pub fn builder() -> MiniClusterBuilder {
        MiniClusterBuilder::default()
    }

    /// The metadata service's RPC address.
    pub fn metadata_addr(&self) -> SocketAddr {
        self.cluster.metadata_addr()
    }

    /// The metadata service's HTTP address (while it runs).
    pub fn metadata_http_addr(&self) -> Option<SocketAddr> {
        self.cluster.metadata().map(|m| m.http_addr())
    }

    /// The client configuration of this cluster (after the builder's client hook).
    pub fn client_config(&self) -> ClientConfig {
        self.builder
            .client_config(&self.metadata_addr().to_string())
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
        self.cluster.datanode_count()
    }

    /// DataNode `i`, if running.
    pub fn datanode(&self, i: usize) -> Option<&DataNode> {
        self.cluster.datanode(i)
    }

    /// Index of the running DataNode whose data address is `addr` (as registered).
    pub fn datanode_index_by_addr(&self, addr: &str) -> Option<usize> {
        self.cluster
            .running_datanodes()
            .find(|(_, n)| n.datanode_id().data_addr == addr)
            .map(|(i, _)| i)
    }

    /// The per-link faults, when the cluster runs with
    /// [`MiniClusterBuilder::link_proxies`].
    pub fn link_faults(&self) -> Option<&LinkFaults> {
        self.faults.as_ref()
    }

    /// Index of the DataNode with this node id (running or not).
    pub fn datanode_index_by_id(&self, id: &sluice_common::NodeId) -> Option<usize> {
        self.cluster.datanode_index_by_id(id)
    }

    /// The volume directories of DataNode `i`.
    pub fn datanode_dirs(&self, i: usize) -> Vec<PathBuf> {
        self.cluster
            .datanode_config(i)
            .map(|c| c.data_dirs.0.clone())
            .unwrap_or_default()
    }

    /// The cluster's temporary root directory.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the metadata service gracefully and starts it again on the same store and port.
    pub async fn restart_metadata(&mut self) -> anyhow::Result<()> {
        Ok(self.cluster.restart_metadata().await?)
    }

    /// Stops the metadata service gracefully (its store stays).
    pub async fn stop_metadata(&mut self) {
        self.cluster.stop_metadata().await;
    }

    /// Starts DataNode `i` (again) on its directories and, after a first start, its ports.
    pub async fn start_datanode(&mut self, i: usize) -> anyhow::Result<()> {
        self.cluster.start_datanode(i).await?;
        self.aim_proxy(i);
        Ok(())
    }

    /// Points DataNode `i`'s proxy (if any) at the DataNode's data address.
    fn aim_proxy(&self, i: usize) {
        if let (Some(Some(p)), Some(node)) = (self.proxies.get(i), self.cluster.datanode(i)) {
            p.set_target(node.data_addr());
        }
    }

    /// Stops DataNode `i` gracefully: writers flush what they received.
    pub async fn stop_datanode(&mut self, i: usize) {
        self.cluster.stop_datanode(i).await;
    }

    /// Kills DataNode `i` abruptly: no flush, no finalize; its files stay as they are.
    pub fn kill_datanode(&mut self, i: usize) {
        self.cluster.kill_datanode(i);
    }

    /// Stops DataNode `i` gracefully and starts it again on the same storage and ports.
    pub async fn restart_datanode(&mut self, i: usize) -> anyhow::Result<()> {
        self.stop_datanode(i).await;
        self.start_datanode(i).await
    }

    /// Waits until the metadata service reports at least `n` live DataNodes.
    pub async fn wait_live(&self, n: usize) -> anyhow::Result<()> {
        Ok(self.cluster.wait_live(n, LIVE_TIMEOUT).await?)
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
    pub async fn shutdown(self) {
        self.cluster.stop().await;
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
