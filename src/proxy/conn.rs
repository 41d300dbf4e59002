//! One client connection: bursts of requests, parked between them. A burst reads request
//! heads and dispatches them, pipelined ones in order, while keep-alive holds and requests
//! keep coming; it holds buffers from the core's pool and the request loop's state. After
//! `buffer_release_ms` with nothing to read the connection parks: buffers back to the pool,
//! the request loop's state freed, and only a small probe read in flight until the next
//! request (or `idle_timeout_ms`). What a request needs from its connection lives in
//! the [`Session`]; the client's read half is the pinned [`ClientReader`] beside it.
//!
//! A connection's task is what it holds while parked, so nothing large lives in it: the
//! request loop's state is boxed per burst, and a TLS handshake runs in a task of its own
//! that hands the connection to a fresh one (`tests/idle_memory.rs` bounds the parked
//! connection's heap).

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use std::os::fd::AsRawFd;

use monoio::io::{Canceller, Splitable};
use monoio::net::TcpStream;

use super::core::CoreCtx;
use super::dispatch::dispatch;
use super::error::RequestError;
use super::guards::{ActiveRequest, Connection};
use super::head::{HeadRead, read_head};
use super::park::{Parked, park};
use super::peer::PeerIp;
use super::session::{ClientIo, RequestId, Session};
use super::watch::Reader;
use crate::http::request::RequestHead;
use crate::http::trace::TraceId;
use crate::runtime::reader::{ClientReader, Released};
use crate::runtime::stream::{ClientRead, ClientWrite};
use crate::shed::Class;
use crate::state::counters::add;

/// Serves one accepted connection until it closes.
pub(super) fn serve(ctx: &Rc<CoreCtx>, stream: TcpStream, peer: SocketAddr, tls: bool) {
    let _ = stream.set_nodelay(true);
    if tls {
        monoio::spawn(serve_tls(Connection::adopt(ctx), stream, peer));
    } else {
        let fd = stream.as_raw_fd();
        let (half, writer) = stream.into_split();
        let halves = (ClientRead::Plain(half), ClientWrite::Plain(writer));
        let parked = Parked::new(halves, fd, peer.ip());
        monoio::spawn(serve_parked(Connection::adopt(ctx), parked));
    }
}

/// A TLS connection's handshake, in a task of its own (its state is kilobytes); the
/// connection's requests are then served by another, which holds none of it.
async fn serve_tls(conn: Connection, stream: TcpStream, peer: SocketAddr) {
    let fd = stream.as_raw_fd();
    if let Some(halves) = super::handshake::handshake(&conn.0, stream, peer).await {
        monoio::spawn(serve_parked(conn, Parked::new(halves, fd, peer.ip())));
    }
}

/// Serves a connection's requests, in bursts, parked between them, until it closes. This
/// is what the connection's task holds while parked: its arguments and [`park`]'s few
/// words (`tests/idle_memory.rs` bounds it).
async fn serve_parked(conn: Connection, mut parked: Parked) {
    let ctx = &conn.0;
    loop {
        // Boxed: the request loop's state (kilobytes) exists only while requests come.
        let since = match Box::pin(burst(ctx.clone(), parked)).await {
            Some((idle, since)) => {
                parked = idle;
                since
            }
            None => return,
        };
        let idle_ms = ctx.snapshot().config.limits.idle_timeout_ms;
        if !park(&ctx.parked, &mut parked, idle_ms, since).await {
            return;
        }
    }
}

/// How a burst ended.
enum Ended {
    Closed,
    /// Nothing to read since `since`: the half, the empty read buffer, the canceller.
    Idle {
        since: Instant,
        half: ClientRead,
        buf: Vec<u8>,
        canceller: Canceller,
    },
}

