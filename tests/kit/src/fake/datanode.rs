//! A fake DataNode on a real socket: it speaks the data-transfer protocol (WriteBlock as the
//! whole pipeline, ReadBlock, ReadChunk, ReplicaInfo), checks what the client sends (seqnos,
//! chunk-aligned offsets, no holes, checksums), keeps blocks in memory, and has knobs to
//! inject failures.

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use sluice_common::checksum;
use sluice_common::frame::{Frame, FrameCodec};
use sluice_common::proto::*;
use sluice_common::{DatanodeId, ExtendedBlock, GenerationStamp, NodeId, Status};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Framed;

const BPC: u32 = 512;

/// What the fake holds and every knob.
#[derive(Debug, Default)]
pub struct DnState {
    /// Block id → bytes held.
    pub blocks: HashMap<u64, Vec<u8>>,
    /// Blocks finalized, in order.
    pub finalized: Vec<u64>,
    /// Visible length to report instead of the bytes held.
    pub visible: HashMap<u64, u64>,
    /// Flip a byte in data served to readers (after computing checksums).
    pub corrupt_reads: bool,
    /// Send read payloads 3 bytes shorter than their header says (Ozone HDDS-15794).
    pub truncate_reads: bool,
    /// Answer the ack of this seqno with `status` at pipeline position `index` (once).
    pub fail_ack: Option<(i64, usize, Status)>,
    /// The stage of every WriteBlock received.
    pub stages: Vec<BlockStage>,
    /// Refuse WriteBlock set-up with this status and first_bad_link.
    pub refuse_setup: Option<(Status, Option<String>)>,
    /// Answer reads naming another replica's generation stamp: `(n, stamp)` names `stamp`
    /// from the `n`-th chunk served on (counted over every read), and in every op response
    /// given once that many chunks were served (a DataNode serving whatever replica it holds,
    /// or one whose replica changed mid-read).
    pub other_stamp: Option<(usize, GenerationStamp)>,
    /// Read chunks served (`ReadBlock` pieces and `ReadChunk` answers).
    pub chunks_served: usize,
    /// Close the next ReadBlock connection after this many chunks (once).
    pub cut_stream_after: Option<usize>,
    /// Never send acks.
    pub stall_acks: bool,
    /// Every packet header received.
    pub packets: Vec<PacketHeader>,
    /// Heartbeat packets received.
    pub heartbeats: usize,
    /// `ReadBlock` ops received.
    pub read_ops: usize,
    /// Chunk-read ops received.
    pub chunk_ops: usize,
    /// `WriteBlock` ops received.
    pub write_ops: usize,
    /// Protocol violations seen (the tests assert there are none).
    pub violations: Vec<String>,
}

/// A running fake DataNode.
pub struct DnHandle {
    /// How to reach it.
    pub id: DatanodeId,
    /// What it records and its knobs.
    pub state: Arc<Mutex<DnState>>,
    _task: tokio_util::task::AbortOnDropHandle<()>,
}

impl DnHandle {
    /// Locks the state.
    pub fn st(&self) -> std::sync::MutexGuard<'_, DnState> {
        self.state.lock().unwrap()
    }
}

type Conn = Framed<TcpStream, FrameCodec<Message>>;

/// Starts a fake DataNode named `name` on `127.0.0.1:0`.
pub async fn start_dn(name: &str) -> DnHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let state = Arc::new(Mutex::new(DnState::default()));
    let st = Arc::clone(&state);
    let task = tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let st = Arc::clone(&st);
            tokio::spawn(async move {
                let _ = serve(Framed::new(sock, FrameCodec::new(16 << 20)), st).await;
            });
        }
    });
    DnHandle {
        id: DatanodeId {
            node_id: NodeId(name.to_string()),
            data_addr: addr,
            http_addr: String::new(),
            rack: "/default-rack".into(),
        },
        state,
        _task: tokio_util::task::AbortOnDropHandle::new(task),
    }
}

