//! SGLang's handoff (docs/behaviour.md §23.6): one request, with a prefill worker's
//! bootstrap address and a fresh room, goes to that prefill worker and to a decode worker
//! at once. Here the prefill side is opened (picked on the prefill pool, admitted at its
//! gate, sent) before the decode side's attempts start; then its answer is drained
//! [`alongside`] them and never reaches the client. The request's answer is the decode
//! side's.

use std::future::Future;
use std::time::{Duration, Instant};

use super::admit::{Budget, Slot, admit};
use super::attempt::{Done, count_outcome};
use super::connect::connect_and_send;
use super::core::CoreCtx;
use super::error::{AttemptError, RequestError};
use super::exchange::Exchange;
use super::guards::{Inflight, OnWorker, Tracked};
use super::pick::{Excluded, bound, pick};
use super::stages::sglang_request;
use crate::http::Limits;
use crate::http::limits::{RESPONSE_READ_BUF, RESPONSE_READ_MIN_SPARE};
use crate::http::response::{ResponseHead, parse_response};
use crate::http::{BodyFraming, chunked::ChunkedParser};
use crate::route::handoff::Bootstrap;
use crate::runtime::clock;
use crate::runtime::stream::Upstream;
use crate::shed::Knob;
use crate::state::counters::{
    DURATION_BUCKETS, ModelCore, Outcome, RequestType, TTFT_BUCKETS, add,
};
use crate::state::{Model, Snapshot, Worker};

/// How long a prefill answer still on its way may hold the connection after the decode
/// side's answer is whole (the KV cache was transferred: the answer is due at once).
const PREFILL_GRACE: Duration = Duration::from_secs(1);

/// The prefill side of one request, sent and not yet answered. Its guards give the slot,
/// the tracked load and the pool's in-flight count back on drop; its outcome is counted
/// on the prefill pool once, on drop.
pub(super) struct Prefilling<'s> {
    snap: &'s Snapshot,
    pool: &'s Model,
    worker: &'s Worker,
    /// The worker's index in the snapshot's workers (the access log's `prefill_worker`).
    pub index: usize,
    /// Taken when the connection goes back to the pool.
    stream: Option<Upstream>,
    cells: &'s ModelCore,
    endpoint: crate::route::Endpoint,
    started: Instant,
    outcome: Outcome,
    tracked: Tracked<'s>,
    _slot: Slot<'s>,
    _on: OnWorker<'s>,
    _inflight: Inflight<'s>,
}

impl Drop for Prefilling<'_> {
    fn drop(&mut self) {
        let cells = self.cells;
        cells.request_done(self.endpoint, RequestType::Unary, self.outcome);
        let secs = clock::since(self.started).as_secs_f64();
        cells.duration.observe(&DURATION_BUCKETS, secs);
    }
}

/// Why no prefill worker has the request.
pub(super) enum NotOpened {
    /// The prefill pool's answer to the client: every worker busy or refusing.
    Answer(RequestError),
    /// The request ended while it waited at a prefill worker's gate (the client left).
    Ended(AttemptError),
    /// No prefill worker available, or none could be reached: the decode worker
    /// prefills the client's own request.
    Fallback,
}

/// Picks a worker of `pool` for the request, puts SGLang's request (its bootstrap
/// fields) in `to_worker`, admits it at the worker's gate and sends it there. A worker
/// that refuses or cannot be reached is left for another, up to `migration_limit`.
pub(super) async fn open<'s>(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, 's>,
    pool: &'s Model,
) -> Result<Prefilling<'s>, NotOpened> {
    let front = ex.req.model;
    ex.req.model = pool;
    let opened = open_on_pool(ctx, ex).await;
    ex.req.model = front;
    opened
}

