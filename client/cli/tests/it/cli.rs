//! The `sluice` binary against the fake metadata service and DataNode.

use sluice_testkit::fake::{start_dn, start_meta, MetaHandle};
use sluice_testkit::{random_bytes, within};
use std::process::Output;

async fn sluice(meta: &MetaHandle, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--metadata")
        .arg(&meta.addr)
        .args(args)
        .env_remove("SLUICE_CONFIG")
        .env("RUST_LOG", "error")
        .output()
        .await
        .expect("run sluice")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test]
async fn put_cat_get_ls_stat_rm_round_trip() {
    within(60, async {
        let dn = start_dn("dn1").await;
        let meta = start_meta(vec![dn.id.clone()]).await;
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("in.bin");
        let data = random_bytes(10_000, 11);
        std::fs::write(&local, &data).unwrap();
        let local_s = local.to_str().unwrap();

        let o = sluice(
            &meta,
            &["put", local_s, "/data.bin", "--block-size", "4KiB"],
        )
        .await;
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(meta.st().files.contains_key("/data.bin"));
        assert!(!meta.st().files.contains_key("/data.bin._COPYING_"));

        let o = sluice(&meta, &["cat", "/data.bin"]).await;
        assert!(o.status.success());
        assert!(o.stdout == data);

        let out = dir.path().join("out.bin");
        let o = sluice(&meta, &["get", "/data.bin", out.to_str().unwrap()]).await;
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(std::fs::read(&out).unwrap() == data);

        let o = sluice(&meta, &["ls", "/"]).await;
        let text = stdout(&o);
        assert!(
            text.contains("10000") && text.contains("/data.bin"),
            "{text}"
        );
        let o = sluice(&meta, &["stat", "/data.bin"]).await;
        assert!(stdout(&o).contains("length: 10000"), "{}", stdout(&o));

        // A second put without -f refuses; with -f replaces.
        let o = sluice(&meta, &["put", local_s, "/data.bin"]).await;
        assert_eq!(o.status.code(), Some(1));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.starts_with("sluice: put: already exists: /data.bin"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1);
        let o = sluice(&meta, &["put", "-f", local_s, "/data.bin"]).await;
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

        let o = sluice(&meta, &["rm", "/data.bin"]).await;
        assert!(o.status.success());
        let o = sluice(&meta, &["rm", "/data.bin"]).await;
        assert_eq!(o.status.code(), Some(1));
        let o = sluice(&meta, &["cat", "/data.bin"]).await;
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.starts_with("sluice: cat: no such file or directory"),
            "{err}"
        );
    })
    .await;
}

#[tokio::test]
async fn fsck_json_is_the_report_and_report_prints() {
    within(60, async {
        let meta = start_meta(vec![]).await;
        let o = sluice(&meta, &["fsck", "/", "--json"]).await;
        assert!(o.status.success());
        let r: sluice_client::FsckReport = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r.health, sluice_client::Health::Healthy);
        let o = sluice(&meta, &["fsck", "/"]).await;
        assert!(stdout(&o).contains("is HEALTHY"), "{}", stdout(&o));
        let o = sluice(&meta, &["report"]).await;
        assert!(o.status.success());
        assert!(stdout(&o).contains("DataNodes: 0"), "{}", stdout(&o));
    })
    .await;
}
