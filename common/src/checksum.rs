//! CRC32C checksums, one per checksum chunk of `bytes_per_checksum` bytes (512 by default, as
//! HDFS). On the wire and on disk a checksum is 4 bytes, big-endian; a run of data carries the
//! checksums of its chunks back to back, the last chunk possibly short.
//!
//! A run's chunks are independent, so on x86-64 with SSE4.2, for chunks shorter than 768 bytes
//! (512 by default), [`compute_into`] and [`verify`] work on three chunks at once, one `crc32`
//! instruction on 8 bytes of each in turn: the CPU's crc32 unit is then throughput-bound (one a
//! cycle) rather than latency-bound (3 cycles) as a lone short chunk is. Elsewhere they
//! checksum chunk by chunk with the `crc32c` crate, which splits inputs of 768 bytes or more in
//! three itself; both give the same bits.

use std::ops::ControlFlow;

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
    let done: ControlFlow<std::convert::Infallible> =
        for_each_crc(data, bytes_per_checksum as usize, |_, crc| {
            out.extend_from_slice(&crc.to_be_bytes());
            ControlFlow::Continue(())
        });
    let ControlFlow::Continue(()) = done;
}

/// Writes the checksums of `data`'s chunks into `out`, which must be exactly
/// [`checksum_len`] bytes long.
///
/// # Panics
/// When `out` has another length (a caller's bug, never input).
pub fn compute_to(data: &[u8], bytes_per_checksum: u32, out: &mut [u8]) {
    assert_eq!(
        out.len(),
        checksum_len(data.len(), bytes_per_checksum),
        "checksum slot length"
    );
    let done: ControlFlow<std::convert::Infallible> =
        for_each_crc(data, bytes_per_checksum as usize, |i, crc| {
            let at = i * CHECKSUM_SIZE;
            out[at..at + CHECKSUM_SIZE].copy_from_slice(&crc.to_be_bytes());
            ControlFlow::Continue(())
        });
    let ControlFlow::Continue(()) = done;
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
    let checked = for_each_crc(data, bytes_per_checksum as usize, |i, actual| {
        let expected = checksum_at(sums, i).unwrap_or_default();
        if actual == expected {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(ChecksumError::Mismatch {
                offset: block_offset + (i as u64) * bytes_per_checksum as u64,
                expected,
                actual,
            })
        }
    });
    match checked {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(e) => Err(e),
    }
}

/// Calls `f` with the index and CRC32C of each of `data`'s chunks, in order, until it breaks.
fn for_each_crc<B>(
    data: &[u8],
    bytes_per_checksum: usize,
    f: impl FnMut(usize, u32) -> ControlFlow<B>,
) -> ControlFlow<B> {
    #[cfg(target_arch = "x86_64")]
    {
        x86::for_each_crc(data, bytes_per_checksum, f)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        for_each_crc_portable(data, bytes_per_checksum, f)
    }
}

/// [`for_each_crc`] one chunk at a time with the `crc32c` crate: without SSE4.2, or off x86-64.
fn for_each_crc_portable<B>(
    data: &[u8],
    bytes_per_checksum: usize,
    mut f: impl FnMut(usize, u32) -> ControlFlow<B>,
) -> ControlFlow<B> {
    data.chunks(bytes_per_checksum)
        .enumerate()
        .try_for_each(|(i, chunk)| f(i, crc(chunk)))
}

