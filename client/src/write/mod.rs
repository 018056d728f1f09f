//! The write path: [`FileWriter`] (HDFS `DFSOutputStream`) cuts bytes into packets and hands
//! them to its streamer task (HDFS `DataStreamer`), which owns the pipeline.
//!
//! - [`packet`]: chunks, checksums and packet boundaries (plain logic).
//! - [`ack`]: the ack queue (plain logic).
//! - [`pipeline`]: one pipeline's connection and state.
//! - [`streamer`]: the task that allocates blocks, sends packets and reads acks.
//! - [`recovery`]: rebuilding a failed pipeline (pipeline recovery).
//! - [`replace`]: the replace-DataNode-on-failure policy and the recovery limit (plain logic).
//! - [`metadata`]: the streamer's block calls to the metadata service.
//! - [`shared`]: what the writer and its streamer share.
//!
//! Backpressure: each packet holds one permit of a semaphore of `write.max.packets.in.flight`
//! permits from the moment the writer starts filling it until the whole pipeline acknowledges
//! it, so `poll_write` returns `Pending` while the window is full.

mod ack;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzzing;
mod metadata;
mod packet;
mod pipeline;
mod recovery;
mod replace;
mod shared;
mod streamer;

use crate::error::ClientError;
use crate::lease::LeaseGuard;
use crate::meta::MetadataClient;
use packet::Packetizer;
use sluice_common::config::ClientConfig;
use sluice_common::rpc::{AppendResponse, FileStatus};
use sluice_common::DatanodeId;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use streamer::{Command, FileParams, FlushPoint, Streamer, WriterShared};
use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio_util::sync::PollSemaphore;
use tokio_util::task::AbortOnDropHandle;

/// Options of [`crate::FileSystem::create`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Replace an existing file.
    pub overwrite: bool,
    /// Create missing parent directories.
    pub create_parent: bool,
    /// Replicas per block (`None`: the configured `replication`, 0 meaning the service's
    /// default).
    pub replication: Option<u16>,
    /// Block size in bytes (`None`: the configured `block.size`, 0 meaning the service's
    /// default); a multiple of `bytes.per.checksum`.
    pub block_size: Option<u64>,
}

/// What a writer is started with: the metadata service, the configuration, and the guard that
/// keeps its lease renewed while it is open.
pub(crate) struct WriterDeps {
    /// Metadata RPCs and the client name.
    pub meta: Arc<MetadataClient>,
    /// The client configuration.
    pub cfg: Arc<ClientConfig>,
    /// Counts this writer with the lease renewer.
    pub lease: LeaseGuard,
}

type OpFuture = Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Flush { sync: bool },
    Close,
}

/// A file open for writing. Implements [`AsyncWrite`]: `poll_flush` is an hflush and
/// `poll_shutdown` is [`FileWriter::close`]. Dropping a writer without closing it stops its
/// streamer; the file stays under construction until its lease expires.
pub struct FileWriter {
    meta: Arc<MetadataClient>,
    path: String,
    packetizer: Packetizer,
    tx: mpsc::UnboundedSender<Command>,
    window: PollSemaphore,
    /// The permit of the packet being filled.
    permit: Option<OwnedSemaphorePermit>,
    shared: Arc<WriterShared>,
    /// A flush or close in progress. In a `Mutex` only so that `FileWriter` is `Sync`; it
    /// is reached through `get_mut`, never locked.
    op: std::sync::Mutex<Option<(OpKind, OpFuture)>>,
    closed: Option<Result<(), ClientError>>,
    bytes_written: u64,
    lease: LeaseGuard,
    _streamer: AbortOnDropHandle<()>,
}

impl std::fmt::Debug for FileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriter")
            .field("path", &self.path)
            .field("bytes_written", &self.bytes_written)
            .field("closed", &self.closed.is_some())
            .finish()
    }
}

impl FileWriter {
    /// Starts the streamer of a file just created.
    pub(crate) fn start(deps: WriterDeps, status: FileStatus) -> Result<FileWriter, ClientError> {
        check_block_size(&status, "create")?;
        let cfg = &deps.cfg;
        let packetizer = Packetizer::new(
            cfg.bytes_per_checksum,
            cfg.write_packet_size.as_usize(),
            status.block_size,
        );
        Ok(Self::start_with(deps, status, packetizer, |s| s))
    }

