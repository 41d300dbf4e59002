use super::*;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

#[test]
fn wrapping_counters() {
    assert!(before(5, 6));
    assert!(!before(6, 5));
    assert!(!before(5, 5));
    assert!(before(ARRIVAL_MASK, 0), "across the wrap");
    assert!(before(ARRIVAL_MASK - 1, 1));
    assert!(!before(0, ARRIVAL_MASK));
    // A gate whose arrival numbers sit just below the wrap keeps its cap and its order.
    let g = Gate::new(1, 2);
    g.arrivals.store(ARRIVAL_MASK, Ordering::SeqCst);
    let a = g.enter().unwrap();
    let b = g.enter().unwrap();
    let c = g.enter().unwrap();
    assert!(g.enter().is_none());
    assert!(a.is_ready() && !b.is_ready() && !c.is_ready());
    drop(a);
    assert!(b.is_ready() && !c.is_ready());
    drop(b);
    assert!(c.is_ready());
    drop(c);
    assert_eq!(g.occupancy(), (0, 0));
}

#[test]
fn exact_cap_and_fifo() {
    let g = Gate::new(2, 2);
    let a = g.enter().unwrap();
    let b = g.enter().unwrap();
    let c = g.enter().unwrap();
    let d = g.enter().unwrap();
    assert!(g.enter().is_none(), "N + Q + 1 admitted");
    assert!(a.is_ready() && b.is_ready());
    assert!(!c.is_ready() && !d.is_ready());
    assert_eq!(g.occupancy(), (2, 2));
    drop(b); // out of order completion still frees the next in line
    assert!(c.is_ready() && !d.is_ready());
    let e = g.enter().unwrap(); // one place freed
    assert!(g.enter().is_none());
    drop(d); // d gives up while queued: e moves up but still waits for a slot
    assert!(!e.is_ready());
    drop(a);
    assert!(e.is_ready());
    assert_eq!(g.rejected(), 2);
    drop((c, e));
    assert_eq!(g.occupancy(), (0, 0));
}

/// Semantics §6: N = 1, Q = 2; A runs, B and C wait. C leaving frees C's place, not a
/// slot: B still waits while A runs. Then the same with the head of the queue leaving.
#[test]
fn a_waiter_that_leaves_frees_a_place_never_a_slot() {
    let g = Gate::new(1, 2);
    let a = g.enter().unwrap();
    let b = g.enter().unwrap();
    let c = g.enter().unwrap();
    drop(c);
    assert!(!b.is_ready(), "two running at a gate of one slot");
    assert_eq!(g.occupancy(), (1, 1));
    let d = g.enter().unwrap(); // C's place is free again
    assert!(g.enter().is_none());
    drop(b); // the head leaves: D moves up, still waiting
    assert!(!d.is_ready());
    assert_eq!(g.occupancy(), (1, 1));
    drop(a);
    assert!(d.is_ready());
    assert_eq!(g.occupancy(), (1, 0));
    drop(d);
    assert_eq!(g.occupancy(), (0, 0));
}

/// A waiter granted a slot it has not looked at yet gives the slot back when dropped, and
/// the next in line gets it.
#[test]
fn a_grant_not_yet_seen_is_given_back_on_drop() {
    let g = Gate::new(1, 3);
    let a = g.enter().unwrap();
    let b = g.enter().unwrap();
    let c = g.enter().unwrap();
    drop(a); // grants b
    drop(b); // without looking: its slot passes to c
    assert!(c.is_ready());
    assert_eq!(g.occupancy(), (1, 0));
    let d = g.enter().unwrap();
    assert!(!d.is_ready(), "a newcomer passed nobody but found no slot");
    drop(c);
    assert!(d.is_ready());
    drop(d);
    assert_eq!(g.occupancy(), (0, 0));
}

/// Places are reused in any order and the queue keeps its order across them.
#[test]
fn places_are_reused_out_of_order() {
    let g = Gate::new(1, 3);
    let run = g.enter().unwrap();
    let mut queue: Vec<_> = (0..3).map(|_| g.enter().unwrap()).collect();
    queue.remove(1); // the middle one leaves
    queue.push(g.enter().unwrap()); // takes the freed place, last in line
    queue.remove(0);
    queue.push(g.enter().unwrap());
    assert!(g.enter().is_none());
    drop(run);
    for (i, t) in queue.iter().enumerate() {
        assert_eq!(t.is_ready(), i == 0, "ticket {i}");
    }
    while !queue.is_empty() {
        assert!(queue[0].is_ready());
        queue.remove(0);
    }
    assert_eq!(g.occupancy(), (0, 0));
}

/// Many threads hammer one gate: never more than N running or N + Q admitted, and
/// every ticket ends.
#[test]
fn concurrent_hammer_never_exceeds_the_cap() {
    const N: u32 = 3;
    const Q: u32 = 2;
    let g = Arc::new(Gate::new(N, Q));
    let running = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicUsize::new(0));
    let max_running = Arc::new(AtomicUsize::new(0));
    let max_admitted = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (g, running, admitted, max_running, max_admitted) = (
                g.clone(),
                running.clone(),
                admitted.clone(),
                max_running.clone(),
                max_admitted.clone(),
            );
            std::thread::spawn(move || {
                for i in 0..2_000 {
                    let Some(t) = g.enter() else { continue };
                    let a = admitted.fetch_add(1, Ordering::SeqCst) + 1;
                    max_admitted.fetch_max(a, Ordering::SeqCst);
                    // Spin until our turn (or give up sometimes, like a timeout).
                    let mut spins = 0u32;
                    while !t.is_ready() {
                        spins += 1;
                        if i % 7 == 0 && spins > 50 {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                    if t.is_ready() {
                        let r = running.fetch_add(1, Ordering::SeqCst) + 1;
                        max_running.fetch_max(r, Ordering::SeqCst);
                        std::hint::spin_loop();
                        running.fetch_sub(1, Ordering::SeqCst);
                    }
                    admitted.fetch_sub(1, Ordering::SeqCst);
                    drop(t);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(max_running.load(Ordering::SeqCst) <= N as usize);
    assert!(max_admitted.load(Ordering::SeqCst) <= (N + Q) as usize);
    assert_eq!(g.occupancy(), (0, 0));
}
