//! Cutting a byte stream into write packets (HDFS `DFSOutputStream`'s packet building).
//!
//! Data is grouped in checksum chunks of `bytes_per_checksum` bytes (a CRC32C each) and
//! packets of at most `packet_size` data bytes. A packet never crosses a block boundary and
//! always starts on a chunk boundary of its block. After a flush that ended inside a chunk the
//! next packet starts again at that chunk's start and carries its bytes again, so that every
//! checksum covers one aligned chunk (see `docs/protocol.md`).
//!
//! The [`Packetizer`] is plain logic: it takes bytes and hands out [`OutPacket`]s; the writer
//! moves them to the streamer task.

use bytes::{Bytes, BytesMut};
use sluice_common::checksum;
use sluice_common::frame::Frame;
use sluice_common::proto::{Message, PacketHeader, HEARTBEAT_SEQNO};

/// A packet ready to be sent (and re-sent by pipeline recovery): its header and its payload
/// (checksums, then data). The streamer assigns `header.seqno` when it sends it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OutPacket {
    /// The header; `seqno` is set by the streamer.
    pub header: PacketHeader,
    /// Checksums then data.
    pub payload: Bytes,
}

impl OutPacket {
    /// A data packet at `offset_in_block`.
    pub(crate) fn data(offset_in_block: u64, data: &[u8], bpc: u32, sync: bool) -> OutPacket {
        let mut payload = Vec::with_capacity(checksum::checksum_len(data.len(), bpc) + data.len());
        checksum::compute_into(data, bpc, &mut payload);
        payload.extend_from_slice(data);
        OutPacket {
            header: PacketHeader {
                seqno: 0,
                offset_in_block,
                data_len: data.len() as u32,
                last: false,
                sync,
            },
            payload: Bytes::from(payload),
        }
    }

    /// A data packet whose payload (checksums, then `data_len` data bytes) is already built.
    fn built(offset_in_block: u64, data_len: usize, payload: Bytes) -> OutPacket {
        OutPacket {
            header: PacketHeader {
                seqno: 0,
                offset_in_block,
                data_len: data_len as u32,
                last: false,
                sync: false,
            },
            payload,
        }
    }

    /// A packet without data: the block's last packet (`last`), or an empty sync packet.
    pub(crate) fn empty(offset_in_block: u64, last: bool, sync: bool) -> OutPacket {
        OutPacket {
            header: PacketHeader {
                seqno: 0,
                offset_in_block,
                data_len: 0,
                last,
                sync,
            },
            payload: Bytes::new(),
        }
    }

    /// A heartbeat packet (seqno -1, no data).
    pub(crate) fn heartbeat() -> OutPacket {
        let mut p = OutPacket::empty(0, false, false);
        p.header.seqno = HEARTBEAT_SEQNO;
        p
    }

    /// Block offset just past this packet's data.
    pub(crate) fn end_offset(&self) -> u64 {
        self.header.offset_in_block + u64::from(self.header.data_len)
    }

    /// The data bytes (after the checksums).
    #[cfg(test)]
    pub(crate) fn data_bytes(&self, bpc: u32) -> &[u8] {
        let sums = checksum::checksum_len(self.header.data_len as usize, bpc);
        &self.payload[sums..]
    }

    /// The frame to put on the wire.
    pub(crate) fn frame(&self) -> Frame<Message> {
        Frame::with_payload(Message::Packet(self.header), self.payload.clone())
    }
}

/// What [`Packetizer::take_full`] hands out.
#[derive(Debug)]
pub(crate) struct FullPacket {
    /// The packet.
    pub packet: OutPacket,
    /// The packet filled its block: the block must be ended (last packet) after it.
    pub ends_block: bool,
}

/// Builds packets from written bytes.
#[derive(Debug)]
pub(crate) struct Packetizer {
    bpc: u32,
    packet_size: usize,
    block_size: u64,
    /// The packet being built: `head` bytes kept for its checksums, then its data, whose
    /// first byte sits at `packet_start` in the block. A full packet's checksums are written
    /// into the slot and the buffer becomes the payload as it is, without copying the data.
    buf: BytesMut,
    /// Bytes before the data in `buf`: room for a whole packet's checksums.
    head: usize,
    /// Block offset of the packet being built (a chunk boundary).
    packet_start: u64,
    /// Bytes of `buf` already sent by a flush (the partial chunk carried over).
    flushed: usize,
}

impl Packetizer {
    /// A packetizer; `packet_size` is rounded down to whole chunks (at least one).
    pub(crate) fn new(bpc: u32, packet_size: usize, block_size: u64) -> Packetizer {
        let bpc_us = bpc.max(1) as usize;
        let packet_size = (packet_size / bpc_us).max(1) * bpc_us;
        let head = checksum::checksum_len(packet_size, bpc.max(1));
        Packetizer {
            bpc: bpc.max(1),
            packet_size,
            block_size: block_size.max(1),
            buf: Self::fresh(head, packet_size),
            head,
            packet_start: 0,
            flushed: 0,
        }
    }

