//! Stage: admission at the worker's gate (`engine_request_limit`): an engine slot now, a
//! place in the FIFO queue (waiting while the client is watched), or a refusal that lets
//! the request migrate; or, when the client's stated budget ends the wait, one that ends
//! the request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::{AttemptError, Refusal};
use super::watch::{Interrupt, Reader, watched};
use crate::admission::{Gate, Room, Ticket};
use crate::runtime::clock;
use crate::shed::{Class, Knob, Why};
use crate::state::Worker;

/// An engine slot of a worker (nothing to hold when it has no cap). Dropped, it gives the
/// slot back, then notifies the waiting rooms of the models the worker serves.
#[derive(Debug)]
pub(super) struct Slot<'w> {
    ticket: Option<Ticket<'w>>,
    rooms: &'w [Arc<Room>],
}

impl<'w> Slot<'w> {
    /// `ticket` (holding a slot) at `worker`.
    pub fn new(worker: &'w Worker, ticket: Option<Ticket<'w>>) -> Slot<'w> {
        Slot {
            ticket,
            rooms: &worker.rooms,
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.ticket.take().map(drop).is_some() {
            for room in self.rooms {
                room.notify();
            }
        }
    }
}

/// The time a client gave its request (docs/behaviour.md §8.10): `ms` from `from`, when
/// Spillway had its head.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub from: Instant,
    pub ms: u64,
}

impl Budget {
    /// When the budget ends.
    pub fn end(self) -> Instant {
        self.from + Duration::from_millis(self.ms)
    }

    /// The refusal when the budget ends a wait at `at` (now, or when the wait is
    /// predicted to end): the ms the request has had by then against its budget.
    pub fn spent(self, at: Instant) -> AttemptError {
        let why = Why {
            knob: Knob::Deadline,
            value: at.saturating_duration_since(self.from).as_millis() as f64,
            threshold: self.ms as f64,
        };
        AttemptError::Refused(Refusal::QueueTimeout, Some(why))
    }
}

/// A slot of `worker` (nothing held when the worker has no cap), after a
/// wait in its queue of at most its `request_queue_timeout_ms`, or the cap `cap_ms` reads
/// (asked only when the ticket must wait) when less, or what is left of the client's
/// `budget` when less still (then its end refuses with knob `deadline`; at once when
/// nothing is left or the ticket's turn is predicted past it).
pub(super) async fn admit<'w>(
    worker: &'w Worker,
    class: Class,
    cap_ms: impl FnOnce() -> Option<u64>,
    budget: Option<Budget>,
    reader: &mut Reader<'_>,
) -> Result<Slot<'w>, AttemptError> {
    let ticket = wait_at_gate(worker, class, cap_ms, budget, reader).await?;
    Ok(Slot::new(worker, ticket))
}

async fn wait_at_gate<'w>(
    worker: &'w Worker,
    class: Class,
    cap_ms: impl FnOnce() -> Option<u64>,
    budget: Option<Budget>,
    reader: &mut Reader<'_>,
) -> Result<Option<Ticket<'w>>, AttemptError> {
    let Some(gate) = worker.gate.as_deref() else {
        return Ok(None);
    };
    let Some(ticket) = gate.enter(class) else {
        let full = at_capacity(gate, u64::from(gate.limit() + gate.queue_limit()));
        return Err(AttemptError::Refused(Refusal::AtCapacity, Some(full)));
    };
    if ticket.is_ready() {
        return Ok(Some(ticket));
    }
    let configured = worker.cfg.request_queue_timeout_ms;
    let timeout_ms = cap_ms().map_or(configured, |cap| cap.min(configured));
    let started = clock::now();
    let mut end = started + Duration::from_millis(timeout_ms);
    let by_budget = budget.filter(|b| b.end() < end);
    if let Some(b) = by_budget {
        end = b.end();
        // Nothing left, or its turn predicted past it: refused now rather than at its end.
        let (_, position) = gate.occupancy();
        let predicted = gate
            .pace()
            .predicted_wait_ms(position)
            .map(Duration::from_millis);
        let turn = predicted.map_or(started, |wait| started + wait);
        // A grant that came meanwhile wins: the ticket holds a slot.
        if end <= turn && !ticket.is_ready() {
            gate.count_refusal();
            return Err(b.spent(turn));
        }
    }
    match watched(ticket.ready(), reader, end).await {
        Ok(()) => Ok(Some(ticket)),
        Err(Interrupt::ClientGone) => Err(AttemptError::ClientGone),
        // The deadline and the turn can come together: a ready ticket goes ahead.
        Err(Interrupt::Timeout | Interrupt::Abandoned) if ticket.is_ready() => Ok(Some(ticket)),
        Err(Interrupt::Timeout | Interrupt::Abandoned) => {
            gate.count_refusal();
            if let Some(b) = by_budget {
                return Err(b.spent(clock::now()));
            }
            let (running, _) = gate.occupancy();
            let share = gate.class_limit(class);
            // Held back by its class's share while slots stood free: that share refused it.
            let why = if share < gate.limit() && running < u64::from(gate.limit()) {
                Why {
                    knob: Knob::ClassShare,
                    value: running as f64,
                    threshold: f64::from(share),
                }
            } else {
                Why {
                    knob: Knob::QueueTimeout,
                    value: clock::since(started).as_millis() as f64,
                    threshold: timeout_ms as f64,
                }
            };
            Err(AttemptError::Refused(Refusal::QueueTimeout, Some(why)))
        }
    }
}

/// Why a worker at capacity refuses (knob `queue_full`): `admitted` requests (in its
/// engine slots and its queue) against its N + Q.
pub(super) fn at_capacity(gate: &Gate, admitted: u64) -> Why {
    Why {
        knob: Knob::QueueFull,
        value: admitted as f64,
        threshold: f64::from(gate.limit() + gate.queue_limit()),
    }
}
