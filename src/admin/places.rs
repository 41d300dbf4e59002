//! The admin connections' places (`admin_max_connections`, docs/behaviour.md §14.2). Each
//! open connection holds one, in the order they were accepted. At the cap, the oldest
//! connection without a request head in progress (a slow or silent client, or a
//! keep-alive one between requests) is told to close and gives up its place at once;
//! only when every open connection is in the middle of a request whose head is complete
//! is a newcomer refused. Everything runs on the control thread: `Rc` and `Cell`, no lock.

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// The open admin connections, oldest first.
#[derive(Debug, Clone, Default)]
pub struct Connections(Rc<RefCell<Vec<Rc<Entry>>>>);

#[derive(Debug)]
struct Entry {
    peer: SocketAddr,
    opened: Instant,
    /// A request whose head is complete is being read, handled or answered.
    busy: Cell<bool>,
    /// Told to close; its place is already given up.
    evicted: Cell<bool>,
    /// The connection's task, woken when it is told to close.
    waker: RefCell<Option<Waker>>,
}

/// A connection closed to make room for a newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    pub peer: SocketAddr,
    /// How long it had been open.
    pub age: Duration,
}

impl Connections {
    /// A place for a connection from `peer` accepted at `now`, under a cap of `max`
    /// places. At the cap, the oldest connections with no request head in progress are
    /// told to close until there is room (`evicted` gets each); `None` when there is no
    /// room even then (nothing is evicted).
    pub fn take(
        &self,
        peer: SocketAddr,
        now: Instant,
        max: usize,
        evicted: &mut impl FnMut(Evicted),
    ) -> Option<Place> {
        let mut open = self.0.borrow_mut();
        let idle = open.iter().filter(|e| !e.busy.get()).count();
        if open.len() - idle >= max {
            return None;
        }
        while open.len() >= max {
            let Some(oldest) = open.iter().position(|e| !e.busy.get()) else {
                break; // unreachable: the count above left room
            };
            let entry = open.remove(oldest);
            entry.evicted.set(true);
            if let Some(waker) = entry.waker.borrow_mut().take() {
                waker.wake();
            }
            evicted(Evicted {
                peer: entry.peer,
                age: now.saturating_duration_since(entry.opened),
            });
        }
        let entry = Rc::new(Entry {
            peer,
            opened: now,
            busy: Cell::new(false),
            evicted: Cell::new(false),
            waker: RefCell::new(None),
        });
        open.push(entry.clone());
        Some(Place {
            open: self.clone(),
            entry,
        })
    }

    /// Places held now.
    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One admin connection's place; given back on drop, unless an eviction gave it up.
#[derive(Debug)]
pub struct Place {
    open: Connections,
    entry: Rc<Entry>,
}

impl Place {
    /// Marks whether a request with a complete head is in progress (the connection may
    /// not be evicted meanwhile).
    pub fn set_busy(&self, busy: bool) {
        self.entry.busy.set(busy);
    }

    /// True once the connection was told to close.
    pub fn is_evicted(&self) -> bool {
        self.entry.evicted.get()
    }

    /// Resolves once the connection is told to close.
    pub fn evicted(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(|cx| {
            if self.is_evicted() {
                return Poll::Ready(());
            }
            let mut waker = self.entry.waker.borrow_mut();
            if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.is_evicted() {
            return;
        }
        let mut open = self.open.0.borrow_mut();
        if let Some(i) = open.iter().position(|e| Rc::ptr_eq(e, &self.entry)) {
            open.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::Context;

    fn peer(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn the_oldest_idle_connection_makes_room_and_busy_ones_are_kept() {
        let open = Connections::default();
        let t0 = crate::runtime::clock::now();
        let mut gone = Vec::new();
        let mut note = |e: Evicted| gone.push(e);
        let a = open.take(peer(1), t0, 3, &mut note).unwrap();
        let b = open.take(peer(2), t0, 3, &mut note).unwrap();
        let c = open.take(peer(3), t0, 3, &mut note).unwrap();
        a.set_busy(true);
        // Full: b is the oldest without a request in progress.
        let later = t0 + Duration::from_millis(7);
        let d = open.take(peer(4), later, 3, &mut note).unwrap();
        assert!(b.is_evicted() && !a.is_evicted() && !c.is_evicted());
        assert_eq!(open.len(), 3, "the evicted place was given up at once");
        drop(b);
        assert_eq!(
            open.len(),
            3,
            "dropping an evicted place gives nothing back twice"
        );
        // Every place busy: refused, nothing evicted.
        c.set_busy(true);
        d.set_busy(true);
        assert!(open.take(peer(5), later, 3, &mut note).is_none());
        // A request answered, the connection idle again: it makes room.
        c.set_busy(false);
        let e = open.take(peer(6), later, 3, &mut note).unwrap();
        assert!(c.is_evicted());
        drop((a, d, e));
        assert!(open.is_empty());
        let peers: Vec<_> = gone
            .iter()
            .map(|e| (e.peer.port(), e.age.as_millis()))
            .collect();
        assert_eq!(peers, [(2, 7), (3, 7)]);
    }

    #[test]
    fn a_cap_lowered_below_the_open_count_evicts_down_to_it() {
        let open = Connections::default();
        let t0 = crate::runtime::clock::now();
        let places: Vec<_> = (0..4)
            .map(|i| open.take(peer(i), t0, 8, &mut |_| {}).unwrap())
            .collect();
        let mut n = 0;
        let fifth = open.take(peer(9), t0, 2, &mut |_| n += 1).unwrap();
        assert_eq!((n, open.len()), (3, 2));
        assert!(places[..3].iter().all(Place::is_evicted) && !places[3].is_evicted());
        drop(fifth);
    }

    #[test]
    fn eviction_wakes_the_connections_task() {
        let open = Connections::default();
        let t0 = crate::runtime::clock::now();
        let a = open.take(peer(1), t0, 1, &mut |_| {}).unwrap();
        let woken = std::sync::Arc::new(Flag::default());
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let mut told = pin!(a.evicted());
        assert!(told.as_mut().poll(&mut cx).is_pending());
        let _b = open.take(peer(2), t0, 1, &mut |_| {}).unwrap();
        assert!(woken.0.load(std::sync::atomic::Ordering::SeqCst));
        assert!(told.as_mut().poll(&mut cx).is_ready());
    }

    #[derive(Default)]
    struct Flag(std::sync::atomic::AtomicBool);

    impl std::task::Wake for Flag {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
