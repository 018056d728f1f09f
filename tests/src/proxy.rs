//! Per-link fault injection: a TCP proxy in front of each MiniCluster DataNode.
//!
//! With [`crate::MiniClusterBuilder::link_proxies`], DataNode `i` binds its own loopback address
//! (`127.0.0.<i+2>`), opens its outbound data connections from it, and advertises the port of a
//! proxy listening on the same address. Every data connection to a DataNode therefore passes a
//! proxy, which knows the caller from the connection's source address: a DataNode's address
//! means that DataNode, anything else is the client. A [`Link`] is "connections opened by
//! `from` to DataNode `to`"; [`LinkFaults`] holds one [`Fault`] per link, changed at any time
//! (existing connections follow at once).
//!
//! The proxy forwards whole data-transfer frames (it reads each frame's length), so that faults
//! can target packets: corrupt the next data packet on a link, or cut a connection as it is
//! about to carry a data packet or a block's last packet. A byte stream that is not made of
//! frames (a frame longer than 64 MiB) is forwarded as raw bytes.

use bytes::{Bytes, BytesMut};
use sluice_common::frame::{decode_header, PREFIX_LEN};
use sluice_common::proto::{Message, PacketHeader};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// Frames longer than this are not parsed: the stream is forwarded as raw bytes.
const MAX_PARSED_FRAME: usize = 64 * 1024 * 1024;

/// Who opened a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// The client (any source address that is not a DataNode's).
    Client,
    /// DataNode `i` of the cluster.
    Datanode(usize),
}

/// The connections opened by `from` to DataNode `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Link {
    /// The caller.
    pub from: Peer,
    /// The DataNode called.
    pub to: usize,
}

impl Link {
    /// The client's connections to DataNode `to`.
    pub fn client_to(to: usize) -> Link {
        Link {
            from: Peer::Client,
            to,
        }
    }

    /// DataNode `from`'s connections to DataNode `to` (pipeline downstream, transfers).
    pub fn between(from: usize, to: usize) -> Link {
        Link {
            from: Peer::Datanode(from),
            to,
        }
    }
}

/// What a link does to its traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Close every connection of the link now, and every new one as it arrives.
    Cut,
    /// Forward nothing, in either direction; the connections stay open (a hung node, or a
    /// partition that sends no resets). Clearing the fault lets the held bytes through.
    Stall,
    /// Hold every frame this long before forwarding it (both directions).
    Delay(Duration),
    /// Flip a data byte of the next data packet the caller sends on the link; the fault then
    /// clears itself.
    CorruptNextPacket,
    /// Close a connection when the caller is about to send a data packet on it: set-ups,
    /// heartbeats and answers pass, every pipeline on the link dies at its first packet.
    CutAtDataPacket,
    /// Close a connection instead of forwarding a block's last packet (a failure while the
    /// block is being closed).
    CutAtLastPacket,
}

/// The faults of every link of one cluster (cheap to clone: a shared handle).
#[derive(Clone, Debug)]
pub struct LinkFaults {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    rules: Mutex<HashMap<Link, Fault>>,
    fired: Mutex<HashMap<Link, u64>>,
    /// Address of each DataNode (index = DataNode).
    addrs: Mutex<Vec<IpAddr>>,
    changed: watch::Sender<u64>,
}

impl Default for LinkFaults {
    fn default() -> Self {
        LinkFaults {
            inner: Arc::new(Inner {
                rules: Mutex::new(HashMap::new()),
                fired: Mutex::new(HashMap::new()),
                addrs: Mutex::new(Vec::new()),
                changed: watch::channel(0).0,
            }),
        }
    }
}

impl LinkFaults {
    /// Sets the fault of `link` (replacing any other).
    pub fn set(&self, link: Link, fault: Fault) {
        self.lock_rules().insert(link, fault);
        self.bump();
    }

    /// Clears the fault of `link`.
    pub fn clear(&self, link: Link) {
        self.lock_rules().remove(&link);
        self.bump();
    }

    /// Clears every fault.
    pub fn clear_all(&self) {
        self.lock_rules().clear();
        self.bump();
    }

    /// The fault of `link`, if any.
    pub fn get(&self, link: Link) -> Option<Fault> {
        self.lock_rules().get(&link).cloned()
    }

    /// How many times a fault acted on `link` (a connection cut, a packet corrupted; a stall
    /// or delay counts once per frame held).
    pub fn fired(&self, link: Link) -> u64 {
        let fired = self.inner.fired.lock().unwrap_or_else(|p| p.into_inner());
        fired.get(&link).copied().unwrap_or(0)
    }

    /// The link a connection from `source` to DataNode `to` belongs to.
    pub fn link_from(&self, source: IpAddr, to: usize) -> Link {
        let addrs = self.inner.addrs.lock().unwrap_or_else(|p| p.into_inner());
        let from = match addrs.iter().position(|a| *a == source) {
            Some(i) => Peer::Datanode(i),
            None => Peer::Client,
        };
        Link { from, to }
    }

