//! The RPC server: one TCP listener; each connection names its service with a 4-byte preamble,
//! then runs tarpc over `sluice_common::rpc::transport`. Every request future is spawned (so a
//! connection's requests run concurrently) on the server's task tracker and runs once it holds a
//! permit of its protocol's pool (`rpc.inflight.max` each, so a client storm cannot hold up
//! heartbeats); one connection may have at most that many requests outstanding (tarpc's
//! `max_concurrent_requests`: more are answered with an error).
//!
//! Every connection is bounded (`docs/security.md`): at most `rpc.connections.max` are open at
//! once, at most `rpc.connections.per-peer.max` from one peer address (more are closed at
//! accept); the preamble must come within [`PREAMBLE_TIMEOUT`]; then
//! the socket is a guarded [`RpcStream`]: an inbound frame longer than `rpc.max.frame.bytes`
//! (`rpc.datanode.max.frame.bytes` for DataNodes) closes the connection from its prefix, and a
//! connection silent, or slower than one frame per `rpc.idle.timeout`, is closed.

mod client;
mod datanode;

pub use client::ClientService;
pub use datanode::DatanodeService;

use crate::service::Shared;
use futures::{Stream, StreamExt};
use sluice_common::config::MetadataConfig;
use sluice_common::peer_limit::PeerCounts;
use sluice_common::rpc::{
    transport, ClientProtocol, DatanodeProtocol, CLIENT_PREAMBLE, DATANODE_PREAMBLE, MAX_RPC_FRAME,
};
use sluice_common::rpc_stream::{RpcStream, StreamLimits};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tarpc::server::{BaseChannel, Channel};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a new connection may take to send its preamble.
pub const PREAMBLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The in-flight request pools, one per protocol.
#[derive(Clone)]
struct Pools {
    client: Arc<Semaphore>,
    datanode: Arc<Semaphore>,
    /// Most requests one connection may have outstanding (more are answered with an error).
    limit: usize,
    /// What a client-protocol connection may send.
    client_stream: StreamLimits,
    /// What a DataNode-protocol connection may send.
    datanode_stream: StreamLimits,
}

/// The limits of the RPC port, from the service's configuration.
#[derive(Debug, Clone, Copy)]
pub struct RpcLimits {
    /// Requests of each protocol handled at once (`rpc.inflight.max`).
    pub inflight: usize,
    /// Connections open at once (`rpc.connections.max`).
    pub connections: usize,
    /// Connections open at once from one peer address (`rpc.connections.per-peer.max`).
    pub connections_per_peer: usize,
    /// Largest client-protocol frame (`rpc.max.frame.bytes`).
    pub max_frame: usize,
    /// Largest DataNode-protocol frame (`rpc.datanode.max.frame.bytes`).
    pub datanode_max_frame: usize,
    /// Longest silence or single frame (`rpc.idle.timeout`).
    pub idle: Duration,
}

impl RpcLimits {
    /// The limits `cfg` sets.
    pub fn from_config(cfg: &MetadataConfig) -> Self {
        RpcLimits {
            inflight: cfg.rpc_inflight_max as usize,
            connections: cfg.rpc_connections_max as usize,
            connections_per_peer: cfg.rpc_connections_per_peer_max as usize,
            max_frame: cfg.rpc_max_frame.as_usize(),
            datanode_max_frame: cfg.rpc_datanode_max_frame.as_usize(),
            idle: cfg.rpc_idle_timeout.get(),
        }
    }
}

