//! A fake metadata service on a real socket: the client protocol over tarpc, with an in-memory
//! namespace just rich enough for the client's protocol tests, and knobs to inject behaviour.

use futures::StreamExt;
use sluice_common::rpc::*;
use sluice_common::{BlockId, DatanodeId, ExtendedBlock, GenerationStamp, MetaError, NodeId};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tarpc::context::Context;
use tarpc::server::{BaseChannel, Channel};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

/// A file of the fake namespace.
#[derive(Debug, Clone, Default)]
pub struct FakeFile {
    /// Its blocks, in order.
    pub blocks: Vec<LocatedBlock>,
    /// Open for writing.
    pub under_construction: bool,
    /// Its block size.
    pub block_size: u64,
    /// Its replication factor.
    pub replication: u16,
    /// The length the last `fsync` recorded.
    pub fsync_len: Option<u64>,
}

/// Everything the fake records and every knob.
#[derive(Debug, Default)]
pub struct MetaState {
    /// The namespace: path → file.
    pub files: BTreeMap<String, FakeFile>,
    /// DataNodes handed out by add_block, in pipeline order (minus excluded ones).
    pub datanodes: Vec<DatanodeId>,
    /// The next block id to hand out.
    pub next_block: u64,
    /// Every `add_block`: the previous block and the excluded DataNodes.
    pub add_block_calls: Vec<(Option<ExtendedBlock>, Vec<NodeId>)>,
    /// Blocks abandoned (`abandon_block`).
    pub abandoned: Vec<ExtendedBlock>,
    /// Every `complete`'s last block.
    pub completes: Vec<Option<ExtendedBlock>>,
    /// `complete` answers false this many times first.
    pub complete_false: usize,
    /// `add_block` answers NotReplicatedYet this many times first.
    pub not_replicated_yet: usize,
    /// Lease renewals received.
    pub renewals: usize,
    /// Every `fsync`'s recorded length.
    pub fsyncs: Vec<u64>,
    /// Bad replicas reported.
    pub bad_reports: Vec<BadReplica>,
    /// The block size of files created without one.
    pub default_block_size: u64,
    /// `update_block_for_pipeline` answers UnknownBlock (recovery refused).
    pub refuse_recovery: bool,
    /// Generation stamps handed out by `update_block_for_pipeline`.
    pub gen_stamp_requests: u64,
    /// `update_pipeline` calls: old block, new block, DataNodes.
    pub pipeline_updates: Vec<(ExtendedBlock, ExtendedBlock, Vec<NodeId>)>,
}

#[derive(Clone)]
struct FakeMeta(Arc<Mutex<MetaState>>);

impl FakeMeta {
    fn st(&self) -> std::sync::MutexGuard<'_, MetaState> {
        self.0.lock().unwrap()
    }
}

fn status_of(path: &str, f: &FakeFile) -> FileStatus {
    let length = f
        .blocks
        .iter()
        .map(|b| b.block.num_bytes)
        .sum::<u64>()
        .max(f.fsync_len.unwrap_or(0));
    FileStatus {
        path: path.to_string(),
        kind: FileKind::File,
        length,
        replication: f.replication,
        block_size: f.block_size,
        modification_time_ms: 0,
        under_construction: f.under_construction,
        block_count: f.blocks.len() as u64,
    }
}

impl ClientProtocol for FakeMeta {
    async fn mkdirs(self, _: Context, _path: String, _parents: bool) -> Result<(), MetaError> {
        Ok(())
    }

    async fn create(
        self,
        _: Context,
        path: String,
        o: CreateOptions,
    ) -> Result<FileStatus, MetaError> {
        let mut st = self.st();
        if st.files.contains_key(&path) && !o.overwrite {
            return Err(MetaError::AlreadyExists { path });
        }
        let block_size = if o.block_size == 0 {
            st.default_block_size
        } else {
            o.block_size
        };
        let f = FakeFile {
            blocks: vec![],
            under_construction: true,
            block_size,
            replication: o.replication,
            fsync_len: None,
        };
        let s = status_of(&path, &f);
        st.files.insert(path, f);
        Ok(s)
    }

    async fn append(
        self,
        _: Context,
        path: String,
        _client: String,
    ) -> Result<AppendResponse, MetaError> {
        let mut st = self.st();
        let f = st
            .files
            .get_mut(&path)
            .ok_or_else(|| MetaError::NotFound { path: path.clone() })?;
        f.under_construction = true;
        let last_block = f
            .blocks
            .last()
            .filter(|b| b.block.num_bytes < f.block_size)
            .cloned();
        Ok(AppendResponse {
            status: status_of(&path, f),
            previous: match last_block {
                Some(_) => None,
                None => f.blocks.last().map(|b| b.block),
            },
            last_block,
        })
    }

