//! One proxied request: pick a worker, get a connection (pool or connect, failing over
//! past unreachable workers), send the request, wait for the response head while watching
//! the client, and stream the body back as it arrives.

use std::future::Future;
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use monoio::buf::IoBuf;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use monoio::net::tcp::TcpOwnedWriteHalf;

use super::{Tracked, connect, inflight_here};
use crate::config::RouterMode;
use crate::config::snapshot::{Model, Snapshot, Worker};
use crate::core::reader::{ClientReader, ReadDone};
use crate::core::{CoreCtx, clock};
use crate::http::chunked::ChunkedParser;
use crate::http::limits::{INITIAL_READ_BUF, RESPONSE_READ_BUF};
use crate::http::response::{ResponseHead, parse_response};
use crate::http::sse::SseCounter;
use crate::http::write::{ClientFraming, LAST_CHUNK, chunk, client_response_head};
use crate::http::{BodyFraming, HttpError};
use crate::metrics::{ITL_BUCKETS, MigrationReason, Outcome, RequestType, TTFT_BUCKETS, add, sub};
use crate::route::{self, DirectRefusal, Endpoint, MemberState, Pick};

/// The client side of the connection, lent to the forwarder.
pub struct Client<'a, F> {
    pub reader: Pin<&'a mut ClientReader<F>>,
    pub writer: &'a mut TcpOwnedWriteHalf,
    /// Holds the upstream request head on entry; reused for client writes.
    pub out: &'a mut Vec<u8>,
    pub rbuf: &'a mut Vec<u8>,
    pub request_id: &'a [u8],
}

/// What is being forwarded.
#[derive(Debug)]
pub struct Outbound<'a> {
    pub snap: &'a Snapshot,
    pub model: &'a Model,
    pub endpoint: Endpoint,
    pub request_type: RequestType,
    pub prompt_tokens: u64,
    /// The de-chunked body within the client buffer.
    pub body: Range<usize>,
    /// Bytes of this request (head and raw body) at the start of the client buffer.
    pub request_end: usize,
    pub worker_id: Option<Range<usize>>,
    pub client_minor: u8,
    pub client_keep_alive: bool,
    pub started: Instant,
}

/// Why no response came from a worker; answered locally before any response byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// Every eligible worker is busy (pool-wide; never migrated).
    Overloaded,
    /// Worker-local refusals left no worker to migrate to, or the migration limit is spent.
    WorkerOverloaded(Refusal),
    DirectBusy,
    Unavailable,
    DirectMissingHeader,
    DirectUnknownWorker,
    BadGateway(&'static str),
    GatewayTimeout,
}

impl Reject {
    pub fn outcome(self) -> Outcome {
        match self {
            Reject::Overloaded | Reject::WorkerOverloaded(_) | Reject::DirectBusy => {
                Outcome::Overload
            }
            Reject::Unavailable => Outcome::Unavailable,
            Reject::DirectMissingHeader => Outcome::Validation,
            Reject::DirectUnknownWorker => Outcome::NotFound,
            Reject::BadGateway(_) => Outcome::Internal,
            Reject::GatewayTimeout => Outcome::ResponseTimeout,
        }
    }
}

/// A worker-local refusal (semantics §6): the request may move to another worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Engine slots and queue full here.
    AtCapacity,
    /// Waited in this worker's queue past `request_queue_timeout_ms`.
    QueueTimeout,
    /// The worker answered 529 (or the overload status).
    UpstreamOverloaded,
    /// The worker answered 503.
    UpstreamUnavailable,
}

impl Refusal {
    fn reason(self) -> MigrationReason {
        match self {
            Refusal::AtCapacity => MigrationReason::WorkerAtCapacity,
            Refusal::QueueTimeout => MigrationReason::QueueTimeout,
            Refusal::UpstreamOverloaded => MigrationReason::UpstreamOverloaded,
            Refusal::UpstreamUnavailable => MigrationReason::UpstreamUnavailable,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    /// The whole response reached the client.
    Done { keep_alive: bool, status: u16 },
    /// Nothing reached the client; answer locally.
    Reject(Reject),
    /// The client left, or the response broke after bytes were sent: close the connection.
    Abort(Outcome),
}

/// Races some work against the client read in flight and a deadline, without dropping
/// either side's operation when the other wins.
enum Race<T> {
    Work(T),
    Client(io::Result<usize>),
    Timeout,
}

async fn race<U: Future, F: Future<Output = ReadDone>>(
    mut work: Pin<&mut U>,
    reader: &mut Pin<&mut ClientReader<F>>,
    mut sleep: Pin<&mut monoio::time::Sleep>,
) -> Race<U::Output> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = work.as_mut().poll(cx) {
            return Poll::Ready(Race::Work(v));
        }
        if let Poll::Ready(r) = reader.as_mut().poll_read(cx) {
            return Poll::Ready(Race::Client(r));
        }
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Race::Timeout);
        }
        Poll::Pending
    })
    .await
}

