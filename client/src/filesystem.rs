//! [`FileSystem`]: the client's entry point. It holds the configuration, the
//! [`MetadataClient`] (the connection to the metadata service and the client name that holds
//! write leases) and the lease renewer, and hands writers and readers what they need of them.
//! It is cheap to clone.

use crate::error::ClientError;
use crate::lease::{LeaseRenewer, DEFAULT_RENEW_INTERVAL};
use crate::meta::MetadataClient;
use crate::read::{FileReader, ReadOptions};
use crate::write::{FileWriter, WriteOptions, WriterDeps};
use sluice_common::config::ClientConfig;
use sluice_common::rpc::{
    ClusterReport, CreateOptions, FileStatus, FsckReport, LocatedBlock, LocatedBlocks,
};
use sluice_common::ExtendedBlock;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// Options of [`FileSystem::connect_with`] beyond the configuration file.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Interval between lease renewals while a writer is open (default 10 s).
    pub lease_renew_interval: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            lease_renew_interval: DEFAULT_RENEW_INTERVAL,
        }
    }
}

/// A connection to a Sluice cluster: namespace operations, file writers and readers.
#[derive(Clone, Debug)]
pub struct FileSystem {
    /// The configuration (validated).
    cfg: Arc<ClientConfig>,
    /// The metadata service, and the client name holding this client's write leases.
    meta: Arc<MetadataClient>,
    /// Renews the leases while writers are open.
    leases: Arc<LeaseRenewer>,
}

impl FileSystem {
    /// Connects to the metadata service at `cfg.metadata_address`.
    pub async fn connect(cfg: ClientConfig) -> Result<FileSystem, ClientError> {
        Self::connect_with(cfg, ConnectOptions::default()).await
    }

    /// [`FileSystem::connect`] with extra options.
    pub async fn connect_with(
        cfg: ClientConfig,
        opts: ConnectOptions,
    ) -> Result<FileSystem, ClientError> {
        cfg.validate()?;
        if opts.lease_renew_interval.is_zero() {
            return Err(ClientError::InvalidArgument {
                name: "lease_renew_interval",
                reason: "must be positive".into(),
            });
        }
        let client_name = format!(
            "sluice-client-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        let addr = cfg.metadata_address.clone();
        let meta = Arc::new(
            MetadataClient::connect(
                addr,
                cfg.rpc_timeout.get(),
                cfg.rpc_connection_max_idle.get(),
                client_name,
            )
            .await?,
        );
        info!(client = %meta.client_name(), metadata = %cfg.metadata_address, "connected");
        Ok(FileSystem {
            cfg: Arc::new(cfg),
            leases: Arc::new(LeaseRenewer::new(
                Arc::clone(&meta),
                opts.lease_renew_interval,
            )),
            meta,
        })
    }

    /// The client name (`sluice-client-<pid>-<random>`), holder of this client's write leases.
    pub fn client_name(&self) -> &str {
        self.meta.client_name()
    }

    /// The configuration in use.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// Creates a file and opens it for writing.
    pub async fn create(&self, path: &str, opts: WriteOptions) -> Result<FileWriter, ClientError> {
        let cfg = &self.cfg;
        let create = CreateOptions {
            client_name: self.meta.client_name().to_string(),
            overwrite: opts.overwrite,
            create_parent: opts.create_parent,
            replication: opts.replication.unwrap_or(cfg.replication),
            block_size: opts.block_size.unwrap_or(cfg.block_size.bytes()),
        };
        if let Some(bs) = opts.block_size {
            if bs == 0 || !bs.is_multiple_of(u64::from(cfg.bytes_per_checksum)) {
                return Err(ClientError::InvalidArgument {
                    name: "block_size",
                    reason: format!(
                        "{bs} must be a positive multiple of bytes.per.checksum ({})",
                        cfg.bytes_per_checksum
                    ),
                });
            }
        }
        let status = self.meta.create(path, &create).await?;
        debug!(path, block_size = status.block_size, "created");
        FileWriter::start(self.writer_deps(), status)
    }

    /// Reopens a closed file for appending (HDFS `append`): the writer continues after the
    /// file's last byte. A partial last block is continued in place: its DataNodes reopen
    /// their replicas under a new generation stamp, and the block's last partial chunk is
    /// read back here and re-sent with the first new bytes, so that its checksum covers the
    /// whole chunk. A full last block (or an empty file) makes the first byte start a new
    /// block. Fails with a lease conflict while another writer holds the file open.
    pub async fn append(&self, path: &str) -> Result<FileWriter, ClientError> {
        let append = self.meta.append(path).await?;
        let tail = match &append.last_block {
            Some(lb) => match self.partial_chunk(path, lb).await {
                Ok(t) => t,
                Err(e) => {
                    self.close_unchanged(path, lb.block).await;
                    return Err(e);
                }
            },
            None => Vec::new(),
        };
        debug!(
            path,
            length = append.status.length,
            partial = append.last_block.is_some(),
            "reopened for append"
        );
        let last = append.last_block.as_ref().map(|lb| lb.block);
        match FileWriter::start_append(self.writer_deps(), append, tail).await {
            Ok(w) => Ok(w),
            Err(e) => {
                if let Some(b) = last {
                    self.close_unchanged(path, b).await;
                }
                Err(e)
            }
        }
    }

    /// The last partial checksum chunk of the block `lb` (empty when it ends on a chunk
    /// boundary), read from its replicas.
    async fn partial_chunk(&self, path: &str, lb: &LocatedBlock) -> Result<Vec<u8>, ClientError> {
        let bpc = u64::from(self.cfg.bytes_per_checksum);
        let len = (lb.block.num_bytes % bpc) as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        let start = lb.offset + lb.block.num_bytes - len as u64;
        let reader = self.open(path).await?;
        let mut tail = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let n = reader.read_at(start + got as u64, &mut tail[got..]).await?;
            if n == 0 {
                return Err(ClientError::protocol(
                    "DataNode",
                    format!(
                        "{path}: the last block ends at {} bytes, {} expected",
                        start + got as u64,
                        lb.offset + lb.block.num_bytes
                    ),
                ));
            }
            got += n;
        }
        Ok(tail)
    }

