//! Speed of the per-chunk CRC32C checksums: the old loop (`crc32c::crc32c` once per chunk, one
//! chunk after another) against `sluice_common::checksum::compute_into` (several chunks in flight
//! on x86-64 with SSE4.2), over a 64 MiB buffer of random bytes checksummed in runs of 1 MiB and
//! of 64 KiB, 512 bytes per checksum (mostly from memory: the buffer is larger than the caches);
//! then, for the CPU cost alone, 64 KiB runs over the buffer's first 256 KiB again and again
//! (in the L2 cache), 64 MiB in all. Each figure is the median of 9 passes; the two are timed
//! alternately in the same process, so the machine's load weighs on both alike.
//!
//! Run it in release (single-threaded; it takes a few seconds):
//!
//! ```text
//! cargo run --release -p sluice-common --example crc_speed
//! ```
//!
//! An argument sets another number of bytes per checksum: `... --example crc_speed -- 4096`.
#![allow(clippy::print_stdout)] // a command-line report

use std::hint::black_box;
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};
use sluice_common::checksum;

const BUFFER: usize = 64 << 20;
const PASSES: usize = 9;

/// Before: one `crc32c::crc32c` per chunk.
fn old_compute_into(data: &[u8], bytes_per_checksum: u32, out: &mut Vec<u8>) {
    out.reserve(checksum::checksum_len(data.len(), bytes_per_checksum));
    for chunk in data.chunks(bytes_per_checksum as usize) {
        out.extend_from_slice(&crc32c::crc32c(chunk).to_be_bytes());
    }
}

/// Time of one pass over `data` in runs of `run` bytes, `BUFFER / data.len()` times, each run
/// checksummed by `f` into a cleared buffer (as a packet is built).
fn pass(
    data: &[u8],
    run: usize,
    bytes_per_checksum: u32,
    f: fn(&[u8], u32, &mut Vec<u8>),
    out: &mut Vec<u8>,
) -> Duration {
    let start = Instant::now();
    for _ in 0..BUFFER / data.len() {
        for piece in data.chunks(run) {
            out.clear();
            f(black_box(piece), bytes_per_checksum, out);
            black_box(&out);
        }
    }
    start.elapsed()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn gb_per_s(bytes: usize, time: Duration) -> f64 {
    bytes as f64 / time.as_secs_f64() / 1e9
}

fn main() {
    let bpc: u32 = match std::env::args().nth(1) {
        Some(arg) => arg.parse().expect("bytes per checksum: a positive integer"),
        None => checksum::DEFAULT_BYTES_PER_CHECKSUM,
    };
    assert!(bpc > 0, "bytes per checksum: a positive integer");
    let mut data = vec![0u8; BUFFER];
    rand::rngs::StdRng::seed_from_u64(1).fill_bytes(&mut data);
    let mut out = Vec::new();

    // Both give the same bytes.
    let mut old = Vec::new();
    old_compute_into(&data, bpc, &mut old);
    checksum::compute_into(&data, bpc, &mut out);
    assert_eq!(
        old, out,
        "compute_into differs from crc32c::crc32c per chunk"
    );

    println!(
        "CRC32C of {} MiB, {bpc} bytes per checksum, median of {PASSES} passes",
        BUFFER >> 20
    );
    for (window, run, what) in [
        (BUFFER, 1 << 20, "runs of 1 MiB  "),
        (BUFFER, 64 << 10, "runs of 64 KiB "),
        (256 << 10, 64 << 10, "in cache 64 KiB"),
    ] {
        let data = &data[..window];
        // Warm up (page faults, caches, frequency), then alternate the two.
        pass(data, run, bpc, old_compute_into, &mut out);
        pass(data, run, bpc, checksum::compute_into, &mut out);
        let mut old_times = Vec::with_capacity(PASSES);
        let mut new_times = Vec::with_capacity(PASSES);
        for _ in 0..PASSES {
            old_times.push(pass(data, run, bpc, old_compute_into, &mut out));
            new_times.push(pass(data, run, bpc, checksum::compute_into, &mut out));
        }
        let old = gb_per_s(BUFFER, median(old_times));
        let new = gb_per_s(BUFFER, median(new_times));
        println!(
            "{what}: per-chunk crc32c {old:6.2} GB/s, compute_into {new:6.2} GB/s, {:.2}x",
            new / old
        );
    }
}