/// Ends a wait early.
enum Interrupt {
    ClientGone,
    Timeout,
}

/// Waits for `work` while watching the client: pipelined bytes arriving meanwhile are kept
/// (the watch re-arms only when nothing is buffered); a disconnect ends the wait.
async fn watched<U: Future, F: Future<Output = ReadDone>>(
    work: U,
    reader: &mut Pin<&mut ClientReader<F>>,
    deadline: Instant,
) -> Result<U::Output, Interrupt> {
    let mut sleep = std::pin::pin!(monoio::time::sleep_until(deadline.into()));
    let mut work = std::pin::pin!(work);
    loop {
        match race(work.as_mut(), reader, sleep.as_mut()).await {
            Race::Work(v) => return Ok(v),
            Race::Client(Ok(n)) if n > 0 => reader.as_mut().watch(),
            Race::Client(_) => return Err(Interrupt::ClientGone),
            Race::Timeout => return Err(Interrupt::Timeout),
        }
    }
}

/// One upstream read appended to `rbuf`, while the client is watched.
async fn read_upstream<F: Future<Output = ReadDone>>(
    stream: &mut TcpStream,
    rbuf: &mut Vec<u8>,
    reader: &mut Pin<&mut ClientReader<F>>,
    deadline: Instant,
) -> Result<io::Result<usize>, Interrupt> {
    if rbuf.capacity() - rbuf.len() < 1024 {
        rbuf.reserve(RESPONSE_READ_BUF);
    }
    let len = rbuf.len();
    let buf = std::mem::take(rbuf);
    let (res, slice) = watched(stream.read(buf.slice_mut(len..)), reader, deadline).await?;
    *rbuf = slice.into_inner();
    Ok(res)
}

async fn write_all(writer: &mut TcpOwnedWriteHalf, out: &mut Vec<u8>) -> io::Result<()> {
    let (res, buf) = writer.write_all(std::mem::take(out)).await;
    *out = buf;
    out.clear();
    res.map(drop)
}

async fn write_prefix(
    writer: &mut TcpOwnedWriteHalf,
    rbuf: &mut Vec<u8>,
    n: usize,
) -> io::Result<()> {
    let (res, slice) = writer.write_all(std::mem::take(rbuf).slice(..n)).await;
    *rbuf = slice.into_inner();
    res.map(drop)
}

/// Sends the prepared request (head and body) kept in `out`.
async fn send(stream: &mut TcpStream, out: &mut Vec<u8>) -> io::Result<()> {
    let (res, buf) = stream.write_all(std::mem::take(out)).await;
    *out = buf;
    res.map(drop)
}

/// Members this request must not use again: `failed` (connect failures, like down) and
/// `refused` (worker-local refusals, like busy). Bit i is member i; pools beyond 128
/// members rely on the shared down and overloaded marks alone.
#[derive(Debug, Default, Clone, Copy)]
struct Excluded {
    failed: u128,
    refused: u128,
}

fn bit(pos: usize) -> u128 {
    1u128.checked_shl(pos as u32).unwrap_or(0)
}

