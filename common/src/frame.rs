//! The data-transfer frame codec.
//!
//! Every message on a data-transfer connection is one frame:
//!
//! ```text
//!  0               4               8
//! +---------------+---------------+---------------------+------------------------+
//! | frame_len u32 | header_len u32| header (bincode 2)  | payload (raw bytes)    |
//! +---------------+---------------+---------------------+------------------------+
//!   big-endian      big-endian      header_len bytes      frame_len - 4 - header_len
//! ```
//!
//! `frame_len` counts every byte after itself. A frame whose `frame_len` exceeds the
//! configured maximum is refused before any of it is buffered. The header is a
//! [`crate::proto::Message`] encoded with bincode 2 (standard configuration, 1 MiB limit); block
//! data always travels in the payload, never inside the header.

use crate::error::FrameError;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{de::DeserializeOwned, Serialize};
use std::marker::PhantomData;
use tokio_util::codec::{Decoder, Encoder};

/// Bytes before the header: `frame_len` and `header_len`.
pub const PREFIX_LEN: usize = 8;

/// Default maximum frame size (16 MiB): a 4 MiB classic read chunk plus its checksums fits
/// with room to spare.
pub const DEFAULT_MAX_FRAME: usize = 16 * 1024 * 1024;

/// Most the decoder grows its buffer by ahead of the bytes that arrived.
pub const GROW_STEP: usize = 64 * 1024;

/// Largest header accepted, whatever the frame size.
pub const MAX_HEADER_LEN: usize = 1024 * 1024;

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_HEADER_LEN>()
}

/// Encodes a header on its own (also used to size frames).
pub fn encode_header<M: Serialize>(header: &M) -> Result<Vec<u8>, FrameError> {
    bincode::serde::encode_to_vec(header, bincode_config())
        .map_err(|e| FrameError::Encode(e.to_string()))
}

/// Decodes a header; every byte of `bytes` must belong to it.
pub fn decode_header<M: DeserializeOwned>(bytes: &[u8]) -> Result<M, FrameError> {
    let (m, used) = bincode::serde::decode_from_slice(bytes, bincode_config())
        .map_err(|e| FrameError::BadHeader(e.to_string()))?;
    if used != bytes.len() {
        return Err(FrameError::BadHeader(format!(
            "{} trailing bytes after the header",
            bytes.len() - used
        )));
    }
    Ok(m)
}

/// One frame: a typed header and its raw payload (empty for most messages).
#[derive(Debug, Clone, PartialEq)]
pub struct Frame<M> {
    /// The message.
    pub header: M,
    /// Raw bytes following the header (checksums and data for packets and chunks).
    pub payload: Bytes,
}

impl<M> Frame<M> {
    /// A frame with no payload.
    pub fn new(header: M) -> Self {
        Self {
            header,
            payload: Bytes::new(),
        }
    }

    /// A frame with a payload.
    pub fn with_payload(header: M, payload: Bytes) -> Self {
        Self { header, payload }
    }
}

/// Reads and writes [`Frame`]s of message type `M`, enforcing a maximum frame size.
#[derive(Debug)]
pub struct FrameCodec<M> {
    max_frame: usize,
    /// Reserve a frame's whole announced length at once ([`FrameCodec::reserving_whole_frames`]).
    reserve_whole: bool,
    _m: PhantomData<fn() -> M>,
}

impl<M> Clone for FrameCodec<M> {
    fn clone(&self) -> Self {
        Self {
            max_frame: self.max_frame,
            reserve_whole: self.reserve_whole,
            _m: PhantomData,
        }
    }
}

impl<M> FrameCodec<M> {
    /// A codec refusing frames larger than `max_frame` bytes (counted after `frame_len`).
    pub fn new(max_frame: usize) -> Self {
        Self {
            max_frame,
            reserve_whole: false,
            _m: PhantomData,
        }
    }

    /// A codec that, once a frame's length prefix has arrived, reserves room for the whole
    /// frame (at most `max_frame`) at once, so that a large frame is read into one buffer
    /// without the growth steps — each a reallocation copying what had arrived. For a client
    /// reading from a DataNode it authenticated by a token it holds: a server keeps the
    /// default, growing with the bytes that arrive, so that a prefix alone costs nothing.
    pub fn reserving_whole_frames(mut self) -> Self {
        self.reserve_whole = true;
        self
    }

