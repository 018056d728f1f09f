//! Storage tests: replicas written through the direct sink, finalized, recovered, and found
//! again by the start-up scan.

use super::dataset::Dataset;
use super::layout;
use super::meta::{self, MetaHeader};
use crate::metrics::Metrics;
use crate::write::sink::{DirectSink, ReplicaSink};
use sluice_common::checksum;
use sluice_common::proto::{BlockStage, ReplicaState};
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn open(dirs: &[PathBuf]) -> (Dataset, Arc<Metrics>) {
    let m = Arc::new(Metrics::default());
    (Dataset::open(dirs, m.clone()).unwrap(), m)
}

/// Writes `bytes` as packets of `packet` bytes into a new Rbw replica; returns the sink.
fn write_rbw(ds: &Dataset, m: &Arc<Metrics>, id: u64, bytes: &[u8], packet: usize) -> DirectSink {
    let r = ds
        .create(BlockId(id), GenerationStamp(1), 512, BlockStage::Create)
        .unwrap();
    let live = r.entry.live.clone();
    let mut sink = DirectSink::new(r, m.clone());
    for (i, p) in bytes.chunks(packet).enumerate() {
        let off = (i * packet) as u64;
        sink.write(off, p, &checksum::compute(p, 512)).unwrap();
    }
    live.set_bytes_on_disk(sink.bytes_on_disk());
    sink
}

/// Checks the replica files of `id` hold `expect` with valid checksums.
fn assert_files_valid(ds: &Dataset, id: u64, expect: &[u8]) {
    let e = ds.get(BlockId(id)).unwrap();
    let on_disk = std::fs::read(e.block_path()).unwrap();
    assert_eq!(on_disk, expect);
    let m = std::fs::read(e.meta_path()).unwrap();
    let h = MetaHeader::decode(&m, Path::new("meta")).unwrap();
    assert_eq!(m.len() as u64, h.meta_len(expect.len() as u64));
    checksum::verify(expect, &m[meta::HEADER_LEN as usize..], 512, 0).unwrap();
}

#[test]
fn packets_with_an_hflush_overlap_rewrite_the_partial_chunk_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, m) = open(&[dir.path().to_path_buf()]);
    let all = data(2000, 3);
    let r = ds
        .create(BlockId(7), GenerationStamp(1), 512, BlockStage::Create)
        .unwrap();
    let mut sink = DirectSink::new(r, m.clone());
    sink.write(0, &all[..700], &checksum::compute(&all[..700], 512))
        .unwrap();
    // After an hflush at 700 the next packet restarts at the chunk start 512.
    sink.write(
        512,
        &all[512..2000],
        &checksum::compute(&all[512..2000], 512),
    )
    .unwrap();
    assert_eq!(sink.bytes_on_disk(), 2000);
    assert_eq!(
        m.bytes_written.get(),
        2000,
        "the overlap is not written twice"
    );
    sink.sync().unwrap();
    assert_files_valid(&ds, 7, &all);
    let live = ds.get(BlockId(7)).unwrap().live;
    let e = ds
        .finalize(BlockId(7), &live, 2000, BlockStage::Create)
        .unwrap();
    assert_eq!(e.state, ReplicaState::Finalized);
    assert!(e.dir.starts_with(layout::finalized_root(dir.path())));
    assert_files_valid(&ds, 7, &all);
}

#[test]
fn scan_finds_finalized_and_turns_rbw_into_rwr() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
    let (fin, rbw) = (data(5000, 1), data(1300, 2));
    {
        let (ds, m) = open(&dirs);
        drop(write_rbw(&ds, &m, 1, &fin, 4096));
        let live = ds.get(BlockId(1)).unwrap().live;
        ds.finalize(BlockId(1), &live, 5000, BlockStage::Create)
            .unwrap();
        drop(write_rbw(&ds, &m, 2, &rbw, 512));
    }
    let (ds, m) = open(&dirs);
    let f = ds.get(BlockId(1)).unwrap();
    assert_eq!(
        (f.state, f.visible_length()),
        (ReplicaState::Finalized, 5000)
    );
    let w = ds.get(BlockId(2)).unwrap();
    assert_eq!((w.state, w.live.bytes_on_disk()), (ReplicaState::Rwr, 1300));
    assert_eq!(
        w.visible_length(),
        0,
        "an Rwr replica's acked length is unknown"
    );
    assert_eq!(m.corrupt_replicas_skipped.get(), 0);
    let mut report = ds.report();
    report.sort_by_key(|r| r.block.id);
    assert_eq!(report.len(), 2);
    assert_eq!(
        report[0].block,
        ExtendedBlock::new(BlockId(1), GenerationStamp(1), 5000)
    );
}

