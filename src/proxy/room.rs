//! Stage: the model's waiting room (docs/behaviour.md §8.12), between the pick and the
//! attempt. A model with a room never queues at a worker's gate: a request whose picked
//! worker has no free slot looks at the model's other eligible workers and, finding none,
//! waits in the room while the client is watched. So does one the pick could not place
//! because every worker is busy or held, and, with a rollout hold, one that found no
//! worker available. Each time it is due (`admission/room.rs`: a slot came back, or the
//! monitor saw a worker become admissible) it looks again and binds to the worker the
//! router picks among those with a free slot (late binding). It leaves with a slot, or
//! refused: the room full (`queue_full`), its place taken by a more important request
//! (`evicted`), its wait over or predicted past its end (`queue_timeout`, or the pick's
//! own answer when the workers stayed busy or away), the client's budget spent
//! (`deadline`).

use std::time::{Duration, Instant};

use super::admit::{Budget, Slot};
use super::core::CoreCtx;
use super::error::{AttemptError, Refusal, RequestError};
use super::exchange::{Exchange, Outbound};
use super::pick::{Excluded, Picked, Unpicked, pick};
use super::watch::{Interrupt, watched};
use crate::admission::{Gate, Room, Turned, Waiter};
use crate::config::WaitingRoom;
use crate::route::RouterMode;
use crate::runtime::clock;
use crate::shed::{Knob, Why};
use crate::state::ModelRoom;
use crate::state::counters::ROOM_WAIT_BUCKETS;

/// A request bound to a worker: its member and a slot there.
pub(super) struct Bound<'s> {
    pub picked: Picked,
    pub slot: Slot<'s>,
}

/// Why a request left the room without a slot.
pub(super) enum Unbound<'s> {
    /// Refused, or the client left: the attempt's error, which ends the request.
    Ended(AttemptError),
    /// No worker may take it (busy, held or away) and it may wait no longer, or not at
    /// all: the pick's answer.
    Unpicked(Unpicked<'s>),
}

/// The first pick of a request that may wait in the room.
pub(super) enum First<'s> {
    /// A member whose gate read free when picked.
    Picked(Picked),
    /// The members eligible but for their gates read full: it waits for a slot.
    Full,
    /// No member may take it (busy, held, away): the router's answer.
    Unpicked(Unpicked<'s>),
}

/// Picks among the members whose gates read free now (a reading, no write), so that the
/// request goes to a worker that can take it; when the router would pick one of the
/// members that left out, the request waits for a slot. Direct mode picks its named
/// worker whatever its gate reads.
pub(super) fn first_pick<'s>(
    ctx: &CoreCtx,
    req: &Outbound<'s>,
    (worker_id, prompt): (Option<&[u8]>, &[u8]),
    excluded: Excluded,
    now: u64,
) -> First<'s> {
    let free = match req.model.router_mode {
        RouterMode::Direct => excluded,
        _ => with_full(req, excluded, |g| g.has_room_for(req.class)),
    };
    match pick(ctx, req, worker_id, prompt, free, now) {
        Ok(picked) => First::Picked(picked),
        Err(none) if free == excluded => First::Unpicked(none),
        Err(_) => match full_or_answer(ctx, req, (worker_id, prompt), excluded, now) {
            None => First::Full,
            Some(none) => First::Unpicked(none),
        },
    }
}

/// `excluded` and the members whose gates are full by `has_room`.
fn with_full(
    req: &Outbound<'_>,
    mut excluded: Excluded,
    has_room: impl Fn(&Gate) -> bool,
) -> Excluded {
    for (i, m) in req.model.members.iter().enumerate() {
        let gate = req.snap.workers[m.worker as usize].gate.as_deref();
        if gate.is_some_and(|g| !has_room(g)) {
            excluded.refused(i);
        }
    }
    excluded
}

/// After a pick that left out the full gates found nobody: the router asked again with
/// them in (picks note nothing). A member it would pick means a wait for a slot (`None`);
/// none is its answer, so every worker busy is the overload answer at once and none
/// available is 503, full gates or not.
fn full_or_answer<'s>(
    ctx: &CoreCtx,
    req: &Outbound<'s>,
    (worker_id, prompt): (Option<&[u8]>, &[u8]),
    excluded: Excluded,
    now: u64,
) -> Option<Unpicked<'s>> {
    pick(ctx, req, worker_id, prompt, excluded, now).err()
}

/// What a look at the model's workers found.
enum Look<'s> {
    Bound(Bound<'s>),
    /// Every eligible worker's slots are full: wait.
    Full,
    Unpicked(Unpicked<'s>),
}

/// When a request's time in the room ends, over all its entries (a request may enter
/// again after a connect failure, §8.12): `since` its first entry, the room's timeout,
/// or its rollout hold once it found no worker available, whichever ends later.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Stay {
    since: Option<Instant>,
    /// It found no worker available at some point (the hold applies).
    held: bool,
}

