//! Unit tests of the waiting room (`room.rs`).

use super::*;
use crate::admission::Gate;

#[test]
fn the_first_waiter_looks_and_later_ones_wait_their_turn() {
    let room = Room::new(2);
    let mut a = room.enter(Class::Standard, 0).unwrap();
    let mut b = room.enter(Class::Standard, 0).unwrap();
    assert!(a.due() && !a.due(), "entered an empty room: due once");
    assert!(!b.due(), "others wait");
    assert!(room.enter(Class::Standard, 0).is_err(), "the cap is exact");
    room.notify();
    assert!(a.due() && !b.due(), "a looked and waits again: still first");
}

#[test]
fn a_notification_goes_to_the_most_important_then_oldest_waiter() {
    let room = Room::new(3);
    let mut old = room.enter(Class::Standard, 0).unwrap();
    assert!(old.due());
    let mut young = room.enter(Class::Standard, 0).unwrap();
    let mut critical = room.enter(Class::Critical, 0).unwrap();
    assert!(critical.due(), "first of its class: looks at once");
    room.notify();
    assert!(critical.due() && !old.due() && !young.due());
    drop(critical); // it found a slot
    room.notify();
    assert!(old.due() && !young.due());
}

#[test]
fn a_newcomer_first_in_its_class_looks_at_once() {
    let room = Room::new(4);
    let mut sheddable = room.enter(Class::Sheddable, 0).unwrap();
    assert!(sheddable.due());
    let mut standard = room.enter(Class::Standard, 0).unwrap();
    assert!(
        standard.due(),
        "nobody of its class or above waits: it looks"
    );
    let mut later = room.enter(Class::Standard, 0).unwrap();
    assert!(!later.due(), "behind the first standard");
    assert_eq!(
        (later.position(), room.waiting_ahead(Class::Critical)),
        (2, 0)
    );
    let mut critical = room.enter(Class::Critical, 0).unwrap();
    assert!(critical.due());
    drop(standard);
    assert_eq!(room.waiting_ahead(Class::Sheddable), 3);
}

#[test]
fn a_notification_with_nobody_waiting_leaves_a_permit_for_the_next() {
    let room = Room::new(3);
    let mut a = room.enter(Class::Standard, 0).unwrap();
    assert!(a.due());
    room.notify(); // a looked and waits: notified
    room.notify(); // a is due already: a permit
    let mut b = room.enter(Class::Standard, 0).unwrap();
    assert!(b.due(), "took the permit");
    let mut c = room.enter(Class::Standard, 0).unwrap();
    assert!(!c.due(), "one permit, one waiter");
    drop((a, b, c));
    assert_eq!(room.waiting(), 0);
    room.notify();
    let mut d = room.enter(Class::Standard, 0).unwrap();
    assert!(d.due(), "an empty room: due");
    assert_eq!(
        counts(room.word.load(Ordering::Relaxed)).2,
        0,
        "no permit kept"
    );
}

#[test]
fn a_waiter_leaving_with_a_notification_passes_it_on() {
    let room = Room::new(2);
    let mut a = room.enter(Class::Standard, 0).unwrap();
    assert!(a.due());
    let mut b = room.enter(Class::Standard, 0).unwrap();
    room.notify();
    drop(a); // notified a second time (due() not called since): passes it on
    assert!(b.due());
}

#[test]
fn a_nudge_tells_the_first_waiters_beyond_those_told_and_leaves_no_permit() {
    let room = Room::new(4);
    assert_eq!(room.wake(3), 0, "nobody waits: no permit either");
    let mut old = room.enter(Class::Standard, 0).unwrap();
    assert!(old.due(), "entered an empty room");
    let mut young = room.enter(Class::Standard, 0).unwrap();
    let mut critical = room.enter(Class::Critical, 0).unwrap();
    assert!(critical.due());
    assert_eq!(room.first_class(), Some(Class::Critical));
    assert_eq!(room.wake(1), 1);
    assert!(critical.due() && !old.due() && !young.due());
    room.notify(); // critical is told again by a release
    assert_eq!(room.wake(2), 1, "one told already: one more");
    assert!(old.due() && !young.due());
    assert_eq!(room.wake(0), 0);
    drop((critical, old, young));
    assert_eq!(room.first_class(), None);
    let mut next = room.enter(Class::Sheddable, 0).unwrap();
    assert!(next.due(), "an empty room");
    let mut last = room.enter(Class::Sheddable, 0).unwrap();
    assert!(!last.due(), "no permit was left");
}

#[test]
fn a_full_room_evicts_the_youngest_of_the_least_important_class_below() {
    let room = Room::new(3);
    let mut old = room.enter(Class::Sheddable, 0).unwrap();
    assert!(old.due());
    let mut young = room.enter(Class::Sheddable, 0).unwrap();
    let mut standard = room.enter(Class::Standard, 0).unwrap();
    assert!(standard.due());
    let mut critical = room.enter(Class::Critical, 0).unwrap();
    assert!(critical.due(), "first of its class");
    assert!(
        young.evicted() && !young.due(),
        "the youngest sheddable one"
    );
    assert!(!old.evicted() && !standard.evicted());
    assert_eq!(room.waiting(), 3, "its count went to the newcomer");
    let other = room.enter(Class::Standard, 0).unwrap();
    assert!(old.evicted(), "then the other sheddable one");
    assert!(
        room.enter(Class::Sheddable, 0).is_err(),
        "nobody below sheddable"
    );
    assert!(
        room.enter(Class::Standard, 0).is_err(),
        "nobody below standard left"
    );
    drop((young, old));
    assert_eq!(room.waiting(), 3);
    drop((standard, critical, other));
    assert_eq!(room.waiting(), 0);
    let mut next = room.enter(Class::Standard, 0).unwrap();
    assert!(next.due(), "an empty room, every place free again");
}

