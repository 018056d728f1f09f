//! A data-transfer connection to one DataNode: framed TCP with the socket timeout applied to
//! every connect, send and receive, and errors that name the DataNode.

use crate::error::ClientError;
use bytes::Bytes;
use sluice_common::checksum;
use sluice_common::frame::{Frame, FrameCodec};
use sluice_common::framed::{self, TimedError};
use sluice_common::proto::{ChunkHeader, Message, Op, OpResponse, PROTOCOL_VERSION};
use sluice_common::token::BlockToken;
use sluice_common::{BlockId, ChecksumError, DatanodeId, ExtendedBlock, GenerationStamp, Status};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, FramedRead, FramedWrite};

/// The frame stream read from a DataNode.
pub(crate) type FrameReader = FramedRead<OwnedReadHalf, FrameCodec<Message>>;
/// The frame sink written to a DataNode.
pub(crate) type FrameWriter = FramedWrite<OwnedWriteHalf, FrameCodec<Message>>;

/// How to talk to DataNodes: socket timeout and frame limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DnSettings {
    /// Timeout of every connect, send and receive.
    pub timeout: Duration,
    /// Largest frame accepted or sent.
    pub max_frame: usize,
}

/// One framed connection to a DataNode.
pub(crate) struct DnConnection {
    node: String,
    framed: Framed<TcpStream, FrameCodec<Message>>,
    timeout: Duration,
}

impl DnConnection {
    /// Connects to `dn`'s data address.
    pub(crate) async fn connect(
        dn: &DatanodeId,
        settings: DnSettings,
    ) -> Result<DnConnection, ClientError> {
        let node = dn.to_string();
        let stream = tokio::time::timeout(settings.timeout, TcpStream::connect(&dn.data_addr))
            .await
            .map_err(|_| ClientError::Timeout {
                node: node.clone(),
                what: "connect",
                after: settings.timeout,
            })?
            .map_err(|e| ClientError::dn_io(&node, "connect", e))?;
        stream
            .set_nodelay(true)
            .map_err(|e| ClientError::dn_io(&node, "set TCP_NODELAY", e))?;
        Ok(DnConnection {
            node,
            // Chunks of up to a frame from the DataNode: each read into one buffer reserved
            // whole, not grown (and copied) step by step.
            framed: Framed::new(
                stream,
                FrameCodec::new(settings.max_frame).reserving_whole_frames(),
            ),
            timeout: settings.timeout,
        })
    }

    /// The DataNode's display name (`id@addr`).
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// Sends one frame.
    pub(crate) async fn send(&mut self, frame: Frame<Message>) -> Result<(), ClientError> {
        send_frame(&mut self.framed, frame, &self.node, self.timeout).await
    }

    /// Sends an `Op` with this build's protocol version and the block access token for it.
    pub(crate) async fn send_op(
        &mut self,
        op: Op,
        token: Option<&BlockToken>,
    ) -> Result<(), ClientError> {
        self.send(Frame::new(Message::Op {
            version: PROTOCOL_VERSION,
            op,
            token: token.cloned(),
        }))
        .await
    }

    /// Receives one frame; `what` names it in errors.
    pub(crate) async fn recv(&mut self, what: &'static str) -> Result<Frame<Message>, ClientError> {
        recv_frame(&mut self.framed, &self.node, self.timeout, what).await
    }

    /// Receives an `OpResponse`, whatever its status.
    async fn recv_response(&mut self) -> Result<OpResponse, ClientError> {
        let frame = self.recv("the op response").await?;
        match frame.header {
            Message::OpResponse(r) => Ok(r),
            other => Err(ClientError::protocol(
                &self.node,
                format!("expected an OpResponse, got {}", message_name(&other)),
            )),
        }
    }

    /// Receives the `OpResponse` of an op on `block`; an error status becomes
    /// [`ClientError::Datanode`].
    pub(crate) async fn recv_op_response(
        &mut self,
        block: BlockId,
    ) -> Result<OpResponse, ClientError> {
        let resp = self.recv_response().await?;
        if !resp.status.is_success() {
            return Err(status_error(&self.node, block, resp.status, &resp.message));
        }
        Ok(resp)
    }

