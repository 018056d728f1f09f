//! The read-ahead window of one streaming read: how many pieces may be read from disk and not
//! yet written to the socket, and the pooled buffers they are read into.
//!
//! A window of `1 + ahead` slots: one for the piece on the wire, `ahead` for the pieces read
//! ahead of it. The reader takes a slot (waiting while all are held) and a buffer before it
//! reads a piece; the slot and the buffer come back when the connection has written the piece
//! and drops it. So `ahead = 0` (prefetch off) reads strictly one piece, sends it, then reads
//! the next: disk and network never overlap. The buffers are recycled for the life of the
//! stream: a streaming read allocates at most `1 + ahead` of them, whatever its length.

use super::range::Piece;
use bytes::BytesMut;
use std::sync::{Arc, Mutex};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// The shared window of one stream.
#[derive(Debug)]
pub struct ReadWindow {
    slots: Arc<Semaphore>,
    free: Mutex<Vec<BytesMut>>,
    ahead: usize,
}

impl ReadWindow {
    /// A window with room for the piece on the wire and `ahead` pieces read ahead of it.
    pub fn new(ahead: usize) -> Arc<ReadWindow> {
        Arc::new(ReadWindow {
            slots: Arc::new(Semaphore::new(ahead + 1)),
            free: Mutex::new(Vec::with_capacity(ahead + 1)),
            ahead,
        })
    }

    /// Pieces read ahead of the one on the wire, at most.
    pub fn ahead(&self) -> usize {
        self.ahead
    }

    /// Slots free right now (tests).
    #[cfg(test)]
    pub fn free_slots(&self) -> usize {
        self.slots.available_permits()
    }

    /// Waits for a free slot.
    pub async fn slot(&self) -> Result<Slot, AcquireError> {
        let permit = Arc::clone(&self.slots).acquire_owned().await?;
        Ok(Slot { _permit: permit })
    }

    /// A buffer of `len` bytes: a recycled one when there is one (its old contents are
    /// overwritten by the read), else a new one.
    pub fn buffer(&self, len: usize) -> BytesMut {
        let recycled = self.free.lock().ok().and_then(|mut f| f.pop());
        let mut buf = recycled.unwrap_or_default();
        if buf.len() >= len {
            buf.truncate(len);
        } else {
            buf.resize(len, 0);
        }
        buf
    }

    fn give_back(&self, buf: BytesMut) {
        if let Ok(mut free) = self.free.lock() {
            if free.len() <= self.ahead {
                free.push(buf);
            }
        }
    }
}

/// A held slot of a [`ReadWindow`].
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
}

/// A piece read ahead: it holds its slot until dropped, and gives its buffer back to the
/// window then (when nothing else still shares it).
#[derive(Debug)]
pub struct WindowPiece {
    piece: Option<Piece>,
    window: Arc<ReadWindow>,
    _slot: Slot,
}

impl WindowPiece {
    /// Wraps `piece`, read into a buffer of `window` while holding `slot`.
    pub fn new(piece: Piece, window: Arc<ReadWindow>, slot: Slot) -> WindowPiece {
        WindowPiece {
            piece: Some(piece),
            window,
            _slot: slot,
        }
    }

    /// The piece.
    pub fn piece(&self) -> Option<&Piece> {
        self.piece.as_ref()
    }
}

impl Drop for WindowPiece {
    fn drop(&mut self) {
        // The buffer goes back before the slot is released (fields drop after this body), so
        // the reader that takes the slot finds it.
        if let Some(buf) = self.piece.take().and_then(Piece::into_buffer) {
            self.window.give_back(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn a_window_holds_one_piece_on_the_wire_plus_those_ahead() {
        let w = ReadWindow::new(2);
        let a = w.slot().now_or_never().unwrap().unwrap();
        let _b = w.slot().now_or_never().unwrap().unwrap();
        let _c = w.slot().now_or_never().unwrap().unwrap();
        assert!(w.slot().now_or_never().is_none(), "a fourth slot must wait");
        drop(a);
        assert!(w.slot().now_or_never().is_some());
    }

    #[test]
    fn with_prefetch_off_the_next_piece_waits_for_the_one_on_the_wire() {
        let w = ReadWindow::new(0);
        let on_wire = w.slot().now_or_never().unwrap().unwrap();
        assert!(w.slot().now_or_never().is_none());
        drop(on_wire);
        assert!(w.slot().now_or_never().is_some());
    }

    #[test]
    fn buffers_are_recycled_and_sized_to_the_request() {
        let w = ReadWindow::new(1);
        let mut b = w.buffer(1000);
        assert_eq!(b.len(), 1000);
        b[0] = 7;
        let ptr = b.as_ptr();
        w.give_back(b);
        let b = w.buffer(600);
        assert_eq!(
            (b.len(), b.as_ptr()),
            (600, ptr),
            "the same allocation, cut"
        );
        w.give_back(b);
        let b = w.buffer(2000);
        assert_eq!(b.len(), 2000);
        // At most 1 + ahead buffers are kept.
        for _ in 0..5 {
            w.give_back(BytesMut::zeroed(10));
        }
        assert_eq!(w.free.lock().unwrap().len(), 2);
    }
}
