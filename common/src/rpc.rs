//! The control plane: two tarpc services served by the metadata service on one port.
//!
//! - [`ClientProtocol`]: the namespace and block allocation, for clients.
//! - [`DatanodeProtocol`]: registration, heartbeats (answered with commands) and block reports,
//!   for DataNodes.
//!
//! A connection starts with a 4-byte preamble naming the service ([`CLIENT_PREAMBLE`] or
//! [`DATANODE_PREAMBLE`]); then tarpc's length-delimited bincode transport runs on it, the
//! service's side guarded by [`crate::rpc_stream::RpcStream`] (frame limit, idle timeout). Block data never travels here: it uses the framed data-transfer
//! protocol of [`crate::frame`].

use crate::error::MetaError;
use crate::ids::{DatanodeId, ExtendedBlock, GenerationStamp, NodeId};
use crate::proto::ReplicaState;
use crate::token::{BlockToken, KeySet};
use serde::{Deserialize, Serialize};
use std::io;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};

/// Preamble of a client-protocol connection.
pub const CLIENT_PREAMBLE: [u8; 4] = *b"SLC1";
/// Preamble of a DataNode-protocol connection.
pub const DATANODE_PREAMBLE: [u8; 4] = *b"SLD1";
/// Largest RPC message a caller accepts, and the default limit of the DataNode protocol on the
/// service (`rpc.datanode.max.frame.bytes`: a block report of a DataNode with millions of
/// replicas fits). The client protocol's inbound limit is much smaller (`rpc.max.frame.bytes`).
pub const MAX_RPC_FRAME: usize = 256 * 1024 * 1024;

/// Whether a namespace entry is a file or a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    /// A file.
    File,
    /// A directory.
    Directory,
}

/// What `stat` and `list` return for one entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStatus {
    /// Absolute path.
    pub path: String,
    /// File or directory.
    pub kind: FileKind,
    /// Length in bytes (0 for directories). For a file being written: the length of its
    /// completed blocks plus what the writer reported with `fsync`.
    pub length: u64,
    /// Replication factor (0 for directories).
    pub replication: u16,
    /// Block size (0 for directories).
    pub block_size: u64,
    /// Last modification, milliseconds since the Unix epoch.
    pub modification_time_ms: u64,
    /// True while a writer holds the file open.
    pub under_construction: bool,
    /// Number of blocks (0 for directories).
    pub block_count: u64,
}

/// Options of `create`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateOptions {
    /// The writer's client name; it becomes the lease holder.
    pub client_name: String,
    /// Replace an existing file (never a directory).
    pub overwrite: bool,
    /// Create missing parent directories.
    pub create_parent: bool,
    /// Replicas per block (0: the service's default).
    pub replication: u16,
    /// Block size in bytes (0: the service's default).
    pub block_size: u64,
}

/// A block of a file with the DataNodes that hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocatedBlock {
    /// The block (length: its known length).
    pub block: ExtendedBlock,
    /// Offset of the block's first byte in the file.
    pub offset: u64,
    /// Replica locations; for a new block, the pipeline in order. Corrupt replicas are left out
    /// unless every replica is corrupt.
    pub locations: Vec<DatanodeId>,
    /// Every known replica is corrupt.
    pub corrupt: bool,
    /// The block access token for it (read for located blocks; write and copy for a new block
    /// or a pipeline being rebuilt); `None` where tokens are off.
    pub token: Option<BlockToken>,
}

/// The blocks of a file that cover a range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocatedBlocks {
    /// The file length the metadata service knows.
    pub file_length: u64,
    /// The blocks overlapping the range, in order.
    pub blocks: Vec<LocatedBlock>,
    /// True while the file is being written: the last block's length may be larger on the
    /// DataNodes (ask them with the `ReplicaInfo` op).
    pub under_construction: bool,
}

/// A DataNode's liveness as the metadata service sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    /// Heart-beating.
    Live,
    /// Missed heartbeats for the stale interval: avoided for new pipelines.
    Stale,
    /// Missed heartbeats for the dead interval: its replicas no longer count.
    Dead,
}