/// Picks a member; `Ok((position, busy-set generation))`.
fn pick(
    ctx: &CoreCtx,
    req: &Outbound<'_>,
    worker_id: Option<&[u8]>,
    ex: Excluded,
    now: u64,
) -> Result<(usize, u64), Reject> {
    let model = req.model;
    let snap = req.snap;
    let mut cache = ctx.busy.borrow_mut();
    let busy = cache.load();
    let shed = busy.enabled(model.id);
    let generation = busy.generation;
    let state = |i: usize| {
        let m = model.members[i];
        let w = &snap.workers[m.worker as usize].state;
        MemberState {
            unreachable: w.is_down(now) || ex.failed & bit(i) != 0,
            busy: (shed && busy.is_busy(m.id))
                || w.is_overloaded(generation)
                || ex.refused & bit(i) != 0,
            inflight: inflight_here(w, ctx.id),
            load: busy.load(m.id),
        }
    };
    let n = model.members.len();
    if model.router_mode == RouterMode::Direct {
        let name = |i: usize| {
            snap.workers[model.members[i].worker as usize]
                .cfg
                .name
                .as_bytes()
        };
        return route::pick_direct(worker_id, n, name, state)
            .map(|i| (i, generation))
            .map_err(|r| match r {
                DirectRefusal::MissingHeader => Reject::DirectMissingHeader,
                DirectRefusal::UnknownWorker => Reject::DirectUnknownWorker,
                DirectRefusal::Busy => Reject::DirectBusy,
                DirectRefusal::Unreachable => Reject::Unavailable,
            });
    }
    let mut rr = ctx.rr(model.id);
    let picked = route::pick(
        model.router_mode,
        n,
        state,
        &mut rr,
        &mut ctx.rng.borrow_mut(),
    );
    ctx.set_rr(model.id, rr);
    match picked {
        Pick::Member(i) => Ok((i, generation)),
        // Nothing busy by the published set: what excluded the rest were worker-local
        // refusals (this request's, or marks since the last publish). Say so.
        Pick::Overloaded if !(shed && model.members.iter().any(|m| busy.is_busy(m.id))) => {
            Err(Reject::WorkerOverloaded(Refusal::AtCapacity))
        }
        Pick::Overloaded => Err(Reject::Overloaded),
        Pick::Unavailable => Err(Reject::Unavailable),
    }
}

/// Forwards one request. On return the request's bytes are consumed from the client buffer.
pub async fn forward<F: Future<Output = ReadDone>>(
    ctx: &CoreCtx,
    c: &mut Client<'_, F>,
    req: &Outbound<'_>,
) -> Forwarded {
    let snap = req.snap;
    let m = &req.model.metrics.cores[ctx.id];
    add(&m.inflight, 1);
    let result = exchange(ctx, c, req).await;
    sub(&m.inflight, 1);
    let outcome = match result {
        Forwarded::Done { status, .. } => {
            Outcome::of_status(status, snap.config.overload_status_code)
        }
        Forwarded::Reject(r) => r.outcome(),
        Forwarded::Abort(o) => o,
    };
    if matches!(
        result,
        Forwarded::Reject(Reject::Overloaded | Reject::WorkerOverloaded(_) | Reject::DirectBusy)
    ) {
        m.rejected(req.endpoint);
    }
    m.request_done(req.endpoint, req.request_type, outcome);
    if !matches!(result, Forwarded::Reject(_)) {
        m.duration.observe(
            &crate::metrics::DURATION_BUCKETS,
            req.started.elapsed().as_secs_f64(),
        );
    }
    result
}

/// What one attempt on one worker came to.
enum Attempt {
    Finished(Forwarded),
    /// Try another worker, if the request may still move.
    Refused(Refusal),
    /// Connect failed: the worker is marked down; try another (not a migration).
    Unreachable,
}

