//! Append on a MiniCluster: `FileSystem::append` continues a partial last block in
//! place (new generation stamp, `Append` pipeline, the partial chunk's checksum rewritten on
//! every replica) or starts a new block after a full one; readers see old and new bytes
//! exact; old-stamp replicas do not survive; restarts keep the file; a DataNode dying during
//! an append is pipeline recovery; WebHDFS `APPEND` (POST) through the DataNode gateway.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_client::{FileSystem, WriteOptions};
use sluice_common::checksum;
use sluice_tests::http::request;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, MiniCluster};
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const LIMIT: Duration = Duration::from_secs(180);
const BLOCK: u64 = 64 * 1024;
const BPC: usize = 512;
/// Bytes of a meta file's header before its checksums.
const META_HEADER: usize = 7;

async fn cluster(n: usize) -> MiniCluster {
    sluice_tests::init_logging();
    let c = MiniCluster::builder().datanodes(n).start().await.unwrap();
    c.wait_live(n).await.unwrap();
    c
}

async fn write_new(fs: &FileSystem, path: &str, data: &[u8]) {
    let opts = WriteOptions {
        block_size: Some(BLOCK),
        create_parent: true,
        ..WriteOptions::default()
    };
    let mut w = fs.create(path, opts).await.unwrap();
    w.write_all(data).await.unwrap();
    w.close().await.unwrap();
}

async fn append(fs: &FileSystem, path: &str, data: &[u8]) {
    let mut w = fs.append(path).await.unwrap();
    w.write_all(data).await.unwrap();
    w.close().await.unwrap();
}

/// Every DataNode's replicas of every block of `path`: exactly one meta file, named with the
/// block's current stamp, a block file with exactly the block's bytes of `data`, and a
/// checksum per chunk that matches (the partial last chunk's too). An error while some
/// replica is not (yet) right, with the reason.
async fn replicas_exact(
    c: &MiniCluster,
    fs: &FileSystem,
    path: &str,
    data: &[u8],
) -> Result<(), String> {
    let lbs = fs
        .get_block_locations(path)
        .await
        .map_err(|e| e.to_string())?;
    for lb in &lbs.blocks {
        let start = lb.offset as usize;
        let want = &data[start..start + lb.block.num_bytes as usize];
        let mut holders = 0;
        for i in 0..c.datanode_count() {
            let files = block_and_meta_files(c, i, lb.block.id.0);
            if files.is_empty() {
                continue;
            }
            holders += 1;
            let metas: Vec<&PathBuf> = files
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "meta"))
                .collect();
            let name = format!("blk_{}_{}.meta", lb.block.id.0, lb.block.gen_stamp.0);
            if metas.len() != 1 || !metas[0].ends_with(&name) {
                return Err(format!(
                    "DataNode {i}: meta files {metas:?}, want one {name}"
                ));
            }
            let block = files
                .iter()
                .find(|p| p.extension().is_none())
                .ok_or(format!("DataNode {i}: no block file in {files:?}"))?;
            let bytes = std::fs::read(block).map_err(|e| e.to_string())?;
            if bytes != want {
                return Err(format!(
                    "DataNode {i}: {} bytes in {}, want {}",
                    bytes.len(),
                    block.display(),
                    want.len()
                ));
            }
            let meta = std::fs::read(metas[0]).map_err(|e| e.to_string())?;
            let mut sums = Vec::new();
            checksum::compute_into(want, BPC as u32, &mut sums);
            if meta.get(META_HEADER..) != Some(&sums[..]) {
                return Err(format!(
                    "DataNode {i}: checksums of {} differ",
                    metas[0].display()
                ));
            }
        }
        if holders < 3 {
            return Err(format!("{} on {holders} DataNodes", lb.block));
        }
    }
    Ok(())
}