#[test]
fn scan_drops_an_unverifiable_rbw_tail_and_skips_a_corrupt_finalized_replica() {
    let dir = tempfile::tempdir().unwrap();
    let dirs = vec![dir.path().to_path_buf()];
    let bytes = data(1500, 9);
    {
        let (ds, m) = open(&dirs);
        drop(write_rbw(&ds, &m, 3, &bytes, 512));
        drop(write_rbw(&ds, &m, 4, &bytes, 512));
        let live = ds.get(BlockId(4)).unwrap().live;
        ds.finalize(BlockId(4), &live, 1500, BlockStage::Create)
            .unwrap();
        // Block 3: bytes past the last checksum (a crash between data and meta writes) and a
        // torn last chunk.
        let e = ds.get(BlockId(3)).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(e.block_path())
            .unwrap();
        std::io::Write::write_all(&mut f, &[0u8; 100]).unwrap();
        // Block 4: a meta file one checksum short.
        let e4 = ds.get(BlockId(4)).unwrap();
        let mf = std::fs::OpenOptions::new()
            .write(true)
            .open(e4.meta_path())
            .unwrap();
        mf.set_len(
            MetaHeader {
                bytes_per_checksum: 512,
            }
            .meta_len(1500)
                - 4,
        )
        .unwrap();
    }
    let (ds, m) = open(&dirs);
    let e = ds.get(BlockId(3)).unwrap();
    assert_eq!(
        e.live.bytes_on_disk(),
        1500,
        "the length covered by checksums"
    );
    assert!(
        ds.get(BlockId(4)).is_none(),
        "never serve a replica whose meta does not cover it"
    );
    assert_eq!(m.corrupt_replicas_skipped.get(), 1);
}

#[test]
fn the_first_replica_of_a_subdir_makes_the_subdir_durable_before_moving_in() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, m) = open(&[dir.path().to_path_buf()]);
    let root = dir.path();
    let finalize = |id: u64| {
        drop(write_rbw(&ds, &m, id, &data(700, 1), 700));
        let live = ds.get(BlockId(id)).unwrap().live;
        crate::sys::record::take();
        ds.finalize(BlockId(id), &live, 700, BlockStage::Create)
            .unwrap();
        crate::sys::record::take()
    };
    let sub = layout::finalized_subdir(root, BlockId(0x300));
    assert_eq!(
        finalize(0x300),
        vec![
            layout::finalized_root(root),
            sub.clone(),
            layout::rbw_dir(root)
        ],
        "new subdir: its parent, then the destination, then the source"
    );
    assert_eq!(
        finalize(0x301),
        vec![sub, layout::rbw_dir(root)],
        "existing subdir: destination, then source"
    );
}

#[test]
fn recovery_truncates_to_the_acked_length_and_bumps_the_generation_stamp() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, m) = open(&[dir.path().to_path_buf()]);
    let bytes = data(3000, 5);
    drop(write_rbw(&ds, &m, 6, &bytes, 1024));
    let old = ExtendedBlock::new(BlockId(6), GenerationStamp(1), 1800);
    let r = ds.recover(old, GenerationStamp(2), false).unwrap().unwrap();
    assert_eq!(r.entry.gen_stamp, GenerationStamp(2));
    assert_eq!(r.entry.visible_length(), 1800);
    drop(r);
    assert_files_valid(&ds, 6, &bytes[..1800]);
    assert!(!layout::rbw_dir(dir.path())
        .join(layout::meta_file_name(BlockId(6), GenerationStamp(1)))
        .exists());
    let err = ds
        .recover(
            ExtendedBlock::new(BlockId(6), GenerationStamp(2), 5000),
            GenerationStamp(3),
            false,
        )
        .unwrap_err();
    assert_eq!(err.status(), sluice_common::Status::ErrorInvalid, "{err}");
    ds.recover(
        ExtendedBlock::new(BlockId(6), GenerationStamp(2), 1000),
        GenerationStamp(3),
        true,
    )
    .unwrap();
    let e = ds.get(BlockId(6)).unwrap();
    assert_eq!(
        (e.state, e.gen_stamp, e.visible_length()),
        (ReplicaState::Finalized, GenerationStamp(3), 1000)
    );
    assert_files_valid(&ds, 6, &bytes[..1000]);
}

