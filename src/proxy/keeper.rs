//! The core's keeper, one task per core: it closes an idle pooled connection as soon as
//! its watch fires, and once a second ends client writes past their send deadline, closes
//! stale pooled connections and parked client connections, trims the buffer pools and
//! refreshes the core's gauges.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::core::CoreCtx;
use crate::runtime::clock;
use crate::state::counters::add;

/// The core's pool keeper: closes idle connections whose watch fired as soon as it
/// wakes it, and once a second ends client writes past their send deadline, closes idle
/// pooled connections past their timeout, trims the buffer pools to what the last second
/// needed, closes parked client connections past their idle timeout, and refreshes the
/// core's gauges.
pub(super) async fn keep(ctx: Rc<CoreCtx>) {
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
    // As many cancellers as the bursts that the kept read buffers can serve.
    parked.trim_cancellers(reads.free_count());
    counters
        .parked_connections
        .store(parked.len() as u64, Ordering::Relaxed);
}
