//! The web UI on the metadata HTTP port (`GET /`): one server-rendered page, HTML and inline
//! CSS only (no external assets, it works offline), refreshed every 5 s:
//!
//! - the cluster summary: capacity, DFS used, Non DFS used, remaining (over the DataNodes that
//!   are not dead, as `sluice report` and `sluice df`), files, directories, blocks,
//!   under-replicated, corrupt and missing blocks;
//! - the DataNode table: address, rack, state (live / stale / dead), capacity with a bar of
//!   used space, blocks, active write pipelines and buffered replicas (from the last
//!   heartbeat), last heartbeat;
//! - recent events (`crate::events`: DataNode dead, pipeline recovered, re-replication done,
//!   corrupt replica found), newest first;
//! - the file browser (`/?path=/dir`): a directory's entries (directories link deeper), and for
//!   each file its blocks with their replica locations.
//!
//! Every value comes from the same state the RPCs read, under the same lock.

use crate::events::Event;
use crate::service::Shared;
use actix_web::{web, HttpRequest, HttpResponse};
use sluice_common::config::units::human_bytes;
use sluice_common::rpc::{ClusterReport, FileKind, FileStatus, LocatedBlocks, NodeState};
use std::fmt::Write as _;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Seconds between automatic reloads.
const REFRESH_SECS: u32 = 5;

