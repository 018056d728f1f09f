//! A replica as the DataNode tracks it: its state (with named transitions), generation stamp,
//! volume and directory, and the live lengths shared with its writer and readers.
//!
//! **Visible length** = `min(bytes_acked, bytes_on_disk)` for a replica being written, the file
//! length for a finalized one (protocol.md "Visible length"). `bytes_on_disk` is raised by the
//! replica writer after its sink has handed the bytes to the file; `bytes_acked` by the ack
//! responder once every DataNode downstream acked them, just before the ack goes upstream (so a
//! writer whose hflush returned is sure new readers see its bytes). Readers only ever see
//! visible bytes.

use super::layout;
use crate::error::{DatanodeError, Result};
use sluice_common::proto::{BlockStage, ReplicaInfo, ReplicaState};
use sluice_common::{BlockId, ExtendedBlock, GenerationStamp};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The named state changes of a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// A `Create` pipeline makes a new replica (→ Rbw).
    Create,
    /// A transfer target starts receiving a copy (→ Temporary).
    BeginTransfer,
    /// The last packet of a pipeline: Rbw → Finalized.
    Finalize,
    /// The DataNode restarted: Rbw → Rwr.
    Restart,
    /// A transfer's last packet: Temporary → Rbw (`TransferRbw`) or Finalized.
    CompleteTransfer(BlockStage),
    /// Pipeline recovery under a new generation stamp: Rbw/Rwr → Rbw (streaming recovery).
    Recover,
    /// Close recovery: Rbw/Rwr/Finalized → Finalized.
    RecoverClose,
    /// Append under a new generation stamp: Finalized → Rbw (HDFS `append`), or an earlier
    /// append attempt's Rbw/Rwr → Rbw (HDFS `recoverAppend`).
    Append,
    /// Block recovery puts the replica under recovery: Rbw/Rwr/Finalized/Rur → Rur.
    InitRecovery,
    /// Block recovery ends: Rur → Finalized (agreed length, recovery id as stamp).
    CommitRecovery,
}

/// The state after `t` from `from` (`None`: no replica yet), or `None` if `t` is not allowed.
pub fn transition(from: Option<ReplicaState>, t: Transition) -> Option<ReplicaState> {
    use ReplicaState::*;
    match (from, t) {
        (None, Transition::Create) => Some(Rbw),
        (None, Transition::BeginTransfer) => Some(Temporary),
        (Some(Rbw), Transition::Finalize) => Some(Finalized),
        (Some(Rbw), Transition::Restart) => Some(Rwr),
        (Some(Temporary), Transition::CompleteTransfer(BlockStage::TransferRbw)) => Some(Rbw),
        (Some(Temporary), Transition::CompleteTransfer(BlockStage::TransferFinalized)) => {
            Some(Finalized)
        }
        (Some(Rbw | Rwr), Transition::Recover) => Some(Rbw),
        (Some(Rbw | Rwr | Finalized), Transition::RecoverClose) => Some(Finalized),
        (Some(Finalized | Rbw | Rwr), Transition::Append) => Some(Rbw),
        (Some(Rbw | Rwr | Finalized | Rur), Transition::InitRecovery) => Some(Rur),
        (Some(Rur), Transition::CommitRecovery) => Some(Finalized),
        _ => None,
    }
}

/// The writer currently attached to a replica: a way to stop it and to learn it has ended.
#[derive(Clone, Debug)]
pub struct WriterSlot {
    /// Cancelled to ask the writer to stop (recovery, replacement, delete).
    pub stop: CancellationToken,
    /// Closed (sender dropped) once the writer has flushed and released the replica.
    pub done: watch::Receiver<()>,
}

/// A replica under block recovery (state Rur): what it was before, and the recovery it is
/// under (HDFS's `ReplicaUnderRecovery`). Kept in memory only: after a restart the replica is
/// what the scan finds (Rwr or Finalized) and the recovery's next attempt starts over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveryMark {
    /// The state before recovery (never Rur).
    pub original: ReplicaState,
    /// The recovery id (the generation stamp the replica takes when recovered).
    pub recovery_id: GenerationStamp,
}

