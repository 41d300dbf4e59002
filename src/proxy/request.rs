//! Stage: a proxied request, from its body to its answer. The body is read whole, the
//! model found in it without allocating (`route::peek`), the upstream head written into
//! the connection's reused buffer, and the request handed to [`super::forward`]; what comes
//! back is either already relayed, or answered here.

use std::hash::Hasher;
use std::ops::Range;

use super::body::BodyError;
use super::body::{continue_100, read_body};
use super::error::RequestError;
use super::exchange::{Exchange, Outbound};
use super::forward::{Forwarded, forward};
use super::log::Ending;
use super::log::log_local;
use super::log::log_request;
use super::log::{ClosedBy, Target, Trail};
use super::session::{ClientIo, Session};
use super::watch::Reader;
use crate::config::PoolRole;
use crate::config::access_log::TraceParent;
use crate::http::budget::budget_ms;
use crate::http::limits::{INITIAL_READ_BUF, RETAINED_BUF_MAX};
use crate::http::trace::Inbound;
use crate::http::trace::inbound;
use crate::http::write::upstream_request_head;
use crate::route::Endpoint;
use crate::route::peek::peek;
use crate::runtime::clock;
use crate::shed::Class;
use crate::state::counters::{RequestType, add};
use crate::state::{Model, Snapshot};

/// What routing needs from a body.
struct Found<'s> {
    model: &'s Model,
    request_type: RequestType,
    prompt_tokens: u64,
    prompt: Range<usize>,
}

/// The model a body names (404 when unknown), whether it streams, its prompt's size and
/// where the prompt is.
fn find_model<'s>(
    snap: &'s Snapshot,
    body: &[u8],
    scratch: &mut Vec<u8>,
) -> Result<Found<'s>, RequestError> {
    let p = peek(body).map_err(RequestError::BadBody)?;
    let name = p.model.ok_or(RequestError::MissingModel)?;
    let name = name.decoded(scratch).map_err(RequestError::BadBody)?;
    let model = (snap.model(name))
        .filter(|m| m.role == PoolRole::Serve)
        .ok_or(RequestError::UnknownModel)?;
    let request_type = if p.stream {
        RequestType::Stream
    } else {
        RequestType::Unary
    };
    let (start, end) = p.prompt.unwrap_or_default();
    Ok(Found {
        model,
        request_type,
        prompt_tokens: (p.prompt_bytes as u64).div_ceil(4),
        prompt: start..end,
    })
}

/// The class the request's header names, else the model's (an unknown value is no
/// error).
fn class_of(s: &Session, buf: &[u8], snap: &Snapshot, model: &Model) -> Class {
    let header = s.head.headers.find(buf, &snap.config.classes.header);
    header.and_then(Class::parse).unwrap_or(model.class)
}

/// The time the client gives its request, as its head states it (docs/behaviour.md §8.10).
fn budget_of(s: &Session, buf: &[u8], snap: &Snapshot) -> Option<u64> {
    let secs = s.head.stainless_timeout.map(|v| v.get(buf));
    let header = snap.config.client_budget_header.as_deref();
    let ms = header.and_then(|name| s.head.headers.find(buf, name));
    budget_ms(secs, ms)
}

/// The hash of the request's `tenant_header` value; 0 without one (or none configured).
/// The value itself is never kept or logged (it may be a bearer token).
fn tenant_of(s: &Session, buf: &[u8], snap: &Snapshot) -> u64 {
    let header = snap.config.tenant_header.as_deref();
    let value = header.and_then(|name| s.head.headers.find(buf, name));
    value.map_or(0, |v| {
        let mut h = rustc_hash::FxHasher::default();
        h.write(v);
        h.finish()
    })
}

/// The upstream request's head, into the reused `to_worker` buffer, with trace context:
/// where its `content-length` digits are.
fn upstream_head(s: &mut Session, buf: &[u8], body_len: usize) -> Option<Range<usize>> {
    let create = trace_context(s, buf);
    let out = &mut s.io.to_worker;
    out.clear();
    let (head, rid) = (&s.head, s.request_id.get());
    let length_at = upstream_request_head(out, buf, head, body_len, s.peer.get(), rid);
    if create {
        add_traceparent(s);
    }
    length_at
}

