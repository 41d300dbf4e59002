//! Worker admission (docs/behaviour.md §8.1–§8.2): at most N requests in flight to a worker and at most Q
//! waiting, across all cores together, admitted strictly first come, first served. N holds
//! at every instant: a waiter that leaves frees a queue place, never an engine slot.
//!
//! The [`Gate`] is one atomic word plus N + Q places allocated up front, all lock-free: no
//! lock, no thread spins or blocks on another, nothing allocated per request. The word
//! packs three counts, so every admission decision is one read-modify-write of one location:
//! - `r`: engine slots held, by running tickets and by grants under way (see `g`).
//! - `l`: waiting tickets: admitted, not yet given a slot, not gone.
//! - `g`: grants under way: slots a dispatcher has reserved (counted in `r`) and is handing
//!   to the oldest waiter (still counted in `l`).
//!
//! Invariants: `r <= N`; every running ticket has its slot in `r`; admitted tickets are
//! `r + l - g <= N + Q`; `g <= r + l` (each grant under way still counts its reserved slot
//! in `r`, or, once granted, its waiter in `l` until settled, even if that ticket already
//! ran and gave the slot back, so `r - g` alone may be negative for a moment); places in
//! use never exceed the tickets counted, so a ticket counted in `l` always finds a FREE
//! place.
//!
//! - **enter**: with `l == 0` and `r < N` (nobody queued, a slot free) take a slot, `r + 1`.
//!   Otherwise, while `r + l - g < N + Q`, queue: `l + 1`, claim a FREE place (→ WAITING,
//!   with an arrival number from a separate counter, which orders the queue), dispatch.
//!   Otherwise refuse: the cap is exact.
//! - **dispatch** hands free slots to the queue, oldest first. While `l > g` and `r < N`:
//!   reserve (`r + 1, g + 1`), turn the oldest WAITING place GRANTED (one compare-and-swap,
//!   raced by its owner's WAITING → FREE: one wins), wake it and settle (`g - 1, l - 1`: it
//!   runs on the reserved slot). None waiting (it left, or has counted itself but not yet
//!   claimed its place): settle by giving the slot back (`r - 1, g - 1`). A grant is paid
//!   for before it is made, so grants never exceed the slots and none is ever taken back.
//! - **no lost grant**: a dispatch with nothing to reserve still writes the word (unchanged,
//!   or with a note bit when grants are under way). Its read-modify-write orders the
//!   caller's claim before the next one on the word: a later release or settle sees that
//!   place; an earlier one is seen by this dispatch. Each settle clears the note and, if it
//!   was set, dispatches again.
//! - **release** (a running or granted ticket ends): free its place if it has one, `r - 1`,
//!   dispatch if someone waits.
//! - **leave** (a waiting ticket dropped: client gone, queue timeout): WAITING → FREE and
//!   `l - 1`, nothing else. If that compare-and-swap fails the ticket was granted
//!   meanwhile: it holds a slot and releases it. A granted ticket keeps its place until it
//!   ends (it is counted in `r`, so places still suffice).
//!
//! Order: grants go to the WAITING place of the most important class, and within it the
//! smallest arrival number; the scan is repeated until a pass finds nothing better: a
//! ticket whose `enter` returned before another's began was claimed before it, so it is
//! visible once the later one is, and is granted first. `tests/loom.rs` model-checks cap,
//! order and wake-ups.
//!
//! Classes ([`Class`]) may each fill only part of the N slots (`class_limits`, all N by
//! default): a ticket of class `c` takes a slot only while fewer than `limit[c]` are held.
//! A dispatch reserves first and then grants the best waiter its reservation allows (it
//! reserved slot number `r`, so waiters of classes with `limit <= r` are passed over). A
//! dispatch that passed over a waiter and gives its slot back looks at the word it wrote:
//! when fewer slots are held than that waiter's limit (a release or another give-back came
//! meanwhile), it dispatches again, so no waiter is left behind a slot it may take.

mod room;
mod tenants;
#[cfg(all(test, not(loom)))]
mod tests;

