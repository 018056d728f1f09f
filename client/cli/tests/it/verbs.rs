//! The `hdfs dfs` verbs through the real `sluice` binary against a real cluster (`sluice
//! local`, three DataNodes): several sources, into directories, du/count/df/report agreeing,
//! test exit codes, touchz, tail and tail -f, cp, checksum, setrep -w; and an interrupted or crashed
//! `put` leaving no `._COPYING_` file behind (or one that the retry takes over after the lease
//! soft limit).

use sluice_testkit::{random_bytes, wait_until, within};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// `sluice local` on free ports with `data` as its directory; returns it and its RPC address.
async fn start_local(data: &Path, config: Option<&Path>) -> (Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(["local", "--port", "0", "--http-port", "0", "--data"])
        .arg(data)
        .env_remove("SLUICE_CONFIG")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    let mut child = cmd.spawn().expect("spawn sluice local");
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

fn sluice_cmd(addr: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.args(["--metadata", addr])
        .args(args)
        .env_remove("SLUICE_CONFIG")
        .env("RUST_LOG", "error")
        .stdin(Stdio::null());
    c
}

async fn sluice(addr: &str, args: &[&str]) -> Output {
    sluice_cmd(addr, args).output().await.expect("run sluice")
}

/// Runs a command that must succeed; returns its stdout.
async fn ok(addr: &str, args: &[&str]) -> String {
    let o = sluice(addr, args).await;
    assert!(
        o.status.success(),
        "sluice {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // No progress bar (nor anything else) when stderr is not a terminal.
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs a command that must fail with exit code 1 and one error line; returns that line.
async fn fails(addr: &str, args: &[&str]) -> String {
    let o = sluice(addr, args).await;
    assert_eq!(o.status.code(), Some(1), "sluice {args:?} should fail");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "one error line: {err}");
    err
}

async fn exit_code(addr: &str, args: &[&str]) -> i32 {
    sluice(addr, args).await.status.code().expect("exit code")
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hdfs_verbs_work_and_agree_with_each_other() {
    within(240, async {
        let dir = tempfile::tempdir().unwrap();
        let (child, addr) = start_local(&dir.path().join("cluster"), None).await;
        let a = &addr;
        let (da, db) = (random_bytes(200_000, 1), random_bytes(5_000, 2));
        let (la, lb) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&la, &da).unwrap();
        std::fs::write(&lb, &db).unwrap();
        let (la, lb) = (la.to_str().unwrap(), lb.to_str().unwrap());

        // Several sources go into an existing directory, and only into one.
        ok(a, &["mkdir", "/d"]).await;
        ok(a, &["put", la, lb, "/d"]).await;
        let err = fails(a, &["put", la, lb, "/nodir"]).await;
        assert!(err.contains("is not a directory"), "{err}");
        let o = sluice(a, &["cat", "/d/a", "/d/b"]).await;
        assert!(o.status.success());
        assert!(o.stdout == [da.as_slice(), db.as_slice()].concat());

        // ls -d, ls --json, stat --json.
        let text = ok(a, &["ls", "-d", "/d"]).await;
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.starts_with('d') && text.trim_end().ends_with(" /d"),
            "{text}"
        );
        let listed = json(&ok(a, &["ls", "--json", "/d"]).await);
        let lengths: Vec<u64> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["length"].as_u64().unwrap())
            .collect();
        assert_eq!(lengths, vec![200_000, 5_000]);
        let st = json(&ok(a, &["stat", "--json", "/d/a"]).await);
        assert_eq!(st["length"], 200_000);
        assert_eq!(st["replication"], 3);

        // du, count and the JSON of du agree: 205000 bytes, three replicas each.
        let du = ok(a, &["du", "-s", "/d"]).await;
        let cols: Vec<&str> = du.split_whitespace().collect();
        assert_eq!(cols, vec!["205000", "615000", "/d"], "{du}");
        let du = ok(a, &["du", "/d"]).await;
        assert_eq!(du.lines().count(), 2, "{du}");
        assert!(du.lines().next().unwrap().starts_with("200000"), "{du}");
        let count = ok(a, &["count", "/d"]).await;
        let cols: Vec<&str> = count.split_whitespace().collect();
        assert_eq!(cols, vec!["1", "2", "205000", "/d"], "{count}");
        let count = ok(a, &["count", "-q", "/d"]).await;
        let cols: Vec<&str> = count.split_whitespace().collect();
        assert_eq!(cols[..4], ["none", "inf", "none", "inf"], "{count}");

        // test: exit codes only.
        assert_eq!(exit_code(a, &["test", "-e", "/d/a"]).await, 0);
        assert_eq!(exit_code(a, &["test", "-e", "/nope"]).await, 1);
        assert_eq!(exit_code(a, &["test", "-d", "/d"]).await, 0);
        assert_eq!(exit_code(a, &["test", "-f", "/d"]).await, 1);
        assert_eq!(exit_code(a, &["test", "-f", "/d/a"]).await, 0);
        assert_eq!(exit_code(a, &["test", "-z", "/d/a"]).await, 1);
        assert_eq!(exit_code(a, &["test", "-s", "/d"]).await, 0);

        // touchz: an empty file; a non-empty one refuses.
        ok(a, &["touchz", "/d/empty"]).await;
        assert_eq!(exit_code(a, &["test", "-z", "/d/empty"]).await, 0);
        ok(a, &["touchz", "/d/empty"]).await;
        let err = fails(a, &["touchz", "/d/a"]).await;
        assert!(err.contains("not a zero-length file"), "{err}");

        // cp and mv, one file or several into a directory.
        ok(a, &["cp", "/d/a", "/c"]).await;
        ok(a, &["mkdir", "/e"]).await;
        ok(a, &["cp", "/d/a", "/d/b", "/e"]).await;
        ok(a, &["mv", "/c", "/e"]).await;
        let o = sluice(a, &["cat", "/e/a", "/e/b", "/e/c"]).await;
        assert!(o.stdout == [da.as_slice(), db.as_slice(), da.as_slice()].concat());
        assert_eq!(exit_code(a, &["test", "-e", "/c"]).await, 1);
        let err = fails(a, &["cp", "/d/a", "/e/a"]).await;
        assert!(err.contains("already exists"), "{err}");

        // checksum: equal for equal contents, whatever the block size.
        ok(a, &["put", "--block-size", "64KiB", la, "/small-blocks"]).await;
        let sums = ok(a, &["checksum", "/d/a", "/e/c", "/small-blocks", "/d/b"]).await;
        let sums: Vec<Vec<&str>> = sums.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(sums.len(), 4);
        assert!(sums.iter().all(|s| s[1] == "COMPOSITE-CRC32C"), "{sums:?}");
        let want = format!("{:08x}", crc32c::crc32c(&da));
        assert_eq!(sums[0][2], want);
        assert_eq!(sums[1][2], want);
        assert_eq!(sums[2][2], want);
        assert_ne!(sums[3][2], want);

        // tail: the last kilobyte.
        let o = sluice(a, &["tail", "/d/a"]).await;
        assert!(o.stdout == da[da.len() - 1024..]);

        // get of several files into a local directory.
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        ok(a, &["get", "/d/a", "/d/b", out.to_str().unwrap()]).await;
        assert!(std::fs::read(out.join("a")).unwrap() == da);
        assert!(std::fs::read(out.join("b")).unwrap() == db);

        // get into a FIFO (as into /dev/null): written in place, still a FIFO afterwards, no
        // `-f` needed. The copy-then-rename of a regular target would replace it by a file.
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success(), "mkfifo");
        // A thread of its own, not the blocking pool: should `get` never open the FIFO, the
        // test fails instead of the runtime waiting for this reader at shutdown.
        let drain = std::thread::Builder::new()
            .name("fifo-drain".into())
            .spawn({
                let fifo = fifo.clone();
                move || std::fs::read(fifo).unwrap()
            })
            .unwrap();
        ok(a, &["get", "/d/a", fifo.to_str().unwrap()]).await;
        assert!(drain.join().unwrap() == da, "the bytes through the FIFO");
        use std::os::unix::fs::FileTypeExt;
        let kind = std::fs::metadata(&fifo).unwrap().file_type();
        assert!(kind.is_fifo(), "still a FIFO: {kind:?}");

        // A local write that fails names what was written: a full device as the target of
        // `get`, and as `cat`'s stdout.
        if std::path::Path::new("/dev/full").exists() {
            let err = fails(a, &["get", "/d/a", "/dev/full"]).await;
            assert!(
                err.contains("/dev/full") && err.contains("No space left on device"),
                "{err}"
            );
            let full = std::fs::File::options()
                .write(true)
                .open("/dev/full")
                .unwrap();
            // `output()` would capture stdout over the file given: spawn, then wait.
            let o = sluice_cmd(a, &["cat", "/d/a"])
                .stdout(full)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
                .wait_with_output()
                .await
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{err}");
            assert!(
                err.contains("stdout") && err.contains("No space left on device"),
                "{err}"
            );
        }

        // setrep -w: repair brings every block to the new factor, up and down.
        ok(
            a,
            &[
                "put",
                "--replication",
                "1",
                "--block-size",
                "64KiB",
                la,
                "/r",
            ],
        )
        .await;
        for n in [3u64, 2] {
            let out = ok(a, &["setrep", "-w", &n.to_string(), "/r"]).await;
            assert!(out.contains(&format!("Replication {n} set: /r")), "{out}");
            assert!(out.contains("done"), "{out}");
            let fsck = json(&ok(a, &["fsck", "/r", "--json"]).await);
            let blocks = fsck["files"][0]["blocks"].as_array().unwrap();
            assert_eq!(blocks.len(), 4);
            for b in blocks {
                assert_eq!(b["locations"].as_array().unwrap().len() as u64, n, "{b}");
            }
            let st = json(&ok(a, &["stat", "--json", "/r"]).await);
            assert_eq!(st["replication"].as_u64(), Some(n));
        }
        let err = fails(a, &["setrep", "0", "/r"]).await;
        assert!(err.contains("replication"), "{err}");

        // On a terminal (script(1) gives the command a pseudo-terminal) put draws a progress
        // bar on stderr: bytes, rate, ETA. Off a terminal (every other command here) nothing.
        if std::path::Path::new("/usr/bin/script").exists() {
            let big = dir.path().join("big");
            std::fs::write(&big, random_bytes(8 << 20, 5)).unwrap();
            let line = format!(
                "{} --metadata {a} put {} /big 2>&1",
                env!("CARGO_BIN_EXE_sluice"),
                big.display()
            );
            let o = Command::new("/usr/bin/script")
                .args(["-qec", &line, "/dev/null"])
                .env("RUST_LOG", "error")
                .env_remove("SLUICE_CONFIG")
                .stdin(Stdio::null())
                .output()
                .await
                .unwrap();
            assert!(o.status.success(), "{o:?}");
            let tty = String::from_utf8_lossy(&o.stdout);
            assert!(tty.contains("ETA") && tty.contains("/s"), "{tty:?}");
            assert!(ok(a, &["stat", "--json", "/big"]).await.contains("8388608"));
        }

        // df and report tell the same capacity; report has Non DFS Used and DFS Used%.
        let report = json(&ok(a, &["report", "--json"]).await);
        let capacity: u64 = report["datanodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["capacity"].as_u64().unwrap())
            .sum();
        let df = json(&ok(a, &["df", "--json"]).await);
        assert_eq!(df["size"].as_u64(), Some(capacity));
        assert!(capacity > 0);
        let df = ok(a, &["df", "-h"]).await;
        assert!(
            df.starts_with("Filesystem") && df.contains("sluice://"),
            "{df}"
        );
        let text = ok(a, &["report"]).await;
        assert!(text.contains("Non DFS Used: "), "{text}");
        assert!(text.contains("DFS Used%: "), "{text}");

        stop(child).await;
    })
    .await;
}

