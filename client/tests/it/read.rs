//! Read-path protocol tests against a fake metadata service and fake DataNodes.

use crate::support::*;
use sluice_client::{ClientError, ReadMode, ReadOptions, WriteOptions};
use sluice_common::config::HumanDuration;
use sluice_common::Status;
use std::io::SeekFrom;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

fn mode(m: ReadMode) -> ReadOptions {
    ReadOptions {
        mode: Some(m),
        ..ReadOptions::default()
    }
}

#[tokio::test]
async fn stream_and_chunk_modes_read_back_what_was_written() {
    within(30, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let fs = connect(config(&meta)).await;
        let data = random_bytes(3 * 4096 + 1234, 9);
        let wopts = WriteOptions {
            block_size: Some(4096),
            ..WriteOptions::default()
        };
        let mut w = fs.create("/rt", wopts).await.unwrap();
        w.write_all(&data).await.unwrap();
        w.close().await.unwrap();
        for m in [ReadMode::Stream, ReadMode::Chunk] {
            let mut r = fs.open_with("/rt", mode(m)).await.unwrap();
            assert_eq!(r.len(), data.len() as u64);
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            assert!(got == data, "{m:?} read differs");
            // read_at across a block boundary, without moving the stream.
            let mut buf = vec![0u8; 3000];
            assert_eq!(r.read_at(3000, &mut buf).await.unwrap(), 3000);
            assert_eq!(buf, data[3000..6000]);
            assert_eq!(r.position(), data.len() as u64);
            let n = r.read_at(data.len() as u64 - 10, &mut buf).await.unwrap();
            assert_eq!(n, 10);
        }
        assert!(dn.st().chunk_ops >= 4, "chunk mode uses ReadChunk");
    })
    .await;
}

#[tokio::test]
async fn seeks_inside_the_buffer_stay_off_the_network_and_past_eof_fails() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let data = random_bytes(4000, 3);
        seed_file(&meta, "/s", &[(&data, &[&dn])]);
        let mut cfg = config(&meta);
        cfg.read_buffer_bytes = sluice_common::config::ByteSize::kib(8);
        let fs = connect(cfg).await;
        let mut r = fs.open("/s").await.unwrap();
        let mut buf = [0u8; 100];
        r.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf[..], &data[..100]);
        // Forward seeks within what the stream delivers (at most a piece past the buffer).
        r.seek(SeekFrom::Start(1500)).await.unwrap();
        r.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf[..], &data[1500..1600]);
        r.seek(SeekFrom::Current(300)).await.unwrap();
        r.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf[..], &data[1900..2000]);
        assert_eq!(
            dn.st().read_ops,
            1,
            "forward seeks within the stream reuse it"
        );
        // A backward seek outside the buffer starts a new stream.
        r.seek(SeekFrom::Start(10)).await.unwrap();
        r.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf[..], &data[10..110]);
        assert_eq!(dn.st().read_ops, 2);
        // Past EOF: an error, position unchanged. At EOF: fine, and reads return 0.
        let pos = r.stream_position().await.unwrap();
        let err = r.seek(SeekFrom::Start(4001)).await.expect_err("past EOF");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(r.stream_position().await.unwrap(), pos);
        assert_eq!(r.seek(SeekFrom::End(0)).await.unwrap(), 4000);
        assert_eq!(r.read(&mut buf).await.unwrap(), 0);
    })
    .await;
}

