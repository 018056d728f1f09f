//! CRC32C checksums, one per checksum chunk of `bytes_per_checksum` bytes (512 by default, as
//! HDFS). On the wire and on disk a checksum is 4 bytes, big-endian; a run of data carries the
//! checksums of its chunks back to back, the last chunk possibly short.

use crate::error::ChecksumError;

/// HDFS's default chunk size for checksums.
pub const DEFAULT_BYTES_PER_CHECKSUM: u32 = 512;

/// Size of one checksum on the wire and on disk.
pub const CHECKSUM_SIZE: usize = 4;

/// Number of checksum chunks covering `len` bytes.
pub fn chunk_count(len: usize, bytes_per_checksum: u32) -> usize {
    len.div_ceil(bytes_per_checksum as usize)
}

/// Bytes of checksums covering `len` bytes of data.
pub fn checksum_len(len: usize, bytes_per_checksum: u32) -> usize {
    chunk_count(len, bytes_per_checksum) * CHECKSUM_SIZE
}

/// The CRC32C of one chunk.
pub fn crc(chunk: &[u8]) -> u32 {
    crc32c::crc32c(chunk)
}

/// Appends the checksums of `data`'s chunks to `out`.
pub fn compute_into(data: &[u8], bytes_per_checksum: u32, out: &mut Vec<u8>) {
    out.reserve(checksum_len(data.len(), bytes_per_checksum));
    for chunk in data.chunks(bytes_per_checksum as usize) {
        out.extend_from_slice(&crc(chunk).to_be_bytes());
    }
}

/// The checksums of `data`'s chunks.
pub fn compute(data: &[u8], bytes_per_checksum: u32) -> Vec<u8> {
    let mut out = Vec::new();
    compute_into(data, bytes_per_checksum, &mut out);
    out
}

/// Reads checksum `index` out of a run of checksums.
pub fn checksum_at(sums: &[u8], index: usize) -> Option<u32> {
    let b = sums.get(index * CHECKSUM_SIZE..(index + 1) * CHECKSUM_SIZE)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Verifies `data` against `sums`. `data` must start on a chunk boundary; `block_offset` is
/// where it starts in the block and only serves the error, which names the first bad chunk.
pub fn verify(
    data: &[u8],
    sums: &[u8],
    bytes_per_checksum: u32,
    block_offset: u64,
) -> Result<(), ChecksumError> {
    let expected_len = checksum_len(data.len(), bytes_per_checksum);
    if sums.len() != expected_len {
        return Err(ChecksumError::Length {
            offset: block_offset,
            expected: expected_len,
            actual: sums.len(),
        });
    }
    for (i, chunk) in data.chunks(bytes_per_checksum as usize).enumerate() {
        let actual = crc(chunk);
        let expected = checksum_at(sums, i).unwrap_or_default();
        if actual != expected {
            return Err(ChecksumError::Mismatch {
                offset: block_offset + (i as u64) * bytes_per_checksum as u64,
                expected,
                actual,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_cover_partial_chunks() {
        assert_eq!(chunk_count(0, 512), 0);
        assert_eq!(chunk_count(1, 512), 1);
        assert_eq!(chunk_count(512, 512), 1);
        assert_eq!(chunk_count(513, 512), 2);
        assert_eq!(checksum_len(65536, 512), 512);
    }

    #[test]
    fn verify_accepts_good_and_names_the_bad_chunk() {
        let data: Vec<u8> = (0..1300u32).map(|i| (i % 251) as u8).collect();
        let sums = compute(&data, 512);
        assert_eq!(sums.len(), 12);
        verify(&data, &sums, 512, 4096).expect("valid");
        let mut bad = data.clone();
        bad[700] ^= 1;
        match verify(&bad, &sums, 512, 4096) {
            Err(ChecksumError::Mismatch { offset, .. }) => assert_eq!(offset, 4096 + 512),
            other => panic!("expected mismatch, got {other:?}"),
        }
        assert!(matches!(
            verify(&data, &sums[..8], 512, 0),
            Err(ChecksumError::Length { .. })
        ));
    }

    #[test]
    fn crc32c_known_vector() {
        // RFC 3720 test vector: 32 bytes of zeros.
        assert_eq!(crc(&[0u8; 32]), 0x8A91_36AA);
    }
}