    /// Starts the writer of a file the metadata service reopened for appending (`append`):
    /// with a partial last block, sets up its `Append` pipeline first (`tail` is the block's
    /// last partial chunk, re-sent with the first bytes so that its checksum is rewritten);
    /// otherwise the first byte starts a new block after `append.previous`.
    pub(crate) async fn start_append(
        deps: WriterDeps,
        append: AppendResponse,
        tail: Vec<u8>,
    ) -> Result<FileWriter, ClientError> {
        let status = append.status;
        check_block_size(&status, "append")?;
        let cfg = &deps.cfg;
        let (bpc, packet_size) = (cfg.bytes_per_checksum, cfg.write_packet_size.as_usize());
        let file_len = status.length;
        let (pipeline, packetizer) = match &append.last_block {
            Some(lb) => {
                let p = Streamer::setup_append(
                    &deps.meta,
                    &deps.cfg,
                    &status.path,
                    lb,
                    status.replication,
                )
                .await?;
                let packetizer = Packetizer::resume(
                    bpc,
                    packet_size,
                    status.block_size,
                    lb.block.num_bytes,
                    &tail,
                );
                (Some(p), packetizer)
            }
            None => (None, Packetizer::new(bpc, packet_size, status.block_size)),
        };
        let previous = append.previous;
        Ok(Self::start_with(deps, status, packetizer, move |s| {
            s.resume(pipeline, previous, file_len)
        }))
    }

