//! [`FileSystem`]: the client's entry point. It holds the tarpc connection to the metadata
//! service (reconnected when it breaks), the configuration, the client name that holds write
//! leases, and the lease renewer. It is cheap to clone.

use crate::error::{rpc_result, ClientError};
use crate::lease::{LeaseRenewer, DEFAULT_RENEW_INTERVAL};
use crate::read::{FileReader, ReadOptions};
use crate::write::{FileWriter, WriteOptions};
use sluice_common::config::ClientConfig;
use sluice_common::rpc::{
    self, ClientProtocolClient, ClusterReport, CreateOptions, FileStatus, FsckReport, LocatedBlock,
    LocatedBlocks,
};
use sluice_common::{ExtendedBlock, MetaError};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tarpc::client::RpcError;
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
    pub(crate) inner: Arc<FsInner>,
}

/// What every clone of a [`FileSystem`] shares.
#[derive(Debug)]
pub(crate) struct FsInner {
    /// The configuration (validated).
    pub cfg: ClientConfig,
    /// `sluice-client-<pid>-<random>`: the lease holder of this client's writers.
    pub client_name: String,
    /// Renews the leases while writers are open.
    pub leases: Arc<LeaseRenewer>,
    rpc: Mutex<RpcSlot>,
    reconnect: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct RpcSlot {
    generation: u64,
    client: ClientProtocolClient,
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
        let client = dial(&cfg).await?;
        let client_name = format!(
            "sluice-client-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        info!(client = %client_name, metadata = %cfg.metadata_address, "connected");
        Ok(FileSystem {
            inner: Arc::new(FsInner {
                cfg,
                client_name,
                leases: Arc::new(LeaseRenewer::new(opts.lease_renew_interval)),
                rpc: Mutex::new(RpcSlot {
                    generation: 0,
                    client,
                }),
                reconnect: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// The client name (`sluice-client-<pid>-<random>`), holder of this client's write leases.
    pub fn client_name(&self) -> &str {
        &self.inner.client_name
    }

    /// The configuration in use.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    /// Creates a file and opens it for writing.
    pub async fn create(&self, path: &str, opts: WriteOptions) -> Result<FileWriter, ClientError> {
        let cfg = &self.inner.cfg;
        let create = CreateOptions {
            client_name: self.inner.client_name.clone(),
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
        let p = path.to_string();
        let status = self
            .inner
            .call("create", false, |c, ctx| {
                let (p, o) = (p.clone(), create.clone());
                async move { c.create(ctx, p, o).await }
            })
            .await?;
        debug!(path, block_size = status.block_size, "created");
        FileWriter::start(Arc::clone(&self.inner), status)
    }

    /// Reopens a closed file for appending (HDFS `append`): the writer continues after the
    /// file's last byte. A partial last block is continued in place: its DataNodes reopen
    /// their replicas under a new generation stamp, and the block's last partial chunk is
    /// read back here and re-sent with the first new bytes, so that its checksum covers the
    /// whole chunk. A full last block (or an empty file) makes the first byte start a new
    /// block. Fails with a lease conflict while another writer holds the file open.
    pub async fn append(&self, path: &str) -> Result<FileWriter, ClientError> {
        let p = path.to_string();
        let client = self.inner.client_name.clone();
        let append = self
            .inner
            .call("append", false, |c, ctx| {
                let (p, client) = (p.clone(), client.clone());
                async move { c.append(ctx, p, client).await }
            })
            .await?;
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
        match FileWriter::start_append(Arc::clone(&self.inner), append, tail).await {
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
        let bpc = u64::from(self.inner.cfg.bytes_per_checksum);
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
        let (p, client) = (path.to_string(), self.inner.client_name.clone());
        let r = self
            .inner
            .call("complete", true, |c, ctx| {
                let (p, client) = (p.clone(), client.clone());
                async move { c.complete(ctx, p, client, Some(last)).await }
            })
            .await;
        if let Err(e) = r {
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
        FileReader::open(Arc::clone(&self.inner), path, opts).await
    }

    /// One entry.
    pub async fn stat(&self, path: &str) -> Result<FileStatus, ClientError> {
        let p = path.to_string();
        self.inner
            .call("stat", true, |c, ctx| {
                let p = p.clone();
                async move { c.stat(ctx, p).await }
            })
            .await
    }

    /// The entries of a directory (or the file itself), sorted by name.
    pub async fn list(&self, path: &str) -> Result<Vec<FileStatus>, ClientError> {
        let p = path.to_string();
        self.inner
            .call("list", true, |c, ctx| {
                let p = p.clone();
                async move { c.list(ctx, p).await }
            })
            .await
    }

    /// Creates a directory (with `parents`, also its missing ancestors).
    pub async fn mkdirs(&self, path: &str, parents: bool) -> Result<(), ClientError> {
        let p = path.to_string();
        self.inner
            .call("mkdirs", true, |c, ctx| {
                let p = p.clone();
                async move { c.mkdirs(ctx, p, parents).await }
            })
            .await
    }

    /// Deletes a file or directory; `Ok(false)` if nothing was there.
    pub async fn delete(&self, path: &str, recursive: bool) -> Result<bool, ClientError> {
        let p = path.to_string();
        self.inner
            .call("delete", false, |c, ctx| {
                let p = p.clone();
                async move { c.delete(ctx, p, recursive).await }
            })
            .await
    }

    /// Renames a file or directory.
    pub async fn rename(&self, src: &str, dst: &str) -> Result<(), ClientError> {
        let (s, d) = (src.to_string(), dst.to_string());
        self.inner
            .call("rename", false, |c, ctx| {
                let (s, d) = (s.clone(), d.clone());
                async move { c.rename(ctx, s, d).await }
            })
            .await
    }

    /// Every block of a file with its locations.
    pub async fn get_block_locations(&self, path: &str) -> Result<LocatedBlocks, ClientError> {
        self.inner.block_locations(path).await
    }

    /// Block-level health of every file at or under `path`.
    pub async fn fsck(&self, path: &str) -> Result<FsckReport, ClientError> {
        let p = path.to_string();
        self.inner
            .call("fsck", true, |c, ctx| {
                let p = p.clone();
                async move { c.fsck(ctx, p).await }
            })
            .await
    }

    /// Recovers the lease of a file whose writer may have disappeared (HDFS
    /// `DistributedFileSystem.recoverLease`): the metadata service recovers the file's last
    /// block and closes it, whoever holds the lease. Returns true once the file is closed (at
    /// once if it was not open); false while recovery runs — call again after a moment.
    pub async fn recover_lease(&self, path: &str) -> Result<bool, ClientError> {
        let p = path.to_string();
        let client = self.inner.client_name.clone();
        self.inner
            .call("recover_lease", true, |c, ctx| {
                let (p, client) = (p.clone(), client.clone());
                async move { c.recover_lease(ctx, p, client).await }
            })
            .await
    }

    /// Sets a file's replication factor; the metadata service then brings every block of the
    /// file to it (watch with [`FileSystem::fsck`]).
    pub async fn set_replication(&self, path: &str, replication: u16) -> Result<(), ClientError> {
        let p = path.to_string();
        self.inner
            .call("set_replication", true, |c, ctx| {
                let p = p.clone();
                async move { c.set_replication(ctx, p, replication).await }
            })
            .await
    }

    /// The DataNodes and block totals.
    pub async fn cluster_report(&self) -> Result<ClusterReport, ClientError> {
        self.inner
            .call("cluster_report", true, |c, ctx| async move {
                c.cluster_report(ctx).await
            })
            .await
    }
}

async fn dial(cfg: &ClientConfig) -> Result<ClientProtocolClient, ClientError> {
    let addr = cfg.metadata_address.clone();
    let timeout = cfg.rpc_timeout.get();
    match tokio::time::timeout(timeout, rpc::connect_client_protocol(addr.as_str())).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(ClientError::Connect {
            addr,
            source: Arc::new(e),
        }),
        Err(_) => Err(ClientError::Connect {
            addr,
            source: Arc::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection within {timeout:?}"),
            )),
        }),
    }
}

impl FsInner {
    /// Calls the metadata service with the configured deadline (enforced here too, see
    /// [`rpc::bounded`]). When the connection is found broken or the call times out, the
    /// connection is re-established; the call is then retried once if it is `idempotent` (a
    /// non-idempotent call may have been executed before the connection broke).
    pub(crate) async fn call<T, F, Fut>(
        &self,
        name: &'static str,
        idempotent: bool,
        f: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(ClientProtocolClient, tarpc::context::Context) -> Fut,
        Fut: Future<Output = Result<Result<T, MetaError>, RpcError>>,
    {
        let timeout = self.cfg.rpc_timeout.get();
        let (generation, client) = self.current();
        let ctx = rpc::context_with_timeout(timeout);
        let r = rpc::bounded(timeout, f(client, ctx)).await;
        // A connection that broke, or a call past its deadline (the channel may be wedged: a
        // restart behind a port proxy), gets a new connection.
        if !matches!(
            r,
            Err(RpcError::Shutdown) | Err(RpcError::Channel(_)) | Err(RpcError::DeadlineExceeded)
        ) {
            return rpc_result(name, r);
        }
        debug!(call = name, "metadata connection broken; reconnecting");
        let client = match self.reconnect(generation).await {
            Ok(c) => c,
            Err(_) => return rpc_result(name, r),
        };
        if !idempotent {
            return rpc_result(name, r);
        }
        let ctx = rpc::context_with_timeout(timeout);
        rpc_result(name, rpc::bounded(timeout, f(client, ctx)).await)
    }

    fn current(&self) -> (u64, ClientProtocolClient) {
        let slot = self.rpc.lock().unwrap_or_else(|p| p.into_inner());
        (slot.generation, slot.client.clone())
    }

    async fn reconnect(&self, seen: u64) -> Result<ClientProtocolClient, ClientError> {
        let _one = self.reconnect.lock().await;
        let (generation, client) = self.current();
        if generation != seen {
            return Ok(client); // someone else reconnected meanwhile
        }
        let fresh = dial(&self.cfg).await?;
        let mut slot = self.rpc.lock().unwrap_or_else(|p| p.into_inner());
        slot.generation += 1;
        slot.client = fresh.clone();
        Ok(fresh)
    }

    /// Every block of a file.
    pub(crate) async fn block_locations(&self, path: &str) -> Result<LocatedBlocks, ClientError> {
        let p = path.to_string();
        self.call("get_block_locations", true, |c, ctx| {
            let p = p.clone();
            async move { c.get_block_locations(ctx, p, 0, u64::MAX).await }
        })
        .await
    }
}
