//! Stage: forward one request to a worker of its model. Pick a worker, attempt it; when
//! the attempt fails in a retry-safe way, try another: a connect failure fails over (the
//! worker is marked down), a worker-local refusal migrates, a worker's failure before
//! any response byte reached the client retries within the model's retry budget (both
//! up to `migration_limit`, never back to a worker that refused or failed). Each
//! attempt's outcome is counted for its worker's health; the request's once at the end.
//!
//! The helpers of the rare paths (a refusal, a retry, a failure's end, the health fast
//! path) are `#[cold]` and never inlined: inlined, they sat inside the connection's state
//! machine, among the common path's instructions, and cost about 3 % CPU per request in
//! instruction-cache misses (bench/README.md, `bench/results/proxy-cachesim-27.md`).

use std::time::Duration;

use super::attempt::{Done, attempt, count_outcome};
use super::bootstrap::{NotOpened, Prefilling, alongside, drain, open};
use super::core::CoreCtx;
use super::error::{AttemptError, Refusal, RequestError};
use super::exchange::{Exchange, Outbound};
use super::guards::{InStage, Inflight, RetryPlace};
use super::log::ClosedBy;
use super::pick::{Excluded, Unpicked, bound, foresee, pick};
use super::room::{Stay, Unbound, bind, first_pick};
use super::stages::{client_request, decode_request, keep_client_request, prefill_request};
use crate::config::{Handoff, PoolRole};
use crate::http::limits::{INITIAL_READ_BUF, MAX_WORKER_ID_LEN};
use crate::route::RouterMode;
use crate::route::handoff::Handed;
use crate::runtime::clock;
use crate::shed::{Knob, Why};
use crate::state::counters::{
    DURATION_BUCKETS, ISL_BUCKETS, ModelCore, Outcome, RequestType, RetryReason, Stage,
    TTFT_BUCKETS, add,
};
use crate::state::{Disaggregated, Model, Snapshot, Worker};

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Forwarded {
    /// The whole response reached the client.
    Done { keep_alive: bool, status: u16 },
    /// Nothing reached the client; answer it locally.
    Local(RequestError),
    /// The client left, or the response broke after bytes were sent: close.
    Aborted(Outcome),
}

impl From<AttemptError> for Forwarded {
    fn from(e: AttemptError) -> Forwarded {
        match e.to_client() {
            Some(answer) => Forwarded::Local(answer),
            None => Forwarded::Aborted(e.outcome()),
        }
    }
}

/// Forwards one request. On return its bytes are consumed from the client buffer. A
/// disaggregated model's request runs its prefill stage first (docs/behaviour.md §23).
pub(super) async fn forward(ctx: &CoreCtx, ex: &mut Exchange<'_, '_>) -> Forwarded {
    let worker_id = detach(ex);
    let mut counted = Counted::start(ctx, &ex.req);
    let result = match ex.req.model.disagg {
        None => attempts(ctx, ex, &mut counted.stage, worker_id.get()).await,
        Some(d) => disaggregated(ctx, ex, &mut counted, d, worker_id.get()).await,
    };
    counted.finish(ctx, ex, result)
}

/// A disaggregated model's request: its prefill stage, then the attempts on the model's
/// own workers (its decode pool) with what that stage left them.
async fn disaggregated(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, '_>,
    counted: &mut Counted<'_>,
    d: Disaggregated,
    id: Option<&[u8]>,
) -> Forwarded {
    match prefill(ctx, ex, d).await {
        Ok(staged) => decode(ctx, ex, counted, staged, id).await,
        Err(answer) => answer,
    }
}

/// What the attempts on the model's own workers (a disaggregated model's decode pool)
/// start with. It lives in the request's future, never on the heap: boxing the large
/// variant would allocate per request.
#[allow(clippy::large_enum_variant)]
enum Staged<'s> {
    /// Its request in `to_worker`, nothing else under way.
    Ready,
    /// vLLM's stage 1 handed the KV cache off; it ended this long after the request began.
    Handed(Duration),
    /// SGLang's prefill side, sent: drained alongside the decode side.
    Alongside(Prefilling<'s>),
}

