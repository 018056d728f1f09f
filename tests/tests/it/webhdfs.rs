//! The WebHDFS gateway over real sockets on a MiniCluster: every namespace op and its
//! JSON, every error mapping (`RemoteException`, Java names, HTTP statuses), bad parameters as
//! 400s, and the redirects of CREATE/APPEND/OPEN/GETFILECHECKSUM to a DataNode.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use serde_json::Value;
use sluice_client::WriteOptions;
use sluice_common::rpc::FileKind;
use sluice_tests::http::{request, Response};
use sluice_tests::{random_bytes, with_timeout, write_all, MiniCluster};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

fn wopts() -> WriteOptions {
    WriteOptions {
        create_parent: true,
        block_size: Some(64 * 1024),
        ..WriteOptions::default()
    }
}

async fn cluster() -> MiniCluster {
    sluice_tests::init_logging();
    let c = MiniCluster::builder().datanodes(3).start().await.unwrap();
    c.wait_live(3).await.unwrap();
    c
}

/// `METHOD http://<metadata http>/webhdfs/v1<path_query>`.
async fn call(c: &MiniCluster, method: &str, path_query: &str) -> Response {
    let url = format!(
        "http://{}/webhdfs/v1{path_query}",
        c.metadata_http_addr().unwrap()
    );
    request(method, &url, b"").await.unwrap()
}

async fn json_ok(c: &MiniCluster, method: &str, path_query: &str) -> Value {
    let r = call(c, method, path_query).await;
    assert_eq!(
        r.status,
        200,
        "{method} {path_query}: {}",
        String::from_utf8_lossy(&r.body)
    );
    r.json().unwrap()
}

