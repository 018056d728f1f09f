//! The data streamer: one task per open file that owns the write pipeline (HDFS
//! `DataStreamer` + `ResponseProcessor`). It takes packets from the writer, allocates blocks
//! (`add_block`, retried elsewhere when the pipeline cannot be set up), sends packets, reads
//! acks, sends heartbeats while idle, ends blocks, answers flushes once everything before them
//! is acknowledged, and completes the file.
//!
//! A pipeline failure goes through [`Streamer::on_pipeline_failure`], the one place pipeline
//! recovery will take over; for now it fails the write with an error naming the DataNode.

use super::ack::{AckFailure, AckOutcome};
use super::packet::OutPacket;
use super::pipeline::Pipeline;
use crate::connection::DnSettings;
use crate::error::ClientError;
use crate::filesystem::FsInner;
use futures::StreamExt;
use sluice_common::frame::Frame;
use sluice_common::proto::Message;
use sluice_common::rpc::LocatedBlock;
use sluice_common::{ExtendedBlock, FrameError, MetaError, NodeId};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
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

/// State shared by the writer and its streamer: the first error, and the in-flight window.
#[derive(Debug)]
pub(crate) struct WriterShared {
    error: Mutex<Option<ClientError>>,
    /// One permit per packet not yet acknowledged; closed when the writer fails.
    pub window: Arc<Semaphore>,
    path: String,
}

impl WriterShared {
    /// Shared state with a window of `window` packets.
    pub(crate) fn new(path: &str, window: usize) -> WriterShared {
        WriterShared {
            error: Mutex::new(None),
            window: Arc::new(Semaphore::new(window)),
            path: path.to_string(),
        }
    }

    /// Records the first error and closes the window so that blocked writers wake up.
    pub(crate) fn fail(&self, e: &ClientError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e.clone());
        }
        self.window.close();
    }

    /// The first error, if any.
    pub(crate) fn error(&self) -> Option<ClientError> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The first error, or "writer closed" when the streamer is gone without one.
    pub(crate) fn error_or_closed(&self) -> ClientError {
        self.error().unwrap_or_else(|| ClientError::WriterClosed {
            path: self.path.clone(),
        })
    }
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

/// The streamer task's state.
pub(crate) struct Streamer {
    fs: Arc<FsInner>,
    path: String,
    rx: mpsc::UnboundedReceiver<Command>,
    shared: Arc<WriterShared>,
    settings: DnSettings,
    pipeline: Option<Pipeline>,
    /// The file's last finished block, with its final length.
    previous: Option<ExtendedBlock>,
    /// The block's last packet is sent; waiting for its ack.
    ending: bool,
    flush_waiters: Vec<oneshot::Sender<Result<FlushPoint, ClientError>>>,
    close_waiter: Option<oneshot::Sender<Result<(), ClientError>>>,
}

