//! What a connection carries through a burst of requests: the [`Session`] (the
//! snapshot, the head being served, the client's identity, the buffers and the write
//! half), and the answers Spillway gives itself. Every stage of a request works on it.

use std::io;
use std::rc::Rc;

use super::core::{CoreCtx, SnapshotRef};
use super::error::RequestError;
use super::peer::PeerIp;
use crate::config::PoolRole;
use crate::http::HttpError;
use crate::http::limits::{FRESH_REQUEST_ID_LEN, MAX_REQUEST_ID_LEN};
use crate::http::request::RequestHead;
use crate::http::trace::TraceId;
use crate::runtime::stalls::{Stalls, Within};
use crate::runtime::stream::ClientWrite;
use crate::shed::Class;
use crate::state::counters::add;

/// A connection between requests and during one.
pub(super) struct Session {
    pub ctx: Rc<CoreCtx>,
    /// The config generation of the current request (refreshed before each request).
    pub snap: SnapshotRef,
    pub io: ClientIo,
    pub head: RequestHead,
    pub peer: PeerIp,
    pub request_id: RequestId,
    /// The current request's class, once its model is known.
    pub class: Class,
    /// The pool of a disaggregated model whose answer the client gets, when it is one of
    /// Spillway's own (a refusal names it).
    pub pool: Option<PoolRole>,
    /// Decoded escaped model names.
    pub scratch: Vec<u8>,
    /// The current request's W3C trace id (access log).
    pub trace: TraceId,
}

impl Session {
    /// Answers a request whose framing is in doubt (a bad request) and closes: returns
    /// false, the connection's fate.
    pub(super) async fn answer_malformed(&mut self, e: HttpError) -> bool {
        add(&self.ctx.counters().bad_requests, 1);
        self.answer(RequestError::Framing(e), false, true).await;
        false
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

    /// [`Session::answer`], also returning the bytes written to the client (0 when the write
    /// failed), for the access log.
    pub(super) async fn answer_counted(
        &mut self,
        e: RequestError,
        keep_alive: bool,
        with_body: bool,
    ) -> (bool, u64) {
        let keep_alive = keep_alive && !e.closes_connection();
        let out = &mut self.io.to_client;
        out.clear();
        e.write(
            &self.snap,
            (self.class, self.pool),
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
    /// What goes to the client next: Spillway's own answer, a response head, body pieces
    /// the client's framing needed.
    pub to_client: Vec<u8>,
    /// The request as it goes to a worker, head and body, kept whole for a migration.
    pub to_worker: Vec<u8>,
    /// What the worker sent: its response head, then body bytes on their way through.
    pub from_worker: Vec<u8>,
    /// The client's request (head and body) while a disaggregated request's stage
    /// request is in `to_worker`; empty until a model with a prefill pool needs it.
    pub kept: Vec<u8>,
    pub stalls: Rc<Stalls>,
    pub send_timeout_ms: u64,
}

impl ClientIo {
    /// Writes all of `to_client` to the client and empties it.
    pub(super) async fn write_to_client(&mut self) -> io::Result<()> {
        let out = std::mem::take(&mut self.to_client);
        let n = out.len();
        let (res, buf) = self.write_within(out, n).await;
        self.to_client = buf;
        self.to_client.clear();
        res
    }

    /// Writes all of `to_client` (a whole answer of Spillway's own): whether the
    /// connection stays open (`keep_alive` and the write went through) and the bytes
    /// written.
    pub(super) async fn write_counted(&mut self, keep_alive: bool) -> (bool, u64) {
        let n = self.to_client.len() as u64;
        match self.write_to_client().await {
            Ok(()) => (keep_alive, n),
            Err(_) => (false, 0),
        }
    }

    /// Writes the first `n` bytes of `from_worker` to the client (a relay without
    /// copying).
    pub(super) async fn write_from_worker(&mut self, n: usize) -> io::Result<()> {
        let buf = std::mem::take(&mut self.from_worker);
        let (res, buf) = self.write_within(buf, n).await;
        self.from_worker = buf;
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
    pub(super) fn set(&mut self, id: &[u8]) {
        let n = id.len().min(MAX_REQUEST_ID_LEN);
        self.text[..n].copy_from_slice(&id[..n]);
        self.len = n;
    }

    pub(super) fn fresh(&mut self, ctx: &CoreCtx) {
        let mut id = [0u8; FRESH_REQUEST_ID_LEN];
        ctx.next_request_id(&mut id);
        self.set(&id);
    }

    pub(super) fn get(&self) -> &[u8] {
        &self.text[..self.len]
    }
}
