//! The data streamer: one task per open file that owns the write pipeline (HDFS
//! `DataStreamer` + `ResponseProcessor`). It takes packets from the writer, allocates blocks
//! (`add_block`, retried elsewhere when the pipeline cannot be set up), sends packets, reads
//! acks, sends heartbeats while idle, ends blocks, answers flushes once everything before them
//! is acknowledged, and completes the file.
//!
//! A block ends HDFS's way: once every data packet is acknowledged, the empty last packet is
//! sent; so when the pipeline fails with only that packet unacknowledged, close recovery
//! finishes the block with the survivors.
//!
//! Every pipeline failure goes through [`Streamer::on_pipeline_failure`]: it moves the
//! unacknowledged packets back in front of what the writer has queued, has [`Recovery`] rebuild
//! the pipeline, and re-sends them — or fails the write when recovery cannot go on (no DataNode
//! left, no replacement where the policy requires one, the same packet failing more than
//! [`super::replace::MAX_RECOVERIES_PER_PACKET`] times, a metadata error).

use super::ack::{AckOutcome, AckQueue, InFlight};
use super::metadata;
use super::packet::OutPacket;
use super::pipeline::Pipeline;
use super::recovery::{Failed, Recovered, Recovery};
use super::replace::{RecoveryBudget, ReplaceRule};
pub(crate) use super::shared::WriterShared;
use crate::connection::DnSettings;
use crate::error::{ClientError, PipelineFailure};
use crate::meta::MetadataClient;
use futures::StreamExt;
use sluice_common::config::ClientConfig;
use sluice_common::frame::Frame;
use sluice_common::proto::Message;
use sluice_common::{DatanodeId, ExtendedBlock, FrameError, MetaError, NodeId};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio::time::Instant;
use tracing::{debug, info, warn, Instrument};

/// What the writer asks of the streamer.
#[derive(Debug)]
pub(crate) enum Command {
    /// Send a data packet of the current block (allocating the block first if needed).
    Packet {
        /// The packet.
        packet: OutPacket,
        /// Its window permit, released when the pipeline acknowledges it.
        permit: Option<OwnedSemaphorePermit>,
    },
    /// The current block is full: send its last packet and wait for the ack.
    EndBlock,
    /// Answer once everything sent so far is acknowledged (after a sync packet if `sync`).
    Flush {
        /// hsync rather than hflush.
        sync: bool,
        /// The answer.
        done: oneshot::Sender<Result<FlushPoint, ClientError>>,
    },
    /// End the current block and complete the file.
    Close {
        /// The answer.
        done: oneshot::Sender<Result<(), ClientError>>,
    },
}

/// Where a flush left the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlushPoint {
    /// Acknowledged length of the file's last block, if it has one.
    pub last_block_len: Option<u64>,
}

enum Event {
    Ack(Option<Result<Frame<Message>, FrameError>>),
    Command(Option<Command>),
    Timer,
}

/// Whether the streamer goes on after an event.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Done,
}

/// What the streamer needs to know about the file beyond its path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileParams {
    /// Replication factor (decides replacements in pipeline recovery).
    pub replication: u16,
}

/// The streamer task's state.
pub(crate) struct Streamer {
    meta: Arc<MetadataClient>,
    cfg: Arc<ClientConfig>,
    path: String,
    params: FileParams,
    rx: mpsc::UnboundedReceiver<Command>,
    shared: Arc<WriterShared>,
    settings: DnSettings,
    pipeline: Option<Pipeline>,
    /// The file's last finished block, with its final length.
    previous: Option<ExtendedBlock>,
    /// Bytes of the file in finished blocks.
    finished_bytes: u64,
    /// The block is being ended: no more commands until its last packet is acknowledged.
    ending: bool,
    /// Close recovery finished the block: the block as finalized.
    closed_by_recovery: Option<ExtendedBlock>,
    /// The writer has hflushed or hsynced (replacement policy input).
    hflushed: bool,
    /// DataNodes taken out of the current block's pipelines.
    failed: Vec<DatanodeId>,
    /// DataNodes that failed a new block's set-up, and when: excluded from this writer's
    /// next blocks for `write.exclude.nodes.cache.expiry` (HDFS's `excludedNodes` cache).
    excluded: Vec<(NodeId, Instant)>,
    budget: RecoveryBudget,
    flush_waiters: Vec<oneshot::Sender<Result<FlushPoint, ClientError>>>,
    close_waiter: Option<oneshot::Sender<Result<(), ClientError>>>,
}

