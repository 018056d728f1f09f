//! Positioned reads (`FileReader::read_at`, HDFS `pread`): requests of their own for exactly
//! the range asked, on a new connection per block, never touching the reader's stream or its
//! buffer (Ozone HDDS-14035: a positioned read must not pre-read). Stream mode sends one
//! `ReadBlock` for the range; chunk mode one `ReadChunk` per `read.chunk.size`. Each replica is
//! tried in turn; a checksum error is reported to the metadata service.

use super::chunk::ChunkReader;
use super::cursor;
use super::{busy_pause, is_busy, wants_refresh, ReadCtx, MAX_REFRESHES};
use crate::connection::{chunk_data, message_name, status_error, DnConnection};
use crate::error::ClientError;
use sluice_common::config::ReadMode;
use sluice_common::proto::{Message, Op, ReadBlockOp};
use sluice_common::rpc::LocatedBlock;
use sluice_common::DatanodeId;
use tracing::warn;

/// Reads `out.len()` bytes at block offset `bpos` of `lb`, trying each replica in turn; when
/// every replica is busy, new rounds after a pause.
pub(crate) async fn read_range(
    ctx: &ReadCtx,
    lb: &LocatedBlock,
    bpos: u64,
    out: &mut [u8],
) -> Result<(), ClientError> {
    let mut round = 0;
    loop {
        match read_range_once(ctx, lb, bpos, out).await {
            Err(e) if is_busy(&e) && round < MAX_REFRESHES => {
                tokio::time::sleep(busy_pause(round)).await;
                round += 1;
            }
            r => return r,
        }
    }
}

/// One round of [`read_range`] over the replicas.
async fn read_range_once(
    ctx: &ReadCtx,
    lb: &LocatedBlock,
    bpos: u64,
    out: &mut [u8],
) -> Result<(), ClientError> {
    let mut last: Option<ClientError> = None;
    let mut lb = std::borrow::Cow::Borrowed(lb);
    let mut refreshes = 0;
    for dn in &lb.locations.clone() {
        let mut r = Err(ClientError::NoReplica {
            block: lb.block.id,
            offset: bpos,
        });
        for _ in 0..=MAX_REFRESHES {
            r = match ctx.mode {
                ReadMode::Stream => stream_range(ctx, dn, &lb, bpos, out).await,
                ReadMode::Chunk => chunk_range(ctx, dn, &lb, bpos, out).await,
            };
            if let Err(ClientError::GenStampMismatch { .. }) = &r {
                ctx.counters.stamp_mismatch();
            }
            match &r {
                Err(e) if wants_refresh(e) && refreshes < MAX_REFRESHES => {
                    refreshes += 1;
                    match ctx.refresh(&lb, refreshes - 1).await {
                        Ok(fresh) => lb = std::borrow::Cow::Owned(fresh),
                        Err(_) => break,
                    }
                }
                _ => break,
            }
        }
        match r {
            Ok(()) => return Ok(()),
            Err(e) => {
                warn!(block = %lb.block.id, node = %dn, error = %e, "positioned read failed");
                if matches!(e, ClientError::Checksum { .. }) {
                    cursor::report_bad(ctx, &lb, dn, &e).await;
                }
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or(ClientError::NoReplica {
        block: lb.block.id,
        offset: bpos,
    }))
}

/// One replica's attempt in stream mode: one `ReadBlock` for exactly the range.
async fn stream_range(
    ctx: &ReadCtx,
    dn: &DatanodeId,
    lb: &LocatedBlock,
    bpos: u64,
    out: &mut [u8],
) -> Result<(), ClientError> {
    let mut conn = DnConnection::connect(dn, ctx.params.settings).await?;
    let op = ReadBlockOp {
        block: lb.block,
        offset: bpos,
        length: out.len() as u64,
        piece_size: ctx.params.piece_size,
    };
    ctx.counters.positioned_request();
    conn.send_op(Op::ReadBlock(op), lb.token.as_ref()).await?;
    conn.recv_read_response(lb.block).await?;
    let mut filled = bpos; // block offset up to which `out` is filled
    loop {
        let frame = conn.recv("a read chunk").await?;
        match frame.header {
            Message::Chunk(h) => {
                let verify = ctx.params.verify;
                let data = chunk_data(&h, frame.payload, lb.block, conn.node(), verify)?;
                ctx.counters.received(data.len());
                if h.offset > filled {
                    let reason = format!("chunk at {} leaves a hole after {filled}", h.offset);
                    return Err(ClientError::protocol(conn.node(), reason));
                }
                filled = copy_overlap(h.offset, &data, filled, bpos, out);
            }
            Message::ReadEnd(e) if e.status.is_success() => break,
            Message::ReadEnd(e) => {
                return Err(status_error(conn.node(), lb.block.id, e.status, &e.message))
            }
            other => {
                let reason = format!("expected a Chunk or ReadEnd, got {}", message_name(&other));
                return Err(ClientError::protocol(conn.node(), reason));
            }
        }
    }
    check_filled(lb, conn.node(), filled, bpos + out.len() as u64)
}

/// One replica's attempt in chunk mode: `ReadChunk` requests of at most `read.chunk.size`,
/// one after the other on one connection.
async fn chunk_range(
    ctx: &ReadCtx,
    dn: &DatanodeId,
    lb: &LocatedBlock,
    bpos: u64,
    out: &mut [u8],
) -> Result<(), ClientError> {
    let token = lb.token.clone();
    let mut reader = ChunkReader::connect(dn, lb.block, token, ctx.params.settings).await?;
    let end = bpos + out.len() as u64;
    let mut filled = bpos;
    while filled < end {
        let length = ctx.chunk_size.min(end - filled);
        ctx.counters.positioned_request();
        let chunk = reader.read(filled, length, ctx.params.verify).await?;
        ctx.counters.received(chunk.data.len());
        let before = filled;
        filled = copy_overlap(chunk.start, &chunk.data, filled, bpos, out);
        if filled == before {
            break; // the replica holds nothing more
        }
    }
    check_filled(lb, &reader.node().to_string(), filled, end)
}

fn check_filled(lb: &LocatedBlock, node: &str, filled: u64, end: u64) -> Result<(), ClientError> {
    if filled < end {
        return Err(ClientError::ShortReplica {
            block: lb.block.id,
            node: node.to_string(),
            visible: filled,
            wanted: end,
        });
    }
    Ok(())
}

/// Copies the part of `data` (at block offset `at`) past `filled` into `out` (which holds block
/// offsets `[bpos, bpos + out.len())`); returns the new `filled`.
fn copy_overlap(at: u64, data: &[u8], filled: u64, bpos: u64, out: &mut [u8]) -> u64 {
    let end = bpos + out.len() as u64;
    let from = filled.max(at);
    let to = (at + data.len() as u64).min(end);
    if to <= from {
        return filled;
    }
    let src = &data[(from - at) as usize..(to - at) as usize];
    out[(from - bpos) as usize..(to - bpos) as usize].copy_from_slice(src);
    to
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_copies_only_the_new_bytes_inside_the_range() {
        let data: Vec<u8> = (0..100).collect();
        let mut out = [0u8; 30];
        // The range is [40, 70); a chunk [0, 100) aligned down fills all of it.
        assert_eq!(copy_overlap(0, &data, 40, 40, &mut out), 70);
        assert_eq!(out[..], data[40..70]);
        // A chunk before what is filled adds nothing.
        assert_eq!(copy_overlap(0, &data[..50], 70, 40, &mut out), 70);
    }
}
