//! Model check of the admission gate with loom: every interleaving (up to the preemption
//! bound) of a few requests at small gates, including waiters that leave the queue at
//! once, after their waker is registered (a queue timeout), or while being granted. Run
//! with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --test loom`
//! (.ci/run does).
//!
//! At every step: at most N running, at most N + Q admitted; at the end the gate is empty.
//! A lost wake-up leaves a waiter blocked forever, which loom reports as a deadlock. Where
//! arrival order is known (each request sent after the previous one's `enter` returned),
//! those that ran started in that order.
#![cfg(loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

// The model's own bookkeeping uses std types: loom runs one thread at a time, so they see
// the schedule's order, and they add no interleavings of their own to explore.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use loom::thread;
use spillway::admission::{Gate, Ticket};
use spillway::shed::Class;

/// What a request does once admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Waits for its turn, runs, leaves.
    Run,
    /// Leaves at once if it has to wait (the client went away while queued).
    Leave,
    /// Polls once if it has to wait (the waker is registered), then leaves unless its turn
    /// came meanwhile: a queue timeout, as `proxy/admit.rs` handles it.
    TimeOut,
}

struct Shared {
    gate: Gate,
    /// Running yields to the other threads (a request takes a while). Loom does not count
    /// that as a preemption, so more of the interesting interleavings fit in its bound,
    /// at the price of many more to explore: some of the models that enter in order use it.
    busy: bool,
    limit: usize,
    cap: usize,
    /// Each request's class by id (standard when absent), and the slots sheddable ones may
    /// fill.
    classes: &'static [Class],
    sheddable_limit: usize,
    running: AtomicUsize,
    running_sheddable: AtomicUsize,
    admitted: AtomicUsize,
    /// Requests in the order they started running.
    started: Mutex<Vec<usize>>,
}

impl Shared {
    fn new(limit: u32, queue: u32, busy: bool) -> Arc<Shared> {
        Shared::with_classes(limit, queue, busy, &[], limit)
    }

    fn with_classes(
        limit: u32,
        queue: u32,
        busy: bool,
        classes: &'static [Class],
        sheddable_limit: u32,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            gate: Gate::with_class_limits(limit, queue, [limit, limit, sheddable_limit]),
            busy,
            limit: limit as usize,
            cap: (limit + queue) as usize,
            classes,
            sheddable_limit: sheddable_limit as usize,
            running: AtomicUsize::new(0),
            running_sheddable: AtomicUsize::new(0),
            admitted: AtomicUsize::new(0),
            started: Mutex::new(Vec::new()),
        })
    }

    /// One request: `enter`, then `plan`.
    fn class(&self, id: usize) -> Class {
        self.classes.get(id).copied().unwrap_or_default()
    }

    fn request(&self, id: usize, plan: Plan) {
        let Some(ticket) = self.gate.enter(self.class(id)) else {
            return;
        };
        let a = self.admitted.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(a <= self.cap, "more than N + Q admitted");
        self.after_enter(id, plan, ticket);
    }

    fn after_enter(&self, id: usize, plan: Plan, ticket: Ticket<'_>) {
        let run = match plan {
            _ if ticket.is_ready() => true,
            Plan::Run => {
                // A lost wake-up would leave this blocked forever: loom reports it.
                loom::future::block_on(ticket.ready());
                true
            }
            Plan::Leave => false,
            Plan::TimeOut => {
                let mut cx = Context::from_waker(Waker::noop());
                matches!(pin!(ticket.ready()).poll(&mut cx), Poll::Ready(())) || ticket.is_ready()
            }
        };
        if run {
            let r = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(r <= self.limit, "more than N in flight");
            let sheddable = self.class(id) == Class::Sheddable;
            if sheddable {
                let r = self.running_sheddable.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(r <= self.sheddable_limit, "sheddable over its share");
            }
            self.started.lock().unwrap().push(id);
            if self.busy {
                thread::yield_now();
            }
            if sheddable {
                self.running_sheddable.fetch_sub(1, Ordering::SeqCst);
            }
            self.running.fetch_sub(1, Ordering::SeqCst);
        }
        self.admitted.fetch_sub(1, Ordering::SeqCst);
        drop(ticket);
    }

    fn assert_empty(&self) {
        assert_eq!(self.gate.occupancy(), (0, 0));
        assert_eq!(self.admitted.load(Ordering::SeqCst), 0);
    }
}

/// All requests arrive at once, in any order (the first on the model's own thread).
fn concurrent(limit: u32, queue: u32, plans: &'static [Plan]) {
    concurrent_classes(limit, queue, plans, &[], limit);
}

