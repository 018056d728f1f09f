//! Reading a range of a replica with the checksums to send with it.
//!
//! Stored checksums are sent as they are, without re-verifying, so that the client detects
//! disk corruption and names the replica. The one exception is a trailing partial chunk: when
//! the bytes sent end inside a chunk whose stored checksum covers more bytes (a range ending
//! mid-chunk, or a replica being written whose last chunk is still growing), its checksum is
//! computed over the bytes sent. For a finalized replica the stored checksum of that chunk is
//! verified first; if it does not match, the stored one is sent so that the client sees the
//! corruption.

use crate::error::{DatanodeError, Result};
use crate::storage::dataset::ReadReplica;
use crate::storage::meta::{self, MetaHeader};
use crate::sys::DIRECT_IO_ALIGN;
use bytes::{Bytes, BytesMut};
use sluice_common::checksum::{self, CHECKSUM_SIZE};
use sluice_common::proto::ReplicaState;
use std::fs::File;

/// One piece of a replica: data from a chunk boundary, and its checksums.
#[derive(Clone, Debug)]
pub struct Piece {
    /// Block offset of the first byte (a chunk boundary).
    pub offset: u64,
    /// Checksums then data, laid out as a frame payload (read into place: no copy).
    payload: Bytes,
    /// Bytes of checksums at the front of `payload`.
    sums_len: usize,
}

impl Piece {
    /// Checksums then data: the payload of a `Chunk` or `Packet` frame.
    pub fn payload(&self) -> Bytes {
        self.payload.clone()
    }

    /// The data.
    pub fn data(&self) -> Bytes {
        self.payload.slice(self.sums_len..)
    }

    /// Data bytes.
    pub fn data_len(&self) -> usize {
        self.payload.len() - self.sums_len
    }

    /// One CRC32C per chunk, big-endian.
    pub fn checksums(&self) -> Bytes {
        self.payload.slice(..self.sums_len)
    }

    /// Checksums then data, borrowed (to write to a socket without a copy).
    pub fn payload_bytes(&self) -> &[u8] {
        &self.payload
    }

    /// The buffer back, for reuse, when nothing else shares it.
    pub fn into_buffer(self) -> Option<BytesMut> {
        self.payload.try_into_mut().ok()
    }
}

/// Reads `[start, start + len)` of `r` (`start` on a chunk boundary) with its checksums,
/// straight into one frame payload. `stored_len` is the replica's length on disk when the read
/// began.
pub fn read_piece(r: &ReadReplica, start: u64, len: usize, stored_len: u64) -> Result<Piece> {
    let size = payload_len(r, len);
    read_piece_into(r, start, len, stored_len, BytesMut::zeroed(size))
}

/// Bytes of checksums and data a piece of `len` data bytes of `r` takes.
pub fn payload_len(r: &ReadReplica, len: usize) -> usize {
    checksum::checksum_len(len, r.entry.bytes_per_checksum.max(1)) + len
}

/// As [`read_piece`], into `buf` (a recycled buffer of [`payload_len`] bytes; its contents
/// are overwritten).
pub fn read_piece_into(
    r: &ReadReplica,
    start: u64,
    len: usize,
    stored_len: u64,
    mut buf: BytesMut,
) -> Result<Piece> {
    let bpc32 = r.entry.bytes_per_checksum;
    let bpc = bpc32 as u64;
    if bpc == 0 || !start.is_multiple_of(bpc) {
        return Err(DatanodeError::invalid(format!(
            "read at {start} is not on a chunk boundary of {bpc} bytes"
        )));
    }
    let sums_len = checksum::checksum_len(len, bpc32);
    buf.resize(sums_len + len, 0);
    let (sums, data) = buf.split_at_mut(sums_len);
    meta::read_exact_at(&r.block, data, start, &r.block_path)?;
    read_sums(r, start, sums, data, stored_len)?;
    Ok(Piece {
        offset: start,
        payload: buf.freeze(),
        sums_len,
    })
}

