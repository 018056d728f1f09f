//! Test support: a tiny in-test metadata service (tarpc `DatanodeProtocol`) that records what
//! DataNodes tell it, DataNodes on `127.0.0.1:0` with temp dirs, and a raw framed client.
#![allow(dead_code, unused_imports, clippy::unwrap_used)]

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use sluice_common::checksum;
use sluice_common::config::{ByteSize, DatanodeConfig, HumanDuration, PathList};
use sluice_common::frame::{Frame, FrameCodec};
use sluice_common::proto::*;
use sluice_common::rpc::*;
use sluice_common::token::{BlockToken, KeySet};
use sluice_common::{
    BlockId, DatanodeId, ExtendedBlock, GenerationStamp, MetaError, NodeId, Status,
};
use sluice_datanode::DataNode;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tarpc::context::Context;
use tarpc::server::{BaseChannel, Channel};
use tokio::io::AsyncReadExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;

pub use sluice_testkit::{random_bytes, wait_for, within};

/// What the fake metadata service heard.
#[derive(Debug, Default)]
pub struct MetaLog {
    pub registered: Vec<DatanodeId>,
    pub events: Vec<(NodeId, ReplicaEvent)>,
    pub reports: Vec<(NodeId, Vec<ReplicaReport>)>,
    pub heartbeats: u64,
    /// Commands handed out with the next heartbeat of a node.
    pub commands: HashMap<NodeId, Vec<DatanodeCommand>>,
    /// Block recoveries reported by primaries.
    pub syncs: Vec<BlockSync>,
}

/// The fake metadata service.
#[derive(Clone, Default)]
pub struct FakeMeta {
    pub log: Arc<Mutex<MetaLog>>,
    /// Block keys handed out on registration and heartbeats (`None`: tokens off).
    pub block_keys: Option<KeySet>,
}

impl FakeMeta {
    pub fn received(&self, node: &NodeId, block: BlockId) -> bool {
        self.log
            .lock()
            .unwrap()
            .events
            .iter()
            .any(|(n, e)| n == node && matches!(e, ReplicaEvent::Received(b) if b.id == block))
    }
    pub fn deleted(&self, node: &NodeId, block: BlockId) -> bool {
        self.log
            .lock()
            .unwrap()
            .events
            .iter()
            .any(|(n, e)| n == node && matches!(e, ReplicaEvent::Deleted(b) if b.id == block))
    }
    pub fn last_report(&self, node: &NodeId) -> Option<Vec<ReplicaReport>> {
        let log = self.log.lock().unwrap();
        log.reports
            .iter()
            .rev()
            .find(|(n, _)| n == node)
            .map(|(_, r)| r.clone())
    }
    pub fn command(&self, node: &NodeId, c: DatanodeCommand) {
        self.log
            .lock()
            .unwrap()
            .commands
            .entry(node.clone())
            .or_default()
            .push(c);
    }
}

impl DatanodeProtocol for FakeMeta {
    async fn register(
        self,
        _: Context,
        reg: DatanodeRegistration,
    ) -> Result<RegisterResponse, MetaError> {
        self.log.lock().unwrap().registered.push(reg.id);
        Ok(RegisterResponse {
            heartbeat_interval_ms: 100,
            block_keys: self.block_keys.clone(),
        })
    }
    async fn heartbeat(self, _: Context, hb: Heartbeat) -> Result<HeartbeatResponse, MetaError> {
        let mut log = self.log.lock().unwrap();
        log.heartbeats += 1;
        let commands = log.commands.remove(&hb.node).unwrap_or_default();
        Ok(HeartbeatResponse {
            commands,
            block_keys: self.block_keys.clone(),
        })
    }
    async fn block_received(
        self,
        _: Context,
        node: NodeId,
        events: Vec<ReplicaEvent>,
    ) -> Result<(), MetaError> {
        let mut log = self.log.lock().unwrap();
        log.events
            .extend(events.into_iter().map(|e| (node.clone(), e)));
        Ok(())
    }
    async fn block_report(
        self,
        _: Context,
        node: NodeId,
        replicas: Vec<ReplicaReport>,
    ) -> Result<u64, MetaError> {
        self.log.lock().unwrap().reports.push((node, replicas));
        Ok(0)
    }
    async fn commit_block_synchronization(
        self,
        _: Context,
        sync: BlockSync,
    ) -> Result<(), MetaError> {
        self.log.lock().unwrap().syncs.push(sync);
        Ok(())
    }
}

