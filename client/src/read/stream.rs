//! Stream mode: one `ReadBlock` request for the rest of a block; a fetcher task receives the
//! DataNode's pieces, verifies their checksums and keeps them in a bounded [`ReadBuffer`]
//! shared with the reader. When the buffer is full the task stops reading the socket, and TCP
//! backpressure pauses the DataNode. Reads and short forward seeks inside what was received
//! never touch the network.

use super::buffer::ReadBuffer;
use super::stats::ReadCounters;
use crate::connection::{chunk_data, message_name, status_error, DnConnection, DnSettings};
use crate::error::ClientError;
use bytes::Bytes;
use sluice_common::proto::{Message, Op, ReadBlockOp};
use sluice_common::token::BlockToken;
use sluice_common::{DatanodeId, ExtendedBlock};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, Instrument};

/// How streams are run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamParams {
    /// Socket timeout and frame limit.
    pub settings: DnSettings,
    /// Data bytes per piece asked of the DataNode.
    pub piece_size: u32,
    /// Bytes received and not yet read, at most.
    pub buffer_bytes: usize,
    /// Verify checksums.
    pub verify: bool,
}

/// What [`BlockStream::wait_for`] found.
#[derive(Debug)]
pub(crate) enum Wait {
    /// The position is in the buffer.
    Ready,
    /// The position is outside what this stream can deliver soon: start a new stream there.
    Restart,
    /// The stream ended (the replica's visible length) before the position.
    Short {
        /// Where the replica's data ended.
        end: u64,
    },
    /// The stream failed; buffered bytes before the failure were all served.
    Failed(ClientError),
}

struct StreamState {
    buf: ReadBuffer,
    /// At least one chunk arrived.
    progressed: bool,
    /// `Ok(end)`: the stream finished at block offset `end`; `Err`: it failed.
    end: Option<Result<u64, ClientError>>,
}

struct Shared {
    state: Mutex<StreamState>,
    /// Signalled when bytes arrive or the stream ends.
    data: Notify,
    /// Signalled when the reader frees room.
    space: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One running `ReadBlock` stream of a block from one DataNode.
pub(crate) struct BlockStream {
    shared: Arc<Shared>,
    node: DatanodeId,
    piece: u64,
    _task: AbortOnDropHandle<()>,
}

impl BlockStream {
    /// Starts streaming `[offset, offset + length)` of `block` from `node`.
    pub(crate) fn start(
        node: DatanodeId,
        (block, token): (ExtendedBlock, Option<BlockToken>),
        (offset, length): (u64, u64),
        params: StreamParams,
        counters: Arc<ReadCounters>,
    ) -> BlockStream {
        let shared = Arc::new(Shared {
            state: Mutex::new(StreamState {
                buf: ReadBuffer::new(offset, params.buffer_bytes),
                progressed: false,
                end: None,
            }),
            data: Notify::new(),
            space: Notify::new(),
        });
        let span = tracing::debug_span!("read_stream", block = %block.id, node = %node);
        let task = tokio::spawn(
            fetch(
                Arc::clone(&shared),
                node.clone(),
                (block, token),
                (offset, length),
                params,
                counters,
            )
            .instrument(span),
        );
        BlockStream {
            shared,
            node,
            piece: u64::from(params.piece_size.max(1)),
            _task: AbortOnDropHandle::new(task),
        }
    }

    /// The DataNode serving this stream.
    pub(crate) fn node(&self) -> &DatanodeId {
        &self.node
    }

    /// True once the stream delivered at least one chunk.
    pub(crate) fn progressed(&self) -> bool {
        self.shared.lock().progressed
    }

    /// Bytes received and not yet read.
    pub(crate) fn buffered(&self) -> usize {
        self.shared.lock().buf.held()
    }

    /// Copies buffered bytes at block offset `pos` into `out` and releases them; 0 when `pos`
    /// is not buffered.
    pub(crate) fn try_copy(&self, pos: u64, out: &mut [u8]) -> usize {
        let mut st = self.shared.lock();
        let n = st.buf.copy_at(pos, out);
        if n > 0 {
            st.buf.release_before(pos + n as u64);
            drop(st);
            self.shared.space.notify_one();
        }
        n
    }

    /// Takes buffered bytes at block offset `pos` (to the end of the piece holding it, at
    /// most `max`) without copying, and releases them; `None` when `pos` is not buffered.
    pub(crate) fn try_take(&self, pos: u64, max: usize) -> Option<Bytes> {
        let mut st = self.shared.lock();
        let b = st.buf.slice_at(pos, max)?;
        st.buf.release_before(pos + b.len() as u64);
        drop(st);
        self.shared.space.notify_one();
        Some(b)
    }

