//! Stage: pick a worker. The router (`route::pick`, pure) sees each member's state as
//! this core's busy replica, the prefill this core routed since that replica was
//! published, the workers' shared marks, their health and this request's own failures
//! have it; nothing reachable → 503, only busy ones → the overload status (busy workers
//! still take a light tenant's request). A worker out of rotation by health is
//! unreachable unless its model panics; one waiting for its trial takes the one request
//! that claims it. Recent failures on this core count as requests in flight. The direct
//! and `kv` picks and the cold paths are never inlined (see `forward.rs`). A pick notes
//! nothing: [`bound`] notes the member the request is bound to (the prefill routed there,
//! `kv` mode's prediction), once it has a slot there.

use super::admit::at_capacity;
use super::core::CoreCtx;
use super::error::{Refusal, RequestError};
use super::exchange::Outbound;
use crate::admission::Gate;
use crate::route::{self, DirectRefusal, MemberState, Pick, RouterMode};
use crate::runtime::clock;
use crate::shed::Why;
use crate::state::counters::{KV_HIT_BUCKETS, OVERHEAD_BUCKETS};
use crate::state::{BusySet, KvRouting, WorkerState};

/// Members this request must not use again: `failed` (connect failures, like down) and
/// `refused` (worker-local refusals, like busy). Bit i is member i; pools beyond 128
/// members rely on the shared down marks and refusal holds alone.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Excluded {
    failed: u128,
    refused: u128,
}

fn bit(pos: usize) -> u128 {
    1u128.checked_shl(pos as u32).unwrap_or(0)
}

impl Excluded {
    pub(super) fn failed(&mut self, pos: usize) {
        self.failed |= bit(pos);
    }

    pub(super) fn refused(&mut self, pos: usize) {
        self.refused |= bit(pos);
    }

    pub(super) fn any(&self) -> bool {
        self.failed | self.refused != 0
    }

    pub(super) fn any_refused(&self) -> bool {
        self.refused != 0
    }
}

/// A member picked for an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Picked {
    /// Position in the model's member list.
    pub member: usize,
    /// Prompt tokens predicted cached there (`kv` mode; 0 otherwise): tracked as KV
    /// blocks, not as prefill work.
    pub cached_tokens: u64,
    /// The busy set's generation the pick read: the prefill [`bound`] notes counts until
    /// the next one.
    generation: u64,
    /// `kv` mode: what its decision found, for [`bound`].
    kv: Option<KvNote>,
}

/// A `kv` decision's findings, noted once the request is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KvNote {
    /// The core's decision count when it was made: its scratch still holds the prompt's
    /// hashes while no other decision followed.
    decision: u64,
    chunks: usize,
    overlap: u32,
    blocks: u64,
}

/// Why no member was picked: the client's answer, and the gate of the held worker whose
/// figures a `queue_full` answer carries (docs/behaviour.md §7.5), which counts the
/// refusal once the answer goes to the client.
#[derive(Debug, Clone, Copy)]
pub(super) struct Unpicked<'s> {
    pub answer: RequestError,
    held: Option<&'s Gate>,
}

impl Unpicked<'_> {
    /// The answer, now that it goes to the client: a refusal for a held worker counts
    /// at that worker's gate (`dynamo_rejection_request_total`), as the gate's own do.
    pub(super) fn answered(self) -> RequestError {
        if let Some(gate) = self.held {
            gate.count_refusal();
        }
        self.answer
    }
}

impl From<RequestError> for Unpicked<'_> {
    fn from(answer: RequestError) -> Self {
        Unpicked { answer, held: None }
    }
}

/// Picks a member. `prompt` is the request's prompt value (`kv` mode hashes it).
pub(super) fn pick<'s>(
    ctx: &CoreCtx,
    req: &Outbound<'s>,
    worker_id: Option<&[u8]>,
    prompt: &[u8],
    mut ex: Excluded,
    now: u64,
) -> Result<Picked, Unpicked<'s>> {
    loop {
        let picked = pick_once(ctx, req, worker_id, prompt, ex, now)?;
        let worker = &req.snap.workers[req.model.members[picked.member].worker as usize];
        // Only a worker waiting for its trial is both picked and out of rotation.
        let on_trial = {
            let busy = &mut ctx.busy.borrow_mut();
            let busy = busy.load();
            busy.is_unhealthy(worker.state.slot) && !busy.panics(req.model.id)
        };
        if !on_trial || worker.state.claim_trial() {
            return Ok(picked);
        }
        ex.failed(picked.member);
    }
}

