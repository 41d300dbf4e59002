//! One client connection: bursts of requests, parked between them. A burst reads request
//! heads and dispatches them, pipelined ones in order, while keep-alive holds and requests
//! keep coming; it holds buffers from the core's pool and the request loop's state. After
//! `buffer_release_ms` with nothing to read the connection parks: buffers back to the pool,
//! the request loop's state freed, and only a small probe read in flight until the next
//! request (or `idle_timeout_ms`). What a request needs from its connection lives in
//! [`Conn`]; the client's read half is the pinned [`ClientReader`] beside it.

use std::io;
use std::io::Write as _;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use monoio::io::{Canceller, Splitable};
use monoio::net::TcpStream;

use super::core::{CoreCtx, FRESH_REQUEST_ID_LEN, SnapshotRef};
use super::error::RequestError;
use super::guards::{ActiveRequest, Connection};
use super::head::HeadRead;
use super::park::{Parked, park};
use super::watch::Reader;
use crate::http::limits::{IDLE_PROBE_LEN, MAX_REQUEST_ID_LEN};
use crate::http::request::RequestHead;
use crate::http::trace::TraceId;
use crate::runtime::reader::{ClientReader, Released};
use crate::runtime::stalls::{Stalls, Within};
use crate::runtime::stream::{ClientRead, ClientWrite};
use crate::shed::Class;
use crate::state::counters::add;

