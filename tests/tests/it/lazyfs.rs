//! The power-loss rig itself (`sluice_tests::lazyfs`), through a real FUSE mount: what a crash
//! keeps and what it throws away.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_tests::lazyfs::LazyFs;
use sluice_tests::with_timeout;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

/// Runs `f` on a fresh mount in a blocking thread, under a 60 s outer timeout.
async fn on_mount(f: impl FnOnce(&LazyFs) + Send + 'static) {
    let dir = tempfile::tempdir().unwrap();
    let task = tokio::task::spawn_blocking(move || {
        let fs = LazyFs::mount_in(dir.path()).unwrap();
        f(&fs);
        drop(fs);
        drop(dir);
    });
    with_timeout(Duration::from_secs(60), "lazyfs test", task)
        .await
        .unwrap();
}

fn sync_dir(p: &Path) {
    File::open(p).unwrap().sync_all().unwrap();
}

fn write_file(p: &Path, data: &[u8], fsync: bool) {
    let mut f = File::create(p).unwrap();
    f.write_all(data).unwrap();
    if fsync {
        f.sync_all().unwrap();
    }
}

fn read(p: &Path) -> Option<Vec<u8>> {
    std::fs::read(p).ok()
}

fn crash(fs: &LazyFs) {
    fs.crash();
    fs.power_on();
}

#[tokio::test]
async fn unsynced_writes_are_read_back_and_lost_in_a_crash() {
    on_mount(|fs| {
        let p = fs.path().join("f");
        write_file(&p, b"durable", true);
        sync_dir(fs.path());
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b" and not").unwrap();
        assert_eq!(
            read(&p).unwrap(),
            b"durable and not",
            "reads see unsynced data"
        );
        assert_eq!(fs.unsynced().bytes, 8);
        let lost = fs.crash();
        assert_eq!((lost.files, lost.bytes), (1, 8));
        assert!(
            std::fs::metadata(&p).is_err(),
            "powered off: every op fails"
        );
        fs.power_on();
        assert_eq!(read(&p).unwrap(), b"durable");
        let mut buf = Vec::new();
        assert!(
            f.read_to_end(&mut buf).is_err(),
            "handles from before the crash are dead"
        );
        assert_eq!(read(&fs.backing().join("f")).unwrap(), b"durable");
    })
    .await;
}

#[tokio::test]
async fn fsync_and_fdatasync_keep_the_data() {
    on_mount(|fs| {
        let (a, b) = (fs.path().join("a"), fs.path().join("b"));
        write_file(&a, b"by fsync", true);
        let mut f = File::create(&b).unwrap();
        f.write_all(b"by fdatasync").unwrap();
        f.sync_data().unwrap();
        sync_dir(fs.path());
        crash(fs);
        assert_eq!(read(&a).unwrap(), b"by fsync");
        assert_eq!(read(&b).unwrap(), b"by fdatasync");
    })
    .await;
}

#[tokio::test]
async fn a_new_file_needs_its_directory_synced() {
    on_mount(|fs| {
        let p = fs.path().join("new");
        write_file(&p, b"data", true);
        crash(fs);
        assert_eq!(
            read(&p),
            None,
            "fsync of the file alone does not keep its name"
        );
        write_file(&p, b"data", true);
        sync_dir(fs.path());
        crash(fs);
        assert_eq!(read(&p).unwrap(), b"data");
    })
    .await;
}

#[tokio::test]
async fn a_new_directory_needs_its_parent_synced() {
    on_mount(|fs| {
        let d = fs.path().join("d");
        std::fs::create_dir(&d).unwrap();
        write_file(&d.join("f"), b"x", true);
        sync_dir(&d);
        crash(fs);
        assert!(!d.exists(), "the directory and all in it are gone");
        std::fs::create_dir(&d).unwrap();
        sync_dir(fs.path());
        write_file(&d.join("f"), b"x", true);
        sync_dir(&d);
        crash(fs);
        assert_eq!(read(&d.join("f")).unwrap(), b"x");
    })
    .await;
}

