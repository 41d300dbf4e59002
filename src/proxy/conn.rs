//! One client connection: read a request head, dispatch it, repeat while keep-alive holds.
//! Pipelined requests are served in order. What a request needs from its connection lives
//! in [`Conn`]; the client's read half is the pinned [`ClientReader`] beside it.

use std::future::Future;
use std::io;
use std::io::Write as _;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use monoio::buf::IoBuf;
use monoio::io::{AsyncWriteRentExt, Splitable};
use monoio::net::TcpStream;
use monoio::net::tcp::TcpOwnedWriteHalf;

use super::core::{CoreCtx, FRESH_REQUEST_ID_LEN, SnapshotRef};
use super::error::RequestError;
use super::guards::{ActiveRequest, Connection};
use super::head::HeadRead;
use super::watch::Reader;
use crate::http::limits::{INITIAL_READ_BUF, MAX_REQUEST_ID_LEN, RESPONSE_READ_BUF};
use crate::http::request::RequestHead;
use crate::runtime::reader::{ClientReader, ReadDone, read_more};
use crate::shed::Class;
use crate::state::counters::add;

/// Serves one accepted connection until it closes.
pub(super) async fn serve(ctx: Rc<CoreCtx>, stream: TcpStream, peer: SocketAddr) {
    let _connection = Connection::adopt(&ctx);
    let _ = stream.set_nodelay(true);
    let (read_half, writer) = stream.into_split();
    let mut conn = Conn {
        snap: ctx.snapshot(),
        ctx,
        io: ClientIo {
            writer,
            out: Vec::with_capacity(4096),
            rbuf: Vec::with_capacity(RESPONSE_READ_BUF),
        },
        head: RequestHead::default(),
        peer: PeerIp::new(peer),
        request_id: RequestId::default(),
        class: Class::default(),
        scratch: Vec::new(),
    };
    let reader = std::pin::pin!(ClientReader::new(
        read_half,
        Vec::with_capacity(INITIAL_READ_BUF),
        read_more
    ));
    conn.run(reader).await;
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
}

impl Conn {
    async fn run<F: Future<Output = ReadDone>>(&mut self, mut reader: Reader<'_, F>) {
        loop {
            self.snap = self.ctx.snapshot();
            self.class = self.snap.config.classes.default;
            match self.read_head(reader.as_mut()).await {
                HeadRead::Ready => {}
                HeadRead::Closed => return,
                HeadRead::Bad(e) => {
                    add(&self.ctx.counters().bad_requests, 1);
                    self.request_id.fresh(&self.ctx);
                    self.answer(RequestError::Framing(e), false, true).await;
                    return;
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
                return;
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
        self.io.write_out().await.is_ok() && keep_alive
    }
}

/// The client's write half and the buffers reused for every request.
pub(super) struct ClientIo {
    pub writer: TcpOwnedWriteHalf,
    /// The next write to the client; holds the upstream request while it is forwarded.
    pub out: Vec<u8>,
    /// Upstream reads.
    pub rbuf: Vec<u8>,
}

impl ClientIo {
    /// Writes all of `out` to the client and empties it.
    pub(super) async fn write_out(&mut self) -> io::Result<()> {
        let (res, buf) = self.writer.write_all(std::mem::take(&mut self.out)).await;
        self.out = buf;
        self.out.clear();
        res.map(drop)
    }

    /// Writes the first `n` bytes of `rbuf` to the client (a relay without copying).
    pub(super) async fn write_rbuf(&mut self, n: usize) -> io::Result<()> {
        let (res, slice) = self
            .writer
            .write_all(std::mem::take(&mut self.rbuf).slice(..n))
            .await;
        self.rbuf = slice.into_inner();
        res.map(drop)
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
