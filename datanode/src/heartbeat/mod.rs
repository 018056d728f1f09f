//! Registration, heartbeats, block reports and commands: the DataNode's side of the
//! `DatanodeProtocol`.
//!
//! This is a plain tokio task driven by the actor-free [`schedule::Schedule`], not an actix
//! actor: all its work is awaiting tarpc calls, which live on tokio, and nothing sends it
//! messages except the incremental report queue, which a `Notify` covers. An actor would add a
//! mailbox and a thread hop and buy nothing; the timing logic stays testable without a runtime.
//!
//! Loop: connect and `register` (retrying with backoff while the metadata service is away) →
//! full `block_report` → then heartbeats every `heartbeat.interval` (capacity, used, remaining,
//! active transfers), a full report every `block.report.interval`, and `block_received` as soon
//! as events are queued (put back and retried on failure). Commands: `Delete` (only replicas
//! whose generation stamp is not newer; `Deleted` reported), `Transfer` (a task running the
//! `TransferBlock` source; the copies running are reported in each heartbeat so that the
//! metadata service hands out no more than `replication.max-streams`), `RecoverBlock` (a task
//! running the block recovery as primary, see `recovery`), `Reregister` (register again, then a
//! full report). Any RPC failure drops the connection and starts over with backoff.

pub mod queue;
pub mod schedule;

use crate::context::Ctx;
use crate::error::DatanodeError;
use schedule::{Backoff, Due, Schedule};
use sluice_common::proto::TransferBlockOp;
use sluice_common::rpc::{
    self, DatanodeCommand, DatanodeProtocolClient, DatanodeRegistration, Heartbeat, ReplicaEvent,
};
use sluice_common::MetaError;
use std::time::{Duration, Instant};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Deadline of each call to the metadata service.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a graceful stop waits for a call to the metadata service in flight.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Why a registration ended.
enum End {
    /// Register again at once.
    Reregister,
    /// The connection failed: reconnect after a backoff.
    Disconnected,
    /// The node is stopping.
    Stop,
}

/// Runs until the node stops.
pub(crate) async fn run(ctx: Ctx, tracker: TaskTracker) {
    let span = tracing::info_span!("heartbeat", node = %ctx.node_id);
    run_inner(ctx, tracker).instrument(span).await
}

async fn run_inner(ctx: Ctx, tracker: TaskTracker) {
    let max = ctx
        .cfg
        .heartbeat_interval
        .get()
        .clamp(Duration::from_millis(200), Duration::from_secs(5));
    let mut backoff = Backoff::new(Duration::from_millis(50), max);
    loop {
        let session = async {
            match register(&ctx).await {
                Ok(client) => {
                    backoff.reset();
                    serve(&ctx, &client, &tracker).await
                }
                Err(e) => {
                    tracing::debug!("registration failed: {e}");
                    End::Disconnected
                }
            }
        };
        // A call in flight when the node stops gets a short grace (pending replica events are
        // sent on the way out), not its whole RPC deadline.
        let end = tokio::select! {
            biased;
            end = session => end,
            _ = ctx.kill.cancelled() => End::Stop,
            _ = async {
                ctx.shutdown.cancelled().await;
                tokio::time::sleep(STOP_GRACE).await;
            } => End::Stop,
        };
        ctx.set_registered(false);
        match end {
            End::Stop => return,
            End::Reregister => continue,
            End::Disconnected => {
                let d = backoff.next_delay();
                tokio::select! {
                    _ = ctx.shutdown.cancelled() => return,
                    _ = ctx.kill.cancelled() => return,
                    _ = tokio::time::sleep(d) => {}
                }
            }
        }
    }
}