/// Reads the stored checksums of `data` (read from block offset `start`, a chunk boundary)
/// into `sums`; a last chunk that ends inside a longer stored chunk gets the checksum of the
/// bytes sent.
fn read_sums(
    r: &ReadReplica,
    start: u64,
    sums: &mut [u8],
    data: &[u8],
    stored_len: u64,
) -> Result<()> {
    let bpc = u64::from(r.entry.bytes_per_checksum);
    meta::read_exact_at(
        &r.meta,
        sums,
        MetaHeader::checksum_pos(start / bpc),
        &r.meta_path,
    )?;
    let end = start + data.len() as u64;
    let tail = end % bpc;
    if tail != 0 && !data.is_empty() {
        let chunk_start = end - tail;
        let stored_end = (chunk_start + bpc).min(stored_len);
        if stored_end > end {
            let sent = &data[(chunk_start - start) as usize..];
            let finalized = r.entry.state == ReplicaState::Finalized;
            if !finalized || stored_chunk_ok(r, chunk_start, sent, stored_end)? {
                let at = sums.len() - CHECKSUM_SIZE;
                sums[at..].copy_from_slice(&checksum::crc(sent).to_be_bytes());
            }
        }
    }
    Ok(())
}

/// As [`read_piece_into`], the data read with O_DIRECT through `direct` (the block file opened
/// with it) straight into the buffer: no copy out of the page cache, and nothing put in it.
/// `start` must be a multiple of [`DIRECT_IO_ALIGN`]; `buf` is replaced by a buffer whose data
/// starts at an aligned address when it is not one already (a window's buffers are after
/// their first use).
pub fn read_piece_direct(
    r: &ReadReplica,
    direct: &File,
    start: u64,
    len: usize,
    stored_len: u64,
    buf: BytesMut,
) -> Result<Piece> {
    let bpc32 = r.entry.bytes_per_checksum;
    let bpc = u64::from(bpc32);
    if bpc == 0 || !start.is_multiple_of(bpc) || !start.is_multiple_of(DIRECT_IO_ALIGN as u64) {
        return Err(DatanodeError::invalid(format!(
            "O_DIRECT read at {start}: not on a chunk boundary of {bpc} bytes and a multiple of \
             {DIRECT_IO_ALIGN}"
        )));
    }
    let sums_len = checksum::checksum_len(len, bpc32);
    let mut buf = aligned_after(buf, sums_len, len.next_multiple_of(DIRECT_IO_ALIGN));
    let (sums, data) = buf.split_at_mut(sums_len);
    let got = crate::sys::read_direct_at(direct, data, start, len)
        .map_err(|e| DatanodeError::io("read (O_DIRECT)", &r.block_path, e))?;
    if got < len {
        return Err(DatanodeError::CorruptMeta {
            path: r.block_path.clone(),
            reason: format!("{len} bytes wanted at offset {start}, file too short"),
        });
    }
    read_sums(r, start, sums, &data[..len], stored_len)?;
    buf.truncate(sums_len + len);
    Ok(Piece {
        offset: start,
        payload: buf.freeze(),
        sums_len,
    })
}

/// `buf`, or a new buffer, of `lead + len` bytes whose byte `lead` sits at an address aligned
/// for O_DIRECT.
fn aligned_after(mut buf: BytesMut, lead: usize, len: usize) -> BytesMut {
    let aligned = (buf.as_ptr() as usize + lead).is_multiple_of(DIRECT_IO_ALIGN);
    if aligned && buf.capacity() >= lead + len {
        buf.resize(lead + len, 0);
        return buf;
    }
    let mut b = BytesMut::zeroed(lead + len + DIRECT_IO_ALIGN);
    let pad = (DIRECT_IO_ALIGN - (b.as_ptr() as usize + lead) % DIRECT_IO_ALIGN) % DIRECT_IO_ALIGN;
    bytes::Buf::advance(&mut b, pad);
    b.truncate(lead + len);
    b
}

/// The replica's bytes per checksum when `[start, start + len)` can be served from the page
/// cache as stored: a chunk-aligned start, within the stored bytes, and no partial last chunk
/// stored longer (its checksum is recomputed from a second, blocking read).
fn servable_from_cache(r: &ReadReplica, start: u64, len: usize, stored_len: u64) -> Option<u32> {
    let bpc32 = r.entry.bytes_per_checksum;
    let bpc = u64::from(bpc32);
    let end = start + len as u64;
    let ok = bpc != 0
        && start.is_multiple_of(bpc)
        && end <= stored_len
        && (end.is_multiple_of(bpc) || end == stored_len);
    ok.then_some(bpc32)
}