/// The mutable, shared part of a replica: lengths, the attached writer, and the recovery it
/// is under.
#[derive(Debug, Default)]
pub struct ReplicaLive {
    bytes_on_disk: AtomicU64,
    bytes_acked: AtomicU64,
    writer: Mutex<Option<WriterSlot>>,
    recovery: Mutex<Option<RecoveryMark>>,
}

impl ReplicaLive {
    /// Lengths as given.
    pub fn new(bytes_on_disk: u64, bytes_acked: u64) -> Arc<Self> {
        Arc::new(ReplicaLive {
            bytes_on_disk: AtomicU64::new(bytes_on_disk),
            bytes_acked: AtomicU64::new(bytes_acked),
            writer: Mutex::new(None),
            recovery: Mutex::new(None),
        })
    }

    /// The recovery this replica is under, if any.
    pub fn recovery(&self) -> Option<RecoveryMark> {
        *self.recovery.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts the replica under recovery (or moves it to a newer recovery).
    pub fn set_recovery(&self, mark: RecoveryMark) {
        *self.recovery.lock().unwrap_or_else(|p| p.into_inner()) = Some(mark);
    }

    /// Bytes in the block file.
    pub fn bytes_on_disk(&self) -> u64 {
        self.bytes_on_disk.load(Ordering::Acquire)
    }

    /// Bytes acknowledged upstream.
    pub fn bytes_acked(&self) -> u64 {
        self.bytes_acked.load(Ordering::Acquire)
    }

    /// Sets the bytes in the block file (the writer, after its sink wrote them).
    pub fn set_bytes_on_disk(&self, n: u64) {
        self.bytes_on_disk.store(n, Ordering::Release);
    }

    /// Raises the acknowledged length (never lowers it).
    pub fn ack_up_to(&self, n: u64) {
        self.bytes_acked.fetch_max(n, Ordering::AcqRel);
    }

    /// Sets both lengths (truncation, finalize).
    pub fn reset(&self, n: u64) {
        self.bytes_on_disk.store(n, Ordering::Release);
        self.bytes_acked.store(n, Ordering::Release);
    }

    /// Attaches a writer; returns the sender half the writer drops when it is done.
    pub fn attach_writer(&self, stop: CancellationToken) -> watch::Sender<()> {
        let (tx, rx) = watch::channel(());
        if let Ok(mut w) = self.writer.lock() {
            *w = Some(WriterSlot { stop, done: rx });
        }
        tx
    }

    /// The attached writer, if any is still running.
    pub fn writer(&self) -> Option<WriterSlot> {
        let slot = self.writer.lock().ok()?.clone()?;
        slot.done.has_changed().is_ok().then_some(slot)
    }

    /// Asks the attached writer (if any) to stop and waits, up to `timeout`, until it has
    /// flushed and let go of the replica: what a recovery, a transfer or a new writer of the
    /// same replica does first.
    pub async fn stop_writer(&self, block: BlockId, timeout: Duration) -> Result<()> {
        let Some(slot) = self.writer() else {
            return Ok(());
        };
        tracing::info!(%block, "stopping the replica's previous writer");
        slot.stop.cancel();
        let mut done = slot.done;
        tokio::time::timeout(timeout, async { while done.changed().await.is_ok() {} })
            .await
            .map_err(|_| DatanodeError::Timeout {
                what: "the previous writer to stop",
                secs: timeout.as_secs_f64(),
            })
    }
}

/// One replica in the replica map. Cheap to clone; the live part is shared.
#[derive(Clone, Debug)]
pub struct ReplicaEntry {
    /// The block id.
    pub id: BlockId,
    /// Generation stamp (names the metadata file).
    pub gen_stamp: GenerationStamp,
    /// State.
    pub state: ReplicaState,
    /// Index of the volume holding it.
    pub volume: usize,
    /// Directory holding its two files.
    pub dir: PathBuf,
    /// Bytes per checksum of its metadata file.
    pub bytes_per_checksum: u32,
    /// Lengths and writer, shared with the writer and readers.
    pub live: Arc<ReplicaLive>,
}

impl ReplicaEntry {
    /// Path of the block file.
    pub fn block_path(&self) -> PathBuf {
        self.dir.join(layout::block_file_name(self.id))
    }

