//! What bounds a connection on the services' HTTP ports (metadata 9870, DataNode 9864):
//! [`HttpLimits`] from the `http.*` keys; [`serve_bounded`], which ends a request body that
//! stops coming; and [`count_peers`], which holds one peer address to its share of the
//! connections (`http.connections.per-peer.max`).
//!
//! actix-web bounds the request head (`client_request_timeout`: a slowloris header trickle is
//! answered 408 and closed), idle keep-alive connections and the connections open at once; it
//! does not bound the time between body bytes, so an unfinished chunked request would hold its
//! handler for ever. [`serve_bounded`] wraps every request's payload: no body byte for
//! `http.body.idle.timeout` ends the body with an error (the handler fails, the connection is
//! closed). Only the gap between bytes is bounded, never the whole body: WebHDFS CREATE and
//! APPEND stream files of any size.

use crate::peer_limit::{PeerCounts, PeerSlot};
use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::Extensions;
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::http::ConnectionType;
use actix_web::{HttpMessage, HttpResponse};
use bytes::Bytes;
use futures::future::Either;
use futures::Stream;
use std::any::Any;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// The limits of one HTTP server.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// The request head must arrive within this (actix `client_request_timeout`).
    pub request_timeout: Duration,
    /// An idle keep-alive connection is closed after this.
    pub keep_alive: Duration,
    /// Longest gap between two body bytes (and before the first).
    pub body_idle: Duration,
    /// Connections open at once (the server runs one worker).
    pub connections: usize,
    /// Connections one peer address (IP) may hold at once.
    pub per_peer: usize,
}

/// What the `on_connect` hook of [`count_peers`] decided for one connection, kept with it (its
/// place in the count is given back when the connection ends).
#[derive(Debug)]
pub struct PeerAdmission(Option<PeerSlot>);

/// An `HttpServer::on_connect` hook counting each connection against its peer address's share
/// of `counts`. A connection past the share is answered `503 Service Unavailable` on its first
/// request and closed by [`serve_bounded`] (one that sends no request is closed by
/// `http.request.timeout`), so one host cannot hold every `http.connections.max` slot.
pub fn count_peers(counts: PeerCounts) -> impl Fn(&dyn Any, &mut Extensions) + Send + Sync {
    move |conn, ext| {
        let Some(stream) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() else {
            return; // not plain TCP: nothing to count by
        };
        let Ok(peer) = stream.peer_addr() else {
            return; // already gone
        };
        let slot = counts.admit(peer.ip());
        if slot.is_none() {
            tracing::warn!(peer = %peer, "HTTP connection past its peer's share closed (http.connections.per-peer.max)");
        }
        ext.insert(PeerAdmission(slot));
    }
}

/// Calls `srv` with `req`'s body bounded by `idle` between bytes; a request whose body stalled
/// is answered and its connection closed (for `App::wrap_fn`).
pub fn serve_bounded<S, B>(
    mut req: ServiceRequest,
    srv: &S,
    idle: Duration,
) -> impl Future<Output = Result<ServiceResponse<BoxBody>, actix_web::Error>> + 'static
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    S::Future: 'static,
    B: MessageBody + 'static,
{
    if matches!(req.conn_data::<PeerAdmission>(), Some(PeerAdmission(None))) {
        let mut res = HttpResponse::ServiceUnavailable()
            .body("too many connections from this address (http.connections.per-peer.max)");
        res.head_mut().set_connection_type(ConnectionType::Close);
        return Either::Left(std::future::ready(Ok(req.into_response(res))));
    }
    let stalled = bound_body(&mut req, idle);
    let call = srv.call(req);
    Either::Right(async move {
        let res = call.await?.map_into_boxed_body();
        let held = stalled.borrow_mut().take();
        Ok(match held {
            None => res,
            // actix drains a chunked body its handler dropped — for ever if it never ends; one
            // still held when the answer is complete makes it close the connection instead.
            Some(held) => res.map_body(|head, body| {
                head.set_connection_type(ConnectionType::Close);
                BoxBody::new(HeldBody { body, _held: held })
            }),
        })
    })
}

/// An answer's body, holding the unfinished request body it answers until it is sent.
struct HeldBody {
    body: BoxBody,
    _held: Payload,
}

impl MessageBody for HeldBody {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_next(cx)
    }
}

/// A stalled body, set aside by [`IdleBody`].
type Stalled = Rc<RefCell<Option<Payload>>>;

/// Replaces `req`'s payload by one that fails after `idle` without a byte; once it did, the
/// returned slot holds the original payload.
fn bound_body(req: &mut ServiceRequest, idle: Duration) -> Stalled {
    let inner = req.take_payload();
    let stalled = Rc::new(RefCell::new(None));
    req.set_payload(Payload::Stream {
        payload: Box::pin(IdleBody {
            inner,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            stalled: stalled.clone(),
            done: false,
        }),
    });
    stalled
}

/// A request body that ends with an error when no byte came for `idle`.
struct IdleBody {
    inner: Payload,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    stalled: Stalled,
    done: bool,
}

impl Stream for IdleBody {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(bytes))) => {
                this.timer.as_mut().reset(Instant::now() + this.idle);
                Poll::Ready(Some(Ok(bytes)))
            }
            Poll::Ready(other) => Poll::Ready(other),
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.done = true;
                    let inner = std::mem::replace(&mut this.inner, Payload::None);
                    *this.stalled.borrow_mut() = Some(inner);
                    tracing::info!(timeout = ?this.idle, "http request body stalled (http.body.idle.timeout); ending it");
                    Poll::Ready(Some(Err(PayloadError::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no request body byte for {:?}", this.idle),
                    )))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}
