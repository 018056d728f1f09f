//! Integration tests through a real RPC port (127.0.0.1:0): the client and DataNode protocols,
//! restart on the same directory, heartbeat commands, liveness, HTTP endpoints.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use sluice_common::config::{HumanDuration, MetadataConfig};
use sluice_common::proto::ReplicaState;
use sluice_common::rpc::{
    connect_client_protocol, connect_datanode_protocol, context_with_timeout, ClientProtocolClient,
    CreateOptions, DatanodeCommand, DatanodeProtocolClient, DatanodeRegistration, FileKind, Health,
    Heartbeat, ReplicaEvent, ReplicaReport,
};
use sluice_common::{DatanodeId, ExtendedBlock, MetaError, NodeId};
use sluice_metadata::MetadataServer;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const CLIENT: &str = "it-client";

fn ctx() -> tarpc::context::Context {
    context_with_timeout(Duration::from_secs(10))
}

fn config(dir: &Path) -> MetadataConfig {
    MetadataConfig {
        bind_host: "127.0.0.1".into(),
        rpc_port: 0,
        http_port: 0,
        data_dir: dir.to_path_buf(),
        ..MetadataConfig::default()
    }
}

struct Running {
    server: MetadataServer,
    token: CancellationToken,
    client: ClientProtocolClient,
    dn: DatanodeProtocolClient,
}

impl Running {
    async fn start(cfg: MetadataConfig) -> Running {
        let token = CancellationToken::new();
        let server = MetadataServer::start(cfg, token.clone()).await.unwrap();
        let client = connect_client_protocol(server.rpc_addr()).await.unwrap();
        let dn = connect_datanode_protocol(server.rpc_addr()).await.unwrap();
        Running {
            server,
            token,
            client,
            dn,
        }
    }

    async fn stop(self) {
        self.token.cancel();
        self.server.wait().await;
    }

    async fn register(&self, n: usize) {
        for i in 0..n {
            let reg = DatanodeRegistration {
                id: DatanodeId {
                    node_id: NodeId(format!("dn{i}")),
                    data_addr: format!("127.0.0.1:{}", 20000 + i),
                    http_addr: format!("127.0.0.1:{}", 21000 + i),
                    rack: "/default-rack".into(),
                },
                capacity: 1 << 40,
                used: 0,
                remaining: 1 << 40,
            };
            let resp = self.dn.register(ctx(), reg).await.unwrap().unwrap();
            assert!(resp.heartbeat_interval_ms > 0);
        }
    }

    async fn heartbeat(&self, n: &str) -> Vec<DatanodeCommand> {
        let hb = Heartbeat {
            node: NodeId(n.into()),
            capacity: 1 << 40,
            used: 0,
            remaining: 1 << 40,
            active_transfers: 0,
        };
        self.dn
            .heartbeat(ctx(), hb)
            .await
            .unwrap()
            .unwrap()
            .commands
    }

    /// Writes a closed file whose blocks have the given lengths, every pipeline node
    /// reporting each block.
    async fn write(&self, path: &str, lens: &[u64]) -> Vec<ExtendedBlock> {
        let c = &self.client;
        c.create(ctx(), path.into(), opts()).await.unwrap().unwrap();
        let mut prev = None;
        let mut out = vec![];
        for &len in lens {
            let lb = c
                .add_block(ctx(), path.into(), CLIENT.into(), prev, vec![])
                .await
                .unwrap()
                .unwrap();
            let b = ExtendedBlock::new(lb.block.id, lb.block.gen_stamp, len);
            for d in &lb.locations {
                let ev = vec![ReplicaEvent::Received(b)];
                self.dn
                    .block_received(ctx(), d.node_id.clone(), ev)
                    .await
                    .unwrap()
                    .unwrap();
            }
            out.push(b);
            prev = Some(b);
        }
        let done = c
            .complete(ctx(), path.into(), CLIENT.into(), prev)
            .await
            .unwrap()
            .unwrap();
        assert!(done);
        out
    }
}

fn opts() -> CreateOptions {
    CreateOptions {
        client_name: CLIENT.into(),
        overwrite: false,
        create_parent: true,
        replication: 0,
        block_size: 0,
    }
}

async fn within<F: Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("test timed out")
}

