//! Model check of the admission gate with loom: every interleaving of three requests at a
//! gate of one slot and one waiting place. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom` (.ci/run does).
#![cfg(loom)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use spillway::admission::Gate;

/// `requests` threads; the last one gives up if it has to wait (a queue timeout or a
/// client leaving while queued).
fn model(limit: u32, queue: u32, requests: usize) {
    loom::model(move || {
        let gate = Arc::new(Gate::new(limit, queue));
        let running = Arc::new(AtomicUsize::new(0));
        let admitted = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..requests)
            .map(|i| {
                let (gate, running, admitted) = (gate.clone(), running.clone(), admitted.clone());
                thread::spawn(move || {
                    let Some(ticket) = gate.enter() else {
                        return false;
                    };
                    let a = admitted.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(a <= (limit + queue) as usize, "more than N + Q admitted");
                    if i == requests - 1 && !ticket.is_ready() {
                        admitted.fetch_sub(1, Ordering::SeqCst);
                        return false;
                    }
                    // A lost wake-up would leave this blocked forever: loom reports it.
                    loom::future::block_on(ticket.ready());
                    let r = running.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(r <= limit as usize, "more than N in flight");
                    running.fetch_sub(1, Ordering::SeqCst);
                    admitted.fetch_sub(1, Ordering::SeqCst);
                    drop(ticket);
                    true
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(gate.occupancy(), (0, 0));
    });
}

#[test]
fn one_slot_one_place_three_requests() {
    model(1, 1, 3);
}

#[test]
fn two_slots_no_place_three_requests() {
    model(2, 0, 3);
}
