//! The embedded cluster starts a metadata service and DataNodes on real sockets and files,
//! waits until they are live, restarts a killed DataNode on its port and storage, and refuses
//! a cluster without DataNodes.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_cluster::{ClusterBuilder, ClusterError};
use sluice_common::config::{DatanodeConfig, HumanDuration, MetadataConfig, PathList};
use sluice_testkit::within;
use std::path::Path;
use std::time::Duration;

fn configs(root: &Path, datanodes: usize) -> (MetadataConfig, Vec<DatanodeConfig>) {
    let meta = MetadataConfig {
        bind_host: "127.0.0.1".into(),
        rpc_port: 0,
        http_port: 0,
        data_dir: root.join("metadata"),
        default_replication: 1,
        min_replication: 1,
        monitor_interval: HumanDuration::millis(100),
        ..MetadataConfig::default()
    };
    let dns = (0..datanodes)
        .map(|i| DatanodeConfig {
            bind_host: "127.0.0.1".into(),
            port: 0,
            http_port: 0,
            data_dirs: PathList(vec![root.join(format!("dn{i}"))]),
            heartbeat_interval: HumanDuration::millis(100),
            ..DatanodeConfig::default()
        })
        .collect();
    (meta, dns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_live_and_restarts_a_killed_datanode_on_its_port() {
    within(60, async {
        let dir = tempfile::tempdir().unwrap();
        let (meta, dns) = configs(dir.path(), 2);
        let mut cluster = ClusterBuilder::new(meta)
            .datanodes(dns)
            .start()
            .await
            .unwrap();
        assert_eq!(cluster.live_datanodes().await.unwrap(), 2);
        let port = cluster.datanode(1).unwrap().data_addr().port();
        let id = cluster.datanode(1).unwrap().node_id().clone();
        cluster.kill_datanode(1);
        assert!(cluster.datanode(1).is_none());
        assert_eq!(cluster.datanode_index_by_id(&id), Some(1));
        let node = cluster.start_datanode(1).await.unwrap();
        assert_eq!(node.data_addr().port(), port);
        assert_eq!(node.node_id(), &id);
        cluster.wait_live(2, Duration::from_secs(20)).await.unwrap();
        assert!(matches!(
            cluster.start_datanode(1).await,
            Err(ClusterError::Running(1))
        ));
        assert!(matches!(
            cluster.start_datanode(5).await,
            Err(ClusterError::NoSuchDataNode(5))
        ));
        cluster.restart_metadata().await.unwrap();
        cluster.wait_live(2, Duration::from_secs(20)).await.unwrap();
        cluster.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_cluster_without_datanodes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, _) = configs(dir.path(), 0);
    assert!(matches!(
        ClusterBuilder::new(meta).start().await,
        Err(ClusterError::NoDataNodes)
    ));
}
