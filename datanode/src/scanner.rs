//! The block scanner (HDFS's `VolumeScanner`): verifies the stored CRC32C of every finalized
//! replica once per `block.scanner.interval`, reading at most `block.scanner.bytes.per.second`
//! (0 turns the scanner off), and reports a replica whose data does not match its checksums
//! (or whose files are damaged) to the metadata service with `ReplicaEvent::Corrupt`. The
//! metadata service has it replaced from a good replica, then deleted.
//!
//! A pass lists the finalized replicas (by block id), then verifies them one piece at a time:
//! each piece is read on the blocking pool, then the task sleeps long enough to keep to the
//! rate, so the scanner never holds a thread while it waits and stops promptly. Replicas
//! deleted, replaced or put under recovery during a pass are skipped. A pass starts at
//! start-up and then one interval after the previous one started (or right after it ended,
//! if it took longer).

use crate::context::Ctx;
use crate::error::{DatanodeError, Result};
use crate::read::range::read_piece;
use crate::storage::dataset::ReadReplica;
use sluice_common::checksum;
use sluice_common::proto::ReplicaState;
use sluice_common::rpc::ReplicaEvent;
use sluice_common::{BlockId, ExtendedBlock};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Data bytes verified per read (a multiple of any sane bytes-per-checksum).
const PIECE: u64 = 1024 * 1024;

/// What verifying one replica found.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Every chunk matches its checksum.
    Good,
    /// The data or the metadata file is damaged; the reason says how.
    Corrupt(String),
    /// The replica went away or changed during the scan: nothing to say.
    Gone,
}

/// Runs until the node stops.
pub(crate) async fn run(ctx: Ctx) {
    let rate = ctx.cfg.block_scanner_bytes_per_second.bytes();
    if rate == 0 {
        tracing::info!(node = %ctx.node_id, "block scanner off");
        return;
    }
    let interval = ctx.cfg.block_scanner_interval.get();
    loop {
        let started = Instant::now();
        let ids = finalized_ids(&ctx);
        for id in ids {
            if stopping(&ctx) {
                return;
            }
            scan_one(&ctx, id, rate).await;
        }
        tracing::debug!(node = %ctx.node_id, took = ?started.elapsed(), "block scanner pass done");
        let next = started + interval;
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            _ = ctx.kill.cancelled() => return,
            _ = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

fn stopping(ctx: &Ctx) -> bool {
    ctx.shutdown.is_cancelled() || ctx.kill.is_cancelled()
}

fn finalized_ids(ctx: &Ctx) -> Vec<BlockId> {
    let mut ids: Vec<BlockId> = ctx
        .dataset
        .report()
        .into_iter()
        .filter(|r| r.state == ReplicaState::Finalized)
        .map(|r| r.block.id)
        .collect();
    ids.sort();
    ids
}

/// Verifies one replica and reports it if corrupt.
async fn scan_one(ctx: &Ctx, id: BlockId, rate: u64) {
    let ds = ctx.dataset.clone();
    let opened = ctx.blocking(move || ds.open_read(id)).await;
    let replica = match opened {
        Ok(r) if r.entry.state == ReplicaState::Finalized => Arc::new(r),
        Ok(_) | Err(DatanodeError::ReplicaNotFound { .. }) => return,
        Err(DatanodeError::ShuttingDown) => return,
        Err(e) => {
            let block = ctx.dataset.get(id).map(|e| e.block());
            if let Some(block) = block {
                report(ctx, block, e.to_string());
            }
            return;
        }
    };
    let block = replica.entry.block();
    match verify(ctx, &replica, rate).await {
        Ok(Verdict::Good) => {
            ctx.metrics.scanner_replicas_verified.inc();
        }
        Ok(Verdict::Gone) => {}
        Ok(Verdict::Corrupt(reason)) => {
            // Only if the replica is still the one verified (not replaced meanwhile).
            let same = ctx
                .dataset
                .get(id)
                .is_some_and(|e| Arc::ptr_eq(&e.live, &replica.entry.live));
            if same {
                report(ctx, block, reason);
            }
        }
        Err(e) => tracing::debug!(block = %id, "block scanner stopped on this replica: {e}"),
    }
}

fn report(ctx: &Ctx, block: ExtendedBlock, reason: String) {
    tracing::warn!(block = %block, node = %ctx.node_id, %reason, "block scanner found a corrupt replica");
    ctx.metrics.scanner_corrupt_replicas.inc();
    ctx.events.push(ReplicaEvent::Corrupt(block));
}

/// Reads the whole replica piece by piece at no more than `rate` bytes per second.
async fn verify(ctx: &Ctx, replica: &Arc<ReadReplica>, rate: u64) -> Result<Verdict> {
    let e = &replica.entry;
    let len = e.live.bytes_on_disk();
    let bpc = u64::from(e.bytes_per_checksum);
    let step = (PIECE / bpc).max(1) * bpc;
    let on_disk = match std::fs::metadata(&replica.block_path) {
        Ok(m) => m.len(),
        Err(_) => return Ok(Verdict::Gone),
    };
    if on_disk != len {
        return Ok(Verdict::Corrupt(format!(
            "block file holds {on_disk} bytes, the replica {len}"
        )));
    }
    let started = Instant::now();
    let mut offset = 0u64;
    while offset < len {
        if stopping(ctx) {
            return Ok(Verdict::Gone);
        }
        let n = step.min(len - offset) as usize;
        let r = replica.clone();
        let piece = match ctx.blocking(move || read_piece(&r, offset, n, len)).await {
            Ok(p) => p,
            Err(DatanodeError::ShuttingDown) => return Ok(Verdict::Gone),
            Err(e) => return Ok(Verdict::Corrupt(e.to_string())),
        };
        if let Err(err) = checksum::verify(
            &piece.data(),
            &piece.checksums(),
            e.bytes_per_checksum,
            offset,
        ) {
            return Ok(Verdict::Corrupt(err.to_string()));
        }
        offset += n as u64;
        ctx.metrics.scanner_bytes_verified.add(n as u64);
        let due = started + Duration::from_secs_f64(offset as f64 / rate as f64);
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return Ok(Verdict::Gone),
            _ = ctx.kill.cancelled() => return Ok(Verdict::Gone),
            _ = tokio::time::sleep_until(due.into()) => {}
        }
    }
    Ok(Verdict::Good)
}
