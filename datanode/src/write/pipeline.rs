//! Setting up the downstream half of a write pipeline: connect to `targets[0]`, send it the
//! `WriteBlock` op with `targets[1..]`, and wait (socket timeout) for its `OpResponse`. Used by
//! the receiver of a `WriteBlock` and by the source of a `TransferBlock`.

use crate::context::NodeContext;
use crate::wire::{self, FrameReader, FrameWriter};
use bytes::Bytes;
use sluice_common::proto::{Message, Op, OpResponse, WriteBlockOp, PROTOCOL_VERSION};
use sluice_common::token::BlockToken;
use sluice_common::Status;
use std::net::{IpAddr, SocketAddr};
use tokio::net::{TcpSocket, TcpStream};

/// An established downstream connection.
#[derive(Debug)]
pub struct Downstream {
    /// Its data address.
    pub addr: String,
    /// Acks come from here.
    pub reader: FrameReader,
    /// Packets go here.
    pub writer: FrameWriter,
}

/// Why the downstream could not be set up: what to answer upstream.
#[derive(Debug)]
pub struct SetupFailure {
    /// Status for the upstream `OpResponse`.
    pub status: Status,
    /// Explanation.
    pub message: String,
    /// The first DataNode that failed.
    pub first_bad_link: String,
}

impl SetupFailure {
    /// The `OpResponse` to send upstream.
    pub fn response(&self) -> OpResponse {
        OpResponse {
            status: self.status,
            message: self.message.clone(),
            first_bad_link: Some(self.first_bad_link.clone()),
            replica: None,
        }
    }
}

/// Connects downstream for `op` (whose `targets` is not empty) and sets up the rest of the
/// pipeline. Any failure names the first bad DataNode.
pub async fn connect(
    ctx: &NodeContext,
    op: &WriteBlockOp,
    token: Option<&BlockToken>,
) -> Result<Downstream, SetupFailure> {
    let Some(first) = op.targets.first() else {
        return Err(SetupFailure {
            status: Status::ErrorInvalid,
            message: "no downstream target".into(),
            first_bad_link: String::new(),
        });
    };
    let addr = first.data_addr.clone();
    let fail = |message: String| SetupFailure {
        status: Status::Error,
        message,
        first_bad_link: addr.clone(),
    };
    // Each DataNode waits for its downstream's set-up longer than the one below it waits for
    // its own (HDFS: socketTimeout + READ_TIMEOUT_EXTENSION * targets), so a dead DataNode is
    // named (first_bad_link) by the one right above it, not blamed on a healthy one upstream.
    let t = sluice_common::proto::ack_timeout(ctx.socket_timeout(), op.targets.len());
    let stream = match tokio::time::timeout(t, dial(&ctx.cfg.bind_host, &addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(fail(format!("cannot connect to downstream {addr}: {e}"))),
        Err(_) => return Err(fail(format!("connecting to downstream {addr} timed out"))),
    };
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = wire::split(stream, ctx.codec());
    let next = WriteBlockOp {
        targets: op.targets[1..].to_vec(),
        ..op.clone()
    };
    let msg = Message::Op {
        version: PROTOCOL_VERSION,
        op: Op::WriteBlock(next),
        token: token.cloned(),
    };
    if let Err(e) = wire::send(&mut writer, msg, Bytes::new(), t).await {
        return Err(fail(format!("sending the op to downstream {addr}: {e}")));
    }
    match wire::recv(&mut reader, t, "the downstream's OpResponse").await {
        Ok(Some(f)) => match f.header {
            Message::OpResponse(r) if r.status.is_success() => Ok(Downstream {
                addr,
                reader,
                writer,
            }),
            Message::OpResponse(r) => Err(SetupFailure {
                status: Status::Error,
                message: format!("downstream {addr} refused: {} {}", r.status, r.message),
                first_bad_link: r.first_bad_link.unwrap_or(addr),
            }),
            other => Err(fail(format!("downstream {addr} answered {other:?}"))),
        },
        Ok(None) => Err(fail(format!("downstream {addr} closed the connection"))),
        Err(e) => Err(fail(format!("downstream {addr}: {e}"))),
    }
}

/// Connects to a peer DataNode. When `bind.host` is a specific address the connection leaves
/// from it (port 0), so that a peer — or a test harness's per-link proxy — sees which DataNode
/// is calling; a loopback `bind.host` is used only toward loopback peers.
pub async fn dial(bind_host: &str, addr: &str) -> std::io::Result<TcpStream> {
    let local = match bind_host.parse::<IpAddr>() {
        Ok(ip) if !ip.is_unspecified() => ip,
        _ => return TcpStream::connect(addr).await,
    };
    let mut last = None;
    for target in tokio::net::lookup_host(addr).await? {
        let fits =
            target.is_ipv4() == local.is_ipv4() && target.ip().is_loopback() == local.is_loopback();
        let socket = match (fits, target) {
            (false, _) => None,
            (true, SocketAddr::V4(_)) => Some(TcpSocket::new_v4()?),
            (true, SocketAddr::V6(_)) => Some(TcpSocket::new_v6()?),
        };
        let r = match socket {
            Some(socket) => match socket.bind(SocketAddr::new(local, 0)) {
                Ok(()) => socket.connect(target).await,
                Err(e) => Err(e),
            },
            None => TcpStream::connect(target).await,
        };
        match r {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            format!("{addr} resolves to no address"),
        )
    }))
}
