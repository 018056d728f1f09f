//! The `DataNode`: start-up (volumes, listeners, actor system, heartbeat), graceful stop and
//! kill.
//!
//! Start order: validate the config → open and scan the volumes (node id from `VERSION`) →
//! bind the data and HTTP ports → start the actor system thread → serve data transfer, HTTP and
//! the heartbeat loop (which registers in the background: the data path works before it).
//! Graceful stop (`shutdown` cancelled, then [`DataNode::wait`]): the listener closes, each
//! connection ends at its next step (writers flush what they received, replicas stay in
//! `rbw/`), pending replica events are sent if the metadata service answers, HTTP stops, then
//! the actor system and its thread. [`DataNode::kill`] drops everything without flushing.

use crate::actors::ActorSystem;
use crate::context::{Ctx, NodeContext};
use crate::error::{DatanodeError, Result};
use crate::failpoint::FailScope;
use crate::heartbeat;
use crate::heartbeat::queue::EventQueue;
use crate::metrics::Metrics;
use crate::server;
use crate::storage::dataset::Dataset;
use crate::write::buffer_pool::{BufferSettings, WriteBuffers};
use sluice_common::config::DatanodeConfig;
use sluice_common::{DatanodeId, NodeId};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A running DataNode.
#[derive(Debug)]
pub struct DataNode {
    ctx: Ctx,
    data_addr: SocketAddr,
    http_addr: SocketAddr,
    actors: ActorSystem,
    tracker: TaskTracker,
    accept: JoinHandle<()>,
    heartbeat: JoinHandle<()>,
    http: actix_web::dev::ServerHandle,
    http_task: JoinHandle<std::io::Result<()>>,
}

/// With `security.enabled` (the default) a cluster secret must be configured (the file may
/// appear later: it is read at every registration); with security off, a warning.
fn check_security(cfg: &sluice_common::config::DatanodeConfig) -> Result<()> {
    use sluice_common::auth;
    if !cfg.security_enabled {
        tracing::warn!("{}", auth::security_off_warning("datanode"));
        return Ok(());
    }
    if auth::secret_configured(&cfg.cluster_secret_file) {
        return Ok(());
    }
    Err(sluice_common::config::ConfigError::invalid(
        "datanode.security.enabled",
        true,
        auth::missing_secret("datanode"),
    )
    .into())
}

impl DataNode {
    /// Scans/creates the volumes, binds the data port (`bind.host:port`) and HTTP port (port 0
    /// = any free port), starts the actix actor system on its own thread, registers with the
    /// metadata service in the background (retrying with backoff while it is unreachable — the
    /// data path works before registration), and serves. Call inside a multi-thread tokio
    /// runtime.
    pub async fn start(mut cfg: DatanodeConfig, shutdown: CancellationToken) -> Result<DataNode> {
        cfg.validate()?;
        check_security(&cfg)?;
        crate::advertise::resolve(&mut cfg).await?;
        let metrics = Arc::new(Metrics::default());
        let dirs = cfg.data_dirs.0.clone();
        let m = metrics.clone();
        let dataset = tokio::task::spawn_blocking(move || Dataset::open(&dirs, m))
            .await
            .map_err(|_| DatanodeError::ShuttingDown)??;
        let node_id = dataset.node_id().clone();
        let (listener, data_addr, http_listener, http_addr) = bind(&cfg).await?;
        let actors = ActorSystem::start(&format!("dn-actors-{}", data_addr.port()))?;
        let id = advertised_id(&cfg, &node_id, data_addr, http_addr);
        let buffers = Arc::new(WriteBuffers::new(
            BufferSettings::from_config(&cfg),
            dataset.volumes().volumes().len(),
            metrics.clone(),
        ));
        let read_memory = crate::read::memory::ReadMemory::new(
            cfg.read_buffer_max_bytes.bytes(),
            metrics.read_buffer_bytes.clone(),
            metrics.reads_busy.clone(),
        );
        let ctx = Arc::new(NodeContext {
            read_memory,
            scope: FailScope::new(data_addr.port(), &node_id.0),
            cfg,
            node_id,
            id,
            dataset: Arc::new(dataset),
            metrics,
            buffers,
            arbiter: actors.arbiter(),
            io: tokio::runtime::Handle::current(),
            events: Arc::new(EventQueue::default()),
            shutdown,
            kill: CancellationToken::new(),
            registered: AtomicBool::new(false),
            gate: tokio::sync::watch::Sender::new(crate::server::access::Gate::Unknown),
        });
        let tracker = TaskTracker::new();
        let accept = tokio::spawn(server::run(ctx.clone(), listener, tracker.clone()));
        let heartbeat = tokio::spawn(heartbeat::run(ctx.clone(), tracker.clone()));
        tracker.spawn(crate::scanner::run(ctx.clone()));
        let server = crate::http::server(ctx.clone(), http_listener).map_err(|source| {
            DatanodeError::Bind {
                addr: http_addr.to_string(),
                source,
            }
        })?;
        let http = server.handle();
        let http_task = tokio::spawn(server);
        tracing::info!(node = %ctx.node_id, %data_addr, %http_addr, advertised = %ctx.id, "DataNode started");
        Ok(DataNode {
            ctx,
            data_addr,
            http_addr,
            actors,
            tracker,
            accept,
            heartbeat,
            http,
            http_task,
        })
    }

