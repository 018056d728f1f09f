//! [`MetadataClient`]: the client's connection to the metadata service. It owns the connection
//! slot (re-established when it breaks), the deadline of every call, and the client name that
//! holds this client's write leases, and has one typed method per client-protocol RPC.
//!
//! A leaf of the crate: it depends on `error` and `sluice-common` only, so that the file
//! system, the writers, the readers and the lease renewer all use it without reaching back
//! into one another.

use crate::error::{rpc_result, ClientError};
use sluice_common::rpc::{
    self, AdditionalDatanodes, AppendResponse, BadReplica, ClientProtocolClient, ClusterReport,
    CreateOptions, FileStatus, FsckReport, LocatedBlock, LocatedBlocks,
};
use sluice_common::rpc_stream::ConnectionWatch;
use sluice_common::{ExtendedBlock, MetaError, NodeId};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tarpc::client::RpcError;
use tracing::debug;

/// A connection to the metadata service's client protocol, shared by every part of one
/// [`crate::FileSystem`].
#[derive(Debug)]
pub(crate) struct MetadataClient {
    addr: String,
    timeout: Duration,
    /// A connection unused this long is replaced before the next call
    /// (`rpc.connection.max-idle`).
    max_idle: Duration,
    client_name: String,
    slot: Mutex<Slot>,
    /// Held while a new connection is dialled, so that callers that find the same connection
    /// broken dial once.
    reconnect: tokio::sync::Mutex<()>,
}

/// The connection in use and how many times it was replaced.
#[derive(Debug)]
struct Slot {
    generation: u64,
    client: ClientProtocolClient,
    /// Tells when the service closed the connection (e.g. idle past its `rpc.idle.timeout`).
    watch: ConnectionWatch,
    /// When a call last ended on it.
    last_used: std::time::Instant,
}

impl MetadataClient {
    /// Connects to `addr` within `timeout`, which is then the deadline of every call;
    /// `client_name` is the lease holder named in the calls that need one. A connection unused
    /// for `max_idle`, or closed by the service, is replaced before the next call.
    pub(crate) async fn connect(
        addr: String,
        timeout: Duration,
        max_idle: Duration,
        client_name: String,
    ) -> Result<MetadataClient, ClientError> {
        let (client, watch) = dial(&addr, timeout).await?;
        Ok(MetadataClient {
            addr,
            timeout,
            max_idle,
            client_name,
            slot: Mutex::new(Slot {
                generation: 0,
                client,
                watch,
                last_used: std::time::Instant::now(),
            }),
            reconnect: tokio::sync::Mutex::new(()),
        })
    }

    /// The lease holder's name (`sluice-client-<pid>-<random>`).
    pub(crate) fn client_name(&self) -> &str {
        &self.client_name
    }

    /// The deadline of one call.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `mkdirs`.
    pub(crate) async fn mkdirs(&self, path: &str, parents: bool) -> Result<(), ClientError> {
        self.call("mkdirs", true, |c, ctx| async move {
            c.mkdirs(ctx, path.to_string(), parents).await
        })
        .await
    }

    /// `create` (not retried: a second try could find the file it created).
    pub(crate) async fn create(
        &self,
        path: &str,
        opts: &CreateOptions,
    ) -> Result<FileStatus, ClientError> {
        self.call("create", false, |c, ctx| async move {
            c.create(ctx, path.to_string(), opts.clone()).await
        })
        .await
    }

    /// `append` with this client as lease holder (not retried: a second try would conflict
    /// with the lease the first one took).
    pub(crate) async fn append(&self, path: &str) -> Result<AppendResponse, ClientError> {
        self.call("append", false, |c, ctx| async move {
            c.append(ctx, path.to_string(), self.client_name.clone())
                .await
        })
        .await
    }

    /// `add_block` (the service answers a repeated call with the same block).
    pub(crate) async fn add_block(
        &self,
        path: &str,
        previous: Option<ExtendedBlock>,
        exclude: &[NodeId],
    ) -> Result<LocatedBlock, ClientError> {
        self.call("add_block", true, |c, ctx| async move {
            let (p, client) = (path.to_string(), self.client_name.clone());
            c.add_block(ctx, p, client, previous, exclude.to_vec())
                .await
        })
        .await
    }