/// Polls `cond` until it holds or the deadline passes.
async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_flow_over_rpc() {
    within(30, async {
        let dir = tempfile::tempdir().unwrap();
        let r = Running::start(config(dir.path())).await;
        let c = &r.client;
        r.register(3).await;
        c.mkdirs(ctx(), "/a/b".into(), true).await.unwrap().unwrap();
        let err = c
            .mkdirs(ctx(), "/x/y".into(), false)
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, MetaError::NotFound { .. }));
        c.create(ctx(), "/a/f".into(), opts())
            .await
            .unwrap()
            .unwrap();
        let lb = c
            .add_block(ctx(), "/a/f".into(), CLIENT.into(), None, vec![])
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lb.locations.len(), 3);
        let last = ExtendedBlock::new(lb.block.id, lb.block.gen_stamp, 1000);
        let done = c
            .complete(ctx(), "/a/f".into(), CLIENT.into(), Some(last))
            .await
            .unwrap();
        assert_eq!(done, Ok(false), "no replica reported yet");
        let ev = vec![ReplicaEvent::Received(last)];
        r.dn.block_received(ctx(), lb.locations[0].node_id.clone(), ev)
            .await
            .unwrap()
            .unwrap();
        let done = c
            .complete(ctx(), "/a/f".into(), CLIENT.into(), Some(last))
            .await
            .unwrap();
        assert_eq!(done, Ok(true));
        let st = c.stat(ctx(), "/a/f".into()).await.unwrap().unwrap();
        assert_eq!(
            (st.kind, st.length, st.under_construction),
            (FileKind::File, 1000, false)
        );
        let lbs = c
            .get_block_locations(ctx(), "/a/f".into(), 0, u64::MAX)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lbs.blocks.len(), 1);
        assert_eq!(lbs.blocks[0].locations, vec![lb.locations[0].clone()]);
        let listing = c.list(ctx(), "/a".into()).await.unwrap().unwrap();
        let names: Vec<&str> = listing.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["/a/b", "/a/f"]);
        let fsck = c.fsck(ctx(), "/".into()).await.unwrap().unwrap();
        assert_eq!(fsck.health, Health::UnderReplicated);
        let report = c.cluster_report(ctx()).await.unwrap().unwrap();
        assert_eq!((report.files, report.directories, report.blocks), (1, 3, 1));
        assert_eq!(report.datanodes.len(), 3);
        r.stop().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_one_connection() {
    within(30, async {
        let dir = tempfile::tempdir().unwrap();
        let r = Running::start(config(dir.path())).await;
        let calls = (0..64).map(|i| {
            let c = r.client.clone();
            async move { c.mkdirs(ctx(), format!("/d/{i:02}"), true).await }
        });
        for res in futures::future::join_all(calls).await {
            res.unwrap().unwrap();
        }
        let listing = r.client.list(ctx(), "/d".into()).await.unwrap().unwrap();
        assert_eq!(listing.len(), 64);
        assert_eq!(listing[10].path, "/d/10");
        r.stop().await;
    })
    .await
}

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
async fn delete_reaches_holders_in_their_next_heartbeat() {
    within(30, async {
        let dir = tempfile::tempdir().unwrap();
        let r = Running::start(config(dir.path())).await;
        r.register(4).await;
        let blocks = r.write("/dir/f", &[10, 20]).await;
        let lbs = r
            .client
            .get_block_locations(ctx(), "/dir/f".into(), 0, 100)
            .await
            .unwrap()
            .unwrap();
        let holders: Vec<NodeId> = lbs.blocks[0]
            .locations
            .iter()
            .map(|d| d.node_id.clone())
            .collect();
        let err = r.client.delete(ctx(), "/dir".into(), false).await.unwrap();
        assert!(matches!(err, Err(MetaError::DirectoryNotEmpty { .. })));
        assert_eq!(
            r.client.delete(ctx(), "/dir".into(), true).await.unwrap(),
            Ok(true)
        );
        assert_eq!(
            r.client.delete(ctx(), "/dir".into(), true).await.unwrap(),
            Ok(false)
        );
        for h in &holders {
            let cmds = r.heartbeat(&h.0).await;
            let [DatanodeCommand::Delete { blocks: deleted }] = &cmds[..] else {
                panic!("expected one Delete for {h}: {cmds:?}")
            };
            assert!(deleted.contains(&blocks[0]), "{h}: {deleted:?}");
            assert!(r.heartbeat(&h.0).await.is_empty());
        }
        let unknown = r.heartbeat("never-registered").await;
        assert_eq!(unknown, vec![DatanodeCommand::Reregister]);
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
        wait_until("dn2 dead", Duration::from_secs(10), || async {
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
        let _ = s.read(&mut buf).await;
        let st = r.client.stat(ctx(), "/".into()).await.unwrap().unwrap();
        assert_eq!(st.kind, FileKind::Directory);
        r.stop().await;
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

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (status, body)
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
/// suite (`cargo test -p sluice-metadata --release --test rpc -- --ignored --nocapture`).
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