    /// An empty packet buffer: the checksum slot, room for the data.
    fn fresh(head: usize, packet_size: usize) -> BytesMut {
        let mut b = BytesMut::with_capacity(head + packet_size);
        b.resize(head, 0);
        b
    }

    /// Data bytes of the packet being built.
    fn data_len(&self) -> usize {
        self.buf.len() - self.head
    }

    /// A packetizer continuing a block that holds `block_len` bytes (an append to a partial
    /// last block): `tail` is the block's last partial chunk (`block_len % bpc` bytes), carried
    /// as if an hflush had sent it, so that the first packet starts at that chunk and its
    /// checksum covers the whole chunk again.
    pub(crate) fn resume(
        bpc: u32,
        packet_size: usize,
        block_size: u64,
        block_len: u64,
        tail: &[u8],
    ) -> Packetizer {
        let mut p = Packetizer::new(bpc, packet_size, block_size);
        p.packet_start = block_len - tail.len() as u64;
        p.buf.extend_from_slice(tail);
        p.flushed = tail.len();
        p
    }

    /// Data bytes the current packet can still take.
    fn room(&self) -> usize {
        let block_left = self.block_size - self.packet_start;
        let cap = (self.packet_size as u64).min(block_left) as usize;
        cap - self.data_len()
    }

    /// Copies as much of `data` as fits in the current packet; returns the bytes taken. Call
    /// [`Packetizer::take_full`] after each write.
    pub(crate) fn write(&mut self, data: &[u8]) -> usize {
        let n = self.room().min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        n
    }

    /// The current packet, if it is full (packet size reached, or its block is full).
    pub(crate) fn take_full(&mut self) -> Option<FullPacket> {
        if self.room() > 0 {
            return None;
        }
        let len = self.data_len();
        // The checksums end where the data starts: right-aligned in the slot, which a packet
        // cut short by its block's end does not fill.
        let from = self.head - checksum::checksum_len(len, self.bpc);
        let (slot, data) = self.buf.split_at_mut(self.head);
        checksum::compute_to(data, self.bpc, &mut slot[from..]);
        let built = std::mem::replace(&mut self.buf, Self::fresh(self.head, self.packet_size));
        let packet = OutPacket::built(self.packet_start, len, built.freeze().slice(from..));
        let end = self.packet_start + len as u64;
        self.flushed = 0;
        let ends_block = end >= self.block_size;
        self.packet_start = if ends_block { 0 } else { end };
        Some(FullPacket { packet, ends_block })
    }

    /// For hflush/hsync/close: a packet with everything written and not yet sent (including a
    /// partial chunk), or `None` when nothing new was written since the last packet. The bytes
    /// of a trailing partial chunk stay, and the next packet starts again at that chunk.
    pub(crate) fn take_flush(&mut self, sync: bool) -> Option<OutPacket> {
        if self.data_len() == self.flushed {
            return None;
        }
        let packet = OutPacket::data(self.packet_start, &self.buf[self.head..], self.bpc, sync);
        // The partial chunk at the end stays, moved to the front of the data.
        let whole = self.data_len() / self.bpc as usize * self.bpc as usize;
        let tail_at = self.head + whole;
        self.buf.copy_within(tail_at.., self.head);
        self.buf.truncate(self.buf.len() - whole);
        self.packet_start += whole as u64;
        self.flushed = self.data_len();
        Some(packet)
    }