/// DataNode `i`'s files of block `id`: `blk_<id>` and every `blk_<id>_<gs>.meta`.
fn block_and_meta_files(c: &MiniCluster, i: usize, id: u64) -> Vec<PathBuf> {
    fn walk(dir: &std::path::Path, id: u64, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                walk(&p, id, out);
            } else if name == format!("blk_{id}") || name.starts_with(&format!("blk_{id}_")) {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for dir in c.datanode_dirs(i) {
        walk(&dir, id, &mut out);
    }
    out
}

async fn assert_replicas_exact(c: &MiniCluster, fs: &FileSystem, path: &str, data: &[u8]) {
    wait_until(Duration::from_secs(30), "every replica exact", || async {
        match replicas_exact(c, fs, path, data).await {
            Ok(()) => true,
            Err(why) => {
                eprintln!("replicas not exact yet: {why}");
                false
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn appends_continue_partial_blocks_and_start_new_ones_byte_exact() {
    with_timeout(LIMIT, "appends", async {
        let c = cluster(3).await;
        let fs = c.client().await.unwrap();
        // 100 001 bytes: block 2 holds 34 465, ending inside a chunk.
        let mut data = random_bytes(100_001, 1);
        write_new(&fs, "/a/f", &data).await;
        let before = fs.get_block_locations("/a/f").await.unwrap().blocks;
        // Fill the partial block and start a third one.
        let more = random_bytes(50_000, 2);
        append(&fs, "/a/f", &more).await;
        data.extend_from_slice(&more);
        let after = fs.get_block_locations("/a/f").await.unwrap().blocks;
        assert_eq!(after.len(), 3);
        assert_eq!(
            after[1].block.id, before[1].block.id,
            "block 2 continued in place"
        );
        assert!(
            after[1].block.gen_stamp > before[1].block.gen_stamp,
            "new stamp"
        );
        assert_eq!(after[1].block.num_bytes, BLOCK);
        assert_eq!(after[0].block, before[0].block, "block 1 untouched");
        assert!(read_all(&fs, "/a/f").await.unwrap() == data);
        // Tiny appends, each inside the same chunk: the chunk's checksum is rewritten each time.
        for i in 0..5u8 {
            append(&fs, "/a/f", &[i; 7]).await;
            data.extend_from_slice(&[i; 7]);
        }
        let st = fs.stat("/a/f").await.unwrap();
        assert_eq!(st.length, data.len() as u64);
        assert!(!st.under_construction);
        assert!(read_all(&fs, "/a/f").await.unwrap() == data);
        // A reader in the middle of the appended range.
        let r = fs.open("/a/f").await.unwrap();
        let mut buf = vec![0u8; 3000];
        let n = r.read_at(99_000, &mut buf).await.unwrap();
        assert!(n > 0 && buf[..n] == data[99_000..99_000 + n]);
        assert_replicas_exact(&c, &fs, "/a/f", &data).await;

        // A file ending exactly on a block boundary: the append starts a new block.
        let mut full = random_bytes(2 * BLOCK as usize, 3);
        write_new(&fs, "/a/full", &full).await;
        append(&fs, "/a/full", b"next block").await;
        full.extend_from_slice(b"next block");
        let lbs = fs.get_block_locations("/a/full").await.unwrap().blocks;
        assert_eq!(
            lbs.iter().map(|b| b.block.num_bytes).collect::<Vec<_>>(),
            vec![BLOCK, BLOCK, 10]
        );
        assert!(read_all(&fs, "/a/full").await.unwrap() == full);

        // An empty file, then appends (fsspec's way of writing a file).
        write_new(&fs, "/a/empty", b"").await;
        append(&fs, "/a/empty", b"").await;
        assert_eq!(fs.stat("/a/empty").await.unwrap().length, 0);
        let body = random_bytes(70_000, 4);
        append(&fs, "/a/empty", &body[..30_000]).await;
        append(&fs, "/a/empty", &body[30_000..]).await;
        assert!(read_all(&fs, "/a/empty").await.unwrap() == body);
        assert_replicas_exact(&c, &fs, "/a/empty", &body).await;
        c.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_appender_is_refused_while_the_first_writes() {
    with_timeout(LIMIT, "second appender", async {
        let c = cluster(3).await;
        let fs = c.client().await.unwrap();
        let other = c.client().await.unwrap();
        write_new(&fs, "/l/f", b"hello").await;
        let mut w = fs.append("/l/f").await.unwrap();
        w.write_all(b", world").await.unwrap();
        w.hflush().await.unwrap();
        let e = other.append("/l/f").await.unwrap_err();
        assert!(e.to_string().contains("another writer"), "{e}");
        assert!(
            fs.append("/l/f").await.is_err(),
            "the holder cannot reopen it either"
        );
        w.close().await.unwrap();
        assert_eq!(read_all(&fs, "/l/f").await.unwrap(), b"hello, world");
        assert!(fs.append("/nothing").await.is_err());
        fs.mkdirs("/l/dir", true).await.unwrap();
        assert!(fs.append("/l/dir").await.is_err());
        c.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_appended_file_survives_restarts_and_old_stamps_are_gone() {
    with_timeout(LIMIT, "restarts", async {
        let mut c = cluster(3).await;
        let fs = c.client().await.unwrap();
        let mut data = random_bytes(10_000, 5);
        write_new(&fs, "/r/f", &data).await;
        let more = random_bytes(3_333, 6);
        append(&fs, "/r/f", &more).await;
        data.extend_from_slice(&more);
        assert_replicas_exact(&c, &fs, "/r/f", &data).await;
        for i in 0..3 {
            c.restart_datanode(i).await.unwrap();
        }
        c.restart_metadata().await.unwrap();
        c.wait_live(3).await.unwrap();
        let fs = c.client().await.unwrap();
        wait_until(Duration::from_secs(30), "the file reads back", || async {
            read_all(&fs, "/r/f").await.is_ok_and(|d| d == data)
        })
        .await;
        assert_replicas_exact(&c, &fs, "/r/f", &data).await;
        // And it can be appended to again after the restart.
        append(&fs, "/r/f", b"!").await;
        data.push(b'!');
        assert!(read_all(&fs, "/r/f").await.unwrap() == data);
        c.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_datanode_dying_during_an_append_is_pipeline_recovery() {
    with_timeout(LIMIT, "dn dies during append", async {
        let mut c = cluster(4).await;
        let fs = c.client().await.unwrap();
        let mut data = random_bytes(100_001, 7);
        write_new(&fs, "/d/f", &data).await;
        let mut w = fs.append("/d/f").await.unwrap();
        let more = random_bytes(200_000, 8);
        w.write_all(&more[..20_000]).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        assert_eq!(pipeline.len(), 3);
        let victim = c.datanode_index_by_addr(&pipeline[1].data_addr).unwrap();
        c.kill_datanode(victim);
        w.write_all(&more[20_000..]).await.unwrap();
        w.close().await.unwrap();
        data.extend_from_slice(&more);
        assert!(w.pipeline_recoveries() >= 1);
        assert!(read_all(&fs, "/d/f").await.unwrap() == data);
        let st = fs.stat("/d/f").await.unwrap();
        assert_eq!(
            (st.length, st.under_construction),
            (data.len() as u64, false)
        );
        c.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_append_whose_holder_is_dead_goes_on_with_the_others() {
    with_timeout(LIMIT, "dead holder at set-up", async {
        let mut c = cluster(4).await;
        let fs = c.client().await.unwrap();
        let mut data = random_bytes(30_000, 9);
        write_new(&fs, "/s/f", &data).await;
        let lb = fs.get_block_locations("/s/f").await.unwrap().blocks[0].clone();
        // Killed, but still live for the metadata service: the set-up finds it down.
        let dead = c
            .datanode_index_by_addr(&lb.locations[0].data_addr)
            .unwrap();
        c.kill_datanode(dead);
        let more = random_bytes(40_000, 10);
        append(&fs, "/s/f", &more).await;
        data.extend_from_slice(&more);
        assert!(read_all(&fs, "/s/f").await.unwrap() == data);
        // The dead holder comes back with the old-stamp replica: it is stale, deleted (or
        // replaced by a copy under the new stamp), never served.
        let old_meta = format!("blk_{}_{}.meta", lb.block.id.0, lb.block.gen_stamp.0);
        assert!(
            block_and_meta_files(&c, dead, lb.block.id.0)
                .iter()
                .any(|p| p.ends_with(&old_meta)),
            "the dead holder still has the old replica on disk"
        );
        c.start_datanode(dead).await.unwrap();
        wait_until(
            Duration::from_secs(60),
            "the old-stamp replica is gone",
            || async {
                !block_and_meta_files(&c, dead, lb.block.id.0)
                    .iter()
                    .any(|p| p.ends_with(&old_meta))
            },
        )
        .await;
        assert!(read_all(&fs, "/s/f").await.unwrap() == data);
        c.shutdown().await;
    })
    .await;
}

fn nn(c: &MiniCluster, path_query: &str) -> String {
    format!(
        "http://{}/webhdfs/v1{path_query}",
        c.metadata_http_addr().unwrap()
    )
}

/// Both steps of a WebHDFS write (`PUT` CREATE or `POST` APPEND).
async fn webhdfs_write(
    c: &MiniCluster,
    method: &str,
    path_query: &str,
    body: &[u8],
) -> (u16, String) {
    let r = request(method, &nn(c, path_query), b"").await.unwrap();
    assert_eq!(r.status, 307, "{}", String::from_utf8_lossy(&r.body));
    let loc = r.header("location").unwrap().to_string();
    let r = request(method, &loc, body).await.unwrap();
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhdfs_append_posts_add_to_the_file() {
    with_timeout(LIMIT, "webhdfs append", async {
        let c = cluster(3).await;
        let fs = c.client().await.unwrap();
        let (status, _) =
            webhdfs_write(&c, "PUT", &format!("/w/f?op=CREATE&blocksize={BLOCK}"), b"").await;
        assert_eq!(status, 201);
        let body = random_bytes(150_000, 11);
        for part in body.chunks(40_000) {
            let (status, text) = webhdfs_write(&c, "POST", "/w/f?op=APPEND", part).await;
            assert_eq!(status, 200, "{text}");
        }
        assert!(read_all(&fs, "/w/f").await.unwrap() == body);
        assert_eq!(fs.stat("/w/f").await.unwrap().length, body.len() as u64);
        assert_replicas_exact(&c, &fs, "/w/f", &body).await;
        // APPEND of a missing file: the metadata service answers 404 at step 1.
        let r = request("POST", &nn(&c, "/w/none?op=APPEND"), b"")
            .await
            .unwrap();
        assert_eq!(r.status, 404, "{}", String::from_utf8_lossy(&r.body));
        c.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn appends_carry_block_access_tokens_when_they_are_required() {
    with_timeout(LIMIT, "append with tokens", async {
        sluice_tests::init_logging();
        let c = MiniCluster::builder()
            .datanodes(3)
            .configure_metadata(|m| m.block_token_enable = true)
            .start()
            .await
            .unwrap();
        c.wait_live(3).await.unwrap();
        let fs = c.client().await.unwrap();
        let mut data = random_bytes(100_001, 12);
        write_new(&fs, "/t/f", &data).await;
        let more = random_bytes(40_000, 13);
        append(&fs, "/t/f", &more).await;
        data.extend_from_slice(&more);
        let (status, text) = webhdfs_write(&c, "POST", "/t/f?op=APPEND", b"by the gateway").await;
        assert_eq!(status, 200, "{text}");
        data.extend_from_slice(b"by the gateway");
        assert!(read_all(&fs, "/t/f").await.unwrap() == data);
        assert_replicas_exact(&c, &fs, "/t/f", &data).await;
        c.shutdown().await;
    })
    .await;
}