    /// Receives the `OpResponse` of a read (`ReadBlock`, `ReadChunk`) of `expected`: the
    /// replica it names must carry `expected`'s generation stamp. A refusal naming the
    /// replica's other stamp, or a success naming another stamp, is
    /// [`ClientError::GenStampMismatch`].
    pub(crate) async fn recv_read_response(
        &mut self,
        expected: ExtendedBlock,
    ) -> Result<OpResponse, ClientError> {
        let resp = self.recv_response().await?;
        match (resp.status, &resp.replica) {
            (Status::Success, Some(r)) => {
                check_source(&self.node, expected, r.block.id, r.block.gen_stamp)?
            }
            (Status::Success, None) => {}
            (Status::ErrorStaleGenStamp, Some(r)) if r.block.id == expected.id => {
                return Err(ClientError::GenStampMismatch {
                    node: self.node.clone(),
                    block: expected.id,
                    expected: expected.gen_stamp,
                    found: r.block.gen_stamp,
                    served: false,
                })
            }
            (status, _) => {
                return Err(status_error(&self.node, expected.id, status, &resp.message))
            }
        }
        Ok(resp)
    }

    /// Splits into independent read and write halves (for a write pipeline).
    pub(crate) fn split(self) -> (FrameReader, FrameWriter) {
        let parts = self.framed.into_parts();
        let codec = parts.codec;
        let (r, w) = parts.io.into_split();
        let mut reader = FramedRead::new(r, codec.clone());
        // Bytes already read past the last frame belong to the reader.
        *reader.read_buffer_mut() = parts.read_buf;
        (reader, FramedWrite::new(w, codec))
    }
}

/// Sends one frame within `timeout` ([`framed::send_within`]).
pub(crate) async fn send_frame<S>(
    sink: &mut S,
    frame: Frame<Message>,
    node: &str,
    timeout: Duration,
) -> Result<(), ClientError>
where
    S: futures::Sink<Frame<Message>, Error = sluice_common::FrameError> + Unpin,
{
    framed::send_within(sink, frame, timeout)
        .await
        .map_err(|e| timed_error(node, "sending a frame", "send", e))
}

/// Receives one frame within `timeout` ([`framed::recv_within`]); a close is an error.
pub(crate) async fn recv_frame<S>(
    stream: &mut S,
    node: &str,
    timeout: Duration,
    what: &'static str,
) -> Result<Frame<Message>, ClientError>
where
    S: futures::Stream<Item = Result<Frame<Message>, sluice_common::FrameError>> + Unpin,
{
    match framed::recv_within(stream, timeout).await {
        Ok(Some(f)) => Ok(f),
        Ok(None) => Err(ClientError::Closed {
            node: node.to_string(),
            what,
        }),
        Err(e) => Err(timed_error(node, what, "receive", e)),
    }
}

/// Maps a timed step's failure: a timeout names `what` was awaited, a codec error `op`.
fn timed_error(node: &str, what: &'static str, op: &'static str, e: TimedError) -> ClientError {
    match e {
        TimedError::Timeout(after) => ClientError::Timeout {
            node: node.to_string(),
            what,
            after,
        },
        TimedError::Frame(e) => frame_error(node, op, e),
    }
}

/// Maps a codec error, keeping socket errors as [`ClientError::DatanodeIo`].
pub(crate) fn frame_error(
    node: &str,
    what: &'static str,
    e: sluice_common::FrameError,
) -> ClientError {
    match e {
        sluice_common::FrameError::Io(io) => ClientError::dn_io(node, what, io),
        other => ClientError::Frame {
            node: node.to_string(),
            source: Arc::new(other),
        },
    }
}

/// The error for a non-success status from `node`.
pub(crate) fn status_error(node: &str, block: BlockId, status: Status, msg: &str) -> ClientError {
    ClientError::Datanode {
        node: node.to_string(),
        block,
        status,
        message: msg.to_string(),
    }
}

/// A short name of a message, for protocol errors.
pub(crate) fn message_name(m: &Message) -> &'static str {
    match m {
        Message::Op { .. } => "Op",
        Message::Packet(_) => "Packet",
        Message::OpResponse(_) => "OpResponse",
        Message::Ack(_) => "Ack",
        Message::Chunk(_) => "Chunk",
        Message::ReadEnd(_) => "ReadEnd",
    }
}

/// Checks that the replica an answer comes from is `expected`'s block under `expected`'s
/// generation stamp: another stamp is [`ClientError::GenStampMismatch`] (logged with the node,
/// the block and both stamps), another block a protocol error.
pub(crate) fn check_source(
    node: &str,
    expected: ExtendedBlock,
    block: BlockId,
    gen_stamp: GenerationStamp,
) -> Result<(), ClientError> {
    if block != expected.id {
        let reason = format!("answered a read of {} with {block}", expected.id);
        return Err(ClientError::protocol(node, reason));
    }
    if gen_stamp != expected.gen_stamp {
        tracing::warn!(
            node,
            block = %block,
            expected = %expected.gen_stamp,
            found = %gen_stamp,
            "DataNode answered a read with another generation stamp; refusing its replica"
        );
        return Err(ClientError::GenStampMismatch {
            node: node.to_string(),
            block,
            expected: expected.gen_stamp,
            found: gen_stamp,
            served: true,
        });
    }
    Ok(())
}

