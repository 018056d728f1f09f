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
use crate::storage::meta;
use bytes::Bytes;
use sluice_common::checksum::{self, CHECKSUM_SIZE};
use sluice_common::proto::ReplicaState;

/// One piece of a replica: data from a chunk boundary, and its checksums.
#[derive(Clone, Debug)]
pub struct Piece {
    /// Block offset of the first byte (a chunk boundary).
    pub offset: u64,
    /// The data.
    pub data: Bytes,
    /// One CRC32C per chunk, big-endian.
    pub checksums: Bytes,
}

impl Piece {
    /// Checksums then data: the payload of a `Chunk` or `Packet` frame.
    pub fn payload(&self) -> Bytes {
        let mut v = Vec::with_capacity(self.checksums.len() + self.data.len());
        v.extend_from_slice(&self.checksums);
        v.extend_from_slice(&self.data);
        Bytes::from(v)
    }
}

/// Reads `[start, start + len)` of `r` (`start` on a chunk boundary). `stored_len` is the
/// replica's length on disk when the read began.
pub fn read_piece(r: &ReadReplica, start: u64, len: usize, stored_len: u64) -> Result<Piece> {
    let bpc = r.entry.bytes_per_checksum as u64;
    if bpc == 0 || !start.is_multiple_of(bpc) {
        return Err(DatanodeError::invalid(format!(
            "read at {start} is not on a chunk boundary of {bpc} bytes"
        )));
    }
    let mut data = vec![0u8; len];
    meta::read_exact_at(&r.block, &mut data, start, &r.block_path)?;
    let chunks = checksum::chunk_count(len, r.entry.bytes_per_checksum) as u64;
    let mut sums = meta::read_checksums(&r.meta, start / bpc, chunks, &r.meta_path)?;
    let end = start + len as u64;
    let tail = end % bpc;
    if tail != 0 && len > 0 {
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
    Ok(Piece {
        offset: start,
        data: Bytes::from(data),
        checksums: Bytes::from(sums),
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
