//! Chunk mode (the classic read): one `ReadChunk` request per chunk on a kept-open connection,
//! each answered by one `Chunk` frame before the next request is sent.

use crate::connection::{chunk_data, message_name, DnConnection, DnSettings};
use crate::error::ClientError;
use bytes::Bytes;
use sluice_common::proto::{Message, Op, ReadChunkOp};
use sluice_common::token::BlockToken;
use sluice_common::{DatanodeId, ExtendedBlock};

/// A connection serving `ReadChunk` requests for one block.
pub(crate) struct ChunkReader {
    conn: DnConnection,
    node: DatanodeId,
    block: ExtendedBlock,
    token: Option<BlockToken>,
    served: u64,
}

/// One chunk's answer.
#[derive(Debug)]
pub(crate) struct ChunkData {
    /// Block offset of `data[0]` (the checksum chunk holding the offset asked for).
    pub start: u64,
    /// The bytes.
    pub data: Bytes,
}

impl ChunkReader {
    /// Connects to `node` for reading `block`.
    pub(crate) async fn connect(
        node: &DatanodeId,
        block: ExtendedBlock,
        token: Option<BlockToken>,
        settings: DnSettings,
    ) -> Result<ChunkReader, ClientError> {
        Ok(ChunkReader {
            conn: DnConnection::connect(node, settings).await?,
            node: node.clone(),
            block,
            token,
            served: 0,
        })
    }

    /// The DataNode.
    pub(crate) fn node(&self) -> &DatanodeId {
        &self.node
    }

    /// Chunks this connection has served.
    pub(crate) fn served(&self) -> u64 {
        self.served
    }

    /// Reads `[offset, offset + length)` (the DataNode clamps it to its visible length).
    pub(crate) async fn read(
        &mut self,
        offset: u64,
        length: u64,
        verify: bool,
    ) -> Result<ChunkData, ClientError> {
        let op = ReadChunkOp {
            block: self.block,
            offset,
            length,
        };
        self.conn
            .send_op(Op::ReadChunk(op), self.token.as_ref())
            .await?;
        self.conn.recv_read_response(self.block).await?;
        let frame = self.conn.recv("a read chunk").await?;
        let Message::Chunk(h) = frame.header else {
            let reason = format!("expected a Chunk, got {}", message_name(&frame.header));
            return Err(ClientError::protocol(self.conn.node(), reason));
        };
        let data = chunk_data(&h, frame.payload, self.block, self.conn.node(), verify)?;
        let bpc = u64::from(h.bytes_per_checksum);
        if h.offset > offset || offset - h.offset >= bpc {
            let reason = format!("chunk at {} does not hold offset {offset}", h.offset);
            return Err(ClientError::protocol(self.conn.node(), reason));
        }
        self.served += 1;
        Ok(ChunkData {
            start: h.offset,
            data,
        })
    }
}
