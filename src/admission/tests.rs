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
    let a = g.enter(Class::Standard).unwrap();
    let b = g.enter(Class::Standard).unwrap();
    let c = g.enter(Class::Standard).unwrap();
    assert!(g.enter(Class::Standard).is_none());
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
    let a = g.enter(Class::Standard).unwrap();
    let b = g.enter(Class::Standard).unwrap();
    let c = g.enter(Class::Standard).unwrap();
    let d = g.enter(Class::Standard).unwrap();
    assert!(g.enter(Class::Standard).is_none(), "N + Q + 1 admitted");
    assert!(a.is_ready() && b.is_ready());
    assert!(!c.is_ready() && !d.is_ready());
    assert_eq!(g.occupancy(), (2, 2));
    drop(b); // out of order completion still frees the next in line
    assert!(c.is_ready() && !d.is_ready());
    let e = g.enter(Class::Standard).unwrap(); // one place freed
    assert!(g.enter(Class::Standard).is_none());
    drop(d); // d gives up while queued: e moves up but still waits for a slot
    assert!(!e.is_ready());
    drop(a);
    assert!(e.is_ready());
    assert_eq!(g.rejected(), 2);
    drop((c, e));
    assert_eq!(g.occupancy(), (0, 0));
}

/// docs/behaviour.md §8.2: N = 1, Q = 2; A runs, B and C wait. C leaving frees C's place, not a
/// slot: B still waits while A runs. Then the same with the head of the queue leaving.
#[test]
fn a_waiter_that_leaves_frees_a_place_never_a_slot() {
    let g = Gate::new(1, 2);
    let a = g.enter(Class::Standard).unwrap();
    let b = g.enter(Class::Standard).unwrap();
    let c = g.enter(Class::Standard).unwrap();
    drop(c);
    assert!(!b.is_ready(), "two running at a gate of one slot");
    assert_eq!(g.occupancy(), (1, 1));
    let d = g.enter(Class::Standard).unwrap(); // C's place is free again
    assert!(g.enter(Class::Standard).is_none());
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
    let a = g.enter(Class::Standard).unwrap();
    let b = g.enter(Class::Standard).unwrap();
    let c = g.enter(Class::Standard).unwrap();
    drop(a); // grants b
    drop(b); // without looking: its slot passes to c
    assert!(c.is_ready());
    assert_eq!(g.occupancy(), (1, 0));
    let d = g.enter(Class::Standard).unwrap();
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
    let run = g.enter(Class::Standard).unwrap();
    let mut queue: Vec<_> = (0..3).map(|_| g.enter(Class::Standard).unwrap()).collect();
    queue.remove(1); // the middle one leaves
    queue.push(g.enter(Class::Standard).unwrap()); // takes the freed place, last in line
    queue.remove(0);
    queue.push(g.enter(Class::Standard).unwrap());
    assert!(g.enter(Class::Standard).is_none());
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

/// Classes: the queue serves critical, then standard, then sheddable, first come first
/// served within each; sheddable fills at most its share of the slots, and a waiting
/// sheddable ticket takes a slot as soon as its share allows.
#[test]
fn classes_order_the_queue_and_keep_to_their_share() {
    let g = Gate::with_class_limits(2, 6, [2, 2, 1]);
    assert_eq!(g.class_limit(Class::Sheddable), 1);
    let s1 = g.enter(Class::Sheddable).unwrap();
    assert!(s1.is_ready());
    let s2 = g.enter(Class::Sheddable).unwrap();
    assert!(!s2.is_ready(), "sheddable over its share of one slot");
    assert_eq!(g.occupancy(), (1, 1));
    let c1 = g.enter(Class::Critical).unwrap();
    assert!(
        c1.is_ready(),
        "critical took the free slot past a waiting sheddable"
    );
    let t1 = g.enter(Class::Standard).unwrap();
    let s3 = g.enter(Class::Sheddable).unwrap();
    let c2 = g.enter(Class::Critical).unwrap();
    let t2 = g.enter(Class::Standard).unwrap();
    let c3 = g.enter(Class::Critical).unwrap();
    assert!(
        g.enter(Class::Critical).is_none(),
        "N + Q is exact over the classes"
    );
    drop(c1); // → c2 (critical first)
    assert!(c2.is_ready() && !c3.is_ready() && !t1.is_ready());
    drop(s1); // → c3
    assert!(c3.is_ready() && !t1.is_ready());
    drop(c2); // → t1 (first standard)
    assert!(t1.is_ready() && !t2.is_ready());
    drop(c3); // → t2
    assert!(t2.is_ready() && !s2.is_ready());
    drop(t1); // one slot held: sheddable's share is full
    assert!(!s2.is_ready() && !s3.is_ready());
    assert_eq!(g.occupancy(), (1, 2));
    drop(t2); // none held: s2, the first sheddable, and only it
    assert!(s2.is_ready() && !s3.is_ready());
    drop(s2);
    assert!(s3.is_ready());
    drop(s3);
    assert_eq!(g.occupancy(), (0, 0));
}

#[test]
fn class_slots_are_at_least_one_and_at_most_n() {
    assert_eq!(class_slots(64, 0.75), 48);
    assert_eq!(class_slots(64, 1.0), 64);
    assert_eq!(class_slots(1, 0.5), 1);
    assert_eq!(class_slots(10, 0.01), 1);
    assert_eq!(class_slots(3, 0.5), 1);
}

/// Many threads of every class hammer one gate: never more than N running, sheddable
/// never over its share, never more than N + Q admitted, and every ticket ends.
#[test]
fn concurrent_hammer_never_exceeds_the_cap() {
    const N: u32 = 3;
    const Q: u32 = 2;
    let g = Arc::new(Gate::with_class_limits(N, Q, [N, N, 1]));
    let sheddable = Arc::new(AtomicUsize::new(0));
    let running = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicUsize::new(0));
    let max_running = Arc::new(AtomicUsize::new(0));
    let max_admitted = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|thread| {
            let class = Class::ALL[thread % 3];
            let sheddable = sheddable.clone();
            let (g, running, admitted, max_running, max_admitted) = (
                g.clone(),
                running.clone(),
                admitted.clone(),
                max_running.clone(),
                max_admitted.clone(),
            );
            std::thread::spawn(move || {
                for i in 0..2_000 {
                    let Some(t) = g.enter(class) else {
                        continue;
                    };
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
                        if class == Class::Sheddable {
                            let s = sheddable.fetch_add(1, Ordering::SeqCst);
                            assert_eq!(s, 0, "sheddable over its share");
                        }
                        std::hint::spin_loop();
                        if class == Class::Sheddable {
                            sheddable.fetch_sub(1, Ordering::SeqCst);
                        }
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