/// One DataNode in a cluster report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeReport {
    /// Identity and addresses.
    pub id: DatanodeId,
    /// Liveness.
    pub state: NodeState,
    /// Total bytes of its volumes.
    pub capacity: u64,
    /// Bytes used by replicas.
    pub used: u64,
    /// Bytes free.
    pub remaining: u64,
    /// Replicas it reported.
    pub blocks: u64,
    /// Milliseconds since its last heartbeat.
    pub last_heartbeat_ms_ago: u64,
    /// Write pipelines it was serving at its last heartbeat.
    #[serde(default)]
    pub active_pipelines: u32,
    /// Replicas it was writing through a write-memory buffer at its last heartbeat.
    #[serde(default)]
    pub buffered_replicas: u32,
}

/// The state of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterReport {
    /// Every DataNode ever registered since the service started.
    pub datanodes: Vec<DatanodeReport>,
    /// Files in the namespace.
    pub files: u64,
    /// Directories in the namespace.
    pub directories: u64,
    /// Blocks in the block manager.
    pub blocks: u64,
    /// Blocks with fewer live replicas than their replication factor.
    pub under_replicated_blocks: u64,
    /// Blocks with no live replica.
    pub missing_blocks: u64,
    /// Blocks with corrupt replicas.
    pub corrupt_blocks: u64,
}

impl DatanodeReport {
    /// Bytes of its volumes used by anything but replicas (HDFS's Non DFS Used: capacity
    /// minus DFS used minus remaining, never below 0).
    pub fn non_dfs_used(&self) -> u64 {
        self.capacity
            .saturating_sub(self.used)
            .saturating_sub(self.remaining)
    }
}

/// Space of a cluster summed over its DataNodes that are not dead (as HDFS sums live
/// DataNodes): what `sluice report`, `sluice df` and the metrics show.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityTotals {
    /// Total bytes of the volumes.
    pub capacity: u64,
    /// Bytes used by replicas (DFS used).
    pub used: u64,
    /// Bytes free.
    pub remaining: u64,
    /// Bytes used by anything else (see [`DatanodeReport::non_dfs_used`]).
    pub non_dfs_used: u64,
}

impl CapacityTotals {
    /// DFS used as a percentage of the capacity (0 with no capacity).
    pub fn used_percent(&self) -> f64 {
        if self.capacity == 0 {
            0.0
        } else {
            self.used as f64 * 100.0 / self.capacity as f64
        }
    }
}

impl ClusterReport {
    /// Space over the DataNodes that are not dead.
    pub fn totals(&self) -> CapacityTotals {
        let mut t = CapacityTotals::default();
        for d in self.datanodes.iter().filter(|d| d.state != NodeState::Dead) {
            t.capacity += d.capacity;
            t.used += d.used;
            t.remaining += d.remaining;
            t.non_dfs_used += d.non_dfs_used();
        }
        t
    }
}

/// Health of a block or a file as `fsck` judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Health {
    /// Every block has its replication factor of live, good replicas.
    Healthy,
    /// Some block has fewer live replicas than its factor (but at least one).
    UnderReplicated,
    /// Some block has a corrupt replica (and at least one good one).
    Corrupt,
    /// Some block has no live good replica.
    Missing,
}

/// One block in an `fsck` report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckBlock {
    /// The block with its length and generation stamp.
    pub block: ExtendedBlock,
    /// Live replicas with the current generation stamp.
    pub locations: Vec<DatanodeId>,
    /// Replicas reported corrupt.
    pub corrupt_locations: Vec<DatanodeId>,
    /// The file's replication factor.
    pub expected_replicas: u16,
    /// The verdict for this block.
    pub health: Health,
}

/// One file in an `fsck` report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckFile {
    /// Path.
    pub path: String,
    /// Length in bytes.
    pub length: u64,
    /// Replication factor.
    pub replication: u16,
    /// Open for writing (its last block may still grow).
    pub under_construction: bool,
    /// Every block, in order.
    pub blocks: Vec<FsckBlock>,
    /// The worst block verdict.
    pub health: Health,
}

/// The answer of `fsck`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckReport {
    /// The path checked.
    pub path: String,
    /// Every file at or under the path.
    pub files: Vec<FsckFile>,
    /// The worst file verdict ([`Health::Healthy`] when there are no files).
    pub health: Health,
}

/// The answer of `append`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendResponse {
    /// The file, now under construction.
    pub status: FileStatus,
    /// The partial last block to continue, if any (see `ClientProtocol::append`).
    pub last_block: Option<LocatedBlock>,
    /// When `last_block` is `None`: the file's last (full) block, the `previous` of the
    /// writer's first `add_block` (`None` for an empty file).
    pub previous: Option<ExtendedBlock>,
}

