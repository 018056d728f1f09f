//! The security switch, with the service binaries: with security on (the default) a metadata
//! service or a DataNode that finds no cluster secret refuses to start, naming the config keys,
//! the environment variable and the switch; with `security.enabled = false` both start, run
//! unauthenticated (any host may speak the DataNode protocol) and warn in their logs.

use sluice_common::auth::SECRET_ENV;
use sluice_tests::process::ProcessCluster;
use sluice_tests::{random_bytes, read_all, with_timeout, write_all};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// Runs `cmd` to its exit (within 30 s); its status and stderr.
async fn run_to_exit(mut cmd: tokio::process::Command) -> (std::process::ExitStatus, String) {
    cmd.env_remove(SECRET_ENV).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the service exits instead of running")
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_cluster_secret_each_service_refuses_to_start_naming_the_keys() {
    with_timeout(LIMIT, "no secret", async {
        let bins = crate::binaries();
        let dir = tempfile::tempdir().unwrap();
        let mut meta = bins.command("metadata");
        meta.args(["--port", "0", "--http-port", "0", "--bind", "127.0.0.1"])
            .arg("--data")
            .arg(dir.path().join("metadata"));
        let (status, err) = run_to_exit(meta).await;
        assert!(!status.success(), "{err}");
        for want in [
            "metadata.security.enabled",
            "metadata.cluster.secret.file",
            SECRET_ENV,
        ] {
            assert!(err.contains(want), "no {want} in:\n{err}");
        }
        let mut dn = bins.command("datanode");
        dn.args(["--metadata", "127.0.0.1:1", "--bind", "127.0.0.1"])
            .args(["--port", "0", "--http-port", "0"])
            .arg("--data")
            .arg(dir.path().join("dn"));
        let (status, err) = run_to_exit(dn).await;
        assert!(!status.success(), "{err}");
        for want in [
            "datanode.security.enabled",
            "datanode.cluster.secret.file",
            SECRET_ENV,
        ] {
            assert!(err.contains(want), "no {want} in:\n{err}");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_security_off_the_cluster_runs_unauthenticated_and_every_service_warns() {
    with_timeout(LIMIT, "security off", async {
        sluice_tests::init_logging();
        let c = ProcessCluster::builder(crate::binaries())
            .datanodes(1)
            .metadata_env("SLUICE_METADATA__SECURITY__ENABLED", "false")
            .datanode_env("SLUICE_DATANODE__SECURITY__ENABLED", "false")
            .start()
            .await
            .unwrap();
        c.wait_live(1).await.unwrap();
        let fs = c.client().await.unwrap();
        let data = random_bytes(100_000, 41);
        let opts = sluice_client::WriteOptions {
            replication: Some(1),
            ..Default::default()
        };
        write_all(&fs, "/off", &data, opts, 10_000).await.unwrap();
        assert!(read_all(&fs, "/off").await.unwrap() == data);
        // Unauthenticated: a stranger may speak the DataNode protocol.
        sluice_common::rpc::connect_datanode_protocol(c.metadata_addr())
            .await
            .expect("no secret demanded");
        assert!(
            !c.root().join("cluster-secret").exists(),
            "no secret was created"
        );
        for log in ["metadata.1.log", "dn0.1.log"] {
            let text = std::fs::read_to_string(c.root().join(log)).unwrap();
            assert!(
                text.contains("security is off") && text.contains("security.enabled = false"),
                "no warning in {log}:\n{text}"
            );
        }
    })
    .await
}