/// As [`concurrent`], request `i` of class `classes[i]`, sheddable ones filling at most
/// `sheddable_limit` slots.
fn concurrent_classes(
    limit: u32,
    queue: u32,
    plans: &'static [Plan],
    classes: &'static [Class],
    sheddable_limit: u32,
) {
    loom::model(move || {
        let s = Shared::with_classes(limit, queue, false, classes, sheddable_limit);
        let threads: Vec<_> = (1..plans.len())
            .map(|id| {
                let s = s.clone();
                thread::spawn(move || s.request(id, plans[id]))
            })
            .collect();
        s.request(0, plans[0]);
        for t in threads {
            t.join().unwrap();
        }
        s.assert_empty();
    });
}

/// Request `i + 1` is sent by request `i` once its `enter` has returned: arrival order is
/// the index order, and with one slot those that ran must have started in it (with two,
/// two granted together may start in either order). Everything else (turns coming,
/// leaving, wakes) runs concurrently.
fn in_order(limit: u32, queue: u32, busy: bool, plans: &'static [Plan]) {
    fn chain(s: Arc<Shared>, id: usize, plans: &'static [Plan]) {
        let ticket = s.gate.enter(s.class(id));
        let next = (id + 1 < plans.len()).then(|| {
            let s = s.clone();
            thread::spawn(move || chain(s, id + 1, plans))
        });
        if let Some(ticket) = ticket {
            let a = s.admitted.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(a <= s.cap, "more than N + Q admitted");
            s.after_enter(id, plans[id], ticket);
        }
        if let Some(next) = next {
            next.join().unwrap();
        }
    }
    loom::model(move || {
        let s = Shared::new(limit, queue, busy);
        chain(s.clone(), 0, plans);
        let started = s.started.lock().unwrap().clone();
        assert!(
            limit > 1 || started.windows(2).all(|w| w[0] < w[1]),
            "started out of arrival order: {started:?}"
        );
        s.assert_empty();
    });
}

use Plan::{Leave, Run, TimeOut};

#[test]
fn one_slot_two_places_three_in_order() {
    in_order(1, 2, true, &[Run, Run, Run]);
}

/// The defect this gate fixes: with one slot, a waiter that leaves must not let the one
/// before it run beside the first.
#[test]
fn one_slot_two_places_the_last_leaves_in_order() {
    in_order(1, 2, true, &[Run, Run, Leave]);
}

/// The head of the queue times out while the slot comes free: it leaves or runs, and the
/// one behind it gets the slot either way (no grant lost, none doubled).
#[test]
fn one_slot_two_places_the_head_times_out_in_order() {
    in_order(1, 2, true, &[Run, TimeOut, Run]);
}

#[test]
fn one_slot_two_places_four_in_order_two_give_up() {
    in_order(1, 2, false, &[Run, TimeOut, Leave, Run]);
}

#[test]
fn one_slot_two_places_four_in_order_the_head_leaves() {
    in_order(1, 2, false, &[Run, Leave, Run, Run]);
}

#[test]
fn two_slots_two_places_five_in_order() {
    in_order(2, 2, false, &[Run, Run, Leave, TimeOut, Run]);
}

#[test]
fn two_slots_two_places_three_in_order_the_last_times_out() {
    in_order(2, 2, true, &[Run, Run, TimeOut]);
}

#[test]
fn one_slot_two_places_three_at_once_one_leaves() {
    concurrent(1, 2, &[Run, Leave, Run]);
}

#[test]
fn one_slot_two_places_three_at_once_one_times_out() {
    concurrent(1, 2, &[Run, TimeOut, Run]);
}

#[test]
fn two_slots_two_places_three_at_once() {
    concurrent(2, 2, &[Run, TimeOut, Run]);
}

#[test]
fn one_slot_no_place_two_at_once() {
    concurrent(1, 0, &[Run, Leave]);
}

/// Two sheddable requests (at most one slot of two between them) and a critical one at
/// once: the share holds, and a sheddable waiter gets the slot its share allows once the
/// other ends (a wake-up lost to a passed-over grant would deadlock).
#[test]
fn two_slots_sheddable_share_one_three_at_once() {
    concurrent_classes(
        2,
        2,
        &[Run, Run, Run],
        &[Class::Sheddable, Class::Sheddable, Class::Critical],
        1,
    );
}

/// A sheddable waiter passed over for its share while a critical one times out.
#[test]
fn two_slots_sheddable_share_one_critical_times_out() {
    concurrent_classes(
        2,
        1,
        &[Run, Run, TimeOut],
        &[Class::Sheddable, Class::Sheddable, Class::Critical],
        1,
    );
}