/// Starts the fake metadata service on a free port.
pub async fn fake_meta() -> (SocketAddr, FakeMeta) {
    fake_meta_on("127.0.0.1:0".parse().unwrap()).await
}

/// Starts the fake metadata service on `addr`.
pub async fn fake_meta_on(addr: SocketAddr) -> (SocketAddr, FakeMeta) {
    sluice_common::telemetry::init("warn");
    let listener = TcpListener::bind(addr).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let meta = FakeMeta::default();
    let m = meta.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let m = m.clone();
            tokio::spawn(async move {
                let mut pre = [0u8; 4];
                if stream.read_exact(&mut pre).await.is_err() || pre != DATANODE_PREAMBLE {
                    return;
                }
                if sluice_common::rpc::accept_preamble(&mut stream, pre)
                    .await
                    .is_err()
                {
                    return;
                }
                BaseChannel::with_defaults(transport(stream, sluice_common::rpc::MAX_RPC_FRAME))
                    .execute(m.serve())
                    .for_each(|f| async move {
                        tokio::spawn(f);
                    })
                    .await;
            });
        }
    });
    (addr, meta)
}

/// A DataNode config for tests: loopback, free ports, fast heartbeats.
pub fn config(meta: SocketAddr, dirs: &[PathBuf]) -> DatanodeConfig {
    DatanodeConfig {
        metadata_address: meta.to_string(),
        bind_host: "127.0.0.1".into(),
        port: 0,
        http_port: 0,
        data_dirs: PathList(dirs.to_vec()),
        heartbeat_interval: HumanDuration::millis(100),
        socket_timeout: HumanDuration::secs(5),
        max_frame_bytes: ByteSize::mib(4),
        read_piece_bytes: ByteSize::kib(64),
        // The fake metadata service proves no cluster secret.
        security_enabled: false,
        ..DatanodeConfig::default()
    }
}

/// A DataNode with its own temp dir and stop token.
pub struct Node {
    pub dn: Option<DataNode>,
    pub dirs: Vec<PathBuf>,
    pub stop: CancellationToken,
    pub _tmp: Option<tempfile::TempDir>,
}

impl Node {
    pub async fn start(meta: SocketAddr) -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = vec![tmp.path().join("d1"), tmp.path().join("d2")];
        let mut n = Node::start_on(meta, dirs, None).await;
        n._tmp = Some(tmp);
        n
    }

    pub async fn start_on(
        meta: SocketAddr,
        dirs: Vec<PathBuf>,
        cfg: Option<DatanodeConfig>,
    ) -> Node {
        let stop = CancellationToken::new();
        let cfg = cfg.unwrap_or_else(|| config(meta, &dirs));
        let dn = DataNode::start(cfg, stop.clone()).await.unwrap();
        Node {
            dn: Some(dn),
            dirs,
            stop,
            _tmp: None,
        }
    }

    pub fn dn(&self) -> &DataNode {
        self.dn.as_ref().unwrap()
    }
    pub fn addr(&self) -> SocketAddr {
        self.dn().data_addr()
    }
    pub fn id(&self) -> DatanodeId {
        self.dn().datanode_id()
    }
    pub fn node_id(&self) -> NodeId {
        self.dn().node_id().clone()
    }
    pub async fn stop(&mut self) {
        self.stop.cancel();
        self.dn.take().unwrap().wait().await;
    }
}