    /// Path of the metadata file.
    pub fn meta_path(&self) -> PathBuf {
        self.dir
            .join(layout::meta_file_name(self.id, self.gen_stamp))
    }

    /// Bytes a reader may read.
    pub fn visible_length(&self) -> u64 {
        match self.state {
            ReplicaState::Finalized => self.live.bytes_on_disk(),
            _ => self.live.bytes_acked().min(self.live.bytes_on_disk()),
        }
    }

    /// The length reported to the metadata service: the final length of a finalized replica,
    /// the bytes on disk otherwise (lease recovery takes the minimum over replicas).
    pub fn reported_length(&self) -> u64 {
        self.live.bytes_on_disk()
    }

    /// The block as reported (id, generation stamp, reported length).
    pub fn block(&self) -> ExtendedBlock {
        ExtendedBlock::new(self.id, self.gen_stamp, self.reported_length())
    }

    /// What the `ReplicaInfo` op and read answers carry.
    pub fn info(&self) -> ReplicaInfo {
        ReplicaInfo {
            block: ExtendedBlock::new(self.id, self.gen_stamp, self.visible_length()),
            state: self.state,
            bytes_on_disk: self.live.bytes_on_disk(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReplicaState::*;

    #[test]
    fn transitions_follow_the_state_machine() {
        assert_eq!(transition(None, Transition::Create), Some(Rbw));
        assert_eq!(transition(Some(Rbw), Transition::Finalize), Some(Finalized));
        assert_eq!(transition(Some(Finalized), Transition::Finalize), None);
        assert_eq!(transition(Some(Rbw), Transition::Restart), Some(Rwr));
        assert_eq!(transition(Some(Finalized), Transition::Restart), None);
        assert_eq!(
            transition(
                Some(Temporary),
                Transition::CompleteTransfer(BlockStage::TransferRbw)
            ),
            Some(Rbw)
        );
        assert_eq!(
            transition(
                Some(Temporary),
                Transition::CompleteTransfer(BlockStage::Create)
            ),
            None
        );
        assert_eq!(transition(Some(Rwr), Transition::Recover), Some(Rbw));
        assert_eq!(transition(Some(Finalized), Transition::Recover), None);
        assert_eq!(
            transition(Some(Finalized), Transition::RecoverClose),
            Some(Finalized)
        );
        assert_eq!(transition(Some(Rwr), Transition::InitRecovery), Some(Rur));
        assert_eq!(transition(Some(Rur), Transition::InitRecovery), Some(Rur));
        assert_eq!(transition(Some(Temporary), Transition::InitRecovery), None);
        assert_eq!(
            transition(Some(Rur), Transition::CommitRecovery),
            Some(Finalized)
        );
        assert_eq!(transition(Some(Rur), Transition::Finalize), None);
        assert_eq!(transition(Some(Rur), Transition::Recover), None);
    }

    #[test]
    fn visible_length_is_the_minimum_while_writing() {
        let live = ReplicaLive::new(1000, 0);
        let mut e = ReplicaEntry {
            id: BlockId(1),
            gen_stamp: GenerationStamp(1),
            state: Rbw,
            volume: 0,
            dir: PathBuf::from("/x"),
            bytes_per_checksum: 512,
            live: live.clone(),
        };
        assert_eq!(e.visible_length(), 0);
        live.ack_up_to(600);
        assert_eq!(e.visible_length(), 600);
        live.ack_up_to(400);
        assert_eq!(e.visible_length(), 600, "acked length never shrinks");
        live.ack_up_to(1500);
        assert_eq!(e.visible_length(), 1000, "never past the bytes on disk");
        e.state = Finalized;
        assert_eq!(e.visible_length(), 1000);
    }

    #[test]
    fn writer_slot_reports_a_finished_writer_as_gone() {
        let live = ReplicaLive::new(0, 0);
        let tx = live.attach_writer(CancellationToken::new());
        assert!(live.writer().is_some());
        drop(tx);
        assert!(live.writer().is_none());
    }
}
