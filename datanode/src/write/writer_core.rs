//! The replica writer's logic, free of actors: what to do with each packet, an hsync, the end
//! of the block, or a stop. The [`super::writer_actor::ReplicaWriter`] actor is a thin shell that runs
//! these methods, in packet order, on the blocking pool.
//!
//! The writer knows its stage and whether its DataNode is the last of the pipeline: that is
//! what decides the sink (write-memory batching applies only to `Create` replicas, by default
//! only on the last DataNode; see [`super::buffer_pool::BufferSettings::applies`]). The receiver
//! takes the memory permit and hands it here as a [`BufferLease`]: with one the writer uses a
//! [`BufferedSink`], without one the [`DirectSink`].

use super::buffer_pool::BufferLease;
use super::buffered_sink::BufferedSink;
use super::sink::{DirectSink, ReplicaSink};
use crate::error::{DatanodeError, Result};
use crate::failpoint::{FailAction, FailScope};
use crate::metrics::Metrics;
use crate::storage::dataset::{Dataset, OpenReplica};
use crate::storage::replica::{ReplicaEntry, ReplicaLive};
use sluice_common::proto::BlockStage;
use sluice_common::BlockId;
use std::sync::Arc;

/// Where a writer sits and how it must behave.
#[derive(Clone, Debug)]
pub struct WriterSettings {
    /// Why the pipeline was set up.
    pub stage: BlockStage,
    /// True when this DataNode has no downstream.
    pub last_in_pipeline: bool,
    /// fsync block and metadata files at finalize (`sync.on.close`).
    pub sync_on_close: bool,
    /// Failpoint scope of this DataNode.
    pub scope: FailScope,
}

/// The state of one replica being written.
pub struct WriterCore {
    block: BlockId,
    settings: WriterSettings,
    sink: Box<dyn ReplicaSink>,
    live: Arc<ReplicaLive>,
    dataset: Arc<Dataset>,
}

impl std::fmt::Debug for WriterCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterCore")
            .field("block", &self.block)
            .field("stage", &self.settings.stage)
            .field("received", &self.sink.bytes_received())
            .finish()
    }
}

impl WriterCore {
    /// A writer for `replica`, continuing at its bytes on disk; buffered when given a memory
    /// permit (`lease`). Blocks (opens files, allocates the buffer). On failure the permit and
    /// the buffer go back.
    pub fn new(
        replica: OpenReplica,
        settings: WriterSettings,
        dataset: Arc<Dataset>,
        metrics: Arc<Metrics>,
        lease: Option<BufferLease>,
    ) -> Result<WriterCore> {
        let block = replica.entry.id;
        let live = replica.entry.live.clone();
        let sink = choose_sink(replica, &settings, metrics, lease)?;
        Ok(WriterCore {
            block,
            settings,
            sink,
            live,
            dataset,
        })
    }

    /// True when the writer batches in memory.
    pub fn is_buffered(&self) -> bool {
        self.sink.is_buffered()
    }

    /// True when writing a packet of `len` bytes without `sync` is a memory copy only (see
    /// [`ReplicaSink::writes_in_memory`]): cheap enough for the receiver's own task.
    pub fn writes_in_memory(&self, len: usize) -> bool {
        self.sink.writes_in_memory(len)
    }

    /// True when received bytes wait in memory for a flush.
    pub fn pending(&self) -> bool {
        self.sink.pending()
    }

    /// Writes one packet (data from the chunk boundary `offset`, and its checksums); with
    /// `sync`, makes everything received durable before returning (hsync).
    pub fn write_packet(
        &mut self,
        offset: u64,
        data: &[u8],
        checksums: &[u8],
        sync: bool,
    ) -> Result<()> {
        let res = self.sink.write(offset, data, checksums);
        self.live.set_bytes_on_disk(self.sink.bytes_on_disk());
        res?;
        if sync {
            self.sync()?;
        }
        Ok(())
    }

    /// Drains the sink and makes everything received durable.
    fn sync(&mut self) -> Result<()> {
        self.flush()?;
        self.failpoint("dn::before_fsync")?;
        self.sink.sync()?;
        self.live.set_bytes_on_disk(self.sink.bytes_on_disk());
        Ok(())
    }

    /// Hands buffered bytes to the file (the idle-flush hook of a buffered sink).
    pub fn flush(&mut self) -> Result<()> {
        let res = self.sink.flush();
        self.live.set_bytes_on_disk(self.sink.bytes_on_disk());
        res
    }

    /// The last packet: drain (and fsync with `sync.on.close`), then move the replica to its
    /// final place and state. The sink is released.
    pub fn finalize(&mut self) -> Result<ReplicaEntry> {
        self.failpoint("dn::finalize")?;
        if self.settings.sync_on_close {
            self.sync()?;
        } else {
            self.flush()?;
        }
        let len = self.sink.bytes_on_disk();
        let res = self
            .dataset
            .finalize(self.block, &self.live, len, self.settings.stage);
        self.sink.release();
        res
    }

    /// The pipeline ended early (upstream lost, stopped, or failed): what was received is
    /// written to the block file, then the sink is released. The replica stays where it is.
    pub fn stop(&mut self) -> Result<()> {
        let res = self.flush();
        self.sink.release();
        res
    }

    /// Frees the sink without flushing (idempotent).
    pub fn release(&mut self) {
        self.sink.release();
    }

    fn failpoint(&self, name: &'static str) -> Result<()> {
        match self.settings.scope.check(name) {
            None => Ok(()),
            Some(a) => Err(DatanodeError::Failpoint {
                name,
                drop: a == FailAction::Drop,
            }),
        }
    }
}

impl Drop for WriterCore {
    fn drop(&mut self) {
        self.sink.release();
    }
}

/// The sink for a replica: buffered when the receiver got a memory permit for it (a `Create`
/// replica, on the last DataNode unless configured otherwise), direct otherwise.
fn choose_sink(
    replica: OpenReplica,
    settings: &WriterSettings,
    metrics: Arc<Metrics>,
    lease: Option<BufferLease>,
) -> Result<Box<dyn ReplicaSink>> {
    let (block, stage, last) = (replica.entry.id, settings.stage, settings.last_in_pipeline);
    let Some(lease) = lease else {
        tracing::debug!(%block, ?stage, last, "replica writer uses the direct sink");
        return Ok(Box::new(DirectSink::new(replica, metrics)));
    };
    let sink = BufferedSink::new(replica, lease, metrics, settings.scope.clone())?;
    tracing::info!(
        %block,
        ?stage,
        last,
        o_direct = sink.uses_direct_io(),
        "replica writer buffers in memory (write-memory batching)"
    );
    Ok(Box::new(sink))
}
