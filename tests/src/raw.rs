//! A raw data-transfer client for tests: talks frames to one DataNode directly, to check a
//! specific replica or to send it malformed input.

use anyhow::{bail, Context};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use sluice_common::checksum;
use sluice_common::frame::{Frame, FrameCodec};
use sluice_common::proto::{
    Message, Op, OpResponse, ReadBlockOp, ReplicaInfo, ReplicaInfoOp, PROTOCOL_VERSION,
};
use sluice_common::token::BlockToken;
use sluice_common::{DatanodeId, ExtendedBlock, NodeId, Status};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

/// A framed connection to one DataNode.
pub struct RawConn {
    framed: Framed<TcpStream, FrameCodec<Message>>,
    token: Option<BlockToken>,
}

impl RawConn {
    /// Connects to `addr` (`host:port`).
    pub async fn connect(addr: &str) -> anyhow::Result<RawConn> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        Ok(RawConn {
            framed: Framed::new(stream, FrameCodec::default()),
            token: None,
        })
    }

    /// Puts `token` (from the block's located block) on every op sent from now on.
    pub fn with_token(mut self, token: Option<BlockToken>) -> RawConn {
        self.token = token;
        self
    }

    /// Sends an op.
    pub async fn send_op(&mut self, op: Op) -> anyhow::Result<()> {
        self.framed
            .send(Frame::new(Message::Op {
                version: PROTOCOL_VERSION,
                op,
                token: self.token.clone(),
            }))
            .await?;
        Ok(())
    }

    /// Sends one frame: `header` and its `payload`.
    pub async fn send_frame(&mut self, header: Message, payload: Bytes) -> anyhow::Result<()> {
        self.framed
            .send(Frame::with_payload(header, payload))
            .await?;
        Ok(())
    }

    /// The next frame, or `None` at end of stream.
    pub async fn next(&mut self) -> anyhow::Result<Option<Frame<Message>>> {
        match self.framed.next().await {
            None => Ok(None),
            Some(r) => Ok(Some(r?)),
        }
    }

    /// The next frame, which must be an `OpResponse`.
    pub async fn op_response(&mut self) -> anyhow::Result<OpResponse> {
        match self.next().await? {
            Some(Frame {
                header: Message::OpResponse(r),
                ..
            }) => Ok(r),
            other => bail!("expected an OpResponse, got {other:?}"),
        }
    }

    /// The underlying socket, to write raw bytes.
    pub fn socket(&mut self) -> &mut TcpStream {
        self.framed.get_mut()
    }

    /// Asks for the replica's state and visible length.
    pub async fn replica_info(&mut self, block: ExtendedBlock) -> anyhow::Result<OpResponse> {
        self.send_op(Op::ReplicaInfo(ReplicaInfoOp { block }))
            .await?;
        self.op_response().await
    }

    /// Streams the whole visible replica with `ReadBlock`, verifying every chunk's CRC32C
    /// against the checksums the DataNode stored. Returns the bytes and the replica info.
    pub async fn read_replica(
        &mut self,
        block: ExtendedBlock,
    ) -> anyhow::Result<(Vec<u8>, ReplicaInfo)> {
        self.send_op(Op::ReadBlock(ReadBlockOp {
            block,
            offset: 0,
            length: u64::MAX,
            piece_size: 0,
        }))
        .await?;
        let resp = self.op_response().await?;
        anyhow::ensure!(resp.status == Status::Success, "ReadBlock failed: {resp:?}");
        let info = resp
            .replica
            .context("ReadBlock answer without replica info")?;
        let mut out = Vec::new();
        loop {
            let frame = self.next().await?.context("stream ended before ReadEnd")?;
            match frame.header {
                Message::Chunk(h) => {
                    anyhow::ensure!(
                        (h.block, h.gen_stamp) == (block.id, info.block.gen_stamp),
                        "chunk names {} stamp {}, the answer {}",
                        h.block,
                        h.gen_stamp,
                        info.block
                    );
                    anyhow::ensure!(
                        h.offset == out.len() as u64,
                        "chunk at {} expected {}",
                        h.offset,
                        out.len()
                    );
                    let sums_len =
                        checksum::checksum_len(h.data_len as usize, h.bytes_per_checksum);
                    let payload: Bytes = frame.payload;
                    anyhow::ensure!(
                        payload.len() == sums_len + h.data_len as usize,
                        "payload length"
                    );
                    let (sums, data) = payload.split_at(sums_len);
                    checksum::verify(data, sums, h.bytes_per_checksum, h.offset)?;
                    out.extend_from_slice(data);
                }
                Message::ReadEnd(end) => {
                    anyhow::ensure!(end.status == Status::Success, "ReadEnd: {end:?}");
                    return Ok((out, info));
                }
                other => bail!("unexpected frame {other:?}"),
            }
        }
    }
}

/// A listener on `127.0.0.1` posing as a DataNode named `name` (an address an attacker names
/// in an op's targets): the listener, and the descriptor to put in the op.
pub async fn trap(name: &str) -> anyhow::Result<(tokio::net::TcpListener, DatanodeId)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let id = DatanodeId {
        node_id: NodeId(name.into()),
        data_addr: listener.local_addr()?.to_string(),
        http_addr: String::new(),
        rack: "/default-rack".into(),
    };
    Ok((listener, id))
}

/// True when something connected to `trap` within `wait`.
pub async fn dialled(trap: &tokio::net::TcpListener, wait: std::time::Duration) -> bool {
    tokio::time::timeout(wait, trap.accept()).await.is_ok()
}
