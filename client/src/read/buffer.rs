//! The read buffer of one block stream: pieces received from the DataNode and not yet read,
//! contiguous, bounded in bytes. Plain logic.
//!
//! The buffer covers `[start, end)` of the block. Pieces are appended at `end`; bytes of a piece
//! that lie before `end` (the leading bytes of a first chunk aligned down, or bytes the reader
//! already skipped) are dropped. [`ReadBuffer::release_before`] moves `start` forward as the
//! reader advances, freeing whole pieces; moving it past `end` empties the buffer and makes the
//! bytes up to the new `start` be skipped when they arrive.

use bytes::Bytes;
use std::collections::VecDeque;

/// Pieces of one block between the reader's position and what the stream delivered.
#[derive(Debug)]
pub(crate) struct ReadBuffer {
    pieces: VecDeque<Bytes>,
    start: u64,
    len: usize,
    capacity: usize,
}

/// A piece that does not follow what the buffer holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Gap {
    /// Where the buffer ends.
    pub expected: u64,
    /// Where the piece starts.
    pub got: u64,
}

impl ReadBuffer {
    /// An empty buffer that will hold bytes from block offset `start`, at most `capacity`.
    pub(crate) fn new(start: u64, capacity: usize) -> ReadBuffer {
        ReadBuffer {
            pieces: VecDeque::new(),
            start,
            len: 0,
            capacity: capacity.max(1),
        }
    }

    /// First byte held (or expected, when empty).
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    /// Just past the last byte held: where the next piece must start (or overlap).
    pub(crate) fn end(&self) -> u64 {
        self.start + self.len as u64
    }

    /// Bytes held.
    pub(crate) fn held(&self) -> usize {
        self.len
    }

    /// Room left before the buffer is full.
    pub(crate) fn free(&self) -> usize {
        self.capacity.saturating_sub(self.len)
    }

    /// True when `pos` is held.
    pub(crate) fn contains(&self, pos: u64) -> bool {
        pos >= self.start && pos < self.end()
    }

    /// Appends a piece that starts at block offset `offset`; bytes before [`ReadBuffer::end`]
    /// are dropped. A piece starting after `end` would leave a hole and is refused.
    pub(crate) fn push(&mut self, offset: u64, data: Bytes) -> Result<(), Gap> {
        let end = self.end();
        if offset > end {
            return Err(Gap {
                expected: end,
                got: offset,
            });
        }
        let skip = (end - offset) as usize;
        if skip >= data.len() {
            return Ok(());
        }
        let piece = data.slice(skip..);
        self.len += piece.len();
        self.pieces.push_back(piece);
        Ok(())
    }

    /// Copies bytes from `pos` (which must be held) into `out`; returns the count.
    pub(crate) fn copy_at(&self, pos: u64, out: &mut [u8]) -> usize {
        if !self.contains(pos) {
            return 0;
        }
        let mut skip = (pos - self.start) as usize;
        let mut n = 0;
        for piece in &self.pieces {
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            let take = (piece.len() - skip).min(out.len() - n);
            out[n..n + take].copy_from_slice(&piece[skip..skip + take]);
            n += take;
            skip = 0;
            if n == out.len() {
                break;
            }
        }
        n
    }

    /// The bytes from `pos` (which must be held) to the end of the piece holding it, at most
    /// `max`, without copying: the piece's memory is shared. `None` when `pos` is not held.
    pub(crate) fn slice_at(&self, pos: u64, max: usize) -> Option<Bytes> {
        if !self.contains(pos) || max == 0 {
            return None;
        }
        let mut skip = (pos - self.start) as usize;
        for piece in &self.pieces {
            if skip < piece.len() {
                let take = (piece.len() - skip).min(max);
                return Some(piece.slice(skip..skip + take));
            }
            skip -= piece.len();
        }
        None
    }

    /// Drops every byte before `pos`. Past `end`, the buffer empties and restarts at `pos`.
    pub(crate) fn release_before(&mut self, pos: u64) {
        if pos <= self.start {
            return;
        }
        if pos >= self.end() {
            self.pieces.clear();
            self.len = 0;
            self.start = pos;
            return;
        }
        let mut drop = (pos - self.start) as usize;
        while drop > 0 {
            let Some(front) = self.pieces.front_mut() else {
                break;
            };
            if front.len() <= drop {
                drop -= front.len();
                self.len -= front.len();
                self.start += front.len() as u64;
                self.pieces.pop_front();
            } else {
                let _ = front.split_to(drop);
                self.len -= drop;
                self.start += drop as u64;
                drop = 0;
            }
        }
    }