async fn exchange<F: Future<Output = ReadDone>>(
    ctx: &CoreCtx,
    c: &mut Client<'_, F>,
    req: &Outbound<'_>,
) -> Forwarded {
    let snap = req.snap;
    let model = req.model;

    // Detach the request from the client buffer: the body joins the head in `out` (one
    // write per attempt, kept for migration), the direct-mode worker id is copied, and the
    // client's bytes are consumed so its socket can be watched from here on.
    let buf = c.reader.buf();
    c.out
        .extend_from_slice(buf.get(req.body.clone()).unwrap_or_default());
    let mut wid = [0u8; 128];
    let wid_len = req
        .worker_id
        .clone()
        .and_then(|r| buf.get(r))
        .filter(|id| id.len() <= wid.len())
        .map(|id| {
            wid[..id.len()].copy_from_slice(id);
            id.len()
        });
    let worker_id = wid_len.map(|n| &wid[..n]);
    c.reader.as_mut().consume(req.request_end, INITIAL_READ_BUF);
    c.reader.as_mut().watch();

    let mut ex = Excluded::default();
    let mut migrations = 0u32;
    let mut last_refusal = None;
    loop {
        let now = clock::now_ms();
        let (pos, generation) = match pick(ctx, req, worker_id, ex, now) {
            Ok(p) => p,
            Err(Reject::Overloaded | Reject::WorkerOverloaded(_)) if last_refusal.is_some() => {
                return Forwarded::Reject(
                    last_refusal.map_or(Reject::Overloaded, Reject::WorkerOverloaded),
                );
            }
            Err(r) => return Forwarded::Reject(r),
        };
        let worker = &snap.workers[model.members[pos].worker as usize];
        match attempt(ctx, c, req, worker).await {
            Attempt::Finished(f) => return f,
            Attempt::Unreachable => {
                ex.failed |= bit(pos);
                add(&ctx.counters().failovers, 1);
            }
            Attempt::Refused(refusal) => {
                match refusal {
                    Refusal::UpstreamUnavailable => worker
                        .state
                        .inhibit(now, snap.config.limits.worker_down_backoff_ms),
                    _ => worker.state.mark_overloaded(generation),
                }
                tracing::debug!(worker = %worker.cfg.name, ?refusal, migrations, "worker refused the request");
                if migrations >= snap.config.migration_limit
                    || model.router_mode == RouterMode::Direct
                {
                    return Forwarded::Reject(match refusal {
                        Refusal::UpstreamUnavailable => Reject::Unavailable,
                        r => Reject::WorkerOverloaded(r),
                    });
                }
                migrations += 1;
                model.metrics.cores[ctx.id].migrated(refusal.reason());
                ex.refused |= bit(pos);
                if refusal != Refusal::UpstreamUnavailable {
                    last_refusal = Some(refusal);
                }
            }
        }
    }
}

