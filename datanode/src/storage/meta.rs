//! A replica's metadata file: `blk_<id>_<genstamp>.meta`, beside the block file.
//!
//! ```text
//!  0        2      3                  7
//! +--------+------+------------------+--------------+--------------+-----
//! | ver u16| type | bytes_per_chksum | CRC32C of    | CRC32C of    | ...
//! |  (=1)  | (=2) | u32              | chunk 0      | chunk 1      |
//! +--------+------+------------------+--------------+--------------+-----
//!   big-endian throughout; type 2 is CRC32C (HDFS's DataChecksum numbering)
//! ```
//!
//! The header is 7 bytes, as in HDFS. Chunk `i`'s checksum sits at byte `7 + 4 * i`; the last
//! chunk may be partial, its checksum covering only the bytes the block file holds. A metadata
//! file "covers" a block file of `len` bytes when it holds exactly `ceil(len / bpc)` checksums.

use crate::error::{DatanodeError, IoContext, Result};
use sluice_common::checksum::{self, CHECKSUM_SIZE};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Layout version written in every metadata file header.
pub const META_VERSION: u16 = 1;
/// Checksum type code of CRC32C (HDFS `DataChecksum.Type.CRC32C`).
pub const CHECKSUM_TYPE_CRC32C: u8 = 2;
/// Bytes of the header.
pub const HEADER_LEN: u64 = 7;
/// Largest bytes-per-checksum accepted in a header or a request.
pub const MAX_BYTES_PER_CHECKSUM: u32 = 1024 * 1024;

/// The header of a metadata file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaHeader {
    /// Bytes of data per checksum.
    pub bytes_per_checksum: u32,
}

impl MetaHeader {
    /// The 7 header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let mut out = [0u8; HEADER_LEN as usize];
        out[0..2].copy_from_slice(&META_VERSION.to_be_bytes());
        out[2] = CHECKSUM_TYPE_CRC32C;
        out[3..7].copy_from_slice(&self.bytes_per_checksum.to_be_bytes());
        out
    }

    /// Parses and checks a header.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<MetaHeader> {
        let corrupt = |reason: String| DatanodeError::CorruptMeta {
            path: path.to_path_buf(),
            reason,
        };
        let b: [u8; HEADER_LEN as usize] = bytes
            .get(..HEADER_LEN as usize)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| corrupt(format!("header shorter than {HEADER_LEN} bytes")))?;
        let version = u16::from_be_bytes([b[0], b[1]]);
        if version != META_VERSION {
            return Err(corrupt(format!(
                "layout version {version}, expected {META_VERSION}"
            )));
        }
        if b[2] != CHECKSUM_TYPE_CRC32C {
            return Err(corrupt(format!("checksum type {}, expected CRC32C", b[2])));
        }
        let bpc = u32::from_be_bytes([b[3], b[4], b[5], b[6]]);
        if bpc == 0 || bpc > MAX_BYTES_PER_CHECKSUM {
            return Err(corrupt(format!("bytes per checksum {bpc} out of range")));
        }
        Ok(MetaHeader {
            bytes_per_checksum: bpc,
        })
    }

    /// File offset of chunk `index`'s checksum.
    pub fn checksum_pos(index: u64) -> u64 {
        HEADER_LEN + index * CHECKSUM_SIZE as u64
    }

    /// Metadata file length covering `data_len` bytes of block data.
    pub fn meta_len(&self, data_len: u64) -> u64 {
        HEADER_LEN + data_len.div_ceil(self.bytes_per_checksum as u64) * CHECKSUM_SIZE as u64
    }

    /// Bytes of block data that a metadata file of `meta_len` bytes covers at most.
    pub fn covered_len(&self, meta_len: u64) -> u64 {
        let sums = meta_len.saturating_sub(HEADER_LEN) / CHECKSUM_SIZE as u64;
        sums * self.bytes_per_checksum as u64
    }
}

/// Writes a fresh header into an empty metadata file.
pub fn write_header(file: &File, header: MetaHeader, path: &Path) -> Result<()> {
    file.write_all_at(&header.encode(), 0).ctx("write", path)
}

/// Reads and checks the header of an open metadata file.
pub fn read_header(file: &File, path: &Path) -> Result<MetaHeader> {
    let mut buf = [0u8; HEADER_LEN as usize];
    read_exact_at(file, &mut buf, 0, path)?;
    MetaHeader::decode(&buf, path)
}

