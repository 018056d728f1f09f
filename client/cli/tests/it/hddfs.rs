//! `sluice hddfs`, the seeking-disk model of `--disk-profile hdd-seek`, as its own process:
//! two files written in 64 KiB fsynced pieces cost one seek each when written one after the
//! other, and a seek per piece when interleaved (the head moves between them); the bytes
//! read back are the bytes written; closing the daemon's standard input unmounts it.
//! Skipped (with a message) without root, /dev/fuse or fusermount3.

#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PIECE: usize = 64 << 10;
const PIECES: usize = 16;

fn usable() -> Result<(), String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("no /dev/fuse".into());
    }
    if !std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return Err("not root".into());
    }
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").exists()));
    if !found {
        return Err("no fusermount3 (Debian fuse3)".into());
    }
    Ok(())
}

fn is_mount(p: &Path) -> bool {
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev());
    match (dev(p), dev(p.parent().unwrap())) {
        (Ok(a), Ok(b)) => a != b,
        _ => true,
    }
}

fn piece(file: u8, i: usize) -> Vec<u8> {
    (0..PIECE)
        .map(|j| (j as u8).wrapping_mul(31) ^ file ^ (i as u8))
        .collect()
}

/// The daemon's counters once it has served at least `writes` write requests.
fn stats_after(path: &Path, writes: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v: Option<Value> = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok());
        if let Some(v) = v.filter(|v| v["writes"].as_u64().unwrap() >= writes) {
            return v;
        }
        assert!(Instant::now() < deadline, "no stats with {writes} writes");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Writes `files` (named by their tag) piece by piece, round robin over the files, each
/// piece followed by `fdatasync` (the kernel writes it back as one request).
fn write_round_robin(mnt: &Path, files: &[u8]) {
    let mut open: Vec<File> = files
        .iter()
        .map(|t| {
            OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(mnt.join(format!("f{t}")))
                .unwrap()
        })
        .collect();
    for i in 0..PIECES {
        for (f, t) in open.iter_mut().zip(files) {
            f.write_all(&piece(*t, i)).unwrap();
            f.sync_data().unwrap();
        }
    }
}

fn delta(a: &Value, b: &Value, k: &str) -> f64 {
    b[k].as_f64().unwrap() - a[k].as_f64().unwrap()
}

/// What the test does on the mount, on a thread the test waits for with a deadline.
fn exercise(mnt: PathBuf, stats: PathBuf) -> (Value, Value, Value) {
    let s0 = stats_after(&stats, 0);
    // One after the other: file 1 whole, then file 2 whole.
    write_round_robin(&mnt, &[1]);
    write_round_robin(&mnt, &[2]);
    let s1 = stats_after(&stats, 2 * PIECES as u64);
    // Interleaved: files 3 and 4 piece by piece.
    write_round_robin(&mnt, &[3, 4]);
    let s2 = stats_after(&stats, 4 * PIECES as u64);
    for t in 1..=4u8 {
        let got = std::fs::read(mnt.join(format!("f{t}"))).unwrap();
        let want: Vec<u8> = (0..PIECES).flat_map(|i| piece(t, i)).collect();
        assert!(got == want, "file {t} reads back other bytes");
    }
    (s0, s1, s2)
}

fn stop(mut child: Child, mnt: &Path) {
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = Command::new("fusermount3").arg("-uz").arg(mnt).status();
            panic!("hddfs did not stop when its stdin closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[allow(clippy::disallowed_methods)] // the test's own worker thread, waited for
fn hddfs_charges_interleaved_writes_a_seek_each_and_reads_back_exactly() {
    if let Err(why) = usable() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (backing, mnt, stats) = (
        tmp.path().join("backing"),
        tmp.path().join("mnt"),
        tmp.path().join("stats.json"),
    );
    std::fs::create_dir_all(&backing).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("hddfs")
        .arg("--backing")
        .arg(&backing)
        .arg("--mount")
        .arg(&mnt)
        .arg("--stats")
        .arg(&stats)
        .arg("--read-ahead-kb=384")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_mount(&mnt) {
        assert!(Instant::now() < deadline, "not mounted after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The mount reads ahead the window asked for (its bdi is 0:<minor of the mount>).
    let dev = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(&mnt).unwrap());
    let bdi = format!(
        "/sys/class/bdi/0:{}/read_ahead_kb",
        (dev & 0xff) | ((dev >> 12) & !0xff)
    );
    let ra = || std::fs::read_to_string(&bdi).unwrap_or_default();
    while ra().trim() != "384" {
        assert!(Instant::now() < deadline, "{bdi} is {} after 10 s", ra());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (tx, rx) = mpsc::channel();
    let (m, s) = (mnt.clone(), stats.clone());
    std::thread::spawn(move || {
        let _ = tx.send(exercise(m, s));
    });
    let outcome = rx.recv_timeout(Duration::from_secs(60));
    stop(child, &mnt);
    assert!(!is_mount(&mnt), "still mounted after the daemon stopped");
    let (s0, s1, s2) = outcome.expect("the writes did not finish in 60 s (or failed)");
    // The data is on the backing directory, whole.
    assert_eq!(
        std::fs::metadata(backing.join("f4")).unwrap().len(),
        (PIECE * PIECES) as u64
    );
    let (seq_seeks, mix_seeks) = (delta(&s0, &s1, "seeks"), delta(&s1, &s2, "seeks"));
    let (seq_busy, mix_busy) = (delta(&s0, &s1, "busy_secs"), delta(&s1, &s2, "busy_secs"));
    let bytes = (2 * PIECE * PIECES) as f64;
    assert_eq!(delta(&s0, &s1, "write_bytes"), bytes);
    assert_eq!(delta(&s1, &s2, "write_bytes"), bytes);
    // One after the other: a seek to each file's start (the head then follows the file).
    assert!(seq_seeks <= 3.0, "sequential: {seq_seeks} seeks");
    // Interleaved: every piece but the first lands a reservation away from the head.
    assert!(
        mix_seeks >= (2 * PIECES - 2) as f64,
        "interleaved: {mix_seeks} seeks"
    );
    // Each seek costs at least track-to-track (1 ms) plus half a turn (4.17 ms).
    let extra = (mix_seeks - seq_seeks) * 0.005;
    assert!(
        mix_busy >= seq_busy + extra,
        "busy {mix_busy:.3} s interleaved vs {seq_busy:.3} s sequential"
    );
}
