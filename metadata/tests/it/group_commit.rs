//! Group commit over real RPC on a `MemStore`: concurrent changes share flushes and each is
//! answered only after a flush that covers it; reads, heartbeats and the apply of other changes
//! never wait for a running flush (the store's batches wait for its flush, as sled's do).

use crate::support::*;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

const N: usize = 64;

async fn names(r: &Running, dir: &str) -> usize {
    r.client
        .list(ctx(), dir.into())
        .await
        .unwrap()
        .map(|v| v.len())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_share_flushes_and_are_answered_after_them() {
    within(60, async {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemStore::new());
        let r = Running::start_on(config(dir.path()), store.clone()).await;
        r.client
            .mkdirs(ctx(), "/d".into(), true)
            .await
            .unwrap()
            .unwrap();
        let flushes_before = store.flushes_completed();
        store.hold_flushes();
        let tasks: Vec<_> = (0..N)
            .map(|i| {
                let c = r.client.clone();
                tokio::spawn(async move {
                    let o = CreateOptions {
                        client_name: format!("c{i}"),
                        ..opts()
                    };
                    c.create(ctx(), format!("/d/f{i}"), o)
                        .await
                        .unwrap()
                        .unwrap();
                })
            })
            .collect();
        // Every create is applied (readers see it) while the first flush is held...
        wait_until(Duration::from_secs(20), "all creates applied", || async {
            names(&r, "/d").await == N
        })
        .await;
        // ...and none is answered before a flush covers it.
        assert!(
            tasks.iter().all(|t| !t.is_finished()),
            "answered before its flush"
        );
        let durable = store.crashed();
        assert!(
            durable.scan_prefix(b"").unwrap().len() < N,
            "not yet durable"
        );
        store.release_flushes();
        for t in tasks {
            within(20, t).await.unwrap();
        }
        let flushes = store.flushes_completed() - flushes_before;
        assert!(flushes <= 4, "{N} creates took {flushes} flushes");
        r.stop().await;

        // What was answered is durable: a power cut keeps every file.
        let r = Running::start_on(config(dir.path()), Arc::new(store.crashed())).await;
        assert_eq!(names(&r, "/d").await, N);
        r.stop().await;
    })
    .await;
}

/// Stat, list, get_block_locations and a heartbeat while a flush is held and a second change
/// arrived after it.
async fn reads(addr: std::net::SocketAddr) {
    let client = connect_client_protocol(addr).await.unwrap();
    let dn = connect_datanode_protocol(addr).await.unwrap();
    wait_until(
        Duration::from_secs(5),
        "the second change applied",
        || async { client.stat(ctx(), "/e".into()).await.unwrap().is_ok() },
    )
    .await;
    let st = client.stat(ctx(), "/d/f".into()).await.unwrap().unwrap();
    assert_eq!(st.length, 100);
    let listed = client.list(ctx(), "/d".into()).await.unwrap().unwrap();
    assert_eq!(listed.len(), 2);
    let lbs = client
        .get_block_locations(ctx(), "/d/f".into(), 0, u64::MAX)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lbs.blocks.len(), 1);
    dn.heartbeat(ctx(), heartbeat()).await.unwrap().unwrap();
}

fn heartbeat() -> Heartbeat {
    Heartbeat {
        node: NodeId("dn0".into()),
        capacity: 1 << 40,
        used: 0,
        remaining: 1 << 40,
        active_transfers: 0,
        transfers_in_progress: 0,
        active_pipelines: 0,
        buffered_replicas: 0,
    }
}