/// Serves one accepted connection until it closes; a TLS listener's connection first
/// completes its handshake.
pub(super) async fn serve(ctx: Rc<CoreCtx>, stream: TcpStream, peer: SocketAddr, tls: bool) {
    let _connection = Connection::adopt(&ctx);
    let _ = stream.set_nodelay(true);
    let (half, writer) = if tls {
        match super::tls::handshake(&ctx, stream, peer).await {
            Some(halves) => halves,
            None => return,
        }
    } else {
        let (half, writer) = stream.into_split();
        (ClientRead::Plain(half), ClientWrite::Plain(writer))
    };
    let mut parked = Parked {
        half,
        writer,
        peer: PeerIp::new(peer),
        canceller: Canceller::new(),
        probe: Box::new([0; IDLE_PROBE_LEN]),
        probed: 0,
    };
    loop {
        // Boxed: the request loop's state (kilobytes) exists only while requests come.
        let Some((idle, since)) = Box::pin(burst(ctx.clone(), parked)).await else {
            return;
        };
        let Some(woken) = park(&ctx, idle, since).await else {
            return;
        };
        parked = woken;
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
        peer,
        canceller,
        probe,
        probed,
    } = parked;
    let mut half = half;
    let mut buf = ctx.read_bufs.borrow_mut().take();
    half.absorb_probe(&probe[..probed], &mut buf);
    let rbuf = ctx.read_bufs.borrow_mut().take();
    let out = ctx.write_bufs.borrow_mut().take();
    let snap = ctx.snapshot();
    let send_timeout_ms = snap.config.limits.client_send_timeout_ms;
    let mut conn = Conn {
        snap,
        io: ClientIo {
            writer,
            out,
            rbuf,
            stalls: ctx.stalls.clone(),
            send_timeout_ms,
        },
        ctx,
        head: RequestHead::default(),
        peer,
        request_id: RequestId::default(),
        class: Class::default(),
        scratch: Vec::new(),
        trace: TraceId::default(),
    };
    let mut reader = std::pin::pin!(ClientReader::new(half, buf, canceller));
    let ended = conn.run(reader.as_mut()).await;
    if matches!(ended, Ended::Closed) {
        // TLS says it is done (close_notify), so the client can tell an end from a cut.
        conn.io.writer.close_notify().await;
    }
    let Conn { ctx, io, peer, .. } = conn;
    ctx.write_bufs.borrow_mut().give(io.out);
    let mut reads = ctx.read_bufs.borrow_mut();
    reads.give(io.rbuf);
    match ended {
        Ended::Idle {
            since,
            half,
            buf,
            canceller,
        } => {
            reads.give(buf);
            let parked = Parked {
                half,
                writer: io.writer,
                peer,
                canceller,
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

/// A connection between requests and during one.
pub(super) struct Conn {
    pub ctx: Rc<CoreCtx>,
    /// The config generation of the current request (refreshed before each request).
    pub snap: SnapshotRef,
    pub io: ClientIo,
    pub head: RequestHead,
    pub peer: PeerIp,
    pub request_id: RequestId,
    /// The current request's class, once its model is known.
    pub class: Class,
    /// Decoded escaped model names.
    pub scratch: Vec<u8>,
    /// The current request's W3C trace id (access log).
    pub trace: TraceId,
}

impl Conn {
    /// The request loop of a burst.
    async fn run(&mut self, mut reader: Reader<'_>) -> Ended {
        loop {
            self.snap = self.ctx.snapshot();
            self.class = self.snap.config.classes.default;
            self.io.send_timeout_ms = self.snap.config.limits.client_send_timeout_ms;
            match self.read_head(reader.as_mut()).await {
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
                    add(&self.ctx.counters().bad_requests, 1);
                    tracing::debug!(peer = ?String::from_utf8_lossy(self.peer.get()), "TLS handshake on the plain listener; closed");
                    return Ended::Closed;
                }
                HeadRead::Bad(e) => {
                    add(&self.ctx.counters().bad_requests, 1);
                    self.request_id.fresh(&self.ctx);
                    self.answer(RequestError::Framing(e), false, true).await;
                    return Ended::Closed;
                }
            }
            match self.head.request_id.map(|s| s.get(reader.buf())) {
                Some(id) => self.request_id.set(id),
                None => self.request_id.fresh(&self.ctx),
            }
            let draining = self.ctx.shared.draining.load(Ordering::Relaxed);
            if draining {
                // Answer, then close: clients move to other instances.
                self.head.keep_alive = false;
            }
            let _active = ActiveRequest::start(&self.ctx);
            if !self.dispatch(reader.as_mut()).await || draining {
                return Ended::Closed;
            }
        }
    }

    /// Answers the request with Spillway's own response. Returns whether the connection
    /// stays open.
    pub(super) async fn answer(
        &mut self,
        e: RequestError,
        keep_alive: bool,
        with_body: bool,
    ) -> bool {
        self.answer_counted(e, keep_alive, with_body).await.0
    }

    /// [`Conn::answer`], also returning the bytes written to the client (0 when the write
    /// failed), for the access log.
    pub(super) async fn answer_counted(
        &mut self,
        e: RequestError,
        keep_alive: bool,
        with_body: bool,
    ) -> (bool, u64) {
        let keep_alive = keep_alive && !e.closes_connection();
        let out = &mut self.io.out;
        out.clear();
        e.write(
            &self.snap,
            self.class,
            out,
            self.request_id.get(),
            keep_alive,
            with_body,
        );
        self.io.write_counted(keep_alive).await
    }
}

/// The client's write half and the buffers reused for every request. Every write must
/// finish within `client_send_timeout_ms` (checked once a second by the core's keeper,
/// [`Stalls`]); one that does not fails with `TimedOut`, and its buffer stays with the
/// abandoned write (the connection closes).
pub(super) struct ClientIo {
    pub writer: ClientWrite,
    /// The next write to the client; holds the upstream request while it is forwarded.
    pub out: Vec<u8>,
    /// Upstream reads.
    pub rbuf: Vec<u8>,
    pub stalls: Rc<Stalls>,
    pub send_timeout_ms: u64,
}

impl ClientIo {
    /// Writes all of `out` to the client and empties it.
    pub(super) async fn write_out(&mut self) -> io::Result<()> {
        let out = std::mem::take(&mut self.out);
        let n = out.len();
        let (res, buf) = self.write_within(out, n).await;
        self.out = buf;
        self.out.clear();
        res
    }

    /// Writes all of `out` (a whole answer of Spillway's own): whether the connection stays
    /// open (`keep_alive` and the write went through) and the bytes written.
    pub(super) async fn write_counted(&mut self, keep_alive: bool) -> (bool, u64) {
        let n = self.out.len() as u64;
        match self.write_out().await {
            Ok(()) => (keep_alive, n),
            Err(_) => (false, 0),
        }
    }

    /// Writes the first `n` bytes of `rbuf` to the client (a relay without copying).
    pub(super) async fn write_rbuf(&mut self, n: usize) -> io::Result<()> {
        let rbuf = std::mem::take(&mut self.rbuf);
        let (res, buf) = self.write_within(rbuf, n).await;
        self.rbuf = buf;
        res
    }

    /// The first `n` bytes of `buf`, within the send timeout. Past it, the write is
    /// dropped with `buf` (the driver keeps it until the kernel lets go) and an empty
    /// buffer comes back.
    async fn write_within(&mut self, buf: Vec<u8>, n: usize) -> (io::Result<()>, Vec<u8>) {
        let write = self.writer.write_prefix(buf, n);
        match Within::new(write, &self.stalls, self.send_timeout_ms).await {
            Some(done) => done,
            None => (Err(io::ErrorKind::TimedOut.into()), Vec::new()),
        }
    }
}

/// The client's address as `x-forwarded-for` writes it.
pub(super) struct PeerIp {
    text: [u8; 48],
    len: usize,
}

impl PeerIp {
    fn new(peer: SocketAddr) -> PeerIp {
        let mut text = [0u8; 48];
        let mut cursor = std::io::Cursor::new(&mut text[..]);
        let _ = write!(cursor, "{}", peer.ip());
        let len = cursor.position() as usize;
        PeerIp { text, len }
    }

    pub(super) fn get(&self) -> &[u8] {
        &self.text[..self.len]
    }
}

/// The request's `x-request-id`: the client's when it sent a usable one, else fresh.
pub(super) struct RequestId {
    text: [u8; MAX_REQUEST_ID_LEN],
    len: usize,
}

impl Default for RequestId {
    fn default() -> Self {
        RequestId {
            text: [0; MAX_REQUEST_ID_LEN],
            len: 0,
        }
    }
}

impl RequestId {
    /// The client's id (the parser only accepts ids that fit).
    fn set(&mut self, id: &[u8]) {
        let n = id.len().min(MAX_REQUEST_ID_LEN);
        self.text[..n].copy_from_slice(&id[..n]);
        self.len = n;
    }

    fn fresh(&mut self, ctx: &CoreCtx) {
        let mut id = [0u8; FRESH_REQUEST_ID_LEN];
        ctx.next_request_id(&mut id);
        self.set(&id);
    }

    pub(super) fn get(&self) -> &[u8] {
        &self.text[..self.len]
    }
}