    fn start_with(
        deps: WriterDeps,
        status: FileStatus,
        packetizer: Packetizer,
        prepare: impl FnOnce(Streamer) -> Streamer,
    ) -> FileWriter {
        let WriterDeps { meta, cfg, lease } = deps;
        let path = status.path.clone();
        let shared = Arc::new(WriterShared::new(
            &path,
            cfg.write_max_packets_in_flight as usize,
        ));
        let (tx, rx) = mpsc::unbounded_channel();
        let params = FileParams {
            replication: status.replication,
        };
        let streamer = prepare(Streamer::new(
            Arc::clone(&meta),
            cfg,
            path.clone(),
            params,
            rx,
            Arc::clone(&shared),
        ));
        let task = AbortOnDropHandle::new(tokio::spawn(streamer.run()));
        FileWriter {
            window: PollSemaphore::new(Arc::clone(&shared.window)),
            meta,
            path,
            packetizer,
            tx,
            permit: None,
            shared,
            op: std::sync::Mutex::new(None),
            closed: None,
            bytes_written: 0,
            lease,
            _streamer: task,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Bytes accepted by `write` so far.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Bytes of the file acknowledged by every DataNode of their pipelines so far. It never
    /// shrinks: pipeline recovery continues from it, and a failed write claims nothing past
    /// it.
    pub fn bytes_acked(&self) -> u64 {
        self.shared.acked()
    }

    /// The DataNodes of the current block's pipeline, in order (empty between blocks). After a
    /// pipeline recovery it is the rebuilt pipeline (HDFS `DFSOutputStream.getPipeline`).
    pub fn pipeline(&self) -> Vec<DatanodeId> {
        self.shared.pipeline()
    }

    /// Pipeline recoveries this writer went through.
    pub fn pipeline_recoveries(&self) -> u64 {
        self.shared.recoveries()
    }

    /// Sends everything written so far, including a partial chunk, and waits until every
    /// DataNode of the pipeline has acknowledged it: new readers then see it.
    pub async fn hflush(&mut self) -> Result<(), ClientError> {
        std::future::poll_fn(|cx| self.poll_op(cx, OpKind::Flush { sync: false })).await
    }

    /// As [`FileWriter::hflush`], with every DataNode making the data durable (fsync) before
    /// it acknowledges; then records the length with the metadata service so that `stat`
    /// shows it.
    pub async fn hsync(&mut self) -> Result<(), ClientError> {
        std::future::poll_fn(|cx| self.poll_op(cx, OpKind::Flush { sync: true })).await
    }

    /// Flushes, ends the last block, and completes the file. Returns the first error of the
    /// writer's life; calling it again returns the same outcome.
    pub async fn close(&mut self) -> Result<(), ClientError> {
        std::future::poll_fn(|cx| self.poll_op(cx, OpKind::Close)).await
    }

    /// Drives the pending op (if any) and then `kind` to completion.
    fn poll_op(&mut self, cx: &mut Context<'_>, kind: OpKind) -> Poll<Result<(), ClientError>> {
        loop {
            let op = self.op.get_mut().unwrap_or_else(|p| p.into_inner());
            if let Some((running, fut)) = op.as_mut() {
                let running = *running;
                let r = ready!(fut.as_mut().poll(cx));
                *op = None;
                if running == OpKind::Close {
                    self.closed = Some(r.clone());
                    self.lease.release();
                }
                if running == kind {
                    return Poll::Ready(r);
                }
                if let Err(e) = r {
                    return Poll::Ready(Err(e));
                }
                continue;
            }
            if let Some(outcome) = &self.closed {
                return Poll::Ready(match kind {
                    OpKind::Close => outcome.clone(),
                    OpKind::Flush { .. } => Err(self.closed_error()),
                });
            }
            let fut = self.start_op(kind);
            *self.op.get_mut().unwrap_or_else(|p| p.into_inner()) = Some((kind, fut));
        }
    }

    fn closed_error(&self) -> ClientError {
        match &self.closed {
            Some(Err(e)) => e.clone(),
            _ => ClientError::WriterClosed {
                path: self.path.clone(),
            },
        }
    }

    /// Takes what is buffered and builds the future of a flush or close.
    fn start_op(&mut self, kind: OpKind) -> OpFuture {
        let sync = kind == OpKind::Flush { sync: true };
        let packet = self.packetizer.take_flush(sync);
        let permit = if packet.is_some() {
            self.permit.take()
        } else {
            None
        };
        let tx = self.tx.clone();
        let shared = Arc::clone(&self.shared);
        let meta = Arc::clone(&self.meta);
        let path = self.path.clone();
        Box::pin(async move {
            if let Some(e) = shared.error() {
                return Err(e);
            }
            if let Some(packet) = packet {
                let permit = match permit {
                    Some(p) => p,
                    None => Arc::clone(&shared.window)
                        .acquire_owned()
                        .await
                        .map_err(|_| shared.error_or_closed())?,
                };
                let cmd = Command::Packet {
                    packet,
                    permit: Some(permit),
                };
                tx.send(cmd).map_err(|_| shared.error_or_closed())?;
            }
            match kind {
                OpKind::Close => {
                    let (done, rx) = oneshot::channel();
                    tx.send(Command::Close { done })
                        .map_err(|_| shared.error_or_closed())?;
                    rx.await.map_err(|_| shared.error_or_closed())?
                }
                OpKind::Flush { sync } => {
                    let (done, rx) = oneshot::channel();
                    tx.send(Command::Flush { sync, done })
                        .map_err(|_| shared.error_or_closed())?;
                    let point = rx.await.map_err(|_| shared.error_or_closed())??;
                    if sync {
                        record_length(&meta, &path, point).await?;
                    }
                    Ok(())
                }
            }
        })
    }

    fn send(&self, cmd: Command) -> Result<(), ClientError> {
        self.tx.send(cmd).map_err(|_| self.shared.error_or_closed())
    }

    /// Hands the current packet to the streamer when it is full.
    fn emit_full(&mut self) -> Result<(), ClientError> {
        if let Some(full) = self.packetizer.take_full() {
            let permit = self.permit.take();
            self.send(Command::Packet {
                packet: full.packet,
                permit,
            })?;
            if full.ends_block {
                self.send(Command::EndBlock)?;
            }
        }
        Ok(())
    }

    fn poll_write_inner(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<Result<usize, ClientError>> {
        let running = self
            .op
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(k, _)| *k);
        if let Some(kind) = running {
            ready!(self.poll_op(cx, kind))?;
        }
        if self.closed.is_some() {
            return Poll::Ready(Err(self.closed_error()));
        }
        if let Some(e) = self.shared.error() {
            return Poll::Ready(Err(e));
        }
        let mut written = 0;
        while written < buf.len() {
            if self.permit.is_none() {
                match self.window.poll_acquire(cx) {
                    Poll::Ready(Some(p)) => self.permit = Some(p),
                    Poll::Ready(None) => return Poll::Ready(Err(self.shared.error_or_closed())),
                    Poll::Pending if written > 0 => break,
                    Poll::Pending => return Poll::Pending,
                }
            }
            written += self.packetizer.write(&buf[written..]);
            self.emit_full()?;
        }
        self.bytes_written += written as u64;
        Poll::Ready(Ok(written))
    }
}

/// A block size of 0 from the metadata service would make every packet end a block.
fn check_block_size(status: &FileStatus, call: &str) -> Result<(), ClientError> {
    if status.block_size == 0 {
        return Err(ClientError::protocol(
            "metadata service",
            format!("{call} returned block size 0 for {}", status.path),
        ));
    }
    Ok(())
}

/// After an hsync: tells the metadata service the last block's length.
async fn record_length(
    meta: &MetadataClient,
    path: &str,
    point: FlushPoint,
) -> Result<(), ClientError> {
    let Some(len) = point.last_block_len else {
        return Ok(()); // no block yet: the file is empty
    };
    meta.fsync(path, len).await
}

impl AsyncWrite for FileWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_write_inner(cx, buf)
            .map_err(io::Error::from)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .poll_op(cx, OpKind::Flush { sync: false })
            .map_err(io::Error::from)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .poll_op(cx, OpKind::Close)
            .map_err(io::Error::from)
    }
}