/// A raw framed client.
pub struct Client {
    pub r: FramedRead<OwnedReadHalf, FrameCodec<Message>>,
    pub w: FramedWrite<OwnedWriteHalf, FrameCodec<Message>>,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).await.unwrap();
        let (r, w) = s.into_split();
        let codec = FrameCodec::<Message>::new(16 << 20);
        Client {
            r: FramedRead::new(r, codec.clone()),
            w: FramedWrite::new(w, codec),
        }
    }
    pub async fn send(&mut self, m: Message, payload: Bytes) {
        self.w.send(Frame::with_payload(m, payload)).await.unwrap();
    }
    /// The next frame; `None` if the connection closed.
    pub async fn next(&mut self) -> Option<Frame<Message>> {
        match tokio::time::timeout(Duration::from_secs(20), self.r.next())
            .await
            .expect("no frame in 20s")
        {
            Some(Ok(f)) => Some(f),
            _ => None,
        }
    }
    pub async fn op(&mut self, op: Op) -> OpResponse {
        self.op_with(op, None).await
    }
    /// Sends `op` with `token` and returns the answer.
    pub async fn op_with(&mut self, op: Op, token: Option<BlockToken>) -> OpResponse {
        self.send(
            Message::Op {
                version: PROTOCOL_VERSION,
                op,
                token,
            },
            Bytes::new(),
        )
        .await;
        self.response().await
    }
    pub async fn response(&mut self) -> OpResponse {
        match self.next().await.expect("connection closed").header {
            Message::OpResponse(r) => r,
            other => panic!("expected an OpResponse, got {other:?}"),
        }
    }
    pub async fn ack(&mut self) -> Option<PipelineAck> {
        match self.next().await?.header {
            Message::Ack(a) => Some(a),
            other => panic!("expected an Ack, got {other:?}"),
        }
    }
    pub async fn packet(&mut self, seqno: i64, offset: u64, data: &[u8], last: bool, sync: bool) {
        let h = PacketHeader {
            seqno,
            offset_in_block: offset,
            data_len: data.len() as u32,
            last,
            sync,
        };
        let mut payload = checksum::compute(data, 512);
        payload.extend_from_slice(data);
        self.send(Message::Packet(h), Bytes::from(payload)).await;
    }
}

pub fn block(id: u64, gs: u64, len: u64) -> ExtendedBlock {
    ExtendedBlock::new(BlockId(id), GenerationStamp(gs), len)
}

pub fn write_op(b: ExtendedBlock, stage: BlockStage, targets: Vec<DatanodeId>) -> Op {
    Op::WriteBlock(WriteBlockOp {
        block: b,
        stage,
        targets,
        client_name: "test-client".into(),
        bytes_per_checksum: 512,
        latest_gen_stamp: b.gen_stamp,
    })
}

/// Sends `data` as 64 KiB packets from `from`, seqnos from `seqno`; returns the next seqno.
pub async fn send_data(c: &mut Client, data: &[u8], from: u64, mut seqno: i64) -> i64 {
    let mut off = from;
    while off < data.len() as u64 {
        let end = (off + 65536).min(data.len() as u64);
        c.packet(seqno, off, &data[off as usize..end as usize], false, false)
            .await;
        off = end;
        seqno += 1;
    }
    seqno
}

/// Reads `n` acks and asserts each is all-SUCCESS over `width` DataNodes.
pub async fn expect_acks(c: &mut Client, n: usize, width: usize) {
    for _ in 0..n {
        let a = c.ack().await.expect("ack");
        assert_eq!(a.replies, vec![Status::Success; width], "ack {}", a.seqno);
    }
}

/// A whole block through a pipeline starting at `first`: simple 64 KiB packets, then last.
pub async fn write_block(
    first: SocketAddr,
    targets: Vec<DatanodeId>,
    b: ExtendedBlock,
    data: &[u8],
) {
    let width = targets.len() + 1;
    let mut c = Client::connect(first).await;
    let r = c.op(write_op(b, BlockStage::Create, targets)).await;
    assert_eq!(r.status, Status::Success, "{}", r.message);
    let seqno = send_data(&mut c, data, 0, 0).await;
    c.packet(seqno, data.len() as u64, &[], true, false).await;
    expect_acks(&mut c, seqno as usize + 1, width).await;
}

