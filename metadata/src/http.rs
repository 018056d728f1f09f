//! The HTTP endpoints (actix-web, one worker, no signal handling of its own):
//!
//! - `GET /`: the web UI (`crate::ui`): summary, DataNodes, file browser;
//! - `GET /health`: `{"status":"ok"}`;
//! - `GET /status`: version, uptime, RPC address, the cluster report, namespace totals (JSON);
//! - `GET /metrics`: Prometheus text (`crate::metrics`, listed in `docs/metrics.md`);
//! - `/webhdfs/v1/...`: the WebHDFS gateway (`crate::webhdfs`).
//!
//! The server stops when the service's cancellation token fires.

use crate::service::Shared;
use actix_web::{web, App, HttpResponse, HttpServer};
use serde::Serialize;
use sluice_common::config::MetadataConfig;
use sluice_common::http_limits::{count_peers, serve_bounded, HttpLimits};
use sluice_common::peer_limit::PeerCounts;
use sluice_common::rpc::ClusterReport;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The HTTP limits `cfg` sets (`http.*`, see `docs/security.md`).
pub fn limits(cfg: &MetadataConfig) -> HttpLimits {
    HttpLimits {
        request_timeout: cfg.http_request_timeout.get(),
        keep_alive: cfg.http_keep_alive_timeout.get(),
        body_idle: cfg.http_body_idle_timeout.get(),
        connections: cfg.http_connections_max as usize,
        per_peer: cfg.http_connections_per_peer_max as usize,
    }
}

/// Builds the HTTP server on a bound listener, within `limits`; await (or spawn) the result to
/// run it.
pub fn server(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    limits: HttpLimits,
    shutdown: CancellationToken,
) -> std::io::Result<actix_web::dev::Server> {
    let data = web::Data::from(shared);
    Ok(HttpServer::new(move || {
        App::new()
            .wrap_fn(move |req, srv| serve_bounded(req, srv, limits.body_idle))
            .app_data(data.clone())
            .route("/", web::get().to(crate::ui::index))
            .route("/health", web::get().to(health))
            .route("/status", web::get().to(status))
            .route("/metrics", web::get().to(metrics))
            .configure(crate::webhdfs::configure)
    })
    .workers(1)
    .client_request_timeout(limits.request_timeout)
    .client_disconnect_timeout(Duration::from_secs(1))
    .keep_alive(limits.keep_alive)
    .max_connections(limits.connections)
    .on_connect(count_peers(PeerCounts::new(limits.per_peer)))
    .disable_signals()
    .shutdown_timeout(1)
    .shutdown_signal(shutdown.cancelled_owned())
    .listen(listener)?
    .run())
}

async fn health() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// Namespace totals in `/status`.
#[derive(Serialize)]
struct NamespaceTotals {
    files: u64,
    directories: u64,
    blocks: u64,
    files_under_construction: usize,
}

/// The `/status` document.
#[derive(Serialize)]
struct Status {
    version: &'static str,
    uptime_ms: u64,
    rpc_address: String,
    namespace: NamespaceTotals,
    cluster: ClusterReport,
}

async fn status(shared: web::Data<Shared>) -> HttpResponse {
    let (cluster, open) = {
        let s = shared.lock();
        (s.cluster_report(Instant::now()), s.open_files())
    };
    HttpResponse::Ok().json(Status {
        version: env!("CARGO_PKG_VERSION"),
        uptime_ms: shared.started.elapsed().as_millis() as u64,
        rpc_address: shared.rpc_addr.to_string(),
        namespace: NamespaceTotals {
            files: cluster.files,
            directories: cluster.directories,
            blocks: cluster.blocks,
            files_under_construction: open,
        },
        cluster,
    })
}

async fn metrics(shared: web::Data<Shared>) -> HttpResponse {
    let (cluster, open, repair) = {
        let s = shared.lock();
        (
            s.cluster_report(Instant::now()),
            s.open_files(),
            s.repair_report(),
        )
    };
    HttpResponse::Ok()
        .content_type(sluice_common::metrics::CONTENT_TYPE)
        .body(shared.metrics.render(&cluster, open, &repair))
}