#[test]
fn recovery_accepts_a_stamp_left_by_a_failed_attempt_but_not_a_newer_one() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, m) = open(&[dir.path().to_path_buf()]);
    let bytes = data(2000, 7);
    drop(write_rbw(&ds, &m, 9, &bytes, 1024));
    // An attempt under gs 2 restamped the replica, then failed further down the pipeline.
    let gs1 = ExtendedBlock::new(BlockId(9), GenerationStamp(1), 1500);
    drop(ds.recover(gs1, GenerationStamp(2), false).unwrap());
    // The writer retries from what it knows (gs 1) with a newer stamp: accepted.
    let r = ds.recover(gs1, GenerationStamp(4), false).unwrap().unwrap();
    assert_eq!(r.entry.gen_stamp, GenerationStamp(4));
    drop(r);
    assert_files_valid(&ds, 9, &bytes[..1500]);
    // A recovery whose latest stamp is older than the replica's is refused.
    let err = ds.recover(gs1, GenerationStamp(3), false).unwrap_err();
    assert_eq!(err.status(), sluice_common::Status::ErrorInvalid, "{err}");
    // So is one naming a stamp newer than the replica's (it is stale).
    let newer = ExtendedBlock::new(BlockId(9), GenerationStamp(5), 1500);
    let err = ds.recover(newer, GenerationStamp(6), false).unwrap_err();
    assert_eq!(
        err.status(),
        sluice_common::Status::ErrorStaleGenStamp,
        "{err}"
    );
}

#[test]
fn create_refuses_same_generation_and_replaces_older_one() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, m) = open(&[dir.path().to_path_buf()]);
    drop(write_rbw(&ds, &m, 8, &data(100, 1), 100));
    let err = ds
        .create(BlockId(8), GenerationStamp(1), 512, BlockStage::Create)
        .unwrap_err();
    assert_eq!(err.status(), sluice_common::Status::ErrorExists);
    let r = ds
        .create(BlockId(8), GenerationStamp(2), 512, BlockStage::Create)
        .unwrap();
    assert_eq!(r.entry.live.bytes_on_disk(), 0);
    assert!(
        ds.delete(ExtendedBlock::new(BlockId(8), GenerationStamp(1), 0))
            .unwrap()
            .is_none(),
        "newer replica kept"
    );
    assert!(ds
        .delete(ExtendedBlock::new(BlockId(8), GenerationStamp(2), 0))
        .unwrap()
        .is_some());
    assert!(ds.get(BlockId(8)).is_none());
}

#[test]
fn a_failed_transfer_leaves_nothing_and_can_be_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, _) = open(&[dir.path().to_path_buf()]);
    let stage = BlockStage::TransferFinalized;
    let first = ds
        .create(BlockId(9), GenerationStamp(4), 512, stage)
        .unwrap();
    assert_eq!(first.entry.state, ReplicaState::Temporary);
    assert!(first.entry.dir.starts_with(layout::tmp_dir(dir.path())));
    assert!(
        ds.report().is_empty(),
        "Temporary replicas are not reported"
    );
    let retry = ds
        .create(BlockId(9), GenerationStamp(4), 512, stage)
        .unwrap();
    ds.delete_temporary(BlockId(9), &first.entry.live).unwrap();
    assert!(
        ds.get(BlockId(9)).is_some(),
        "only the failed attempt's replica is removed"
    );
    ds.delete_temporary(BlockId(9), &retry.entry.live).unwrap();
    assert!(ds.get(BlockId(9)).is_none());
    assert_eq!(
        std::fs::read_dir(layout::tmp_dir(dir.path()))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn append_reopens_a_finalized_replica_under_the_new_stamp_and_rewrites_its_partial_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, m) = open(&[dir.path().to_path_buf()]);
    let all = data(3000, 5);
    drop(write_rbw(&ds, &m, 9, &all[..1300], 4096));
    let live = ds.get(BlockId(9)).unwrap().live;
    ds.finalize(BlockId(9), &live, 1300, BlockStage::Create)
        .unwrap();
    let old = ds.get(BlockId(9)).unwrap();
    let at = |gs, n| ExtendedBlock::new(BlockId(9), GenerationStamp(gs), n);
    // Refused: a wrong length, a stale or not-newer stamp.
    assert!(ds.append(at(1, 1200), GenerationStamp(2)).is_err());
    assert!(ds.append(at(1, 1300), GenerationStamp(1)).is_err());
    assert!(ds.append(at(0, 1300), GenerationStamp(2)).is_err());
    assert!(ds.append(at(2, 1300), GenerationStamp(3)).is_err());
    assert_eq!(ds.get(BlockId(9)).unwrap().state, ReplicaState::Finalized);

    let r = ds.append(at(1, 1300), GenerationStamp(2)).unwrap();
    assert_eq!(
        (r.entry.state, r.entry.gen_stamp),
        (ReplicaState::Rbw, GenerationStamp(2))
    );
    assert!(r.entry.dir.starts_with(layout::rbw_dir(dir.path())));
    assert!(!old.meta_path().exists() && !old.block_path().exists());
    assert_eq!(r.entry.live.bytes_on_disk(), 1300);
    // The client re-sends the partial chunk (from 1024) with the new bytes.
    let mut sink = DirectSink::new(r, m.clone());
    sink.write(1024, &all[1024..], &checksum::compute(&all[1024..], 512))
        .unwrap();
    sink.sync().unwrap();
    assert_files_valid(&ds, 9, &all);
    drop(sink);
    // A retried set-up (another stamp) finds the reopened replica and continues from 1300.
    let r = ds.append(at(1, 1300), GenerationStamp(3)).unwrap();
    assert_eq!(r.entry.gen_stamp, GenerationStamp(3));
    assert_eq!(r.entry.live.bytes_on_disk(), 1300);
    drop(r);
    assert_files_valid(&ds, 9, &all[..1300]);
    let live = ds.get(BlockId(9)).unwrap().live;
    let e = ds
        .finalize(BlockId(9), &live, 1300, BlockStage::Append)
        .unwrap();
    assert_eq!(
        (e.state, e.gen_stamp),
        (ReplicaState::Finalized, GenerationStamp(3))
    );
    // The start-up scan finds it under the new stamp only.
    drop(ds);
    let (ds, _) = open(&[dir.path().to_path_buf()]);
    let e = ds.get(BlockId(9)).unwrap();
    assert_eq!(
        (e.state, e.gen_stamp, e.live.bytes_on_disk()),
        (ReplicaState::Finalized, GenerationStamp(3), 1300)
    );
    assert_files_valid(&ds, 9, &all[..1300]);
}

