//! Writes that did not finish at once, with their deadlines. A write to a client that
//! takes nothing for too long must end (`client_send_timeout_ms`), but a timer per write
//! costs more than the write's own bookkeeping (about 1,100 instructions a request here).
//! Instead a write still pending after its first poll is listed with its deadline, and
//! the core's once-a-second keeper wakes those past it ([`Stalls::expire`]): a deadline
//! is kept to within a second, and a write that finishes at once costs nothing.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use super::clock;

/// One core's pending writes (owned by the core; no lock).
#[derive(Debug, Default)]
pub struct Stalls {
    pending: RefCell<slab::Slab<Entry>>,
}

#[derive(Debug)]
struct Entry {
    deadline_ms: u64,
    waker: Waker,
    expired: bool,
}

impl Stalls {
    /// Wakes the writes past their deadline (they end as timed out). Returns how many.
    pub fn expire(&self, now_ms: u64) -> usize {
        let mut expired = 0;
        for (_, e) in self.pending.borrow_mut().iter_mut() {
            if !e.expired && e.deadline_ms <= now_ms {
                e.expired = true;
                e.waker.wake_by_ref();
                expired += 1;
            }
        }
        expired
    }

    /// Writes pending now.
    pub fn len(&self) -> usize {
        self.pending.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pin_project_lite::pin_project! {
    /// `inner` bounded by a deadline `timeout_ms` after its first pending poll; resolves
    /// to `None` once past it.
    pub struct Within<'a, F> {
        #[pin]
        inner: F,
        stalls: &'a Stalls,
        timeout_ms: u64,
        key: Option<usize>,
    }

    impl<F> PinnedDrop for Within<'_, F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(key) = this.key.take() {
                this.stalls.pending.borrow_mut().try_remove(key);
            }
        }
    }
}

impl<'a, F> Within<'a, F> {
    pub fn new(inner: F, stalls: &'a Stalls, timeout_ms: u64) -> Within<'a, F> {
        Within {
            inner,
            stalls,
            timeout_ms,
            key: None,
        }
    }
}

impl<F: Future> Future for Within<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut pending = this.stalls.pending.borrow_mut();
        let expired = this
            .key
            .and_then(|k| pending.get(k))
            .is_some_and(|e| e.expired);
        if let Some(k) = this.key.take_if(|_| expired) {
            pending.try_remove(k);
            return Poll::Ready(None);
        }
        drop(pending);
        let polled = this.inner.poll(cx);
        let mut pending = this.stalls.pending.borrow_mut();
        match (polled, *this.key) {
            (Poll::Ready(v), key) => {
                if let Some(k) = key {
                    pending.try_remove(k);
                }
                *this.key = None;
                Poll::Ready(Some(v))
            }
            (Poll::Pending, None) => {
                let deadline_ms = clock::now_ms().saturating_add(*this.timeout_ms);
                *this.key = Some(pending.insert(Entry {
                    deadline_ms,
                    waker: cx.waker().clone(),
                    expired: false,
                }));
                Poll::Pending
            }
            (Poll::Pending, Some(k)) => {
                if let Some(e) = pending
                    .get_mut(k)
                    .filter(|e| !e.waker.will_wake(cx.waker()))
                {
                    e.waker = cx.waker().clone();
                }
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A future that stays pending until told otherwise.
    struct Gate<'a>(&'a std::cell::Cell<bool>);

    impl Future for Gate<'_> {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            if self.0.get() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    fn poll<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn only_pending_writes_are_listed_and_each_ends_by_its_deadline() {
        let stalls = Stalls::default();
        let open = std::cell::Cell::new(true);
        let mut done = std::pin::pin!(Within::new(Gate(&open), &stalls, 1_000));
        assert_eq!(poll(done.as_mut()), Poll::Ready(Some(())));
        assert!(
            stalls.is_empty(),
            "a write that finished at once is never listed"
        );

        let shut = std::cell::Cell::new(false);
        let mut stuck = std::pin::pin!(Within::new(Gate(&shut), &stalls, 1_000));
        assert_eq!(poll(stuck.as_mut()), Poll::Pending);
        assert_eq!(stalls.len(), 1);
        let now = clock::now_ms();
        assert_eq!(stalls.expire(now), 0, "not yet");
        assert_eq!(poll(stuck.as_mut()), Poll::Pending);
        assert_eq!(stalls.expire(now + 2_000), 1);
        assert_eq!(poll(stuck.as_mut()), Poll::Ready(None));
        assert!(stalls.is_empty());

        // One that finishes after waiting leaves the list; a dropped one too.
        let later = std::cell::Cell::new(false);
        let mut slow = std::pin::pin!(Within::new(Gate(&later), &stalls, 1_000));
        assert_eq!(poll(slow.as_mut()), Poll::Pending);
        later.set(true);
        assert_eq!(poll(slow.as_mut()), Poll::Ready(Some(())));
        assert!(stalls.is_empty());
        {
            let mut gone = Box::pin(Within::new(Gate(&shut), &stalls, 1_000));
            assert_eq!(poll(gone.as_mut()), Poll::Pending);
            assert_eq!(stalls.len(), 1);
        }
        assert!(stalls.is_empty());
    }
}
