//! One attempt on one worker, in stage order: admit at its gate → connect or reuse and
//! send → read the response head (once more on a fresh connection when a reused one was
//! closed before any byte) → (a refusal ends the attempt here, and so does a 5xx when
//! another worker may retry it) → relay the body (or, for stage 1 of a disaggregated
//! request, collect it) → give the connection back to the pool, watched. Guards give back the slot and the tracked load on every path.

use super::admit::{Budget, Slot, admit};
use super::collect::collect;
use super::connect::{connect_and_send, retry_fresh};
use super::core::CoreCtx;
use super::error::AttemptError;
use super::exchange::Exchange;
use super::guards::{InStage, OnWorker, Tracked};
use super::relay::relay;
use super::response::{HungWatch, failed, read_response_head, refusal};
use crate::http::response::ResponseHead;
use crate::http::write::ClientFraming;
use crate::runtime::clock;
use crate::state::counters::{Stage, add};
use crate::state::{Model, Snapshot, Worker};

/// A response relayed whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Done {
    pub keep_alive: bool,
    pub status: u16,
}

/// One attempt, on the slot `held` when the request already has one (from the model's
/// waiting room), else after admission at the worker's gate. `may_retry` (asked only on a
/// 5xx head): the head is dropped for a retry elsewhere rather than relayed.
pub(super) async fn attempt(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, '_>,
    (worker, held): (&Worker, Option<Slot<'_>>),
    cached_tokens: u64,
    stage: &mut InStage<'_>,
    may_retry: impl Fn() -> bool,
) -> Result<Done, AttemptError> {
    let _on_worker = OnWorker::start(&worker.state, ctx.id);
    let limits = &ex.req.snap.config.limits;
    let ticket = match held {
        Some(slot) => slot,
        None => gate(ctx, ex, worker).await?,
    };
    let mut sent = connect_and_send(ctx, worker, &mut ex.io.to_worker, limits).await?;
    stage.set(Some(Stage::Dispatch));
    let block_size = worker.cfg.block_size;
    let mut tracked = Tracked::start(
        &worker.state,
        ctx.id,
        ex.req.prompt_tokens,
        cached_tokens,
        block_size,
    );
    let mut resp = ResponseHead::default();
    let model = ex.req.model;
    let hung = (model.stall_check_ms).map(|ms| HungWatch::new(ctx, worker, model.id, ms));
    match read_response_head(ex, &mut sent.stream, limits, &mut resp, hung.as_ref()).await {
        // The worker had closed the pooled connection: once more, on a fresh one.
        Err(AttemptError::Hangup) if sent.reused => {
            let why = "closed before responding";
            sent = retry_fresh(ctx, worker, &mut ex.io.to_worker, limits, why).await?;
            read_response_head(ex, &mut sent.stream, limits, &mut resp, hung.as_ref()).await?;
        }
        head => head?,
    }
    stage.set(None);
    if hung.is_some() {
        let answered = &worker.state.tracked[ctx.id].answered_ms;
        answered.store(clock::now_ms(), std::sync::atomic::Ordering::Relaxed);
    }
    let overload = ex.req.snap.config.overload_status_code;
    if let Some(r) = refusal(resp.status, overload) {
        return Err(AttemptError::Refused(r, None));
    }
    if failed(resp.status, overload) && may_retry() {
        return Err(AttemptError::WorkerFailed(resp.status));
    }
    let cells = &ex.req.model.metrics.cores[ctx.id];
    let mut stream = sent.stream;
    let reusable = if ex.collect {
        collect(ex, cells, &mut stream, &resp, &mut tracked, limits).await?
    } else {
        relay(ex, cells, &mut stream, &resp, &mut tracked, limits).await?
    };
    drop(tracked);
    drop(ticket);
    if reusable {
        let (slot, max_idle) = (worker.state.slot, limits.pool_max_idle_per_worker);
        let stirred = (ctx.pools.borrow_mut()).put(slot, stream, clock::now_ms(), max_idle);
        add(&ctx.counters().upstream_idle_closed, u64::from(stirred));
    }
    let framing = ClientFraming::for_response(resp.framing(), ex.req.client_minor);
    Ok(Done {
        keep_alive: ex.req.client_keep_alive && framing.allows_keep_alive(),
        status: resp.status,
    })
}

/// Admission at the worker's gate, timed for the log line.
async fn gate<'w>(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, '_>,
    worker: &'w Worker,
) -> Result<Slot<'w>, AttemptError> {
    let waited = clock::now();
    // The adaptive mode cuts queue waits short while the model is overloaded.
    let cap_ms = || ctx.busy.borrow_mut().load().queue_cap_ms(ex.req.model.id);
    let budget = (ex.req.budget_ms).map(|ms| Budget {
        from: ex.req.started,
        ms,
    });
    let slot = admit(worker, ex.req.class, cap_ms, budget, &mut ex.reader).await;
    ex.trail.queue += clock::since(waited);
    slot
}

/// Counts an attempt's outcome for its worker's health: a 5xx that is no refusal and
/// the worker's failures count against it, successes for it; refusals and the client's
/// doing count for nothing.
pub(super) fn count_outcome(
    ctx: &CoreCtx,
    (snap, model): (&Snapshot, &Model),
    worker: &Worker,
    result: &Result<Done, AttemptError>,
) {
    let overload = snap.config.overload_status_code;
    let failure = match result {
        Ok(done) => failed(done.status, overload).then_some(false),
        Err(e) => e.failure(),
    };
    let in_a_row = worker.state.outcome(ctx.id, failure);
    if failure.is_some() {
        ctx.note_failure(worker.state.slot as usize, clock::now_ms());
        let outlier = &snap.config.outlier;
        if outlier.enabled && in_a_row >= outlier.consecutive_failures.max(1) {
            out_at_once(ctx, snap, model, worker);
        }
    }
}

/// Failures in a row reached the threshold: out of rotation at once, without waiting for
/// the monitor's pass (which ejects it, or says no and puts it back), unless that would
/// leave `model` fewer than its healthy share by what this core sees.
#[cold]
#[inline(never)]
fn out_at_once(ctx: &CoreCtx, snap: &Snapshot, model: &Model, worker: &Worker) {
    if worker.state.is_provisional() {
        return;
    }
    let busy = &mut ctx.busy.borrow_mut();
    let busy = busy.load();
    let out = (model.members.iter())
        .map(|m| &snap.workers[m.worker as usize].state)
        .filter(|w| w.is_provisional() || busy.is_unhealthy(w.slot))
        .count();
    let allowed =
        crate::health::max_ejected(model.members.len(), snap.config.outlier.min_healthy_percent);
    if out < allowed && !busy.is_unhealthy(worker.state.slot) {
        worker.state.set_provisional();
    }
}