fn resp(status: Status, msg: &str) -> Frame<Message> {
    Frame::new(Message::OpResponse(OpResponse::error(status, msg)))
}

async fn serve(mut conn: Conn, st: Arc<Mutex<DnState>>) -> Option<()> {
    while let Some(Ok(frame)) = conn.next().await {
        let Message::Op { op, .. } = frame.header else {
            return None;
        };
        match op {
            Op::WriteBlock(w) => return write_block(conn, st, w).await,
            Op::ReadBlock(r) => read_block(&mut conn, &st, r).await?,
            Op::ReadChunk(r) => read_chunk(&mut conn, &st, r).await?,
            Op::ReplicaInfo(r) => {
                let info = replica(&st, &r.block);
                let f = match info {
                    Some(info) => Frame::new(Message::OpResponse(OpResponse {
                        replica: Some(info),
                        ..OpResponse::ok()
                    })),
                    None => resp(Status::ErrorNotFound, "no replica"),
                };
                conn.send(f).await.ok()?;
            }
            Op::TransferBlock(_)
            | Op::InitReplicaRecovery(_)
            | Op::UpdateReplicaUnderRecovery(_) => {
                conn.send(resp(Status::ErrorUnsupported, "")).await.ok()?
            }
        }
    }
    Some(())
}

fn replica(st: &Mutex<DnState>, block: &ExtendedBlock) -> Option<ReplicaInfo> {
    let s = st.lock().unwrap();
    let data = s.blocks.get(&block.id.0)?;
    let visible = s
        .visible
        .get(&block.id.0)
        .copied()
        .unwrap_or(data.len() as u64);
    Some(ReplicaInfo {
        block: ExtendedBlock::new(block.id, block.gen_stamp, visible),
        state: if s.finalized.contains(&block.id.0) {
            ReplicaState::Finalized
        } else {
            ReplicaState::Rbw
        },
        bytes_on_disk: data.len() as u64,
    })
}

async fn write_block(mut conn: Conn, st: Arc<Mutex<DnState>>, w: WriteBlockOp) -> Option<()> {
    let refuse = {
        let mut s = st.lock().unwrap();
        s.write_ops += 1;
        s.refuse_setup.clone()
    };
    if let Some((status, link)) = refuse {
        let mut r = OpResponse::error(status, "refused by the test");
        r.first_bad_link = link;
        conn.send(Frame::new(Message::OpResponse(r))).await.ok()?;
        return Some(());
    }
    if !prepare(&st, &w) {
        conn.send(resp(Status::ErrorInvalid, "cannot recover"))
            .await
            .ok()?;
        return Some(());
    }
    conn.send(Frame::new(Message::OpResponse(OpResponse::ok())))
        .await
        .ok()?;
    if w.stage == BlockStage::CloseRecovery {
        return Some(()); // finalized during set-up; no packets follow
    }
    let pipeline = 1 + w.targets.len();
    let mut expected_seqno = 0i64;
    while let Some(Ok(frame)) = conn.next().await {
        let Message::Packet(h) = frame.header else {
            return None;
        };
        let ack_status = on_packet(&st, w.block.id.0, &h, &frame.payload, &mut expected_seqno);
        let (stall, fail) = {
            let s = st.lock().unwrap();
            (s.stall_acks, s.fail_ack)
        };
        if stall {
            continue;
        }
        let mut replies = vec![ack_status; pipeline];
        if let Some((seq, idx, status)) = fail {
            if seq == h.seqno && idx < pipeline {
                replies[idx] = status;
                st.lock().unwrap().fail_ack = None;
            }
        }
        let ack = PipelineAck {
            seqno: h.seqno,
            replies,
        };
        conn.send(Frame::new(Message::Ack(ack))).await.ok()?;
    }
    Some(())
}