    /// Records DataNode `i`'s address.
    pub(crate) fn register(&self, i: usize, ip: IpAddr) {
        let mut addrs = self.inner.addrs.lock().unwrap_or_else(|p| p.into_inner());
        if addrs.len() <= i {
            addrs.resize(i + 1, IpAddr::from([0, 0, 0, 0]));
        }
        addrs[i] = ip;
    }

    fn lock_rules(&self) -> std::sync::MutexGuard<'_, HashMap<Link, Fault>> {
        self.inner.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.inner.changed.send_modify(|v| *v += 1);
    }

    fn fire(&self, link: Link) {
        let mut fired = self.inner.fired.lock().unwrap_or_else(|p| p.into_inner());
        *fired.entry(link).or_default() += 1;
    }

    /// Removes a one-shot fault if it is still the link's; true if this call took it.
    fn take(&self, link: Link, fault: &Fault) -> bool {
        let mut rules = self.lock_rules();
        if rules.get(&link) == Some(fault) {
            rules.remove(&link);
            drop(rules);
            self.bump();
            true
        } else {
            false
        }
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }
}

/// The address DataNode `i` binds when the cluster runs with link proxies.
pub fn datanode_ip(i: usize) -> anyhow::Result<IpAddr> {
    let last = u8::try_from(i + 2)
        .ok()
        .filter(|b| *b < 255)
        .ok_or_else(|| anyhow::anyhow!("at most 253 DataNodes behind link proxies"))?;
    Ok(IpAddr::from([127, 0, 0, last]))
}

/// The proxy in front of one DataNode: accepts on the DataNode's advertised address and
/// forwards to its bound data port. Dropping it closes the listener and every connection.
#[derive(Debug)]
pub struct DnProxy {
    addr: SocketAddr,
    target: Arc<Mutex<Option<SocketAddr>>>,
    _task: AbortOnDropHandle<()>,
}

