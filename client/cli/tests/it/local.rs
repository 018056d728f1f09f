//! `sluice local`: the embedded cluster starts, serves put/get/fsck through the real binary,
//! and stops on SIGTERM; restarted on the same directory, the file is still there.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

async fn start_local(data: &Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["local", "--port", "0", "--http-port", "0", "--data"])
        .arg(data)
        .env_remove("SLUICE_CONFIG")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn sluice local");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines
            .next_line()
            .await
            .expect("read stdout")
            .expect("sluice local exited before it was ready");
        if let Some(rest) = line.trim().strip_prefix("metadata RPC") {
            break rest.split_whitespace().next().expect("address").to_string();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

async fn sluice(addr: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--metadata", addr])
        .args(args)
        .env_remove("SLUICE_CONFIG")
        .output()
        .await
        .expect("run sluice")
}

#[allow(unsafe_code)] // kill(2) on our own child process
async fn stop(mut child: Child) {
    let pid = child.id().expect("pid") as libc::pid_t;
    // SAFETY: sending SIGTERM to our own child process.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("sluice local stops within 30 s after SIGTERM")
        .expect("wait");
    assert!(status.success(), "sluice local exit status {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_cluster_serves_put_get_fsck_and_survives_a_restart() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("cluster");
        let input = dir.path().join("in.bin");
        let bytes: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(&input, &bytes).unwrap();

        let (child, addr) = start_local(&data_dir).await;
        let o = sluice(
            &addr,
            &[
                "put",
                input.to_str().unwrap(),
                "/d/in.bin",
                "--block-size",
                "1MiB",
            ],
        )
        .await;
        assert!(
            o.status.success(),
            "put: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let o = sluice(&addr, &["fsck", "/d/in.bin", "--json"]).await;
        assert!(o.status.success());
        let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let blocks = report["files"][0]["blocks"].as_array().unwrap();
        assert_eq!(blocks.len(), 3);
        for b in blocks {
            assert_eq!(b["locations"].as_array().unwrap().len(), 3, "{b}");
        }
        assert_eq!(report["health"], "Healthy");
        stop(child).await;

        let (child, addr) = start_local(&data_dir).await;
        let out = dir.path().join("out.bin");
        let o = sluice(&addr, &["get", "/d/in.bin", out.to_str().unwrap()]).await;
        assert!(
            o.status.success(),
            "get after restart: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(std::fs::read(&out).unwrap() == bytes);

        // appendToFile: two local files and stdin onto the file (its last block is partial),
        // and onto a missing file, which it creates.
        let small = dir.path().join("small.txt");
        std::fs::write(&small, b"appended line\n").unwrap();
        let (i, s) = (input.to_str().unwrap(), small.to_str().unwrap());
        let mut child_in = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["--metadata", &addr, "appendToFile", s, i, "-", "/d/in.bin"])
            .env_remove("SLUICE_CONFIG")
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use tokio::io::AsyncWriteExt;
            let mut stdin = child_in.stdin.take().unwrap();
            stdin.write_all(b"from stdin").await.unwrap();
        }
        let o = child_in.wait_with_output().await.unwrap();
        assert!(
            o.status.success(),
            "appendToFile: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let mut want = bytes.clone();
        want.extend_from_slice(b"appended line\n");
        want.extend_from_slice(&bytes);
        want.extend_from_slice(b"from stdin");
        let o = sluice(&addr, &["cat", "/d/in.bin"]).await;
        assert!(
            o.status.success() && o.stdout == want,
            "cat after appendToFile"
        );
        let o = sluice(&addr, &["appendToFile", s, "/d/new.txt"]).await;
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = sluice(&addr, &["appendToFile", s, "/d/new.txt"]).await;
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = sluice(&addr, &["cat", "/d/new.txt"]).await;
        assert_eq!(o.stdout, b"appended line\nappended line\n");
        stop(child).await;
    })
    .await
    .expect("test timed out");
}