/// What a pick would find now, for a decision made before the request goes (a
/// disaggregated request's decode pool, before stage 1): the prompt tokens predicted
/// cached at the member it would pick, or why it would pick none. The model's
/// round-robin turn stays where it was.
pub(super) fn foresee<'s>(
    ctx: &CoreCtx,
    req: &Outbound<'s>,
    prompt: &[u8],
    now: u64,
) -> Result<u64, Unpicked<'s>> {
    let turn = ctx.rr(req.model.id);
    let picked = pick(ctx, req, None, prompt, Excluded::default(), now);
    ctx.set_rr(req.model.id, turn);
    picked.map(|p| p.cached_tokens)
}

fn pick_once<'s>(
    ctx: &CoreCtx,
    req: &Outbound<'s>,
    worker_id: Option<&[u8]>,
    prompt: &[u8],
    ex: Excluded,
    now: u64,
) -> Result<Picked, Unpicked<'s>> {
    let (model, snap) = (req.model, req.snap);
    let mut cache = ctx.busy.borrow_mut();
    let busy = cache.load();
    // A tenant below the mean in flight is spared the busy rule (docs/behaviour.md §8.13).
    let light = (model.tenants.as_deref()).is_some_and(|t| t.light(req.tenant));
    let shed = busy.enabled(model.id) && !light;
    let panic = busy.panics(model.id);
    let kv_mode = model.kv.is_some();
    let why = |i: usize| busy_why(ctx, req, busy, i);
    let state = |i: usize| {
        let m = model.members[i];
        let w = &snap.workers[m.worker as usize].state;
        let unhealthy =
            w.is_suspect() || w.is_provisional() || (busy.is_unhealthy(w.slot) && !w.trial_open());
        let penalty = ctx.failure_penalty(w.slot as usize, now);
        let mut s = MemberState {
            unreachable: w.is_down(now) || ex.failed & bit(i) != 0 || (unhealthy && !panic),
            busy: (shed && why(i).is_some()) || w.is_held(now) || ex.refused & bit(i) != 0,
            inflight: w.inflight_on(ctx.id).saturating_add(penalty),
            load: busy.load(m.id),
            ..MemberState::default()
        };
        if kv_mode {
            (s.prefill_tokens, s.decode_blocks) = kv_state(ctx, req, w, penalty);
        }
        s
    };
    let n = model.members.len();
    let picked = |member: usize, kv: Option<KvNote>| Picked {
        member,
        cached_tokens: kv.map_or(0, |k| u64::from(k.overlap) * kv_block(req)),
        generation: busy.generation,
        kv,
    };
    if model.router_mode == RouterMode::Direct {
        let why = |i: usize| why(i).flatten();
        return Ok(picked(pick_direct(req, worker_id, why, state, now)?, None));
    }
    let (pick_result, note) = if let Some(kv) = model.kv.as_deref() {
        pick_kv(ctx, req, kv, prompt, state, now)
    } else {
        let mut rr = ctx.rr(model.id);
        let picked = route::pick(
            model.router_mode,
            n,
            state,
            &mut rr,
            &mut ctx.rng.borrow_mut(),
        );
        ctx.set_rr(model.id, rr);
        (picked, None)
    };
    match pick_result {
        Pick::Member(member) => Ok(picked(member, note)),
        // Nothing busy by the busy rule: what excluded the rest were worker-local
        // refusals (this request's, or holds since the last publish). Say so, with the
        // figures of the held worker with the most room.
        Pick::Overloaded if !(shed && (0..n).any(|i| why(i).is_some())) => {
            let refused = |why| RequestError::Refused(Refusal::AtCapacity, why);
            Err(held_full(req, 0..n, refused, now))
        }
        // Every worker busy by the busy rule: the least busy one says why.
        Pick::Overloaded => {
            Err(RequestError::Overloaded(least_busy(n, |i| why(i).flatten())).into())
        }
        Pick::Unavailable => Err(RequestError::Unavailable.into()),
    }
}

