//! Framed data-transfer connections: split halves with the frame codec, and small helpers to
//! send a message and to receive one within a timeout.

use crate::error::{DatanodeError, Result};
use bytes::Bytes;
use sluice_common::frame::{Frame, FrameCodec};
use sluice_common::framed::{self, TimedError};
use sluice_common::memory::FileMap;
use sluice_common::proto::{Message, OpResponse};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, Interest};
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

/// Writes one frame whose payload is `head` followed by `len` bytes of `file` at `offset`,
/// within `timeout`: the header and `head` with one write, the file's bytes with `sendfile`
/// from the page cache to the socket, never through a buffer of ours (HDFS `BlockSender`'s
/// `transferTo`). Only for a range the caller found cached: `sendfile` reads the file
/// synchronously. A file shorter than the range fails the write (the frame is then
/// incomplete and the connection must close, which every caller's error path does).
pub async fn write_from_file(
    w: &mut FrameWriter,
    msg: &Message,
    head: &[u8],
    (file, offset, len): (&File, u64, usize),
    timeout: Duration,
) -> Result<()> {
    let send = |sock, at: u64, left| {
        let mut pos = offset + at;
        crate::sys::sendfile(sock, file, &mut pos, left)
    };
    write_frame_tail(w, msg, head, len, send, timeout).await
}

/// As [`write_from_file`], the file's bytes sent with `send(2)` from a mapping of the block
/// file ([`FileMap`]): one copy, into the socket, and none into a buffer of ours first.
pub async fn write_from_map(
    w: &mut FrameWriter,
    msg: &Message,
    head: &[u8],
    (map, offset, len): (&FileMap, u64, usize),
    timeout: Duration,
) -> Result<()> {
    let send = |sock, at: u64, left| {
        map.send(sock, offset + at, left).map_err(|e| {
            if e.raw_os_error() == Some(libc::EFAULT) {
                std::io::Error::other(format!(
                    "the block file no longer holds bytes {}..{} (truncated while they were \
                     sent)",
                    offset + at,
                    offset + len as u64
                ))
            } else {
                e
            }
        })
    };
    write_frame_tail(w, msg, head, len, send, timeout).await
}

/// Writes one frame whose payload is `head` and then `len` bytes that `send(socket, at,
/// left)` puts on the socket itself (`at` bytes of them sent so far; it returns how many it
/// sent, `WouldBlock` when the socket is full, 0 if the source ended early), within `timeout`.
async fn write_frame_tail(
    w: &mut FrameWriter,
    msg: &Message,
    head: &[u8],
    len: usize,
    mut send: impl FnMut(std::os::unix::io::RawFd, u64, usize) -> std::io::Result<usize>,
    timeout: Duration,
) -> Result<()> {
    let prefix =
        sluice_common::frame::encode_prefix(msg, head.len() + len, w.encoder().max_frame())
            .map_err(DatanodeError::from)?;
    let write = async {
        futures::SinkExt::<Frame<Message>>::flush(w)
            .await
            .map_err(|e| match e {
                sluice_common::FrameError::Io(e) => e,
                other => std::io::Error::other(other),
            })?;
        let mut buf = bytes::Buf::chain(prefix.as_slice(), head);
        w.get_mut().write_all_buf(&mut buf).await?;
        let sock: &TcpStream = w.get_ref().as_ref();
        let (mut at, end) = (0u64, len as u64);
        while at < end {
            sock.writable().await?;
            let left = (end - at) as usize;
            match sock.try_io(Interest::WRITABLE, || send(sock.as_raw_fd(), at, left)) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!(
                            "the block file ended {at} bytes into a {len}-byte piece, \
                             while sending it"
                        ),
                    ))
                }
                Ok(n) => at += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, write).await {
        Ok(r) => r.map_err(|e| DatanodeError::from(sluice_common::FrameError::Io(e))),
        Err(_) => Err(DatanodeError::Timeout {
            what: "the peer to take a frame",
            secs: timeout.as_secs_f64(),
        }),
    }
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