/// Reads the stored checksums of chunks `[first, first + count)` (tests).
#[cfg(test)]
pub fn read_checksums(file: &File, first: u64, count: u64, path: &Path) -> Result<Vec<u8>> {
    let len = usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(CHECKSUM_SIZE))
        .ok_or_else(|| DatanodeError::invalid(format!("{count} checksums do not fit memory")))?;
    let mut buf = vec![0u8; len];
    read_exact_at(file, &mut buf, MetaHeader::checksum_pos(first), path)?;
    Ok(buf)
}

/// `read_exact_at` whose short read is a [`DatanodeError::CorruptMeta`]-style typed error.
pub fn read_exact_at(file: &File, buf: &mut [u8], pos: u64, path: &Path) -> Result<()> {
    file.read_exact_at(buf, pos).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            DatanodeError::CorruptMeta {
                path: path.to_path_buf(),
                reason: format!("{} bytes wanted at offset {pos}, file too short", buf.len()),
            }
        } else {
            DatanodeError::io("read", path, e)
        }
    })
}

/// Truncates a replica to `len` bytes: the block file to `len`, the metadata file to the
/// checksums covering it, and a partial last chunk's checksum recomputed from the data.
/// Neither file is synced here; callers fsync both afterwards.
pub fn truncate_replica(
    block: &File,
    block_path: &Path,
    meta: &File,
    meta_path: &Path,
    header: MetaHeader,
    len: u64,
) -> Result<()> {
    block.set_len(len).ctx("truncate", block_path)?;
    meta.set_len(header.meta_len(len))
        .ctx("truncate", meta_path)?;
    let bpc = header.bytes_per_checksum as u64;
    let tail = len % bpc;
    if tail != 0 {
        let start = len - tail;
        let mut data = vec![0u8; tail as usize];
        read_exact_at(block, &mut data, start, block_path)?;
        let sum = checksum::crc(&data).to_be_bytes();
        meta.write_all_at(&sum, MetaHeader::checksum_pos(start / bpc))
            .ctx("write", meta_path)?;
    }
    Ok(())
}

/// Checks that the stored checksum of the chunk `[start, start + data.len())` matches.
pub fn chunk_matches(meta: &File, meta_path: &Path, bpc: u32, start: u64, data: &[u8]) -> bool {
    let mut sum = [0u8; CHECKSUM_SIZE];
    if read_exact_at(
        meta,
        &mut sum,
        MetaHeader::checksum_pos(start / bpc as u64),
        meta_path,
    )
    .is_err()
    {
        return false;
    }
    u32::from_be_bytes(sum) == checksum::crc(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_damage_is_named() {
        let h = MetaHeader {
            bytes_per_checksum: 512,
        };
        let p = Path::new("/x/blk_1_1.meta");
        assert_eq!(MetaHeader::decode(&h.encode(), p).unwrap(), h);
        let mut bad = h.encode();
        bad[2] = 1;
        let err = MetaHeader::decode(&bad, p).unwrap_err();
        assert!(err.to_string().contains("checksum type"), "{err}");
        assert!(MetaHeader::decode(&bad[..3], p).is_err());
        assert_eq!(h.meta_len(0), 7);
        assert_eq!(h.meta_len(513), 15);
        assert_eq!(h.covered_len(15), 1024);
    }

    #[test]
    fn truncate_recomputes_the_partial_last_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let (bp, mp) = (dir.path().join("blk"), dir.path().join("meta"));
        let data: Vec<u8> = (0..2000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&bp, &data).unwrap();
        let h = MetaHeader {
            bytes_per_checksum: 512,
        };
        let mut m = h.encode().to_vec();
        m.extend(checksum::compute(&data, 512));
        std::fs::write(&mp, &m).unwrap();
        let (b, mf) = (
            File::options().read(true).write(true).open(&bp).unwrap(),
            File::options().read(true).write(true).open(&mp).unwrap(),
        );
        truncate_replica(&b, &bp, &mf, &mp, h, 700).unwrap();
        assert_eq!(std::fs::metadata(&bp).unwrap().len(), 700);
        let sums = read_checksums(&mf, 0, 2, &mp).unwrap();
        assert_eq!(sums, checksum::compute(&data[..700], 512));
        assert_eq!(std::fs::metadata(&mp).unwrap().len(), 15);
        assert!(chunk_matches(&mf, &mp, 512, 512, &data[512..700]));
    }
}
