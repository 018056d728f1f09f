//! [`RpcStream`]: the socket under a tarpc connection, watched byte by byte.
//!
//! tarpc frames its messages with tokio-util's `LengthDelimitedCodec`:
//!
//! ```text
//! +----------------+---------------------------+
//! | length: u32 BE | bincode message (length)  |
//! +----------------+---------------------------+
//! ```
//!
//! The codec reserves a frame's announced length as soon as its prefix arrives, and a
//! connection may otherwise stay open for ever. On the metadata service's side this wrapper
//! follows the frame boundaries of the bytes read and ends the connection with an error (which
//! ends the tarpc channel) when:
//!
//! - a prefix announces more than the inbound limit — before the codec sees the prefix, so
//!   nothing is reserved;
//! - a frame is not complete within the idle timeout of its first byte (a trickle, slowloris);
//! - nothing was read or written for the idle timeout (an idle connection; clients reconnect).
//!
//! On the client's side it only records that the connection ended ([`ConnectionWatch`]), so
//! that the next call dials again instead of failing on a connection the service closed.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What the service allows one connection.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Largest inbound frame (its announced length).
    pub max_frame: usize,
    /// Longest silence, and longest time one inbound frame may take from first to last byte.
    pub idle: Duration,
}

/// Tells whether a connection has ended (read end of stream or an error).
#[derive(Debug, Clone, Default)]
pub struct ConnectionWatch(Arc<AtomicBool>);

impl ConnectionWatch {
    /// True once the connection's read side ended.
    pub fn is_closed(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn close(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Where the reader is in the frame stream.
#[derive(Debug, Default)]
struct FrameCursor {
    head: [u8; 4],
    head_filled: usize,
    body_left: u64,
}

impl FrameCursor {
    /// In the middle of a frame (prefix or body).
    fn in_frame(&self) -> bool {
        self.head_filled > 0 || self.body_left > 0
    }

    /// Follows `bytes`; returns the announced length of the first prefix over `max`.
    fn advance(&mut self, mut bytes: &[u8], max: usize) -> Result<(), u64> {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = (self.body_left.min(bytes.len() as u64)) as usize;
                self.body_left -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            let n = (4 - self.head_filled).min(bytes.len());
            self.head[self.head_filled..self.head_filled + n].copy_from_slice(&bytes[..n]);
            self.head_filled += n;
            bytes = &bytes[n..];
            if self.head_filled == 4 {
                self.head_filled = 0;
                let len = u64::from(u32::from_be_bytes(self.head));
                if len > max as u64 {
                    return Err(len);
                }
                self.body_left = len;
            }
        }
        Ok(())
    }
}

/// The service side's state: limits, timer and cursor.
struct Guard {
    limits: StreamLimits,
    peer: SocketAddr,
    cursor: FrameCursor,
    last_activity: Instant,
    frame_started: Instant,
    timer: Pin<Box<Sleep>>,
}

impl Guard {
    /// When the connection is closed unless something happens first.
    fn deadline(&self) -> Instant {
        if self.cursor.in_frame() {
            self.frame_started + self.limits.idle
        } else {
            self.last_activity + self.limits.idle
        }
    }

    /// Follows the bytes just read.
    fn read(&mut self, bytes: &[u8]) -> io::Result<()> {
        let now = Instant::now();
        if !self.cursor.in_frame() {
            self.frame_started = now;
        }
        self.last_activity = now;
        if let Err(announced) = self.cursor.advance(bytes, self.limits.max_frame) {
            tracing::warn!(peer = %self.peer, announced, limit = self.limits.max_frame,
                "rpc frame larger than the limit (rpc.max.frame.bytes); closing the connection");
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "rpc frame of {announced} bytes exceeds the limit of {}",
                    self.limits.max_frame
                ),
            ));
        }
        if !self.cursor.in_frame() {
            // The frame is complete: the next one's clock starts with its first byte.
            self.frame_started = now;
        } else if now >= self.frame_started + self.limits.idle {
            // Bytes keep coming, but too slowly to finish the frame in time.
            return Err(self.expired());
        }
        Ok(())
    }

    /// The error (and the log line) of a connection closed by the idle timeout.
    fn expired(&self) -> io::Error {
        let what = if self.cursor.in_frame() {
            "an rpc frame was not complete within rpc.idle.timeout"
        } else {
            "an rpc connection was idle for rpc.idle.timeout"
        };
        tracing::info!(peer = %self.peer, timeout = ?self.limits.idle, "{what}; closing the connection");
        io::Error::new(io::ErrorKind::TimedOut, what)
    }

    /// Ready with an error once the deadline has passed.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            let deadline = self.deadline();
            if self.timer.deadline() != deadline {
                self.timer.as_mut().reset(deadline);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if self.deadline() > deadline {
                continue; // activity moved it while the timer ran
            }
            return Poll::Ready(self.expired());
        }
    }
}

