//! A core's listeners: accept connections until told to stop (over `max_connections` a
//! canned 503 and a close, or only the close on a TLS listener); on a drain, wait for the
//! requests in flight first.

use std::net::SocketAddr;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use monoio::io::AsyncWriteRentExt;
use monoio::net::{TcpListener, TcpStream};

use super::conn::serve;
use super::core::CoreCtx;
use super::keeper::keep;
use crate::runtime::clock;
use crate::runtime::listen::{STOP_DRAIN, accept_until_stopped};
use crate::state::counters::add;

/// How often a draining core checks for requests still in flight.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// One of a core's listeners: the socket, its stop channel, whether it speaks TLS.
pub struct Listener {
    pub socket: TcpListener,
    pub stop: StdUnixStream,
    pub tls: bool,
}

/// Runs core `ctx` on its listeners (the plain one, a TLS one, or both) until a stop
/// byte arrives on each; a drain (`STOP_DRAIN`) first lets the requests in flight finish
/// (up to the drain deadline).
pub async fn run(ctx: Rc<CoreCtx>, listeners: Vec<Listener>) {
    monoio::spawn(keep(ctx.clone()));
    monoio::spawn(super::log::flush_log(ctx.clone()));
    let loops: Vec<_> = listeners
        .into_iter()
        .map(|l| monoio::spawn(accept_loop(ctx.clone(), l)))
        .collect();
    let mut why = None;
    for l in loops {
        let stopped = l.await;
        why = Some(why.map_or(stopped, |w: u8| if w == STOP_DRAIN { w } else { stopped }));
    }
    if why == Some(STOP_DRAIN) {
        drain(&ctx).await;
    }
    // Returning drops every remaining connection task: idle keep-alive connections close.
}

/// One listener's accept loop; returns the stop byte (the listener closes).
async fn accept_loop(ctx: Rc<CoreCtx>, l: Listener) -> u8 {
    let kind = if l.tls { "tls" } else { "data" };
    accept_until_stopped(&l.socket, l.stop, kind, |stream, peer| {
        accepted(&ctx, stream, peer, l.tls)
    })
    .await
}

fn accepted(ctx: &Rc<CoreCtx>, stream: TcpStream, peer: SocketAddr, tls: bool) {
    let shared = &ctx.shared;
    let max = shared.snapshot.load().config.limits.max_connections;
    add(&ctx.counters().connections, 1);
    if shared.connections.fetch_add(1, Ordering::AcqRel) >= max {
        shared.connections.fetch_sub(1, Ordering::AcqRel);
        add(&ctx.counters().connections_refused, 1);
        // A TLS client could not read a plain answer: it just sees the close.
        if !tls {
            monoio::spawn(turn_away(ctx.clone(), stream));
        }
        return;
    }
    serve(ctx, stream, peer, tls);
}

/// Answers a connection over `max_connections` and closes it.
async fn turn_away(ctx: Rc<CoreCtx>, mut stream: TcpStream) {
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