impl Stay {
    fn end(&self, since: Instant, settings: &WaitingRoom) -> Instant {
        let hold = settings.hold_ms.filter(|_| self.held).unwrap_or(0);
        since + Duration::from_millis(settings.timeout_ms.max(hold))
    }
}

/// Whether a request the router could not place may wait in the room for that to change:
/// every worker busy or held (the overload answers) with `waiting_room_waits_for_busy`;
/// none available with a rollout hold. Notes the hold on `stay`.
fn may_wait(none: &Unpicked<'_>, settings: &WaitingRoom, stay: &mut Stay) -> bool {
    match none.answer {
        RequestError::Overloaded(_) | RequestError::Refused(..) => settings.waits_for_busy,
        RequestError::Unavailable if settings.hold_ms.is_some() => {
            stay.held = true;
            true
        }
        _ => false,
    }
}

/// A slot for the request at the member just picked (`first`) or at any eligible
/// member, now or after a wait in the model's room; or, when the pick found none
/// (`first` is its answer), after a wait for one to become admissible when that answer
/// may change. Joins the room at once behind waiters of its class or more important ones.
pub(super) async fn bind<'s>(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, 's>,
    first: First<'s>,
    room: &'s ModelRoom,
    stay: &mut Stay,
) -> Result<Bound<'s>, Unbound<'s>> {
    let (settings, room) = (&room.settings, &*room.room);
    let last = match first {
        First::Unpicked(none) if !may_wait(&none, settings, stay) => {
            return Err(Unbound::Unpicked(none));
        }
        First::Unpicked(none) => Some(none),
        // Nobody of its class or a more important one waits: the picked worker's free
        // slot is its own (one waiter of a less important class cannot take, say for its
        // share).
        First::Picked(first) if room.waiting_ahead(ex.req.class) == 0 => {
            let worker = &ex.req.snap.workers[ex.req.model.members[first.member].worker as usize];
            let ticket = match worker.gate.as_deref() {
                None => Some(None),
                Some(gate) => gate.try_take(ex.req.class).map(Some),
            };
            if let Some(ticket) = ticket {
                let slot = Slot::new(worker, ticket);
                return Ok(Bound {
                    picked: first,
                    slot,
                });
            }
            None
        }
        First::Picked(_) | First::Full => None,
    };
    let waiter = match room.enter(ex.req.class, ex.req.tenant) {
        Ok(w) => w,
        Err(turned) => return Err(Unbound::Ended(turned_away(room, turned, ex.req.tenant))),
    };
    let started = clock::now();
    let since = *stay.since.get_or_insert(started);
    let result = wait(ctx, ex, waiter, (since, settings), stay, last).await;
    let waited = clock::since(started);
    ex.trail.queue += waited;
    ex.before_worker += waited;
    let cells = &ex.req.model.metrics.cores[ctx.id];
    let wait_cells = &cells.room_wait[ex.req.class.index()];
    wait_cells.observe(&ROOM_WAIT_BUCKETS, waited.as_secs_f64());
    result
}

/// The wait in the room, from entry to a slot or a refusal. `last` is why the router
/// could not place the request when it last looked (none when it found slots full).
async fn wait<'s>(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, 's>,
    mut waiter: Waiter<'s>,
    (since, settings): (Instant, &WaitingRoom),
    stay: &mut Stay,
    mut last: Option<Unpicked<'s>>,
) -> Result<Bound<'s>, Unbound<'s>> {
    let budget = (ex.req.budget_ms).map(|ms| Budget {
        from: ex.req.started,
        ms,
    });
    let end_by = |stay: &Stay| {
        let end = stay.end(since, settings);
        match budget.filter(|b| b.end() < end) {
            Some(b) => (b.end(), Some(b)),
            None => (end, None),
        }
    };
    // Its turn predicted past its end: refused now rather than at its end (not while it
    // waits for workers to come back, which no release rate predicts).
    let room = waiter.room();
    let predicted = (room.pace().predicted_wait_ms(waiter.position())).filter(|_| !stay.held);
    let turn = predicted.map(|ms| clock::now() + Duration::from_millis(ms));
    let refuse = |at: Instant, by_budget: Option<Budget>, predicted: Option<u64>| {
        if let Some(b) = by_budget {
            return Unbound::Ended(b.spent(at));
        }
        let waited = predicted.unwrap_or_else(|| clock::since(since).as_millis() as u64);
        let why = room_figures(Knob::QueueTimeout, waited, settings.timeout_ms);
        let retry_after = retry_after(room);
        let refused = AttemptError::Refused(Refusal::RoomTimeout { retry_after }, Some(why));
        Unbound::Ended(refused)
    };
    loop {
        if waiter.evicted() {
            return Err(evicted(room));
        }
        if waiter.due() {
            match look(ctx, ex) {
                Look::Bound(b) => return Ok(b),
                Look::Full => last = None,
                Look::Unpicked(none) if may_wait(&none, settings, stay) => last = Some(none),
                Look::Unpicked(none) => return Err(Unbound::Unpicked(none)),
            }
        }
        let (end, by_budget) = end_by(stay);
        if let Some(turn) = turn.filter(|&t| end <= t && !stay.held) {
            ex.req.model.metrics.cores[ctx.id].room_predicted();
            return Err(refuse(turn, by_budget, predicted));
        }
        match watched(waiter.notified(), &mut ex.reader, end).await {
            Ok(()) => {}
            Err(Interrupt::ClientGone) => return Err(Unbound::Ended(AttemptError::ClientGone)),
            Err(Interrupt::Timeout | Interrupt::Abandoned) => {
                if waiter.evicted() {
                    return Err(evicted(room));
                }
                // A turn that came with the end goes ahead.
                if waiter.due() {
                    match look(ctx, ex) {
                        Look::Bound(b) => return Ok(b),
                        Look::Full => last = None,
                        Look::Unpicked(none) => last = Some(none),
                    }
                }
                // Workers that stayed busy, held or away: the router's answer says so.
                return Err(match (last, by_budget) {
                    (Some(none), None) => Unbound::Unpicked(none),
                    _ => refuse(clock::now(), by_budget, None),
                });
            }
        }
    }
}