impl Streamer {
    /// A streamer for `path`, fed by `rx`.
    pub(crate) fn new(
        meta: Arc<MetadataClient>,
        cfg: Arc<ClientConfig>,
        path: String,
        params: FileParams,
        rx: mpsc::UnboundedReceiver<Command>,
        shared: Arc<WriterShared>,
    ) -> Streamer {
        let settings = dn_settings(&cfg);
        Streamer {
            meta,
            cfg,
            path,
            params,
            rx,
            shared,
            settings,
            pipeline: None,
            previous: None,
            finished_bytes: 0,
            ending: false,
            closed_by_recovery: None,
            hflushed: false,
            failed: Vec::new(),
            excluded: Vec::new(),
            budget: RecoveryBudget::default(),
            flush_waiters: Vec::new(),
            close_waiter: None,
        }
    }

    /// A streamer appending to `path`: continuing on `pipeline` (an append to a partial last
    /// block, set up by [`Streamer::setup_append`]) or, without one, starting a new block
    /// after `previous`; `file_len` bytes are in the file already. An appender counts as
    /// having hflushed for the replacement policy (HDFS `isAppend`): bytes already in the
    /// file must not be left on fewer DataNodes.
    pub(crate) fn resume(
        mut self,
        pipeline: Option<Pipeline>,
        previous: Option<ExtendedBlock>,
        file_len: u64,
    ) -> Streamer {
        self.hflushed = true;
        self.previous = previous;
        self.finished_bytes = file_len - pipeline.as_ref().map_or(0, |p| p.block.num_bytes);
        self.shared.set_acked(file_len);
        if let Some(p) = &pipeline {
            self.shared.set_pipeline(&p.nodes);
        }
        self.pipeline = pipeline;
        self
    }

    /// Sets up the pipeline of an append to the partial last block `lb`.
    pub(crate) async fn setup_append(
        meta: &MetadataClient,
        cfg: &ClientConfig,
        path: &str,
        lb: &sluice_common::rpc::LocatedBlock,
        replication: u16,
    ) -> Result<Pipeline, ClientError> {
        let mut failed = Vec::new();
        let r = Recovery {
            meta,
            path,
            settings: dn_settings(cfg),
            bpc: cfg.bytes_per_checksum,
            rule: ReplaceRule::from_config(cfg),
            replication,
            hflushed: true,
            failed: &mut failed,
        };
        r.append(lb).await
    }

    /// Runs until the file is completed, the writer goes away, or the write fails.
    pub(crate) async fn run(mut self) {
        let span = tracing::info_span!("streamer", path = %self.path);
        let r = self.run_loop().instrument(span.clone()).await;
        if let Err(e) = r {
            span.in_scope(|| warn!(error = %e, "write failed"));
            self.shared.fail(&e);
            for w in self.flush_waiters.drain(..) {
                let _ = w.send(Err(e.clone()));
            }
            if let Some(w) = self.close_waiter.take() {
                let _ = w.send(Err(e));
            }
        }
    }

    async fn run_loop(&mut self) -> Result<(), ClientError> {
        loop {
            let flow = match self.next_event().await {
                Event::Ack(frame) => self.on_ack_frame(frame).await?,
                Event::Command(None) => {
                    debug!("writer dropped without close; stopping");
                    return Ok(());
                }
                Event::Command(Some(cmd)) => self.on_command(cmd).await?,
                Event::Timer => self.on_timer().await?,
            };
            if flow == Flow::Done || self.settle().await? == Flow::Done {
                return Ok(());
            }
        }
    }