    /// The configured maximum.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }
}

impl<M> Default for FrameCodec<M> {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FRAME)
    }
}

impl<M: DeserializeOwned> Decoder for FrameCodec<M> {
    type Item = Frame<M>;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame<M>>, FrameError> {
        if src.len() < 4 {
            return Ok(None);
        }
        let frame_len = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
        if frame_len > self.max_frame {
            return Err(FrameError::TooLarge {
                len: frame_len as u64,
                max: self.max_frame as u64,
            });
        }
        if frame_len < 4 {
            return Err(FrameError::BadHeaderLength {
                header_len: 0,
                frame_len: frame_len as u64,
            });
        }
        if src.len() < 4 + frame_len {
            // Grow with the bytes that arrive, never by what a peer merely announces: a
            // 4-byte prefix claiming 16 MiB must not cost 16 MiB.
            let missing = 4 + frame_len - src.len();
            src.reserve(if self.reserve_whole {
                missing
            } else {
                missing.min(GROW_STEP)
            });
            return Ok(None);
        }
        let header_len = u32::from_be_bytes([src[4], src[5], src[6], src[7]]) as usize;
        if header_len > frame_len - 4 || header_len > MAX_HEADER_LEN {
            return Err(FrameError::BadHeaderLength {
                header_len: header_len as u64,
                frame_len: frame_len as u64,
            });
        }
        src.advance(PREFIX_LEN);
        let header_bytes = src.split_to(header_len);
        let payload = src.split_to(frame_len - 4 - header_len).freeze();
        let header = decode_header(&header_bytes)?;
        Ok(Some(Frame { header, payload }))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame<M>>, FrameError> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(FrameError::Truncated {
                buffered: src.len(),
            }),
        }
    }
}

/// The bytes of a frame before its payload — `frame_len`, `header_len` and the encoded header —
/// for a payload of `payload_len` bytes; refused when the frame would exceed `max_frame`.
pub fn encode_prefix<M: Serialize>(
    header: &M,
    payload_len: usize,
    max_frame: usize,
) -> Result<Vec<u8>, FrameError> {
    let header = encode_header(header)?;
    let frame_len = 4 + header.len() + payload_len;
    if frame_len > max_frame {
        return Err(FrameError::TooLarge {
            len: frame_len as u64,
            max: max_frame as u64,
        });
    }
    let mut head = Vec::with_capacity(PREFIX_LEN + header.len());
    head.put_u32(frame_len as u32);
    head.put_u32(header.len() as u32);
    head.put_slice(&header);
    Ok(head)
}

impl<M: Serialize> Encoder<Frame<M>> for FrameCodec<M> {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame<M>, dst: &mut BytesMut) -> Result<(), FrameError> {
        let head = encode_prefix(&frame.header, frame.payload.len(), self.max_frame)?;
        dst.reserve(head.len() + frame.payload.len());
        dst.put_slice(&head);
        dst.put_slice(&frame.payload);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    enum Msg {
        Ping { n: u64 },
        Data { offset: u64, len: u32 },
    }

    #[test]
    fn an_announced_length_reserves_nothing_until_the_bytes_arrive() {
        let mut codec = FrameCodec::<Msg>::new(DEFAULT_MAX_FRAME);
        let mut src = BytesMut::new();
        src.extend_from_slice(&(DEFAULT_MAX_FRAME as u32).to_be_bytes());
        src.extend_from_slice(&[0, 0, 0, 4]);
        assert!(codec.decode(&mut src).unwrap().is_none());
        assert!(
            src.capacity() <= 2 * GROW_STEP,
            "capacity {}",
            src.capacity()
        );
        // A whole large frame still decodes as it arrives piece by piece.
        let f = Frame::with_payload(Msg::Ping { n: 1 }, Bytes::from(vec![7u8; 3 << 20]));
        let all = encode(f.clone(), DEFAULT_MAX_FRAME);
        let mut src = BytesMut::new();
        let mut got = None;
        for piece in all.chunks(100_000) {
            src.extend_from_slice(piece);
            if let Some(d) = codec.decode(&mut src).unwrap() {
                got = Some(d);
            }
        }
        assert_eq!(got, Some(f));
    }