/// A refusal for held members (`queue_full`, docs/behaviour.md §7.5): `answer` with the
/// figures of the one among `members` held now with the most room at its gate (the
/// first of equals), its admitted requests against its N + Q; without figures when none
/// held has a gate.
#[cold]
#[inline(never)]
fn held_full<'s>(
    req: &Outbound<'s>,
    members: impl Iterator<Item = usize>,
    answer: impl Fn(Option<Why>) -> RequestError,
    now: u64,
) -> Unpicked<'s> {
    let (model, snap) = (req.model, req.snap);
    let room = |w: &Why| w.threshold - w.value;
    let held = members
        .filter_map(|i| {
            let worker = &snap.workers[model.members[i].worker as usize];
            let gate = worker
                .gate
                .as_deref()
                .filter(|_| worker.state.is_held(now))?;
            let (running, waiting) = gate.occupancy();
            Some((at_capacity(gate, running + waiting), gate))
        })
        .reduce(|best, next| {
            if room(&next.0) > room(&best.0) {
                next
            } else {
                best
            }
        });
    Unpicked {
        answer: answer(held.map(|(why, _)| why)),
        held: held.map(|(_, gate)| gate),
    }
}

/// `kv` mode's block size.
fn kv_block(req: &Outbound<'_>) -> u64 {
    (req.model.kv.as_ref()).map_or(1, |k| u64::from(k.settings.kv_cache_block_size.max(1)))
}

/// `kv` mode's load of a worker: active prefill tokens and decode blocks, each of its
/// `failures` on this core lately weighing as one more request of this one's size
/// decoding there.
fn kv_state(ctx: &CoreCtx, req: &Outbound<'_>, w: &WorkerState, failures: u32) -> (u64, u64) {
    let block = (req.model.kv.as_ref()).map_or(1, |k| k.settings.kv_cache_block_size.max(1));
    let request_blocks = req.prompt_tokens.div_ceil(u64::from(block)).max(1);
    let load = w.kv_load(ctx.id);
    let failing = u64::from(failures) * request_blocks;
    (load.prefill_tokens, load.decode_blocks + failing)
}

/// Whether member `i` is busy for the request by the busy rule, and why (when known): by
/// the published set, else by the worker's headroom: the requests Spillway has at its engine
/// now beyond the engine's slots, or the prefill this core routed there since the set was
/// published.
fn busy_why(ctx: &CoreCtx, req: &Outbound<'_>, busy: &BusySet, i: usize) -> Option<Option<Why>> {
    let m = req.model.members[i];
    if busy.is_busy(req.class, m.id) {
        return Some(busy.why(req.class, m.id));
    }
    let headroom = busy.headroom(m.id);
    let worker = &req.snap.workers[m.worker as usize];
    if headroom.checks_waiting(req.class) {
        let queued = worker.gate.as_ref().map_or(0, |g| g.occupancy().1);
        let bound = worker.state.inflight_total().saturating_sub(queued);
        if let Some(why) = headroom.waiting_why(req.class, bound) {
            return Some(Some(why));
        }
    }
    match ctx.routed_since(worker.state.slot as usize, busy.generation) {
        0 => None, // nothing routed since: the published word stands
        routed => headroom.why(req.class, routed).map(Some),
    }
}