/// [`read_piece_into`] from the page cache only: `Ok(piece)` when the data and its checksums
/// were all cached ([`crate::sys::pread_cached`]), else the buffer back, untouched as far as
/// the caller is concerned, for the blocking read. A piece whose last chunk is partial and
/// stored longer (its checksum recomputed from a second read) is always left to the blocking
/// read.
pub fn read_piece_cached(
    r: &ReadReplica,
    start: u64,
    len: usize,
    stored_len: u64,
    mut buf: BytesMut,
) -> std::result::Result<Piece, BytesMut> {
    let Some(bpc32) = servable_from_cache(r, start, len, stored_len) else {
        return Err(buf);
    };
    let bpc = bpc32 as u64;
    let sums_len = checksum::checksum_len(len, bpc32);
    buf.resize(sums_len + len, 0);
    let (sums, data) = buf.split_at_mut(sums_len);
    if !crate::sys::pread_cached(&r.block, data, start)
        || !crate::sys::pread_cached(&r.meta, sums, MetaHeader::checksum_pos(start / bpc))
    {
        return Err(buf);
    }
    Ok(Piece {
        offset: start,
        payload: buf.freeze(),
        sums_len,
    })
}

/// A piece whose data stays in the block file, to be sent with `sendfile`
/// ([`crate::wire::write_from_file`]): its offset, its checksums (read), its data length.
#[derive(Debug)]
pub struct FilePiece {
    /// Block offset of the first data byte.
    pub offset: u64,
    /// The stored checksums of its chunks.
    pub sums: BytesMut,
    /// Data bytes, in the block file at `offset`.
    pub data_len: usize,
}

/// A [`FilePiece`] of `[start, start + len)` when its data is all in the page cache
/// ([`crate::sys::cached_pages`]) and its checksums are read from the page cache
/// ([`crate::sys::pread_cached`]) into `sums`; else `sums` back. As [`read_piece_cached`],
/// a partial last chunk stored longer is left to the blocking read, and so is every piece
/// where the kernel cannot say what is cached.
pub fn file_piece_cached(
    r: &ReadReplica,
    start: u64,
    len: usize,
    stored_len: u64,
    sums: BytesMut,
) -> std::result::Result<FilePiece, BytesMut> {
    match crate::sys::cached_pages(&r.block, start, len as u64) {
        Some((cached, pages)) if cached >= pages => file_piece(r, start, len, stored_len, sums),
        _ => Err(sums),
    }
}

/// As [`file_piece_cached`], for data the caller already found whole in the page cache.
pub fn file_piece(
    r: &ReadReplica,
    start: u64,
    len: usize,
    stored_len: u64,
    mut sums: BytesMut,
) -> std::result::Result<FilePiece, BytesMut> {
    let Some(bpc32) = servable_from_cache(r, start, len, stored_len) else {
        return Err(sums);
    };
    let bpc = bpc32 as u64;
    sums.resize(checksum::checksum_len(len, bpc32), 0);
    if !crate::sys::pread_cached(&r.meta, &mut sums, MetaHeader::checksum_pos(start / bpc)) {
        return Err(sums);
    }
    Ok(FilePiece {
        offset: start,
        sums,
        data_len: len,
    })
}

/// True if the stored checksum of the chunk `[chunk_start, stored_end)` matches its bytes.
fn stored_chunk_ok(
    r: &ReadReplica,
    chunk_start: u64,
    head: &[u8],
    stored_end: u64,
) -> Result<bool> {
    let mut chunk = head.to_vec();
    let rest = (stored_end - chunk_start) as usize - head.len();
    let mut more = vec![0u8; rest];
    meta::read_exact_at(
        &r.block,
        &mut more,
        chunk_start + head.len() as u64,
        &r.block_path,
    )?;
    chunk.extend_from_slice(&more);
    Ok(meta::chunk_matches(
        &r.meta,
        &r.meta_path,
        r.entry.bytes_per_checksum,
        chunk_start,
        &chunk,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_o_direct_buffer_has_its_data_aligned_and_is_kept_once_it_is() {
        for lead in [0usize, 8, 8192, 100] {
            let b = aligned_after(BytesMut::zeroed(10), lead, 3 * DIRECT_IO_ALIGN);
            assert_eq!(b.len(), lead + 3 * DIRECT_IO_ALIGN);
            assert!((b.as_ptr() as usize + lead).is_multiple_of(DIRECT_IO_ALIGN));
            // Recycled (as a window does, through `Bytes`): the same memory again.
            let at = b.as_ptr();
            let again = b.freeze().try_into_mut().unwrap();
            let b = aligned_after(again, lead, 2 * DIRECT_IO_ALIGN);
            assert_eq!(b.as_ptr(), at, "lead {lead}: reused");
            assert_eq!(b.len(), lead + 2 * DIRECT_IO_ALIGN);
        }
    }
}