/// Splits a `Chunk` payload into its data, checking that it comes from `expected`'s replica
/// ([`check_source`]) and (when `verify`) every checksum. The data starts at `header.offset`
/// in the block; any length or checksum problem is a [`ClientError::Checksum`] naming the
/// block, the offset and the DataNode.
pub(crate) fn chunk_data(
    header: &ChunkHeader,
    payload: Bytes,
    expected: ExtendedBlock,
    node: &str,
    verify: bool,
) -> Result<Bytes, ClientError> {
    check_source(node, expected, header.block, header.gen_stamp)?;
    let block = expected.id;
    let bpc = header.bytes_per_checksum;
    if bpc == 0 {
        return Err(ClientError::protocol(
            node,
            "chunk with bytes_per_checksum 0",
        ));
    }
    if !header.offset.is_multiple_of(u64::from(bpc)) {
        return Err(ClientError::protocol(
            node,
            format!("chunk offset {} is not a multiple of {bpc}", header.offset),
        ));
    }
    let data_len = header.data_len as usize;
    let sums_len = checksum::checksum_len(data_len, bpc);
    let checksum_err = |source| ClientError::Checksum {
        block,
        offset: header.offset,
        node: node.to_string(),
        source,
    };
    if payload.len() != sums_len + data_len {
        return Err(checksum_err(ChecksumError::Length {
            offset: header.offset,
            expected: sums_len,
            actual: payload.len().saturating_sub(data_len),
        }));
    }
    let data = payload.slice(sums_len..);
    if verify {
        checksum::verify(&data, &payload[..sums_len], bpc, header.offset).map_err(|e| {
            let offset = match &e {
                ChecksumError::Mismatch { offset, .. } | ChecksumError::Length { offset, .. } => {
                    *offset
                }
            };
            ClientError::Checksum {
                block,
                offset,
                node: node.to_string(),
                source: e,
            }
        })?;
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_payload_checks_name_block_offset_and_node() {
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut payload = checksum::compute(&data, 512);
        payload.extend_from_slice(&data);
        let b3 = ExtendedBlock::new(BlockId(3), GenerationStamp(7), 0);
        let header = ChunkHeader {
            block: BlockId(3),
            gen_stamp: GenerationStamp(7),
            offset: 1024,
            data_len: 1000,
            bytes_per_checksum: 512,
        };
        let got = chunk_data(&header, Bytes::from(payload.clone()), b3, "dn", true).unwrap();
        assert_eq!(&got[..], &data[..]);
        let mut bad = payload.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        match chunk_data(&header, Bytes::from(bad), b3, "dnX", true) {
            Err(ClientError::Checksum {
                block,
                offset,
                node,
                ..
            }) => {
                assert_eq!((block, offset, node.as_str()), (BlockId(3), 1536, "dnX"));
            }
            other => panic!("{other:?}"),
        }
        let short = Bytes::from(payload[..payload.len() - 10].to_vec());
        assert!(matches!(
            chunk_data(&header, short, b3, "dn", false),
            Err(ClientError::Checksum { .. })
        ));
    }

    #[test]
    fn a_chunk_from_a_replica_with_another_stamp_or_block_is_refused() {
        let data = vec![7u8; 512];
        let mut payload = checksum::compute(&data, 512);
        payload.extend_from_slice(&data);
        let payload = Bytes::from(payload);
        let expected = ExtendedBlock::new(BlockId(3), GenerationStamp(7), 0);
        let mut header = ChunkHeader {
            block: BlockId(3),
            gen_stamp: GenerationStamp(8),
            offset: 0,
            data_len: 512,
            bytes_per_checksum: 512,
        };
        match chunk_data(&header, payload.clone(), expected, "dnY", true) {
            Err(ClientError::GenStampMismatch {
                node,
                block,
                expected,
                found,
                served,
            }) => {
                assert_eq!(node, "dnY");
                assert_eq!(block, BlockId(3));
                assert_eq!((expected, found), (GenerationStamp(7), GenerationStamp(8)));
                assert!(served);
            }
            other => panic!("{other:?}"),
        }
        header.gen_stamp = GenerationStamp(7);
        header.block = BlockId(4);
        assert!(matches!(
            chunk_data(&header, payload.clone(), expected, "dn", true),
            Err(ClientError::Protocol { .. })
        ));
        header.block = BlockId(3);
        assert!(chunk_data(&header, payload, expected, "dn", true).is_ok());
    }
}