impl DnProxy {
    /// Listens on `ip:0` in front of DataNode `index`.
    pub async fn start(ip: IpAddr, index: usize, faults: LinkFaults) -> anyhow::Result<DnProxy> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await?;
        let addr = listener.local_addr()?;
        faults.register(index, ip);
        let target = Arc::new(Mutex::new(None));
        let task = tokio::spawn(accept_loop(listener, index, faults, Arc::clone(&target)));
        Ok(DnProxy {
            addr,
            target,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// Where callers connect (the DataNode's advertised data address).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the DataNode's bound data address (after each start).
    pub fn set_target(&self, target: SocketAddr) {
        *self.target.lock().unwrap_or_else(|p| p.into_inner()) = Some(target);
    }
}

async fn accept_loop(
    listener: TcpListener,
    index: usize,
    faults: LinkFaults,
    target: Arc<Mutex<Option<SocketAddr>>>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else { continue };
                let link = faults.link_from(peer.ip(), index);
                let to = *target.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(to) = to {
                    conns.spawn(serve(stream, to, link, faults.clone()));
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Forwards one connection until both directions end or the link cuts it.
async fn serve(caller: TcpStream, target: SocketAddr, link: Link, faults: LinkFaults) {
    if faults.get(link) == Some(Fault::Cut) {
        faults.fire(link);
        return;
    }
    let Ok(server) = TcpStream::connect(target).await else {
        return; // the DataNode is down: the caller sees the connection close
    };
    let _ = caller.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let cut = CancellationToken::new();
    let (cr, cw) = caller.into_split();
    let (sr, sw) = server.into_split();
    let forward = Pump {
        link,
        forward: true,
        faults: faults.clone(),
        cut: cut.clone(),
    };
    let back = Pump {
        link,
        forward: false,
        faults,
        cut,
    };
    tokio::join!(forward.run(cr, sw), back.run(sr, cw));
}

/// One direction of a proxied connection.
struct Pump {
    link: Link,
    /// Caller to DataNode (packets flow this way).
    forward: bool,
    faults: LinkFaults,
    cut: CancellationToken,
}

/// What to do with one frame.
enum Verdict {
    Forward(Bytes),
    Cut,
}

impl Pump {
    async fn run(self, mut src: OwnedReadHalf, mut dst: OwnedWriteHalf) {
        let mut buf = BytesMut::with_capacity(128 * 1024);
        let mut splitter = Splitter::default();
        let mut changed = self.faults.subscribe();
        loop {
            tokio::select! {
                _ = self.cut.cancelled() => return,
                r = changed.changed() => {
                    if r.is_err() || self.faults.get(self.link) == Some(Fault::Cut) {
                        self.cut_now();
                        return;
                    }
                    continue;
                }
                r = src.read_buf(&mut buf) => match r {
                    Ok(0) | Err(_) => {
                        let _ = dst.shutdown().await;
                        return;
                    }
                    Ok(_) => {}
                },
            }
            while let Some(unit) = splitter.next(&mut buf) {
                let bytes = match self.judge(unit).await {
                    Verdict::Forward(b) => b,
                    Verdict::Cut => {
                        self.cut_now();
                        return;
                    }
                };
                // A peer that closed ends this direction only, as in TCP: what the other
                // direction still carries (the last acks before a DataNode closed) gets through.
                tokio::select! {
                    _ = self.cut.cancelled() => return,
                    r = dst.write_all(&bytes) => if r.is_err() { return },
                }
            }
        }
    }

    fn cut_now(&self) {
        self.faults.fire(self.link);
        self.cut.cancel();
    }

    /// Applies the link's fault to one frame, waiting while the link is stalled.
    async fn judge(&self, mut unit: Bytes) -> Verdict {
        let mut changed = self.faults.subscribe();
        loop {
            let packet = if self.forward {
                packet_header(&unit)
            } else {
                None
            };
            let data = packet.is_some_and(|h| h.data_len > 0 && !h.last);
            match self.faults.get(self.link) {
                Some(Fault::Cut) => return Verdict::Cut,
                Some(Fault::Stall) => {
                    self.faults.fire(self.link);
                    tokio::select! {
                        _ = self.cut.cancelled() => return Verdict::Cut,
                        r = changed.changed() => if r.is_err() { return Verdict::Cut },
                    }
                }
                Some(Fault::Delay(d)) => {
                    self.faults.fire(self.link);
                    tokio::time::sleep(d).await;
                    return Verdict::Forward(unit);
                }
                Some(f @ Fault::CorruptNextPacket) if data => {
                    if self.faults.take(self.link, &f) {
                        self.faults.fire(self.link);
                        unit = flip_last_byte(unit);
                    }
                    return Verdict::Forward(unit);
                }
                Some(Fault::CutAtDataPacket) if data => return Verdict::Cut,
                Some(Fault::CutAtLastPacket) if packet.is_some_and(|h| h.last) => {
                    return Verdict::Cut
                }
                _ => return Verdict::Forward(unit),
            }
        }
    }
}

/// Cuts a byte stream into whole frames (`frame_len` prefix included).
#[derive(Default)]
struct Splitter {
    raw: bool,
}

impl Splitter {
    fn next(&mut self, buf: &mut BytesMut) -> Option<Bytes> {
        if buf.is_empty() {
            return None;
        }
        if self.raw {
            return Some(buf.split().freeze());
        }
        if buf.len() < 4 {
            return None;
        }
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len > MAX_PARSED_FRAME {
            self.raw = true;
            return Some(buf.split().freeze());
        }
        if buf.len() < 4 + len {
            buf.reserve(4 + len - buf.len());
            return None;
        }
        Some(buf.split_to(4 + len).freeze())
    }
}

/// The packet header of a frame, if the frame is a packet.
fn packet_header(frame: &[u8]) -> Option<PacketHeader> {
    let header_len = u32::from_be_bytes(frame.get(4..PREFIX_LEN)?.try_into().ok()?) as usize;
    let header = frame.get(PREFIX_LEN..PREFIX_LEN.checked_add(header_len)?)?;
    match decode_header::<Message>(header).ok()? {
        Message::Packet(h) => Some(h),
        _ => None,
    }
}

/// Flips the frame's last byte: for a data packet, the last data byte.
fn flip_last_byte(frame: Bytes) -> Bytes {
    let mut v = frame.to_vec();
    if let Some(b) = v.last_mut() {
        *b ^= 0x5a;
    }
    Bytes::from(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_common::frame::{Frame, FrameCodec};
    use tokio_util::codec::Encoder;

    fn frame(m: Message, payload: &[u8]) -> Bytes {
        let mut buf = BytesMut::new();
        FrameCodec::<Message>::default()
            .encode(
                Frame::with_payload(m, Bytes::copy_from_slice(payload)),
                &mut buf,
            )
            .unwrap();
        buf.freeze()
    }

    #[test]
    fn splits_frames_and_finds_packets() {
        let h = PacketHeader {
            seqno: 3,
            offset_in_block: 512,
            data_len: 4,
            last: false,
            sync: false,
        };
        let a = frame(Message::Packet(h), &[0, 0, 0, 0, 1, 2, 3, 4]);
        let b = frame(
            Message::Ack(sluice_common::proto::PipelineAck {
                seqno: 1,
                replies: vec![],
            }),
            &[],
        );
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&a);
        buf.extend_from_slice(&b[..3]);
        let mut s = Splitter::default();
        let first = s.next(&mut buf).unwrap();
        assert_eq!(first, a);
        assert_eq!(packet_header(&first), Some(h));
        assert!(s.next(&mut buf).is_none(), "partial frame waits");
        buf.extend_from_slice(&b[3..]);
        let second = s.next(&mut buf).unwrap();
        assert_eq!(packet_header(&second), None);
        let flipped = flip_last_byte(first.clone());
        assert_eq!(flipped.len(), first.len());
        assert_ne!(flipped.last(), first.last());
    }
}