    async fn add_block(
        self,
        _: Context,
        path: String,
        _client: String,
        previous: Option<ExtendedBlock>,
        exclude: Vec<NodeId>,
    ) -> Result<LocatedBlock, MetaError> {
        let mut st = self.st();
        st.add_block_calls.push((previous, exclude.clone()));
        if st.not_replicated_yet > 0 {
            st.not_replicated_yet -= 1;
            return Err(MetaError::NotReplicatedYet {
                block: previous.map(|b| b.id).unwrap_or(BlockId(0)),
            });
        }
        let locations: Vec<DatanodeId> = st
            .datanodes
            .iter()
            .filter(|d| !exclude.contains(&d.node_id))
            .cloned()
            .collect();
        if locations.is_empty() {
            return Err(MetaError::NotEnoughDatanodes {
                needed: 1,
                available: 0,
            });
        }
        st.next_block += 1;
        let id = BlockId(st.next_block);
        let file = st
            .files
            .get_mut(&path)
            .ok_or(MetaError::NotFound { path: path.clone() })?;
        if let (Some(prev), Some(last)) = (previous, file.blocks.last_mut()) {
            last.block.num_bytes = prev.num_bytes;
        }
        let offset = file.blocks.iter().map(|b| b.block.num_bytes).sum();
        let lb = LocatedBlock {
            block: ExtendedBlock::new(id, GenerationStamp(1000 + id.0), 0),
            offset,
            locations,
            corrupt: false,
            token: None,
        };
        file.blocks.push(lb.clone());
        Ok(lb)
    }

    async fn abandon_block(
        self,
        _: Context,
        path: String,
        _client: String,
        block: ExtendedBlock,
    ) -> Result<(), MetaError> {
        let mut st = self.st();
        st.abandoned.push(block);
        if let Some(f) = st.files.get_mut(&path) {
            f.blocks.retain(|b| b.block.id != block.id);
        }
        Ok(())
    }

    async fn complete(
        self,
        _: Context,
        path: String,
        _client: String,
        last: Option<ExtendedBlock>,
    ) -> Result<bool, MetaError> {
        let mut st = self.st();
        st.completes.push(last);
        if st.complete_false > 0 {
            st.complete_false -= 1;
            return Ok(false);
        }
        let f = st
            .files
            .get_mut(&path)
            .ok_or(MetaError::NotFound { path })?;
        if let (Some(l), Some(b)) = (last, f.blocks.last_mut()) {
            b.block.num_bytes = l.num_bytes;
        }
        f.under_construction = false;
        Ok(true)
    }

    async fn fsync(self, _: Context, path: String, _c: String, len: u64) -> Result<(), MetaError> {
        let mut st = self.st();
        st.fsyncs.push(len);
        if let Some(f) = st.files.get_mut(&path) {
            f.fsync_len = Some(len);
        }
        Ok(())
    }

    async fn get_block_locations(
        self,
        _: Context,
        path: String,
        _offset: u64,
        _length: u64,
    ) -> Result<LocatedBlocks, MetaError> {
        let st = self.st();
        let f = st
            .files
            .get(&path)
            .ok_or(MetaError::NotFound { path: path.clone() })?;
        Ok(LocatedBlocks {
            file_length: status_of(&path, f).length,
            blocks: f.blocks.clone(),
            under_construction: f.under_construction,
        })
    }

    async fn list(self, _: Context, path: String) -> Result<Vec<FileStatus>, MetaError> {
        let st = self.st();
        Ok(st
            .files
            .iter()
            .filter(|(p, _)| p.starts_with(&path))
            .map(|(p, f)| status_of(p, f))
            .collect())
    }

    async fn stat(self, _: Context, path: String) -> Result<FileStatus, MetaError> {
        let st = self.st();
        if path == "/" {
            return Ok(FileStatus {
                path,
                kind: FileKind::Directory,
                length: 0,
                replication: 0,
                block_size: 0,
                modification_time_ms: 0,
                under_construction: false,
                block_count: 0,
            });
        }
        let f = st
            .files
            .get(&path)
            .ok_or(MetaError::NotFound { path: path.clone() })?;
        Ok(status_of(&path, f))
    }

    async fn delete(self, _: Context, path: String, _r: bool) -> Result<bool, MetaError> {
        Ok(self.st().files.remove(&path).is_some())
    }

    async fn rename(self, _: Context, src: String, dst: String) -> Result<(), MetaError> {
        let mut st = self.st();
        let f = st
            .files
            .remove(&src)
            .ok_or(MetaError::NotFound { path: src })?;
        st.files.insert(dst, f);
        Ok(())
    }

    async fn renew_lease(self, _: Context, _client: String) -> Result<(), MetaError> {
        self.st().renewals += 1;
        Ok(())
    }