    /// Number of pieces held (tests).
    #[cfg(test)]
    pub(crate) fn pieces(&self) -> usize {
        self.pieces.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(from: u64, len: usize) -> Bytes {
        Bytes::from(
            (0..len)
                .map(|i| ((from as usize + i) % 251) as u8)
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn first_aligned_chunk_is_trimmed_to_the_requested_offset() {
        let mut b = ReadBuffer::new(700, 4096);
        b.push(512, piece(512, 1024)).unwrap();
        assert_eq!((b.start(), b.end()), (700, 1536));
        let mut out = [0u8; 10];
        assert_eq!(b.copy_at(700, &mut out), 10);
        assert_eq!(&out[..], &piece(700, 10)[..]);
        assert_eq!(
            b.push(2000, piece(2000, 10)),
            Err(Gap {
                expected: 1536,
                got: 2000
            })
        );
    }

    #[test]
    fn forward_seek_within_the_buffer_releases_whole_pieces() {
        let mut b = ReadBuffer::new(0, 4096);
        for i in 0..4 {
            b.push(i * 1024, piece(i * 1024, 1024)).unwrap();
        }
        assert_eq!(b.free(), 0);
        b.release_before(2500);
        assert_eq!(b.pieces(), 2, "two whole pieces freed, the third cut");
        assert_eq!((b.start(), b.held()), (2500, 4096 - 2500));
        let mut out = vec![0u8; 2000];
        let n = b.copy_at(2500, &mut out);
        assert_eq!(n, 4096 - 2500);
        assert_eq!(&out[..n], &piece(2500, n)[..]);
        assert!(b.free() >= 2500);
        // A read across piece boundaries.
        assert!(!b.contains(4096));
        assert!(!b.contains(2499));
    }

    #[test]
    fn skipping_past_the_end_drops_bytes_until_the_new_position() {
        let mut b = ReadBuffer::new(0, 2048);
        b.push(0, piece(0, 1024)).unwrap();
        b.release_before(1500);
        assert_eq!((b.start(), b.held()), (1500, 0));
        // The next piece [1024, 2048) arrives: only [1500, 2048) is kept.
        b.push(1024, piece(1024, 1024)).unwrap();
        assert_eq!((b.start(), b.end()), (1500, 2048));
        let mut out = [0u8; 4];
        b.copy_at(1500, &mut out);
        assert_eq!(&out[..], &piece(1500, 4)[..]);
        // A piece entirely before the end is ignored.
        b.push(0, piece(0, 100)).unwrap();
        assert_eq!(b.held(), 548);
    }

    #[test]
    fn a_slice_shares_the_piece_holding_the_position_and_stops_at_its_end() {
        let mut b = ReadBuffer::new(100, 4096);
        b.push(0, piece(0, 1024)).unwrap();
        b.push(1024, piece(1024, 1024)).unwrap();
        let s = b.slice_at(1000, 4096).unwrap();
        assert_eq!(
            &s[..],
            &piece(1000, 24)[..],
            "to the end of the first piece"
        );
        let s = b.slice_at(1030, 10).unwrap();
        assert_eq!(&s[..], &piece(1030, 10)[..], "at most max");
        assert_eq!(b.slice_at(99, 10), None, "before the buffer");
        assert_eq!(b.slice_at(2048, 10), None, "past the buffer");
        assert_eq!(b.slice_at(500, 0), None);
        // Shared, not copied: the slice points into the piece the buffer holds.
        let whole = b.slice_at(1024, 4096).unwrap();
        let again = b.slice_at(1024, 4096).unwrap();
        assert_eq!(whole.as_ptr(), again.as_ptr());
    }

    #[test]
    fn bounds_are_respected() {
        let mut b = ReadBuffer::new(0, 1000);
        b.push(0, piece(0, 600)).unwrap();
        assert_eq!(b.free(), 400);
        b.push(600, piece(600, 600)).unwrap();
        assert_eq!(b.free(), 0);
        let mut out = [0u8; 8];
        assert_eq!(b.copy_at(1200, &mut out), 0);
        b.release_before(1200);
        assert_eq!(b.free(), 1000);
    }
}
