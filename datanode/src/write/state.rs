//! The replica writer's logic, free of actors: what to do with each packet, an hsync, the end
//! of the block, or a stop. The [`super::writer::ReplicaWriter`] actor is a thin shell that runs
//! these methods, in packet order, on the blocking pool.
//!
//! The writer knows its stage and whether its DataNode is the last of the pipeline: that is
//! what decides the sink (write-memory batching applies only to `Create` replicas, by default
//! only on the last DataNode). Today every writer uses the [`DirectSink`].

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
pub struct WriteState {
    block: BlockId,
    settings: WriterSettings,
    sink: Box<dyn ReplicaSink>,
    live: Arc<ReplicaLive>,
    dataset: Arc<Dataset>,
}

impl std::fmt::Debug for WriteState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteState")
            .field("block", &self.block)
            .field("stage", &self.settings.stage)
            .field("received", &self.sink.bytes_received())
            .finish()
    }
}

impl WriteState {
    /// A writer for `replica`, continuing at its bytes on disk.
    pub fn new(
        replica: OpenReplica,
        settings: WriterSettings,
        dataset: Arc<Dataset>,
        metrics: Arc<Metrics>,
    ) -> WriteState {
        let block = replica.entry.id;
        let live = replica.entry.live.clone();
        let sink = choose_sink(replica, &settings, metrics);
        WriteState {
            block,
            settings,
            sink,
            live,
            dataset,
        }
    }

    /// Bytes received so far.
    pub fn bytes_received(&self) -> u64 {
        self.sink.bytes_received()
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
        self.sink.write(offset, data, checksums)?;
        self.live.set_bytes_on_disk(self.sink.bytes_on_disk());
        if sync {
            self.failpoint("dn::before_fsync")?;
            self.sink.sync()?;
            self.live.set_bytes_on_disk(self.sink.bytes_on_disk());
        }
        Ok(())
    }

    /// Hands buffered bytes to the file (the idle-flush hook of a buffered sink).
    pub fn flush(&mut self) -> Result<()> {
        self.sink.flush()?;
        self.live.set_bytes_on_disk(self.sink.bytes_on_disk());
        Ok(())
    }

    /// The last packet: drain (and fsync with `sync.on.close`), then move the replica to its
    /// final place and state. The sink is released.
    pub fn finalize(&mut self) -> Result<ReplicaEntry> {
        self.failpoint("dn::finalize")?;
        self.sink.finalize(self.settings.sync_on_close)?;
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

impl Drop for WriteState {
    fn drop(&mut self) {
        self.sink.release();
    }
}

/// The sink for a replica: the direct sink today. The buffered sink of write-memory batching
/// goes here, for `Create` replicas (on the last DataNode unless configured otherwise).
fn choose_sink(
    replica: OpenReplica,
    settings: &WriterSettings,
    metrics: Arc<Metrics>,
) -> Box<dyn ReplicaSink> {
    tracing::debug!(
        block = %replica.entry.id,
        stage = ?settings.stage,
        last = settings.last_in_pipeline,
        "replica writer uses the direct sink"
    );
    Box::new(DirectSink::new(replica, metrics))
}