impl Streamer {
    /// A streamer for `path`, fed by `rx`.
    pub(crate) fn new(
        fs: Arc<FsInner>,
        path: String,
        rx: mpsc::UnboundedReceiver<Command>,
        shared: Arc<WriterShared>,
    ) -> Streamer {
        let settings = DnSettings {
            timeout: fs.cfg.socket_timeout.get(),
            max_frame: fs.cfg.max_frame_bytes.as_usize(),
        };
        Streamer {
            fs,
            path,
            rx,
            shared,
            settings,
            pipeline: None,
            previous: None,
            ending: false,
            flush_waiters: Vec::new(),
            close_waiter: None,
        }
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
            if flow == Flow::Done {
                return Ok(());
            }
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
                    self.pipeline = Some(self.setup_block().await?);
                }
                self.send(packet, permit).await?;
            }
            Command::EndBlock => self.end_block().await?,
            Command::Flush { sync, done } => self.on_flush(sync, done).await?,
            Command::Close { done } => {
                self.close_waiter = Some(done);
                if self.pipeline.is_some() {
                    self.end_block().await?;
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
            let bpc = u64::from(self.fs.cfg.bytes_per_checksum);
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

    async fn end_block(&mut self) -> Result<(), ClientError> {
        let Some(p) = &self.pipeline else {
            return Ok(());
        };
        // Every packet offset is a chunk boundary (protocol.md), the empty last one too.
        let bpc = u64::from(self.fs.cfg.bytes_per_checksum);
        let offset = p.bytes_sent / bpc * bpc;
        debug!(block = %p.block.id, length = p.bytes_sent, "ending block");
        self.ending = true;
        self.send(OutPacket::empty(offset, true, false), None).await
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
                let reason = format!(
                    "expected an Ack, got {}",
                    crate::connection::message_name(&f.header)
                );
                return self.fail_pipeline(0, reason).await;
            }
            Some(Err(e)) => return self.fail_pipeline(0, format!("reading acks: {e}")).await,
            None => {
                return self
                    .fail_pipeline(0, "connection closed while acks were expected".into())
                    .await
            }
        };
        let outcome = match p.acks.on_ack(&ack, p.nodes.len()) {
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
            if last {
                return self.finish_block().await;
            }
        }
        self.answer_flushes();
        Ok(Flow::Continue)
    }

    async fn fail_pipeline(
        &mut self,
        bad_index: usize,
        reason: String,
    ) -> Result<Flow, ClientError> {
        self.on_pipeline_failure(AckFailure { bad_index, reason })
            .await?;
        Ok(Flow::Continue)
    }

    /// The block's last packet is acknowledged: the block is done.
    async fn finish_block(&mut self) -> Result<Flow, ClientError> {
        if let Some(p) = self.pipeline.take() {
            info!(block = %p.block.id, gen_stamp = %p.block.gen_stamp, length = p.block.num_bytes, "block written");
            self.previous = Some(p.block);
        }
        self.ending = false;
        if self.close_waiter.is_some() {
            return self.finish_close().await;
        }
        Ok(Flow::Continue)
    }

    async fn finish_close(&mut self) -> Result<Flow, ClientError> {
        self.complete().await?;
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
            let reason = format!(
                "no ack within the socket timeout ({:?})",
                self.settings.timeout
            );
            return self.fail_pipeline(0, reason).await;
        }
        if !self.ending && now >= p.heartbeat_due() {
            debug!(block = %p.block.id, "sending heartbeat");
            if let Err(f) = p.send_heartbeat().await {
                self.on_pipeline_failure(f).await?;
            }
        }
        Ok(Flow::Continue)
    }

    /// The pipeline failed at `f.bad_index`. This is the single place pipeline recovery will
    /// replace (exclude the node, new generation stamp, rebuild, re-send the ack queue); for
    /// now the write fails with an error naming the DataNode.
    async fn on_pipeline_failure(&mut self, f: AckFailure) -> Result<(), ClientError> {
        let Some(p) = self.pipeline.take() else {
            return Err(ClientError::WriterClosed {
                path: self.path.clone(),
            });
        };
        let node = p.node_name(f.bad_index);
        warn!(block = %p.block.id, node = %node, reason = %f.reason, "pipeline failed");
        Err(ClientError::Pipeline {
            block: p.block.id,
            node,
            index: f.bad_index,
            reason: f.reason,
        })
    }

    /// Allocates the next block and sets up its pipeline, abandoning the block and excluding
    /// the bad DataNode when set-up fails (HDFS `nextBlockOutputStream`).
    async fn setup_block(&mut self) -> Result<Pipeline, ClientError> {
        let attempts = self.fs.cfg.block_write_retries + 1;
        let mut excluded: Vec<NodeId> = Vec::new();
        let mut tried: Vec<String> = Vec::new();
        let mut last = String::new();
        for attempt in 1..=attempts {
            let lb = self.add_block(&excluded).await?;
            let client = &self.fs.client_name;
            let bpc = self.fs.cfg.bytes_per_checksum;
            match Pipeline::create(&lb, client, bpc, self.settings).await {
                Ok(p) => {
                    debug!(block = %lb.block.id, nodes = lb.locations.len(), "pipeline set up");
                    return Ok(p);
                }
                Err(f) => {
                    warn!(block = %lb.block.id, attempt, error = %f.error, "pipeline set-up failed");
                    self.abandon(&lb).await;
                    let bad = f.bad.or_else(|| lb.locations.first().cloned());
                    if let Some(bad) = bad {
                        tried.push(bad.to_string());
                        excluded.push(bad.node_id);
                    }
                    last = f.error.to_string();
                }
            }
        }
        Err(ClientError::PipelineSetup {
            path: self.path.clone(),
            attempts,
            tried,
            last,
        })
    }

    /// `add_block`, retried with backoff while the previous block is not replicated yet.
    /// The metadata service answers a repeated `add_block` (same `previous`, block untouched)
    /// with the same block, and a repeated `complete`/`abandon_block` with the same outcome,
    /// so these calls are retried after a reconnection.
    async fn add_block(&self, excluded: &[NodeId]) -> Result<LocatedBlock, ClientError> {
        let deadline = Instant::now() + self.fs.cfg.rpc_timeout.get();
        let mut delay = Duration::from_millis(100);
        loop {
            let (path, client) = (self.path.clone(), self.fs.client_name.clone());
            let (prev, excl) = (self.previous, excluded.to_vec());
            let r = self
                .fs
                .call("add_block", true, |c, ctx| {
                    let (path, client, excl) = (path.clone(), client.clone(), excl.clone());
                    async move { c.add_block(ctx, path, client, prev, excl).await }
                })
                .await;
            match r {
                Err(ClientError::Meta(MetaError::NotReplicatedYet { block }))
                    if Instant::now() + delay < deadline =>
                {
                    debug!(%block, ?delay, "previous block not replicated yet; retrying add_block");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    async fn abandon(&self, lb: &LocatedBlock) {
        let (path, client, block) = (self.path.clone(), self.fs.client_name.clone(), lb.block);
        let r = self
            .fs
            .call("abandon_block", true, |c, ctx| {
                let (path, client) = (path.clone(), client.clone());
                async move { c.abandon_block(ctx, path, client, block).await }
            })
            .await;
        if let Err(e) = r {
            warn!(block = %block.id, error = %e, "abandon_block failed");
        }
    }

    /// `complete`, retried with a doubling backoff from 100 ms until it says the file is
    /// closed or the deadline (the RPC timeout) passes.
    async fn complete(&self) -> Result<(), ClientError> {
        let timeout = self.fs.cfg.rpc_timeout.get();
        let deadline = Instant::now() + timeout;
        let mut delay = Duration::from_millis(100);
        loop {
            let (path, client, last) = (
                self.path.clone(),
                self.fs.client_name.clone(),
                self.previous,
            );
            let done = self
                .fs
                .call("complete", true, |c, ctx| {
                    let (path, client) = (path.clone(), client.clone());
                    async move { c.complete(ctx, path, client, last).await }
                })
                .await?;
            if done {
                info!(last = ?self.previous.map(|b| b.id), "file complete");
                return Ok(());
            }
            if Instant::now() + delay > deadline {
                return Err(ClientError::CompleteTimeout {
                    path: self.path.clone(),
                    after: timeout,
                });
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }
}

async fn read_ack(p: Option<&mut Pipeline>) -> Option<Result<Frame<Message>, FrameError>> {
    match p {
        Some(p) => p.reader.next().await,
        None => std::future::pending().await,
    }
}