/// Most entries of a directory shown.
const MAX_ENTRIES: usize = 500;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}\
table{border-collapse:collapse}td,th{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:left}\
th{background:#f3f3f3}.num{text-align:right;font-variant-numeric:tabular-nums}\
.bar{width:10em;height:.8em;background:#e6e6e6;display:inline-block;vertical-align:middle}\
.bar span{display:block;height:100%;background:#3b82f6}\
.live{color:#15803d}.stale{color:#b45309}.dead{color:#b91c1c;font-weight:bold}\
.warn{color:#b91c1c;font-weight:bold}code{font-size:.95em}\
.datanode-dead,.corrupt-replica{color:#b91c1c}.pipeline-recovered{color:#b45309}\
.replication-done{color:#15803d}";

/// A directory's entries, or a file with its blocks.
enum Browse {
    Dir(Vec<FileStatus>),
    File(FileStatus, LocatedBlocks),
    Error(String),
}

/// `GET /`.
pub async fn index(shared: web::Data<Shared>, req: HttpRequest) -> HttpResponse {
    let path = query_path(req.query_string());
    let (cluster, events, browse) = {
        let mut s = shared.lock();
        let cluster = s.cluster_report(Instant::now());
        let events = s.events();
        let browse = match s.stat(&path) {
            Ok(st) if st.kind == FileKind::Directory => match s.list(&path) {
                Ok(entries) => Browse::Dir(entries),
                Err(e) => Browse::Error(e.to_string()),
            },
            Ok(st) => match s.get_block_locations(&path, 0, u64::MAX) {
                Ok(blocks) => Browse::File(st, blocks),
                Err(e) => Browse::Error(e.to_string()),
            },
            Err(e) => Browse::Error(e.to_string()),
        };
        (cluster, events, browse)
    };
    let mut html = String::with_capacity(16 * 1024);
    let _ = write!(
        html,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
         <title>Sluice metadata service</title><style>{STYLE}</style></head><body>\
         <h1>Sluice metadata service <small>{}</small></h1>",
        esc(&shared.rpc_addr.to_string())
    );
    summary(&mut html, &cluster);
    datanodes(&mut html, &cluster);
    recent_events(&mut html, &events, SystemTime::now());
    browser(&mut html, &path, &browse);
    html.push_str("</body></html>");
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(html)
}

/// The `path` query parameter, `/` without one.
fn query_path(query: &str) -> String {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "path")
        .map(|(_, v)| v.into_owned())
        .filter(|p| p.starts_with('/'))
        .unwrap_or_else(|| "/".to_string())
}

fn summary(html: &mut String, c: &ClusterReport) {
    let t = c.totals();
    let rows: [(&str, &str, String); 11] = [
        ("capacity", "Configured capacity", bytes(t.capacity)),
        ("used", "DFS used", bytes(t.used)),
        ("non-dfs-used", "Non DFS used", bytes(t.non_dfs_used)),
        ("remaining", "DFS remaining", bytes(t.remaining)),
        (
            "used-percent",
            "DFS used%",
            format!("{:.2}%", t.used_percent()),
        ),
        ("files", "Files", c.files.to_string()),
        ("directories", "Directories", c.directories.to_string()),
        ("blocks", "Blocks", c.blocks.to_string()),
        (
            "under-replicated",
            "Under-replicated blocks",
            c.under_replicated_blocks.to_string(),
        ),
        (
            "corrupt",
            "Blocks with corrupt replicas",
            c.corrupt_blocks.to_string(),
        ),
        ("missing", "Missing blocks", c.missing_blocks.to_string()),
    ];
    html.push_str("<h2>Summary</h2><table id=\"summary\">");
    for (id, name, value) in rows {
        let warn = matches!(id, "missing" | "corrupt") && value != "0";
        let _ = write!(
            html,
            "<tr><th>{name}</th><td class=\"num{}\" id=\"{id}\">{value}</td></tr>",
            if warn { " warn" } else { "" }
        );
    }
    html.push_str("</table>");
}

fn datanodes(html: &mut String, c: &ClusterReport) {
    let count = |s: NodeState| c.datanodes.iter().filter(|d| d.state == s).count();
    let _ = write!(
        html,
        "<h2>DataNodes</h2><p id=\"datanode-counts\">{} live, {} stale, {} dead</p>\
         <table id=\"datanodes\"><tr><th>Address</th><th>Rack</th><th>State</th>\
         <th>Capacity</th><th>Used</th><th>Remaining</th><th>Blocks</th>\
         <th>Active pipelines</th><th>Buffered replicas</th><th>Last heartbeat</th></tr>",
        count(NodeState::Live),
        count(NodeState::Stale),
        count(NodeState::Dead)
    );
    for d in &c.datanodes {
        let state = match d.state {
            NodeState::Live => "live",
            NodeState::Stale => "stale",
            NodeState::Dead => "dead",
        };
        let pct = if d.capacity == 0 {
            0.0
        } else {
            d.used as f64 * 100.0 / d.capacity as f64
        };
        let _ = write!(
            html,
            "<tr class=\"datanode\" data-node=\"{node}\" data-state=\"{state}\">\
             <td><a href=\"http://{http}/\">{addr}</a></td><td>{rack}</td>\
             <td class=\"{state}\">{state}</td><td class=\"num\">{cap}</td>\
             <td><span class=\"bar\"><span style=\"width:{bar:.1}%\"></span></span> {used} \
             ({pct:.2}%)</td><td class=\"num\">{rem}</td><td class=\"num\">{blocks}</td>\
             <td class=\"num pipelines\">{pipelines}</td><td class=\"num buffered\">{buffered}</td>\
             <td class=\"num\">{hb:.1} s ago</td></tr>",
            node = esc(&d.id.node_id.to_string()),
            http = esc(&d.id.http_addr),
            addr = esc(&d.id.data_addr),
            rack = esc(&d.id.rack),
            cap = bytes(d.capacity),
            bar = pct
                .clamp(0.0, 100.0)
                .max(if d.used > 0 { 0.5 } else { 0.0 }),
            used = bytes(d.used),
            rem = bytes(d.remaining),
            blocks = d.blocks,
            pipelines = activity(d.state, d.active_pipelines),
            buffered = activity(d.state, d.buffered_replicas),
            hb = d.last_heartbeat_ms_ago as f64 / 1000.0,
        );
    }
    html.push_str("</table>");
}

/// A count from the last heartbeat; "-" for a dead DataNode, whose last report is stale.
fn activity(state: NodeState, n: u32) -> String {
    if state == NodeState::Dead {
        "-".to_string()
    } else {
        n.to_string()
    }
}

/// The recent events panel, newest first.
fn recent_events(html: &mut String, events: &[Event], now: SystemTime) {
    html.push_str("<h2>Recent events</h2>");
    if events.is_empty() {
        html.push_str("<p id=\"no-events\">No events since the service started.</p>");
        return;
    }
    html.push_str("<table id=\"events\"><tr><th>Time (UTC)</th><th>Event</th></tr>");
    for e in events {
        let since =
            e.at.duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
        let ago = now.duration_since(e.at).unwrap_or_default().as_secs();
        let day = since % 86_400;
        let _ = write!(
            html,
            "<tr class=\"event {kind}\" data-kind=\"{kind}\"><td class=\"num\">\
             {:02}:{:02}:{:02} ({ago} s ago)</td><td>{}</td></tr>",
            day / 3600,
            day % 3600 / 60,
            day % 60,
            esc(&e.kind.describe()),
            kind = e.kind.name(),
        );
    }
    html.push_str("</table>");
}

fn browser(html: &mut String, path: &str, browse: &Browse) {
    let _ = write!(
        html,
        "<h2>Browse <code id=\"browse-path\">{}</code></h2>",
        esc(path)
    );
    if path != "/" {
        let parent = match path.trim_end_matches('/').rsplit_once('/') {
            Some(("", _)) | None => "/".to_string(),
            Some((p, _)) => p.to_string(),
        };
        let _ = write!(html, "<p><a href=\"/?path={}\">..</a></p>", url(&parent));
    }
    match browse {
        Browse::Error(e) => {
            let _ = write!(html, "<p class=\"warn\" id=\"browse-error\">{}</p>", esc(e));
        }
        Browse::Dir(entries) => {
            html.push_str(
                "<table id=\"entries\"><tr><th>Name</th><th>Type</th><th>Size</th>\
                 <th>Replication</th><th>Blocks</th></tr>",
            );
            for e in entries.iter().take(MAX_ENTRIES) {
                let name = e.path.rsplit('/').next().unwrap_or(&e.path);
                let (kind, repl) = match e.kind {
                    FileKind::Directory => ("dir", "-".to_string()),
                    FileKind::File => ("file", e.replication.to_string()),
                };
                let _ = write!(
                    html,
                    "<tr class=\"entry\" data-kind=\"{kind}\"><td><a href=\"/?path={}\">{}</a></td>\
                     <td>{kind}</td><td class=\"num\">{}</td><td class=\"num\">{repl}</td>\
                     <td class=\"num\">{}</td></tr>",
                    url(&e.path),
                    esc(name),
                    bytes(e.length),
                    e.block_count
                );
            }
            html.push_str("</table>");
            if entries.len() > MAX_ENTRIES {
                let _ = write!(html, "<p>… {} more</p>", entries.len() - MAX_ENTRIES);
            }
        }
        Browse::File(st, blocks) => {
            let _ = write!(
                html,
                "<p id=\"file\">{} bytes, replication {}, block size {}{}</p>\
                 <table id=\"blocks\"><tr><th>Block</th><th>Offset</th><th>Length</th>\
                 <th>Replicas</th></tr>",
                st.length,
                st.replication,
                bytes(st.block_size),
                if st.under_construction {
                    ", under construction"
                } else {
                    ""
                }
            );
            for b in &blocks.blocks {
                let locs: Vec<String> = b.locations.iter().map(|d| esc(&d.data_addr)).collect();
                let _ =
                    write!(
                    html,
                    "<tr class=\"block\" data-replicas=\"{}\"><td>{}</td><td class=\"num\">{}</td>\
                     <td class=\"num\">{}</td><td>{}{}</td></tr>",
                    b.locations.len(),
                    esc(&b.block.to_string()),
                    b.offset,
                    b.block.num_bytes,
                    locs.join(", "),
                    if b.corrupt { " <span class=\"warn\">corrupt</span>" } else { "" }
                );
            }
            html.push_str("</table>");
        }
    }
}

fn bytes(n: u64) -> String {
    format!("{} ({n} B)", human_bytes(n))
}

fn esc(s: &str) -> String {
    sluice_common::html::escape(s)
}

fn url(s: &str) -> String {
    sluice_common::html::query_value(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_come_from_the_query() {
        assert_eq!(query_path(""), "/");
        assert_eq!(query_path("path=%2Fa%20b"), "/a b");
        assert_eq!(query_path("path=relative"), "/");
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(url("/a b&c"), "%2Fa+b%26c");
    }
}
