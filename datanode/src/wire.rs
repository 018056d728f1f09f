//! Framed data-transfer connections: split halves with the frame codec, and small helpers to
//! send a message and to receive one within a timeout.

use crate::error::{DatanodeError, Result};
use bytes::Bytes;
use sluice_common::frame::{Frame, FrameCodec};
use sluice_common::framed::{self, TimedError};
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

/// Sends one message with a payload, within `timeout` ([`framed::send_within`]).
pub async fn send(
    w: &mut FrameWriter,
    msg: Message,
    payload: Bytes,
    timeout: Duration,
) -> Result<()> {
    framed::send_within(w, Frame::with_payload(msg, payload), timeout)
        .await
        .map_err(|e| timed_error(e, "the peer to take a frame"))
}

/// Writes one frame straight from a borrowed `payload` within `timeout`
/// ([`framed::write_within`]: no copy into the codec's buffer).
pub async fn write_direct(
    w: &mut FrameWriter,
    msg: &Message,
    payload: &[u8],
    timeout: Duration,
) -> Result<()> {
    framed::write_within(w, msg, payload, timeout)
        .await
        .map_err(|e| timed_error(e, "the peer to take a frame"))
}

/// A timed step's failure as a [`DatanodeError`]: a timeout names what was awaited.
fn timed_error(e: TimedError, what: &'static str) -> DatanodeError {
    match e {
        TimedError::Timeout(after) => DatanodeError::Timeout {
            what,
            secs: after.as_secs_f64(),
        },
        TimedError::Frame(e) => DatanodeError::from(e),
    }
}

/// Sends an `OpResponse`.
pub async fn respond(w: &mut FrameWriter, resp: OpResponse, timeout: Duration) -> Result<()> {
    send(w, Message::OpResponse(resp), Bytes::new(), timeout).await
}

/// Receives one frame within `timeout` ([`framed::recv_within`]): `Ok(None)` when the peer
/// closed cleanly between frames.
pub async fn recv(
    r: &mut FrameReader,
    timeout: Duration,
    what: &'static str,
) -> Result<Option<Frame<Message>>> {
    framed::recv_within(r, timeout)
        .await
        .map_err(|e| timed_error(e, what))
}

/// An `OpResponse` describing `err`.
pub fn error_response(err: &DatanodeError) -> OpResponse {
    OpResponse::error(err.status(), err.to_string())
}