/// Admission, connection, request and response on one worker.
async fn attempt<F: Future<Output = ReadDone>>(
    ctx: &CoreCtx,
    c: &mut Client<'_, F>,
    req: &Outbound<'_>,
    worker: &Worker,
) -> Attempt {
    let snap = req.snap;
    let limits = &snap.config.limits;

    // Admission: a slot now, a place in the queue, or a refusal.
    let ticket = match worker.gate.as_deref() {
        None => None,
        Some(gate) => match gate.enter() {
            None => return Attempt::Refused(Refusal::AtCapacity),
            Some(t) => Some((gate, t)),
        },
    };
    if let Some((gate, t)) = ticket.as_ref().filter(|(_, t)| !t.is_ready()) {
        let deadline = Instant::now() + Duration::from_millis(worker.cfg.request_queue_timeout_ms);
        match watched(t.ready(), &mut c.reader, deadline).await {
            Ok(()) => {}
            Err(Interrupt::ClientGone) => {
                add(&ctx.counters().client_disconnects, 1);
                return Attempt::Finished(Forwarded::Abort(Outcome::Cancelled));
            }
            // The deadline and the turn can come together: a ready ticket goes ahead.
            Err(Interrupt::Timeout) if t.is_ready() => {}
            Err(Interrupt::Timeout) => {
                gate.count_rejection();
                return Attempt::Refused(Refusal::QueueTimeout);
            }
        }
    }

    // Connection: pooled (retried once fresh if it fails on write) or new.
    let now = clock::now_ms();
    let pooled = ctx
        .pools
        .borrow_mut()
        .take(worker.state.slot, now, limits.pool_idle_timeout_ms);
    let reused = pooled.is_some();
    let mut stream = match pooled {
        Some(s) => s,
        None => match connect_worker(ctx, worker, now, limits).await {
            Some(s) => s,
            None => return Attempt::Unreachable,
        },
    };
    if let Err(e) = send(&mut stream, c.out).await {
        if !reused {
            tracing::warn!(worker = %worker.cfg.name, error = %e, "sending the request failed");
            return Attempt::Finished(Forwarded::Reject(Reject::BadGateway(
                "the worker closed the connection",
            )));
        }
        // A kept-alive connection the worker closed under us, detected before the request
        // went out: retry once on a fresh connection. Nothing else is replayed.
        tracing::debug!(worker = %worker.cfg.name, error = %e, "pooled connection failed on write; retrying fresh");
        add(&ctx.counters().upstream_reuse_retries, 1);
        stream = match connect_worker(ctx, worker, clock::now_ms(), limits).await {
            Some(s) => s,
            None => return Attempt::Unreachable,
        };
        if send(&mut stream, c.out).await.is_err() {
            return Attempt::Finished(Forwarded::Reject(Reject::BadGateway(
                "the worker closed the connection",
            )));
        }
    }

    let mut tracked = Tracked::start(
        &worker.state,
        ctx.id,
        req.prompt_tokens,
        worker.cfg.block_size,
    );
    c.rbuf.clear();
    let first_byte_timeout = Duration::from_millis(limits.upstream_first_byte_timeout_ms);
    let mut resp = ResponseHead::default();
    loop {
        match read_upstream(
            &mut stream,
            c.rbuf,
            &mut c.reader,
            Instant::now() + first_byte_timeout,
        )
        .await
        {
            Err(Interrupt::ClientGone) => {
                add(&ctx.counters().client_disconnects, 1);
                return Attempt::Finished(Forwarded::Abort(Outcome::Cancelled));
            }
            Err(Interrupt::Timeout) => {
                return Attempt::Finished(Forwarded::Reject(Reject::GatewayTimeout));
            }
            Ok(Ok(0)) | Ok(Err(_)) => {
                return Attempt::Finished(Forwarded::Reject(Reject::BadGateway(
                    "the worker closed the connection before responding",
                )));
            }
            Ok(Ok(_)) => {}
        }
        match parse_response(c.rbuf, limits.max_header_bytes, false, &mut resp) {
            Ok(false) => continue,
            Ok(true) if resp.status == 101 => {
                return Attempt::Finished(Forwarded::Reject(Reject::BadGateway(
                    "unexpected protocol switch",
                )));
            }
            Ok(true) if resp.is_informational() => {
                c.rbuf.drain(..resp.head_len);
                continue;
            }
            Ok(true) => break,
            Err(HttpError::HeaderTooLarge) => {
                return Attempt::Finished(Forwarded::Reject(Reject::BadGateway(
                    "response head too large",
                )));
            }
            Err(_) => {
                return Attempt::Finished(Forwarded::Reject(Reject::BadGateway(
                    "malformed response from the worker",
                )));
            }
        }
    }
    // A refusal from the worker itself, before any body byte: worker-local, migratable.
    if resp.status == 529 || resp.status == snap.config.overload_status_code {
        return Attempt::Refused(Refusal::UpstreamOverloaded);
    }
    if resp.status == 503 {
        return Attempt::Refused(Refusal::UpstreamUnavailable);
    }

    let relayed = relay(
        ctx,
        c,
        req,
        &mut stream,
        &resp,
        &mut tracked,
        first_byte_timeout,
    )
    .await;
    drop(tracked);
    drop(ticket);
    match relayed {
        Ok(reusable) => {
            if reusable {
                ctx.pools.borrow_mut().put(
                    worker.state.slot,
                    stream,
                    clock::now_ms(),
                    limits.pool_max_idle_per_worker,
                );
            }
            let keep_alive = req.client_keep_alive
                && ClientFraming::for_response(resp.framing(), req.client_minor)
                    .allows_keep_alive();
            Attempt::Finished(Forwarded::Done {
                keep_alive,
                status: resp.status,
            })
        }
        Err(outcome) => Attempt::Finished(Forwarded::Abort(outcome)),
    }
}

async fn connect_worker(
    ctx: &CoreCtx,
    worker: &Worker,
    now: u64,
    limits: &crate::http::Limits,
) -> Option<TcpStream> {
    match connect(worker.cfg.addr, limits.connect_timeout_ms).await {
        Ok(s) => {
            worker.state.mark_up();
            add(&ctx.counters().upstream_connects, 1);
            Some(s)
        }
        Err(e) => {
            let backoff = worker.state.mark_down(
                now,
                limits.worker_down_backoff_ms,
                limits.worker_down_backoff_max_ms,
            );
            add(&ctx.counters().upstream_connect_failures, 1);
            tracing::warn!(worker = %worker.cfg.name, url = %worker.cfg.url, error = %e, backoff_ms = backoff, "worker unreachable; marked down");
            None
        }
    }
}

/// Where the upstream body stands.
enum Body {
    Length(u64),
    Chunked(ChunkedParser),
    UntilClose,
    Done,
}