async fn register(ctx: &Ctx) -> Result<DatanodeProtocolClient, String> {
    let addr = ctx.cfg.metadata_address.clone();
    // Security off: prove nothing (and join only a service that demands nothing).
    let secret = match ctx.cfg.security_enabled {
        true => sluice_common::auth::ClusterSecret::resolve(&ctx.cfg.cluster_secret_file)
            .map_err(|e| format!("cluster secret: {e}"))?
            .ok_or_else(|| sluice_common::auth::missing_secret("datanode"))
            .map(Some)?,
        false => None,
    };
    let connect = rpc::connect_datanode_protocol_with(addr.as_str(), secret.as_ref());
    let client = tokio::time::timeout(RPC_TIMEOUT, connect)
        .await
        .map_err(|_| format!("connecting to {addr} timed out"))?
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let space = ctx.dataset.space();
    let reg = DatanodeRegistration {
        id: ctx.id.clone(),
        capacity: space.capacity,
        used: space.used,
        remaining: space.remaining,
    };
    let resp = rpc::bounded(
        RPC_TIMEOUT,
        client.register(rpc::context_with_timeout(RPC_TIMEOUT), reg),
    )
    .await
    .map_err(|e| format!("register: {e}"))?
    .map_err(|e| format!("register refused: {e}"))?;
    ctx.metrics.registrations.inc();
    ctx.set_block_keys(resp.block_keys);
    ctx.set_registered(true);
    tracing::info!(metadata = %addr, id = %ctx.id, heartbeat_ms = resp.heartbeat_interval_ms, "registered");
    Ok(client)
}

/// One registration's life: reports, heartbeats, incremental reports, commands.
async fn serve(ctx: &Ctx, client: &DatanodeProtocolClient, tracker: &TaskTracker) -> End {
    let mut sched = Schedule::registered(
        Instant::now(),
        ctx.cfg.heartbeat_interval.get(),
        ctx.cfg.block_report_interval.get(),
    );
    loop {
        if !ctx.events.is_empty() && !send_events(ctx, client).await {
            return End::Disconnected;
        }
        let now = Instant::now();
        let res = match sched.due(now) {
            Due::BlockReport => block_report(ctx, client)
                .await
                .map(|()| sched.report_sent(now)),
            Due::Heartbeat => match heartbeat(ctx, client, tracker).await {
                Ok(reregister) => {
                    sched.heartbeat_sent(now);
                    if reregister {
                        return End::Reregister;
                    }
                    Ok(())
                }
                Err(e) => Err(e),
            },
            Due::WaitUntil(at) => {
                tokio::select! {
                    _ = ctx.shutdown.cancelled() => {
                        send_events(ctx, client).await;
                        return End::Stop;
                    }
                    _ = ctx.kill.cancelled() => return End::Stop,
                    _ = ctx.events.pushed() => {}
                    _ = tokio::time::sleep_until(at.into()) => {}
                }
                Ok(())
            }
        };
        match res {
            Ok(()) => {}
            Err(RpcFailure::Unregistered) => return End::Reregister,
            Err(RpcFailure::Other(e)) => {
                ctx.metrics.metadata_rpc_errors.inc();
                tracing::warn!("metadata service call failed: {e}");
                return End::Disconnected;
            }
        }
    }
}

enum RpcFailure {
    Unregistered,
    Other(String),
}

fn classify<T>(r: Result<Result<T, MetaError>, tarpc::client::RpcError>) -> Result<T, RpcFailure> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(MetaError::UnknownDatanode { .. })) => Err(RpcFailure::Unregistered),
        Ok(Err(e)) => Err(RpcFailure::Other(e.to_string())),
        Err(e) => Err(RpcFailure::Other(e.to_string())),
    }
}

async fn block_report(ctx: &Ctx, client: &DatanodeProtocolClient) -> Result<(), RpcFailure> {
    let ds = ctx.dataset.clone();
    let replicas = ds.report();
    let n = replicas.len();
    let unknown = classify(
        rpc::bounded(
            RPC_TIMEOUT,
            client.block_report(
                rpc::context_with_timeout(RPC_TIMEOUT),
                ctx.node_id.clone(),
                replicas,
            ),
        )
        .await,
    )?;
    ctx.metrics.block_reports_sent.inc();
    tracing::info!(replicas = n, unknown, "full block report sent");
    Ok(())
}

/// Sends queued events; false if the call failed (they are put back).
async fn send_events(ctx: &Ctx, client: &DatanodeProtocolClient) -> bool {
    let events = ctx.events.take();
    if events.is_empty() {
        return true;
    }
    let n = events.len() as u64;
    let r = rpc::bounded(
        RPC_TIMEOUT,
        client.block_received(
            rpc::context_with_timeout(RPC_TIMEOUT),
            ctx.node_id.clone(),
            events.clone(),
        ),
    )
    .await;
    match classify(r) {
        Ok(()) => {
            ctx.metrics.replica_events_sent.add(n);
            true
        }
        Err(_) => {
            ctx.metrics.metadata_rpc_errors.inc();
            ctx.events.put_back(events);
            false
        }
    }
}