    async fn update_block_for_pipeline(
        self,
        _: Context,
        block: ExtendedBlock,
        _client: String,
    ) -> Result<LocatedBlock, MetaError> {
        let mut st = self.st();
        if st.refuse_recovery {
            return Err(MetaError::UnknownBlock { block: block.id });
        }
        st.gen_stamp_requests += 1;
        let gs = GenerationStamp(block.gen_stamp.0 + st.gen_stamp_requests);
        Ok(LocatedBlock {
            block: ExtendedBlock::new(block.id, gs, block.num_bytes),
            offset: 0,
            locations: st.datanodes.clone(),
            corrupt: false,
            token: None,
        })
    }

    async fn update_pipeline(
        self,
        _: Context,
        _client: String,
        old: ExtendedBlock,
        new: ExtendedBlock,
        nodes: Vec<NodeId>,
    ) -> Result<(), MetaError> {
        self.st().pipeline_updates.push((old, new, nodes));
        Ok(())
    }

    async fn get_additional_datanodes(
        self,
        _: Context,
        req: AdditionalDatanodes,
    ) -> Result<LocatedBlock, MetaError> {
        Ok(LocatedBlock {
            block: req.block,
            offset: 0,
            locations: vec![],
            corrupt: false,
            token: None,
        })
    }

    async fn recover_lease(
        self,
        _: Context,
        path: String,
        _client: String,
    ) -> Result<bool, MetaError> {
        let mut st = self.st();
        let f = st
            .files
            .get_mut(&path)
            .ok_or(MetaError::NotFound { path })?;
        f.under_construction = false;
        Ok(true)
    }

    async fn report_bad_blocks(self, _: Context, r: Vec<BadReplica>) -> Result<(), MetaError> {
        self.st().bad_reports.extend(r);
        Ok(())
    }

    async fn set_replication(
        self,
        _: Context,
        path: String,
        replication: u16,
    ) -> Result<(), MetaError> {
        let mut st = self.st();
        let f = st
            .files
            .get_mut(&path)
            .ok_or(MetaError::NotFound { path })?;
        f.replication = replication;
        Ok(())
    }

    async fn cluster_report(self, _: Context) -> Result<ClusterReport, MetaError> {
        Ok(ClusterReport {
            datanodes: vec![],
            files: self.st().files.len() as u64,
            directories: 1,
            blocks: 0,
            under_replicated_blocks: 0,
            missing_blocks: 0,
            corrupt_blocks: 0,
        })
    }

    async fn fsck(self, _: Context, path: String) -> Result<FsckReport, MetaError> {
        Ok(FsckReport {
            path,
            files: vec![],
            health: Health::Healthy,
        })
    }
}

/// A running fake metadata service.
pub struct MetaHandle {
    /// Its RPC address.
    pub addr: String,
    /// What it records and its knobs.
    pub state: Arc<Mutex<MetaState>>,
    /// Closes every open connection (new ones are still accepted).
    pub drop_connections: Arc<tokio::sync::Notify>,
    _task: tokio_util::task::AbortOnDropHandle<()>,
}

impl MetaHandle {
    /// Locks the state.
    pub fn st(&self) -> std::sync::MutexGuard<'_, MetaState> {
        self.state.lock().unwrap()
    }
}

/// Starts a fake metadata service on `127.0.0.1:0`.
pub async fn start_meta(datanodes: Vec<DatanodeId>) -> MetaHandle {
    let state = Arc::new(Mutex::new(MetaState {
        datanodes,
        default_block_size: 4096,
        ..Default::default()
    }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let st = Arc::clone(&state);
    let drop_connections = Arc::new(tokio::sync::Notify::new());
    let kill = Arc::clone(&drop_connections);
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let st = Arc::clone(&st);
            let kill = Arc::clone(&kill);
            tokio::spawn(async move {
                let killed = kill.notified();
                let mut pre = [0u8; 4];
                if sock.read_exact(&mut pre).await.is_err() || pre != CLIENT_PREAMBLE {
                    return;
                }
                if sluice_common::rpc::accept_preamble(&mut sock, pre)
                    .await
                    .is_err()
                {
                    return;
                }
                let channel =
                    BaseChannel::with_defaults(transport(sock, sluice_common::rpc::MAX_RPC_FRAME));
                let serve = channel
                    .execute(FakeMeta(st).serve())
                    .for_each(|f| async move {
                        tokio::spawn(f);
                    });
                tokio::select! {
                    _ = serve => {}
                    _ = killed => {}
                }
            });
        }
    });
    MetaHandle {
        addr,
        state,
        drop_connections,
        _task: tokio_util::task::AbortOnDropHandle::new(task),
    }
}