/// Direct mode: the member the `x-worker-id` header names, or why not (`why`: why a
/// member is busy by the busy rule; a held one says it is full).
#[inline(never)]
fn pick_direct<'s>(
    req: &Outbound<'s>,
    worker_id: Option<&[u8]>,
    why: impl Fn(usize) -> Option<Why>,
    state: impl Fn(usize) -> MemberState,
    now: u64,
) -> Result<usize, Unpicked<'s>> {
    let (model, snap) = (req.model, req.snap);
    let name = |i: usize| {
        snap.workers[model.members[i].worker as usize]
            .cfg
            .name
            .as_bytes()
    };
    route::pick_direct(worker_id, model.members.len(), name, state).map_err(|r| match r {
        DirectRefusal::MissingHeader => RequestError::DirectMissingHeader.into(),
        DirectRefusal::UnknownWorker => RequestError::DirectUnknownWorker.into(),
        DirectRefusal::Busy(i) => match why(i) {
            Some(why) => RequestError::DirectBusy(Some(why)).into(),
            None => held_full(req, [i].into_iter(), RequestError::DirectBusy, now),
        },
        DirectRefusal::Unreachable => RequestError::Unavailable.into(),
    })
}

/// `kv` mode: the decision (`route::decide_kv`) on this core's scratch and the router's
/// overhead; with what [`bound`] notes if the request is bound to the member picked.
#[inline(never)]
fn pick_kv(
    ctx: &CoreCtx,
    req: &Outbound<'_>,
    kv: &KvRouting,
    prompt: &[u8],
    state: impl Fn(usize) -> MemberState,
    now: u64,
) -> (Pick, Option<KvNote>) {
    let started = clock::now();
    let n = req.model.members.len();
    let d = route::decide_kv(
        &kv.cache,
        &kv.settings,
        prompt,
        req.prompt_tokens,
        n,
        state,
        &mut ctx.kv_hashes.borrow_mut(),
        now,
        &mut ctx.rng.borrow_mut(),
    );
    let decision = ctx.kv_decisions.get().wrapping_add(1);
    ctx.kv_decisions.set(decision);
    let Pick::Member(_) = d.pick else {
        return (d.pick, None);
    };
    let cells = &req.model.metrics.cores[ctx.id];
    let secs = clock::since(started).as_secs_f64();
    cells.router_overhead.observe(&OVERHEAD_BUCKETS, secs);
    let note = KvNote {
        decision,
        chunks: d.chunks,
        overlap: d.overlap,
        blocks: d.blocks,
    };
    (d.pick, Some(note))
}

/// Notes the member a request is bound to (with a slot there, or none to take): the
/// prefill routed there (each core's own count until the next busy set), and in `kv`
/// mode the prediction that it holds the prompt now, with the hit-rate metrics. `prompt`
/// is the request's prompt value; `now` the attempt's clock reading (after a wait in the
/// room it is older by that wait, so the prediction ends that much sooner).
pub(super) fn bound(ctx: &CoreCtx, req: &Outbound<'_>, prompt: &[u8], picked: &Picked, now: u64) {
    let worker = &req.snap.workers[req.model.members[picked.member].worker as usize];
    let prefill = req.prompt_tokens.saturating_sub(picked.cached_tokens);
    ctx.note_routed(worker.state.slot as usize, picked.generation, prefill);
    let (Some(kv), Some(note)) = (req.model.kv.as_deref(), picked.kv) else {
        return;
    };
    // The scratch holds this prompt's hashes unless another decision came since.
    let chunks = Some(note.chunks).filter(|_| ctx.kv_decisions.get() == note.decision);
    let scratch = &mut ctx.kv_hashes.borrow_mut();
    let recorded = route::record_kv(
        &kv.cache,
        &kv.settings,
        (prompt, chunks),
        picked.member,
        scratch,
        now,
    );
    let cells = &req.model.metrics.cores[ctx.id];
    let hit = match note.blocks {
        0 => 0.0,
        b => f64::from(note.overlap) / b as f64,
    };
    cells.kv_hit_rate.observe(&KV_HIT_BUCKETS, hit);
    cells.kv_recorded(recorded.added, recorded.evicted);
    worker
        .state
        .kv_hit(ctx.id, u64::from(note.overlap), note.blocks);
}

/// Why the least busy of `n` busy members is busy (the one closest to its threshold), by
/// `why` of each.
#[cold]
#[inline(never)]
fn least_busy(n: usize, why: impl Fn(usize) -> Option<Why>) -> Option<Why> {
    (0..n)
        .filter_map(why)
        .min_by(|a, b| a.excess().total_cmp(&b.excess()))
}