    /// `abandon_block`.
    pub(crate) async fn abandon_block(
        &self,
        path: &str,
        block: ExtendedBlock,
    ) -> Result<(), ClientError> {
        self.call("abandon_block", true, |c, ctx| async move {
            c.abandon_block(ctx, path.to_string(), self.client_name.clone(), block)
                .await
        })
        .await
    }

    /// `complete`: `Ok(false)` while the last block is not reported yet.
    pub(crate) async fn complete(
        &self,
        path: &str,
        last: Option<ExtendedBlock>,
    ) -> Result<bool, ClientError> {
        self.call("complete", true, |c, ctx| async move {
            c.complete(ctx, path.to_string(), self.client_name.clone(), last)
                .await
        })
        .await
    }

    /// `fsync`: the last block's hflushed length.
    pub(crate) async fn fsync(&self, path: &str, last_block_len: u64) -> Result<(), ClientError> {
        self.call("fsync", true, |c, ctx| async move {
            let (p, client) = (path.to_string(), self.client_name.clone());
            c.fsync(ctx, p, client, last_block_len).await
        })
        .await
    }

    /// `get_block_locations` of `[offset, offset + length)`.
    pub(crate) async fn get_block_locations(
        &self,
        path: &str,
        offset: u64,
        length: u64,
    ) -> Result<LocatedBlocks, ClientError> {
        self.call("get_block_locations", true, |c, ctx| async move {
            c.get_block_locations(ctx, path.to_string(), offset, length)
                .await
        })
        .await
    }

    /// `list`.
    pub(crate) async fn list(&self, path: &str) -> Result<Vec<FileStatus>, ClientError> {
        self.call("list", true, |c, ctx| async move {
            c.list(ctx, path.to_string()).await
        })
        .await
    }

    /// `stat`.
    pub(crate) async fn stat(&self, path: &str) -> Result<FileStatus, ClientError> {
        self.call("stat", true, |c, ctx| async move {
            c.stat(ctx, path.to_string()).await
        })
        .await
    }

    /// `delete` (not retried: a second try would answer `false` for what the first deleted).
    pub(crate) async fn delete(&self, path: &str, recursive: bool) -> Result<bool, ClientError> {
        self.call("delete", false, |c, ctx| async move {
            c.delete(ctx, path.to_string(), recursive).await
        })
        .await
    }

    /// `rename` (not retried: a second try would find the source gone).
    pub(crate) async fn rename(&self, src: &str, dst: &str) -> Result<(), ClientError> {
        self.call("rename", false, |c, ctx| async move {
            c.rename(ctx, src.to_string(), dst.to_string()).await
        })
        .await
    }

    /// `renew_lease` of every lease this client holds.
    pub(crate) async fn renew_lease(&self) -> Result<(), ClientError> {
        self.call("renew_lease", true, |c, ctx| async move {
            c.renew_lease(ctx, self.client_name.clone()).await
        })
        .await
    }

    /// `update_block_for_pipeline`: a new generation stamp and write token for `block`.
    pub(crate) async fn update_block_for_pipeline(
        &self,
        block: ExtendedBlock,
    ) -> Result<LocatedBlock, ClientError> {
        self.call("update_block_for_pipeline", true, |c, ctx| async move {
            c.update_block_for_pipeline(ctx, block, self.client_name.clone())
                .await
        })
        .await
    }

    /// `update_pipeline` (not retried: the first try may have recorded the new stamp).
    pub(crate) async fn update_pipeline(
        &self,
        old: ExtendedBlock,
        new: ExtendedBlock,
        nodes: &[NodeId],
    ) -> Result<(), ClientError> {
        self.call("update_pipeline", false, |c, ctx| async move {
            c.update_pipeline(ctx, self.client_name.clone(), old, new, nodes.to_vec())
                .await
        })
        .await
    }

    /// `get_additional_datanodes`.
    pub(crate) async fn get_additional_datanodes(
        &self,
        req: &AdditionalDatanodes,
    ) -> Result<LocatedBlock, ClientError> {
        self.call("get_additional_datanodes", true, |c, ctx| async move {
            c.get_additional_datanodes(ctx, req.clone()).await
        })
        .await
    }

    /// `report_bad_blocks`.
    pub(crate) async fn report_bad_blocks(&self, bad: &[BadReplica]) -> Result<(), ClientError> {
        self.call("report_bad_blocks", true, |c, ctx| async move {
            c.report_bad_blocks(ctx, bad.to_vec()).await
        })
        .await
    }

