//! Framed data-transfer connections: split halves with the frame codec, and small helpers to
//! send a message and to receive one within a timeout.

use crate::error::{DatanodeError, Result};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use sluice_common::frame::{Frame, FrameCodec};
use sluice_common::proto::{Message, OpResponse};
use std::time::Duration;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::{FramedRead, FramedWrite};

/// The reading half of a data-transfer connection.
pub type FrameReader = FramedRead<OwnedReadHalf, FrameCodec<Message>>;
/// The writing half of a data-transfer connection.
pub type FrameWriter = FramedWrite<OwnedWriteHalf, FrameCodec<Message>>;

/// Splits a connection into framed halves.
pub fn split(stream: TcpStream, codec: FrameCodec<Message>) -> (FrameReader, FrameWriter) {
    let (r, w) = stream.into_split();
    (
        FramedRead::new(r, codec.clone()),
        FramedWrite::new(w, codec),
    )
}

/// Sends one message with a payload, within `timeout`.
pub async fn send(
    w: &mut FrameWriter,
    msg: Message,
    payload: Bytes,
    timeout: Duration,
) -> Result<()> {
    match tokio::time::timeout(timeout, w.send(Frame::with_payload(msg, payload))).await {
        Ok(r) => r.map_err(DatanodeError::from),
        Err(_) => Err(DatanodeError::Timeout {
            what: "the peer to take a frame",
            secs: timeout.as_secs_f64(),
        }),
    }
}

/// Sends an `OpResponse`.
pub async fn respond(w: &mut FrameWriter, resp: OpResponse, timeout: Duration) -> Result<()> {
    send(w, Message::OpResponse(resp), Bytes::new(), timeout).await
}

/// Receives one frame within `timeout`: `Ok(None)` when the peer closed cleanly between frames.
pub async fn recv(
    r: &mut FrameReader,
    timeout: Duration,
    what: &'static str,
) -> Result<Option<Frame<Message>>> {
    match tokio::time::timeout(timeout, r.next()).await {
        Ok(None) => Ok(None),
        Ok(Some(res)) => res.map(Some).map_err(DatanodeError::from),
        Err(_) => Err(DatanodeError::Timeout {
            what,
            secs: timeout.as_secs_f64(),
        }),
    }
}

/// An `OpResponse` describing `err`.
pub fn error_response(err: &DatanodeError) -> OpResponse {
    OpResponse::error(err.status(), err.to_string())
}