/// A socket under tarpc: see the module documentation.
pub struct RpcStream<S> {
    inner: S,
    guard: Option<Guard>,
    watch: ConnectionWatch,
}

impl<S> RpcStream<S> {
    /// The metadata service's side of a connection from `peer`, held to `limits`.
    pub fn guarded(inner: S, peer: SocketAddr, limits: StreamLimits) -> Self {
        let now = Instant::now();
        RpcStream {
            inner,
            guard: Some(Guard {
                limits,
                peer,
                cursor: FrameCursor::default(),
                last_activity: now,
                frame_started: now,
                timer: Box::pin(tokio::time::sleep_until(now + limits.idle)),
            }),
            watch: ConnectionWatch::default(),
        }
    }

    /// A caller's side: no limits; [`RpcStream::watch`] tells when the service closed it.
    pub fn watched(inner: S) -> Self {
        RpcStream {
            inner,
            guard: None,
            watch: ConnectionWatch::default(),
        }
    }

    /// Tells when the connection ended.
    pub fn watch(&self) -> ConnectionWatch {
        self.watch.clone()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for RpcStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let new = &buf.filled()[before..];
                if new.is_empty() {
                    this.watch.close();
                    return Poll::Ready(Ok(()));
                }
                if let Some(guard) = &mut this.guard {
                    if let Err(e) = guard.read(new) {
                        this.watch.close();
                        return Poll::Ready(Err(e));
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => {
                this.watch.close();
                Poll::Ready(Err(e))
            }
            Poll::Pending => match &mut this.guard {
                Some(guard) => match guard.poll_expired(cx) {
                    Poll::Ready(e) => {
                        this.watch.close();
                        Poll::Ready(Err(e))
                    }
                    Poll::Pending => Poll::Pending,
                },
                None => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for RpcStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(guard)) = (&r, &mut this.guard) {
            if *n > 0 {
                guard.last_activity = Instant::now();
            }
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limits(max_frame: usize, idle_ms: u64) -> StreamLimits {
        StreamLimits {
            max_frame,
            idle: Duration::from_millis(idle_ms),
        }
    }

    fn peer() -> SocketAddr {
        "127.0.0.1:1".parse().unwrap()
    }

    #[test]
    fn the_cursor_follows_frames_split_anywhere() {
        let mut c = FrameCursor::default();
        let mut bytes = Vec::new();
        for len in [0u32, 3, 10] {
            bytes.extend_from_slice(&len.to_be_bytes());
            bytes.extend(std::iter::repeat_n(7u8, len as usize));
        }
        for piece in bytes.chunks(3) {
            c.advance(piece, 10).unwrap();
        }
        assert!(!c.in_frame());
        c.advance(&[0, 0], 10).unwrap();
        assert!(c.in_frame());
        assert_eq!(c.advance(&[0, 11], 10), Err(11));
    }

    #[tokio::test]
    async fn a_prefix_over_the_limit_ends_the_read_before_the_codec_sees_it() {
        let (mut a, b) = tokio::io::duplex(1024);
        let mut s = RpcStream::guarded(b, peer(), limits(1024, 60_000));
        a.write_all(&(200u32 << 20).to_be_bytes()).await.unwrap();
        let mut buf = [0u8; 16];
        let e = s.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("209715200"), "{e}");
        assert!(s.watch().is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn silence_and_trickles_end_within_the_idle_timeout() {
        // Silence.
        let (_a, b) = tokio::io::duplex(1024);
        let mut s = RpcStream::guarded(b, peer(), limits(1024, 1000));
        let t0 = Instant::now();
        let e = s.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(t0.elapsed(), Duration::from_millis(1000));

        // A frame trickled one byte every 300 ms: closed 1 s after its first byte although
        // bytes keep coming.
        let (mut a, b) = tokio::io::duplex(1024);
        let mut s = RpcStream::guarded(b, peer(), limits(1024, 1000));
        tokio::spawn(async move {
            let _ = a.write_all(&100u32.to_be_bytes()).await;
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if a.write_all(&[1]).await.is_err() {
                    break;
                }
            }
        });
        let t0 = Instant::now();
        let mut buf = [0u8; 256];
        let e = loop {
            match s.read(&mut buf).await {
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(
            t0.elapsed() <= Duration::from_millis(1000),
            "{:?}",
            t0.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn whole_frames_keep_a_connection_open() {
        let (mut a, b) = tokio::io::duplex(1024);
        let mut s = RpcStream::guarded(b, peer(), limits(1024, 1000));
        tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(800)).await;
                a.write_all(&[0, 0, 0, 1, 9]).await.unwrap();
            }
        });
        let mut got = 0;
        let mut buf = [0u8; 64];
        while got < 25 {
            got += s.read(&mut buf).await.unwrap();
        }
        assert!(!s.watch().is_closed());
    }
}
