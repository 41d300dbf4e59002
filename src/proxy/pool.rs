//! Per-core keep-alive pools of upstream connections, per worker slot (newest last). An
//! idle connection is watched; one that became readable is never reused, and the core's
//! keeper (`keeper.rs`) closes it as soon as its watch fires.

use std::task::Waker;

use crate::runtime::stream::Upstream;

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