/// Streams `[offset, offset+len)` with ReadBlock; checks every chunk's checksums; returns the
/// response and the data from the aligned start.
pub async fn read_block(
    addr: SocketAddr,
    b: ExtendedBlock,
    offset: u64,
    len: u64,
) -> (OpResponse, Vec<u8>) {
    let mut c = Client::connect(addr).await;
    let r = c
        .op(Op::ReadBlock(ReadBlockOp {
            block: b,
            offset,
            length: len,
            piece_size: 0,
        }))
        .await;
    if r.status != Status::Success {
        return (r, Vec::new());
    }
    let mut out = Vec::new();
    let mut expect = offset / 512 * 512;
    loop {
        let f = c.next().await.expect("stream cut");
        match f.header {
            Message::Chunk(h) => {
                assert_eq!(h.offset, expect, "pieces in order");
                let (sums, data) = split_payload(&f.payload, h.data_len, h.bytes_per_checksum);
                checksum::verify(data, sums, h.bytes_per_checksum, h.offset)
                    .expect("valid checksums");
                out.extend_from_slice(data);
                expect += h.data_len as u64;
            }
            Message::ReadEnd(e) => {
                assert_eq!(e.status, Status::Success, "{}", e.message);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // The connection takes another op afterwards.
    let again = c.op(Op::ReplicaInfo(ReplicaInfoOp { block: b })).await;
    assert_eq!(again.status, Status::Success);
    (r, out)
}

/// One ReadChunk; returns the response and the data from the aligned start.
pub async fn read_chunk(
    c: &mut Client,
    b: ExtendedBlock,
    offset: u64,
    len: u64,
) -> (OpResponse, Vec<u8>) {
    let r = c
        .op(Op::ReadChunk(ReadChunkOp {
            block: b,
            offset,
            length: len,
        }))
        .await;
    if r.status != Status::Success {
        return (r, Vec::new());
    }
    let f = c.next().await.expect("chunk");
    let Message::Chunk(h) = f.header else {
        panic!("expected a chunk")
    };
    let (sums, data) = split_payload(&f.payload, h.data_len, h.bytes_per_checksum);
    checksum::verify(data, sums, h.bytes_per_checksum, h.offset).expect("valid checksums");
    (r, data.to_vec())
}

pub fn split_payload(p: &[u8], data_len: u32, bpc: u32) -> (&[u8], &[u8]) {
    let n = checksum::checksum_len(data_len as usize, bpc);
    assert_eq!(p.len(), n + data_len as usize, "payload size");
    p.split_at(n)
}

/// Finds the finalized block and meta files of `id` under `dirs`.
pub fn finalized_files(dirs: &[PathBuf], id: u64) -> Option<(PathBuf, PathBuf)> {
    for d in dirs {
        let root = d.join("current").join("finalized");
        for sub in std::fs::read_dir(&root).ok()?.flatten() {
            let blk = sub.path().join(format!("blk_{id}"));
            if blk.exists() {
                let meta = std::fs::read_dir(sub.path())
                    .ok()?
                    .flatten()
                    .map(|e| e.path())
                    .find(|p| {
                        p.file_name()
                            .unwrap()
                            .to_string_lossy()
                            .starts_with(&format!("blk_{id}_"))
                    })?;
                return Some((blk, meta));
            }
        }
    }
    None
}

/// Asserts the files hold `data` with a valid header and CRCs.
pub fn assert_valid_files(blk: &Path, meta: &Path, data: &[u8]) {
    assert_eq!(std::fs::read(blk).unwrap(), data, "block file content");
    let m = std::fs::read(meta).unwrap();
    assert_eq!(&m[..3], &[0, 1, 2], "meta version 1, CRC32C");
    let bpc = u32::from_be_bytes([m[3], m[4], m[5], m[6]]);
    checksum::verify(data, &m[7..], bpc, 0).expect("meta CRCs match the block file");
}
