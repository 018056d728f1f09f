//! Client throughput against the in-memory fake DataNode (which verifies every checksum):
//! a measure of the client's own cost, not of a cluster. Run with
//! `cargo test -p sluice-client --test it -- throughput:: --ignored --nocapture`.

use crate::support::*;
use sluice_client::{ReadMode, ReadOptions, WriteOptions};
use sluice_common::config::ByteSize;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement, prints MB/s"]
async fn write_and_read_throughput_against_the_fake() {
    within(300, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let mut cfg = config(&meta);
        cfg.write_packet_size = ByteSize::kib(64);
        cfg.read_piece_bytes = ByteSize::mib(1);
        cfg.read_buffer_bytes = ByteSize::mib(32);
        cfg.read_chunk_size = ByteSize::mib(4);
        let fs = connect(cfg).await;
        let size = 256usize << 20;
        let chunk = random_bytes(1 << 20, 1);
        let opts = WriteOptions {
            block_size: Some(64 << 20),
            ..Default::default()
        };
        let t = Instant::now();
        let mut w = fs.create("/big", opts).await.unwrap();
        for _ in 0..size / chunk.len() {
            w.write_all(&chunk).await.unwrap();
        }
        w.close().await.unwrap();
        let mbs = |secs: f64| size as f64 / (1 << 20) as f64 / secs;
        println!("write: {:.0} MiB/s", mbs(t.elapsed().as_secs_f64()));
        for m in [ReadMode::Stream, ReadMode::Chunk] {
            let opts = ReadOptions {
                mode: Some(m),
                ..Default::default()
            };
            let mut r = fs.open_with("/big", opts).await.unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let t = Instant::now();
            let mut total = 0;
            loop {
                let n = r.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                total += n;
            }
            assert_eq!(total, size);
            println!("read {m:?}: {:.0} MiB/s", mbs(t.elapsed().as_secs_f64()));
        }
    })
    .await;
}