/// A request for more DataNodes for an existing pipeline (HDFS `getAdditionalDatanode`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdditionalDatanodes {
    /// The file being written.
    pub path: String,
    /// The writer (must hold the lease).
    pub client: String,
    /// The block being written.
    pub block: ExtendedBlock,
    /// DataNodes already in the pipeline.
    pub existing: Vec<NodeId>,
    /// DataNodes not to pick (failed ones).
    pub exclude: Vec<NodeId>,
    /// How many to add.
    pub count: u32,
}

/// A bad replica, as a reader found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadReplica {
    /// The block.
    pub block: ExtendedBlock,
    /// The DataNode that served bad data.
    pub node: NodeId,
    /// What was wrong.
    pub reason: String,
}

/// The namespace and block protocol used by clients.
#[tarpc::service]
pub trait ClientProtocol {
    /// Creates a directory (and, with `parents`, its missing ancestors). Ok if it exists.
    async fn mkdirs(path: String, parents: bool) -> Result<(), MetaError>;
    /// Creates a file open for writing, with `opts.client_name` as lease holder.
    async fn create(path: String, opts: CreateOptions) -> Result<FileStatus, MetaError>;
    /// Reopens a closed file for appending, with `client` as lease holder (HDFS `append`).
    /// The answer's `last_block` is the file's last block when it is partial (its generation
    /// stamp and length as the DataNodes hold it, and the DataNodes holding it): the writer
    /// gets a new stamp for it (`update_block_for_pipeline`) and sets up an `Append` pipeline.
    /// `None` when the file is empty or its last block is full: the next byte starts a new
    /// block (`add_block` with the last block as `previous`).
    async fn append(path: String, client: String) -> Result<AppendResponse, MetaError>;
    /// Commits `previous` (the file's last block, with its final length) and allocates the next
    /// block with a pipeline of DataNodes, none of them in `exclude`.
    async fn add_block(
        path: String,
        client: String,
        previous: Option<ExtendedBlock>,
        exclude: Vec<NodeId>,
    ) -> Result<LocatedBlock, MetaError>;
    /// Drops a block whose pipeline could not be set up (it must be the file's last block).
    async fn abandon_block(
        path: String,
        client: String,
        block: ExtendedBlock,
    ) -> Result<(), MetaError>;
    /// Commits the last block (with its final length) and closes the file. `Ok(false)`: the
    /// last block has not yet been reported by enough DataNodes; call again shortly.
    async fn complete(
        path: String,
        client: String,
        last: Option<ExtendedBlock>,
    ) -> Result<bool, MetaError>;
    /// Records that the writer has hflushed `last_block_length` bytes of its last block, so
    /// that `stat` shows the length (HDFS's hsync with UPDATE_LENGTH).
    async fn fsync(path: String, client: String, last_block_length: u64) -> Result<(), MetaError>;
    /// The blocks of a file overlapping `[offset, offset + length)`.
    async fn get_block_locations(
        path: String,
        offset: u64,
        length: u64,
    ) -> Result<LocatedBlocks, MetaError>;
    /// The entries of a directory (or the file itself), sorted by name.
    async fn list(path: String) -> Result<Vec<FileStatus>, MetaError>;
    /// One entry.
    async fn stat(path: String) -> Result<FileStatus, MetaError>;
    /// Deletes a file or directory (non-empty only with `recursive`); its replicas are deleted
    /// by the DataNodes at their next heartbeats. `Ok(false)` if nothing was there.
    async fn delete(path: String, recursive: bool) -> Result<bool, MetaError>;
    /// Renames (moves) a file or directory; the destination must not exist and its parent must.
    async fn rename(src: String, dst: String) -> Result<(), MetaError>;
    /// Keeps every lease of `client` alive.
    async fn renew_lease(client: String) -> Result<(), MetaError>;
    /// Gives a block being written a new generation stamp before its pipeline is rebuilt
    /// (HDFS `updateBlockForPipeline`). Only the lease holder may ask.
    async fn update_block_for_pipeline(
        block: ExtendedBlock,
        client: String,
    ) -> Result<LocatedBlock, MetaError>;
    /// Records the rebuilt pipeline and new generation stamp (HDFS `updatePipeline`).
    async fn update_pipeline(
        client: String,
        old_block: ExtendedBlock,
        new_block: ExtendedBlock,
        nodes: Vec<NodeId>,
    ) -> Result<(), MetaError>;
    /// Picks `req.count` more DataNodes for an existing pipeline, none in `existing` or
    /// `exclude`: `locations` are the new DataNodes, `token` a copy token naming them.
    async fn get_additional_datanodes(req: AdditionalDatanodes) -> Result<LocatedBlock, MetaError>;
    /// Reports replicas that served bad data.
    async fn report_bad_blocks(replicas: Vec<BadReplica>) -> Result<(), MetaError>;
    /// Sets a file's replication factor (HDFS `setReplication`): every block of the file is
    /// brought to it by repair (copies or excess deletions). A directory is `IsADirectory`.
    async fn set_replication(path: String, replication: u16) -> Result<(), MetaError>;
    /// The DataNodes and block totals.
    async fn cluster_report() -> Result<ClusterReport, MetaError>;
    /// Block-level health of every file at or under `path`.
    async fn fsck(path: String) -> Result<FsckReport, MetaError>;
    /// Starts lease recovery of the file at `path` for `client` (HDFS
    /// `DistributedFileSystem.recoverLease`): the file's last block is recovered and the file
    /// closed, whoever held its lease. `Ok(true)` once the file is closed (at once if it was
    /// not open); `Ok(false)` while recovery runs — call again.
    async fn recover_lease(path: String, client: String) -> Result<bool, MetaError>;
}

