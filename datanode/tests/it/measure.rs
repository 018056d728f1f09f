//! Measurements, not assertions of speed: run with
//! `cargo test -p sluice-datanode --release --test it -- measure:: --ignored --nocapture`.
//! Prints pipeline write throughput, block-file write calls per MiB, and streaming vs classic
//! read throughput on loopback.

#![allow(clippy::unwrap_used)]

use crate::support::*;
use sluice_common::config::ByteSize;
use sluice_common::Status;
use std::time::Instant;

const MIB: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run explicitly"]
async fn measure_write_and_read_paths() {
    within(600, async {
        let (meta_addr, _) = fake_meta().await;
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let tmp = tempfile::tempdir().unwrap();
            let dirs = vec![tmp.path().to_path_buf()];
            let mut cfg = config(meta_addr, &dirs);
            cfg.max_frame_bytes = ByteSize::mib(16);
            cfg.read_piece_bytes = ByteSize::mib(1);
            let mut n = Node::start_on(meta_addr, dirs, Some(cfg)).await;
            n._tmp = Some(tmp);
            nodes.push(n);
        }
        let (blocks, size) = (8usize, 16 * MIB);
        let data = random_bytes(size, 1);
        let t = Instant::now();
        for i in 0..blocks {
            let targets = vec![nodes[1].id(), nodes[2].id()];
            write_block(nodes[0].addr(), targets, block(100 + i as u64, 1, 0), &data).await;
        }
        let secs = t.elapsed().as_secs_f64();
        let mib = (blocks * size / MIB) as f64;
        eprintln!("write: {blocks} blocks x {} MiB through 3 DataNodes, 64 KiB packets: {:.1} MiB/s", size / MIB, mib / secs);
        for (i, n) in nodes.iter().enumerate() {
            let m = n.dn().metrics();
            eprintln!(
                "  dn{i}: block-file write calls {} = {:.1} per MiB; meta write calls {:.1} per MiB; fsyncs {}",
                m.block_file_writes.get(),
                m.block_file_writes.get() as f64 / mib,
                m.meta_file_writes.get() as f64 / mib,
                m.fsyncs.get()
            );
        }
        let b = block(100, 1, size as u64);
        let t = Instant::now();
        for _ in 0..4 {
            let (_, got) = read_block(nodes[0].addr(), b, 0, u64::MAX).await;
            assert_eq!(got.len(), size);
        }
        let stream = 4.0 * (size / MIB) as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..4 {
            let mut c = Client::connect(nodes[0].addr()).await;
            let mut off = 0u64;
            while off < size as u64 {
                let (r, piece) = read_chunk(&mut c, b, off, 4 * MIB as u64).await;
                assert_eq!(r.status, Status::Success);
                off += piece.len() as u64;
            }
        }
        let classic = 4.0 * (size / MIB) as f64 / t.elapsed().as_secs_f64();
        eprintln!("read {} MiB x4: ReadBlock (1 MiB pieces) {stream:.1} MiB/s; ReadChunk (4 MiB, one request each) {classic:.1} MiB/s", size / MIB);
        let m = nodes[0].dn().metrics();
        eprintln!("  prefetch advised {} MiB, dropped behind {} MiB", m.prefetch_advised_bytes.get() / MIB as u64, m.dropbehind_bytes.get() / MIB as u64);
    })
    .await
}
