//! The access log's hooks on the data path: what a request leaves behind as it goes
//! ([`Trail`]), the line written when it ends, and the task that hands partly filled
//! buffers to the writer a few times a second. Formatting and the writer thread are in
//! [`crate::accesslog`].

use std::rc::Rc;
use std::time::{Duration, Instant};

use super::session::Session;
use crate::accesslog::Record;
use crate::config::PoolRole;
use crate::http::request::RequestHead;
use crate::route::RouterMode;
use crate::runtime::clock;

/// What the forwarder learns about a request, for its log line.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Trail {
    /// Index of the last worker tried in the snapshot's workers.
    pub worker: Option<usize>,
    pub migrations: u32,
    pub queue: Duration,
    pub ttft: Option<Duration>,
    /// The status relayed from the worker (once its head went to the client).
    pub status: Option<u16>,
    /// Bytes written to the client: the worker's response relayed, or Spillway's own
    /// answer.
    pub bytes_out: u64,
    /// Who ended a response that broke off.
    pub closed: Option<ClosedBy>,
    /// A disaggregated request's prefill worker (stage 1), and the pool that answered the
    /// client with a refusal, when one did.
    pub prefill_worker: Option<usize>,
    pub pool: Option<PoolRole>,
}

/// Who ended a response that broke off after bytes reached the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClosedBy {
    /// The client left (or took nothing for `client_send_timeout_ms`).
    Client,
    /// The worker closed, reset, stalled or sent invalid framing.
    Worker,
}

impl ClosedBy {
    /// The access log's `closed` field.
    pub(super) fn label(self) -> &'static str {
        match self {
            ClosedBy::Client => "client",
            ClosedBy::Worker => "upstream",
        }
    }
}

/// The request line's method and path, copied when the head is read (the client buffer
/// moves on before the line is written); paths over 256 bytes are cut.
pub(super) struct Target {
    method: [u8; 16],
    method_len: usize,
    path: [u8; 256],
    path_len: usize,
}

impl Target {
    pub(super) fn of(head: &RequestHead, buf: &[u8]) -> Target {
        let mut t = Target {
            method: [0; 16],
            method_len: 0,
            path: [0; 256],
            path_len: 0,
        };
        let m = head.method_span.get(buf);
        t.method_len = m.len().min(16);
        t.method[..t.method_len].copy_from_slice(&m[..t.method_len]);
        let p = head.path(buf);
        t.path_len = p.len().min(256);
        t.path[..t.path_len].copy_from_slice(&p[..t.path_len]);
        t
    }
}

/// What the request handler knows when the request ends.
pub(super) struct Ending<'a> {
    pub model: Option<&'a crate::state::Model>,
    pub status: u16,
    pub knob: Option<&'static str>,
    pub started: Instant,
    pub bytes_in: u64,
    pub trail: &'a Trail,
}

pub(super) fn router(m: RouterMode) -> &'static str {
    match m {
        RouterMode::RoundRobin => "round-robin",
        RouterMode::Random => "random",
        RouterMode::PowerOfTwo => "power-of-two",
        RouterMode::LeastLoaded => "least-loaded",
        RouterMode::Direct => "direct",
        RouterMode::Kv => "kv",
    }
}

/// Writes the request's line (when the log is on and sampling keeps it).
pub(super) fn log_request(s: &Session, target: &Target, e: &Ending<'_>) {
    let cfg = &s.snap.config.access_log;
    if cfg.destination == crate::config::access_log::Destination::Off {
        return;
    }
    let mut log = s.ctx.log.borrow_mut();
    let Some(log) = log.as_mut() else {
        return;
    };
    let t = e.trail;
    let name = |w: Option<usize>| {
        w.and_then(|i| s.snap.workers.get(i))
            .map(|w| w.cfg.name.as_bytes())
    };
    let duration = clock::since(e.started);
    let r = Record {
        unix_ms: clock::unix_ms().saturating_sub(duration.as_millis() as u64),
        request_id: s.request_id.get(),
        client: s.peer.get(),
        method: &target.method[..target.method_len],
        path: &target.path[..target.path_len],
        model: e.model.map(|m| m.name.as_bytes()),
        router: e.model.map(|m| router(m.router_mode)),
        worker: name(t.worker),
        prefill_worker: name(t.prefill_worker),
        status: e.status,
        knob: e.knob,
        class: e.model.map(|_| s.class.label()),
        migrations: t.migrations,
        queue_us: t.queue.as_micros() as u64,
        ttft_us: t.ttft.map(|d| d.as_micros() as u64),
        duration_us: duration.as_micros() as u64,
        bytes_in: e.bytes_in,
        bytes_out: t.bytes_out,
        closed: t.closed.map(ClosedBy::label),
        trace_id: s.trace.id(),
    };
    log.line(cfg, &r, s.ctx.counters());
}

/// The line of a request answered before routing (no model, no worker, no trace),
/// once its answer of `bytes_out` bytes is written.
pub(super) fn log_local(
    s: &mut Session,
    target: &Target,
    status: u16,
    started: Instant,
    bytes_in: u64,
    bytes_out: u64,
) {
    s.trace.clear();
    let trail = Trail {
        bytes_out,
        ..Trail::default()
    };
    let end = Ending {
        model: None,
        status,
        knob: None,
        started,
        bytes_in,
        trail: &trail,
    };
    log_request(s, target, &end);
}

/// Hands partly filled log buffers to the writer every 200 ms, so quiet traffic is
/// written within a fraction of a second.
pub(super) async fn flush_log(ctx: Rc<super::core::CoreCtx>) {
    loop {
        monoio::time::sleep(Duration::from_millis(200)).await;
        if let Some(log) = ctx.log.borrow_mut().as_mut() {
            log.flush();
        }
    }
}
