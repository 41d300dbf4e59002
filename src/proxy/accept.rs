//! A core's listener: accept connections (over `max_connections` a canned 503 and a close)
//! until told to stop; on a drain, wait for the requests in flight first.

use std::net::SocketAddr;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use monoio::io::AsyncWriteRentExt;
use monoio::net::{TcpListener, TcpStream};

use super::conn::serve;
use super::core::CoreCtx;
use super::pool::sweep_pools;
use crate::runtime::clock;
use crate::runtime::listen::{STOP_DRAIN, accept_until_stopped};
use crate::state::counters::add;

/// How often a draining core checks for requests still in flight.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// Runs core `ctx` on `listener` until a stop byte arrives; a drain (`STOP_DRAIN`) first
/// lets the requests in flight finish (up to the drain deadline).
pub async fn run(ctx: Rc<CoreCtx>, listener: TcpListener, stop: StdUnixStream) {
    monoio::spawn(sweep_pools(ctx.clone()));
    monoio::spawn(super::log::flush_log(ctx.clone()));
    let why = accept_until_stopped(&listener, stop, "data", |stream, peer| {
        accepted(&ctx, stream, peer)
    })
    .await;
    drop(listener);
    if why == STOP_DRAIN {
        drain(&ctx).await;
    }
    // Returning drops every remaining connection task: idle keep-alive connections close.
}

fn accepted(ctx: &Rc<CoreCtx>, stream: TcpStream, peer: SocketAddr) {
    let shared = &ctx.shared;
    let max = shared.snapshot.load().config.limits.max_connections;
    add(&ctx.counters().connections, 1);
    if shared.connections.fetch_add(1, Ordering::AcqRel) >= max {
        shared.connections.fetch_sub(1, Ordering::AcqRel);
        add(&ctx.counters().connections_refused, 1);
        monoio::spawn(refuse(ctx.clone(), stream));
        return;
    }
    monoio::spawn(serve(ctx.clone(), stream, peer));
}

/// Answers a connection over `max_connections` and closes it.
async fn refuse(ctx: Rc<CoreCtx>, mut stream: TcpStream) {
    let mut out = Vec::with_capacity(256);
    ctx.shared
        .snapshot
        .load()
        .responses
        .too_many_connections
        .write(&mut out, b"-", false, true);
    let _ = stream.write_all(out).await;
}

/// Waits until this core has no request in flight, or the drain deadline.
async fn drain(ctx: &CoreCtx) {
    let deadline = ctx.shared.drain_deadline_ms.load(Ordering::Relaxed);
    while ctx.active_requests.get() > 0 && clock::now_ms() < deadline {
        monoio::time::sleep(DRAIN_POLL).await;
    }
    if ctx.active_requests.get() > 0 {
        tracing::warn!(
            core = ctx.id,
            cut = ctx.active_requests.get(),
            "drain timeout: cutting requests in flight"
        );
    }
}
