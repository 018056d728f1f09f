//! The data half of WebHDFS on a MiniCluster: CREATE and OPEN through the redirect
//! to a DataNode, which writes through the replicated pipeline and reads with failover; ranged
//! reads; overwrite; GETFILECHECKSUM; an upload cut short leaves no file; a DataNode dying
//! mid-upload is pipeline recovery; a download survives dead replicas.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use sluice_tests::http::{request, Response};
use sluice_tests::{random_bytes, read_all, wait_until, with_timeout, MiniCluster};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(180);
const BLOCK: u64 = 64 * 1024;

async fn cluster(n: usize) -> MiniCluster {
    sluice_tests::init_logging();
    let c = MiniCluster::builder().datanodes(n).start().await.unwrap();
    c.wait_live(n).await.unwrap();
    c
}

fn nn(c: &MiniCluster, path_query: &str) -> String {
    format!(
        "http://{}/webhdfs/v1{path_query}",
        c.metadata_http_addr().unwrap()
    )
}

/// Step 1 at the metadata service: the DataNode URL it redirects to.
async fn location(c: &MiniCluster, method: &str, path_query: &str) -> String {
    let r = request(method, &nn(c, path_query), b"").await.unwrap();
    assert_eq!(
        r.status,
        307,
        "{method} {path_query}: {}",
        String::from_utf8_lossy(&r.body)
    );
    r.header("location").unwrap().to_string()
}

/// Both steps of CREATE.
async fn create(c: &MiniCluster, path_query: &str, body: &[u8]) -> Response {
    let loc = location(c, "PUT", &format!("{path_query}&op=CREATE")).await;
    request("PUT", &loc, body).await.unwrap()
}

/// Both steps of OPEN.
async fn open(c: &MiniCluster, path_query: &str) -> Response {
    let loc = location(c, "GET", &format!("{path_query}&op=OPEN")).await;
    request("GET", &loc, b"").await.unwrap()
}