/// Sends `sig` to a child process.
#[allow(unsafe_code)] // kill(2) on our own child process
fn kill(child: &Child, sig: libc::c_int) {
    let pid = child.id().expect("pid") as libc::pid_t;
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(pid, sig) };
}

async fn stop(mut child: Child) {
    kill(&child, libc::SIGTERM);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("sluice local stops within 30 s after SIGTERM")
        .expect("wait");
    assert!(status.success(), "sluice local exit status {status}");
}

/// Starts `put - dest`, feeds it bytes until its `._COPYING_` file exists, and returns it
/// with its stdin still open.
async fn put_in_flight(addr: &str, dest: &str) -> Child {
    let mut put = sluice_cmd(addr, &["put", "-", dest])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn put");
    let mut stdin = put.stdin.take().expect("stdin");
    stdin
        .write_all(&random_bytes(300_000, 3))
        .await
        .expect("write to put");
    stdin.flush().await.expect("flush to put");
    let copying = format!("{dest}._COPYING_");
    wait_until(
        Duration::from_secs(30),
        "the ._COPYING_ file exists",
        || {
            let copying = copying.clone();
            async move { exit_code(addr, &["test", "-e", &copying]).await == 0 }
        },
    )
    .await;
    // Keep stdin open: the put is still running when the test acts on it.
    tokio::spawn(async move {
        let _stdin = stdin;
        tokio::time::sleep(Duration::from_secs(600)).await;
    });
    put
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_put_leaves_no_copying_file_and_a_crashed_one_is_taken_over() {
    within(240, async {
        let dir = tempfile::tempdir().unwrap();
        // Lease recovery needs the lease soft limit passed, and a service past its stale
        // interval (DataNodes have reported): both short here.
        let cfg = dir.path().join("sluice.toml");
        std::fs::write(
            &cfg,
            "[metadata]\n\"lease.soft.limit\" = \"10s\"\n\"datanode.stale.interval\" = \"2s\"\n\
             \"datanode.dead.interval\" = \"30s\"\n[datanode]\n\"heartbeat.interval\" = \"500ms\"\n",
        )
        .unwrap();
        let (child, addr) = start_local(&dir.path().join("cluster"), Some(&cfg)).await;
        let a = &addr;
        let local = dir.path().join("x");
        std::fs::write(&local, random_bytes(100_000, 4)).unwrap();
        let local = local.to_str().unwrap();

        for sig in [libc::SIGINT, libc::SIGTERM] {
            let put = put_in_flight(a, "/x").await;
            kill(&put, sig);
            let out = put.wait_with_output().await.unwrap();
            assert_eq!(out.status.code(), Some(1));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.starts_with("sluice: put: interrupted by SIG"), "{err}");
            assert_eq!(exit_code(a, &["test", "-e", "/x._COPYING_"]).await, 1);
            assert_eq!(exit_code(a, &["test", "-e", "/x"]).await, 1);
        }

        // A failed source (a directory cannot be read) deletes the ._COPYING_ file too.
        let err = fails(a, &["put", dir.path().to_str().unwrap(), "/y"]).await;
        assert!(err.starts_with("sluice: put: "), "{err}");
        assert_eq!(exit_code(a, &["test", "-e", "/y._COPYING_"]).await, 1);

        // A crashed put leaves its ._COPYING_ file under its lease: a retry before the soft
        // limit is refused, one after it takes the file over and succeeds.
        let put = put_in_flight(a, "/x").await;
        kill(&put, libc::SIGKILL);
        let err = fails(a, &["put", local, "/x"]).await;
        assert!(err.contains("is being written by"), "{err}");
        wait_until(Duration::from_secs(60), "a retried put succeeds", || async {
            sluice(a, &["put", local, "/x"]).await.status.success()
        })
        .await;
        assert_eq!(exit_code(a, &["test", "-e", "/x._COPYING_"]).await, 1);
        let o = sluice(a, &["cat", "/x"]).await;
        assert!(o.stdout == std::fs::read(local).unwrap());

        stop(child).await;
    })
    .await;
}

