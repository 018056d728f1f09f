//! The data-transfer server: the accept loop and one task per connection.
//!
//! At most `max.transfer.threads` connections are served at once; further connections wait in
//! the listener's accept queue. One peer address holds at most
//! `data.connections.per-peer.max` of them: a connection past that is closed at accept.
//! Connection tasks are tracked so that a graceful stop can wait for them.

pub(crate) mod access;
mod connection;

use crate::context::Ctx;
use crate::metrics::GaugeGuard;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Accepts connections until `shutdown` (or `kill`) is cancelled.
pub(crate) async fn run(ctx: Ctx, listener: TcpListener, tracker: TaskTracker) {
    let slots = Arc::new(Semaphore::new(ctx.cfg.max_transfer_threads as usize));
    let peers =
        sluice_common::peer_limit::PeerCounts::new(ctx.cfg.data_connections_per_peer_max as usize);
    loop {
        let permit = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            _ = ctx.kill.cancelled() => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            _ = ctx.kill.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(node = %ctx.node_id, "accept failed: {e}");
                continue;
            }
        };
        let Some(held) = peers.admit(peer.ip()) else {
            ctx.metrics.connections_refused_per_peer.inc();
            tracing::warn!(node = %ctx.node_id, %peer, max = ctx.cfg.data_connections_per_peer_max, "connection refused: data.connections.per-peer.max reached for this peer");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        ctx.metrics.connections_accepted.inc();
        let c = ctx.clone();
        let span = tracing::debug_span!("connection", node = %ctx.node_id, %peer);
        tracker.spawn(
            async move {
                let _active = GaugeGuard::new(&c.metrics.active_transfers);
                connection::serve(c.clone(), stream).await;
                drop(held);
                drop(permit);
            }
            .instrument(span),
        );
    }
    tracing::debug!(node = %ctx.node_id, "data-transfer listener closed");
}
