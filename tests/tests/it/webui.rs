//! The metadata service's web UI (`GET /`) over real sockets on a MiniCluster: the
//! summary and the DataNode table agree with the cluster report after a write and after a
//! DataNode is killed, and the file browser shows directories, files, blocks and their
//! replica locations; a DataNode's own page (`GET /` on its HTTP port) shows its volume and
//! its replicas. The DataNode table's active pipelines and buffered replicas follow an open
//! writer (carried in heartbeats), and the recent events panel shows the DataNode's death and
//! the re-replication that follows.

use sluice_client::WriteOptions;
use sluice_tests::http::request;
use sluice_tests::{random_bytes, wait_until, with_timeout, write_all, MiniCluster};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const LIMIT: Duration = Duration::from_secs(120);
/// One condition of the page (well inside `LIMIT`, so that a failure names it).
const WAIT: Duration = Duration::from_secs(30);

/// The page at `/<query>` as text.
async fn page(c: &MiniCluster, query: &str) -> String {
    let url = format!("http://{}/{query}", c.metadata_http_addr().unwrap());
    let r = request("GET", &url, b"").await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    String::from_utf8(r.body).unwrap()
}

/// The text of the summary cell `id`.
fn cell<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no #{id}"))
        + id.len()
        + 6;
    let end = html[start..].find('<').unwrap() + start;
    &html[start..end]
}

/// The DataNode table's `class="num <class>"` cells.
fn column(html: &str, class: &str) -> Vec<String> {
    html.split(&format!("class=\"num {class}\">"))
        .skip(1)
        .map(|s| s[..s.find('<').unwrap()].to_string())
        .collect()
}

