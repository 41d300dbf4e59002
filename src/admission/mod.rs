//! Worker admission (semantics §6): at most N requests in flight to a worker and at most Q
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
//! FIFO: grants go to the smallest arrival number among WAITING places, and the scan is
//! repeated until a pass finds nothing older: a ticket whose `enter` returned before
//! another's began was claimed before it, so it is visible once the later one is, and is
//! granted first. `tests/loom.rs` model-checks cap, order and wake-ups.

#[cfg(all(test, not(loom)))]
mod tests;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crossbeam_utils::CachePadded;

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

/// A place's state: `arrival << 2 | status`; FREE is 0.
const FREE: u64 = 0;
const WAITING: u64 = 1;
const GRANTED: u64 = 2;
/// Arrival numbers wrap at 2^62; live ones are far closer than 2^61 to each other.
const ARRIVAL_MASK: u64 = (1 << 62) - 1;

/// True when arrival `a` came before arrival `b` (wrapping).
fn before(a: u64, b: u64) -> bool {
    ((a.wrapping_sub(b) << 2) as i64) < 0
}

/// One waiting (or granted) ticket's place.
#[derive(Debug)]
struct Place {
    state: AtomicU64,
    waker: AtomicWaker,
}

#[derive(Debug)]
pub struct Gate {
    limit: u32,
    queue: u32,
    /// `note | g << 42 | r << 21 | l`.
    word: CachePadded<AtomicU64>,
    places: Box<[Place]>,
    arrivals: AtomicU64,
    rejected: AtomicU64,
}

impl Gate {
    /// `limit` engine slots (N ≥ 1) and `queue` waiting places (Q), each below 2^20.
    pub fn new(limit: u32, queue: u32) -> Gate {
        let limit = limit.clamp(1, MAX_LIMIT);
        let queue = queue.min(MAX_LIMIT);
        Gate {
            limit,
            queue,
            word: CachePadded::new(AtomicU64::new(0)),
            places: (0..limit + queue)
                .map(|_| Place {
                    state: AtomicU64::new(FREE),
                    waker: AtomicWaker::new(),
                })
                .collect(),
            arrivals: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    pub fn queue_limit(&self) -> u32 {
        self.queue
    }

    /// Takes a ticket: a slot now, or a place in the queue; `None` when N + Q are already
    /// admitted (the caller refuses with [`AT_CAPACITY`]).
    pub fn enter(&self) -> Option<Ticket<'_>> {
        let (n, cap) = (u64::from(self.limit), u64::from(self.limit + self.queue));
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
            let place = self.claim();
            self.dispatch();
            Some(place)
        };
        Some(Ticket { gate: self, place })
    }

    /// Claims a FREE place for a ticket already counted in `l`. One is always free: places
    /// in use never exceed the other tickets counted.
    fn claim(&self) -> Waiting {
        let arrival = self.arrivals.fetch_add(1, Ordering::Relaxed) & ARRIVAL_MASK;
        let state = arrival << 2 | WAITING;
        let mut i = (arrival % self.places.len() as u64) as usize;
        loop {
            let s = &self.places[i].state;
            if s.compare_exchange(FREE, state, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Waiting { index: i, state };
            }
            i = (i + 1) % self.places.len();
        }
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
            let settle = match self.grant_oldest() {
                Some(_) => G1 + L1,
                None => G1 + R1,
            };
            let before = self
                .word
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                    Some((w - settle) & !NOTE)
                })
                .unwrap_or_else(|w| w);
            if settle == G1 + R1 && before & NOTE == 0 {
                return;
            }
        }
    }

    /// Turns the oldest WAITING place GRANTED and wakes its task; `None` when no place
    /// waits.
    fn grant_oldest(&self) -> Option<usize> {
        loop {
            let (i, s) = self.oldest_waiting()?;
            let place = &self.places[i];
            let granted = s - WAITING + GRANTED;
            if place
                .state
                .compare_exchange(s, granted, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                place.waker.wake();
                return Some(i);
            }
        }
    }

    /// The WAITING place with the smallest arrival number. A second pass finds any older
    /// one claimed while the first ran: it was claimed before the one found (its `enter`
    /// finished first), so it is visible now.
    fn oldest_waiting(&self) -> Option<(usize, u64)> {
        let mut best: Option<(usize, u64)> = None;
        loop {
            let mut older = false;
            for (i, p) in self.places.iter().enumerate() {
                let s = p.state.load(Ordering::Acquire);
                if s & 3 == WAITING && best.is_none_or(|(_, b)| before(s >> 2, b >> 2)) {
                    best = Some((i, s));
                    older = true;
                }
            }
            if !older {
                return best;
            }
        }
    }

    /// Gives back the slot of a ticket that holds one.
    fn release(&self) {
        let before = self.word.fetch_sub(R1, Ordering::AcqRel);
        if counts(before).0 > 0 {
            self.dispatch();
        }
    }

    /// Counts a refusal that happened after a ticket was taken (queue timeout).
    pub fn count_rejection(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// (in flight, waiting), for gauges. Slots free or reserved while someone waits are
    /// that waiter's already (it is being granted), so in flight ≤ N and waiting ≤ Q at
    /// every instant.
    pub fn occupancy(&self) -> (u64, u64) {
        let (l, r, g) = counts(self.word.load(Ordering::Acquire));
        let admitted = r + l - g;
        let running = admitted.min(u64::from(self.limit));
        (running, admitted - running)
    }

    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
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
        let Some(p) = ticket.place.filter(|_| !ticket.is_ready()) else {
            return Poll::Ready(());
        };
        // Register first, then check again: a grant in between either sees the waker or
        // is seen by the second check.
        let waker = &ticket.gate.places[p.index].waker;
        #[cfg(loom)]
        waker.register(cx.waker().clone());
        #[cfg(not(loom))]
        waker.register(cx.waker());
        if ticket.is_ready() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}