pub use room::{Notified, ROOM_EVICTED, ROOM_FULL, ROOM_TENANT_FULL, ROOM_TIMEOUT};
pub use room::{Room, Turned, Waiter};
pub use tenants::{Counted, InFlight, TENANTS};

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crossbeam_utils::CachePadded;

use crate::shed::Class;

#[cfg(loom)]
use loom::future::AtomicWaker;
#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(not(loom))]
use atomic_waker::AtomicWaker;
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

/// Dynamo's refusal messages, verbatim.
pub const AT_CAPACITY: &str = "Server overloaded: worker at capacity";
pub const QUEUE_TIMEOUT: &str =
    "Server overloaded: request rejected after exceeding the backend admission queue delay";
/// A waiter whose client's stated budget ended (Spillway's).
pub const DEADLINE: &str = "Server overloaded: request rejected when the time the client gave it ran out while it waited for a slot";

/// Width of each count in the word; N and Q are clamped below half of it.
const BITS: u32 = 21;
const MASK: u64 = (1 << BITS) - 1;
const L1: u64 = 1;
const R1: u64 = 1 << BITS;
const G1: u64 = 1 << (2 * BITS);
/// Set by a dispatch that found nothing to do while grants were under way.
const NOTE: u64 = 1 << 63;
const MAX_LIMIT: u32 = (1 << (BITS - 1)) - 1;

/// (l, r, g) of a word.
fn counts(w: u64) -> (u64, u64, u64) {
    (w & MASK, (w >> BITS) & MASK, (w >> (2 * BITS)) & MASK)
}

/// A place's state: `arrival << 4 | class << 2 | status`; FREE is 0.
const FREE: u64 = 0;
const WAITING: u64 = 1;
const GRANTED: u64 = 2;
const STATUS: u64 = 3;
const ARRIVAL_SHIFT: u32 = 4;
/// Arrival numbers wrap at 2^60; live ones are far closer than 2^59 to each other.
const ARRIVAL_MASK: u64 = (1 << 60) - 1;

/// True when arrival `a` came before arrival `b` (wrapping).
fn before(a: u64, b: u64) -> bool {
    ((a.wrapping_sub(b) << ARRIVAL_SHIFT) as i64) < 0
}

fn class_of(state: u64) -> usize {
    ((state >> 2) & 3) as usize
}

/// True when place state `a` is served before `b`: a more important class, or the same
/// class and an earlier arrival.
fn served_before(a: u64, b: u64) -> bool {
    match class_of(a).cmp(&class_of(b)) {
        std::cmp::Ordering::Less => true,
        std::cmp::Ordering::Greater => false,
        std::cmp::Ordering::Equal => before(a >> ARRIVAL_SHIFT, b >> ARRIVAL_SHIFT),
    }
}

/// The slots a class with `share` of N may fill: at least one, at most N.
pub fn class_slots(limit: u32, share: f64) -> u32 {
    ((f64::from(limit) * share) as u32).clamp(1, limit.max(1))
}

/// What a dispatch's scan did.
enum Granted {
    Yes,
    /// Nobody waits that this reservation could serve; `Some(limit)`: a waiter was passed
    /// over for its class limit (the lowest such limit).
    No(Option<u64>),
}

/// One waiting (or granted) ticket's place.
#[derive(Debug)]
struct Place {
    state: AtomicU64,
    waker: AtomicWaker,
}