/// Sends a heartbeat and runs its commands; `Ok(true)` asks to register again.
async fn heartbeat(
    ctx: &Ctx,
    client: &DatanodeProtocolClient,
    tracker: &TaskTracker,
) -> Result<bool, RpcFailure> {
    let space = ctx.dataset.space();
    let hb = Heartbeat {
        node: ctx.node_id.clone(),
        capacity: space.capacity,
        used: space.used,
        remaining: space.remaining,
        active_transfers: ctx.metrics.active_transfers.get().max(0) as u32,
        transfers_in_progress: ctx.metrics.replication_transfers_active.get().max(0) as u32,
        active_pipelines: ctx.metrics.active_pipelines.get().max(0) as u32,
        buffered_replicas: ctx.metrics.buffered_replicas.get().max(0) as u32,
    };
    let resp = classify(
        rpc::bounded(
            RPC_TIMEOUT,
            client.heartbeat(rpc::context_with_timeout(RPC_TIMEOUT), hb),
        )
        .await,
    )?;
    ctx.metrics.heartbeats_sent.inc();
    if resp.block_keys.is_some() {
        ctx.set_block_keys(resp.block_keys);
    }
    let mut reregister = false;
    for cmd in resp.commands {
        match cmd {
            DatanodeCommand::Delete { blocks } => delete(ctx, blocks).await,
            DatanodeCommand::Transfer {
                block,
                targets,
                token,
            } => spawn_transfer(ctx, tracker, block, targets, token),
            DatanodeCommand::RecoverBlock(rb) => {
                let span = tracing::info_span!("block_recovery", block = %rb.block.id, node = %ctx.node_id, recovery_id = %rb.recovery_id);
                let work = crate::recovery::worker::recover_block(ctx.clone(), client.clone(), rb);
                tracker.spawn(work.instrument(span));
            }
            DatanodeCommand::Reregister => reregister = true,
        }
    }
    Ok(reregister)
}

/// Counts a running `Transfer` command from the moment it is accepted (so that the next
/// heartbeat already reports it) until its task ends.
struct TransferSlot(std::sync::Arc<crate::metrics::Metrics>);

impl TransferSlot {
    fn take(metrics: &std::sync::Arc<crate::metrics::Metrics>) -> Self {
        metrics.replication_transfers_active.inc();
        let now = metrics.replication_transfers_active.get();
        metrics.replication_transfers_peak.raise_to(now);
        TransferSlot(metrics.clone())
    }
}

impl Drop for TransferSlot {
    fn drop(&mut self) {
        self.0.replication_transfers_active.dec();
    }
}

/// Runs a re-replication copy in a tracked task.
fn spawn_transfer(
    ctx: &Ctx,
    tracker: &TaskTracker,
    block: sluice_common::ExtendedBlock,
    targets: Vec<sluice_common::DatanodeId>,
    token: Option<sluice_common::token::BlockToken>,
) {
    let slot = TransferSlot::take(&ctx.metrics);
    let c = ctx.clone();
    let op = TransferBlockOp {
        block,
        targets,
        stage: crate::transfer::COMMAND_STAGE,
        client_name: format!("metadata-command@{}", ctx.node_id),
    };
    let span = tracing::info_span!("transfer_command", block = %block.id, node = %ctx.node_id);
    tracker.spawn(
        async move {
            let _slot = slot;
            c.metrics.replication_transfers.inc();
            c.metrics.transfer_block_ops.inc();
            if let Err(e) = crate::transfer::transfer(&c, op, token.as_ref()).await {
                c.metrics.replication_transfer_failures.inc();
                tracing::warn!("transfer command failed: {e}");
            }
        }
        .instrument(span),
    );
}

async fn delete(ctx: &Ctx, blocks: Vec<sluice_common::ExtendedBlock>) {
    for b in blocks {
        let ds = ctx.dataset.clone();
        match ctx.blocking(move || ds.delete(b)).await {
            Ok(Some(deleted)) => {
                tracing::info!(block = %b.id, "replica deleted");
                ctx.events.push(ReplicaEvent::Deleted(deleted));
            }
            Ok(None) => {}
            Err(DatanodeError::ShuttingDown) => return,
            Err(e) => tracing::warn!(block = %b.id, "delete failed: {e}"),
        }
    }
}