#[tokio::test]
async fn a_rename_needs_a_directory_sync() {
    on_mount(|fs| {
        let (src, dst) = (fs.path().join("tmp"), fs.path().join("final"));
        write_file(&dst, b"old", true);
        write_file(&src, b"new", true);
        sync_dir(fs.path());
        std::fs::rename(&src, &dst).unwrap();
        assert_eq!(read(&dst).unwrap(), b"new");
        crash(fs);
        assert_eq!(read(&src).unwrap(), b"new", "the old name is back");
        assert_eq!(
            read(&dst).unwrap(),
            b"old",
            "and so is the file it replaced"
        );
        std::fs::rename(&src, &dst).unwrap();
        sync_dir(fs.path());
        crash(fs);
        assert_eq!(read(&src), None);
        assert_eq!(read(&dst).unwrap(), b"new");
    })
    .await;
}

#[tokio::test]
async fn a_file_moved_between_directories_is_kept_by_syncing_the_destination() {
    on_mount(|fs| {
        let (rbw, fin) = (fs.path().join("rbw"), fs.path().join("finalized"));
        std::fs::create_dir(&rbw).unwrap();
        std::fs::create_dir(&fin).unwrap();
        sync_dir(fs.path());
        write_file(&rbw.join("blk"), b"block", true);
        std::fs::rename(rbw.join("blk"), fin.join("blk")).unwrap();
        sync_dir(&fin);
        crash(fs);
        assert_eq!(read(&fin.join("blk")).unwrap(), b"block");
        assert_eq!(read(&rbw.join("blk")), None);
    })
    .await;
}

#[tokio::test]
async fn unlink_and_truncate_are_undone_until_synced() {
    on_mount(|fs| {
        let (a, b) = (fs.path().join("a"), fs.path().join("b"));
        write_file(&a, b"kept", true);
        write_file(&b, b"0123456789", true);
        sync_dir(fs.path());
        std::fs::remove_file(&a).unwrap();
        let f = OpenOptions::new().write(true).open(&b).unwrap();
        f.set_len(4).unwrap();
        assert_eq!(read(&b).unwrap(), b"0123");
        crash(fs);
        assert_eq!(
            read(&a).unwrap(),
            b"kept",
            "unlink without a directory fsync is undone"
        );
        assert_eq!(
            read(&b).unwrap(),
            b"0123456789",
            "truncate without fsync is undone"
        );
        std::fs::remove_file(&a).unwrap();
        sync_dir(fs.path());
        let f = OpenOptions::new().write(true).open(&b).unwrap();
        f.set_len(4).unwrap();
        f.sync_all().unwrap();
        crash(fs);
        assert_eq!(read(&a), None);
        assert_eq!(read(&b).unwrap(), b"0123");
        let rmdir = fs.path().join("d");
        std::fs::create_dir(&rmdir).unwrap();
        sync_dir(fs.path());
        std::fs::remove_dir(&rmdir).unwrap();
        crash(fs);
        assert!(rmdir.is_dir(), "rmdir without a directory fsync is undone");
    })
    .await;
}

#[tokio::test]
async fn sync_makes_everything_durable_and_overwrites_read_back_exactly() {
    on_mount(|fs| {
        let p = fs.path().join("f");
        let mut f = File::create(&p).unwrap();
        f.write_all(&[1u8; 100_000]).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[2u8; 10], 50_000).unwrap();
        f.write_all_at(&[3u8; 10], 200_000).unwrap();
        let mut want = vec![1u8; 100_000];
        want[50_000..50_010].fill(2);
        want.resize(200_000, 0);
        want.extend_from_slice(&[3u8; 10]);
        assert_eq!(read(&p).unwrap(), want);
        fs.sync().unwrap();
        assert_eq!(fs.unsynced(), Default::default());
        crash(fs);
        assert_eq!(read(&p).unwrap(), want);
    })
    .await;
}
