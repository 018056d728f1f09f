//! [`MetadataServer`]: opens the store, binds the RPC and HTTP listeners, starts every task,
//! and tears them down in order on shutdown (tasks, HTTP, then the store: flushed and its lock
//! released so that a new server can open the same directory right after).

use crate::error::MetadataError;
use crate::service::Shared;
use crate::state::State;
use crate::store::{GroupCommit, MetaStore, SledStore};
use sluice_common::config::MetadataConfig;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A running metadata service.
pub struct MetadataServer {
    rpc_addr: SocketAddr,
    http_addr: SocketAddr,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    http: JoinHandle<std::io::Result<()>>,
    store: Arc<dyn MetaStore>,
}

impl MetadataServer {
    /// Opens the store under `cfg.data_dir`, binds RPC (`cfg.bind_host:cfg.rpc_port`) and HTTP
    /// (`cfg.bind_host:cfg.http_port`) — port 0 picks a free port — and starts serving. Must be
    /// called inside a multi-thread tokio runtime.
    pub async fn start(
        cfg: MetadataConfig,
        shutdown: CancellationToken,
    ) -> Result<MetadataServer, MetadataError> {
        cfg.validate()?;
        let store = open_store(&cfg).await?;
        Self::start_with_store(cfg, store, shutdown).await
    }

    /// Like [`MetadataServer::start`] on an opened store (`cfg.data_dir` is not used), e.g. a
    /// [`crate::store::MemStore`] in a test. The store is closed on failure and on shutdown.
    pub async fn start_with_store(
        cfg: MetadataConfig,
        store: Arc<dyn MetaStore>,
        shutdown: CancellationToken,
    ) -> Result<MetadataServer, MetadataError> {
        cfg.validate()?;
        match Self::start_on(&cfg, store.clone(), shutdown).await {
            Ok(server) => Ok(server),
            Err(e) => {
                // Release the store (and its lock) so that the caller may try again.
                let _ = store.close();
                Err(e)
            }
        }
    }

    /// Everything after the store is open.
    async fn start_on(
        cfg: &MetadataConfig,
        store: Arc<dyn MetaStore>,
        shutdown: CancellationToken,
    ) -> Result<MetadataServer, MetadataError> {
        let store: Arc<dyn MetaStore> = if cfg.group_commit {
            Arc::new(GroupCommit::new(store))
        } else {
            store
        };
        let state =
            State::open(cfg, store.clone(), Instant::now()).map_err(|e| store_error(cfg, e))?;
        store.flush().await.map_err(|e| store_error(cfg, e))?;
        let (rpc, http) = bind(cfg).await?;
        let rpc_addr = local_addr(&rpc.local_addr(), "rpc", cfg)?;
        let http_addr = local_addr(&http.local_addr(), "http", cfg)?;
        let mut shared = Shared::new(
            state,
            rpc_addr,
            crate::tokens::Tokens::new(cfg),
            shutdown.clone(),
        );
        shared.cluster_secret = cluster_secret(cfg)?;
        let shared = Arc::new(shared);
        let http_server = crate::http::server(
            http,
            shared.clone(),
            crate::http::limits(cfg),
            shutdown.clone(),
        )
        .map_err(|source| MetadataError::Http {
            addr: http_addr.to_string(),
            source,
        })?;
        let tracker = TaskTracker::new();
        tracker.spawn(crate::rpc::serve(
            rpc,
            shared.clone(),
            crate::rpc::RpcLimits::from_config(cfg),
            shutdown.clone(),
            tracker.clone(),
        ));
        tracker.spawn(crate::monitor::run(
            shared,
            cfg.monitor_interval.get(),
            shutdown.clone(),
        ));
        tracker.close();
        let http = tokio::spawn(http_server);
        tracing::info!(rpc = %rpc_addr, http = %http_addr, data = %cfg.data_dir.display(), "metadata service started");
        Ok(MetadataServer {
            rpc_addr,
            http_addr,
            shutdown,
            tracker,
            http,
            store,
        })
    }

    /// The bound RPC address.
    pub fn rpc_addr(&self) -> SocketAddr {
        self.rpc_addr
    }