/// Several chunks at once with SSE4.2's `crc32` instruction.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8, _mm_prefetch, _MM_HINT_T0};
    use std::ops::ControlFlow;

    /// Chunks in flight: enough independent `crc32`s to cover the instruction's latency (3
    /// cycles, one issued a cycle). 4 and 5 measured no faster (`examples/crc_speed.rs`).
    pub(super) const LANES: usize = 3;

    /// Chunks this long or longer go to `crc32c::crc32c`, which from 3 × 256 bytes on runs
    /// three streams within the chunk itself (as fast, and faster from memory, than
    /// [`interleaved`] at 768 to 4096 bytes; at 64 KiB a run may hold a single chunk).
    pub(super) const INTERLEAVE_BELOW: usize = 768;

    /// [`super::for_each_crc`], interleaved if the chunks are short and the CPU has SSE4.2
    /// (`is_x86_feature_detected!` caches its answer: one relaxed atomic load), else chunk by
    /// chunk.
    pub(super) fn for_each_crc<B>(
        data: &[u8],
        bytes_per_checksum: usize,
        f: impl FnMut(usize, u32) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        if bytes_per_checksum < INTERLEAVE_BELOW && is_x86_feature_detected!("sse4.2") {
            interleaved_checked(data, bytes_per_checksum, f)
        } else {
            super::for_each_crc_portable(data, bytes_per_checksum, f)
        }
    }

    /// Calls [`interleaved`]; only once the CPU is known to have SSE4.2.
    #[allow(unsafe_code)] // calling the `#[target_feature(enable = "sse4.2")]` function
    fn interleaved_checked<B>(
        data: &[u8],
        bytes_per_checksum: usize,
        f: impl FnMut(usize, u32) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        debug_assert!(is_x86_feature_detected!("sse4.2"));
        // SAFETY: `interleaved`'s only requirement is the target feature it enables, SSE4.2,
        // which the sole caller, `for_each_crc`, has just found this CPU has.
        unsafe { interleaved(data, bytes_per_checksum, f) }
    }

    /// [`super::for_each_crc`]: the full chunks [`LANES`] at a time, then the rest of them
    /// two at a time, then one by one with the short last chunk if any.
    #[target_feature(enable = "sse4.2")]
    fn interleaved<B>(
        data: &[u8],
        bytes_per_checksum: usize,
        mut f: impl FnMut(usize, u32) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        let bpc = bytes_per_checksum;
        let (full, short) = data.split_at(data.len() / bpc * bpc);
        let mut index = 0;
        let mut groups = full.chunks_exact(LANES * bpc);
        for group in &mut groups {
            for crc in lanes::<LANES>(group, bpc) {
                f(index, crc)?;
                index += 1;
            }
        }
        let mut pairs = groups.remainder().chunks_exact(2 * bpc);
        for pair in &mut pairs {
            for crc in lanes::<2>(pair, bpc) {
                f(index, crc)?;
                index += 1;
            }
        }
        for chunk in pairs.remainder().chunks_exact(bpc).chain([short]) {
            if !chunk.is_empty() {
                f(index, super::crc(chunk))?;
                index += 1;
            }
        }
        ControlFlow::Continue(())
    }

    /// The CRC32Cs of the `N` chunks of `len` bytes that make up `group`, each step one `crc32`
    /// on the next 8 bytes of every chunk.
    ///
    /// First it prefetches the next group (the `N * len` bytes after `group`, which are short:
    /// `len` < [`INTERLEAVE_BELOW`]): the hardware prefetchers do not follow these `N` streams
    /// well, and from memory (data not in the caches) 3 lanes without it ran at 0.75x the
    /// speed of one chunk at a time, and at 1.2x with a prefetch each cache line 4 KiB ahead
    /// in each lane, against 1.7x with this. Prefetching past the end of the data is harmless:
    /// a prefetch never faults.
    #[inline]
    #[target_feature(enable = "sse4.2")]
    fn lanes<const N: usize>(group: &[u8], len: usize) -> [u32; N] {
        debug_assert_eq!(group.len(), N * len);
        // Plain loops rather than `array::from_fn` or `map`, whose closures were not inlined.
        let mut chunks: [&[u8]; N] = [&[]; N];
        for (lane, chunk) in chunks.iter_mut().zip(group.chunks_exact(len)) {
            *lane = chunk;
        }
        let line_count = len / 64;
        let mut lines: [&[[u8; 64]]; N] = [&[]; N];
        for (lane, chunk) in lines.iter_mut().zip(chunks) {
            *lane = &chunk.as_chunks::<64>().0[..line_count];
        }
        let mut state = [u64::from(u32::MAX); N];
        let next = group.as_ptr().wrapping_add(N * len);
        for off in (0..N * len).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(off).cast::<i8>());
        }
        for i in 0..line_count {
            for w in 0..8 {
                for (s, lane) in state.iter_mut().zip(lines) {
                    let word = lane[i].as_chunks::<8>().0[w];
                    *s = _mm_crc32_u64(*s, u64::from_le_bytes(word));
                }
            }
        }
        let word_count = (len % 64) / 8;
        let mut words: [&[[u8; 8]]; N] = [&[]; N];
        for (lane, chunk) in words.iter_mut().zip(chunks) {
            *lane = &chunk[line_count * 64..].as_chunks::<8>().0[..word_count];
        }
        for w in 0..word_count {
            for (s, lane) in state.iter_mut().zip(words) {
                *s = _mm_crc32_u64(*s, u64::from_le_bytes(lane[w]));
            }
        }
        let tail = line_count * 64 + word_count * 8;
        for b in tail..len {
            for (s, lane) in state.iter_mut().zip(chunks) {
                *s = u64::from(_mm_crc32_u8(*s as u32, lane[b]));
            }
        }
        let mut crcs = [0; N];
        for (crc, s) in crcs.iter_mut().zip(state) {
            *crc = !(s as u32);
        }
        crcs
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, RngCore, SeedableRng};

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
    fn compute_to_fills_a_slot_as_compute_appends() {
        let mut rng = StdRng::seed_from_u64(7);
        for len in [0usize, 1, 511, 512, 513, 4096, 65_536 + 300] {
            let mut data = vec![0u8; len];
            rng.fill_bytes(&mut data);
            let mut slot = vec![0xAAu8; checksum_len(len, 512)];
            compute_to(&data, 512, &mut slot);
            assert_eq!(slot, compute(&data, 512), "{len} bytes");
        }
    }

    /// Per-chunk `crc32c::crc32c`, as the code was before the interleaving.
    fn reference(data: &[u8], bytes_per_checksum: u32) -> Vec<u8> {
        data.chunks(bytes_per_checksum as usize)
            .flat_map(|chunk| crc32c::crc32c(chunk).to_be_bytes())
            .collect()
    }

    /// Chunks worth corrupting: the first ones (every lane of the first groups, and of the pairs
    /// and singles after the groups), the last ones (the short one if any), a few at random.
    fn chunks_to_corrupt(count: usize, rng: &mut impl Rng) -> Vec<usize> {
        let mut picks: Vec<usize> = (0..2 * x86_lanes() + 2).collect();
        picks.extend((0..2 * x86_lanes() + 2).map(|back| count.wrapping_sub(1 + back)));
        picks.extend((0..4).map(|_| rng.random_range(0..count.max(1))));
        picks.retain(|&i| i < count);
        picks.sort_unstable();
        picks.dedup();
        picks
    }

    fn x86_lanes() -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            x86::LANES
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            3
        }
    }

    #[test]
    fn compute_and_verify_match_per_chunk_crc32c() {
        let mut rng = StdRng::seed_from_u64(0x5_1u64 << 32 | 0xC3C3);
        let bpcs = [1u32, 3, 8, 63, 64, 65, 100, 512, 767, 768, 4096, 65536];
        let mut lens = vec![
            0usize,
            1,
            7,
            8,
            9,
            63,
            64,
            65,
            511,
            512,
            513,
            2 * 512,
            3 * 512 - 1,
            3 * 512,
            3 * 512 + 1,
            4 * 512 + 100,
            5 * 512 + 7,
            64 << 10,
            (1 << 20) + 5,
        ];
        lens.extend((0..12).map(|_| rng.random_range(0..300_000)));
        let mut buffer = vec![0u8; (1 << 20) + 5];
        rng.fill_bytes(&mut buffer);
        for &bpc in &bpcs {
            // Around one, two, three... chunks of this size, and around the lane groups.
            let mut lens = lens.clone();
            for chunks in 1..=2 * x86_lanes() + 2 {
                let n = chunks * bpc as usize;
                lens.extend([n - 1, n, n + 1]);
            }
            // A million chunks of 1 or 3 bytes add time and nothing else (debug builds).
            lens.retain(|&len| bpc >= 64 || len <= 70_000);
            for &len in &lens {
                let data = &buffer[..len];
                let want = reference(data, bpc);
                let sums = compute(data, bpc);
                assert_eq!(sums, want, "compute, len {len}, bpc {bpc}");
                let mut appended = vec![0xAB];
                compute_into(data, bpc, &mut appended);
                assert_eq!(
                    appended[1..],
                    want[..],
                    "compute_into, len {len}, bpc {bpc}"
                );
                let portable: Vec<u8> = {
                    let mut out = Vec::new();
                    let done: ControlFlow<()> =
                        for_each_crc_portable(data, bpc as usize, |_, crc| {
                            out.extend_from_slice(&crc.to_be_bytes());
                            ControlFlow::Continue(())
                        });
                    assert_eq!(done, ControlFlow::Continue(()));
                    out
                };
                assert_eq!(portable, want, "portable, len {len}, bpc {bpc}");
                verify(data, &sums, bpc, 7 << 20).expect("valid");

                // Huge chunk counts with tiny chunks: fewer corruptions keep the test short.
                let count = chunk_count(len, bpc);
                for i in chunks_to_corrupt(count, &mut rng) {
                    let start = i * bpc as usize;
                    let end = (start + bpc as usize).min(len);
                    let at = rng.random_range(start..end);
                    let mut bad = data.to_vec();
                    bad[at] ^= 1 << rng.random_range(0..8);
                    let expected = checksum_at(&want, i).expect("in range");
                    let actual = crc32c::crc32c(&bad[start..end]);
                    assert_eq!(
                        verify(&bad, &sums, bpc, 7 << 20),
                        Err(ChecksumError::Mismatch {
                            offset: (7 << 20) + start as u64,
                            expected,
                            actual,
                        }),
                        "byte {at} (chunk {i} of {count}), len {len}, bpc {bpc}"
                    );
                    // A second bad chunk after it: the first is still the one named.
                    if i + 1 < count {
                        bad[(start + bpc as usize + 1).min(len - 1)] ^= 0x80;
                        assert!(
                            matches!(
                                verify(&bad, &sums, bpc, 7 << 20),
                                Err(ChecksumError::Mismatch { offset, .. })
                                    if offset == (7 << 20) + start as u64
                            ),
                            "two bad chunks from {i}, len {len}, bpc {bpc}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn verify_names_the_exact_length_error() {
        let data = [7u8; 1300];
        let sums = compute(&data, 512);
        for short in [0, 4, 8, 11, 13, 16] {
            let sums = if short <= sums.len() {
                sums[..short].to_vec()
            } else {
                [&sums[..], &[0u8; 4][..]].concat()
            };
            assert_eq!(
                verify(&data, &sums, 512, 99),
                Err(ChecksumError::Length {
                    offset: 99,
                    expected: 12,
                    actual: sums.len(),
                })
            );
        }
        assert_eq!(verify(&[], &[], 512, 0), Ok(()));
        assert!(compute(&[], 512).is_empty());
    }

    #[test]
    fn crc32c_known_vector() {
        // RFC 3720 test vector: 32 bytes of zeros.
        assert_eq!(crc(&[0u8; 32]), 0x8A91_36AA);
    }
}