/// The first `n` lines `sluice local` writes to stderr with `env` set.
async fn local_log_lines(data: &Path, env: &[(&str, &str)], n: usize) -> Vec<String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(["local", "--port", "0", "--http-port", "0", "--data"])
        .arg(data)
        .env_remove("SLUICE_CONFIG")
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn sluice local");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut out = Vec::new();
    while out.len() < n {
        let line = lines.next_line().await.expect("read stderr");
        out.push(line.expect("sluice local stopped logging early"));
    }
    kill(&child, libc::SIGKILL);
    let _ = child.wait().await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_json_lines_on_request_and_never_coloured_off_a_terminal() {
    within(120, async {
        let dir = tempfile::tempdir().unwrap();
        let json_lines =
            local_log_lines(&dir.path().join("j"), &[("SLUICE_LOG__FORMAT", "json")], 5).await;
        for l in &json_lines {
            let v = json(l);
            assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
        }
        let text = local_log_lines(&dir.path().join("t"), &[], 5).await;
        for l in &text {
            assert!(!l.contains('\x1b'), "ANSI escape in {l:?}");
            assert!(serde_json::from_str::<serde_json::Value>(l).is_err(), "{l}");
        }
        // Colour is the operator's choice: forced on, the same lines carry escapes.
        let forced =
            local_log_lines(&dir.path().join("c"), &[("SLUICE_LOG__COLOR", "always")], 5).await;
        assert!(forced.iter().any(|l| l.contains('\x1b')), "{forced:?}");
    })
    .await;
}

