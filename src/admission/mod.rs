//! Worker admission (semantics §6): at most N requests in flight to a worker and at most Q
//! waiting, across all cores together, admitted strictly first come, first served.
//!
//! The [`Gate`] is one atomic word and a ring of wakers, all lock-free. The word packs two
//! wrapping 32-bit counters, so every admission decision is one read-modify-write of one
//! location and no side can act on a stale view of the other:
//! - `issued`: tickets handed out. A request takes ticket `t` by compare-and-swap only
//!   while `issued - done < N + Q`, so the cap is exact: never N + Q + 1.
//! - `done`: tickets given back (finished, abandoned or timed out), one per ticket.
//! - Ticket `t` may run once `t < done + N`. Tickets start in order, so a newcomer never
//!   passes a waiter (FIFO across cores), and at most N run: `started - done <= N`.
//! - Each release makes exactly one more ticket eligible (`done + N - 1`) and wakes it
//!   through `wakers[t mod size]`; at most N + Q tickets are outstanding and the ring has
//!   at least that many slots, so outstanding tickets never share one. The waker can
//!   belong to a task on any core (monoio's cross-thread wake).
//!
//! A [`Ticket`] gives itself back on drop, on every path. `tests/loom.rs` model-checks
//! every interleaving of small cases.

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

#[derive(Debug)]
pub struct Gate {
    limit: u32,
    queue: u32,
    /// `issued << 32 | done`, both wrapping.
    word: CachePadded<AtomicU64>,
    wakers: Box<[AtomicWaker]>,
    mask: u32,
    rejected: AtomicU64,
}

fn issued(word: u64) -> u32 {
    (word >> 32) as u32
}

fn done(word: u64) -> u32 {
    word as u32
}

fn pack(issued: u32, done: u32) -> u64 {
    (u64::from(issued) << 32) | u64::from(done)
}

/// Ticket `t` holds a slot once `t < done + limit`, in wrapping arithmetic: outstanding
/// tickets are within N + Q of `done`, far inside the 2^31 window.
fn eligible(t: u32, done: u32, limit: u32) -> bool {
    (t.wrapping_sub(done) as i32) < limit as i32
}

impl Gate {
    /// `limit` engine slots (N ≥ 1) and `queue` waiting places (Q); N + Q below 2^30.
    pub fn new(limit: u32, queue: u32) -> Gate {
        let limit = limit.clamp(1, 1 << 29);
        let queue = queue.min(1 << 29);
        let size = (limit + queue).next_power_of_two();
        Gate {
            limit,
            queue,
            word: CachePadded::new(AtomicU64::new(0)),
            wakers: (0..size).map(|_| AtomicWaker::new()).collect(),
            mask: size - 1,
            rejected: AtomicU64::new(0),
        }
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    pub fn queue_limit(&self) -> u32 {
        self.queue
    }

    /// Takes a ticket, or `None` when N + Q are already admitted (the caller refuses with
    /// [`AT_CAPACITY`]).
    pub fn enter(&self) -> Option<Ticket<'_>> {
        let cap = self.limit + self.queue;
        let taken = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (issued(w).wrapping_sub(done(w)) < cap)
                    .then(|| pack(issued(w).wrapping_add(1), done(w)))
            });
        match taken {
            Ok(w) => Some(Ticket {
                gate: self,
                t: issued(w),
            }),
            Err(_) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    fn is_eligible(&self, t: u32) -> bool {
        eligible(t, done(self.word.load(Ordering::Acquire)), self.limit)
    }

    /// Gives a ticket back and wakes the one that becomes eligible, if it is waiting.
    fn release(&self) {
        let Ok(before) = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(pack(issued(w), done(w).wrapping_add(1)))
            })
        else {
            return;
        };
        let done = done(before).wrapping_add(1);
        let outstanding = issued(before).wrapping_sub(done);
        if outstanding >= self.limit {
            let next = done.wrapping_add(self.limit - 1);
            self.wakers[(next & self.mask) as usize].wake();
        }
    }

    /// Counts a refusal that happened after a ticket was taken (queue timeout).
    pub fn count_rejection(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// (in flight, waiting), for gauges.
    pub fn occupancy(&self) -> (u64, u64) {
        let w = self.word.load(Ordering::Acquire);
        let outstanding = issued(w).wrapping_sub(done(w));
        let running = outstanding.min(self.limit);
        (u64::from(running), u64::from(outstanding - running))
    }

    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
}

/// A place at the gate: waiting until [`Ticket::ready`], then an engine slot. Given back
/// on drop, whatever happened.
#[derive(Debug)]
pub struct Ticket<'a> {
    gate: &'a Gate,
    t: u32,
}

impl Ticket<'_> {
    /// True once this ticket holds an engine slot.
    pub fn is_ready(&self) -> bool {
        self.gate.is_eligible(self.t)
    }

    /// Resolves when this ticket's turn has come.
    pub fn ready(&self) -> Ready<'_, '_> {
        Ready { ticket: self }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.gate.release();
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
        let Ticket { gate, t } = *self.ticket;
        if gate.is_eligible(t) {
            return Poll::Ready(());
        }
        // Register first, then check again: a release in between either sees the waker
        // or is seen by the second check.
        #[cfg(loom)]
        gate.wakers[(t & gate.mask) as usize].register(cx.waker().clone());
        #[cfg(not(loom))]
        gate.wakers[(t & gate.mask) as usize].register(cx.waker());
        if gate.is_eligible(t) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn wrapping_counters() {
        assert!(eligible(5, 5, 1));
        assert!(!eligible(6, 5, 1));
        assert!(eligible(3, 5, 1), "an earlier ticket stays eligible");
        assert!(eligible(u32::MAX, u32::MAX - 1, 2));
        assert!(eligible(0, u32::MAX, 2), "across the wrap");
        assert!(!eligible(1, u32::MAX, 2));
        // A gate whose counters sit just below the wrap keeps its cap.
        let g = Gate::new(1, 2);
        g.word
            .store(pack(u32::MAX - 1, u32::MAX - 1), Ordering::SeqCst);
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
}