/// Asserts a `RemoteException` answer; returns its message.
async fn remote_error(
    c: &MiniCluster,
    method: &str,
    path_query: &str,
    status: u16,
    exception: &str,
) -> String {
    let r = call(c, method, path_query).await;
    let body = String::from_utf8_lossy(&r.body).to_string();
    assert_eq!(r.status, status, "{method} {path_query}: {body}");
    let j = r.json().unwrap();
    let e = &j["RemoteException"];
    assert_eq!(e["exception"], exception, "{method} {path_query}: {body}");
    assert!(
        e["javaClassName"].as_str().unwrap().ends_with(exception),
        "{body}"
    );
    e["message"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_listing_summary_and_home() {
    with_timeout(LIMIT, "status and listings", async {
        let c = cluster().await;
        let fs = c.client().await.unwrap();
        write_all(&fs, "/d/a.bin", &random_bytes(150_000, 1), wopts(), 8192)
            .await
            .unwrap();
        write_all(&fs, "/d/b.bin", &random_bytes(10, 2), wopts(), 8192)
            .await
            .unwrap();
        fs.mkdirs("/d/sub/deeper", true).await.unwrap();

        let st = json_ok(&c, "GET", "/d/a.bin?op=GETFILESTATUS").await;
        let f = &st["FileStatus"];
        assert_eq!(f["type"], "FILE");
        assert_eq!(f["length"], 150_000);
        assert_eq!(f["blockSize"], 64 * 1024);
        assert_eq!(f["replication"], 3);
        assert_eq!(f["pathSuffix"], "");
        assert_eq!(f["permission"], "644");
        let mtime = fs.stat("/d/a.bin").await.unwrap().modification_time_ms;
        assert_eq!(f["modificationTime"], mtime);
        let d = json_ok(&c, "GET", "/d?op=getfilestatus").await;
        assert_eq!(d["FileStatus"]["type"], "DIRECTORY");
        assert_eq!(d["FileStatus"]["permission"], "755");

        let ls = json_ok(&c, "GET", "/d/?op=LISTSTATUS&user.name=ann").await;
        let names: Vec<&str> = ls["FileStatuses"]["FileStatus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["pathSuffix"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a.bin", "b.bin", "sub"]);
        let one = json_ok(&c, "GET", "/d/b.bin?op=LISTSTATUS").await;
        let entries = one["FileStatuses"]["FileStatus"].as_array().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0]["pathSuffix"], "");
        assert_eq!(entries[0]["length"], 10);

        let batch = json_ok(&c, "GET", "/d?op=LISTSTATUS_BATCH&startAfter=a.bin").await;
        let listing = &batch["DirectoryListing"];
        assert_eq!(listing["remainingEntries"], 0);
        let got: Vec<&str> = listing["partialListing"]["FileStatuses"]["FileStatus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["pathSuffix"].as_str().unwrap())
            .collect();
        assert_eq!(got, ["b.bin", "sub"]);

        let cs = json_ok(&c, "GET", "/d?op=GETCONTENTSUMMARY").await;
        let s = &cs["ContentSummary"];
        assert_eq!(s["directoryCount"], 3, "{cs}");
        assert_eq!(s["fileCount"], 2);
        assert_eq!(s["length"], 150_010);
        assert_eq!(s["spaceConsumed"], 450_030);
        assert_eq!(s["quota"], -1);
        assert_eq!(s["spaceQuota"], -1);

        let home = json_ok(&c, "GET", "/?op=GETHOMEDIRECTORY&user.name=ann").await;
        assert_eq!(home, serde_json::json!({"Path": "/user/ann"}));
        let anon = json_ok(&c, "GET", "/?op=GETHOMEDIRECTORY").await;
        assert_eq!(anon["Path"], "/user/dr.who");
        c.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mkdirs_rename_delete_are_the_client_protocol_changes() {
    with_timeout(LIMIT, "mutations", async {
        let mut c = cluster().await;
        let fs = c.client().await.unwrap();
        write_all(&fs, "/f", &random_bytes(1000, 3), wopts(), 8192)
            .await
            .unwrap();

        assert_eq!(
            json_ok(&c, "PUT", "/x/y%20z?op=MKDIRS&permission=755").await["boolean"],
            true
        );
        assert_eq!(fs.stat("/x/y z").await.unwrap().kind, FileKind::Directory);
        // Into an existing directory, as HDFS's rename.
        assert_eq!(
            json_ok(&c, "PUT", "/f?op=RENAME&destination=/x").await["boolean"],
            true
        );
        assert_eq!(fs.stat("/x/f").await.unwrap().length, 1000);
        assert_eq!(
            json_ok(&c, "PUT", "/x/f?op=RENAME&destination=/x/g").await["boolean"],
            true
        );
        // A missing source, an existing destination, a missing parent: false, not an error.
        for q in [
            "/nope?op=RENAME&destination=/x/h",
            "/x/g?op=RENAME&destination=/x/g",
            "/x/g?op=RENAME&destination=/no/such/g",
        ] {
            assert_eq!(json_ok(&c, "PUT", q).await["boolean"], false, "{q}");
        }
        remote_error(
            &c,
            "DELETE",
            "/x?op=DELETE",
            403,
            "PathIsNotEmptyDirectoryException",
        )
        .await;
        remote_error(
            &c,
            "DELETE",
            "/x?op=DELETE&recursive=false",
            403,
            "PathIsNotEmptyDirectoryException",
        )
        .await;
        assert_eq!(
            json_ok(&c, "DELETE", "/nope?op=DELETE").await["boolean"],
            false
        );
        assert_eq!(
            json_ok(&c, "DELETE", "/x/y%20z?op=DELETE").await["boolean"],
            true
        );

        // The changes are in the store: a restarted service has them.
        c.restart_metadata().await.unwrap();
        let fs = c.client().await.unwrap();
        assert_eq!(fs.stat("/x/g").await.unwrap().length, 1000);
        assert!(fs.stat("/x/y z").await.is_err());
        assert_eq!(
            json_ok(&c, "DELETE", "/x?op=DELETE&recursive=True").await["boolean"],
            true
        );
        assert!(fs.stat("/x").await.is_err());
        c.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_are_remote_exceptions_with_hdfs_statuses() {
    with_timeout(LIMIT, "errors", async {
        let c = cluster().await;
        let fs = c.client().await.unwrap();
        write_all(&fs, "/file", &random_bytes(100, 4), wopts(), 8192)
            .await
            .unwrap();

        let m = remote_error(
            &c,
            "GET",
            "/missing?op=LISTSTATUS",
            404,
            "FileNotFoundException",
        )
        .await;
        assert!(m.contains("/missing does not exist"), "{m}");
        remote_error(
            &c,
            "GET",
            "/missing?op=GETFILESTATUS",
            404,
            "FileNotFoundException",
        )
        .await;
        remote_error(
            &c,
            "GET",
            "/missing?op=GETCONTENTSUMMARY",
            404,
            "FileNotFoundException",
        )
        .await;
        remote_error(&c, "GET", "/missing?op=OPEN", 404, "FileNotFoundException").await;
        remote_error(&c, "GET", "/?op=OPEN", 404, "FileNotFoundException").await;
        remote_error(
            &c,
            "PUT",
            "/file?op=MKDIRS",
            403,
            "FileAlreadyExistsException",
        )
        .await;
        remote_error(
            &c,
            "PUT",
            "/file/sub?op=MKDIRS",
            403,
            "ParentNotDirectoryException",
        )
        .await;

        let bad = [
            ("GET", "/file?op=FROBNICATE", "op"),
            ("GET", "/file", "op"),
            ("PUT", "/file?op=LISTSTATUS", "op"),
            ("GET", "/file?op=OPEN&offset=-1", "offset"),
            ("GET", "/file?op=OPEN&length=ten", "length"),
            ("DELETE", "/file?op=DELETE&recursive=maybe", "recursive"),
            ("PUT", "/file?op=CREATE&replication=0", "replication"),
            ("PUT", "/file?op=CREATE&blocksize=-5", "blocksize"),
            ("PUT", "/file?op=RENAME", "destination"),
            ("PUT", "/file?op=RENAME&destination=relative", "destination"),
            ("GET", "/a/../file?op=GETFILESTATUS", ".."),
            ("PUT", "/file?op=RENAME&destination=/a/../b", ".."),
        ];
        for (method, q, named) in bad {
            let m = remote_error(&c, method, q, 400, "IllegalArgumentException").await;
            assert!(m.contains(named), "{method} {q}: {m}");
        }
        remote_error(
            &c,
            "PUT",
            "/file?op=SETOWNER&owner=x",
            400,
            "UnsupportedOperationException",
        )
        .await;
        // Nothing above changed the file.
        assert_eq!(fs.stat("/file").await.unwrap().length, 100);
        c.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn set_replication_changes_the_factor_and_repair_follows() {
    with_timeout(LIMIT, "setreplication", async {
        let c = cluster().await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(200 * 1024, 9);
        write_all(&fs, "/r/f", &data, wopts(), 8192).await.unwrap();
        assert_eq!(fs.stat("/r/f").await.unwrap().replication, 3);

        let q = "/r/f?op=SETREPLICATION&replication=2";
        assert_eq!(json_ok(&c, "PUT", q).await["boolean"], true);
        let st = json_ok(&c, "GET", "/r/f?op=GETFILESTATUS").await;
        assert_eq!(st["FileStatus"]["replication"], 2);
        // The repair pass deletes the excess replica of every block.
        sluice_tests::wait_until(LIMIT, "every block on 2 DataNodes", || async {
            let located = fs.get_block_locations("/r/f").await.unwrap();
            located.blocks.iter().all(|b| b.locations.len() == 2)
        })
        .await;
        assert_eq!(sluice_tests::read_all(&fs, "/r/f").await.unwrap(), data);

        // Without the parameter: the cluster default (3). A directory: false, as HDFS.
        assert_eq!(
            json_ok(&c, "PUT", "/r/f?op=SETREPLICATION").await["boolean"],
            true
        );
        assert_eq!(fs.stat("/r/f").await.unwrap().replication, 3);
        assert_eq!(
            json_ok(&c, "PUT", "/r?op=SETREPLICATION&replication=2").await["boolean"],
            false
        );
        remote_error(
            &c,
            "PUT",
            "/nope?op=SETREPLICATION&replication=2",
            404,
            "FileNotFoundException",
        )
        .await;
        let m = remote_error(
            &c,
            "PUT",
            "/r/f?op=SETREPLICATION&replication=0",
            400,
            "IllegalArgumentException",
        )
        .await;
        assert!(m.contains("replication"), "{m}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn data_ops_redirect_to_a_datanode() {
    with_timeout(LIMIT, "redirects", async {
        let c = cluster().await;
        let fs = c.client().await.unwrap();
        write_all(&fs, "/r/file", &random_bytes(200_000, 5), wopts(), 8192)
            .await
            .unwrap();
        let dn_http: Vec<String> = (0..3)
            .map(|i| c.datanode(i).unwrap().http_addr().to_string())
            .collect();
        let on_dn = |loc: &str| {
            dn_http
                .iter()
                .any(|a| loc.starts_with(&format!("http://{a}/webhdfs/v1/")))
        };

        for (method, q) in [
            (
                "PUT",
                "/r/new%20file?op=CREATE&overwrite=true&user.name=ann",
            ),
            ("POST", "/r/file?op=APPEND"),
            ("GET", "/r/file?op=OPEN&offset=70000&length=10"),
            ("GET", "/r/file?op=GETFILECHECKSUM"),
        ] {
            let r = call(&c, method, q).await;
            assert_eq!(r.status, 307, "{method} {q}");
            let loc = r.header("location").unwrap().to_string();
            assert!(on_dn(&loc), "{loc}");
            let op = q.split("op=").nth(1).unwrap().split('&').next().unwrap();
            assert!(loc.contains(&format!("op={op}")), "{loc}");
            assert!(loc.contains("namenoderpcaddress="), "{loc}");
            let nr = json_ok(&c, method, &format!("{q}&noredirect=true")).await;
            let nloc = nr["Location"].as_str().unwrap();
            assert!(on_dn(nloc) && !nloc.contains("noredirect"), "{nloc}");
        }
        let create = call(&c, "PUT", "/r/new%20file?op=CREATE").await;
        assert!(create
            .header("location")
            .unwrap()
            .contains("/webhdfs/v1/r/new%20file?"));
        // OPEN goes to a DataNode holding the block at the offset (block 1 of 64 KiB blocks).
        let lb = &fs.get_block_locations("/r/file").await.unwrap().blocks[1];
        let holders: Vec<&str> = lb.locations.iter().map(|d| d.http_addr.as_str()).collect();
        for _ in 0..5 {
            let r = call(&c, "GET", "/r/file?op=OPEN&offset=70000").await;
            let loc = r.header("location").unwrap();
            assert!(
                holders
                    .iter()
                    .any(|h| loc.starts_with(&format!("http://{h}/"))),
                "{loc}"
            );
        }
        c.shutdown().await;
    })
    .await;
}
