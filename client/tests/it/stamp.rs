//! Reads checked end to end: a DataNode answering a read with a replica under another
//! generation stamp than the metadata service gave — in its op response or in any chunk,
//! mid-stream included — is refused, counted, and read around.

use crate::support::*;
use sluice_client::{ClientError, ReadMode, ReadOptions};
use sluice_common::config::ByteSize;
use sluice_common::GenerationStamp;
use tokio::io::AsyncReadExt;

fn mode(m: ReadMode) -> ReadOptions {
    ReadOptions {
        mode: Some(m),
        ..ReadOptions::default()
    }
}

/// The `ClientError` inside an `io::Error` from `AsyncRead`.
fn client_error(e: &std::io::Error) -> &ClientError {
    e.get_ref()
        .and_then(|e| e.downcast_ref::<ClientError>())
        .expect("a ClientError")
}

/// Reads `/f` (seeded at stamp 5 on `bad` then `good`) in both modes and positioned, while
/// `bad` names stamp 6 from its `after`-th chunk on: every read returns the exact bytes, from
/// `good`, and the reader counts the refusal and excludes `bad`.
async fn read_around(after: usize) {
    let bad = start_dn("bad").await;
    let good = start_dn("good").await;
    let meta = start_meta(vec![]).await;
    let data = random_bytes(3000, 21);
    seed_file(&meta, "/f", &[(&data, &[&bad, &good])]);
    let mut cfg = config(&meta);
    cfg.read_piece_bytes = ByteSize(512);
    cfg.read_chunk_size = ByteSize(512);
    let fs = connect(cfg).await;
    for m in [ReadMode::Stream, ReadMode::Chunk] {
        {
            let mut s = bad.st();
            s.chunks_served = 0;
            s.other_stamp = Some((after, GenerationStamp(6)));
        }
        let mut r = fs.open_with("/f", mode(m)).await.unwrap();
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        assert!(got == data, "{m:?}: bytes differ");
        let stats = r.stats();
        assert_eq!(stats.stamp_mismatches, 1, "{m:?}");
        assert_eq!(stats.excluded, vec![bad.id.node_id.clone()], "{m:?}");
        let mut buf = vec![0u8; 2000];
        r.read_at(700, &mut buf).await.unwrap();
        assert_eq!(buf, data[700..2700], "{m:?} positioned");
        assert_eq!(r.stats().stamp_mismatches, 2, "{m:?} positioned");
    }
    let served = {
        let g = good.st();
        g.read_ops + g.chunk_ops
    };
    assert!(served >= 4, "{served}");
    assert!(
        meta.st().bad_reports.is_empty(),
        "a stamp mismatch is not a corrupt replica"
    );
}

#[tokio::test]
async fn a_replica_answering_another_generation_stamp_is_refused_and_read_around() {
    within(30, read_around(0)).await;
}

#[tokio::test]
async fn a_stamp_changing_mid_stream_is_refused_and_the_read_goes_on_elsewhere() {
    within(30, read_around(2)).await;
}

#[tokio::test]
async fn with_no_other_replica_the_error_names_node_block_and_both_stamps() {
    within(30, async {
        let bad = start_dn("bad").await;
        let meta = start_meta(vec![]).await;
        let data = random_bytes(3000, 22);
        seed_file(&meta, "/f", &[(&data, &[&bad])]);
        let mut cfg = config(&meta);
        cfg.read_piece_bytes = ByteSize(512);
        let fs = connect(cfg).await;
        bad.st().other_stamp = Some((1, GenerationStamp(9)));
        let mut r = fs.open("/f").await.unwrap();
        let mut got = Vec::new();
        let err = r.read_to_end(&mut got).await.expect_err("refused");
        match client_error(&err) {
            ClientError::GenStampMismatch {
                node,
                block,
                expected,
                found,
                served,
            } => {
                assert!(node.contains("bad"), "{node}");
                assert_eq!(block.0, 900);
                assert_eq!(
                    (*expected, *found),
                    (GenerationStamp(5), GenerationStamp(9))
                );
                assert!(*served);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            got.len() <= 512,
            "only the chunk before the change was delivered: {}",
            got.len()
        );
        assert!(got[..] == data[..got.len()]);
    })
    .await;
}