#[tokio::test]
async fn out_of_range_surfaces_at_once_with_its_status() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let data = random_bytes(2000, 4);
        seed_file(&meta, "/oor", &[(&data, &[&dn])]);
        dn.st().visible.insert(900, 0); // the replica has nothing readable
        let mut cfg = config(&meta);
        cfg.socket_timeout = HumanDuration::secs(30);
        let fs = connect(cfg).await;
        for m in [ReadMode::Stream, ReadMode::Chunk] {
            let mut r = fs.open_with("/oor", mode(m)).await.unwrap();
            let started = Instant::now();
            let mut buf = [0u8; 10];
            let err = r.read(&mut buf).await.expect_err("out of range");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "no timeout wait"
            );
            let inner = err
                .get_ref()
                .and_then(|e| e.downcast_ref::<ClientError>())
                .unwrap();
            assert!(
                matches!(
                    inner,
                    ClientError::Datanode {
                        status: Status::ErrorOutOfRange,
                        ..
                    }
                ),
                "{inner:?}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_corrupt_replica_is_reported_and_the_read_fails_over() {
    within(20, async {
        let bad = start_dn("bad").await;
        let good = start_dn("good").await;
        let meta = start_meta(vec![]).await;
        let data = random_bytes(3000, 5);
        seed_file(&meta, "/c", &[(&data, &[&bad, &good])]);
        bad.st().corrupt_reads = true;
        let fs = connect(config(&meta)).await;
        for m in [ReadMode::Stream, ReadMode::Chunk] {
            let mut r = fs.open_with("/c", mode(m)).await.unwrap();
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            assert!(got == data, "{m:?}");
        }
        let r = fs.open("/c").await.unwrap();
        let mut buf = vec![0u8; 100];
        r.read_at(1000, &mut buf).await.unwrap();
        assert_eq!(buf, data[1000..1100]);
        let reports = meta.st().bad_reports.clone();
        assert_eq!(reports.len(), 3);
        assert!(reports.iter().all(|b| b.node == bad.id.node_id));
    })
    .await;
}

#[tokio::test]
async fn a_truncated_piece_is_a_checksum_error_naming_the_replica_and_is_read_around() {
    within(20, async {
        let short = start_dn("short").await;
        let good = start_dn("good").await;
        let meta = start_meta(vec![]).await;
        let data = random_bytes(3000, 13);
        seed_file(&meta, "/t", &[(&data, &[&short, &good])]);
        seed_file(&meta, "/t1", &[(&data, &[&short])]);
        short.st().truncate_reads = true;
        let fs = connect(config(&meta)).await;
        for m in [ReadMode::Stream, ReadMode::Chunk] {
            let mut r = fs.open_with("/t", mode(m)).await.unwrap();
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            assert!(got == data, "{m:?}");
            assert_eq!(r.stats().reported_bad, 1, "{m:?}");
            assert_eq!(r.stats().excluded, vec![short.id.node_id.clone()]);
            // With no other replica the error surfaces, naming the replica.
            let mut r = fs.open_with("/t1", mode(m)).await.unwrap();
            let mut buf = [0u8; 10];
            let err = r.read(&mut buf).await.expect_err("truncated");
            let inner = err
                .get_ref()
                .and_then(|e| e.downcast_ref::<ClientError>())
                .unwrap();
            match inner {
                ClientError::Checksum { node, source, .. } => {
                    assert!(node.contains("short"), "{node}");
                    assert!(
                        matches!(source, sluice_common::ChecksumError::Length { .. }),
                        "{source:?}"
                    );
                }
                other => panic!("{m:?}: {other:?}"),
            }
        }
        assert!(meta
            .st()
            .bad_reports
            .iter()
            .all(|b| b.node == short.id.node_id));
    })
    .await;
}

