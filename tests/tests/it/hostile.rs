//! Hostile traffic on every port (bounded resources, docs/security.md): each limit closes what would
//! otherwise hold a connection, memory or a buffer for ever, and the cluster keeps serving.
//!
//! Metadata RPC port: an oversized frame prefix, silent and trickling connections, the
//! connection cap, and a client that outlives the idle timeout.

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