/// Serves requests with buffers from the pool until the connection closes (None) or
/// idles; then gives the buffers back and returns what the connection keeps.
async fn burst(ctx: Rc<CoreCtx>, parked: Parked) -> Option<(Parked, Instant)> {
    let Parked {
        half,
        writer,
        fd,
        peer,
        probe,
        probed,
    } = parked;
    let mut half = half;
    let mut buf = ctx.read_bufs.borrow_mut().take();
    half.absorb_probe(&probe[..probed], &mut buf);
    let from_worker = ctx.read_bufs.borrow_mut().take();
    let canceller = ctx.parked.borrow_mut().take_canceller();
    let (to_client, to_worker) = {
        let mut writes = ctx.write_bufs.borrow_mut();
        (writes.take(), writes.take())
    };
    let snap = ctx.snapshot();
    let send_timeout_ms = snap.config.limits.client_send_timeout_ms;
    let mut session = Session {
        snap,
        io: ClientIo {
            writer,
            to_client,
            to_worker,
            from_worker,
            kept: Vec::new(),
            stalls: ctx.stalls.clone(),
            send_timeout_ms,
        },
        ctx,
        head: RequestHead::default(),
        peer: PeerIp::new(peer),
        request_id: RequestId::default(),
        class: Class::default(),
        pool: None,
        scratch: Vec::new(),
        trace: TraceId::default(),
    };
    let mut reader = std::pin::pin!(ClientReader::new(half, buf, canceller));
    let ended = run(&mut session, reader.as_mut()).await;
    if matches!(ended, Ended::Closed) {
        // TLS says it is done (close_notify), so the client can tell an end from a cut.
        session.io.writer.close_notify().await;
    }
    let Session { ctx, io, .. } = session;
    let mut writes = ctx.write_bufs.borrow_mut();
    writes.give(io.to_client);
    writes.give(io.to_worker);
    drop(writes);
    let mut reads = ctx.read_bufs.borrow_mut();
    reads.give(io.from_worker);
    match ended {
        Ended::Idle {
            since,
            half,
            buf,
            canceller,
        } => {
            reads.give(buf);
            ctx.parked.borrow_mut().give_canceller(canceller);
            let parked = Parked {
                half,
                writer: io.writer,
                fd,
                peer,
                probe,
                probed: 0,
            };
            Some((parked, since))
        }
        Ended::Closed => {
            // A read still in flight keeps its buffer until the driver drops it.
            reads.give(reader.as_mut().take_buf().unwrap_or_default());
            None
        }
    }
}

/// The request loop of a burst.
async fn run(s: &mut Session, mut reader: Reader<'_>) -> Ended {
    loop {
        s.snap = s.ctx.snapshot();
        s.class = s.snap.config.classes.default;
        s.io.send_timeout_ms = s.snap.config.limits.client_send_timeout_ms;
        match read_head(s, reader.as_mut()).await {
            HeadRead::Ready => {}
            HeadRead::Closed => return Ended::Closed,
            HeadRead::Idle(since) => match reader.as_mut().release().await {
                Released::Idle(half, buf, canceller) => {
                    return Ended::Idle {
                        since,
                        half,
                        buf,
                        canceller,
                    };
                }
                // A request arrived as the read was cancelled: serve it.
                Released::Data => continue,
                Released::Closed => return Ended::Closed,
            },
            HeadRead::Bad(_) if reader.buf().starts_with(&[0x16, 0x03]) => {
                // A TLS ClientHello on a plain listener: nothing it could read.
                add(&s.ctx.counters().bad_requests, 1);
                tracing::debug!(peer = ?String::from_utf8_lossy(s.peer.get()), "TLS handshake on the plain listener; closed");
                return Ended::Closed;
            }
            HeadRead::Bad(e) => {
                add(&s.ctx.counters().bad_requests, 1);
                s.request_id.fresh(&s.ctx);
                s.answer(RequestError::Framing(e), false, true).await;
                return Ended::Closed;
            }
        }
        match s.head.request_id.map(|span| span.get(reader.buf())) {
            Some(id) => s.request_id.set(id),
            None => s.request_id.fresh(&s.ctx),
        }
        let draining = s.ctx.shared.draining.load(Ordering::Relaxed);
        if draining {
            // Answer, then close: clients move to other instances.
            s.head.keep_alive = false;
        }
        let _active = ActiveRequest::start(&s.ctx);
        if !dispatch(s, reader.as_mut()).await || draining {
            return Ended::Closed;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn future_size<A, B, F>(_: fn(A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// A parked connection's task is its `serve_parked` future: a few hundred bytes. The
    /// TLS handshake's state and the request loop's (kilobytes each) live elsewhere.
    #[test]
    fn a_parked_connections_task_is_small() {
        let parked = future_size(serve_parked);
        assert!(parked <= 512, "serve_parked's future is {parked} B");
        let burst = future_size(burst);
        assert!(burst > 4 * parked, "the burst ({burst} B) is boxed apart");
    }
}
