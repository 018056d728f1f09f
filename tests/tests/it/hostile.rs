//! Hostile traffic on every port (bounded resources, docs/security.md): each limit closes what would
//! otherwise hold a connection, memory or a buffer for ever, and the cluster keeps serving.
//!
//! Metadata RPC port: an oversized frame prefix, silent and trickling connections, the
//! connection cap, and a client that outlives the idle timeout. HTTP ports (metadata and
//! DataNode): a slowloris header trickle, an unfinished chunked upload, and a slow but steady
//! upload that must still work.

use sluice_common::config::{ByteSize, HumanDuration};
use sluice_common::rpc::CLIENT_PREAMBLE;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, write_all, MiniCluster};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(60);

async fn cluster(idle: Duration, connections: u32) -> MiniCluster {
    sluice_tests::init_logging();
    MiniCluster::builder()
        .datanodes(1)
        .replication(1)
        .configure_metadata(move |m| {
            m.rpc_idle_timeout = HumanDuration(idle);
            m.rpc_connections_max = connections;
        })
        // Clients replace a connection before the service's idle timeout closes it.
        .configure_client(move |c| c.rpc_connection_max_idle = HumanDuration(idle / 2))
        .start()
        .await
        .expect("cluster starts")
}

/// A client-protocol connection past its preamble (the service echoed it).
async fn rpc_conn(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&CLIENT_PREAMBLE).await.unwrap();
    let mut echo = [0u8; 4];
    s.read_exact(&mut echo).await.unwrap();
    assert_eq!(echo, CLIENT_PREAMBLE);
    s
}