/// `tail -f` prints the last kilobyte, then every byte appended afterwards, as it arrives
/// (here: two `appendToFile`s while it runs), and keeps running until stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follow_prints_what_is_appended_while_it_runs() {
    within(180, async {
        let dir = tempfile::tempdir().unwrap();
        let (child, addr) = start_local(&dir.path().join("cluster"), None).await;
        let a = &addr;
        let parts = [
            random_bytes(3_000, 11),
            random_bytes(70_000, 12),
            random_bytes(5, 13),
        ];
        let locals: Vec<String> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let f = dir.path().join(format!("part{i}"));
                std::fs::write(&f, p).unwrap();
                f.to_str().unwrap().to_string()
            })
            .collect();
        ok(a, &["put", &locals[0], "/t"]).await;
        let mut tail = sluice_cmd(a, &["tail", "-f", "/t"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn tail -f");
        let mut stdout = tail.stdout.take().expect("stdout");
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = got.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = stdout.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        let mut want = parts[0][parts[0].len() - 1024..].to_vec();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                ok(a, &["appendToFile", &locals[i], "/t"]).await;
                want.extend_from_slice(part);
            }
            let what = format!("tail -f printed the {} bytes so far", want.len());
            let need = want.len();
            wait_until(Duration::from_secs(30), &what, || {
                let n = got.lock().unwrap().len();
                async move { n >= need }
            })
            .await;
            assert!(*got.lock().unwrap() == want, "tail -f printed other bytes");
        }
        assert!(
            tail.try_wait().unwrap().is_none(),
            "tail -f keeps running after the file stops growing"
        );
        drop(tail);
        stop(child).await;
    })
    .await;
}