#[test]
fn an_append_cut_between_its_renames_comes_back_as_the_finalized_replica() {
    let dir = tempfile::tempdir().unwrap();
    let all = data(1300, 6);
    {
        let (ds, m) = open(&[dir.path().to_path_buf()]);
        drop(write_rbw(&ds, &m, 11, &all, 4096));
        let live = ds.get(BlockId(11)).unwrap().live;
        ds.finalize(BlockId(11), &live, 1300, BlockStage::Create)
            .unwrap();
        // Dataset::append's first rename reached the disk, its second did not.
        let e = ds.get(BlockId(11)).unwrap();
        let rbw = layout::rbw_dir(dir.path()).join(layout::block_file_name(BlockId(11)));
        std::fs::rename(e.block_path(), rbw).unwrap();
    }
    let (ds, _) = open(&[dir.path().to_path_buf()]);
    let e = ds.get(BlockId(11)).unwrap();
    assert_eq!(
        (e.state, e.gen_stamp, e.live.bytes_on_disk()),
        (ReplicaState::Finalized, GenerationStamp(1), 1300)
    );
    assert_files_valid(&ds, 11, &all);
}

#[test]
fn a_state_change_waits_only_for_its_own_blocks_lock() {
    use super::dataset::LOCK_STRIPES;
    use std::sync::mpsc;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let (ds, _m) = open(&[dir.path().to_path_buf()]);
    let ds = Arc::new(ds);
    let create = |id: u64| {
        let (ds, (tx, rx)) = (Arc::clone(&ds), mpsc::channel());
        let t = std::thread::Builder::new().name(format!("create-{id}"));
        let h = t
            .spawn(move || {
                let r = ds.create(BlockId(id), GenerationStamp(1), 512, BlockStage::Create);
                let _ = tx.send(r.map(|_| ()));
            })
            .unwrap();
        (rx, h)
    };
    let held = ds.hold_lock(BlockId(1));
    // Another block's create (and its directory fsync) does not wait for block 1's lock...
    let (other, t2) = create(2);
    other
        .recv_timeout(Duration::from_secs(20))
        .expect("block 2 was created while block 1's lock was held")
        .unwrap();
    // ...while a block sharing block 1's stripe does.
    let (same, t65) = create(1 + LOCK_STRIPES as u64);
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        matches!(same.try_recv(), Err(mpsc::TryRecvError::Empty)),
        "a create of a block on the held stripe finished"
    );
    drop(held);
    same.recv_timeout(Duration::from_secs(20))
        .expect("the create finished once the lock was free")
        .unwrap();
    t2.join().unwrap();
    t65.join().unwrap();
}