    /// `set_replication`.
    pub(crate) async fn set_replication(
        &self,
        path: &str,
        replication: u16,
    ) -> Result<(), ClientError> {
        self.call("set_replication", true, |c, ctx| async move {
            c.set_replication(ctx, path.to_string(), replication).await
        })
        .await
    }

    /// `cluster_report`.
    pub(crate) async fn cluster_report(&self) -> Result<ClusterReport, ClientError> {
        self.call("cluster_report", true, |c, ctx| async move {
            c.cluster_report(ctx).await
        })
        .await
    }

    /// `fsck`.
    pub(crate) async fn fsck(&self, path: &str) -> Result<FsckReport, ClientError> {
        self.call("fsck", true, |c, ctx| async move {
            c.fsck(ctx, path.to_string()).await
        })
        .await
    }

    /// `recover_lease` for this client: `Ok(true)` once the file is closed.
    pub(crate) async fn recover_lease(&self, path: &str) -> Result<bool, ClientError> {
        self.call("recover_lease", true, |c, ctx| async move {
            c.recover_lease(ctx, path.to_string(), self.client_name.clone())
                .await
        })
        .await
    }

    /// Calls the metadata service with the deadline (enforced here too, see
    /// [`rpc::bounded`]). When the connection is found broken or the call times out, the
    /// connection is re-established; the call is then retried once if it is `idempotent` (a
    /// non-idempotent call may have been executed before the connection broke).
    async fn call<T, F, Fut>(
        &self,
        name: &'static str,
        idempotent: bool,
        f: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(ClientProtocolClient, tarpc::context::Context) -> Fut,
        Fut: Future<Output = Result<Result<T, MetaError>, RpcError>>,
    {
        let (mut generation, mut client, stale) = self.current();
        if stale {
            // Idle past rpc.connection.max-idle (the service may be closing it for its
            // rpc.idle.timeout) or closed by the service: dial again before sending.
            debug!(
                call = name,
                "metadata connection idle or closed; reconnecting"
            );
            self.reconnect(generation).await?;
            (generation, client, _) = self.current();
        }
        let r = self.call_on(client, &f).await;
        self.used(generation);
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
        rpc_result(name, self.call_on(client, &f).await)
    }

    /// One try of a call on `client`, bounded by the deadline.
    async fn call_on<T, F, Fut>(&self, client: ClientProtocolClient, f: &F) -> Result<T, RpcError>
    where
        F: Fn(ClientProtocolClient, tarpc::context::Context) -> Fut,
        Fut: Future<Output = Result<T, RpcError>>,
    {
        let ctx = rpc::context_with_timeout(self.timeout);
        rpc::bounded(self.timeout, f(client, ctx)).await
    }

    /// The connection, and whether it must be replaced before a call (closed by the service,
    /// or idle past `max_idle`).
    fn current(&self) -> (u64, ClientProtocolClient, bool) {
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        let stale = slot.watch.is_closed() || slot.last_used.elapsed() > self.max_idle;
        (slot.generation, slot.client.clone(), stale)
    }

    /// Records that a call ended on connection `generation`.
    fn used(&self, generation: u64) {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if slot.generation == generation {
            slot.last_used = std::time::Instant::now();
        }
    }

    /// A new connection, unless another caller replaced generation `seen` meanwhile.
    async fn reconnect(&self, seen: u64) -> Result<ClientProtocolClient, ClientError> {
        let _one = self.reconnect.lock().await;
        let (generation, client, _) = self.current();
        if generation != seen {
            return Ok(client); // someone else reconnected meanwhile
        }
        let (fresh, watch) = dial(&self.addr, self.timeout).await?;
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        slot.generation += 1;
        slot.client = fresh.clone();
        slot.watch = watch;
        slot.last_used = std::time::Instant::now();
        Ok(fresh)
    }
}

/// Connects to the client protocol at `addr` within `timeout`.
async fn dial(
    addr: &str,
    timeout: Duration,
) -> Result<(ClientProtocolClient, ConnectionWatch), ClientError> {
    let connect_error = |source: std::io::Error| ClientError::Connect {
        addr: addr.to_string(),
        source: Arc::new(source),
    };
    match tokio::time::timeout(timeout, rpc::connect_client_protocol_watched(addr)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(connect_error(e)),
        Err(_) => Err(connect_error(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no connection within {timeout:?}"),
        ))),
    }
}