    /// After each event: finishes a block that close recovery finalized, and sends the last
    /// packet of a block being ended once every data packet is acknowledged.
    async fn settle(&mut self) -> Result<Flow, ClientError> {
        loop {
            if let Some(block) = self.closed_by_recovery.take() {
                return self.finish_block(block).await;
            }
            let Some(p) = self.pipeline.as_mut() else {
                return Ok(Flow::Continue);
            };
            if !self.ending || p.last_sent || !p.acks.is_empty() {
                return Ok(Flow::Continue);
            }
            // Every packet offset is a chunk boundary (protocol.md), the empty last one too.
            let bpc = u64::from(self.cfg.bytes_per_checksum);
            let offset = p.bytes_sent / bpc * bpc;
            debug!(block = %p.block.id, length = p.bytes_sent, "sending the block's last packet");
            self.send(OutPacket::empty(offset, true, false), None)
                .await?;
        }
    }

    async fn next_event(&mut self) -> Event {
        let accept = !self.ending && self.close_waiter.is_none();
        let deadline = self.next_deadline();
        let pipe = self.pipeline.as_mut();
        let rx = &mut self.rx;
        tokio::select! {
            biased;
            f = read_ack(pipe) => Event::Ack(f),
            c = rx.recv(), if accept => Event::Command(c),
            _ = tokio::time::sleep_until(deadline) => Event::Timer,
        }
    }

    fn next_deadline(&self) -> Instant {
        let far = Instant::now() + Duration::from_secs(24 * 3600);
        let Some(p) = &self.pipeline else { return far };
        let mut d = p.ack_deadline().unwrap_or(far);
        if !self.ending {
            d = d.min(p.heartbeat_due());
        }
        d
    }

    async fn on_command(&mut self, cmd: Command) -> Result<Flow, ClientError> {
        match cmd {
            Command::Packet { packet, permit } => {
                if self.pipeline.is_none() {
                    let p = self.setup_block().await?;
                    self.shared.set_pipeline(&p.nodes);
                    self.pipeline = Some(p);
                }
                self.send(packet, permit).await?;
            }
            Command::EndBlock => self.end_block(),
            Command::Flush { sync, done } => self.on_flush(sync, done).await?,
            Command::Close { done } => {
                self.close_waiter = Some(done);
                if self.pipeline.is_some() {
                    self.end_block();
                } else {
                    return self.finish_close().await;
                }
            }
        }
        Ok(Flow::Continue)
    }

