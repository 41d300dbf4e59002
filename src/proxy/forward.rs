//! Stage: forward one request to a worker of its model. Pick a worker, attempt it; when
//! the attempt fails in a retry-safe way, try another: a connect failure fails over (the
//! worker is marked down), a worker-local refusal migrates (up to `migration_limit`,
//! never back to a worker that refused). Counts the outcome once at the end.

use super::attempt::{Done, attempt};
use super::core::CoreCtx;
use super::error::{AttemptError, Refusal, RequestError};
use super::exchange::{Exchange, Outbound};
use super::guards::{InStage, Inflight};
use super::log::ClosedBy;
use super::pick::{Excluded, pick};
use crate::http::limits::{INITIAL_READ_BUF, MAX_WORKER_ID_LEN};
use crate::route::RouterMode;
use crate::runtime::clock;
use crate::shed::{Knob, Why};
use crate::state::Worker;
use crate::state::counters::{DURATION_BUCKETS, ISL_BUCKETS, Outcome, Stage, add};

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

/// Forwards one request. On return its bytes are consumed from the client buffer.
pub(super) async fn forward(ctx: &CoreCtx, ex: &mut Exchange<'_, '_>) -> Forwarded {
    let req = &ex.req;
    let cells = &req.model.metrics.cores[ctx.id];
    cells.classed(req.class);
    cells.isl.observe_count(&ISL_BUCKETS, req.prompt_tokens);
    let inflight = Inflight::start(cells);
    let mut stage = InStage::enter(cells, Stage::Route);
    let result = attempts(ctx, ex, &mut stage).await;
    drop(stage);
    drop(inflight);
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

/// One log line per refusal, at most once a second per knob on each core.
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
struct Tries {
    excluded: Excluded,
    migrations: u32,
    /// The last worker-local refusal that was not a 503, and its figures.
    last_refusal: Option<(Refusal, Option<Why>)>,
    /// `dynamo_frontend_cached_tokens` takes the first `kv` pick only.
    cached_observed: bool,
}

/// Picks and attempts workers until one answers, or none may take the request.
async fn attempts(ctx: &CoreCtx, ex: &mut Exchange<'_, '_>, stage: &mut InStage<'_>) -> Forwarded {
    let worker_id = detach(ex);
    let (snap, model) = (ex.req.snap, ex.req.model);
    let mut tries = Tries::default();
    loop {
        stage.set(Some(Stage::Route));
        let now = clock::now_ms();
        let (id, excluded) = (worker_id.get(), tries.excluded);
        let picked = match pick(ctx, &ex.req, id, ex.prompt(), excluded, now) {
            Ok(p) => p,
            // Refused by every worker tried, and nothing left: say why they refused.
            Err(RequestError::Overloaded(_) | RequestError::Refused(..))
                if tries.last_refusal.is_some() =>
            {
                let (last, why) = tries.last_refusal.unwrap_or((Refusal::AtCapacity, None));
                return Forwarded::Local(RequestError::Refused(last, why));
            }
            Err(e) => return Forwarded::Local(e),
        };
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
        let e = match attempt(ctx, ex, worker, picked.cached_tokens, stage).await {
            Ok(Done { keep_alive, status }) => return Forwarded::Done { keep_alive, status },
            Err(e) if !e.another_worker_may_try() => {
                if e.to_client().is_none() {
                    ex.trail.closed = Some(match e {
                        AttemptError::ClientGone | AttemptError::ClientSendTimeout => {
                            ClosedBy::Client
                        }
                        _ => ClosedBy::Worker,
                    });
                }
                if e == AttemptError::ClientGone {
                    add(&ctx.counters().client_disconnects, 1);
                }
                return e.into();
            }
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

/// Marks a worker that refused the request and decides whether the request may move:
/// `Some(answer)` when it may not (limit spent, or direct routing).
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
    match refusal {
        Refusal::UpstreamUnavailable => worker.state.inhibit(now, limits.worker_down_backoff_ms),
        // A class's share says nothing of the worker: other classes keep using it.
        _ if why.is_some_and(|w| w.knob == Knob::ClassShare) => {}
        _ => worker.state.hold(now, limits.worker_refusal_hold_ms),
    }
    let migrations = tries.migrations;
    tracing::debug!(worker = %worker.cfg.name, ?refusal, migrations, "worker refused the request");
    if migrations >= req.snap.config.migration_limit || req.model.router_mode == RouterMode::Direct
    {
        return Some(refusal.to_client(why));
    }
    req.model.metrics.cores[ctx.id].migrated(refusal.reason());
    None
}