async fn open_on_pool<'s>(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, 's>,
) -> Result<Prefilling<'s>, NotOpened> {
    let (snap, pool) = (ex.req.snap, ex.req.model);
    let limits = &snap.config.limits;
    let mut excluded = Excluded::default();
    let mut refused = None;
    for _ in 0..=snap.config.migration_limit {
        let now = clock::now_ms();
        let picked = match pick(ctx, &ex.req, None, ex.prompt(), excluded, now) {
            Ok(picked) => picked,
            Err(none) => return Err(unpicked(none.answered(), refused)),
        };
        let pos = picked.member;
        let worker = &snap.workers[pool.members[pos].worker as usize];
        let room = ctx.rng.borrow_mut().next_u64();
        let (host, port) = (&worker.cfg.endpoint.host, worker.cfg.bootstrap_port);
        if !sglang_request(ex, Bootstrap { host, port, room }) {
            return Err(NotOpened::Fallback);
        }
        bound(ctx, &ex.req, ex.prompt(), &picked, now);
        let on = OnWorker::start(&worker.state, ctx.id);
        let budget = (ex.req.budget_ms).map(|ms| Budget {
            from: ex.req.started,
            ms,
        });
        let slot = match admit(worker, ex.req.class, || None, budget, &mut ex.reader).await {
            Ok(slot) => slot,
            Err(AttemptError::Refused(r, why)) => {
                let knob = why.map(|w| w.knob);
                // The client's budget is spent: no other worker can serve it in time.
                if knob == Some(Knob::Deadline) {
                    return Err(NotOpened::Answer(r.to_client(why)));
                }
                // A class's share says nothing of the worker: others keep using it.
                if knob != Some(Knob::ClassShare) {
                    worker
                        .state
                        .hold(clock::now_ms(), limits.worker_refusal_hold_ms);
                }
                excluded.refused(pos);
                refused = Some(RequestError::Refused(r, why));
                continue;
            }
            Err(e) => return Err(NotOpened::Ended(e)),
        };
        let sent = connect_and_send(ctx, worker, &mut ex.io.to_worker, limits).await;
        let stream = match sent {
            Ok(sent) => sent.stream,
            Err(e) => {
                count_outcome(ctx, (snap, pool), worker, &Err(e));
                excluded.failed(pos);
                continue;
            }
        };
        let cells = &pool.metrics.cores[ctx.id];
        let (tokens, cached) = (ex.req.prompt_tokens, picked.cached_tokens);
        return Ok(Prefilling {
            snap,
            pool,
            worker,
            index: pool.members[pos].worker as usize,
            stream: Some(stream),
            cells,
            endpoint: ex.req.endpoint,
            started: clock::now(),
            outcome: Outcome::Cancelled,
            tracked: Tracked::start(&worker.state, ctx.id, tokens, cached, worker.cfg.block_size),
            _slot: slot,
            _on: on,
            _inflight: Inflight::start(cells),
        });
    }
    Err(refused.map_or(NotOpened::Fallback, NotOpened::Answer))
}

/// The pick found no prefill worker: every one busy or refusing is the pool's answer
/// (the last refusal, when workers refused it); none available, a fallback.
fn unpicked(answer: RequestError, refused: Option<RequestError>) -> NotOpened {
    match (answer, refused) {
        (RequestError::Unavailable, None) => NotOpened::Fallback,
        (answer, refused) => NotOpened::Answer(refused.unwrap_or(answer)),
    }
}

/// Runs the decode side's `decode` and the prefill side's `prefill` together; returns the
/// decode side's result. When the decode side ends first, the prefill side has
/// [`PREFILL_GRACE`] more if the decode side's answer was `whole`, else it is dropped
/// (its connection closes, which cancels it at the worker).
pub(super) async fn alongside<T>(
    decode: impl Future<Output = T>,
    prefill: impl Future<Output = ()>,
    whole: impl Fn(&T) -> bool,
) -> T {
    let mut decode = std::pin::pin!(decode);
    let mut prefill = std::pin::pin!(prefill);
    monoio::select! {
        t = &mut decode => {
            if whole(&t) {
                let _ = monoio::time::timeout(PREFILL_GRACE, prefill).await;
            }
            t
        }
        () = &mut prefill => decode.await,
    }
}