/// Prepares the replica for the op's stage (the fake holds one copy for the whole pipeline):
/// a new one for `Create`; truncated to the acknowledged length for the recovery stages, and
/// finalized for `CloseRecovery`. False when there is nothing to recover.
fn prepare(st: &Mutex<DnState>, w: &WriteBlockOp) -> bool {
    let mut s = st.lock().unwrap();
    s.stages.push(w.stage);
    let id = w.block.id.0;
    match w.stage {
        BlockStage::StreamingRecovery | BlockStage::CloseRecovery => {
            let Some(held) = s.blocks.get_mut(&id) else {
                return false;
            };
            if (held.len() as u64) < w.block.num_bytes {
                return false;
            }
            held.truncate(w.block.num_bytes as usize);
            if w.stage == BlockStage::CloseRecovery {
                s.finalized.push(id);
            }
        }
        _ => {
            s.blocks.insert(id, Vec::new());
        }
    }
    true
}

/// Checks and applies one packet; returns this node's status.
fn on_packet(
    st: &Mutex<DnState>,
    id: u64,
    h: &PacketHeader,
    payload: &Bytes,
    next: &mut i64,
) -> Status {
    let mut s = st.lock().unwrap();
    s.packets.push(*h);
    if h.seqno == HEARTBEAT_SEQNO {
        s.heartbeats += 1;
        return Status::Success;
    }
    let bad = |s: &mut DnState, why: String| {
        s.violations.push(why);
        Status::ErrorInvalid
    };
    if h.seqno != *next {
        return bad(&mut s, format!("seqno {} expected {}", h.seqno, *next));
    }
    *next += 1;
    let held = s.blocks.get(&id).map_or(0, |b| b.len() as u64);
    if !h.offset_in_block.is_multiple_of(u64::from(BPC)) || h.offset_in_block > held {
        return bad(
            &mut s,
            format!("offset {} with {held} held", h.offset_in_block),
        );
    }
    if h.last {
        if h.data_len != 0 {
            return bad(&mut s, "last packet with data".into());
        }
        s.finalized.push(id);
        return Status::Success;
    }
    let sums = checksum::checksum_len(h.data_len as usize, BPC);
    if payload.len() != sums + h.data_len as usize {
        return bad(&mut s, "payload length".into());
    }
    let data = &payload[sums..];
    if checksum::verify(data, &payload[..sums], BPC, h.offset_in_block).is_err() {
        return Status::ErrorChecksum;
    }
    let block = s.blocks.entry(id).or_default();
    let start = h.offset_in_block as usize;
    let overlap = (block.len() - start).min(data.len());
    if block[start..start + overlap] != data[..overlap] {
        s.violations
            .push(format!("re-sent bytes at {start} differ"));
        return Status::ErrorInvalid;
    }
    block.extend_from_slice(&data[overlap..]);
    Status::Success
}

/// The bytes `[offset aligned down, min(end, visible))` of a replica, with where they start.
struct Served {
    block: ExtendedBlock,
    data: Vec<u8>,
    from: u64,
    visible: u64,
    corrupt: bool,
    truncate: bool,
}

fn serve_bytes(
    st: &Mutex<DnState>,
    block: &ExtendedBlock,
    offset: u64,
    end: u64,
) -> Result<Served, Frame<Message>> {
    let s = st.lock().unwrap();
    let Some(data) = s.blocks.get(&block.id.0) else {
        return Err(resp(Status::ErrorNotFound, "no such replica"));
    };
    let visible = s
        .visible
        .get(&block.id.0)
        .copied()
        .unwrap_or(data.len() as u64);
    if offset >= visible {
        let msg = format!("offset {offset} >= visible {visible}");
        return Err(resp(Status::ErrorOutOfRange, &msg));
    }
    let from = offset / u64::from(BPC) * u64::from(BPC);
    let to = end.min(visible);
    Ok(Served {
        block: *block,
        data: data[from as usize..to as usize].to_vec(),
        from,
        visible,
        corrupt: s.corrupt_reads,
        truncate: s.truncate_reads,
    })
}

