//! What the service sends out waits for the flush of the change that implies it, over real
//! RPC on a `MemStore` whose flushes can be held or made to fail: no heartbeat carries a
//! `Delete` of a deleted file before the delete is durable, and after a failed flush the
//! service stops and a restart on what was durable still has the file and every replica.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use crate::support::*;
use std::sync::Arc;

/// Blocks named in the `Delete` commands of one heartbeat of each of dn0..dn2.
async fn deletes(r: &Running) -> Vec<ExtendedBlock> {
    let mut out = vec![];
    for i in 0..3 {
        for c in r.heartbeat(&format!("dn{i}")).await {
            if let DatanodeCommand::Delete { blocks } = c {
                out.extend(blocks);
            }
        }
    }
    out
}

async fn started_with_file(
    store: &Arc<MemStore>,
) -> (Running, Vec<ExtendedBlock>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let r = Running::start_on(config(dir.path()), store.clone()).await;
    r.register(3).await;
    let blocks = r.write("/d/f", &[4096, 100]).await;
    assert!(deletes(&r).await.is_empty());
    (r, blocks, dir)
}

/// Runs `op` while flushes are held: it must not return, and no heartbeat may carry a
/// `Delete`; once flushes go on, it returns and the deletions follow.
async fn held_until_flushed<F>(op: F)
where
    F: FnOnce(ClientProtocolClient) -> tokio::task::JoinHandle<()>,
{
    let store = Arc::new(MemStore::new());
    let (r, blocks, _dir) = started_with_file(&store).await;
    let before = store.flushes_started();
    store.hold_flushes();
    let task = op(r.client.clone());
    wait_until(
        Duration::from_secs(10),
        "the change's flush to start",
        || async { store.flushes_started() > before },
    )
    .await;
    for _ in 0..3 {
        assert!(
            deletes(&r).await.is_empty(),
            "a Delete left before the flush"
        );
    }
    assert!(!task.is_finished(), "acknowledged before its flush");
    store.release_flushes();
    within(10, task).await.unwrap();
    let mut sent = deletes(&r).await;
    sent.sort_by_key(|b| b.id);
    sent.dedup();
    assert_eq!(sent, blocks);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_delete_before_the_delete_is_durable() {
    within(
        60,
        held_until_flushed(|c| {
            tokio::spawn(async move {
                assert!(c.delete(ctx(), "/d".into(), true).await.unwrap().unwrap());
            })
        }),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_delete_before_an_overwrite_is_durable() {
    within(
        60,
        held_until_flushed(|c| {
            tokio::spawn(async move {
                let over = CreateOptions {
                    overwrite: true,
                    ..opts()
                };
                c.create(ctx(), "/d/f".into(), over).await.unwrap().unwrap();
            })
        }),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_flush_stops_the_service_and_the_file_survives() {
    within(60, async {
        let store = Arc::new(MemStore::new());
        let (r, blocks, dir) = started_with_file(&store).await;
        store.fail_flushes(true);
        // Refused with `Storage`, or the connection closes as the service stops: never an ack.
        let res = r.client.delete(ctx(), "/d".into(), true).await;
        assert!(
            matches!(res, Ok(Err(MetaError::Storage { .. })) | Err(_)),
            "{res:?}"
        );
        // Heartbeats are refused (or find the service gone): no command leaves any more.
        for i in 0..3 {
            let hb = Heartbeat {
                node: NodeId(format!("dn{i}")),
                capacity: 1 << 40,
                used: 0,
                remaining: 1 << 40,
                active_transfers: 0,
                transfers_in_progress: 0,
                active_pipelines: 0,
                buffered_replicas: 0,
            };
            let res = r.dn.heartbeat(ctx(), hb).await;
            assert!(!matches!(res, Ok(Ok(_))), "{res:?}");
        }
        assert!(r.server.failed());
        wait_until(
            Duration::from_secs(10),
            "the service to stop itself",
            || async { r.token.is_cancelled() },
        )
        .await;
        r.server.wait().await;

        // Power cut: only what was durable is left.
        let after = Arc::new(store.crashed());
        let r = Running::start_on(config(dir.path()), after).await;
        let st = r.client.stat(ctx(), "/d/f".into()).await.unwrap().unwrap();
        assert_eq!((st.length, st.block_count), (4196, 2));
        r.register(3).await;
        for i in 0..3 {
            let reports = blocks
                .iter()
                .map(|b| ReplicaReport {
                    block: *b,
                    state: ReplicaState::Finalized,
                })
                .collect();
            let node = NodeId(format!("dn{i}"));
            let invalid =
                r.dn.block_report(ctx(), node, reports)
                    .await
                    .unwrap()
                    .unwrap();
            assert_eq!(invalid, 0);
        }
        assert!(deletes(&r).await.is_empty(), "no replica is deleted");
        r.stop().await;
    })
    .await;
}