/// What a DataNode sends when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatanodeRegistration {
    /// Identity and advertised addresses.
    pub id: DatanodeId,
    /// Total bytes of its volumes.
    pub capacity: u64,
    /// Bytes used by replicas.
    pub used: u64,
    /// Bytes free.
    pub remaining: u64,
}

/// The metadata service's answer to a registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// Interval the DataNode should heartbeat at, in milliseconds.
    pub heartbeat_interval_ms: u64,
    /// The keys block access tokens are signed with; `None`: tokens are off and the DataNode
    /// serves ops without one.
    pub block_keys: Option<KeySet>,
}

/// A heartbeat: liveness and space.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Who.
    pub node: NodeId,
    /// Total bytes of its volumes.
    pub capacity: u64,
    /// Bytes used by replicas.
    pub used: u64,
    /// Bytes free.
    pub remaining: u64,
    /// Data-transfer connections being served.
    pub active_transfers: u32,
    /// Re-replication copies (`Transfer` commands) running on this DataNode (HDFS's
    /// `xmitsInProgress`): the metadata service hands out at most
    /// `replication.max-streams` minus this many new ones.
    #[serde(default)]
    pub transfers_in_progress: u32,
    /// Write pipelines (WriteBlock ops) it is serving now.
    #[serde(default)]
    pub active_pipelines: u32,
    /// Replicas being written through a write-memory buffer now.
    #[serde(default)]
    pub buffered_replicas: u32,
}

/// Work the metadata service hands to a DataNode in a heartbeat reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DatanodeCommand {
    /// Delete these replicas (deleted files, stale generation stamps, excess or corrupt copies).
    Delete {
        /// The replicas; a replica is deleted only if its generation stamp is not newer.
        blocks: Vec<ExtendedBlock>,
    },
    /// Copy a finalized replica to `targets` (re-replication).
    Transfer {
        /// The block.
        block: ExtendedBlock,
        /// Where to, in pipeline order.
        targets: Vec<DatanodeId>,
        /// A copy token naming `targets`.
        token: Option<BlockToken>,
    },
    /// Register again, then send a full block report (the service lost track of this node).
    Reregister,
    /// Be the primary of a block recovery (lease recovery of an abandoned file): ask every
    /// location for its replica, agree on a length, update the replicas and report with
    /// `commit_block_synchronization`.
    RecoverBlock(RecoveringBlock),
}

/// A block to recover (HDFS `RecoveringBlock`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveringBlock {
    /// The block as the metadata service knows it (id, generation stamp, length so far).
    pub block: ExtendedBlock,
    /// The recovery id: the block's generation stamp once recovered.
    pub recovery_id: GenerationStamp,
    /// Every DataNode that may hold a replica (the primary among them).
    pub locations: Vec<DatanodeId>,
    /// A recover token for the block at `recovery_id`, which the primary shows to every
    /// location.
    pub token: Option<BlockToken>,
}