/// The attempts on the model's own workers, with what stage 1 left them.
async fn decode(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, '_>,
    counted: &mut Counted<'_>,
    staged: Staged<'_>,
    id: Option<&[u8]>,
) -> Forwarded {
    let stage = &mut counted.stage;
    match staged {
        Staged::Ready => attempts(ctx, ex, stage, id).await,
        Staged::Handed(at) => {
            let result = attempts(ctx, ex, stage, id).await;
            if let Some(ttft) = ex.trail.ttft {
                let secs = ttft.saturating_sub(at).as_secs_f64();
                counted.cells.handoff_ttft.observe(&TTFT_BUCKETS, secs);
            }
            result
        }
        Staged::Alongside(prefilling) => {
            let mut buf = std::mem::take(&mut ex.io.kept);
            let whole = |r: &Forwarded| matches!(r, Forwarded::Done { .. });
            let decoded = attempts(ctx, ex, stage, id);
            let result = alongside(decoded, drain(ctx, prefilling, &mut buf), whole).await;
            ex.io.kept = buf;
            result
        }
    }
}

/// A request counted on its model's cells (a disaggregated request's stage 1, on its
/// prefill pool's): its class, its prompt's size, in flight, its tenant's, its stage; its
/// outcome once, at [`Counted::finish`].
struct Counted<'m> {
    cells: &'m ModelCore,
    _inflight: Inflight<'m>,
    _of_tenant: Option<crate::admission::Counted<'m>>,
    stage: InStage<'m>,
}

impl<'m> Counted<'m> {
    fn start(ctx: &CoreCtx, req: &Outbound<'m>) -> Counted<'m> {
        let model: &'m Model = req.model;
        let cells = &model.metrics.cores[ctx.id];
        cells.classed(req.class);
        cells.isl.observe_count(&ISL_BUCKETS, req.prompt_tokens);
        Counted {
            cells,
            _inflight: Inflight::start(cells),
            _of_tenant: model.tenants.as_deref().map(|t| t.enter(req.tenant)),
            stage: InStage::enter(cells, Stage::Route),
        }
    }

    fn finish(self, ctx: &CoreCtx, ex: &Exchange<'_, '_>, result: Forwarded) -> Forwarded {
        let cells = self.cells;
        drop(self);
        let req = &ex.req;
        let outcome = match result {
            Forwarded::Done { status, .. } => {
                Outcome::of_status(status, req.snap.config.overload_status_code)
            }
            Forwarded::Local(e) => {
                if e.answers_overloaded() {
                    cells.rejected(req.endpoint);
                }
                if let Some(knob) = e.knob() {
                    cells.refused(knob, req.class);
                    log_refusal(ctx, req, &e, knob, ex.request_id);
                }
                e.outcome()
            }
            Forwarded::Aborted(o) => o,
        };
        cells.request_done(req.endpoint, req.request_type, outcome);
        if !matches!(result, Forwarded::Local(_)) {
            let secs = clock::since(req.started).as_secs_f64();
            cells.duration.observe(&DURATION_BUCKETS, secs);
        }
        result
    }
}

/// Stage 1 of a disaggregated request, unless the decode pool would refuse it anyway (then
/// its answer is the client's), or its prompt is short enough (uncached) to prefill where
/// it decodes. Err: the client's answer.
async fn prefill<'s>(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, 's>,
    d: Disaggregated,
) -> Result<Staged<'s>, Forwarded> {
    let (front, pool) = (ex.req.model, ex.req.snap.prefill_pool(&d));
    let Some(pool) = pool.filter(|_| front.router_mode != RouterMode::Direct) else {
        return Ok(Staged::Ready);
    };
    let now = clock::now_ms();
    let cached = match foresee(ctx, &ex.req, ex.prompt(), now) {
        Ok(cached) => cached,
        // No decode worker would take it: no prefill for nothing (a room waits for one).
        Err(none) if front.room.is_none() => return Err(unpicked(none, &Tries::default())),
        Err(_) => 0,
    };
    let uncached = ex.req.prompt_tokens.saturating_sub(cached);
    if uncached < d.max_local_prefill_tokens {
        front.metrics.cores[ctx.id].handed(Handed::Local);
        return Ok(Staged::Ready);
    }
    match d.handoff {
        Handoff::Vllm => vllm(ctx, ex, pool).await,
        Handoff::Sglang => sglang(ctx, ex, pool).await,
    }
}

