//! Per-core keep-alive pools of upstream connections, per worker slot (newest last), and
//! the once-a-second sweep that closes the stale ones and trims the buffer pools.

use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::runtime::stream::Upstream;

use super::core::CoreCtx;
use crate::http::limits::POOL_PEEK_AFTER_IDLE_MS;
use crate::runtime::clock;

/// Idle keep-alive connections of one core, per worker slot (newest last).
#[derive(Debug, Default)]
pub struct Pools {
    idle: Vec<Vec<(Upstream, u64)>>,
}

impl Pools {
    /// The newest idle connection to `slot` that is still open, if any. Stale or closed
    /// ones are dropped on the way.
    pub fn take(&mut self, slot: u32, now_ms: u64, idle_timeout_ms: u64) -> Option<Upstream> {
        let list = self.idle.get_mut(slot as usize)?;
        while let Some((stream, since)) = list.pop() {
            let idle = now_ms.saturating_sub(since);
            if idle >= idle_timeout_ms {
                // Newest is stale, so all are.
                list.clear();
                return None;
            }
            // A connection back from a response moments ago is open: servers that close
            // after a response say `Connection: close` (never pooled), and keep-alive
            // timeouts are seconds. Peek (one syscall) only after a real idle spell.
            if idle < POOL_PEEK_AFTER_IDLE_MS || is_open(&stream) {
                return Some(stream);
            }
        }
        None
    }

    pub fn put(&mut self, slot: u32, stream: Upstream, now_ms: u64, max_idle: usize) {
        let slot = slot as usize;
        if self.idle.len() <= slot {
            self.idle.resize_with(slot + 1, Vec::new);
        }
        let list = &mut self.idle[slot];
        if list.len() < max_idle {
            list.push((stream, now_ms));
        }
    }

    /// Closes connections idle for longer than the timeout.
    pub fn sweep(&mut self, now_ms: u64, idle_timeout_ms: u64) {
        for list in &mut self.idle {
            let stale = list
                .iter()
                .take_while(|(_, since)| now_ms.saturating_sub(*since) >= idle_timeout_ms)
                .count();
            list.drain(..stale);
        }
    }

    pub fn idle_count(&self, slot: u32) -> usize {
        self.idle.get(slot as usize).map_or(0, Vec::len)
    }
}

/// A pooled connection is usable only if the peer has not closed it and sent nothing
/// unsolicited: a non-blocking peek must find no data (EAGAIN).
fn is_open(stream: &Upstream) -> bool {
    use nix::sys::socket::{MsgFlags, recv};
    let mut byte = [0u8; 1];
    matches!(
        recv(
            stream.tcp().as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
        ),
        Err(nix::errno::Errno::EAGAIN)
    )
}

/// Once a second: closes idle pooled connections past their timeout, trims the buffer
/// pools to what the last second needed, closes parked client connections past their idle
/// timeout, and refreshes the core's gauges.
pub(super) async fn sweep_pools(ctx: Rc<CoreCtx>) {
    loop {
        monoio::time::sleep(Duration::from_secs(1)).await;
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