/// Reads until the service closes `s`; how long that took.
async fn closed_after(s: &mut TcpStream) -> Duration {
    let t0 = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return t0.elapsed(),
            Ok(_) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_a_prefix_announcing_200_mib_is_closed_at_once() {
    with_timeout(LIMIT, "oversized rpc frame", async {
        let c = cluster(Duration::from_secs(60), 4096).await;
        assert_eq!(
            sluice_common::config::MetadataConfig::default().rpc_max_frame,
            ByteSize::mib(4)
        );
        let mut s = rpc_conn(c.metadata_addr()).await;
        s.write_all(&(200u32 << 20).to_be_bytes()).await.unwrap();
        s.write_all(&[0u8; 1000]).await.unwrap();
        // Closed from its prefix, long before the 60 s idle timeout.
        let took = closed_after(&mut s).await;
        assert!(took < Duration::from_secs(5), "closed after {took:?}");
        // The service still answers everyone else.
        let fs = c.client().await.unwrap();
        fs.mkdirs("/still-here", true).await.unwrap();
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_silent_and_trickling_connections_are_closed_and_clients_reconnect() {
    with_timeout(LIMIT, "idle rpc connections", async {
        let idle = Duration::from_secs(1);
        let c = cluster(idle, 4096).await;
        assert_eq!(
            sluice_common::config::MetadataConfig::default().rpc_idle_timeout,
            HumanDuration::secs(60)
        );
        let fs = c.client().await.unwrap();
        let data = random_bytes(10_000, 1);
        write_all(
            &fs,
            "/a",
            &data,
            sluice_client::WriteOptions::default(),
            4096,
        )
        .await
        .unwrap();

        // After its preamble, a connection that sends nothing.
        let mut silent = rpc_conn(c.metadata_addr()).await;
        // One that trickles a 100-byte frame, a byte every 100 ms (never idle, never done).
        let mut trickle = rpc_conn(c.metadata_addr()).await;
        trickle.write_all(&100u32.to_be_bytes()).await.unwrap();
        let (mut rd, mut wr) = trickle.into_split();
        let writer = tokio::spawn(async move {
            for _ in 0..99 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if wr.write_all(&[1]).await.is_err() {
                    return;
                }
            }
        });
        let took = closed_after(&mut silent).await;
        assert!(took < idle * 3, "silent connection closed after {took:?}");
        let t0 = Instant::now();
        let mut buf = [0u8; 64];
        while !matches!(rd.read(&mut buf).await, Ok(0) | Err(_)) {}
        assert!(
            t0.elapsed() < idle * 3,
            "trickle closed after {:?}",
            t0.elapsed()
        );
        writer.abort();

        // The client's own connection was idle longer than `silent` (and is being closed): its
        // next calls (create is not idempotent) go out on a new one and succeed.
        write_all(
            &fs,
            "/b",
            &data,
            sluice_client::WriteOptions::default(),
            4096,
        )
        .await
        .unwrap();
        assert!(read_all(&fs, "/a").await.unwrap() == data);
        assert!(read_all(&fs, "/b").await.unwrap() == data);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_connections_past_the_cap_are_closed_at_accept() {
    with_timeout(LIMIT, "rpc connection cap", async {
        let cap = 6;
        let c = cluster(Duration::from_secs(60), cap).await;
        assert_eq!(
            sluice_common::config::MetadataConfig::default().rpc_connections_max,
            4096
        );
        let addr = c.metadata_addr();
        // Fill the cap (the DataNode holds some of it); the first one over is closed without
        // the preamble echo.
        let mut held = Vec::new();
        let refused = loop {
            assert!(
                held.len() <= cap as usize,
                "{} connections accepted",
                held.len()
            );
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(&CLIENT_PREAMBLE).await.unwrap();
            let mut echo = [0u8; 4];
            match s.read_exact(&mut echo).await {
                Ok(_) => held.push(s),
                Err(_) => break held.len(),
            }
        };
        assert!(refused <= cap as usize, "{refused}");
        // Once they go, clients are served again.
        drop(held);
        wait_until(LIMIT, "a client connects after the flood", || async {
            match c.client().await {
                Ok(fs) => fs.mkdirs("/after", true).await.is_ok(),
                Err(_) => false,
            }
        })
        .await;
    })
    .await
}

async fn http_cluster(timeout: Duration) -> MiniCluster {
    sluice_tests::init_logging();
    let c = MiniCluster::builder()
        .datanodes(1)
        .replication(1)
        .configure_metadata(move |m| m.http_request_timeout = HumanDuration(timeout))
        .configure_datanodes(move |_, d| {
            d.http_request_timeout = HumanDuration(timeout);
            d.http_body_idle_timeout = HumanDuration(timeout);
        })
        .start()
        .await
        .expect("cluster starts");
    c.wait_live(1).await.unwrap();
    c
}

/// Sends `head` then one more header line every 200 ms (never the blank line); how long until
/// the server closed the connection.
async fn trickle_headers(addr: SocketAddr, head: &str) -> Duration {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(head.as_bytes()).await.unwrap();
    let writer = tokio::spawn(async move {
        for i in 0..300 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if wr
                .write_all(format!("X-Slow-{i}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let t0 = Instant::now();
    let mut buf = [0u8; 1024];
    while !matches!(rd.read(&mut buf).await, Ok(0) | Err(_)) {}
    writer.abort();
    t0.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_a_header_trickle_is_closed_within_the_request_timeout() {
    with_timeout(LIMIT, "slowloris on the HTTP ports", async {
        let timeout = Duration::from_secs(1);
        let c = http_cluster(timeout).await;
        let defaults = sluice_common::config::DatanodeConfig::default();
        assert_eq!(defaults.http_request_timeout, HumanDuration::secs(5));
        assert_eq!(defaults.http_body_idle_timeout, HumanDuration::secs(60));
        let head = "GET /health HTTP/1.1\r\nHost: x\r\n";
        let meta = c.metadata_http_addr().unwrap();
        let dn = c.datanode(0).unwrap().http_addr();
        for addr in [meta, dn] {
            let took = trickle_headers(addr, head).await;
            assert!(took < timeout * 4, "{addr}: closed after {took:?}");
        }
        // Both still answer.
        for addr in [meta, dn] {
            let r = sluice_tests::http::request("GET", &format!("http://{addr}/health"), b"")
                .await
                .unwrap();
            assert_eq!(r.status, 200);
        }
    })
    .await
}

/// The DataNode URL (host:port, path and query) the metadata service redirects a CREATE of
/// `path` to.
async fn create_location(c: &MiniCluster, path: &str) -> (String, String) {
    let url = format!(
        "http://{}/webhdfs/v1{path}?op=CREATE&overwrite=true",
        c.metadata_http_addr().unwrap()
    );
    let r = sluice_tests::http::request("PUT", &url, b"").await.unwrap();
    assert_eq!(r.status, 307);
    let loc = r.header("location").unwrap();
    let rest = loc.strip_prefix("http://").unwrap();
    let slash = rest.find('/').unwrap();
    (rest[..slash].to_string(), rest[slash..].to_string())
}

/// A chunked PUT of `path_query` to `host`: its head.
fn chunked_put(host: &str, path_query: &str) -> String {
    format!("PUT {path_query} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_an_unfinished_upload_is_closed_and_a_slow_steady_one_completes() {
    with_timeout(LIMIT, "unfinished chunked upload", async {
        let timeout = Duration::from_secs(1);
        let c = http_cluster(timeout).await;
        let fs = c.client().await.unwrap();

        // One 1 KiB chunk, then nothing: the DataNode ends the request and the connection.
        let (host, pq) = create_location(&c, "/stalled").await;
        let mut s = TcpStream::connect(&host).await.unwrap();
        s.write_all(chunked_put(&host, &pq).as_bytes())
            .await
            .unwrap();
        s.write_all(b"400\r\n").await.unwrap();
        s.write_all(&[7u8; 1024]).await.unwrap();
        s.write_all(b"\r\n").await.unwrap();
        let took = closed_after(&mut s).await;
        assert!(took < timeout * 5, "closed after {took:?}");
        // No file was made from it.
        wait_until(LIMIT, "the stalled upload leaves no file", || async {
            fs.stat("/stalled").await.is_err()
        })
        .await;

        // A body slower in total than the timeout, but never silent for it, is fine.
        let data = random_bytes(12 * 1024, 3);
        let (host, pq) = create_location(&c, "/steady").await;
        let mut s = TcpStream::connect(&host).await.unwrap();
        s.write_all(chunked_put(&host, &pq).as_bytes())
            .await
            .unwrap();
        let t0 = Instant::now();
        for piece in data.chunks(1024) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            s.write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                .await
                .unwrap();
            s.write_all(piece).await.unwrap();
            s.write_all(b"\r\n").await.unwrap();
        }
        s.write_all(b"0\r\n\r\n").await.unwrap();
        assert!(t0.elapsed() > timeout * 2);
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
        assert!(read_all(&fs, "/steady").await.unwrap() == data);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_a_write_naming_more_targets_than_replication_max_is_refused_before_dialling() {
    use sluice_common::proto::{BlockStage, Op, WriteBlockOp};
    use sluice_common::{BlockId, ExtendedBlock, GenerationStamp, Status};
    with_timeout(LIMIT, "WriteBlock with 600 targets", async {
        sluice_tests::init_logging();
        assert_eq!(
            sluice_common::config::DatanodeConfig::default().replication_max,
            512
        );
        // Tokens off, so that only the new check stands between the op and its first dial.
        let c = MiniCluster::builder()
            .datanodes(1)
            .replication(1)
            .configure_metadata(|m| m.block_token_enable = false)
            .start()
            .await
            .unwrap();
        c.wait_live(1).await.unwrap();
        let (trap, target) = sluice_tests::raw::trap("trap").await.unwrap();
        let op = Op::WriteBlock(WriteBlockOp {
            block: ExtendedBlock::new(BlockId(1 << 40), GenerationStamp(1), 0),
            stage: BlockStage::Create,
            targets: vec![target; 600],
            client_name: "attacker".into(),
            bytes_per_checksum: 512,
            latest_gen_stamp: GenerationStamp(1),
        });
        let dn = c.datanode(0).unwrap();
        let mut conn = sluice_tests::raw::RawConn::connect(&dn.data_addr().to_string())
            .await
            .unwrap();
        conn.send_op(op).await.unwrap();
        let r = conn.op_response().await.unwrap();
        assert_eq!(r.status, Status::ErrorInvalid, "{r:?}");
        assert!(r.message.contains("replication.max"), "{}", r.message);
        // Nothing was dialled.
        let dialled = sluice_tests::raw::dialled(&trap, Duration::from_millis(500)).await;
        assert!(!dialled, "the DataNode dialled a target");
    })
    .await
}