    async fn send(
        &mut self,
        packet: OutPacket,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<(), ClientError> {
        let Some(p) = self.pipeline.as_mut() else {
            return Err(ClientError::WriterClosed {
                path: self.path.clone(),
            });
        };
        match p.send(packet, permit).await {
            Ok(()) => Ok(()),
            Err(f) => self.on_pipeline_failure(f).await,
        }
    }

    async fn on_flush(
        &mut self,
        sync: bool,
        done: oneshot::Sender<Result<FlushPoint, ClientError>>,
    ) -> Result<(), ClientError> {
        self.hflushed = true;
        let Some(p) = self.pipeline.as_mut() else {
            let point = FlushPoint {
                last_block_len: self.previous.map(|b| b.num_bytes),
            };
            let _ = done.send(Ok(point));
            return Ok(());
        };
        if sync && !p.synced {
            // Nothing new to send, but data since the last sync must be made durable: an
            // empty packet with the sync flag at the current chunk boundary (as HDFS does).
            let bpc = u64::from(self.cfg.bytes_per_checksum);
            let offset = p.bytes_sent / bpc * bpc;
            self.send(OutPacket::empty(offset, false, true), None)
                .await?;
        }
        self.flush_waiters.push(done);
        self.answer_flushes();
        Ok(())
    }

    /// Answers the flush waiters once nothing is in flight.
    fn answer_flushes(&mut self) {
        let Some(p) = &self.pipeline else { return };
        if !p.acks.is_empty() || self.flush_waiters.is_empty() {
            return;
        }
        let point = FlushPoint {
            last_block_len: Some(p.acks.acked_len()),
        };
        for w in self.flush_waiters.drain(..) {
            let _ = w.send(Ok(point));
        }
    }

    /// Starts ending the block: no more commands; [`Streamer::settle`] sends the last packet
    /// once every data packet is acknowledged.
    fn end_block(&mut self) {
        if let Some(p) = &self.pipeline {
            debug!(block = %p.block.id, length = p.bytes_sent, "ending block");
            self.ending = true;
        }
    }

    async fn on_ack_frame(
        &mut self,
        frame: Option<Result<Frame<Message>, FrameError>>,
    ) -> Result<Flow, ClientError> {
        let Some(p) = self.pipeline.as_mut() else {
            return Ok(Flow::Continue);
        };
        let ack = match frame {
            Some(Ok(Frame {
                header: Message::Ack(ack),
                ..
            })) => ack,
            Some(Ok(f)) => {
                let failure = PipelineFailure::AckProtocol {
                    node: p.first(),
                    reason: format!(
                        "expected an Ack, got {}",
                        crate::connection::message_name(&f.header)
                    ),
                };
                return self.fail_pipeline(failure).await;
            }
            Some(Err(e)) => {
                let node = p.first().to_string();
                let error = crate::connection::frame_error(&node, "reading acks", e);
                let failure = p.connection_failure(error);
                return self.fail_pipeline(failure).await;
            }
            None => {
                let error = ClientError::Closed {
                    node: p.first().to_string(),
                    what: "acks",
                };
                let failure = p.connection_failure(error);
                return self.fail_pipeline(failure).await;
            }
        };
        let outcome = match p.acks.on_ack(&ack, &p.nodes) {
            Ok(o) => o,
            Err(f) => {
                self.on_pipeline_failure(f).await?;
                return Ok(Flow::Continue);
            }
        };
        p.last_ack_progress = Instant::now();
        if let AckOutcome::Acked {
            acked_len, last, ..
        } = outcome
        {
            p.block.num_bytes = acked_len;
            self.shared.set_acked(self.finished_bytes + acked_len);
            if last {
                let block = p.block;
                return self.finish_block(block).await;
            }
        }
        self.answer_flushes();
        Ok(Flow::Continue)
    }

    async fn fail_pipeline(&mut self, failure: PipelineFailure) -> Result<Flow, ClientError> {
        self.on_pipeline_failure(failure).await?;
        Ok(Flow::Continue)
    }

    /// The block is done (its last packet acknowledged, or close recovery finalized it).
    async fn finish_block(&mut self, block: ExtendedBlock) -> Result<Flow, ClientError> {
        info!(block = %block.id, gen_stamp = %block.gen_stamp, length = block.num_bytes, "block written");
        self.pipeline = None;
        self.shared.set_pipeline(&[]);
        self.previous = Some(block);
        self.finished_bytes += block.num_bytes;
        self.shared.set_acked(self.finished_bytes);
        self.ending = false;
        if self.close_waiter.is_some() {
            return self.finish_close().await;
        }
        Ok(Flow::Continue)
    }

    async fn finish_close(&mut self) -> Result<Flow, ClientError> {
        metadata::complete(&self.meta, &self.path, self.previous).await?;
        if let Some(w) = self.close_waiter.take() {
            let _ = w.send(Ok(()));
        }
        Ok(Flow::Done)
    }

    async fn on_timer(&mut self) -> Result<Flow, ClientError> {
        let now = Instant::now();
        let Some(p) = self.pipeline.as_mut() else {
            return Ok(Flow::Continue);
        };
        if p.ack_deadline().is_some_and(|d| now >= d) {
            let failure = PipelineFailure::AckTimeout {
                node: p.first(),
                after: sluice_common::proto::ack_timeout(self.settings.timeout, p.nodes.len()),
            };
            return self.fail_pipeline(failure).await;
        }
        if !self.ending && now >= p.heartbeat_due() {
            debug!(block = %p.block.id, "sending heartbeat");
            if let Err(f) = p.send_heartbeat().await {
                self.on_pipeline_failure(f).await?;
            }
        }
        Ok(Flow::Continue)
    }

    /// The pipeline failed at `f.node()` (HDFS `processDatanodeOrExternalError`): the
    /// unacknowledged packets go back in front of the writer's queue, [`Recovery`] rebuilds
    /// the pipeline, and they are re-sent. A failure while re-sending starts over. Returns an
    /// error when the write cannot go on.
    async fn on_pipeline_failure(&mut self, mut f: PipelineFailure) -> Result<(), ClientError> {
        loop {
            let Some(mut p) = self.pipeline.take() else {
                return Err(ClientError::WriterClosed {
                    path: self.path.clone(),
                });
            };
            let in_flight = p.acks.drain();
            warn!(block = %p.block.id, node = %f.node(), reason = %f, unacked = in_flight.len(), acked = p.block.num_bytes, "pipeline failed");
            let progress = p.acks.acked_packets();
            if self.budget.on_failure(p.block.id, progress).is_err() {
                return Err(ClientError::RecoveryLimit {
                    block: p.block.id,
                    attempts: self.budget.tried(),
                    last: Box::new(f),
                });
            }
            let closing = self.ending && p.last_sent;
            let (synced, block) = (p.synced, p.block);
            let failed = Failed {
                block,
                nodes: std::mem::take(&mut p.nodes),
                failure: f,
                closing,
            };
            drop(p); // closes the connection to the old first DataNode
            let recovered = self.recovery().run(failed).await?;
            self.shared.count_recovery();
            let mut np = match recovered {
                Recovered::Closed { block, nodes } => {
                    self.shared.set_pipeline(&nodes);
                    self.closed_by_recovery = Some(block);
                    return Ok(());
                }
                Recovered::Streaming(np) => *np,
            };
            np.acks = AckQueue::resume(block.num_bytes, progress);
            np.synced = synced;
            self.shared.set_pipeline(&np.nodes);
            let resent = resend(&mut np, in_flight).await;
            self.pipeline = Some(np);
            match resent {
                Ok(()) => {
                    self.answer_flushes();
                    return Ok(());
                }
                Err(again) => f = again,
            }
        }
    }

    fn recovery(&mut self) -> Recovery<'_> {
        Recovery {
            meta: &self.meta,
            path: &self.path,
            settings: self.settings,
            bpc: self.cfg.bytes_per_checksum,
            rule: ReplaceRule::from_config(&self.cfg),
            replication: self.params.replication,
            hflushed: self.hflushed,
            failed: &mut self.failed,
        }
    }

