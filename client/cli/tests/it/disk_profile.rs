//! `--disk-profile hdd` end to end: while `sluice bench mixed` runs, its cgroups exist under
//! blkio and memory, hold the benchmark process (which runs the DataNodes) and carry the
//! HDD limits on the disk holding `--dir`; afterwards they are gone and the report says what
//! the profile was charged. Skipped (with a message) without root and cgroup v1 controllers.

#![allow(clippy::unwrap_used)]

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Root with writable v1 blkio and memory hierarchies, or why not.
fn cgroups_usable() -> Result<(), String> {
    for c in ["blkio", "memory"] {
        let root = Path::new("/sys/fs/cgroup").join(c);
        if !root.join("cgroup.procs").exists() {
            return Err(format!("no cgroup v1 {c} controller"));
        }
    }
    let probe = Path::new("/sys/fs/cgroup/blkio").join(format!("it-probe-{}", std::process::id()));
    std::fs::create_dir(&probe).map_err(|e| format!("cannot create a blkio cgroup: {e}"))?;
    let _ = std::fs::remove_dir(&probe);
    Ok(())
}

/// The word after `key` in `line`.
fn after<'a>(line: &'a str, key: &str) -> &'a str {
    let mut w = line.split_whitespace();
    while let Some(x) = w.next() {
        if x == key {
            return w.next().unwrap();
        }
    }
    panic!("no {key:?} in {line:?}")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap()
}

#[test]
#[allow(clippy::disallowed_methods)] // the test's own stderr reader thread
fn hdd_profile_cgroup_holds_the_cluster_with_its_limits_and_is_removed_afterwards() {
    if let Err(why) = cgroups_usable() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = tmp.path().join("bench");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "mixed",
            "--disk-profile",
            "hdd",
            "--json",
            "--writers",
            "1",
        ])
        .args(["--file-size", "1MiB", "--readers", "1", "--read-files", "1"])
        .args([
            "--read-size",
            "1MiB",
            "--duration",
            "3s",
            "--configs",
            "off",
        ])
        .args(["--datanodes", "1", "--dir"])
        .arg(&dir)
        .env_remove("SLUICE_CONFIG")
        .env_remove("SLUICE_METADATA")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(l);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let line = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.starts_with("disk profile: hdd:") => break l,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("no profile line from the benchmark: {e}");
            }
        }
    };
    let blkio = PathBuf::from(after(&line, "blkio"));
    let memory = PathBuf::from(after(&line, "memory"));
    let device = after(&line, "device");
    let pid = child.id().to_string();
    // During the run (the 3 s timed phase has not ended: its report is not out yet).
    for g in [&blkio, &memory] {
        let procs = read(&g.join("cgroup.procs"));
        assert!(
            procs.lines().any(|p| p == pid),
            "{} holds {procs:?}",
            g.display()
        );
    }
    // A whole disk (not a partition) known to the kernel.
    let sys = Path::new("/sys/dev/block").join(device);
    assert!(sys.exists() && !sys.join("partition").exists(), "{device}");
    let dev = device;
    for f in ["read_iops_device", "write_iops_device"] {
        let v = read(&blkio.join(format!("blkio.throttle.{f}")));
        assert_eq!(v.trim(), format!("{dev} 170"), "{f}");
    }
    for f in ["read_bps_device", "write_bps_device"] {
        let v = read(&blkio.join(format!("blkio.throttle.{f}")));
        assert_eq!(v.trim(), format!("{dev} 150000000"), "{f}");
    }
    assert_eq!(
        read(&memory.join("memory.limit_in_bytes")).trim(),
        "1073741824"
    );
    let mut stdout = child.stdout.take().unwrap();
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut stdout, &mut out).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success());
    assert!(
        !blkio.exists() && !memory.exists(),
        "the cgroups are removed"
    );
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let notes = report["notes"].to_string();
    assert!(notes.contains("disk profile charged"), "{notes}");
}
