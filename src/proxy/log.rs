//! The access log's hooks on the data path: what a request leaves behind as it goes
//! ([`Trail`]), the line written when it ends, and the task that hands partly filled
//! buffers to the writer a few times a second. Formatting and the writer thread are in
//! [`crate::accesslog`].

use std::rc::Rc;
use std::time::{Duration, Instant};

use super::conn::Conn;
use super::forward::Forwarded;
use super::request::Outbound;
use crate::accesslog::Record;
use crate::config::access_log::TraceParent;
use crate::http::trace::{Inbound, inbound};
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
    pub closed: Option<&'static str>,
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
    pub(super) fn of(conn: &Conn, buf: &[u8]) -> Target {
        let mut t = Target {
            method: [0; 16],
            method_len: 0,
            path: [0; 256],
            path_len: 0,
        };
        let m = conn.head.method_span.get(buf);
        t.method_len = m.len().min(16);
        t.method[..t.method_len].copy_from_slice(&m[..t.method_len]);
        let p = conn.head.path(buf);
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

impl Conn {
    /// Writes the request's line (when the log is on and sampling keeps it).
    pub(super) fn log_request(&self, target: &Target, e: &Ending<'_>) {
        let cfg = &self.snap.config.access_log;
        if cfg.destination == crate::config::access_log::Destination::Off {
            return;
        }
        let mut log = self.ctx.log.borrow_mut();
        let Some(log) = log.as_mut() else {
            return;
        };
        let t = e.trail;
        let worker = t
            .worker
            .and_then(|i| self.snap.workers.get(i))
            .map(|w| w.cfg.name.as_bytes());
        let duration = clock::since(e.started);
        let r = Record {
            unix_ms: clock::unix_ms().saturating_sub(duration.as_millis() as u64),
            request_id: self.request_id.get(),
            client: self.peer.get(),
            method: &target.method[..target.method_len],
            path: &target.path[..target.path_len],
            model: e.model.map(|m| m.name.as_bytes()),
            router: e.model.map(|m| router(m.router_mode)),
            worker,
            status: e.status,
            knob: e.knob,
            class: e.model.map(|_| self.class.label()),
            migrations: t.migrations,
            queue_us: t.queue.as_micros() as u64,
            ttft_us: t.ttft.map(|d| d.as_micros() as u64),
            duration_us: duration.as_micros() as u64,
            bytes_in: e.bytes_in,
            bytes_out: t.bytes_out,
            closed: t.closed,
            trace_id: self.trace.id(),
        };
        log.line(cfg, &r, self.ctx.counters());
    }
}

impl Conn {
    /// W3C trace context, decided before the upstream head is written: a valid client
    /// `traceparent` (exactly one) goes upstream with its `tracestate` as they are and its
    /// trace id is kept. Otherwise (none, an invalid one, several) the client's
    /// `traceparent` and `tracestate` fields are put in the head's skip mask, and with
    /// `traceparent = "create"` the caller adds a new one ([`Conn::add_traceparent`]):
    /// returns whether to. With `"pass"` the request then has no trace id.
    pub(super) fn trace_context(&mut self, buf: &[u8]) -> bool {
        let (found, fields) = inbound(&self.head.headers, buf, &mut self.trace);
        if found == Inbound::Valid {
            return false;
        }
        self.head.headers.skip |= fields;
        self.snap.config.access_log.traceparent == TraceParent::Create
    }

    /// Adds a new `traceparent` to the upstream head in `out`, before its blank line.
    pub(super) fn add_traceparent(&mut self) {
        let random = {
            let mut rng = self.ctx.rng.borrow_mut();
            [rng.next_u64(), rng.next_u64(), rng.next_u64()]
        };
        let out = &mut self.io.out;
        out.truncate(out.len().saturating_sub(2));
        self.trace.create(random, out);
        out.extend_from_slice(b"\r\n");
    }

    /// The line of a request answered before routing (no model, no worker, no trace),
    /// once its answer of `bytes_out` bytes is written.
    pub(super) fn log_local(
        &mut self,
        target: &Target,
        status: u16,
        started: Instant,
        bytes_in: u64,
        bytes_out: u64,
    ) {
        self.trace.clear();
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
        self.log_request(target, &end);
    }

    /// The line of a request that went to [`super::forward`].
    pub(super) fn log_forwarded(
        &self,
        target: &Target,
        req: &Outbound<'_>,
        forwarded: Forwarded,
        trail: &Trail,
    ) {
        let overload = req.snap.config.overload_status_code;
        let (status, knob) = match forwarded {
            Forwarded::Done { status, .. } => (status, None),
            Forwarded::Rejected(e) => (e.status(overload), e.knob().map(|k| k.label())),
            // The worker's status when its head was relayed; else nginx's 499 (client
            // gone) or 502.
            Forwarded::Aborted(_) => {
                let gone = if trail.closed == Some("client") {
                    499
                } else {
                    502
                };
                (trail.status.unwrap_or(gone), None)
            }
        };
        let end = Ending {
            model: Some(req.model),
            status,
            knob,
            started: req.started,
            bytes_in: req.request_end as u64,
            trail,
        };
        self.log_request(target, &end);
    }
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
