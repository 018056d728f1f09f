//! The RPC server: one TCP listener; each connection names its service with a 4-byte preamble,
//! then runs tarpc over `sluice_common::rpc::transport`. Every request future is spawned (so a
//! connection's requests run concurrently) on the server's task tracker.

mod client;
mod datanode;

pub use client::ClientService;
pub use datanode::DatanodeService;

use crate::service::Shared;
use futures::{Stream, StreamExt};
use sluice_common::rpc::{
    transport, ClientProtocol, DatanodeProtocol, CLIENT_PREAMBLE, DATANODE_PREAMBLE,
};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tarpc::server::{BaseChannel, Channel};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a new connection may take to send its preamble.
pub const PREAMBLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Accepts connections until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                let conn = connection(
                    stream,
                    peer,
                    shared.clone(),
                    shutdown.clone(),
                    tracker.clone(),
                );
                tracker.spawn(conn);
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
    if matches!(preamble, CLIENT_PREAMBLE | DATANODE_PREAMBLE) {
        if let Err(e) = sluice_common::rpc::accept_preamble(&mut stream, preamble).await {
            tracing::debug!(%peer, error = %e, "connection closed before its preamble echo");
            return;
        }
    }
    match preamble {
        CLIENT_PREAMBLE => {
            let requests = BaseChannel::with_defaults(transport(stream))
                .execute(ClientService::new(shared).serve());
            run_channel(requests, shutdown, tracker).await;
        }
        DATANODE_PREAMBLE => {
            let requests = BaseChannel::with_defaults(transport(stream))
                .execute(DatanodeService::new(shared).serve());
            run_channel(requests, shutdown, tracker).await;
        }
        other => {
            tracing::warn!(%peer, preamble = ?other, "unknown rpc preamble; closing");
        }
    }
}

/// Spawns each request of a channel until the channel ends or `shutdown`.
async fn run_channel<S, F>(requests: S, shutdown: CancellationToken, tracker: TaskTracker)
where
    S: Stream<Item = F>,
    F: Future<Output = ()> + Send + 'static,
{
    let mut requests = std::pin::pin!(requests);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            next = requests.next() => match next {
                Some(request) => {
                    tracker.spawn(request);
                }
                None => break,
            },
        }
    }
}
