//! [`PowerCluster`]: a [`MiniCluster`] whose metadata store and DataNode volumes live on
//! [`LazyFs`] mounts, so that a node can lose power: what it had not synced is gone, and it
//! restarts on the same directories and ports.
//!
//! A crash cuts the node's file system first (from that instant every I/O of the node fails
//! with `EIO`, so nothing it does afterwards reaches the disk), then stops the node and waits
//! for every task of it to end (its shutdown flushes fail like any other I/O), then powers the
//! file system on and starts the node again. Stopping rather than aborting the node makes sure
//! no thread of the old node touches the disk after the power is back.

use crate::lazyfs::{LazyFs, Lost};
use crate::process::{ProcessCluster, ProcessClusterBuilder};
use crate::{MiniCluster, MiniClusterBuilder};
use anyhow::Context;
use sluice_common::config::PathList;
use std::path::PathBuf;
use std::time::Duration;

/// How long a crashed node may take to stop before it is killed outright.
const STOP_LIMIT: Duration = Duration::from_secs(20);

/// A [`MiniCluster`] on lazyfs mounts. Fields drop in order: the cluster before its mounts.
pub struct PowerCluster {
    cluster: MiniCluster,
    mounts: Mounts,
}

/// The lazyfs mounts of a power-cut cluster: the metadata store's and one per DataNode, in a
/// temporary directory.
struct Mounts {
    metadata_fs: LazyFs,
    datanode_fs: Vec<LazyFs>,
    _dir: tempfile::TempDir,
}

async fn mount(dir: PathBuf) -> anyhow::Result<LazyFs> {
    tokio::task::spawn_blocking(move || LazyFs::mount_in(&dir))
        .await?
        .context("mounting lazyfs (needs /dev/fuse and root)")
}

impl Mounts {
    /// Mounts the metadata store's file system and `datanodes` DataNode file systems.
    async fn new(datanodes: usize) -> anyhow::Result<Mounts> {
        let dir = tempfile::Builder::new().prefix("sluice-power-").tempdir()?;
        let metadata_fs = mount(dir.path().join("metadata")).await?;
        let mut datanode_fs = Vec::new();
        for i in 0..datanodes {
            datanode_fs.push(mount(dir.path().join(format!("dn{i}"))).await?);
        }
        Ok(Mounts {
            metadata_fs,
            datanode_fs,
            _dir: dir,
        })
    }

    /// The metadata store's directory.
    fn store_dir(&self) -> PathBuf {
        self.metadata_fs.path().join("store")
    }

    /// DataNode `i`'s volume directory (one volume each).
    fn volumes(&self) -> Vec<PathBuf> {
        self.datanode_fs
            .iter()
            .map(|f| f.path().join("vol0"))
            .collect()
    }

    /// `sync(1)` on every mount.
    fn settle(&self) -> anyhow::Result<()> {
        self.metadata_fs.sync()?;
        for fs in &self.datanode_fs {
            fs.sync()?;
        }
        Ok(())
    }

    /// Cuts every mount at one instant.
    fn crash_all(&self) -> Vec<Lost> {
        let mut lost = vec![self.metadata_fs.crash()];
        lost.extend(self.datanode_fs.iter().map(LazyFs::crash));
        lost
    }
}

impl PowerCluster {
    /// Starts `builder`'s cluster with `datanodes` DataNodes (one volume each), the metadata
    /// store and every volume on its own lazyfs mount. The builder's metadata and DataNode
    /// hooks are replaced (they only set the data directories).
    pub async fn start(builder: MiniClusterBuilder, datanodes: usize) -> anyhow::Result<Self> {
        let mounts = Mounts::new(datanodes).await?;
        let meta_dir = mounts.store_dir();
        let vols = mounts.volumes();
        let cluster = builder
            .datanodes(datanodes)
            .volumes_per_datanode(1)
            .configure_metadata(move |c| c.data_dir = meta_dir.clone())
            .configure_datanodes(move |i, c| c.data_dirs = PathList(vec![vols[i].clone()]))
            .start()
            .await?;
        Ok(PowerCluster { cluster, mounts })
    }

    /// Makes everything on every mount durable, as the kernel's writeback does for a machine
    /// that has been up a while (`sync(1)` on each node).
    pub fn settle(&self) -> anyhow::Result<()> {
        self.mounts.settle()
    }

    /// The cluster.
    pub fn cluster(&self) -> &MiniCluster {
        &self.cluster
    }

    /// The cluster, to stop, kill or restart nodes without a power cut.
    pub fn cluster_mut(&mut self) -> &mut MiniCluster {
        &mut self.cluster
    }

    /// The metadata service's mount.
    pub fn metadata_fs(&self) -> &LazyFs {
        &self.mounts.metadata_fs
    }

    /// DataNode `i`'s mount.
    pub fn datanode_fs(&self, i: usize) -> &LazyFs {
        &self.mounts.datanode_fs[i]
    }

    /// DataNode `i`'s volume, as it survived (the backing directory).
    pub fn datanode_backing(&self, i: usize) -> PathBuf {
        self.mounts.datanode_fs[i].backing().join("vol0")
    }