    #[test]
    fn a_codec_reserving_whole_frames_reads_a_frame_into_one_allocation() {
        let codec = FrameCodec::<Msg>::new(DEFAULT_MAX_FRAME).reserving_whole_frames();
        let mut codec = codec.clone(); // the setting survives a clone (split connections)
        let f = Frame::with_payload(Msg::Ping { n: 2 }, Bytes::from(vec![9u8; 1 << 20]));
        let all = encode(f.clone(), DEFAULT_MAX_FRAME);
        let mut src = BytesMut::new();
        src.extend_from_slice(&all[..8]);
        assert!(codec.decode(&mut src).unwrap().is_none());
        assert!(src.capacity() >= all.len(), "capacity {}", src.capacity());
        let at = src.as_ptr();
        let mut got = None;
        for piece in all[8..].chunks(100_000) {
            src.extend_from_slice(piece);
            if let Some(d) = codec.decode(&mut src).unwrap() {
                got = Some(d);
            }
        }
        let got = got.expect("a frame");
        assert_eq!(got, f);
        assert_eq!(
            got.payload.as_ptr(),
            at.wrapping_add(all.len() - (1 << 20)),
            "the payload is where the frame was first reserved: no reallocation"
        );
        // The bound still holds: a prefix past max_frame is refused, not reserved.
        let mut src = BytesMut::new();
        src.extend_from_slice(&(DEFAULT_MAX_FRAME as u32 + 1).to_be_bytes());
        assert!(codec.decode(&mut src).is_err());
    }

    fn encode(frame: Frame<Msg>, max: usize) -> BytesMut {
        let mut buf = BytesMut::new();
        FrameCodec::<Msg>::new(max)
            .encode(frame, &mut buf)
            .expect("encode");
        buf
    }

    #[test]
    fn round_trip_with_and_without_payload_even_byte_by_byte() {
        let mut wire = encode(Frame::new(Msg::Ping { n: 7 }), 1024);
        wire.extend_from_slice(&encode(
            Frame::with_payload(Msg::Data { offset: 9, len: 3 }, Bytes::from_static(b"abc")),
            1024,
        ));
        let mut codec = FrameCodec::<Msg>::new(1024);
        let mut src = BytesMut::new();
        let mut out = Vec::new();
        for b in wire.iter() {
            src.put_u8(*b);
            while let Some(f) = codec.decode(&mut src).expect("decode") {
                out.push(f);
            }
        }
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].header, Msg::Ping { n: 7 });
        assert!(out[0].payload.is_empty());
        assert_eq!(out[1].payload.as_ref(), b"abc");
    }

    #[test]
    fn oversized_frame_is_refused_before_buffering() {
        let mut src = BytesMut::from(&[0x7f, 0xff, 0xff, 0xff][..]);
        let err = FrameCodec::<Msg>::new(1024)
            .decode(&mut src)
            .expect_err("must fail");
        assert!(
            matches!(err, FrameError::TooLarge { max: 1024, .. }),
            "{err}"
        );
        let big = Frame::with_payload(Msg::Ping { n: 1 }, Bytes::from(vec![0u8; 2000]));
        let mut dst = BytesMut::new();
        assert!(FrameCodec::<Msg>::new(1024).encode(big, &mut dst).is_err());
    }

    #[test]
    fn garbage_header_is_a_typed_error() {
        let mut src = BytesMut::new();
        src.put_u32(4 + 3);
        src.put_u32(3);
        src.put_slice(&[0xff, 0xff, 0xff]);
        let err = FrameCodec::<Msg>::new(1024)
            .decode(&mut src)
            .expect_err("must fail");
        assert!(matches!(err, FrameError::BadHeader(_)), "{err}");
    }

    #[test]
    fn header_length_past_the_frame_is_refused() {
        let mut src = BytesMut::new();
        src.put_u32(8);
        src.put_u32(100);
        src.put_slice(&[0; 4]);
        let err = FrameCodec::<Msg>::new(1024)
            .decode(&mut src)
            .expect_err("must fail");
        assert!(matches!(err, FrameError::BadHeaderLength { .. }), "{err}");
    }

    #[test]
    fn truncated_frame_at_eof_is_an_error() {
        let wire = encode(Frame::new(Msg::Ping { n: 7 }), 1024);
        let mut src = BytesMut::from(&wire[..wire.len() - 1]);
        let err = FrameCodec::<Msg>::new(1024)
            .decode_eof(&mut src)
            .expect_err("must fail");
        assert!(matches!(err, FrameError::Truncated { .. }), "{err}");
    }
}