#[test]
fn a_notified_waiter_is_not_evicted_and_an_evicted_one_passes_its_turn_on() {
    let room = Room::new(2);
    let mut first = room.enter(Class::Sheddable, 0).unwrap();
    assert!(first.due());
    let second = room.enter(Class::Sheddable, 0).unwrap();
    room.notify();
    let critical = room.enter(Class::Critical, 0).unwrap();
    assert!(!first.evicted() && second.evicted(), "first was notified");
    assert!(first.due());
    drop((first, second, critical));
    let room = Room::new(2);
    let x = room.enter(Class::Sheddable, 0).unwrap(); // due: entered an empty room
    let mut y = room.enter(Class::Standard, 0).unwrap();
    assert!(y.due());
    let mut c = room.enter(Class::Critical, 0).unwrap();
    assert!(x.evicted());
    assert!(c.due() && !c.due());
    drop(x); // evicted before it looked: its turn goes on, to the first waiter
    assert!(c.due() && !y.due());
}

#[test]
fn evictions_under_way_are_bounded_by_the_spare_places() {
    let room = Room::new(20);
    let sheddable: Vec<_> = (0..20)
        .map(|_| room.enter(Class::Sheddable, 0).unwrap())
        .collect();
    let critical: Vec<_> = (0..16)
        .map(|_| room.enter(Class::Critical, 0).unwrap())
        .collect();
    assert_eq!(sheddable.iter().filter(|w| w.evicted()).count(), 16);
    assert!(
        room.enter(Class::Critical, 0).is_err(),
        "16 evicted waiters still on their way out"
    );
    let mut sheddable = sheddable;
    let gone = sheddable.iter().position(|w| w.evicted()).unwrap();
    sheddable.remove(gone);
    assert!(room.enter(Class::Critical, 0).is_ok(), "one left: one more");
    drop((sheddable, critical));
    assert_eq!(room.waiting(), 0);
}

/// Waiters leave in the order the room serves them, one notification each.
fn served(room: &Room, mut waiters: Vec<(&'static str, Waiter<'_>)>) -> Vec<&'static str> {
    let mut order = Vec::new();
    while !waiters.is_empty() {
        let due = waiters.iter_mut().position(|(_, w)| w.due());
        let Some(i) = due else {
            room.notify();
            continue;
        };
        order.push(waiters.remove(i).0);
    }
    order
}

#[test]
fn tenants_are_served_in_turn_each_first_come_first_served() {
    let room = Room::new(16);
    let (heavy, light) = (1, 2);
    assert_ne!(bucket(heavy), bucket(light));
    let mut waiters = Vec::new();
    for name in ["h1", "h2", "h3", "h4", "h5"] {
        waiters.push((name, room.enter(Class::Standard, heavy).unwrap()));
    }
    for name in ["l1", "l2"] {
        waiters.push((name, room.enter(Class::Standard, light).unwrap()));
    }
    assert_eq!(
        waiters[6].1.position(),
        3,
        "behind a turn of each tenant, not h1-h5"
    );
    let order = served(&room, waiters);
    let at = |n: &str| order.iter().position(|o| *o == n).unwrap();
    assert!(at("l1") <= 1 && at("l2") <= 3, "{order:?}");
    let heavy_order: Vec<&str> = order
        .iter()
        .copied()
        .filter(|o| o.starts_with('h'))
        .collect();
    assert_eq!(heavy_order, ["h1", "h2", "h3", "h4", "h5"], "{order:?}");
    // Without tenants every request is tenant 0: first come, first served.
    let waiters = ["a", "b", "c"].map(|n| (n, room.enter(Class::Standard, 0).unwrap()));
    assert_eq!(served(&room, waiters.into()), ["a", "b", "c"]);
}

#[test]
fn a_tenant_holds_at_most_its_share_of_the_room() {
    let room = Room::new(4);
    room.set_tenant_share(0.5);
    assert_eq!(room.tenant_capacity(), 2);
    let a: Vec<_> = (0..2)
        .map(|_| room.enter(Class::Standard, 1).unwrap())
        .collect();
    assert_eq!(
        room.enter(Class::Critical, 1).unwrap_err(),
        Turned::TenantFull
    );
    assert_eq!(room.tenant_waiting(1), 2);
    let b: Vec<_> = (0..2)
        .map(|_| room.enter(Class::Standard, 2).unwrap())
        .collect();
    assert_eq!(room.enter(Class::Standard, 3).unwrap_err(), Turned::Full);
    drop(a);
    assert!(
        room.enter(Class::Standard, 1).is_ok(),
        "its places came back"
    );
    drop(b);
    room.set_tenant_share(0.01);
    assert_eq!(room.tenant_capacity(), 1, "at least one place");
}

#[test]
fn try_take_takes_a_free_slot_only_when_nobody_queues_at_the_gate() {
    let gate = Gate::new(1, 1);
    let held = gate.try_take(Class::Standard).unwrap();
    assert!(gate.try_take(Class::Standard).is_none());
    let queued = gate.enter(Class::Standard).unwrap();
    assert!(!queued.is_ready());
    drop(held);
    assert!(queued.is_ready(), "the gate's own queue goes first");
    assert!(gate.try_take(Class::Standard).is_none());
    drop(queued);
    assert!(gate.try_take(Class::Standard).is_some());
}
