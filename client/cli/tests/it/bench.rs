//! The benchmarks run end to end on tiny embedded clusters: `sluice bench read` reports every
//! configuration (both modes, warm and cold, prefetch as configured, with advice, into buffers
//! only, off) with its ratios; `bench write` and `bench mixed` report each batching
//! configuration, with block-file write calls counted on buffered and unbuffered replicas;
//! `bench read` and `bench write` carry each row's floor (the same bytes without Sluice,
//! measured in the same run) and the ratios.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `sluice bench <args> --json --dir <dir>` under an outer timeout (the child is killed
/// when it passes) and returns its JSON report; `dir` must be gone afterwards.
#[allow(clippy::disallowed_methods)] // a test's own thread, joined by the test
fn bench(args: &[&str], dir: &Path, limit: Duration) -> serde_json::Value {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("bench")
        .args(args)
        .args(["--json", "--dir"])
        .arg(dir)
        .env_remove("SLUICE_CONFIG")
        .env_remove("SLUICE_METADATA")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    // Drain stdout on a thread so a large report cannot block the child.
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut v).map(|_| v)
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluice bench {args:?} did not finish in {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = reader.join().unwrap().unwrap();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert!(status.success(), "bench {args:?} failed: {stderr}");
    assert!(!dir.exists(), "the cluster directory is removed");
    serde_json::from_slice(&out).unwrap()
}

/// A row measured against its floor in the same run: Sluice's MB/s and CPU per GiB, the
/// floor's, and the ratios.
fn assert_vs_floor(row: &serde_json::Value) {
    let num = |k: &str| {
        row[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} missing: {row:#}"))
    };
    assert!(num("mb_s") > 0.0 && num("floor_mb_s") > 0.0, "{row:#}");
    assert!(num("cpu_s_per_gib") >= 0.0 && num("floor_cpu_s_per_gib") >= 0.0);
    let ratio = num("mb_s") / num("floor_mb_s");
    assert!(
        (num("mb_s_vs_floor") - ratio).abs() < 1e-9 * ratio.max(1.0),
        "{row:#}"
    );
    assert!(num("cpu_vs_floor") >= 0.0, "{row:#}");
}

#[test]
fn bench_read_reports_both_modes_warm_and_cold_and_prefetch_off() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bench");
    let args = ["read", "--size", "2MiB", "--block-size", "1MiB"];
    let args = [&args[..], &["--threads", "2", "--runs", "2"]].concat();
    let report = bench(&args, &dir, Duration::from_secs(180));
    let rows = report["rows"].as_array().unwrap();
    // (1 and 2 threads) x (warm, cold) x (stream, chunk) as configured, then stream with
    // kernel advice forced, into buffers only, and with prefetch off.
    assert_eq!(rows.len(), 20, "{report:#}");
    for r in rows {
        assert_eq!(r["runs"].as_array().unwrap().len(), 2);
        assert!(r["mb_per_s"]["median"].as_f64().unwrap() > 0.0);
        assert_eq!(r["floor_runs"].as_array().unwrap().len(), 2, "{r:#}");
        assert_vs_floor(r);
    }
    let off = rows.iter().filter(|r| r["prefetch"] == "off").count();
    assert_eq!(off, 4);
    for label in ["8MiB,auto", "8MiB,advice", "8MiB,no-advice"] {
        let stream = rows
            .iter()
            .filter(|r| r["prefetch"] == label && r["mode"] == "stream");
        assert_eq!(stream.count(), 4, "{label}");
    }
    // One warm stream, in each of the four prefetch configurations, paired with both loopback
    // copies (one buffer; the file's bytes) before each of its runs.
    for r in rows {
        let paired = r["threads"] == 1 && r["cache"] == "warm" && r["mode"] == "stream";
        for (ratio, runs) in [
            ("mb_s_vs_loopback", "loopback_runs"),
            ("mb_s_vs_loopback_file", "loopback_file_runs"),
        ] {
            assert_eq!(r[ratio].is_f64(), paired, "{ratio}: {r:#}");
            let copies = r[runs].as_array().map_or(0, Vec::len);
            assert_eq!(copies, if paired { 2 } else { 0 }, "{runs}: {r:#}");
        }
    }
    // stream/chunk (4), each prefetch configuration against off (3 x 4), stream/loopback
    // copy and stream/copy of the file's bytes (4 each).
    assert_eq!(report["ratios"].as_array().unwrap().len(), 24, "{report:#}");
    assert!(report["loopback"]["mb_per_s"]["median"].as_f64().unwrap() > 0.0);
}

