//! The source side of `TransferBlock` (and of the metadata service's `Transfer` command): copy
//! `[0, block.num_bytes)` of a local replica to `targets` through a `WriteBlock` pipeline with
//! stage `TransferRbw` or `TransferFinalized`.
//!
//! Packets carry the stored checksums (a partial last chunk's checksum is recomputed over the
//! bytes sent, see [`crate::read::range`]), then the last packet; acks are read concurrently
//! and every one must be all-SUCCESS.

use crate::context::Ctx;
use crate::error::{DatanodeError, Result};
use crate::read::range::read_piece;
use crate::wire::{self, FrameReader, FrameWriter};
use crate::write::pipeline;
use bytes::Bytes;
use sluice_common::proto::{BlockStage, Message, PacketHeader, TransferBlockOp, WriteBlockOp};
use sluice_common::token::BlockToken;
use sluice_common::ExtendedBlock;
use std::sync::Arc;

/// Data bytes per transfer packet (HDFS's 64 KiB).
const PACKET_DATA: u64 = 64 * 1024;

/// Copies the replica; returns the block as copied.
pub(crate) async fn transfer(
    ctx: &Ctx,
    op: TransferBlockOp,
    token: Option<&BlockToken>,
) -> Result<ExtendedBlock> {
    let id = op.block.id;
    if !op.stage.is_transfer() || op.targets.is_empty() {
        return Err(DatanodeError::invalid(format!(
            "a transfer needs a Transfer stage and targets, got {:?} with {} targets",
            op.stage,
            op.targets.len()
        )));
    }
    let ds = ctx.dataset.clone();
    let replica = Arc::new(ctx.blocking(move || ds.open_read(id)).await?);
    let e = &replica.entry;
    if e.gen_stamp < op.block.gen_stamp {
        return Err(DatanodeError::StaleGenStamp {
            block: id,
            requested: op.block.gen_stamp,
            have: e.gen_stamp,
        });
    }
    let mut on_disk = e.live.bytes_on_disk();
    if on_disk < op.block.num_bytes && e.live.writer().is_some() {
        // A buffered writer (write-memory batching) may hold acknowledged bytes in memory.
        // Its pipeline was given up — that is why a client copies the replica — so stop it:
        // it flushes what it received before it lets go.
        e.live.stop_writer(e.id, ctx.socket_timeout()).await?;
        on_disk = e.live.bytes_on_disk();
    }
    if on_disk < op.block.num_bytes {
        return Err(DatanodeError::InvalidReplica {
            block: id,
            reason: format!(
                "holds {on_disk} bytes, fewer than the {} to copy",
                op.block.num_bytes
            ),
        });
    }
    let block = ExtendedBlock::new(id, e.gen_stamp, op.block.num_bytes);
    let wop = WriteBlockOp {
        block,
        stage: op.stage,
        targets: op.targets.clone(),
        client_name: ctx.node_id.0.clone(),
        bytes_per_checksum: e.bytes_per_checksum,
        latest_gen_stamp: e.gen_stamp,
    };
    let ds = pipeline::connect(ctx, &wop, token)
        .await
        .map_err(|f| DatanodeError::Downstream {
            addr: f.first_bad_link.clone(),
            reason: f.message,
        })?;
    let addr = ds.addr.clone();
    // Packets start on chunk boundaries: a multiple of bytes per checksum, about 64 KiB.
    let bpc = wop.bytes_per_checksum as u64;
    let packet = (PACKET_DATA / bpc * bpc).max(bpc);
    let packets = op.block.num_bytes.div_ceil(packet) as i64;
    let (send, acks) = tokio::join!(
        send_packets(ctx, replica, packet, op.block.num_bytes, on_disk, ds.writer),
        read_acks(ctx, ds.reader, packets, &addr)
    );
    send?;
    acks?;
    tracing::info!(block = %id, to = %addr, stage = ?op.stage, "transfer complete");
    Ok(block)
}

async fn send_packets(
    ctx: &Ctx,
    replica: Arc<crate::storage::dataset::ReadReplica>,
    packet: u64,
    len: u64,
    on_disk: u64,
    mut w: FrameWriter,
) -> Result<FrameWriter> {
    let t = ctx.socket_timeout();
    let mut seqno = 0i64;
    let mut offset = 0u64;
    while offset < len {
        let n = packet.min(len - offset) as usize;
        let r = replica.clone();
        let piece = ctx
            .blocking(move || read_piece(&r, offset, n, on_disk))
            .await?;
        let h = PacketHeader {
            seqno,
            offset_in_block: offset,
            data_len: n as u32,
            last: false,
            sync: false,
        };
        wire::send(&mut w, Message::Packet(h), piece.payload(), t).await?;
        ctx.metrics.bytes_read.add(n as u64);
        offset += n as u64;
        seqno += 1;
    }
    let last = PacketHeader {
        seqno,
        offset_in_block: len,
        data_len: 0,
        last: true,
        sync: false,
    };
    wire::send(&mut w, Message::Packet(last), Bytes::new(), t).await?;
    Ok(w)
}

async fn read_acks(ctx: &Ctx, mut r: FrameReader, data_packets: i64, addr: &str) -> Result<()> {
    let t = ctx.socket_timeout();
    for want in 0..=data_packets {
        let bad = |reason: String| DatanodeError::Downstream {
            addr: addr.to_string(),
            reason,
        };
        let f = wire::recv(&mut r, t, "a transfer ack")
            .await?
            .ok_or_else(|| bad(format!("closed before acking packet {want}")))?;
        match f.header {
            Message::Ack(a) if a.seqno == want && a.first_failure().is_none() => {}
            Message::Ack(a) => return Err(bad(format!("ack {} {:?}", a.seqno, a.replies))),
            other => return Err(bad(format!("answered {other:?}"))),
        }
    }
    Ok(())
}

/// The stage a `Transfer` command of the metadata service uses.
pub(crate) const COMMAND_STAGE: BlockStage = BlockStage::TransferFinalized;