/// The outcome of a block recovery, reported by its primary DataNode (HDFS
/// `commitBlockSynchronization`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockSync {
    /// The block as the `RecoverBlock` command named it.
    pub block: ExtendedBlock,
    /// The recovery id, now the generation stamp of the recovered replicas.
    pub new_gen_stamp: GenerationStamp,
    /// The agreed length.
    pub new_length: u64,
    /// Close the file once the block is recorded.
    pub close_file: bool,
    /// No replica holds any byte of the block: remove it from the file.
    pub delete_block: bool,
    /// The DataNodes whose replicas were finalized at `new_gen_stamp` and `new_length`.
    pub new_targets: Vec<NodeId>,
}

/// The reply to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// Work to do, in order.
    pub commands: Vec<DatanodeCommand>,
    /// The current block keys (they roll over); `None` where tokens are off.
    pub block_keys: Option<KeySet>,
}

/// An incremental report about one replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaEvent {
    /// A replica was finalized (its length is final).
    Received(ExtendedBlock),
    /// A replica was deleted.
    Deleted(ExtendedBlock),
    /// The block scanner found a replica whose data does not match its checksums.
    Corrupt(ExtendedBlock),
}

/// One replica in a full block report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaReport {
    /// The replica's block, generation stamp and length.
    pub block: ExtendedBlock,
    /// Its state.
    pub state: ReplicaState,
}

/// The protocol DataNodes speak to the metadata service.
#[tarpc::service]
pub trait DatanodeProtocol {
    /// Registers (or re-registers) a DataNode. A full block report must follow.
    async fn register(reg: DatanodeRegistration) -> Result<RegisterResponse, MetaError>;
    /// Liveness and space; the answer carries commands.
    async fn heartbeat(hb: Heartbeat) -> Result<HeartbeatResponse, MetaError>;
    /// Incremental replica events since the last call.
    async fn block_received(node: NodeId, events: Vec<ReplicaEvent>) -> Result<(), MetaError>;
    /// Every replica the DataNode holds (Temporary replicas excluded). Returns the number of
    /// replicas the service did not know and scheduled for deletion.
    async fn block_report(node: NodeId, replicas: Vec<ReplicaReport>) -> Result<u64, MetaError>;
    /// The result of a block recovery this DataNode ran as primary: records the block's new
    /// generation stamp, length and locations (or removes it) and closes the file.
    async fn commit_block_synchronization(sync: BlockSync) -> Result<(), MetaError>;
}

/// A tarpc context whose deadline is `timeout` from now.
pub fn context_with_timeout(timeout: Duration) -> tarpc::context::Context {
    let mut ctx = tarpc::context::current();
    ctx.deadline = Instant::now() + timeout;
    ctx
}

/// How long past its deadline [`bounded`] lets a call run before abandoning it.
pub const RPC_GRACE: Duration = Duration::from_secs(1);

/// Awaits an RPC made with a `timeout` deadline, but never longer than `timeout` +
/// [`RPC_GRACE`]: tarpc enforces the deadline inside its dispatch task, and a call made as its
/// connection broke (a metadata service restarting behind docker's port proxy) was seen to
/// wait on well past it. Past the bound the call is abandoned as
/// [`tarpc::client::RpcError::DeadlineExceeded`]; callers should then drop the connection.
pub async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, tarpc::client::RpcError>>,
) -> Result<T, tarpc::client::RpcError> {
    match tokio::time::timeout(timeout.saturating_add(RPC_GRACE), call).await {
        Ok(r) => r,
        Err(_) => Err(tarpc::client::RpcError::DeadlineExceeded),
    }
}

/// The tarpc transport on an established stream (after the preamble). `max_frame` bounds the
/// frames it encodes and decodes; a service also wraps its socket in a guarded
/// [`crate::rpc_stream::RpcStream`], which refuses a larger inbound prefix before the codec
/// sees (and reserves) it.
pub fn transport<S, Item, SinkItem>(
    stream: S,
    max_frame: usize,
) -> tarpc::serde_transport::Transport<
    S,
    Item,
    SinkItem,
    tarpc::tokio_serde::formats::Bincode<Item, SinkItem>,
