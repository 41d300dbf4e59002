//! Per-core keep-alive pools of upstream connections, per worker slot (newest last), and
//! the sweep task: once a second it closes the stale ones and trims the buffer pools, and
//! whenever an idle connection's watch fires (the worker sent bytes or closed) it closes
//! that connection at once. An idle connection that became readable is never reused.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::Waker;
use std::time::Duration;

use super::core::CoreCtx;
use crate::runtime::clock;
use crate::runtime::stream::Upstream;
use crate::state::counters::add;

/// Idle keep-alive connections of one core, per worker slot (newest last).
#[derive(Debug, Default)]
pub struct Pools {
    idle: Vec<Vec<Idle>>,
    /// The sweep task's: idle connections' watches wake it when they fire.
    waker: Option<Waker>,
}

#[derive(Debug)]
struct Idle {
    stream: Upstream,
    since_ms: u64,
}

/// What [`Pools::take`] found.
#[derive(Debug)]
pub struct Taken {
    pub stream: Option<Upstream>,
    /// Idle connections passed over because something arrived on them.
    pub stirred: u64,
}

impl Pools {
    /// The newest idle connection to `slot` on which nothing arrived, if any. Stale and
    /// stirred ones are dropped on the way.
    pub fn take(&mut self, slot: u32, now_ms: u64, idle_timeout_ms: u64) -> Taken {
        let mut taken = Taken {
            stream: None,
            stirred: 0,
        };
        let Some(list) = self.idle.get_mut(slot as usize) else {
            return taken;
        };
        while let Some(mut idle) = list.pop() {
            if now_ms.saturating_sub(idle.since_ms) >= idle_timeout_ms {
                // Newest is stale, so all are.
                list.clear();
                break;
            }
            if idle.stream.reusable() {
                taken.stream = Some(idle.stream);
                break;
            }
            taken.stirred += 1;
        }
        taken
    }

    /// Keeps `stream` idle for `slot`, watched, unless the pool is full. True when it is
    /// closed instead because something arrived on it already.
    pub fn put(&mut self, slot: u32, mut stream: Upstream, now_ms: u64, max_idle: usize) -> bool {
        let slot = slot as usize;
        if self.idle.len() <= slot {
            self.idle.resize_with(slot + 1, Vec::new);
        }
        let list = &mut self.idle[slot];
        if list.len() >= max_idle {
            return false;
        }
        if !stream.go_idle(self.waker.as_ref().unwrap_or(Waker::noop())) {
            return true;
        }
        list.push(Idle {
            stream,
            since_ms: now_ms,
        });
        false
    }

    /// Closes the idle connections on which something arrived, and has the others wake
    /// `waker` when something does. Returns how many it closed.
    pub fn close_stirred(&mut self, waker: &Waker) -> u64 {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            self.waker = Some(waker.clone());
        }
        let mut closed = 0;
        for list in &mut self.idle {
            list.retain_mut(|idle| {
                let stirred = idle.stream.stirred(waker);
                closed += u64::from(stirred);
                !stirred
            });
        }
        closed
    }

    /// Closes connections idle for longer than the timeout.
    pub fn sweep(&mut self, now_ms: u64, idle_timeout_ms: u64) {
        for list in &mut self.idle {
            let stale = list
                .iter()
                .take_while(|idle| now_ms.saturating_sub(idle.since_ms) >= idle_timeout_ms)
                .count();
            list.drain(..stale);
        }
    }
}

/// The core's pool keeper: closes idle connections whose watch fired as soon as it
/// wakes it, and once a second ends client writes past their send deadline, closes idle
/// pooled connections past their timeout, trims the buffer pools to what the last second
/// needed, closes parked client connections past their idle timeout, and refreshes the
/// core's gauges.
pub(super) async fn sweep_pools(ctx: Rc<CoreCtx>) {
    loop {
        let mut second = std::pin::pin!(monoio::time::sleep(Duration::from_secs(1)));
        std::future::poll_fn(|cx| {
            let closed = ctx.pools.borrow_mut().close_stirred(cx.waker());
            add(&ctx.counters().upstream_idle_closed, closed);
            second.as_mut().poll(cx)
        })
        .await;
        ctx.stalls.expire(clock::now_ms());
        trim_buffers(&ctx);
        let timeout = ctx
            .shared
            .snapshot
            .load()
            .config
            .limits
            .pool_idle_timeout_ms;
        ctx.pools.borrow_mut().sweep(clock::now_ms(), timeout);
    }
}

fn trim_buffers(ctx: &CoreCtx) {
    let (mut reads, mut writes) = (ctx.read_bufs.borrow_mut(), ctx.write_bufs.borrow_mut());
    reads.trim();
    writes.trim();
    let counters = ctx.counters();
    let lent = reads.lent() + writes.lent();
    let free = reads.free_bytes() + writes.free_bytes();
    counters.buffers_lent.store(lent as u64, Ordering::Relaxed);
    counters
        .buffer_pool_bytes
        .store(free as u64, Ordering::Relaxed);
    let mut parked = ctx.parked.borrow_mut();
    parked.expire(clock::now_ms());
    counters
        .parked_connections
        .store(parked.len() as u64, Ordering::Relaxed);
}