/// Reads the prefill worker's answer to its end and drops it (into `buf`, a spare
/// connection buffer); counts its outcome for the worker's health and the pool's
/// metrics, and pools the connection when it can be reused.
pub(super) async fn drain(ctx: &CoreCtx, mut p: Prefilling<'_>, buf: &mut Vec<u8>) {
    let limits = &p.snap.config.limits;
    let answered = read_answer(&mut p, buf, limits).await;
    if answered.is_ok() {
        // Its one token (SGLang's prefill side stops there): the prefill is done.
        let took = clock::since(p.started);
        p.tracked.first_byte(took);
        p.cells.ttft.observe(&TTFT_BUCKETS, took.as_secs_f64());
    }
    let result = answered.map(|(status, _)| Done {
        keep_alive: false,
        status,
    });
    count_outcome(ctx, (p.snap, p.pool), p.worker, &result);
    let overload = p.snap.config.overload_status_code;
    p.outcome = match result {
        Ok(done) => Outcome::of_status(done.status, overload),
        Err(e) => e.outcome(),
    };
    buf.clear();
    if let Ok((_, true)) = answered {
        let (slot, max_idle) = (p.worker.state.slot, limits.pool_max_idle_per_worker);
        if let Some(stream) = p.stream.take() {
            let stirred = (ctx.pools.borrow_mut()).put(slot, stream, clock::now_ms(), max_idle);
            add(&ctx.counters().upstream_idle_closed, u64::from(stirred));
        }
    }
}

/// The answer's status and whether its connection can be reused. The head must come
/// within `upstream_first_byte_timeout_ms`, the body's reads within
/// `upstream_stream_idle_timeout_ms` of each other.
async fn read_answer(
    p: &mut Prefilling<'_>,
    buf: &mut Vec<u8>,
    limits: &Limits,
) -> Result<(u16, bool), AttemptError> {
    buf.clear();
    let first_byte = Duration::from_millis(limits.upstream_first_byte_timeout_ms);
    let deadline = clock::now() + first_byte;
    let mut resp = ResponseHead::default();
    let Some(stream) = p.stream.as_mut() else {
        return Err(AttemptError::Hangup);
    };
    loop {
        match parse_response(buf, limits.max_header_bytes, false, &mut resp) {
            Ok(true) if resp.status >= 200 => break,
            Ok(true) => drop(buf.drain(..resp.head_len)),
            Ok(false) => {}
            Err(_) => return Err(AttemptError::BadGateway(BAD_ANSWER)),
        }
        if read_some(stream, buf, deadline).await? == 0 {
            return Err(AttemptError::Hangup);
        }
    }
    buf.drain(..resp.head_len);
    let idle = Duration::from_millis(limits.upstream_stream_idle_timeout_ms);
    let framing = resp.framing();
    let mut left = match framing {
        BodyFraming::Length(n) => n,
        _ => 0,
    };
    let mut chunks = ChunkedParser::new();
    loop {
        let done = match framing {
            BodyFraming::None => true,
            BodyFraming::Length(_) => {
                left = left.saturating_sub(buf.len() as u64);
                buf.clear();
                left == 0
            }
            BodyFraming::Chunked => {
                let skimmed = chunks.skim(buf, |_| {});
                let (used, done) = skimmed.map_err(|_| AttemptError::BadGateway(BAD_ANSWER))?;
                buf.drain(..used);
                done
            }
            BodyFraming::UntilClose => false,
        };
        if done {
            return Ok((resp.status, resp.reusable && buf.is_empty()));
        }
        match read_some(stream, buf, clock::now() + idle).await? {
            0 if framing == BodyFraming::UntilClose => return Ok((resp.status, false)),
            0 => return Err(AttemptError::Hangup),
            _ => {}
        }
    }
}

const BAD_ANSWER: &str = "the prefill worker's answer could not be read";

/// One read appended to `buf` before `deadline`: the bytes read (0: the worker closed).
async fn read_some(
    stream: &mut Upstream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<usize, AttemptError> {
    if buf.capacity() - buf.len() < RESPONSE_READ_MIN_SPARE {
        buf.reserve(RESPONSE_READ_BUF);
    }
    let left = deadline.saturating_duration_since(clock::now());
    let read = monoio::time::timeout(left, stream.read_into(std::mem::take(buf))).await;
    match read {
        Ok((Ok(n), b)) => {
            *buf = b;
            Ok(n)
        }
        Ok((Err(_), b)) => {
            *buf = b;
            Err(AttemptError::Hangup)
        }
        Err(_) => Err(AttemptError::Stalled),
    }
}