impl Place {
    /// Ready once `done` holds. Checks, registers the task's waker, then checks again: a
    /// wake in between either sees the waker or is seen by the second check.
    fn poll_until(&self, cx: &mut Context<'_>, done: impl Fn() -> bool) -> Poll<()> {
        if done() {
            return Poll::Ready(());
        }
        #[cfg(loom)]
        self.waker.register(cx.waker().clone());
        #[cfg(not(loom))]
        self.waker.register(cx.waker());
        if done() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[derive(Debug)]
pub struct Gate {
    limit: u32,
    queue: u32,
    /// Slots each class may fill, by [`Class::index`].
    class_limits: [u32; 3],
    /// `note | g << 42 | r << 21 | l`.
    word: CachePadded<AtomicU64>,
    places: Box<[Place]>,
    arrivals: AtomicU64,
    rejected: AtomicU64,
    /// Slots given back so far, and the rate at which they were given back while
    /// requests waited: statistics for a waiter's predicted wait, outside the gate's
    /// invariants (plain atomics, not modelled by loom).
    released: std::sync::atomic::AtomicU64,
    pace: Pace,
}

impl Gate {
    /// `limit` engine slots (N ≥ 1) and `queue` waiting places (Q), each below 2^20; every
    /// class may fill all N.
    pub fn new(limit: u32, queue: u32) -> Gate {
        Gate::with_class_limits(limit, queue, [limit; 3])
    }

    /// As [`Gate::new`], each class filling at most its `class_limits` entry (by
    /// [`Class::index`]; clamped to 1..=N).
    pub fn with_class_limits(limit: u32, queue: u32, class_limits: [u32; 3]) -> Gate {
        let limit = limit.clamp(1, MAX_LIMIT);
        let queue = queue.min(MAX_LIMIT);
        Gate {
            limit,
            queue,
            class_limits: class_limits.map(|c| c.clamp(1, limit)),
            word: CachePadded::new(AtomicU64::new(0)),
            places: (0..limit + queue)
                .map(|_| Place {
                    state: AtomicU64::new(FREE),
                    waker: AtomicWaker::new(),
                })
                .collect(),
            arrivals: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            released: std::sync::atomic::AtomicU64::new(0),
            pace: Pace::default(),
        }
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    pub fn queue_limit(&self) -> u32 {
        self.queue
    }

    pub fn class_limit(&self, class: Class) -> u32 {
        self.class_limits[class.index()]
    }

    /// Takes a ticket for a request of `class`: a slot now, or a place in the queue; `None`
    /// when N + Q are already admitted (the caller refuses with [`AT_CAPACITY`]).
    pub fn enter(&self, class: Class) -> Option<Ticket<'_>> {
        let n = u64::from(self.class_limits[class.index()]);
        let cap = u64::from(self.limit + self.queue);
        let taken = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let (l, r, g) = counts(w);
                if l == 0 && r < n {
                    Some(w + R1)
                } else if r + l - g < cap {
                    Some(w + L1)
                } else {
                    None
                }
            });
        let Ok(before) = taken else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let (l, r, _) = counts(before);
        let place = if l == 0 && r < n {
            None
        } else {
            let place = self.claim(class);
            self.dispatch();
            Some(place)
        };
        Some(Ticket { gate: self, place })
    }