    /// True once a store flush failed, which stops the service (its shutdown token is
    /// cancelled).
    pub fn failed(&self) -> bool {
        self.store.clock().failed()
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Waits until every task ended after `shutdown` was cancelled and the store is closed
    /// (flushed, sled lock released) so that a new server can start on the same data_dir in the
    /// same process right after.
    pub async fn wait(self) {
        self.shutdown.cancelled().await;
        self.tracker.wait().await;
        match self.http.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "http server stopped with an error"),
            Err(e) => tracing::warn!(error = %e, "http server task failed"),
        }
        let store = self.store;
        let closed = tokio::task::spawn_blocking(move || store.close()).await;
        match closed {
            Ok(Ok(())) => tracing::info!("metadata service stopped"),
            Ok(Err(e)) => tracing::error!(error = %e, "closing the metadata store failed"),
            Err(e) => tracing::error!(error = %e, "closing the metadata store panicked"),
        }
    }
}

fn store_error(cfg: &MetadataConfig, e: impl std::fmt::Display) -> MetadataError {
    MetadataError::Store {
        path: cfg.data_dir.clone(),
        message: e.to_string(),
    }
}

async fn open_store(cfg: &MetadataConfig) -> Result<Arc<dyn MetaStore>, MetadataError> {
    let dir = cfg.data_dir.clone();
    let opened = tokio::task::spawn_blocking(move || {
        // sled creates the directory; SledStore::open makes it durable.
        SledStore::open(&dir).map_err(|e| e.to_string())
    })
    .await;
    match opened {
        Ok(Ok(store)) => Ok(Arc::new(store) as Arc<dyn MetaStore>),
        Ok(Err(message)) => Err(store_error(cfg, message)),
        Err(join) => Err(store_error(cfg, join)),
    }
}

async fn bind(
    cfg: &MetadataConfig,
) -> Result<(tokio::net::TcpListener, std::net::TcpListener), MetadataError> {
    let rpc_addr = format!("{}:{}", cfg.bind_host, cfg.rpc_port);
    let rpc = tokio::net::TcpListener::bind(&rpc_addr)
        .await
        .map_err(|source| MetadataError::Bind {
            what: "rpc",
            addr: rpc_addr.clone(),
            source,
        })?;
    let http_addr = format!("{}:{}", cfg.bind_host, cfg.http_port);
    let http = std::net::TcpListener::bind(&http_addr)
        .and_then(|l| l.set_nonblocking(true).map(|_| l))
        .map_err(|source| MetadataError::Bind {
            what: "http",
            addr: http_addr,
            source,
        })?;
    Ok((rpc, http))
}

fn local_addr(
    addr: &std::io::Result<SocketAddr>,
    what: &'static str,
    cfg: &MetadataConfig,
) -> Result<SocketAddr, MetadataError> {
    match addr {
        Ok(a) => Ok(*a),
        Err(e) => Err(MetadataError::Bind {
            what,
            addr: cfg.bind_host.clone(),
            source: std::io::Error::new(e.kind(), e.to_string()),
        }),
    }
}

/// The cluster secret DataNodes must prove, from `cluster.secret.file` (created when missing)
/// or `SLUICE_CLUSTER_SECRET`. With `security.enabled` (the default) a service without one
/// refuses to start; with security off no secret is read or demanded and a warning is logged.
fn cluster_secret(
    cfg: &MetadataConfig,
) -> Result<Option<sluice_common::auth::ClusterSecret>, MetadataError> {
    use sluice_common::auth::{self, ClusterSecret};
    use sluice_common::config::ConfigError;
    if !cfg.security_enabled {
        tracing::warn!("{}", auth::security_off_warning("metadata"));
        return Ok(None);
    }
    let secret = ClusterSecret::resolve_or_create(&cfg.cluster_secret_file).map_err(|e| {
        MetadataError::Config(ConfigError::invalid(
            "metadata.cluster.secret.file",
            cfg.cluster_secret_file.display(),
            e.to_string(),
        ))
    })?;
    match secret {
        Some(s) => Ok(Some(s)),
        None => Err(MetadataError::Config(ConfigError::invalid(
            "metadata.security.enabled",
            true,
            auth::missing_secret("metadata"),
        ))),
    }
}