    /// Allocates the next block and sets up its pipeline, abandoning the block and excluding
    /// the bad DataNode when set-up fails (HDFS `nextBlockOutputStream`).
    ///
    /// The exclusion cache (DataNodes that failed this writer's earlier set-ups) is a hint,
    /// never a reason for fewer replicas: when the block it shapes gets fewer DataNodes than
    /// the replication asks for — or none — the block is abandoned and allocated again without
    /// the cached DataNodes (once; a node that fails again is excluded by this set-up). A
    /// DataNode restarted after a failure would otherwise be left out of every new pipeline
    /// for `write.exclude.nodes.cache.expiry`, and on a small cluster each block would be
    /// written to fewer DataNodes than it could have been.
    async fn setup_block(&mut self) -> Result<Pipeline, ClientError> {
        let attempts = self.cfg.block_write_retries + 1;
        let expiry = self.cfg.exclude_nodes_expiry.get();
        self.excluded.retain(|(_, at)| at.elapsed() < expiry);
        let mut cached: Vec<NodeId> = self.excluded.iter().map(|(n, _)| n.clone()).collect();
        let mut excluded = cached.clone();
        let mut tried: Vec<DatanodeId> = Vec::new();
        let mut last: Option<ClientError> = None;
        let want = usize::from(self.params.replication);
        self.failed.clear();
        let mut attempt = 0;
        while attempt < attempts {
            let shaped_by_cache = excluded.iter().any(|n| cached.contains(n));
            let lb = match metadata::add_block(&self.meta, &self.path, self.previous, &excluded)
                .await
            {
                Ok(lb) => lb,
                Err(ClientError::Meta(MetaError::NotEnoughDatanodes { .. })) if shaped_by_cache => {
                    self.forget_cached(&mut cached, &mut excluded);
                    continue;
                }
                // Excluding failed DataNodes left too few: report the whole story.
                Err(e @ ClientError::Meta(MetaError::NotEnoughDatanodes { .. }))
                    if !excluded.is_empty() =>
                {
                    last = Some(e);
                    break;
                }
                Err(e) => return Err(e),
            };
            if lb.locations.len() < want && shaped_by_cache {
                debug!(
                    block = %lb.block.id,
                    nodes = lb.locations.len(),
                    want,
                    "short pipeline because of cached exclusions: allocating again without them"
                );
                metadata::abandon(&self.meta, &self.path, &lb).await;
                self.forget_cached(&mut cached, &mut excluded);
                continue;
            }
            attempt += 1;
            let client = self.meta.client_name();
            let bpc = self.cfg.bytes_per_checksum;
            match Pipeline::create(&lb, client, bpc, self.settings).await {
                Ok(p) => {
                    debug!(block = %lb.block.id, nodes = lb.locations.len(), "pipeline set up");
                    return Ok(p);
                }
                Err(e) => {
                    warn!(block = %lb.block.id, attempt, error = %e, "pipeline set-up failed");
                    metadata::abandon(&self.meta, &self.path, &lb).await;
                    let bad = match &e {
                        ClientError::Pipeline { failure, .. } => Some(failure.node().clone()),
                        _ => lb.locations.first().cloned(),
                    };
                    if let Some(bad) = bad {
                        if !expiry.is_zero() {
                            self.excluded.push((bad.node_id.clone(), Instant::now()));
                        }
                        excluded.push(bad.node_id.clone());
                        tried.push(bad);
                    }
                    last = Some(e);
                }
            }
        }
        Err(ClientError::PipelineSetup {
            path: self.path.clone(),
            attempts,
            tried,
            last: Box::new(last.unwrap_or_else(|| {
                ClientError::protocol("metadata service", "no block to set a pipeline up for")
            })),
        })
    }

