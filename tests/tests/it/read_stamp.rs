//! Reads checked end to end on a real cluster: a DataNode serves a reader only the replica
//! under the generation stamp it asked for (stamp 0, or an old stamp with its still valid
//! token, is refused with `ERROR_STALE_GENSTAMP` naming the replica's stamp), and a reader
//! whose stamp an append made old asks the metadata service again and reads on.

use sluice_client::{ReadMode, ReadOptions, WriteOptions};
use sluice_common::proto::{Message, Op, OpResponse, ReadBlockOp, ReadChunkOp};
use sluice_common::rpc::LocatedBlock;
use sluice_common::{ExtendedBlock, GenerationStamp, Status};
use sluice_tests::raw::RawConn;
use sluice_tests::{random_bytes, read_all, with_timeout, write_all, MiniCluster};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LIMIT: Duration = Duration::from_secs(120);
const BLOCK: u64 = 64 * 1024;

async fn cluster(tokens: bool) -> MiniCluster {
    sluice_tests::init_logging();
    MiniCluster::builder()
        .block_size(BLOCK)
        .configure_metadata(move |m| m.block_token_enable = tokens)
        .start()
        .await
        .expect("cluster starts")
}

fn opts() -> WriteOptions {
    WriteOptions {
        overwrite: true,
        create_parent: true,
        ..WriteOptions::default()
    }
}

/// The two read ops over the whole of `block`.
fn reads(block: ExtendedBlock) -> [Op; 2] {
    [
        Op::ReadBlock(ReadBlockOp {
            block,
            offset: 0,
            length: u64::MAX,
            piece_size: 0,
        }),
        Op::ReadChunk(ReadChunkOp {
            block,
            offset: 0,
            length: 4096,
        }),
    ]
}

/// Sends `op` with `lb`'s token to each of `lb`'s DataNodes asking for `stamp`; every one
/// must refuse with `ERROR_STALE_GENSTAMP`, name the replica's real stamp, and send nothing
/// else.
async fn refused_everywhere(lb: &LocatedBlock, stamp: GenerationStamp, real: GenerationStamp) {
    let mut asked = lb.block;
    asked.gen_stamp = stamp;
    for dn in &lb.locations {
        for op in reads(asked) {
            let mut c = RawConn::connect(&dn.data_addr)
                .await
                .unwrap()
                .with_token(lb.token.clone());
            c.send_op(op.clone()).await.unwrap();
            let r: OpResponse = c.op_response().await.unwrap();
            assert_eq!(
                r.status,
                Status::ErrorStaleGenStamp,
                "{op:?} on {dn}: {r:?}"
            );
            let replica = r.replica.expect("the refusal names the replica");
            assert_eq!(replica.block.id, lb.block.id);
            assert_eq!(replica.block.gen_stamp, real, "{op:?} on {dn}");
            // The connection stays usable and carries no chunk of the refused replica.
            c.send_op(reads(ExtendedBlock::new(lb.block.id, real, 0))[1].clone())
                .await
                .unwrap();
            let next = c.next().await.unwrap().expect("an answer");
            assert!(matches!(next.header, Message::OpResponse(_)), "{next:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_naming_stamp_0_is_refused_by_the_datanode() {
    with_timeout(LIMIT, "stamp 0", async {
        // Tokens off: only the DataNode's stamp check stands between the op and the replica.
        let c = cluster(false).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(BLOCK as usize + 1000, 31);
        write_all(&fs, "/r/f", &data, opts(), 10_000).await.unwrap();
        let located = fs.get_block_locations("/r/f").await.unwrap();
        for lb in &located.blocks {
            refused_everywhere(lb, GenerationStamp(0), lb.block.gen_stamp).await;
            let newer = GenerationStamp(lb.block.gen_stamp.0 + 1000);
            refused_everywhere(lb, newer, lb.block.gen_stamp).await;
        }
        assert!(read_all(&fs, "/r/f").await.unwrap() == data);
        c.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_stamp_with_its_valid_token_is_refused_and_an_open_reader_reads_on() {
    with_timeout(LIMIT, "old stamp after append", async {
        let c = cluster(true).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(BLOCK as usize + 1000, 32);
        write_all(&fs, "/r/a", &data, opts(), 10_000).await.unwrap();
        let before = fs.get_block_locations("/r/a").await.unwrap();
        let old = before.blocks.last().unwrap().clone();
        let mut readers = Vec::new();
        for m in [ReadMode::Stream, ReadMode::Chunk] {
            let ropts = ReadOptions {
                mode: Some(m),
                ..ReadOptions::default()
            };
            readers.push((m, fs.open_with("/r/a", ropts).await.unwrap()));
        }
        // The append reopens the last block under a new generation stamp.
        let tail = random_bytes(3000, 33);
        let mut w = fs.append("/r/a").await.unwrap();
        w.write_all(&tail).await.unwrap();
        w.close().await.unwrap();
        let after = fs.get_block_locations("/r/a").await.unwrap();
        let new = after.blocks.last().unwrap().clone();
        assert_eq!(new.block.id, old.block.id);
        assert!(new.block.gen_stamp > old.block.gen_stamp, "{new:?}");
        // The old token is still valid, for the old stamp only: the replica is not served.
        refused_everywhere(&old, old.block.gen_stamp, new.block.gen_stamp).await;
        // Readers opened before the append read what they knew of, through a refreshed stamp.
        for (m, mut r) in readers {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            assert!(got == data, "{m:?}: bytes differ");
            assert!(r.stats().stamp_mismatches >= 1, "{m:?}: {:?}", r.stats());
            assert!(r.stats().excluded.is_empty(), "{m:?}: {:?}", r.stats());
        }
        let mut all = data.clone();
        all.extend_from_slice(&tail);
        assert!(read_all(&fs, "/r/a").await.unwrap() == all);
        c.shutdown().await;
    })
    .await
}