/// vLLM's stage 1: the prefill pool answers a one-token, non-streaming copy of the
/// request (collected, not relayed), and stage 2's request carries that answer's
/// `kv_transfer_params`. A busy prefill pool answers the client; one that fails the
/// request leaves stage 2 the client's own request.
async fn vllm<'s>(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, 's>,
    pool: &'s Model,
) -> Result<Staged<'s>, Forwarded> {
    let front = ex.req.model;
    let cells = &front.metrics.cores[ctx.id];
    if !prefill_request(ex) {
        cells.handed(Handed::Local);
        return Ok(Staged::Ready);
    }
    let request_type = ex.req.request_type;
    (ex.req.model, ex.req.request_type, ex.collect) = (pool, RequestType::Unary, true);
    let mut counted = Counted::start(ctx, &ex.req);
    let result = attempts(ctx, ex, &mut counted.stage, None).await;
    let result = counted.finish(ctx, ex, result);
    (ex.req.model, ex.req.request_type, ex.collect) = (front, request_type, false);
    ex.trail.prefill_worker = ex.trail.worker.take();
    ex.before_worker = clock::since(ex.req.started);
    let handed = match result {
        Forwarded::Done { status, .. } if (200..300).contains(&status) => decode_request(ex),
        // Every prefill worker busy or refusing: the prefill pool's answer. None
        // available (or all failing): the decode worker prefills it.
        Forwarded::Local(e) if e.client_may_retry() && e != RequestError::Unavailable => {
            ex.trail.pool = Some(PoolRole::Prefill);
            return Err(Forwarded::Local(e));
        }
        Forwarded::Aborted(o) => return Err(Forwarded::Aborted(o)),
        Forwarded::Done { .. } | Forwarded::Local(_) => client_request(ex),
    };
    cells.handed(handed);
    Ok(match handed {
        Handed::Remote => Staged::Handed(ex.before_worker),
        _ => Staged::Ready,
    })
}

/// SGLang's handoff: a prefill worker gets the request with its bootstrap fields now, and
/// the decode side's attempts send the same one. A busy prefill pool answers the client;
/// none available leaves the decode worker the client's own request.
async fn sglang<'s>(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, 's>,
    pool: &'s Model,
) -> Result<Staged<'s>, Forwarded> {
    let cells = &ex.req.model.metrics.cores[ctx.id];
    keep_client_request(ex);
    match open(ctx, ex, pool).await {
        Ok(prefilling) => {
            ex.trail.prefill_worker = Some(prefilling.index);
            cells.handed(Handed::Remote);
            Ok(Staged::Alongside(prefilling))
        }
        Err(NotOpened::Answer(e)) => {
            let pool_cells = &pool.metrics.cores[ctx.id];
            if e.answers_overloaded() {
                pool_cells.rejected(ex.req.endpoint);
            }
            if let Some(knob) = e.knob() {
                pool_cells.refused(knob, ex.req.class);
            }
            pool_cells.request_done(ex.req.endpoint, RequestType::Unary, e.outcome());
            ex.trail.pool = Some(PoolRole::Prefill);
            Err(Forwarded::Local(e))
        }
        Err(NotOpened::Ended(e)) => Err(ended(ctx, ex, e)),
        Err(NotOpened::Fallback) => {
            client_request(ex);
            cells.handed(Handed::Fallback);
            Ok(Staged::Ready)
        }
    }
}

