//! Framed data-transfer connections with a time limit on every step: send one [`Frame`]
//! ([`send_within`]), receive one ([`recv_within`]), or write one straight from a borrowed
//! payload without copying it into the codec's buffer ([`write_within`], the DataNode's read
//! path). The client and the DataNode map [`TimedError`] onto their own error types.

use crate::error::FrameError;
use crate::frame::{encode_prefix, Frame, FrameCodec};
use bytes::Buf;
use futures::{Sink, SinkExt, Stream, StreamExt};
use serde::Serialize;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_util::codec::FramedWrite;

/// Why a timed frame step failed.
#[derive(Debug, thiserror::Error)]
pub enum TimedError {
    /// The peer did not take or send the frame within the limit.
    #[error("no progress within {0:?}")]
    Timeout(Duration),
    /// The codec or the socket failed.
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Sends one frame within `limit`.
pub async fn send_within<S, M>(
    sink: &mut S,
    frame: Frame<M>,
    limit: Duration,
) -> Result<(), TimedError>
where
    S: Sink<Frame<M>, Error = FrameError> + Unpin,
{
    match tokio::time::timeout(limit, sink.send(frame)).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(TimedError::Timeout(limit)),
    }
}

/// Receives one frame within `limit`; `Ok(None)` when the peer closed cleanly between frames.
pub async fn recv_within<S, M>(
    stream: &mut S,
    limit: Duration,
) -> Result<Option<Frame<M>>, TimedError>
where
    S: Stream<Item = Result<Frame<M>, FrameError>> + Unpin,
{
    match tokio::time::timeout(limit, stream.next()).await {
        Ok(None) => Ok(None),
        Ok(Some(r)) => Ok(Some(r?)),
        Err(_) => Err(TimedError::Timeout(limit)),
    }
}

/// Writes one frame of `header` and `payload` within `limit`, the prefix and header from
/// [`encode_prefix`] and the payload in the same vectored write, straight from `payload`:
/// the codec would first copy the whole payload into its write buffer. Anything the codec
/// still buffers goes first, so frames stay in order.
pub async fn write_within<W, M>(
    w: &mut FramedWrite<W, FrameCodec<M>>,
    header: &M,
    payload: &[u8],
    limit: Duration,
) -> Result<(), TimedError>
where
    W: AsyncWrite + Unpin,
    M: Serialize,
{
    let head = encode_prefix(header, payload.len(), w.encoder().max_frame())?;
    let write = async {
        w.flush().await?;
        let mut buf = head.as_slice().chain(payload);
        w.get_mut()
            .write_all_buf(&mut buf)
            .await
            .map_err(FrameError::Io)
    };
    match tokio::time::timeout(limit, write).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(TimedError::Timeout(limit)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use tokio_util::codec::FramedRead;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    enum Msg {
        Data { n: u32 },
    }

    #[tokio::test]
    async fn a_direct_write_reads_back_as_the_codec_frame_in_order() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let mut w = FramedWrite::new(a, FrameCodec::<Msg>::new(1 << 20));
        let mut r = FramedRead::new(b, FrameCodec::<Msg>::new(1 << 20));
        let t = Duration::from_secs(5);
        send_within(
            &mut w,
            Frame::with_payload(Msg::Data { n: 1 }, vec![1u8; 10].into()),
            t,
        )
        .await
        .unwrap();
        write_within(&mut w, &Msg::Data { n: 2 }, &[2u8; 300], t)
            .await
            .unwrap();
        let f1 = recv_within(&mut r, t).await.unwrap().unwrap();
        let f2 = recv_within(&mut r, t).await.unwrap().unwrap();
        assert_eq!(f1.header, Msg::Data { n: 1 });
        assert_eq!(f2.header, Msg::Data { n: 2 });
        assert_eq!(&f2.payload[..], &[2u8; 300][..]);
        drop(w);
        assert!(recv_within(&mut r, t).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_direct_write_over_the_maximum_is_refused_before_sending() {
        let (a, _b) = tokio::io::duplex(1 << 16);
        let mut w = FramedWrite::new(a, FrameCodec::<Msg>::new(64));
        let e = write_within(
            &mut w,
            &Msg::Data { n: 1 },
            &[0u8; 100],
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(e, TimedError::Frame(FrameError::TooLarge { .. })),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_silent_peer_is_a_timeout() {
        let (_a, b) = tokio::io::duplex(1 << 16);
        let mut r = FramedRead::new(b, FrameCodec::<Msg>::new(1 << 20));
        let e = recv_within(&mut r, Duration::from_millis(20))
            .await
            .unwrap_err();
        assert!(matches!(e, TimedError::Timeout(_)), "{e}");
    }
}