    /// Bytes of the current block written so far (sent or not).
    #[cfg(test)]
    pub(crate) fn block_bytes(&self) -> u64 {
        self.packet_start + self.data_len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// Writes everything, collecting full packets.
    fn feed(p: &mut Packetizer, data: &[u8]) -> Vec<FullPacket> {
        let mut out = Vec::new();
        let mut off = 0;
        while off < data.len() {
            off += p.write(&data[off..]);
            if let Some(f) = p.take_full() {
                out.push(f);
            }
        }
        out
    }

    #[test]
    fn a_resumed_block_resends_its_partial_chunk_first() {
        // A block of 1300 bytes (bpc 512): its tail is 276 bytes from offset 1024.
        let old = bytes(1300);
        let mut p = Packetizer::resume(512, 2048, 512 * 32, 1300, &old[1024..]);
        assert_eq!(p.block_bytes(), 1300);
        assert!(p.take_flush(false).is_none(), "nothing new to send yet");
        let new = bytes(5000);
        let full = feed(&mut p, &new);
        let first = &full[0].packet;
        assert_eq!(first.header.offset_in_block, 1024);
        let mut want = old[1024..].to_vec();
        want.extend_from_slice(&new[..2048 - 276]);
        assert_eq!(first.data_bytes(512), &want[..]);
        let mut sums = Vec::new();
        checksum::compute_into(&want, 512, &mut sums);
        assert_eq!(
            &first.payload[..sums.len()],
            &sums[..],
            "whole-chunk checksums"
        );
        assert_eq!(p.block_bytes(), 1300 + 5000);
    }

    #[test]
    fn packets_are_chunk_aligned_and_never_cross_blocks() {
        // 16 chunks of 512 per block, 4 chunks per packet, block not a packet multiple.
        let mut p = Packetizer::new(512, 2048, 512 * 10);
        let data = bytes(512 * 25 + 100);
        let full = feed(&mut p, &data);
        let mut rebuilt = Vec::new();
        let mut block_len = 0u64;
        for f in &full {
            let h = f.packet.header;
            assert_eq!(h.offset_in_block % 512, 0);
            assert_eq!(h.offset_in_block, block_len);
            assert!(h.data_len as usize <= 2048);
            block_len += u64::from(h.data_len);
            assert!(block_len <= 5120);
            checksum::verify(
                f.packet.data_bytes(512),
                &f.packet.payload[..h.data_len as usize / 512 * 4],
                512,
                0,
            )
            .unwrap();
            rebuilt.extend_from_slice(f.packet.data_bytes(512));
            if f.ends_block {
                assert_eq!(block_len, 5120);
                block_len = 0;
            }
        }
        // 2 full blocks: packets 2048, 2048, 1024 (ends block) each.
        let sizes: Vec<u32> = full.iter().map(|f| f.packet.header.data_len).collect();
        assert_eq!(sizes[..3], [2048, 2048, 1024]);
        assert_eq!(full.iter().filter(|f| f.ends_block).count(), 2);
        let tail = p.take_flush(false).unwrap();
        assert_eq!(
            (tail.header.offset_in_block, tail.header.data_len),
            (2048, 612)
        );
        rebuilt.extend_from_slice(tail.data_bytes(512));
        assert_eq!(rebuilt, data);
    }

    #[test]
    fn flush_resends_the_partial_chunk_from_its_start() {
        let mut p = Packetizer::new(512, 4096, 1 << 20);
        let data = bytes(700 + 1300);
        assert!(feed(&mut p, &data[..700]).is_empty());
        let first = p.take_flush(true).unwrap();
        assert_eq!(first.header.offset_in_block, 0);
        assert_eq!(first.header.data_len, 700);
        assert!(first.header.sync);
        assert_eq!(first.payload.len(), 8 + 700);
        // Nothing new: no packet.
        assert!(p.take_flush(false).is_none());
        assert!(feed(&mut p, &data[700..]).is_empty());
        let second = p.take_flush(false).unwrap();
        // Starts again at the partial chunk (512) and carries bytes 512..2000.
        assert_eq!(second.header.offset_in_block, 512);
        assert_eq!(second.header.data_len, 2000 - 512);
        assert_eq!(second.data_bytes(512), &data[512..]);
        assert!(!second.header.sync);
        assert_eq!(p.block_bytes(), 2000);
    }

    #[test]
    fn flush_on_a_chunk_boundary_carries_nothing_over() {
        let mut p = Packetizer::new(512, 4096, 1 << 20);
        feed(&mut p, &bytes(1024));
        let f = p.take_flush(false).unwrap();
        assert_eq!(f.end_offset(), 1024);
        assert!(p.take_flush(false).is_none());
        feed(&mut p, &bytes(10));
        let g = p.take_flush(false).unwrap();
        assert_eq!((g.header.offset_in_block, g.header.data_len), (1024, 10));
    }

    #[test]
    fn a_packet_after_a_partial_flush_still_fills_to_packet_size() {
        let mut p = Packetizer::new(512, 1024, 4096);
        feed(&mut p, &bytes(600));
        p.take_flush(false).unwrap();
        // The carried-over 88 bytes plus 1000 new: the packet [512, 1536) is full at 1024.
        let full = feed(&mut p, &bytes(1000));
        assert_eq!(full.len(), 1);
        assert_eq!(full[0].packet.header.offset_in_block, 512);
        assert_eq!(full[0].packet.header.data_len, 1024);
        assert_eq!(p.block_bytes(), 1600);
    }

    #[test]
    fn block_size_not_a_multiple_of_the_chunk_ends_with_a_short_chunk() {
        let mut p = Packetizer::new(512, 1024, 1000);
        let full = feed(&mut p, &bytes(2000));
        let v: Vec<(u64, u32, bool)> = full
            .iter()
            .map(|f| {
                (
                    f.packet.header.offset_in_block,
                    f.packet.header.data_len,
                    f.ends_block,
                )
            })
            .collect();
        assert_eq!(v, vec![(0, 1000, true), (0, 1000, true)]);
    }
}