/// The stamp the next answer names: the one asked for, or the `other_stamp` knob's once its
/// chunk count is reached. `chunk` counts the answer as a served chunk.
fn answer_stamp(st: &Mutex<DnState>, asked: GenerationStamp, chunk: bool) -> GenerationStamp {
    let mut s = st.lock().unwrap();
    let served = s.chunks_served;
    if chunk {
        s.chunks_served += 1;
    }
    match s.other_stamp {
        Some((n, other)) if served >= n => other,
        _ => asked,
    }
}

/// A chunk of `[from, to)` (block offsets) out of `s`, naming `stamp`.
fn chunk_frame(s: &Served, from: u64, to: u64, stamp: GenerationStamp) -> Frame<Message> {
    let slice = &s.data[(from - s.from) as usize..(to - s.from) as usize];
    let mut payload = checksum::compute(slice, BPC);
    let mut body = slice.to_vec();
    if s.corrupt && !body.is_empty() {
        body[0] ^= 0xff;
    }
    payload.extend_from_slice(&body);
    if s.truncate {
        payload.truncate(payload.len().saturating_sub(3));
    }
    let h = ChunkHeader {
        block: s.block.id,
        gen_stamp: stamp,
        offset: from,
        data_len: slice.len() as u32,
        bytes_per_checksum: BPC,
    };
    Frame::with_payload(Message::Chunk(h), Bytes::from(payload))
}

fn ok_with(block: &ExtendedBlock, stamp: GenerationStamp, visible: u64) -> Frame<Message> {
    Frame::new(Message::OpResponse(OpResponse {
        replica: Some(ReplicaInfo {
            block: ExtendedBlock::new(block.id, stamp, visible),
            state: ReplicaState::Finalized,
            bytes_on_disk: visible,
        }),
        ..OpResponse::ok()
    }))
}

async fn read_block(conn: &mut Conn, st: &Mutex<DnState>, r: ReadBlockOp) -> Option<()> {
    st.lock().unwrap().read_ops += 1;
    let s = match serve_bytes(st, &r.block, r.offset, r.offset.saturating_add(r.length)) {
        Ok(x) => x,
        Err(f) => return conn.send(f).await.ok(),
    };
    let stamp = answer_stamp(st, r.block.gen_stamp, false);
    conn.send(ok_with(&r.block, stamp, s.visible)).await.ok()?;
    let piece = if r.piece_size == 0 {
        1 << 20
    } else {
        u64::from(r.piece_size)
    };
    let end = s.from + s.data.len() as u64;
    let mut at = s.from;
    let mut cut = st.lock().unwrap().cut_stream_after.take();
    while at < end {
        if cut == Some(0) {
            return None; // drop the connection mid-stream
        }
        cut = cut.map(|c| c - 1);
        let to = (at + piece).min(end);
        let stamp = answer_stamp(st, r.block.gen_stamp, true);
        conn.send(chunk_frame(&s, at, to, stamp)).await.ok()?;
        at = to;
    }
    let fin = ReadEnd {
        status: Status::Success,
        message: String::new(),
    };
    conn.send(Frame::new(Message::ReadEnd(fin))).await.ok()
}

async fn read_chunk(conn: &mut Conn, st: &Mutex<DnState>, r: ReadChunkOp) -> Option<()> {
    st.lock().unwrap().chunk_ops += 1;
    let s = match serve_bytes(st, &r.block, r.offset, r.offset.saturating_add(r.length)) {
        Ok(x) => x,
        Err(f) => return conn.send(f).await.ok(),
    };
    let stamp = answer_stamp(st, r.block.gen_stamp, false);
    conn.send(ok_with(&r.block, stamp, s.visible)).await.ok()?;
    let to = s.from + s.data.len() as u64;
    let stamp = answer_stamp(st, r.block.gen_stamp, true);
    conn.send(chunk_frame(&s, s.from, to, stamp)).await.ok()
}
