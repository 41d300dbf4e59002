//! Stage: the model's waiting room (docs/behaviour.md §8.12), between the pick and the
//! attempt. A model with a room never queues at a worker's gate: a request whose picked
//! worker has no free slot looks at the model's other eligible workers and, finding none,
//! waits in the room while the client is watched. Each time it is due
//! (`admission/room.rs`) it looks again and binds to the worker the router picks among
//! those with a free slot (late binding). It leaves with a slot, or refused: the room full
//! (`queue_full`), its wait over or predicted past its end (`queue_timeout`), the
//! client's budget spent (`deadline`); or with the pick's own answer when every worker
//! turned busy or unreachable meanwhile.

use std::time::{Duration, Instant};

use super::admit::{Budget, Slot};
use super::core::CoreCtx;
use super::error::{AttemptError, Refusal};
use super::exchange::Exchange;
use super::pick::{Excluded, Picked, Unpicked, pick};
use super::watch::{Interrupt, watched};
use crate::admission::{Room, Waiter};
use crate::runtime::clock;
use crate::shed::{Knob, Why};
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
    /// No worker may take it now (all busy or unreachable): the pick's answer.
    Unpicked(Unpicked<'s>),
}

/// What a look at the model's workers found.
enum Look<'s> {
    Bound(Bound<'s>),
    /// Every eligible worker's slots are full: wait.
    Full,
    Unpicked(Unpicked<'s>),
}

/// A slot for the request at `first` (the member just picked) or at any eligible member,
/// now or after a wait in `room` of at most `timeout_ms` (less when the client's budget
/// ends first). Joins the room at once behind waiters of its class or more important ones.
pub(super) async fn bind<'s>(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, 's>,
    first: Picked,
    (room, timeout_ms): (&'s Room, u64),
) -> Result<Bound<'s>, Unbound<'s>> {
    // Nobody of its class or a more important one waits: the picked worker's free slot
    // is its own (one waiter of a less important class cannot take, say for its share).
    if room.waiting_ahead(ex.req.class) == 0 {
        let worker = &ex.req.snap.workers[ex.req.model.members[first.member].worker as usize];
        if let Some(gate) = worker.gate.as_deref() {
            if let Some(t) = gate.try_take(ex.req.class) {
                let slot = Slot::new(worker, Some(t));
                return Ok(Bound {
                    picked: first,
                    slot,
                });
            }
        } else {
            let slot = Slot::new(worker, None);
            return Ok(Bound {
                picked: first,
                slot,
            });
        }
    }
    let Some(waiter) = room.enter(ex.req.class) else {
        let why = room_figures(Knob::QueueFull, room.waiting(), room.capacity().into());
        let retry_after = retry_after(room);
        let refused = AttemptError::Refused(Refusal::RoomFull { retry_after }, Some(why));
        return Err(Unbound::Ended(refused));
    };
    let started = clock::now();
    let result = wait(ctx, ex, waiter, started, timeout_ms).await;
    let waited = clock::since(started);
    ex.trail.queue += waited;
    let cells = &ex.req.model.metrics.cores[ctx.id];
    let wait_cells = &cells.room_wait[ex.req.class.index()];
    wait_cells.observe(&ROOM_WAIT_BUCKETS, waited.as_secs_f64());
    result
}

/// The wait in the room, from entry to a slot or a refusal.
async fn wait<'s>(
    ctx: &CoreCtx,
    ex: &mut Exchange<'_, 's>,
    mut waiter: Waiter<'s>,
    started: Instant,
    timeout_ms: u64,
) -> Result<Bound<'s>, Unbound<'s>> {
    let budget = (ex.req.budget_ms).map(|ms| Budget {
        from: ex.req.started,
        ms,
    });
    let mut end = started + Duration::from_millis(timeout_ms);
    let by_budget = budget.filter(|b| b.end() < end);
    if let Some(b) = by_budget {
        end = b.end();
    }
    // Its turn predicted past its end: refused now rather than at its end.
    let room = waiter.room();
    let pace = room.pace();
    let predicted = pace.predicted_wait_ms(waiter.position());
    let turn = predicted.map_or(started, |ms| started + Duration::from_millis(ms));
    let refuse = |at: Instant, predicted: Option<u64>| match by_budget {
        Some(b) => b.spent(at),
        None => {
            let waited = predicted.unwrap_or_else(|| clock::since(started).as_millis() as u64);
            let why = room_figures(Knob::QueueTimeout, waited, timeout_ms);
            let retry_after = retry_after(room);
            AttemptError::Refused(Refusal::RoomTimeout { retry_after }, Some(why))
        }
    };
    let early = end <= turn;
    loop {
        if waiter.due() {
            match look(ctx, ex) {
                Look::Bound(b) => return Ok(b),
                Look::Unpicked(u) => return Err(Unbound::Unpicked(u)),
                Look::Full => continue,
            }
        }
        if early {
            ex.req.model.metrics.cores[ctx.id].room_predicted();
            return Err(Unbound::Ended(refuse(turn, predicted)));
        }
        match watched(waiter.notified(), &mut ex.reader, end).await {
            Ok(()) => {}
            Err(Interrupt::ClientGone) => return Err(Unbound::Ended(AttemptError::ClientGone)),
            Err(Interrupt::Timeout | Interrupt::Abandoned) => {
                // A turn that came with the end goes ahead.
                if waiter.due()
                    && let Look::Bound(b) = look(ctx, ex)
                {
                    return Ok(b);
                }
                return Err(Unbound::Ended(refuse(clock::now(), None)));
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
    let mut full = Excluded::default();
    for (i, m) in model.members.iter().enumerate() {
        let gate = snap.workers[m.worker as usize].gate.as_deref();
        if gate.is_some_and(|g| !g.look(req.class)) {
            full.refused(i);
        }
    }
    // Each pass takes a slot or marks one more member full (pools beyond the 128 members
    // `Excluded` marks end at a wait).
    for _ in 0..=model.members.len() {
        let picked = match pick(ctx, req, None, ex.prompt(), full, clock::now_ms()) {
            Ok(p) => p,
            Err(_) if full.any() => return Look::Full,
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