    /// Power cut of the metadata service, then a restart on the same store and port.
    pub async fn crash_metadata(&mut self) -> anyhow::Result<Lost> {
        let lost = self.mounts.metadata_fs.crash();
        if tokio::time::timeout(STOP_LIMIT, self.cluster.stop_metadata())
            .await
            .is_err()
        {
            anyhow::bail!("the crashed metadata service did not stop within {STOP_LIMIT:?}");
        }
        self.mounts.metadata_fs.power_on();
        self.cluster.restart_metadata().await?;
        Ok(lost)
    }

    /// Power cut of DataNode `i`; it stays down until [`PowerCluster::restart_datanode`].
    pub async fn crash_datanode(&mut self, i: usize) -> Lost {
        let lost = self.mounts.datanode_fs[i].crash();
        self.stop_crashed(i).await;
        lost
    }

    async fn stop_crashed(&mut self, i: usize) {
        if tokio::time::timeout(STOP_LIMIT, self.cluster.stop_datanode(i))
            .await
            .is_err()
        {
            tracing::warn!("crashed DataNode {i} did not stop within {STOP_LIMIT:?}");
        }
    }

    /// Powers DataNode `i`'s file system on and starts it on the same volume and ports.
    pub async fn restart_datanode(&mut self, i: usize) -> anyhow::Result<()> {
        self.mounts.datanode_fs[i].power_on();
        self.cluster.start_datanode(i).await
    }

    /// Power cut of the whole cluster at one instant, then everything restarts.
    pub async fn crash_all(&mut self) -> anyhow::Result<Vec<Lost>> {
        let lost = self.mounts.crash_all();
        for i in 0..self.mounts.datanode_fs.len() {
            self.stop_crashed(i).await;
        }
        if tokio::time::timeout(STOP_LIMIT, self.cluster.stop_metadata())
            .await
            .is_err()
        {
            anyhow::bail!("the crashed metadata service did not stop within {STOP_LIMIT:?}");
        }
        self.mounts.metadata_fs.power_on();
        self.cluster.restart_metadata().await?;
        for i in 0..self.mounts.datanode_fs.len() {
            self.restart_datanode(i).await?;
        }
        Ok(lost)
    }
}

/// A [`ProcessCluster`] on lazyfs mounts: every node is its own process, and a power cut is
/// the cut of the node's file system followed at once by SIGKILL of its process, so nothing
/// of the old node survives the cut, not even a thread stuck on the dead disk. This is the rig
/// for long runs of many cuts: sled 0.34 keeps a process-wide lock that a flush stuck on a
/// cut mount holds for ever, so an in-process restart after a cut ([`PowerCluster`]) can wedge
/// the next store in the same process (docs/power-loss.md).
pub struct ProcessPowerCluster {
    cluster: ProcessCluster,
    mounts: Mounts,
}

impl ProcessPowerCluster {
    /// Starts `builder`'s cluster with `datanodes` DataNodes, the metadata store and each
    /// DataNode's volume on its own lazyfs mount (the builder's directories are replaced).
    pub async fn start(builder: ProcessClusterBuilder, datanodes: usize) -> anyhow::Result<Self> {
        let mounts = Mounts::new(datanodes).await?;
        let cluster = builder
            .datanodes(datanodes)
            .metadata_dir(mounts.store_dir())
            .datanode_dirs(mounts.volumes())
            .start()
            .await?;
        Ok(ProcessPowerCluster { cluster, mounts })
    }

    /// Makes everything on every mount durable (`sync(1)` on each node).
    pub fn settle(&self) -> anyhow::Result<()> {
        self.mounts.settle()
    }

    /// The cluster.
    pub fn cluster(&self) -> &ProcessCluster {
        &self.cluster
    }

    /// Power cut of the metadata service, then a restart on the same store and port.
    pub async fn crash_metadata(&mut self) -> anyhow::Result<Lost> {
        let lost = self.mounts.metadata_fs.crash();
        self.cluster.kill_metadata().await?;
        self.mounts.metadata_fs.power_on();
        self.cluster.start_metadata().await?;
        Ok(lost)
    }

    /// Power cut of DataNode `i`; it stays down until [`ProcessPowerCluster::restart_datanode`].
    pub async fn crash_datanode(&mut self, i: usize) -> anyhow::Result<Lost> {
        let lost = self.mounts.datanode_fs[i].crash();
        self.cluster.kill_datanode(i).await?;
        Ok(lost)
    }

    /// Powers DataNode `i`'s file system on and starts it on the same volume and port.
    pub async fn restart_datanode(&mut self, i: usize) -> anyhow::Result<()> {
        self.mounts.datanode_fs[i].power_on();
        self.cluster.start_datanode(i).await
    }

    /// Power cut of the whole cluster at one instant, then everything restarts.
    pub async fn crash_all(&mut self) -> anyhow::Result<Vec<Lost>> {
        let lost = self.mounts.crash_all();
        for i in 0..self.mounts.datanode_fs.len() {
            self.cluster.kill_datanode(i).await?;
        }
        self.cluster.kill_metadata().await?;
        self.mounts.metadata_fs.power_on();
        self.cluster.start_metadata().await?;
        for i in 0..self.mounts.datanode_fs.len() {
            self.restart_datanode(i).await?;
        }
        Ok(lost)
    }
}