#[tokio::test]
async fn every_replica_corrupt_gives_a_checksum_error_naming_block_offset_and_node() {
    within(20, async {
        let bad = start_dn("bad1").await;
        let meta = start_meta(vec![]).await;
        let data = random_bytes(3000, 6);
        seed_file(&meta, "/cc", &[(&data, &[&bad])]);
        bad.st().corrupt_reads = true;
        let fs = connect(config(&meta)).await;
        let mut r = fs.open("/cc").await.unwrap();
        r.seek(SeekFrom::Start(1100)).await.unwrap();
        let mut buf = [0u8; 10];
        let err = r.read(&mut buf).await.expect_err("corrupt");
        let inner = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<ClientError>())
            .unwrap();
        match inner {
            ClientError::Checksum {
                block,
                offset,
                node,
                ..
            } => {
                assert_eq!(block.0, 900);
                assert_eq!(*offset, 1024, "the chunk holding 1100");
                assert!(node.contains("bad1"));
            }
            other => panic!("unexpected {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn a_dead_replica_fails_over_and_a_short_one_hands_over_the_rest() {
    within(20, async {
        let dead = start_dn("dead").await;
        let short = start_dn("short").await;
        let full = start_dn("full").await;
        let meta = start_meta(vec![]).await;
        let data = random_bytes(5000, 7);
        seed_file(&meta, "/f", &[(&data, &[&dead, &short, &full])]);
        dead.st().blocks.clear(); // answers ERROR_NOT_FOUND
        short.st().visible.insert(900, 2048);
        let fs = connect(config(&meta)).await;
        let mut r = fs.open("/f").await.unwrap();
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        assert!(got == data);
        assert!(short.st().read_ops >= 1 && full.st().read_ops >= 1);
    })
    .await;
}

#[tokio::test]
async fn empty_files_read_as_eof_and_a_file_being_written_uses_replica_lengths() {
    within(20, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let fs = connect(config(&meta)).await;
        let mut w = fs.create("/e", WriteOptions::default()).await.unwrap();
        w.close().await.unwrap();
        let mut r = fs.open("/e").await.unwrap();
        assert!(r.is_empty());
        let mut got = Vec::new();
        assert_eq!(r.read_to_end(&mut got).await.unwrap(), 0);

        // Under construction: the metadata service knows 0 bytes of the last block; the
        // DataNode says 1500 are visible.
        let mut w = fs.create("/uc", WriteOptions::default()).await.unwrap();
        let data = random_bytes(1500, 8);
        w.write_all(&data).await.unwrap();
        w.hflush().await.unwrap();
        let mut r = fs.open("/uc").await.unwrap();
        assert_eq!(r.len(), 1500);
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        assert!(got == data);
        w.close().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn opening_a_missing_file_is_a_matchable_meta_error() {
    within(20, async {
        let meta = start_meta(vec![]).await;
        let fs = connect(config(&meta)).await;
        let err = fs.open("/nope").await.expect_err("missing");
        assert!(
            matches!(
                err,
                ClientError::Meta(sluice_common::MetaError::NotFound { .. })
            ),
            "{err:?}"
        );
        assert!(err.is_meta());
    })
    .await;
}

#[tokio::test]
async fn a_stream_dropped_after_progress_is_reopened_on_the_same_replica() {
    within(20, async {
        let dn = start_dn("only").await;
        let meta = start_meta(vec![]).await;
        let data = random_bytes(4000, 12);
        seed_file(&meta, "/cut", &[(&data, &[&dn])]);
        dn.st().cut_stream_after = Some(2);
        let fs = connect(config(&meta)).await;
        let mut r = fs.open("/cut").await.unwrap();
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        assert!(got == data);
        assert_eq!(dn.st().read_ops, 2, "reopened once at the current offset");
    })
    .await;
}

#[tokio::test]
async fn a_broken_metadata_connection_is_reestablished() {
    within(20, async {
        let meta = start_meta(vec![]).await;
        let fs = connect(config(&meta)).await;
        let dn = start_dn("dn1").await;
        seed_file(&meta, "/x", &[(b"abc", &[&dn])]);
        assert_eq!(fs.stat("/x").await.unwrap().length, 3);
        meta.drop_connections.notify_waiters();
        // The first call after the break may see it; an idempotent call is retried on a new
        // connection, so it succeeds.
        assert_eq!(fs.stat("/x").await.unwrap().length, 3);
        assert_eq!(fs.list("/").await.unwrap().len(), 1);
    })
    .await;
}