fn exception(r: &Response) -> String {
    r.json().unwrap()["RemoteException"]["exception"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_then_open_ranges_byte_exact() {
    with_timeout(LIMIT, "create and open", async {
        let c = cluster(3).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(300_000, 7);
        let r = create(
            &c,
            &format!("/w/a.bin?blocksize={BLOCK}&user.name=ann"),
            &data,
        )
        .await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        assert!(
            r.header("location").unwrap().starts_with("hdfs://"),
            "{:?}",
            r.headers
        );
        let st = fs.stat("/w/a.bin").await.unwrap();
        assert_eq!(
            (st.length, st.block_size, st.replication),
            (300_000, BLOCK, 3)
        );
        assert!(!st.under_construction);
        assert!(read_all(&fs, "/w/a.bin").await.unwrap() == data);
        for lb in fs.get_block_locations("/w/a.bin").await.unwrap().blocks {
            assert_eq!(lb.locations.len(), 3, "{}", lb.block);
        }

        let whole = open(&c, "/w/a.bin?").await;
        assert_eq!(whole.status, 200);
        assert_eq!(
            whole.header("content-type"),
            Some("application/octet-stream")
        );
        assert!(whole.body == data);
        for (offset, length) in [
            (0, 10),
            (65_530, 20),
            (100_000, 150_000),
            (299_999, 5),
            (7, 0),
        ] {
            let r = open(&c, &format!("/w/a.bin?offset={offset}&length={length}")).await;
            assert_eq!(r.status, 200);
            let end = (offset + length).min(data.len());
            assert!(
                r.body == data[offset..end],
                "offset {offset} length {length}"
            );
        }
        let tail = open(&c, "/w/a.bin?offset=250000").await;
        assert!(tail.body == data[250_000..]);
        let at_end = open(&c, "/w/a.bin?offset=300000").await;
        assert_eq!((at_end.status, at_end.body.len()), (200, 0));
        let past = open(&c, "/w/a.bin?offset=300001").await;
        assert_eq!(
            (past.status, exception(&past).as_str()),
            (403, "IOException")
        );

        // overwrite=false on an existing file; overwrite=true replaces it; an empty body.
        let again = create(&c, "/w/a.bin?", b"x").await;
        assert_eq!(
            (again.status, exception(&again).as_str()),
            (403, "FileAlreadyExistsException")
        );
        let replaced = create(&c, "/w/a.bin?overwrite=true", b"short").await;
        assert_eq!(replaced.status, 201);
        assert_eq!(read_all(&fs, "/w/a.bin").await.unwrap(), b"short");
        assert_eq!(create(&c, "/w/empty?", b"").await.status, 201);
        assert_eq!(fs.stat("/w/empty").await.unwrap().length, 0);
        assert_eq!(open(&c, "/w/empty?").await.body.len(), 0);
        // Step 2 refuses namespace ops; a DataNode URL validates parameters too.
        let dn = c.datanode(0).unwrap().http_addr();
        let r = request(
            "GET",
            &format!("http://{dn}/webhdfs/v1/w?op=LISTSTATUS"),
            b"",
        )
        .await
        .unwrap();
        assert_eq!(
            (r.status, exception(&r).as_str()),
            (400, "UnsupportedOperationException")
        );
        let r = request(
            "GET",
            &format!("http://{dn}/webhdfs/v1/w/a.bin?op=OPEN&offset=-3"),
            b"",
        )
        .await
        .unwrap();
        assert_eq!(
            (r.status, exception(&r).as_str()),
            (400, "IllegalArgumentException")
        );
        c.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checksum_is_equal_for_equal_contents_whatever_the_block_size() {
    with_timeout(LIMIT, "checksum", async {
        let c = cluster(3).await;
        let data = random_bytes(200_000, 8);
        assert_eq!(
            create(&c, &format!("/c/one?blocksize={BLOCK}"), &data)
                .await
                .status,
            201
        );
        assert_eq!(
            create(&c, &format!("/c/two?blocksize={}", 4 * BLOCK), &data)
                .await
                .status,
            201
        );
        let mut other = data.clone();
        other[123_456] ^= 1;
        assert_eq!(create(&c, "/c/three?", &other).await.status, 201);
        let mut sums = Vec::new();
        for p in ["/c/one", "/c/two", "/c/three"] {
            let loc = location(&c, "GET", &format!("{p}?op=GETFILECHECKSUM")).await;
            let j = request("GET", &loc, b"").await.unwrap().json().unwrap();
            let fc = j["FileChecksum"].clone();
            assert_eq!(fc["algorithm"], "COMPOSITE-CRC32C");
            assert_eq!(fc["length"], 4);
            sums.push(fc["bytes"].as_str().unwrap().to_string());
        }
        assert_eq!(sums[0], sums[1]);
        assert_ne!(sums[0], sums[2]);
        assert_eq!(sums[0], format!("{:08x}", crc32c::crc32c(&data)));
        c.shutdown().await;
    })
    .await;
}

/// Sends the head of a PUT with `Content-Length: total` and the first `body` bytes.
async fn start_put(url: &str, total: usize, body: &[u8]) -> TcpStream {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, target) = rest.split_at(rest.find('/').unwrap());
    let mut s = TcpStream::connect(host).await.unwrap();
    let head = format!("PUT {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {total}\r\nConnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upload_cut_short_leaves_no_file() {
    with_timeout(LIMIT, "cut upload", async {
        let c = cluster(3).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(400_000, 9);
        let loc = location(&c, "PUT", &format!("/cut/f?op=CREATE&blocksize={BLOCK}")).await;
        let s = start_put(&loc, data.len(), &data[..250_000]).await;
        wait_until(
            Duration::from_secs(30),
            "the upload has written blocks",
            || async { fs.stat("/cut/f").await.is_ok_and(|st| st.block_count >= 2) },
        )
        .await;
        drop(s); // the HTTP client goes away 150 000 bytes short
        wait_until(
            Duration::from_secs(30),
            "the partial file is deleted",
            || async { fs.stat("/cut/f").await.is_err() },
        )
        .await;
        c.shutdown().await;
    })
    .await;
}

/// Once the upload has reached its third block: a DataNode of the current pipeline other than
/// the gateway.
async fn victim(c: &MiniCluster, fs: &sluice_client::FileSystem, gateway: usize) -> Option<usize> {
    let lbs = fs.get_block_locations("/dd/f").await.ok()?;
    if lbs.blocks.len() < 3 {
        return None;
    }
    lbs.blocks.last()?.locations.iter().find_map(|d| {
        c.datanode_index_by_addr(&d.data_addr)
            .filter(|&i| i != gateway)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_datanode_dying_mid_upload_is_pipeline_recovery() {
    with_timeout(LIMIT, "dn dies mid-upload", async {
        let mut c = cluster(4).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(600_000, 10);
        let loc = location(&c, "PUT", &format!("/dd/f?op=CREATE&blocksize={BLOCK}")).await;
        let gateway = (0..4)
            .find(|&i| loc.contains(&c.datanode(i).unwrap().http_addr().to_string()))
            .unwrap();
        let mut s = start_put(&loc, data.len(), &data[..300_000]).await;
        wait_until(
            Duration::from_secs(30),
            "a pipeline without the gateway",
            || async { victim(&c, &fs, gateway).await.is_some() },
        )
        .await;
        let victim = victim(&c, &fs, gateway).await;
        c.kill_datanode(victim.unwrap());
        s.write_all(&data[300_000..]).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        let head = String::from_utf8_lossy(&raw);
        assert!(head.starts_with("HTTP/1.1 201"), "{head}");
        assert!(read_all(&fs, "/dd/f").await.unwrap() == data);
        let st = fs.stat("/dd/f").await.unwrap();
        assert!(!st.under_construction && st.length == data.len() as u64);
        c.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_download_fails_over_to_live_replicas() {
    with_timeout(LIMIT, "download failover", async {
        let mut c = cluster(4).await;
        let fs = c.client().await.unwrap();
        let data = random_bytes(300_000, 11);
        assert_eq!(
            create(&c, &format!("/o/f?blocksize={BLOCK}"), &data)
                .await
                .status,
            201
        );
        let lb = &fs.get_block_locations("/o/f").await.unwrap().blocks[0];
        let holders: Vec<usize> = lb
            .locations
            .iter()
            .filter_map(|d| c.datanode_index_by_addr(&d.data_addr))
            .collect();
        // Two of the first block's three holders die; the metadata service still lists them.
        c.kill_datanode(holders[0]);
        c.kill_datanode(holders[1]);
        let alive: Vec<String> = (0..4)
            .filter_map(|i| c.datanode(i).map(|d| d.http_addr().to_string()))
            .collect();
        for i in 0..6 {
            // Ask a live DataNode directly (the redirect may still name a dead one).
            let dn = &alive[i % alive.len()];
            let url = format!("http://{dn}/webhdfs/v1/o/f?op=OPEN&offset=1000");
            let r = request("GET", &url, b"").await.unwrap();
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            assert!(r.body == data[1000..], "read {i} through {dn}");
        }
        c.shutdown().await;
    })
    .await;
}