    /// Drops the cached exclusions from this set-up (`excluded`) and from the writer's cache:
    /// they are tried again. DataNodes this set-up excluded itself stay excluded.
    fn forget_cached(&mut self, cached: &mut Vec<NodeId>, excluded: &mut Vec<NodeId>) {
        excluded.retain(|n| !cached.contains(n));
        self.excluded.retain(|(n, _)| !cached.contains(n));
        cached.clear();
    }
}

/// The DataNode socket settings of `cfg`.
fn dn_settings(cfg: &ClientConfig) -> DnSettings {
    DnSettings {
        timeout: cfg.socket_timeout.get(),
        max_frame: cfg.max_frame_bytes.as_usize(),
    }
}

/// Re-sends `packets` (oldest first) on a rebuilt pipeline. On a failure the packets not yet
/// sent are queued behind the failed one, so the next recovery finds them all, in order.
async fn resend(p: &mut Pipeline, packets: Vec<InFlight>) -> Result<(), PipelineFailure> {
    let mut rest = packets.into_iter();
    for inf in rest.by_ref() {
        if let Err(f) = p.send(inf.packet, inf.permit).await {
            for later in rest {
                p.requeue(later.packet, later.permit);
            }
            return Err(f);
        }
    }
    Ok(())
}

async fn read_ack(p: Option<&mut Pipeline>) -> Option<Result<Frame<Message>, FrameError>> {
    match p {
        Some(p) => p.reader.next().await,
        None => std::future::pending().await,
    }
}