/// Holds a flush, starts a change that waits in it and a second change after it, then reads.
/// Returns whether the reads completed in time; every change must be answered only after the
/// flush is let go.
async fn during_a_held_flush(addr: std::net::SocketAddr, store: Arc<MemStore>) -> bool {
    let client = connect_client_protocol(addr).await.unwrap();
    let before = store.flushes_started();
    store.hold_flushes();
    // Set just before the held flush is let go: no change may be answered before.
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (c, flag) = (client.clone(), released.clone());
    let first = tokio::spawn(async move {
        c.create(ctx(), "/d/g".into(), opts())
            .await
            .unwrap()
            .unwrap();
        assert!(flag.load(SeqCst), "answered before its flush");
    });
    wait_until(Duration::from_secs(10), "a flush to be held", || async {
        store.flushes_started() > before
    })
    .await;
    // Another change arrives during the flush: its apply must not wait for it.
    let (c, flag) = (client.clone(), released.clone());
    let second = tokio::spawn(async move {
        c.mkdirs(ctx(), "/e".into(), true).await.unwrap().unwrap();
        assert!(flag.load(SeqCst), "answered before its flush");
    });
    let done = tokio::time::timeout(Duration::from_secs(10), reads(addr))
        .await
        .is_ok();
    released.store(true, SeqCst);
    store.release_flushes();
    if done {
        within(10, first).await.unwrap();
        within(10, second).await.unwrap();
    }
    done
}

/// The server and the test run on separate runtimes: a server stuck behind the flush (every
/// worker blocked, as with sled's batches waiting for its flush under the state lock) makes
/// the test fail instead of hang.
#[test]
fn reads_and_heartbeats_do_not_wait_for_a_flush() {
    let runtime = |workers| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap()
    };
    let (server_rt, test_rt) = (runtime(4), runtime(2));
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemStore::new());
    store.serialize_with_flush(true);
    let r = server_rt.block_on(async {
        let r = Running::start_on(config(dir.path()), store.clone()).await;
        r.register(3).await;
        r.write("/d/f", &[100]).await;
        r
    });
    let addr = r.server.rpc_addr();
    let done = test_rt.block_on(within(60, during_a_held_flush(addr, store)));
    if !done {
        server_rt.shutdown_background();
        test_rt.shutdown_background();
        panic!("a read or heartbeat waited for the held flush");
    }
    server_rt.block_on(r.stop());
}

/// `create` calls the server has started handling, from `/metrics`.
async fn creates_started(r: &Running) -> u64 {
    let (_, body) = http_get(r.server.http_addr(), "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix("sluice_metadata_rpc_calls_total{method=\"create\"} "))
        .map(|n| n.trim().parse().unwrap())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_requests_in_flight_are_bounded_and_heartbeats_have_their_own_pool() {
    within(60, async {
        const BOUND: u32 = 4;
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemStore::new());
        let cfg = MetadataConfig {
            rpc_inflight_max: BOUND,
            ..config(dir.path())
        };
        let r = Running::start_on(cfg, store.clone()).await;
        r.client
            .mkdirs(ctx(), "/d".into(), true)
            .await
            .unwrap()
            .unwrap();
        r.register(1).await;
        store.hold_flushes();
        // Twice the bound, on two connections: the pool is per protocol, not per connection.
        let other = connect_client_protocol(r.server.rpc_addr()).await.unwrap();
        let tasks: Vec<_> = (0..2 * BOUND)
            .map(|i| {
                let c = if i % 2 == 0 {
                    r.client.clone()
                } else {
                    other.clone()
                };
                tokio::spawn(async move {
                    let o = CreateOptions {
                        client_name: format!("c{i}"),
                        ..opts()
                    };
                    c.create(ctx(), format!("/d/f{i}"), o)
                        .await
                        .unwrap()
                        .unwrap();
                })
            })
            .collect();
        wait_until(Duration::from_secs(20), "the bound reached", || async {
            creates_started(&r).await >= u64::from(BOUND)
        })
        .await;
        // Heartbeats (their own pool) go on while every client permit waits for the flush;
        // meanwhile no further create starts.
        for _ in 0..20 {
            r.dn.heartbeat(ctx(), heartbeat()).await.unwrap().unwrap();
            assert_eq!(
                creates_started(&r).await,
                u64::from(BOUND),
                "bound exceeded"
            );
        }
        store.release_flushes();
        for t in tasks {
            within(20, t).await.unwrap();
        }
        assert_eq!(names(&r, "/d").await, 2 * BOUND as usize);
        r.stop().await;
    })
    .await;
}

#[test]
fn the_in_flight_bound_defaults_to_1024() {
    assert_eq!(MetadataConfig::default().rpc_inflight_max, 1024);
}