/// One log line per refusal, at most once a second per knob on each core.
#[cold]
#[inline(never)]
fn log_refusal(ctx: &CoreCtx, req: &Outbound<'_>, e: &RequestError, knob: Knob, rid: &[u8]) {
    if !ctx.may_log_refusal(knob, clock::now_ms()) {
        return;
    }
    let why = e.why();
    tracing::warn!(
        model = %req.model.name,
        knob = knob.label(),
        class = req.class.label(),
        value = why.map(|w| w.value),
        threshold = why.map(|w| w.threshold),
        setting = knob.setting(),
        status = e.status(req.snap.config.overload_status_code),
        request_id = std::str::from_utf8(rid).unwrap_or("-"),
        "request refused (this knob is logged at most once a second per core)"
    );
}

/// The `x-worker-id` of a direct-routed request, copied out of the client buffer.
struct WorkerId {
    text: [u8; MAX_WORKER_ID_LEN],
    len: Option<usize>,
}

impl WorkerId {
    fn get(&self) -> Option<&[u8]> {
        self.len.map(|n| &self.text[..n])
    }
}

/// Detaches the request from the client buffer: the body joins the head in `to_worker`
/// (one write per attempt, kept for migration; the prompt's place in it is kept), the
/// direct-mode worker id is copied, and the client's bytes are consumed so its socket
/// can be watched from here on.
fn detach(ex: &mut Exchange<'_, '_>) -> WorkerId {
    let req = &ex.req;
    let buf = ex.reader.buf();
    let body_at = ex.io.to_worker.len();
    (ex.io.to_worker).extend_from_slice(buf.get(req.body.clone()).unwrap_or_default());
    ex.prompt_at = body_at + req.prompt.start..body_at + req.prompt.end;
    let mut id = WorkerId {
        text: [0; MAX_WORKER_ID_LEN],
        len: None,
    };
    let value = req.worker_id.clone().and_then(|r| buf.get(r));
    if let Some(v) = value.filter(|v| v.len() <= MAX_WORKER_ID_LEN) {
        id.text[..v.len()].copy_from_slice(v);
        id.len = Some(v.len());
    }
    let request_end = req.request_end;
    ex.reader.as_mut().consume(request_end, INITIAL_READ_BUF);
    ex.reader.as_mut().watch();
    id
}

/// Where a request stands after the attempts so far.
#[derive(Default)]
struct Tries<'m> {
    excluded: Excluded,
    /// Migrations and retries so far (`migration_limit` bounds both).
    migrations: u32,
    /// The last worker-local refusal that was not a 503, and its figures.
    last_refusal: Option<(Refusal, Option<Why>)>,
    /// `dynamo_frontend_cached_tokens` takes the first `kv` pick only.
    cached_observed: bool,
    /// The place in the model's retry budget, from the first retry on.
    retry: Option<RetryPlace<'m>>,
    /// The last failure retried: the client's answer when no worker is left to try.
    last_failure: Option<AttemptError>,
    /// Its time in the model's waiting room so far.
    stay: Stay,
}

impl Tries<'_> {
    /// Whether the request may (still) wait in its model's room: no worker refused it
    /// and none failed once it had it (a connect failure sent nothing: it may).
    fn may_wait(&self) -> bool {
        !self.excluded.any_refused() && self.last_failure.is_none()
    }

    /// Whether the request may still move to another worker: `migration_limit` (for
    /// migrations and retries together) not spent, and not direct routing.
    fn may_move(&self, snap: &Snapshot, model: &Model) -> bool {
        self.migrations < snap.config.migration_limit && model.router_mode != RouterMode::Direct
    }

    /// Whether a failed attempt could be retried: it may move, and the budget has room
    /// (or a place is held already). No room is counted on `cells`.
    fn may_retry(&self, snap: &Snapshot, model: &Model, cells: &ModelCore) -> bool {
        if !self.may_move(snap, model) {
            return false;
        }
        let (running, allowed) = budget(snap, model);
        let room =
            self.retry.is_some() || running.load(std::sync::atomic::Ordering::Relaxed) < allowed;
        if !room {
            cells.retry_refused();
        }
        room
    }
}

