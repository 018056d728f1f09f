//! Pipeline recovery driven by DataNode failpoints (run with `--features failpoints`, which
//! `--all-features` enables). The test holds `crate::scenario()`: the `fail` registry is global to the process.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_client::WriteOptions;
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, MiniCluster};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_write_errors_and_a_crash_at_finalize_are_recovered() {
    let _failpoints = crate::scenario();
    with_timeout(Duration::from_secs(120), "failpoint recovery", async {
        sluice_tests::init_logging();
        let cluster = MiniCluster::builder()
            .datanodes(5)
            .block_size(1024 * 1024)
            .start()
            .await
            .unwrap();
        let fs = cluster.client().await.unwrap();
        let port_of = |id: &sluice_common::NodeId| {
            let i = cluster.datanode_index_by_id(id).unwrap();
            cluster.datanode(i).unwrap().data_addr().port()
        };

        // The middle DataNode fails its local write (before_write = ERROR in its ack slot).
        let data = random_bytes(400_000, 31);
        let mut w = fs
            .create(
                "/fp/write",
                WriteOptions {
                    create_parent: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        w.write_all(&data[..100_000]).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        let middle = port_of(&pipeline[1].node_id);
        fail::cfg("dn::before_write", &format!("return({middle}:error)")).unwrap();
        w.write_all(&data[100_000..]).await.unwrap();
        w.hflush().await.unwrap();
        fail::remove("dn::before_write");
        assert_eq!(w.pipeline_recoveries(), 1);
        assert!(w
            .pipeline()
            .iter()
            .all(|d| d.node_id != pipeline[1].node_id));
        w.close().await.unwrap();
        assert!(read_all(&fs, "/fp/write").await.unwrap() == data);

        // The last DataNode crashes as it finalizes (drop: connections closed, nothing sent):
        // close recovery finishes the block on the other two.
        let data = random_bytes(300_000, 32);
        let mut w = fs
            .create("/fp/finalize", WriteOptions::default())
            .await
            .unwrap();
        w.write_all(&data).await.unwrap();
        w.hflush().await.unwrap();
        let pipeline = w.pipeline();
        let last = port_of(&pipeline[2].node_id);
        fail::cfg("dn::finalize", &format!("return({last}:drop)")).unwrap();
        w.close().await.unwrap();
        fail::remove("dn::finalize");
        assert_eq!(w.pipeline_recoveries(), 1);
        assert!(read_all(&fs, "/fp/finalize").await.unwrap() == data);
        let lb = &fs.get_block_locations("/fp/finalize").await.unwrap().blocks[0];
        for dn in &pipeline[..2] {
            assert!(
                lb.locations.iter().any(|d| d.node_id == dn.node_id),
                "{dn} finalized"
            );
        }
        wait_until(Duration::from_secs(60), "re-replication to 3", || async {
            fs.fsck("/fp").await.unwrap().health == sluice_common::rpc::Health::Healthy
        })
        .await;
        cluster.shutdown().await;
    })
    .await
}