impl Body {
    /// Bytes of `buf` belonging to the body (to forward now) and whether it is complete.
    fn advance(
        &mut self,
        buf: &[u8],
        on_data: &mut impl FnMut(&[u8]),
    ) -> Result<(usize, bool), HttpError> {
        match self {
            Body::Length(remaining) => {
                let take = (*remaining).min(buf.len() as u64) as usize;
                on_data(&buf[..take]);
                *remaining -= take as u64;
                let done = *remaining == 0;
                if done {
                    *self = Body::Done;
                }
                Ok((take, done))
            }
            Body::Chunked(p) => {
                let (used, done) = p.skim(buf, &mut *on_data)?;
                if done {
                    *self = Body::Done;
                }
                Ok((used, done))
            }
            Body::UntilClose => {
                on_data(buf);
                Ok((buf.len(), false))
            }
            Body::Done => Ok((0, true)),
        }
    }
}

/// Streams the response to the client. Returns whether the upstream connection can be
/// pooled, or the outcome that ended the exchange early.
async fn relay<F: Future<Output = ReadDone>>(
    ctx: &CoreCtx,
    c: &mut Client<'_, F>,
    req: &Outbound<'_>,
    stream: &mut TcpStream,
    resp: &ResponseHead,
    tracked: &mut Tracked<'_>,
    gap_timeout: Duration,
) -> Result<bool, Outcome> {
    let model = req.model;
    let m = &model.metrics.cores[ctx.id];
    let framing = resp.framing();
    let cf = ClientFraming::for_response(framing, req.client_minor);
    let keep_client = req.client_keep_alive && cf.allows_keep_alive();
    // The request in `out` is no longer needed: the response is committed to this worker.
    c.out.clear();
    client_response_head(
        c.out,
        c.rbuf,
        resp,
        cf,
        c.request_id,
        keep_client,
        req.client_minor,
    );
    c.rbuf.drain(..resp.head_len);

    let mut body = match framing {
        BodyFraming::None => Body::Done,
        BodyFraming::Length(n) => Body::Length(n),
        BodyFraming::Chunked => Body::Chunked(ChunkedParser::new()),
        BodyFraming::UntilClose => Body::UntilClose,
    };
    let count_tokens = model.track_output_blocks;
    let mut sse = SseCounter::default();
    let mut first = true;
    let mut last_data = Instant::now();
    let mut eof = false;
    loop {
        let mut events = 0;
        let (take, done) = body
            .advance(c.rbuf, &mut |d| {
                if count_tokens {
                    events += sse.feed(d);
                }
            })
            .map_err(|_| Outcome::Internal)?;
        let done = done || eof;
        if take > 0 {
            let now = Instant::now();
            if first {
                first = false;
                tracked.first_byte();
                m.ttft
                    .observe(&TTFT_BUCKETS, now.duration_since(req.started).as_secs_f64());
            } else if req.request_type == RequestType::Stream {
                m.itl
                    .observe(&ITL_BUCKETS, now.duration_since(last_data).as_secs_f64());
            }
            last_data = now;
            tracked.generated(events);
        }
        let direct = take > 0 && cf != ClientFraming::Rechunk && c.out.is_empty();
        if take > 0 && !direct {
            if cf == ClientFraming::Rechunk {
                chunk(c.out, &c.rbuf[..take]);
            } else {
                c.out.extend_from_slice(&c.rbuf[..take]);
            }
        }
        if done && cf == ClientFraming::Rechunk {
            c.out.extend_from_slice(LAST_CHUNK);
        }
        let written = if direct {
            write_prefix(c.writer, c.rbuf, take).await
        } else if !c.out.is_empty() {
            write_all(c.writer, c.out).await
        } else {
            Ok(())
        };
        if written.is_err() {
            add(&ctx.counters().client_disconnects, 1);
            return Err(Outcome::Cancelled);
        }
        c.rbuf.drain(..take);
        if done {
            // Bytes past the end of the message: the connection is out of step; drop it.
            return Ok(resp.reusable
                && !eof
                && c.rbuf.is_empty()
                && framing != BodyFraming::UntilClose);
        }
        match read_upstream(stream, c.rbuf, &mut c.reader, Instant::now() + gap_timeout).await {
            Ok(Ok(0)) if matches!(body, Body::UntilClose) => eof = true,
            Ok(Ok(0)) | Ok(Err(_)) => return Err(Outcome::Internal),
            Ok(Ok(_)) => {}
            Err(Interrupt::ClientGone) => {
                add(&ctx.counters().client_disconnects, 1);
                return Err(Outcome::Cancelled);
            }
            Err(Interrupt::Timeout) => return Err(Outcome::ResponseTimeout),
        }
    }
}