/// The model's retry budget: the retries running now, and how many may run at once.
fn budget<'m>(snap: &Snapshot, model: &'m Model) -> (&'m std::sync::atomic::AtomicU64, u64) {
    let allowed = snap.config.retry_budget.allowed(model.metrics.inflight());
    (&model.metrics.retries_running, allowed)
}

/// Picks and attempts workers of the request's model until one answers, or none may take
/// the request.
async fn attempts(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, '_>,
    stage: &mut InStage<'_>,
    id: Option<&[u8]>,
) -> Forwarded {
    let (snap, model) = (ex.req.snap, ex.req.model);
    let mut tries = Tries::default();
    loop {
        stage.set(Some(Stage::Route));
        let now = clock::now_ms();
        let excluded = tries.excluded;
        // A model's waiting room takes a request that no worker refused and none failed
        // once it had it: it may wait there for any worker.
        let room = model.room.as_ref().filter(|_| tries.may_wait());
        let (picked, held) = match room {
            None => match pick(ctx, &ex.req, id, ex.prompt(), excluded, now) {
                Ok(picked) => (picked, None),
                Err(none) => return unpicked(none, &tries),
            },
            Some(room) => {
                let first = first_pick(ctx, &ex.req, (id, ex.prompt()), excluded, now);
                match bind(ctx, ex, first, room, &mut tries.stay).await {
                    Ok(bound) => (bound.picked, Some(bound.slot)),
                    Err(Unbound::Unpicked(none)) => return unpicked(none, &tries),
                    Err(Unbound::Ended(e)) => return ended(ctx, ex, e),
                }
            }
        };
        bound(ctx, &ex.req, ex.prompt(), &picked, now);
        let pos = picked.member;
        if model.kv.is_some() && !tries.cached_observed {
            tries.cached_observed = true;
            let cells = &model.metrics.cores[ctx.id];
            cells
                .cached_tokens
                .observe_count(&ISL_BUCKETS, picked.cached_tokens);
        }
        let worker = &snap.workers[model.members[pos].worker as usize];
        ex.trail.worker = Some(model.members[pos].worker as usize);
        let cells = &model.metrics.cores[ctx.id];
        let may_retry = || tries.may_retry(snap, model, cells);
        let on = (worker, held);
        let result = attempt(ctx, ex, on, picked.cached_tokens, stage, may_retry).await;
        count_outcome(ctx, (snap, model), worker, &result);
        let e = match result {
            Ok(Done { keep_alive, status }) => return Forwarded::Done { keep_alive, status },
            Err(e) if e.retry_reason().is_some() && retry(ctx, &ex.req, &e, &mut tries) => {
                tries.excluded.failed(pos);
                tries.last_failure = Some(e);
                ex.trail.migrations = tries.migrations;
                continue;
            }
            Err(e) if !e.another_worker_may_try() => return ended(ctx, ex, e),
            Err(e) => e,
        };
        match e {
            AttemptError::Refused(refusal, why) => {
                if let Some(last) = refused(ctx, &ex.req, worker, refusal, why, &tries) {
                    return Forwarded::Local(last);
                }
                tries.migrations += 1;
                ex.trail.migrations = tries.migrations;
                tries.excluded.refused(pos);
                if refusal != Refusal::UpstreamUnavailable {
                    tries.last_refusal = Some((refusal, why));
                }
            }
            _ => {
                tries.excluded.failed(pos);
                add(&ctx.counters().failovers, 1);
            }
        }
    }
}