    /// The node id stored in the volumes.
    pub fn node_id(&self) -> &NodeId {
        &self.ctx.node_id
    }

    /// The bound data-transfer address.
    pub fn data_addr(&self) -> SocketAddr {
        self.data_addr
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The identity registered with the metadata service (advertised addresses).
    pub fn datanode_id(&self) -> DatanodeId {
        self.ctx.id.clone()
    }

    /// The node's counters.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.ctx.metrics.clone()
    }

    /// The write-memory batching resources (memory permits, buffer pool, flush gates).
    pub fn write_buffers(&self) -> Arc<WriteBuffers> {
        self.ctx.buffers.clone()
    }

    /// After `shutdown` is cancelled: waits until connections, actors and the actor thread
    /// have ended, writers having flushed what they received (graceful stop).
    pub async fn wait(self) {
        self.ctx.shutdown.cancelled().await;
        let _ = self.accept.await;
        self.tracker.close();
        self.tracker.wait().await;
        let _ = self.heartbeat.await;
        self.http.stop(true).await;
        let _ = self.http_task.await;
        self.actors.stop_and_join().await;
        tracing::info!(node = %self.ctx.node_id, "DataNode stopped");
    }

    /// Abrupt stop, as close to a crash as in-process allows: tasks and the actor system are
    /// dropped without flushing or finalizing; files stay as they are on disk. Listeners close
    /// as their tasks are dropped, which happens shortly after this returns.
    pub fn kill(self) {
        tracing::warn!(node = %self.ctx.node_id, "DataNode killed");
        self.ctx.kill.cancel();
        self.accept.abort();
        self.heartbeat.abort();
        self.actors.stop();
        let http = self.http.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { http.stop(false).await });
        }
    }
}

/// Binds the data-transfer and HTTP listeners; returns them with their bound addresses.
async fn bind(
    cfg: &DatanodeConfig,
) -> Result<(TcpListener, SocketAddr, std::net::TcpListener, SocketAddr)> {
    let host = bracket(&cfg.bind_host);
    let data = format!("{host}:{}", cfg.port);
    let listener = TcpListener::bind(&data)
        .await
        .map_err(|source| DatanodeError::Bind {
            addr: data.clone(),
            source,
        })?;
    let data_addr = listener
        .local_addr()
        .map_err(|e| DatanodeError::io("local_addr", &data, e))?;
    let http = format!("{host}:{}", cfg.http_port);
    let http_listener =
        std::net::TcpListener::bind(&http).map_err(|source| DatanodeError::Bind {
            addr: http.clone(),
            source,
        })?;
    let http_addr = http_listener
        .local_addr()
        .map_err(|e| DatanodeError::io("local_addr", &http, e))?;
    Ok((listener, data_addr, http_listener, http_addr))
}

/// `[v6]` for IPv6 literals in `host:port` strings.
fn bracket(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// The advertised identity: `advertised.host` (`@ip` already replaced by the address, see
/// `advertise`), else a specific `bind.host`, else the machine's host name; `advertised.port`,
/// else the bound port.
fn advertised_id(
    cfg: &DatanodeConfig,
    node_id: &NodeId,
    data: SocketAddr,
    http: SocketAddr,
) -> DatanodeId {
    let host = if !cfg.advertised_host.is_empty() {
        cfg.advertised_host.clone()
    } else if is_specific(&cfg.bind_host) {
        cfg.bind_host.clone()
    } else {
        crate::sys::host_name().unwrap_or_else(|| "localhost".into())
    };
    let port = if cfg.advertised_port != 0 {
        cfg.advertised_port
    } else {
        data.port()
    };
    let host = bracket(&host);
    DatanodeId {
        node_id: node_id.clone(),
        data_addr: format!("{host}:{port}"),
        http_addr: format!("{host}:{}", http.port()),
        rack: cfg.rack.clone(),
    }
}

fn is_specific(host: &str) -> bool {
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => !ip.is_unspecified(),
        Err(_) => !host.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_address_prefers_config_then_specific_bind() {
        let mut cfg = DatanodeConfig::default();
        let id = NodeId("dn-1".into());
        let (d, h): (SocketAddr, SocketAddr) = (
            "0.0.0.0:4000".parse().unwrap(),
            "0.0.0.0:4001".parse().unwrap(),
        );
        cfg.bind_host = "127.0.0.1".into();
        assert_eq!(advertised_id(&cfg, &id, d, h).data_addr, "127.0.0.1:4000");
        cfg.advertised_host = "dn1.example".into();
        cfg.advertised_port = 9866;
        let a = advertised_id(&cfg, &id, d, h);
        assert_eq!(
            (a.data_addr.as_str(), a.http_addr.as_str()),
            ("dn1.example:9866", "dn1.example:4001")
        );
        cfg.advertised_host.clear();
        cfg.bind_host = "0.0.0.0".into();
        assert!(!advertised_id(&cfg, &id, d, h)
            .data_addr
            .starts_with("0.0.0.0"));
    }
}
