//! `sluice bench read` runs end to end on a tiny embedded cluster and reports every
//! configuration (both modes, warm and cold, prefetch as configured, with advice, into buffers
//! only, off) with its ratios.

#![cfg(feature = "embedded")]
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn bench_read_reports_both_modes_warm_and_cold_and_prefetch_off() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bench");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "read", "--size", "2MiB", "--block-size", "1MiB"])
        .args(["--threads", "2", "--runs", "2", "--json", "--dir"])
        .arg(&dir)
        .env_remove("SLUICE_CONFIG")
        .env_remove("SLUICE_METADATA")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    // (1 and 2 threads) x (warm, cold) x (stream, chunk) as configured, then stream with
    // kernel advice forced, into buffers only, and with prefetch off.
    assert_eq!(rows.len(), 20, "{report:#}");
    for r in rows {
        assert_eq!(r["runs"].as_array().unwrap().len(), 2);
        assert!(r["mb_per_s"]["median"].as_f64().unwrap() > 0.0);
    }
    let off = rows.iter().filter(|r| r["prefetch"] == "off").count();
    assert_eq!(off, 4);
    for label in ["8MiB,auto", "8MiB,advice", "8MiB,no-advice"] {
        let stream = rows
            .iter()
            .filter(|r| r["prefetch"] == label && r["mode"] == "stream");
        assert_eq!(stream.count(), 4, "{label}");
    }
    // stream/chunk (4), and each prefetch configuration against off (3 x 4).
    assert_eq!(report["ratios"].as_array().unwrap().len(), 16, "{report:#}");
    assert!(report["loopback"]["mb_per_s"]["median"].as_f64().unwrap() > 0.0);
    assert!(!dir.exists(), "the cluster directory is removed");
}