    /// A slot now, or `None` without queueing (a waiting room's look at this gate,
    /// `room.rs`). The word is written even when nothing is taken: that read-modify-write
    /// orders the look before the next release, which then finds the room's waiter.
    pub fn try_take(&self, class: Class) -> Option<Ticket<'_>> {
        let n = u64::from(self.class_limits[class.index()]);
        let free = |w: u64| {
            let (l, r, _) = counts(w);
            l == 0 && r < n
        };
        let before = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(if free(w) { w + R1 } else { w })
            })
            .unwrap_or_else(|w| w);
        // Built only when taken: a ticket dropped gives a slot back.
        free(before).then(|| Ticket {
            gate: self,
            place: None,
        })
    }

    /// Whether a request of `class` would take a slot now, by a reading: a hint (a
    /// decision uses [`Gate::look`] or [`Gate::try_take`]).
    pub fn has_room_for(&self, class: Class) -> bool {
        let n = u64::from(self.class_limits[class.index()]);
        let (l, r, _) = counts(self.word.load(Ordering::Acquire));
        l == 0 && r < n
    }

    /// Whether a request of `class` would take a slot now ([`Gate::try_take`] without
    /// taking it), by a read-modify-write of the word for the same reason.
    pub fn look(&self, class: Class) -> bool {
        let n = u64::from(self.class_limits[class.index()]);
        let before = (self.word)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, Some)
            .unwrap_or_else(|w| w);
        let (l, r, _) = counts(before);
        l == 0 && r < n
    }

    /// Claims a FREE place for a ticket already counted in `l`. One is always free: places
    /// in use never exceed the other tickets counted.
    fn claim(&self, class: Class) -> Waiting {
        claim(&self.places, &self.arrivals, class)
    }

    /// Hands free slots to the oldest waiters while there are both (see the module doc).
    fn dispatch(&self) {
        let n = u64::from(self.limit);
        loop {
            let reserved = self
                .word
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                    let (l, r, g) = counts(w);
                    if l > g && r < n {
                        Some(w + R1 + G1)
                    } else if g > 0 {
                        Some(w | NOTE)
                    } else {
                        // Written back unchanged: still a read-modify-write, which orders
                        // this waiter's claim before the next release (see the module doc).
                        Some(w)
                    }
                })
                .unwrap_or_else(|w| w);
            let (l, r, g) = counts(reserved);
            if l <= g || r >= n {
                return; // nothing to do, or a note left for the grants under way
            }
            let granted = self.grant_best(r);
            let settle = match granted {
                Granted::Yes => G1 + L1,
                Granted::No(_) => G1 + R1,
            };
            let before = self
                .word
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                    Some((w - settle) & !NOTE)
                })
                .unwrap_or_else(|w| w);
            let held_now = counts(before - settle).1;
            match granted {
                Granted::Yes => {}
                _ if before & NOTE != 0 => {}
                Granted::No(Some(limit)) if held_now < limit => {}
                Granted::No(_) => return,
            }
        }
    }

    /// Turns the best WAITING place that may take slot number `slot` GRANTED and wakes its
    /// task.
    fn grant_best(&self, slot: u64) -> Granted {
        loop {
            let (i, s, passed) = self.best_waiting(slot);
            let Some(i) = i else {
                return Granted::No(passed);
            };
            let place = &self.places[i];
            let granted = s - WAITING + GRANTED;
            if place
                .state
                .compare_exchange(s, granted, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                place.waker.wake();
                return Granted::Yes;
            }
        }
    }

    /// The WAITING place served first among those whose class may take slot number
    /// `slot`, its state, and the lowest class limit of those passed over. A second pass
    /// finds any better one claimed while the first ran: it was claimed before the one
    /// found (its `enter` finished first), so it is visible now.
    fn best_waiting(&self, slot: u64) -> (Option<usize>, u64, Option<u64>) {
        let (mut best, mut best_state, mut passed) = (None, 0, None::<u64>);
        loop {
            let mut better = false;
            for (i, p) in self.places.iter().enumerate() {
                let s = p.state.load(Ordering::Acquire);
                if s & STATUS != WAITING {
                    continue;
                }
                let limit = u64::from(self.class_limits[class_of(s)]);
                if slot >= limit {
                    passed = Some(passed.map_or(limit, |p| p.min(limit)));
                } else if best.is_none() || served_before(s, best_state) {
                    (best, best_state, better) = (Some(i), s, true);
                }
            }
            if !better {
                return (best, best_state, passed);
            }
        }
    }

    /// Gives back the slot of a ticket that holds one.
    fn release(&self) {
        self.released
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let before = self.word.fetch_sub(R1, Ordering::AcqRel);
        if counts(before).0 > 0 {
            self.dispatch();
        }
    }

    /// Counts a refusal that happened after a ticket was taken (queue timeout).
    pub fn count_refusal(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// (in flight, waiting), for gauges. A slot reserved for a waiter (being granted) is
    /// counted as in flight, so in flight ≤ N at every instant. Waiting ≤ Q holds when
    /// every class may fill all N; waiters held back by their class's share wait beside
    /// free slots, so then up to N + Q minus those in flight may wait.
    pub fn occupancy(&self) -> (u64, u64) {
        let (l, r, g) = counts(self.word.load(Ordering::Acquire));
        let admitted = r + l - g;
        // A slot reserved for a waiter counts as its own: running, no longer waiting.
        let running = if g <= l { r.min(admitted) } else { admitted };
        (running, admitted - running)
    }

    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// Slots given back so far (the monitor measures their rate).
    pub fn released(&self) -> u64 {
        self.released.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The rate at which its slots come back while requests wait.
    pub fn pace(&self) -> &Pace {
        &self.pace
    }
}

/// The rate at which slots come back while requests wait (per 1,000 s; 0: not measured),
/// as the monitor last measured it (`monitor/release.rs`): a waiter's predicted wait.
#[derive(Debug, Default)]
pub struct Pace(std::sync::atomic::AtomicU64);

impl Pace {
    /// Publishes a measured rate, per second (0: unknown).
    pub fn set(&self, per_sec: f64) {
        let milli = (per_sec * 1_000.0).round().clamp(0.0, u64::MAX as f64) as u64;
        self.0.store(milli, std::sync::atomic::Ordering::Relaxed);
    }

    /// The published rate, per second (0: unknown).
    pub fn per_sec(&self) -> f64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1_000.0
    }

    /// How long the waiter at 1-based `position` in line may expect to wait, in ms, at
    /// the published rate; `None` while that rate is unknown.
    pub fn predicted_wait_ms(&self, position: u64) -> Option<u64> {
        let milli = self.0.load(std::sync::atomic::Ordering::Relaxed);
        predicted_wait_ms(position, milli)
    }
}

