//! The DataNode's HTTP endpoint (actix-web, one worker, signals off): `/` (the web page,
//! `crate::ui`), `/health`, `/status`
//! (JSON: node id, volumes, replicas by state, active transfers, registration) and `/metrics`
//! (Prometheus text), and the data half of WebHDFS under `/webhdfs/v1` (`crate::webhdfs`).

use crate::context::Ctx;
use crate::metrics::VolumeLabel;
use actix_web::{web, App, HttpResponse, HttpServer};
use serde::Serialize;
use sluice_common::http_limits::{count_peers, serve_bounded, HttpLimits};
use sluice_common::peer_limit::PeerCounts;
use std::collections::BTreeMap;

#[derive(Serialize)]
struct VolumeStatus {
    dir: String,
    capacity: u64,
    remaining: u64,
    used: u64,
}

#[derive(Serialize)]
struct Status {
    node_id: String,
    data_addr: String,
    http_addr: String,
    registered: bool,
    volumes: Vec<VolumeStatus>,
    replicas: BTreeMap<String, u64>,
    active_transfers: i64,
}

async fn health() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn status(ctx: web::Data<Ctx>) -> HttpResponse {
    let volumes = ctx
        .dataset
        .volumes()
        .volumes()
        .iter()
        .map(|v| {
            let s = v.space().unwrap_or_default();
            VolumeStatus {
                dir: v.root.display().to_string(),
                capacity: s.capacity,
                remaining: s.remaining,
                used: ctx.dataset.used_on(v.index),
            }
        })
        .collect();
    HttpResponse::Ok().json(Status {
        node_id: ctx.node_id.0.clone(),
        data_addr: ctx.id.data_addr.clone(),
        http_addr: ctx.id.http_addr.clone(),
        registered: ctx.is_registered(),
        volumes,
        replicas: ctx.dataset.counts(),
        active_transfers: ctx.metrics.active_transfers.get(),
    })
}

/// `/metrics`: the gauges read from elsewhere (volume space, the write-buffer cap) are set,
/// then the registry is encoded.
async fn metrics(ctx: web::Data<Ctx>) -> HttpResponse {
    let m = &ctx.metrics;
    for v in ctx.dataset.volumes().volumes() {
        let label = VolumeLabel {
            volume: v.root.display().to_string(),
        };
        let s = v.space().unwrap_or_default();
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        m.volumes
            .capacity
            .get_or_create(&label)
            .set(gauge(s.capacity));
        m.volumes
            .remaining
            .get_or_create(&label)
            .set(gauge(s.remaining));
        m.volumes
            .used
            .get_or_create(&label)
            .set(gauge(ctx.dataset.used_on(v.index)));
    }
    let cap = ctx.cfg.write_buffer_max_capacity_mb;
    m.write_buffer_capacity_bytes.set(if cap < 0 {
        -1
    } else {
        cap.saturating_mul(1 << 20)
    });
    HttpResponse::Ok()
        .content_type(sluice_common::metrics::CONTENT_TYPE)
        .body(m.render())
}

/// Builds the server on an already bound listener, within the `http.*` limits of the
/// DataNode's configuration (`docs/security.md`); the caller spawns and stops it.
pub(crate) fn server(
    ctx: Ctx,
    listener: std::net::TcpListener,
) -> std::io::Result<actix_web::dev::Server> {
    let cfg = &ctx.cfg;
    let limits = HttpLimits {
        request_timeout: cfg.http_request_timeout.get(),
        keep_alive: cfg.http_keep_alive_timeout.get(),
        body_idle: cfg.http_body_idle_timeout.get(),
        connections: cfg.http_connections_max as usize,
        per_peer: cfg.http_connections_per_peer_max as usize,
    };
    let gateway = web::Data::new(crate::webhdfs::Gateway::new(ctx.clone()));
    let data = web::Data::new(ctx);
    Ok(HttpServer::new(move || {
        App::new()
            .wrap_fn(move |req, srv| serve_bounded(req, srv, limits.body_idle))
            .app_data(data.clone())
            .configure(|c| crate::webhdfs::configure(c, gateway.clone()))
            .route("/", web::get().to(crate::ui::index))
            .route("/health", web::get().to(health))
            .route("/status", web::get().to(status))
            .route("/metrics", web::get().to(metrics))
    })
    .workers(1)
    .client_request_timeout(limits.request_timeout)
    .client_disconnect_timeout(std::time::Duration::from_secs(1))
    .keep_alive(limits.keep_alive)
    .max_connections(limits.connections)
    .on_connect(count_peers(PeerCounts::new(limits.per_peer)))
    .disable_signals()
    .shutdown_timeout(1)
    .listen(listener)?
    .run())
}