>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite,
    Item: for<'de> Deserialize<'de>,
    SinkItem: Serialize,
{
    let framed = tokio_util::codec::LengthDelimitedCodec::builder()
        .max_frame_length(max_frame)
        .new_framed(stream);
    tarpc::serde_transport::new(framed, tarpc::tokio_serde::formats::Bincode::default())
}

async fn dial(addr: impl ToSocketAddrs, preamble: [u8; 4]) -> io::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    stream.write_all(&preamble).await?;
    check_echo(&mut stream, preamble).await?;
    Ok(stream)
}

async fn check_echo(stream: &mut TcpStream, preamble: [u8; 4]) -> io::Result<()> {
    // The service echoes the preamble once it has taken the connection. Without waiting for
    // it, a connection accepted by something else on the port (docker's port proxy while the
    // service restarts) looked established and its first call could hang.
    let mut echo = [0u8; 4];
    match stream.read_exact(&mut echo).await {
        Ok(_) if echo == preamble => Ok(()),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a Sluice metadata service: it answered {echo:?} to the preamble"),
        )),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the connection was closed before the metadata service accepted it",
        )),
        Err(e) => Err(e),
    }
}

/// What the service sends back on a new connection once it has read a known preamble.
pub async fn accept_preamble(stream: &mut TcpStream, preamble: [u8; 4]) -> io::Result<()> {
    stream.write_all(&preamble).await
}

/// Connects to the metadata service's client protocol.
pub async fn connect_client_protocol(addr: impl ToSocketAddrs) -> io::Result<ClientProtocolClient> {
    Ok(connect_client_protocol_watched(addr).await?.0)
}

/// Connects to the metadata service's client protocol; the watch tells when the service closed
/// the connection (an idle one, after its `rpc.idle.timeout`), so that the caller dials again
/// before its next call instead of failing it.
pub async fn connect_client_protocol_watched(
    addr: impl ToSocketAddrs,
) -> io::Result<(ClientProtocolClient, crate::rpc_stream::ConnectionWatch)> {
    let stream = crate::rpc_stream::RpcStream::watched(dial(addr, CLIENT_PREAMBLE).await?);
    let watch = stream.watch();
    let client = ClientProtocolClient::new(
        tarpc::client::Config::default(),
        transport(stream, MAX_RPC_FRAME),
    )
    .spawn();
    Ok((client, watch))
}

/// Connects to the metadata service's DataNode protocol (with no cluster secret).
pub async fn connect_datanode_protocol(
    addr: impl ToSocketAddrs,
) -> io::Result<DatanodeProtocolClient> {
    connect_datanode_protocol_with(addr, None).await
}

/// Connects to the metadata service's DataNode protocol, proving `secret` when the service
/// demands it (and checking the service's proof): see [`crate::auth`].
pub async fn connect_datanode_protocol_with(
    addr: impl ToSocketAddrs,
    secret: Option<&crate::auth::ClusterSecret>,
) -> io::Result<DatanodeProtocolClient> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    stream.write_all(&DATANODE_PREAMBLE).await?;
    crate::auth::answer(&mut stream, secret, DATANODE_PREAMBLE)
        .await
        .map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection was closed before the metadata service accepted it",
            ),
            _ => e,
        })?;
    Ok(DatanodeProtocolClient::new(
        tarpc::client::Config::default(),
        transport(stream, MAX_RPC_FRAME),
    )
    .spawn())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Something that accepts and closes at once (docker's port proxy while the service is
    /// down) is a connection error at once, not a client whose first call hangs.
    #[tokio::test]
    async fn a_port_that_accepts_and_closes_is_a_connect_error() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                drop(s);
            }
        });
        let e = connect_client_protocol(addr).await.err().unwrap();
        assert!(
            e.to_string()
                .contains("before the metadata service accepted it")
                || e.kind() == io::ErrorKind::ConnectionReset,
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_call_that_never_answers_is_abandoned_after_its_deadline_and_the_grace() {
        let t0 = Instant::now();
        let r: Result<(), _> = bounded(Duration::from_millis(10), std::future::pending()).await;
        assert!(matches!(r, Err(tarpc::client::RpcError::DeadlineExceeded)));
        let took = t0.elapsed();
        assert!(took >= RPC_GRACE && took < RPC_GRACE * 10, "{took:?}");
        // A call that answers in time is untouched.
        let r = bounded(Duration::from_secs(5), async { Ok(7) }).await;
        assert!(matches!(r, Ok(7)));
    }
}