/// The block-file write calls per MiB of a row: buffered replicas batch 64 KiB packets into
/// 4 MiB flushes, so they make far fewer calls than unbuffered ones.
fn calls(row: &serde_json::Value, key: &str) -> Option<f64> {
    row[key].as_f64()
}

#[test]
fn bench_write_compares_batching_off_and_on_with_write_calls_per_mib() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bench");
    let args = ["write", "--single-size", "8MiB", "--writers", "4"];
    let args = [&args[..], &["--writer-size", "2MiB", "--runs", "1"]].concat();
    let report = bench(&args, &dir, Duration::from_secs(180));
    let rows = report["rows"].as_array().unwrap();
    // (single writer, many writers) x (off, last replica).
    assert_eq!(rows.len(), 4, "{report:#}");
    for r in rows {
        assert!(r["mb_per_s"]["median"].as_f64().unwrap() > 0.0, "{r:#}");
        assert_vs_floor(r);
        let direct = calls(r, "direct_calls_per_mib").expect("unbuffered replicas");
        match r["batching"].as_str().unwrap() {
            "off" => assert!(calls(r, "buffered_calls_per_mib").is_none(), "{r:#}"),
            _ => {
                let buffered = calls(r, "buffered_calls_per_mib").expect("buffered");
                assert!(buffered < direct, "{r:#}");
            }
        }
    }
}

#[test]
fn bench_mixed_reports_every_batching_configuration() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bench");
    let args = [
        "mixed",
        "--writers",
        "2",
        "--file-size",
        "2MiB",
        "--readers",
        "2",
    ];
    let args = [&args[..], &["--read-files", "2", "--read-size", "256KiB"]].concat();
    let args = [&args[..], &["--duration", "2s"]].concat();
    let report = bench(&args, &dir, Duration::from_secs(180));
    let rows = report["rows"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["batching"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["off", "last-replica", "all-replicas"], "{report:#}");
    for r in rows {
        assert!(
            r["read_mb_per_s"]["median"].as_f64().unwrap() > 0.0,
            "{r:#}"
        );
        assert!(
            r["write_mb_per_s"]["median"].as_f64().unwrap() > 0.0,
            "{r:#}"
        );
        assert!(r["blocks_written"].as_u64().unwrap() > 0, "{r:#}");
    }
}

#[test]
fn bench_meta_reports_every_operation_per_task_count_with_group_commit_off_and_on() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bench");
    let args = ["meta", "--tasks", "1,4", "--ops", "40", "--storm", "300ms"];
    let args = [&args[..], &["--group-commit", "off,on"]].concat();
    let report = bench(&args, &dir, Duration::from_secs(120));
    let rows = report["rows"].as_array().unwrap();
    let ops = [
        "mkdirs",
        "create+close",
        "stat",
        "open",
        "rename",
        "delete",
        "stat under create storm",
        "create+close (storm)",
    ];
    // (off, on) x (1, 4 tasks) x every operation.
    assert_eq!(rows.len(), 2 * 2 * ops.len(), "{report:#}");
    for setting in ["off", "on"] {
        for tasks in [1, 4] {
            for op in ops {
                let r = rows
                    .iter()
                    .find(|r| r["group_commit"] == setting && r["tasks"] == tasks && r["op"] == op)
                    .unwrap_or_else(|| panic!("no row {setting} {tasks} {op}: {report:#}"));
                assert!(r["ops_per_s"].as_f64().unwrap() > 0.0, "{r}");
                assert!(r["p99_ms"].as_f64().unwrap() >= r["p50_ms"].as_f64().unwrap());
                if !op.contains("storm") {
                    // Every phase ran all of its operations (40 over the tasks).
                    assert_eq!(r["ops"], 40, "{r}");
                }
            }
        }
    }
}
