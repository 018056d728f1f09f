//! The DataNode's web page (`GET /` on its HTTP port): server-rendered HTML with inline CSS,
//! no scripts or external assets, reloading every 5 s: identity and registration, volumes
//! (capacity, used by replicas, remaining, with a bar), replicas by state (those being written
//! are `Rbw`), data-transfer connections, the write-memory buffers (bytes allocated against
//! the cap, buffered replicas, flushes), and reads (streams and chunk requests, pieces sent,
//! prefetch). The figures are those of `/status` and `/metrics`.

use crate::context::Ctx;
use actix_web::{web, HttpResponse};
use sluice_common::config::units::human_bytes;
use sluice_common::html::escape;
use std::fmt::Write as _;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}\
table{border-collapse:collapse}td,th{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:left}\
th{background:#f3f3f3}.num{text-align:right;font-variant-numeric:tabular-nums}\
.bar{width:10em;height:.8em;background:#e6e6e6;display:inline-block;vertical-align:middle}\
.bar span{display:block;height:100%;background:#3b82f6}";

/// `GET /`.
pub(crate) async fn index(ctx: web::Data<Ctx>) -> HttpResponse {
    let m = &ctx.metrics;
    let mut html = String::with_capacity(8 * 1024);
    let _ = write!(
        html,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"5\"><title>Sluice DataNode {id}</title>\
         <style>{STYLE}</style></head><body><h1>Sluice DataNode <small>{id}</small></h1>\
         <p>data <code>{data}</code>, HTTP <code>{http}</code>, \
         <span id=\"registered\">{reg}</span></p>",
        id = escape(&ctx.node_id.0),
        data = escape(&ctx.id.data_addr),
        http = escape(&ctx.id.http_addr),
        reg = if ctx.is_registered() {
            "registered"
        } else {
            "not registered"
        },
    );
    html.push_str(
        "<h2>Volumes</h2><table id=\"volumes\"><tr><th>Directory</th><th>Capacity</th>\
         <th>Used by replicas</th><th>Remaining</th></tr>",
    );
    for v in ctx.dataset.volumes().volumes() {
        let s = v.space().unwrap_or_default();
        let used = ctx.dataset.used_on(v.index);
        let pct = if s.capacity == 0 {
            0.0
        } else {
            used as f64 * 100.0 / s.capacity as f64
        };
        let _ = write!(
            html,
            "<tr class=\"volume\"><td>{}</td><td class=\"num\">{}</td><td><span class=\"bar\">\
             <span style=\"width:{:.1}%\"></span></span> {}</td><td class=\"num\">{}</td></tr>",
            escape(&v.root.display().to_string()),
            human_bytes(s.capacity),
            pct.clamp(0.0, 100.0),
            human_bytes(used),
            human_bytes(s.remaining)
        );
    }
    html.push_str("</table><h2>Replicas</h2><table id=\"replicas\">");
    for (state, n) in ctx.dataset.counts() {
        let _ = write!(
            html,
            "<tr><th>{}</th><td class=\"num\" id=\"replicas-{}\">{n}</td></tr>",
            escape(&state),
            escape(&state.to_lowercase())
        );
    }
    let cap = ctx.cfg.write_buffer_max_capacity_mb;
    let cap_text = if cap < 0 {
        "no cap".to_string()
    } else {
        human_bytes((cap as u64) << 20)
    };
    let rows = [
        (
            "Data-transfer connections",
            "active-transfers",
            m.active_transfers.get().to_string(),
        ),
        (
            "Write-buffer memory",
            "write-buffer-bytes",
            format!(
                "{} of {cap_text} (peak {})",
                human_bytes(m.write_buffer_bytes.get().max(0) as u64),
                human_bytes(m.write_buffer_bytes_peak.get().max(0) as u64)
            ),
        ),
        (
            "Buffered replicas being written",
            "buffered-replicas",
            m.buffered_replicas.get().to_string(),
        ),
        (
            "Buffer flushes (idle-timer)",
            "buffer-flushes",
            format!("{} ({})", m.buffer_flushes.get(), m.idle_flushes.get()),
        ),
        (
            "Flushes running",
            "flushes-in-progress",
            m.flushes_in_progress.get().to_string(),
        ),
        (
            "Streaming reads (ReadBlock)",
            "read-streams",
            m.read_block_ops.get().to_string(),
        ),
        (
            "Chunk reads (ReadChunk)",
            "read-chunks",
            m.read_chunk_ops.get().to_string(),
        ),
        (
            "Pieces sent / read ahead from disk",
            "pieces",
            format!("{} / {}", m.pieces_sent.get(), m.stream_pieces_read.get()),
        ),
        (
            "Prefetch advised (WILLNEED)",
            "prefetch",
            human_bytes(m.prefetch_advised_bytes.get()),
        ),
        (
            "Bytes read / written",
            "bytes",
            format!(
                "{} / {}",
                human_bytes(m.bytes_read.get()),
                human_bytes(m.bytes_written.get())
            ),
        ),
    ];
    html.push_str("</table><h2>Activity</h2><table id=\"activity\">");
    for (name, id, value) in rows {
        let _ = write!(
            html,
            "<tr><th>{name}</th><td class=\"num\" id=\"{id}\">{}</td></tr>",
            escape(&value)
        );
    }
    html.push_str("</table></body></html>");
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(html)
}