    /// Closes a file reopened for append whose writer could not start, its last block as it
    /// was (best effort: otherwise the file waits for lease recovery).
    async fn close_unchanged(&self, path: &str, last: ExtendedBlock) {
        if let Err(e) = self.meta.complete(path, Some(last)).await {
            warn!(path, error = %e, "closing the file after a failed append");
        }
    }

    /// Opens a file for reading with the configured read mode.
    pub async fn open(&self, path: &str) -> Result<FileReader, ClientError> {
        self.open_with(path, ReadOptions::default()).await
    }

    /// Opens a file for reading with explicit options.
    pub async fn open_with(
        &self,
        path: &str,
        opts: ReadOptions,
    ) -> Result<FileReader, ClientError> {
        FileReader::open(Arc::clone(&self.meta), &self.cfg, path, opts).await
    }

    /// One entry.
    pub async fn stat(&self, path: &str) -> Result<FileStatus, ClientError> {
        self.meta.stat(path).await
    }

    /// The entries of a directory (or the file itself), sorted by name.
    pub async fn list(&self, path: &str) -> Result<Vec<FileStatus>, ClientError> {
        self.meta.list(path).await
    }

    /// Creates a directory (with `parents`, also its missing ancestors).
    pub async fn mkdirs(&self, path: &str, parents: bool) -> Result<(), ClientError> {
        self.meta.mkdirs(path, parents).await
    }

    /// Deletes a file or directory; `Ok(false)` if nothing was there.
    pub async fn delete(&self, path: &str, recursive: bool) -> Result<bool, ClientError> {
        self.meta.delete(path, recursive).await
    }

    /// Renames a file or directory.
    pub async fn rename(&self, src: &str, dst: &str) -> Result<(), ClientError> {
        self.meta.rename(src, dst).await
    }

    /// Every block of a file with its locations.
    pub async fn get_block_locations(&self, path: &str) -> Result<LocatedBlocks, ClientError> {
        self.meta.get_block_locations(path, 0, u64::MAX).await
    }

    /// Block-level health of every file at or under `path`.
    pub async fn fsck(&self, path: &str) -> Result<FsckReport, ClientError> {
        self.meta.fsck(path).await
    }

    /// Recovers the lease of a file whose writer may have disappeared (HDFS
    /// `DistributedFileSystem.recoverLease`): the metadata service recovers the file's last
    /// block and closes it, whoever holds the lease. Returns true once the file is closed (at
    /// once if it was not open); false while recovery runs — call again after a moment.
    pub async fn recover_lease(&self, path: &str) -> Result<bool, ClientError> {
        self.meta.recover_lease(path).await
    }

    /// Sets a file's replication factor; the metadata service then brings every block of the
    /// file to it (watch with [`FileSystem::fsck`]).
    pub async fn set_replication(&self, path: &str, replication: u16) -> Result<(), ClientError> {
        self.meta.set_replication(path, replication).await
    }

    /// The DataNodes and block totals.
    pub async fn cluster_report(&self) -> Result<ClusterReport, ClientError> {
        self.meta.cluster_report().await
    }

    /// What a new writer needs: the metadata client, the configuration, and a lease guard.
    fn writer_deps(&self) -> WriterDeps {
        WriterDeps {
            meta: Arc::clone(&self.meta),
            cfg: Arc::clone(&self.cfg),
            lease: self.leases.acquire(),
        }
    }
}