/// Returns whether the connection stays open.
pub(super) async fn proxy(s: &mut Session, mut reader: Reader<'_>, endpoint: Endpoint) -> bool {
    let started = clock::now();
    let target = Target::of(&s.head, reader.buf());
    if !continue_100(s, &reader).await {
        return false;
    }
    let body = match read_body(s, reader.as_mut()).await {
        Ok(b) => b,
        Err(BodyError::Closed) => return false,
        Err(BodyError::Bad(e)) => return s.answer_malformed(e).await,
    };
    let snap = s.snap.clone();
    let found = find_model(
        &snap,
        reader.buf().get(body.range.clone()).unwrap_or_default(),
        &mut s.scratch,
    );
    let keep = s.head.keep_alive;
    let found = match found {
        Ok(found) => found,
        Err(e) => {
            add(&s.ctx.counters().bad_requests, 1);
            reader.as_mut().consume(body.request_end, INITIAL_READ_BUF);
            let status = e.status(snap.config.overload_status_code);
            let (keep, bytes_out) = s.answer_counted(e, keep, true).await;
            let bytes_in = body.request_end as u64;
            log_local(s, &target, status, started, bytes_in, bytes_out);
            return keep;
        }
    };
    s.class = class_of(s, reader.buf(), &snap, found.model);
    let req = Outbound {
        snap: &snap,
        model: found.model,
        endpoint,
        request_type: found.request_type,
        class: s.class,
        prompt_tokens: found.prompt_tokens,
        prompt: found.prompt,
        body: body.range,
        request_end: body.request_end,
        worker_id: s.head.worker_id.map(|s| s.start as usize..s.end as usize),
        client_minor: s.head.minor_version,
        client_keep_alive: keep,
        started,
        budget_ms: budget_of(s, reader.buf(), &snap),
        tenant: tenant_of(s, reader.buf(), &snap),
    };
    let length_at = upstream_head(s, reader.buf(), req.body.len());
    let head_len = s.io.to_worker.len();
    let mut ex = Exchange {
        req,
        reader: reader.as_mut(),
        io: &mut s.io,
        prompt_at: 0..0,
        request_id: s.request_id.get(),
        trail: Trail::default(),
        before_worker: std::time::Duration::ZERO,
        head_len,
        length_at,
        collect: false,
    };
    let forwarded = forward(&s.ctx, &mut ex).await;
    let Exchange { req, mut trail, .. } = ex;
    let keep = match forwarded {
        Forwarded::Done { keep_alive, .. } => keep_alive,
        Forwarded::Aborted(_) => false,
        Forwarded::Local(e) => {
            let disaggregated = req.model.disagg.is_some();
            s.pool = trail.pool.or(disaggregated.then_some(PoolRole::Serve));
            let (keep, written) = s.answer_counted(e, keep, true).await;
            s.pool = None;
            trail.bytes_out += written;
            keep
        }
    };
    log_forwarded(s, &target, &req, forwarded, &trail);
    release_large(&mut s.io);
    keep
}

/// One large body must not pin its buffers on an idle keep-alive connection.
fn release_large(io: &mut ClientIo) {
    for buf in [&mut io.to_worker, &mut io.kept] {
        if buf.capacity() > RETAINED_BUF_MAX {
            buf.clear();
            buf.shrink_to(4096);
        }
    }
}

/// W3C trace context, decided before the upstream head is written: a valid client
/// `traceparent` (exactly one) goes upstream with its `tracestate` as they are and its
/// trace id is kept. Otherwise (none, an invalid one, several) the client's
/// `traceparent` and `tracestate` fields are put in the head's skip mask, and with
/// `traceparent = "create"` the caller adds a new one ([`add_traceparent`]):
/// returns whether to. With `"pass"` the request then has no trace id.
fn trace_context(s: &mut Session, buf: &[u8]) -> bool {
    let (found, fields) = inbound(&s.head.headers, buf, &mut s.trace);
    if found == Inbound::Valid {
        return false;
    }
    s.head.headers.skip |= fields;
    s.snap.config.access_log.traceparent == TraceParent::Create
}

/// Adds a new `traceparent` to the upstream head in `to_worker`, before its blank line.
fn add_traceparent(s: &mut Session) {
    let random = {
        let mut rng = s.ctx.rng.borrow_mut();
        [rng.next_u64(), rng.next_u64(), rng.next_u64()]
    };
    let out = &mut s.io.to_worker;
    out.truncate(out.len().saturating_sub(2));
    s.trace.create(random, out);
    out.extend_from_slice(b"\r\n");
}

/// The line of a request that went to [`super::forward`].
fn log_forwarded(
    s: &Session,
    target: &Target,
    req: &Outbound<'_>,
    forwarded: Forwarded,
    trail: &Trail,
) {
    let overload = req.snap.config.overload_status_code;
    let (status, knob) = match forwarded {
        Forwarded::Done { status, .. } => (status, None),
        Forwarded::Local(e) => (e.status(overload), e.knob().map(|k| k.label())),
        // The worker's status when its head was relayed; else nginx's 499 (client
        // gone) or 502.
        Forwarded::Aborted(_) => {
            let gone = if trail.closed == Some(ClosedBy::Client) {
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
    log_request(s, target, &end);
}