/// Accepts connections until `shutdown`, within `limits`.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    limits: RpcLimits,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let pools = Pools {
        client: Arc::new(Semaphore::new(limits.inflight)),
        datanode: Arc::new(Semaphore::new(limits.inflight)),
        limit: limits.inflight,
        client_stream: StreamLimits {
            max_frame: limits.max_frame,
            idle: limits.idle,
        },
        datanode_stream: StreamLimits {
            max_frame: limits.datanode_max_frame,
            idle: limits.idle,
        },
    };
    let slots = Arc::new(Semaphore::new(limits.connections));
    let peers = PeerCounts::new(limits.connections_per_peer);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, max = limits.connections,
                        "rpc connection refused: rpc.connections.max connections are open");
                    drop(stream);
                    continue;
                };
                let Some(held) = peers.admit(peer.ip()) else {
                    tracing::warn!(%peer, max = limits.connections_per_peer,
                        "rpc connection refused: rpc.connections.per-peer.max reached for this peer");
                    drop(stream);
                    continue;
                };
                let conn = connection(
                    stream,
                    peer,
                    shared.clone(),
                    pools.clone(),
                    shutdown.clone(),
                    tracker.clone(),
                );
                tracker.spawn(async move {
                    conn.await;
                    drop(held);
                    drop(slot);
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        }
    }
    tracing::debug!("rpc accept loop stopped");
}

async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    pools: Pools,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let _ = stream.set_nodelay(true);
    let mut preamble = [0u8; 4];
    let read = tokio::select! {
        _ = shutdown.cancelled() => return,
        r = tokio::time::timeout(PREAMBLE_TIMEOUT, stream.read_exact(&mut preamble)) => r,
    };
    match read {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "connection closed before its preamble");
            return;
        }
        Err(_) => {
            tracing::warn!(%peer, "no preamble within {PREAMBLE_TIMEOUT:?}; closing");
            return;
        }
    }
    if let (DATANODE_PREAMBLE, Some(secret)) = (preamble, &shared.cluster_secret) {
        let proof = sluice_common::auth::challenge(&mut stream, secret, preamble);
        match tokio::time::timeout(PREAMBLE_TIMEOUT, proof).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(%peer, error = %e, "DataNode connection without the cluster secret; closing");
                return;
            }
            Err(_) => {
                tracing::warn!(%peer, "no cluster-secret proof within {PREAMBLE_TIMEOUT:?}; closing");
                return;
            }
        }
    } else if matches!(preamble, CLIENT_PREAMBLE | DATANODE_PREAMBLE) {
        if let Err(e) = sluice_common::rpc::accept_preamble(&mut stream, preamble).await {
            tracing::debug!(%peer, error = %e, "connection closed before its preamble echo");
            return;
        }
    }
    match preamble {
        CLIENT_PREAMBLE => {
            let stream = RpcStream::guarded(stream, peer, pools.client_stream);
            let requests = BaseChannel::with_defaults(transport(stream, MAX_RPC_FRAME))
                .max_concurrent_requests(pools.limit)
                .execute(ClientService::new(shared).serve());
            run_channel(requests, pools.client, shutdown, tracker).await;
        }
        DATANODE_PREAMBLE => {
            let stream = RpcStream::guarded(stream, peer, pools.datanode_stream);
            let requests = BaseChannel::with_defaults(transport(stream, MAX_RPC_FRAME))
                .max_concurrent_requests(pools.limit)
                .execute(DatanodeService::new(shared).serve());
            run_channel(requests, pools.datanode, shutdown, tracker).await;
        }
        other => {
            tracing::warn!(%peer, preamble = ?other, "unknown rpc preamble; closing");
        }
    }
}

/// Spawns each request of a channel until the channel ends or `shutdown`; a request runs once
/// it holds a permit of `pool`, until it is answered.
async fn run_channel<S, F>(
    requests: S,
    pool: Arc<Semaphore>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) where
    S: Stream<Item = F>,
    F: Future<Output = ()> + Send + 'static,
{
    // The channel is polled all the time (it also writes the answers); a waiting request is a
    // small future, and a connection may have at most the pool's size outstanding.
    let mut requests = std::pin::pin!(requests);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            next = requests.next() => match next {
                Some(request) => {
                    let pool = pool.clone();
                    tracker.spawn(async move {
                        let Ok(_permit) = pool.acquire_owned().await else {
                            return;
                        };
                        request.await;
                    });
                }
                None => break,
            },
        }
    }
}
