//! Integration tests of the service as a whole: restart on the same directory, liveness,
//! HTTP endpoints, bad connections, start-up failures, and a throughput measurement.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_on_the_same_directory() {
    within(60, async {
        let dir = tempfile::tempdir().unwrap();
        let r = Running::start(config(dir.path())).await;
        r.register(3).await;
        let blocks = r.write("/keep/file", &[4096, 100]).await;
        r.client
            .create(ctx(), "/keep/open".into(), opts())
            .await
            .unwrap()
            .unwrap();
        let open_block = r
            .client
            .add_block(ctx(), "/keep/open".into(), CLIENT.into(), None, vec![])
            .await
            .unwrap()
            .unwrap();
        r.stop().await;

        let r = Running::start(config(dir.path())).await;
        let st = r
            .client
            .stat(ctx(), "/keep/file".into())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (st.length, st.block_count, st.under_construction),
            (4196, 2, false)
        );
        let open = r
            .client
            .stat(ctx(), "/keep/open".into())
            .await
            .unwrap()
            .unwrap();
        assert!(open.under_construction);
        let lbs = r
            .client
            .get_block_locations(ctx(), "/keep/file".into(), 0, u64::MAX)
            .await
            .unwrap()
            .unwrap();
        let got: Vec<ExtendedBlock> = lbs.blocks.iter().map(|b| b.block).collect();
        assert_eq!(got, blocks);
        // DataNodes come back with their reports.
        r.register(3).await;
        for i in 0..3 {
            let reps = blocks
                .iter()
                .map(|b| ReplicaReport {
                    block: *b,
                    state: ReplicaState::Finalized,
                })
                .collect();
            let n =
                r.dn.block_report(ctx(), NodeId(format!("dn{i}")), reps)
                    .await
                    .unwrap();
            assert_eq!(n, Ok(0));
        }
        let fsck = r
            .client
            .fsck(ctx(), "/keep/file".into())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(fsck.health, Health::Healthy);
        // Counters did not go backwards.
        let b = r.write("/new", &[1]).await;
        assert!(b[0].id > open_block.block.id);
        assert!(b[0].gen_stamp > open_block.block.gen_stamp);
        r.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_datanode_goes_stale_then_dead() {
    within(30, async {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.stale_interval = HumanDuration::millis(300);
        cfg.dead_interval = HumanDuration::millis(700);
        cfg.monitor_interval = HumanDuration::millis(50);
        let r = Running::start(cfg).await;
        r.register(3).await;
        r.write("/f", &[5]).await;
        // dn0 and dn1 heartbeat; dn2 stays silent.
        let client = r.client.clone();
        let state_of = |n: &'static str| {
            let client = client.clone();
            async move {
                let report = client.cluster_report(ctx()).await.unwrap().unwrap();
                report
                    .datanodes
                    .into_iter()
                    .find(|d| d.id.node_id.0 == n)
                    .map(|d| d.state)
            }
        };
        wait_until(Duration::from_secs(10), "dn2 dead", || async {
            r.heartbeat("dn0").await;
            r.heartbeat("dn1").await;
            state_of("dn2").await == Some(sluice_common::rpc::NodeState::Dead)
        })
        .await;
        assert_eq!(
            state_of("dn0").await,
            Some(sluice_common::rpc::NodeState::Live)
        );
        let fsck = r.client.fsck(ctx(), "/".into()).await.unwrap().unwrap();
        assert_eq!(fsck.health, Health::UnderReplicated);
        assert_eq!(fsck.files[0].blocks[0].locations.len(), 2);
        assert_eq!(r.heartbeat("dn2").await, vec![DatanodeCommand::Reregister]);
        r.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_preamble_is_closed_and_the_server_stays_up() {
    within(30, async {
        let dir = tempfile::tempdir().unwrap();
        let r = Running::start(config(dir.path())).await;
        let mut s = tokio::net::TcpStream::connect(r.server.rpc_addr())
            .await
            .unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 16];
        let n = s.read(&mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "connection closed without an answer");
        // Garbage after a valid preamble only ends that connection.
        let mut s = tokio::net::TcpStream::connect(r.server.rpc_addr())
            .await
            .unwrap();
        s.write_all(b"SLC1\x00\x00\x00\x05hello").await.unwrap();
        // A known preamble is echoed: the connection was taken by the service.
        let mut echo = [0u8; 4];
        s.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"SLC1");
        let _ = s.read(&mut buf).await;
        let st = r.client.stat(ctx(), "/".into()).await.unwrap().unwrap();
        assert_eq!(st.kind, FileKind::Directory);
        // A connection that never sends its preamble does not hold up shutdown.
        let _silent = tokio::net::TcpStream::connect(r.server.rpc_addr())
            .await
            .unwrap();
        let stopping = Instant::now();
        r.stop().await;
        assert!(
            stopping.elapsed() < Duration::from_secs(3),
            "{:?}",
            stopping.elapsed()
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_start_names_the_address_and_releases_the_store() {
    within(30, async {
        let dir = tempfile::tempdir().unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut cfg = config(dir.path());
        cfg.rpc_port = taken.local_addr().unwrap().port();
        let err = MetadataServer::start(cfg, CancellationToken::new())
            .await
            .err()
            .expect("port in use");
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                sluice_metadata::MetadataError::Bind { what: "rpc", .. }
            ),
            "{msg}"
        );
        assert!(
            msg.contains(&taken.local_addr().unwrap().port().to_string()),
            "{msg}"
        );
        // The store was released: a server starts on the same directory at once.
        let r = Running::start(config(dir.path())).await;
        r.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_health_status_metrics() {
    within(30, async {
        let dir = tempfile::tempdir().unwrap();
        let r = Running::start(config(dir.path())).await;
        r.register(3).await;
        r.write("/f", &[5]).await;
        let addr = r.server.http_addr();
        let (code, body) = http_get(addr, "/health").await;
        assert_eq!((code, body.as_str()), (200, r#"{"status":"ok"}"#));
        let (code, body) = http_get(addr, "/status").await;
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["rpc_address"], r.server.rpc_addr().to_string());
        assert_eq!(v["namespace"]["files"], 1);
        assert_eq!(v["cluster"]["datanodes"].as_array().unwrap().len(), 3);
        let (code, body) = http_get(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("sluice_metadata_files 1"), "{body}");
        assert!(
            body.contains("sluice_metadata_datanodes{state=\"live\"} 3"),
            "{body}"
        );
        assert!(
            body.contains("sluice_metadata_rpc_calls_total{method=\"add_block\"} 1"),
            "{body}"
        );
        let (code, _) = http_get(addr, "/nope").await;
        assert_eq!(code, 404);
        r.stop().await;
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "http stopped"
        );
    })
    .await
}

/// Throughput of durable namespace changes and of the write path over RPC. Not part of the
/// suite (`cargo test -p sluice-metadata --release --test it -- service:: --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_rpc_throughput() {
    within(300, async {
        let dir = tempfile::tempdir().unwrap();
        let r = Running::start(config(dir.path())).await;
        r.register(3).await;
        for clients in [1usize, 16] {
            let n = 2000 / clients;
            let started = Instant::now();
            let tasks = (0..clients).map(|c| {
                let client = r.client.clone();
                async move {
                    for i in 0..n {
                        let p = format!("/bench{clients}/c{c}/d{i}");
                        client.mkdirs(ctx(), p, true).await.unwrap().unwrap();
                    }
                }
            });
            futures::future::join_all(tasks).await;
            let secs = started.elapsed().as_secs_f64();
            println!(
                "mkdirs (durable): {clients:>2} clients, {} ops in {secs:.2}s = {:.0} ops/s",
                n * clients,
                (n * clients) as f64 / secs
            );
        }
        let started = Instant::now();
        let files = 300;
        for i in 0..files {
            r.write(&format!("/files/f{i}"), &[1 << 20]).await;
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "create+add_block+block_received x3+complete: {files} files in {secs:.2}s = {:.2} ms/file",
            secs * 1000.0 / files as f64
        );
        r.stop().await;
    })
    .await
}