/// The sum of a column's numbers.
fn column_sum(html: &str, class: &str) -> u64 {
    column(html, class)
        .iter()
        .filter_map(|c| c.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_ui_shows_the_cluster_its_files_and_a_dead_datanode() {
    with_timeout(LIMIT, "web UI", async {
        sluice_tests::init_logging();
        let mut c = MiniCluster::builder()
            .datanodes(4)
            .heartbeat(Duration::from_millis(200))
            .liveness(Duration::from_secs(1), Duration::from_secs(2))
            .start()
            .await
            .unwrap();
        c.wait_live(4).await.unwrap();
        let fs = c.client().await.unwrap();
        fs.mkdirs("/dir/sub", true).await.unwrap();
        let opts = WriteOptions {
            block_size: Some(64 * 1024),
            ..WriteOptions::default()
        };
        write_all(&fs, "/dir/f<1>", &random_bytes(200_000, 1), opts, 64 * 1024)
            .await
            .unwrap();

        let html = page(&c, "").await;
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("http-equiv=\"refresh\""));
        assert!(
            !html.contains("<script src") && !html.contains("<link"),
            "no external assets"
        );
        let report = fs.cluster_report().await.unwrap();
        assert_eq!(cell(&html, "files"), report.files.to_string());
        assert_eq!(cell(&html, "blocks"), "4");
        assert_eq!(cell(&html, "missing"), "0");
        assert!(cell(&html, "capacity").ends_with(&format!("({} B)", report.totals().capacity)));
        assert_eq!(html.matches("data-state=\"live\"").count(), 4);
        assert!(html.contains("4 live, 0 stale, 0 dead"));

        // The browser: the directory, then the file with 4 blocks on 3 replicas each.
        let dir = page(&c, "?path=%2Fdir").await;
        assert!(dir.contains("data-kind=\"dir\"><td><a href=\"/?path=%2Fdir%2Fsub\">sub</a>"));
        assert!(dir.contains("f&lt;1&gt;"), "names are escaped");
        let file = page(&c, "?path=%2Fdir%2Ff%3C1%3E").await;
        assert_eq!(
            file.matches("class=\"block\" data-replicas=\"3\"").count(),
            4
        );
        let holders = fs.get_block_locations("/dir/f<1>").await.unwrap();
        for d in &holders.blocks[0].locations {
            assert!(file.contains(&d.data_addr), "{} not shown", d.data_addr);
        }

        // A DataNode's own page: its volume, its finalized replicas, the write buffers.
        let holder = &holders.blocks[0].locations[0];
        let url = format!("http://{}/", holder.http_addr);
        let r = request("GET", &url, b"").await.unwrap();
        assert_eq!(r.status, 200);
        let dn = String::from_utf8(r.body).unwrap();
        assert!(dn.contains("id=\"registered\">registered<"), "{dn}");
        assert_eq!(dn.matches("class=\"volume\"").count(), 1);
        let on_it = holders
            .blocks
            .iter()
            .filter(|b| b.locations.iter().any(|d| d.node_id == holder.node_id))
            .count();
        assert_eq!(cell(&dn, "replicas-finalized"), on_it.to_string());
        assert!(cell(&dn, "write-buffer-bytes").contains(" of "), "{dn}");
        assert_eq!(cell(&dn, "read-streams"), "0");

        // An open writer: its three DataNodes count a pipeline, the last one a buffered replica
        // (write.memory.buffer.last-replica-only); both go back to 0 once it closes.
        assert!(html.contains("<th>Active pipelines</th><th>Buffered replicas</th>"));
        // The first file's pipelines end just after its close returned: wait for the
        // heartbeats that say so.
        wait_until(WAIT, "the first file's pipelines gone", || async {
            column_sum(&page(&c, "").await, "pipelines") == 0
        })
        .await;
        assert!(html.contains("id=\"no-events\""), "no events yet");
        let mut w = fs
            .create("/dir/open", WriteOptions::default())
            .await
            .unwrap();
        w.write_all(&random_bytes(100_000, 2)).await.unwrap();
        w.hflush().await.unwrap();
        wait_until(WAIT, "the open pipeline in the DataNode table", || async {
            let html = page(&c, "").await;
            column_sum(&html, "pipelines") == 3 && column_sum(&html, "buffered") == 1
        })
        .await;
        w.close().await.unwrap();
        wait_until(WAIT, "no pipeline once the writer closed", || async {
            let html = page(&c, "").await;
            column_sum(&html, "pipelines") == 0 && column_sum(&html, "buffered") == 0
        })
        .await;

        // A DataNode killed: the page shows it dead and the others live.
        let victim = c
            .datanode_index_by_addr(&holders.blocks[0].locations[0].data_addr)
            .unwrap();
        c.kill_datanode(victim);
        wait_until(LIMIT, "the page shows one dead DataNode", || async {
            page(&c, "").await.contains("3 live, 0 stale, 1 dead")
        })
        .await;
        let html = page(&c, "").await;
        assert_eq!(html.matches("data-state=\"dead\"").count(), 1);
        assert_eq!(html.matches("data-state=\"live\"").count(), 3);
        // A dead DataNode's last activity is stale: shown as "-".
        assert_eq!(
            column(&html, "pipelines")
                .iter()
                .filter(|c| *c == "-")
                .count(),
            1
        );
        assert_eq!(
            column(&html, "buffered")
                .iter()
                .filter(|c| *c == "-")
                .count(),
            1
        );
        let report = fs.cluster_report().await.unwrap();
        assert!(cell(&html, "capacity").ends_with(&format!("({} B)", report.totals().capacity)));
        // The events panel: the death, then the copies that replace its replicas.
        let dead = "data-kind=\"datanode-dead\"><td class=\"num\">";
        assert_eq!(html.matches(dead).count(), 1, "{html}");
        assert!(
            html.contains(&format!("DataNode dead: {}", holder.node_id)),
            "{html}"
        );
        wait_until(WAIT, "a re-replication done event", || async {
            page(&c, "")
                .await
                .contains("data-kind=\"replication-done\"")
        })
        .await;
        c.shutdown().await;
    })
    .await;
}
