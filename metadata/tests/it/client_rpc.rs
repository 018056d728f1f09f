//! Integration tests of the client protocol through a real RPC port (127.0.0.1:0): the write
//! path, concurrency on one connection, deletion reaching DataNodes, pipeline recovery.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use crate::support::*;

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
async fn pipeline_recovery_over_rpc() {
    within(30, async {
        let dir = tempfile::tempdir().unwrap();
        let r = Running::start(config(dir.path())).await;
        let c = &r.client;
        r.register(4).await;
        c.create(ctx(), "/p".into(), opts()).await.unwrap().unwrap();
        let lb = c
            .add_block(ctx(), "/p".into(), CLIENT.into(), None, vec![])
            .await
            .unwrap()
            .unwrap();
        c.fsync(ctx(), "/p".into(), CLIENT.into(), 512)
            .await
            .unwrap()
            .unwrap();
        let err = c
            .update_block_for_pipeline(ctx(), lb.block, "intruder".into())
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, MetaError::NotLeaseHolder { .. }), "{err}");
        let fresh = c
            .update_block_for_pipeline(ctx(), lb.block, CLIENT.into())
            .await
            .unwrap()
            .unwrap();
        assert!(fresh.block.gen_stamp > lb.block.gen_stamp);
        let failed = lb.locations[2].node_id.clone();
        let survivors: Vec<NodeId> = lb.locations[..2]
            .iter()
            .map(|d| d.node_id.clone())
            .collect();
        let req = sluice_common::rpc::AdditionalDatanodes {
            path: "/p".into(),
            client: CLIENT.into(),
            block: lb.block,
            existing: survivors.clone(),
            exclude: vec![failed.clone()],
            count: 1,
        };
        let extra = c
            .get_additional_datanodes(ctx(), req)
            .await
            .unwrap()
            .unwrap()
            .locations;
        assert_eq!(extra.len(), 1);
        assert!(extra[0].node_id != failed && !survivors.contains(&extra[0].node_id));
        let mut nodes = survivors;
        nodes.push(extra[0].node_id.clone());
        let new = ExtendedBlock::new(lb.block.id, fresh.block.gen_stamp, 512);
        let bad_old = ExtendedBlock {
            gen_stamp: fresh.block.gen_stamp,
            ..lb.block
        };
        let err = c
            .update_pipeline(ctx(), CLIENT.into(), bad_old, new, nodes.clone())
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(err, MetaError::GenerationStampMismatch { .. }),
            "{err}"
        );
        c.update_pipeline(ctx(), CLIENT.into(), lb.block, new, nodes.clone())
            .await
            .unwrap()
            .unwrap();
        let lbs = c
            .get_block_locations(ctx(), "/p".into(), 0, 1)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lbs.blocks[0].block, new);
        let got: Vec<NodeId> = lbs.blocks[0]
            .locations
            .iter()
            .map(|d| d.node_id.clone())
            .collect();
        assert_eq!(got, nodes);
        // The replica the failed node finalizes with the old stamp is deleted there.
        let old = ExtendedBlock {
            num_bytes: 100,
            ..lb.block
        };
        let ev = vec![ReplicaEvent::Received(old)];
        r.dn.block_received(ctx(), failed.clone(), ev)
            .await
            .unwrap()
            .unwrap();
        let cmds = r.heartbeat(&failed.0).await;
        assert_eq!(cmds, vec![DatanodeCommand::Delete { blocks: vec![old] }]);
        // Abandoning is refused to others and idempotent for the writer.
        let err = c
            .abandon_block(ctx(), "/p".into(), "x".into(), new)
            .await
            .unwrap();
        assert!(matches!(err, Err(MetaError::NotLeaseHolder { .. })));
        c.abandon_block(ctx(), "/p".into(), CLIENT.into(), new)
            .await
            .unwrap()
            .unwrap();
        c.abandon_block(ctx(), "/p".into(), CLIENT.into(), new)
            .await
            .unwrap()
            .unwrap();
        let st = c.stat(ctx(), "/p".into()).await.unwrap().unwrap();
        assert_eq!((st.block_count, st.length), (0, 0));
        r.stop().await;
    })
    .await
}