/// Looks at the model's members for a free slot: the router picks among the eligible ones
/// whose gate would take the request now; a slot is taken there (or the look goes on if
/// another request took it first). Every gate looked at is written (`Gate::look`), which
/// orders this look before the next release there.
fn look<'s>(ctx: &CoreCtx, ex: &Exchange<'_, 's>) -> Look<'s> {
    let req = &ex.req;
    let (snap, model) = (req.snap, req.model);
    let mut full = with_full(req, Excluded::default(), |g| g.look(req.class));
    // Each pass takes a slot or marks one more member full (pools beyond the 128 members
    // `Excluded` marks end at a wait).
    for _ in 0..=model.members.len() {
        let now = clock::now_ms();
        let picked = match pick(ctx, req, None, ex.prompt(), full, now) {
            Ok(p) => p,
            Err(_) if full.any() => {
                let all = Excluded::default();
                return match full_or_answer(ctx, req, (None, ex.prompt()), all, now) {
                    None => Look::Full,
                    Some(none) => Look::Unpicked(none),
                };
            }
            Err(none) => return Look::Unpicked(none),
        };
        let worker = &snap.workers[model.members[picked.member].worker as usize];
        let ticket = match worker.gate.as_deref() {
            None => None,
            Some(gate) => match gate.try_take(req.class) {
                Some(t) => Some(t),
                None => {
                    full.refused(picked.member);
                    continue;
                }
            },
        };
        let slot = Slot::new(worker, ticket);
        return Look::Bound(Bound { picked, slot });
    }
    Look::Full
}

/// The refusal of a waiter a more important request evicted.
#[cold]
#[inline(never)]
fn evicted(room: &Room) -> Unbound<'static> {
    let why = room_figures(Knob::Evicted, room.waiting(), room.capacity().into());
    let retry_after = retry_after(room);
    Unbound::Ended(AttemptError::Refused(
        Refusal::RoomEvicted { retry_after },
        Some(why),
    ))
}

/// The refusal of a request the room has no place for: full, or its tenant's share held.
#[cold]
#[inline(never)]
fn turned_away(room: &Room, turned: Turned, tenant: u64) -> AttemptError {
    let retry_after = retry_after(room);
    let (refusal, why) = match turned {
        Turned::Full => (
            Refusal::RoomFull { retry_after },
            room_figures(Knob::QueueFull, room.waiting(), room.capacity().into()),
        ),
        Turned::TenantFull => (
            Refusal::TenantFull { retry_after },
            room_figures(
                Knob::TenantShare,
                room.tenant_waiting(tenant),
                room.tenant_capacity(),
            ),
        ),
    };
    AttemptError::Refused(refusal, Some(why))
}

/// A room refusal's `Retry-After`: the wait predicted now for a request that would join
/// the room's line, in whole seconds rounded up (at least 1); `None` while the room's
/// pace is unknown.
fn retry_after(room: &Room) -> Option<u32> {
    let ms = room.pace().predicted_wait_ms(room.waiting() + 1)?;
    Some(ms.div_ceil(1_000).clamp(1, u64::from(u32::MAX)) as u32)
}

/// A room refusal's figures: `value` against the room's `threshold`.
fn room_figures(knob: Knob, value: u64, threshold: u64) -> Why {
    Why {
        knob,
        value: value as f64,
        threshold: threshold as f64,
    }
}