/// No worker is left to pick: the client's answer. Refused by every worker tried: why
/// they refused. Failed by every worker that could take it: the last failure. Else the
/// pick's own answer (counted at the held worker it names, if any).
#[cold]
#[inline(never)]
fn unpicked(none: Unpicked<'_>, tries: &Tries) -> Forwarded {
    match none.answer {
        RequestError::Overloaded(_) | RequestError::Refused(..) if tries.last_refusal.is_some() => {
            let (last, why) = tries.last_refusal.unwrap_or((Refusal::AtCapacity, None));
            Forwarded::Local(RequestError::Refused(last, why))
        }
        _ if tries.last_failure.is_some() => {
            let last = tries.last_failure.unwrap_or(AttemptError::Stalled);
            last.into()
        }
        _ => Forwarded::Local(none.answered()),
    }
}

/// The last attempt failed and nobody else may try: who closed, and the answer.
#[cold]
#[inline(never)]
fn ended(ctx: &CoreCtx, ex: &mut Exchange<'_, '_>, e: AttemptError) -> Forwarded {
    if e.to_client().is_none() {
        ex.trail.closed = Some(match e {
            AttemptError::ClientGone | AttemptError::ClientSendTimeout => ClosedBy::Client,
            _ => ClosedBy::Worker,
        });
    }
    if e == AttemptError::ClientGone {
        add(&ctx.counters().client_disconnects, 1);
    }
    e.into()
}

/// Decides whether a failed attempt is retried on another worker: within the limit and
/// the model's retry budget (docs/behaviour.md §22.5), which a wait given up on a hung
/// worker does not need. Counts it either way.
#[cold]
#[inline(never)]
fn retry<'m>(ctx: &CoreCtx, req: &Outbound<'m>, e: &AttemptError, tries: &mut Tries<'m>) -> bool {
    let reason = e.retry_reason().unwrap_or(RetryReason::Malformed);
    let (snap, model) = (req.snap, req.model);
    let cells = &model.metrics.cores[ctx.id];
    if !tries.may_move(snap, model) {
        return false;
    }
    // A wait given up on a hung worker adds no load: the hung worker does none of it.
    if tries.retry.is_none() && reason != RetryReason::Stalled {
        let (running, allowed) = budget(snap, model);
        tries.retry = RetryPlace::take(running, allowed);
        if tries.retry.is_none() {
            cells.retry_refused();
            tracing::debug!(model = %model.name, reason = reason.label(), "retry budget spent: the failure goes to the client");
            return false;
        }
    }
    tries.migrations += 1;
    cells.retried(reason);
    tracing::debug!(model = %model.name, reason = reason.label(), error = e.label(), "attempt failed; retrying on another worker");
    true
}

/// Marks a worker that refused the request and decides whether the request may move:
/// `Some(answer)` when it may not (limit spent, or direct routing).
#[cold]
#[inline(never)]
fn refused(
    ctx: &CoreCtx,
    req: &Outbound<'_>,
    worker: &Worker,
    refusal: Refusal,
    why: Option<Why>,
    tries: &Tries,
) -> Option<RequestError> {
    let limits = &req.snap.config.limits;
    // The attempt may have waited in a queue or for the worker's answer: read the clock.
    let now = clock::now_ms();
    let knob = why.map(|w| w.knob);
    match refusal {
        Refusal::UpstreamUnavailable => worker.state.inhibit(now, limits.worker_down_backoff_ms),
        // A class's share or a client's budget says nothing of the worker: others keep
        // using it.
        _ if matches!(knob, Some(Knob::ClassShare | Knob::Deadline)) => {}
        _ => worker.state.hold(now, limits.worker_refusal_hold_ms),
    }
    let migrations = tries.migrations;
    tracing::debug!(worker = %worker.cfg.name, ?refusal, migrations, "worker refused the request");
    // The client's budget is spent: no other worker can serve it in time.
    if knob == Some(Knob::Deadline) || !tries.may_move(req.snap, req.model) {
        return Some(refusal.to_client(why));
    }
    req.model.metrics.cores[ctx.id].migrated(refusal.reason());
    None
}