    /// Waits until `pos` is buffered, or says why it will not be. A position a little past
    /// the buffered range (less than a piece) is waited for, the bytes before it skipped; a
    /// position before the buffer or further ahead asks for a new stream.
    pub(crate) async fn wait_for(&self, pos: u64) -> Wait {
        loop {
            let notified = self.shared.data.notified();
            {
                let mut st = self.shared.lock();
                if st.buf.contains(pos) {
                    return Wait::Ready;
                }
                if pos < st.buf.start() || pos > st.buf.end() + self.piece {
                    return Wait::Restart;
                }
                match &st.end {
                    Some(Err(e)) => return Wait::Failed(e.clone()),
                    Some(Ok(end)) => return Wait::Short { end: *end },
                    None => {
                        if pos > st.buf.start() {
                            st.buf.release_before(pos);
                            self.shared.space.notify_one();
                        }
                    }
                }
            }
            notified.await;
        }
    }
}

/// The fetcher task: runs the request and records how it ended.
async fn fetch(
    shared: Arc<Shared>,
    node: DatanodeId,
    (block, token): (ExtendedBlock, Option<BlockToken>),
    range: (u64, u64),
    params: StreamParams,
    counters: Arc<ReadCounters>,
) {
    let r = fetch_inner(&shared, &node, (block, token), range, params, &counters).await;
    if let Err(e) = &r {
        debug!(error = %e, "stream failed");
    }
    shared.lock().end = Some(r);
    shared.data.notify_one();
}

async fn fetch_inner(
    shared: &Shared,
    node: &DatanodeId,
    (block, token): (ExtendedBlock, Option<BlockToken>),
    (offset, length): (u64, u64),
    params: StreamParams,
    counters: &ReadCounters,
) -> Result<u64, ClientError> {
    let mut conn = DnConnection::connect(node, params.settings).await?;
    counters.request();
    let op = ReadBlockOp {
        block,
        offset,
        length,
        piece_size: params.piece_size,
    };
    conn.send_op(Op::ReadBlock(op), token.as_ref()).await?;
    let resp = conn.recv_read_response(block).await?;
    if let Some(r) = resp.replica {
        debug!(visible = r.block.num_bytes, "stream started");
    }
    let room = (params.piece_size as usize).min(params.buffer_bytes).max(1);
    let mut next: Option<u64> = None;
    loop {
        wait_for_room(shared, room).await;
        let frame = conn.recv("a read chunk").await?;
        match frame.header {
            Message::Chunk(h) => {
                let data = chunk_data(&h, frame.payload, block, conn.node(), params.verify)?;
                counters.received(data.len());
                check_order(&h, next, offset, conn.node())?;
                next = Some(h.offset + data.len() as u64);
                let pushed = {
                    let mut st = shared.lock();
                    st.progressed = true;
                    st.buf.push(h.offset, data)
                };
                if let Err(gap) = pushed {
                    let reason =
                        format!("chunk at {} after data ending at {}", gap.got, gap.expected);
                    return Err(ClientError::protocol(conn.node(), reason));
                }
                shared.data.notify_one();
            }
            Message::ReadEnd(end) if end.status.is_success() => return Ok(next.unwrap_or(offset)),
            Message::ReadEnd(end) => {
                return Err(status_error(
                    conn.node(),
                    block.id,
                    end.status,
                    &end.message,
                ))
            }
            other => {
                let reason = format!("expected a Chunk or ReadEnd, got {}", message_name(&other));
                return Err(ClientError::protocol(conn.node(), reason));
            }
        }
    }
}

/// Chunks must follow each other; the first one starts at the checksum chunk holding `offset`.
fn check_order(
    h: &sluice_common::proto::ChunkHeader,
    next: Option<u64>,
    offset: u64,
    node: &str,
) -> Result<(), ClientError> {
    let ok = match next {
        Some(n) => h.offset == n,
        None => h.offset <= offset && offset - h.offset < u64::from(h.bytes_per_checksum),
    };
    if ok {
        return Ok(());
    }
    let expected = next.map_or(format!("the chunk holding {offset}"), |n| n.to_string());
    Err(ClientError::protocol(
        node,
        format!("chunk at offset {}, expected {expected}", h.offset),
    ))
}

async fn wait_for_room(shared: &Shared, room: usize) {
    loop {
        let notified = shared.space.notified();
        if shared.lock().buf.free() >= room {
            return;
        }
        notified.await;
    }
}
