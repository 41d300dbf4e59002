//! Model check of a model's waiting room with loom (`admission/room.rs`): requests that
//! find every gate of the model full wait in the room and look again when notified; each
//! request that ends gives its slot back and notifies the room, as `proxy/guards.rs` does.
//! Every interleaving (up to the preemption bound) of a few requests at one or two gates,
//! including waiters that leave while notified and a waiter a more important request
//! evicts. Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom_room`
//! (.ci/run does).
//!
//! At every step: at most N running per gate, at most the room's cap waiting; at the end
//! the gates and the room are empty. A lost notification leaves a waiter blocked forever
//! while a slot stands free, which loom reports as a deadlock.
#![cfg(loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Waker};

// The model's own bookkeeping uses std types (see tests/loom.rs).
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use loom::thread;
use spillway::admission::{Gate, Room, Ticket};
use spillway::shed::Class;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Waits until it holds a slot, runs, ends.
    Run,
    /// Looks when due, polls once, then leaves unless it found a slot: a room timeout.
    TimeOut,
}

struct Shared {
    gates: Vec<Gate>,
    room: Room,
    limit: usize,
    running: Vec<AtomicUsize>,
    waiting: AtomicUsize,
    /// Evictions the scenario allows for.
    evictions: usize,
}

impl Shared {
    fn new(gates: usize, limit: u32, room: u32) -> Arc<Shared> {
        Arc::new(Shared {
            gates: (0..gates).map(|_| Gate::new(limit, 0)).collect(),
            room: Room::new(room),
            limit: limit as usize,
            running: (0..gates).map(|_| AtomicUsize::new(0)).collect(),
            waiting: AtomicUsize::new(0),
            evictions: 0,
        })
    }

    /// A slot at the first gate with one free.
    fn look(&self) -> Option<(usize, Ticket<'_>)> {
        (self.gates.iter().enumerate())
            .find_map(|(i, g)| g.try_take(Class::Standard).map(|t| (i, t)))
    }

    /// Runs on a slot of gate `i`, then gives it back and notifies the room.
    fn run(&self, i: usize, ticket: Ticket<'_>) {
        let r = self.running[i].fetch_add(1, Ordering::SeqCst) + 1;
        assert!(r <= self.limit, "more than N in flight");
        self.running[i].fetch_sub(1, Ordering::SeqCst);
        self.end(ticket);
    }

    fn end(&self, ticket: Ticket<'_>) {
        drop(ticket);
        self.room.notify();
    }

    /// One request: a free slot, else the room.
    fn request(&self, plan: Plan) {
        self.request_as(plan, Class::Standard)
    }

    /// One request of `class`; one evicted from the room leaves.
    fn request_as(&self, plan: Plan, class: Class) {
        if let Some((i, t)) = self.look() {
            return self.run(i, t);
        }
        let Ok(mut waiter) = self.room.enter(class, 0) else {
            return;
        };
        let w = self.waiting.fetch_add(1, Ordering::SeqCst) + 1;
        let cap = self.room.capacity() as usize;
        assert!(
            self.room.waiting() as usize <= cap,
            "more than the room's cap"
        );
        // An evicted waiter counts here until it sees it: one per eviction under way.
        assert!(
            w <= cap + self.evictions,
            "more than the room's cap waiting"
        );
        let found = loop {
            if waiter.evicted() {
                break None;
            }
            if waiter.due() {
                if let Some(found) = self.look() {
                    break Some(found);
                }
                continue;
            }
            match plan {
                // A lost notification leaves this blocked forever: loom reports it.
                Plan::Run => loom::future::block_on(waiter.notified()),
                Plan::TimeOut => {
                    let mut cx = Context::from_waker(Waker::noop());
                    let _ = pin!(waiter.notified()).poll(&mut cx);
                    if waiter.due() {
                        break self.look();
                    }
                    break None;
                }
            }
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        drop(waiter);
        if let Some((i, t)) = found {
            self.run(i, t);
        }
    }

    fn assert_empty(&self) {
        for g in &self.gates {
            assert_eq!(g.occupancy(), (0, 0));
        }
        assert_eq!(self.room.waiting(), 0);
    }
}

/// `held` slots (round robin over `gates` gates of `limit`) are taken at the start; the
/// model's own thread ends them one after another while `plans` requests arrive at once.
fn model(gates: usize, limit: u32, room: u32, held: usize, plans: &'static [Plan]) {
    loom::model(move || {
        let s = Shared::new(gates, limit, room);
        let tickets: Vec<_> = (0..held)
            .map(|h| s.gates[h % gates].try_take(Class::Standard).unwrap())
            .collect();
        let requests: Vec<_> = plans
            .iter()
            .map(|&plan| {
                let s = s.clone();
                thread::spawn(move || s.request(plan))
            })
            .collect();
        for t in tickets {
            s.end(t);
        }
        for t in requests {
            t.join().unwrap();
        }
        s.assert_empty();
    });
}

/// [`model`] with requests of classes: `(plan, class)` each; a full room may evict.
fn model_classes(room: u32, plans: &'static [(Plan, Class)]) {
    loom::model(move || {
        let mut s = Shared::new(1, 1, room);
        Arc::get_mut(&mut s).unwrap().evictions = plans.len();
        let held = s.gates[0].try_take(Class::Standard).unwrap();
        let requests: Vec<_> = plans
            .iter()
            .map(|&(plan, class)| {
                let s = s.clone();
                thread::spawn(move || s.request_as(plan, class))
            })
            .collect();
        s.end(held);
        for t in requests {
            t.join().unwrap();
        }
        s.assert_empty();
    });
}

use Plan::{Run, TimeOut};

/// A slot comes back while a request enters the room: it finds it, or is notified.
#[test]
fn one_gate_one_slot_a_release_and_a_waiter() {
    model(1, 1, 1, 1, &[Run]);
}

/// Two waiters and one slot going round: each ends and notifies the next.
#[test]
fn one_gate_one_slot_two_waiters() {
    model(1, 1, 2, 1, &[Run, Run]);
}

/// A waiter times out, perhaps with a notification: it passes it on.
#[test]
fn one_gate_one_slot_one_waiter_times_out() {
    model(1, 1, 2, 1, &[TimeOut, Run]);
}

/// Two gates free a slot each at once; the waiter binds to either.
#[test]
fn two_gates_two_releases_one_waiter() {
    model(2, 1, 1, 2, &[Run]);
}

/// The room's cap is exact: with one place, one of two waits and the other is refused or
/// finds a slot.
#[test]
fn one_gate_room_of_one_two_requests() {
    model(1, 1, 1, 1, &[Run, Run]);
}

/// A full room of one: a critical request evicts the sheddable waiter (or finds the slot,
/// or waits behind nobody) while the slot comes back; the evicted one leaves, nobody is
/// stranded, and the room's count stays exact.
#[test]
fn a_critical_request_evicts_a_sheddable_waiter() {
    model_classes(1, &[(Run, Class::Sheddable), (Run, Class::Critical)]);
}