/// The wait of the waiter at 1-based `position` when slots come back `milli` times per
/// 1,000 s: `position` releases; `None` when the rate is 0 (unknown).
pub fn predicted_wait_ms(position: u64, milli: u64) -> Option<u64> {
    (milli > 0).then(|| position.saturating_mul(1_000_000) / milli)
}

/// Claims a FREE place among `places` for one already counted, with the next arrival
/// number: one is always free when places in use never exceed those counted.
fn claim(places: &[Place], arrivals: &AtomicU64, class: Class) -> Waiting {
    let arrival = arrivals.fetch_add(1, Ordering::Relaxed);
    claim_at(places, arrival, arrival, class)
}

/// [`claim`] searching from place `start` (modulo), for a waiter served in `order` (an
/// arrival number, or a fair-queuing tag) within its class.
fn claim_at(places: &[Place], start: u64, order: u64, class: Class) -> Waiting {
    let state = (order & ARRIVAL_MASK) << ARRIVAL_SHIFT | (class.index() as u64) << 2 | WAITING;
    let mut i = (start % places.len() as u64) as usize;
    loop {
        let s = &places[i].state;
        if s.compare_exchange(FREE, state, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Waiting { index: i, state };
        }
        i = (i + 1) % places.len();
    }
}

/// A queued ticket's place and its WAITING state (arrival number included).
#[derive(Debug, Clone, Copy)]
struct Waiting {
    index: usize,
    state: u64,
}

/// A place at the gate: waiting until [`Ticket::ready`], then an engine slot. Given back
/// on drop, whatever happened.
#[derive(Debug)]
pub struct Ticket<'a> {
    gate: &'a Gate,
    /// `None`: ran at once.
    place: Option<Waiting>,
}

impl Ticket<'_> {
    /// True once this ticket holds an engine slot.
    pub fn is_ready(&self) -> bool {
        self.place.is_none_or(|p| {
            self.gate.places[p.index].state.load(Ordering::Acquire) == p.state - WAITING + GRANTED
        })
    }

    /// Resolves when this ticket holds an engine slot.
    pub fn ready(&self) -> Ready<'_, '_> {
        Ready { ticket: self }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let gate = self.gate;
        let Some(p) = self.place else {
            return gate.release();
        };
        let state = &gate.places[p.index].state;
        match state.compare_exchange(p.state, FREE, Ordering::AcqRel, Ordering::Acquire) {
            // Left the queue: a place freed, no slot.
            Ok(_) => {
                gate.word.fetch_sub(L1, Ordering::AcqRel);
            }
            // Granted (perhaps just now): the place is ours to free, then the slot.
            Err(_) => {
                state.store(FREE, Ordering::Release);
                gate.release();
            }
        }
    }
}

/// Future of [`Ticket::ready`].
#[derive(Debug)]
pub struct Ready<'t, 'g> {
    ticket: &'t Ticket<'g>,
}

impl Future for Ready<'_, '_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let ticket = self.ticket;
        match ticket.place {
            Some(p) => ticket.gate.places[p.index].poll_until(cx, || ticket.is_ready()),
            None => Poll::Ready(()),
        }
    }
}
