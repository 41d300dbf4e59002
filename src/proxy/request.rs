//! Stage: a proxied request, from its body to its answer. The body is read whole, the
//! model found in it without allocating (`route::peek`), the upstream head written into
//! the connection's reused buffer, and the request handed to [`super::forward`]; what comes
//! back is either already relayed, or answered here.

use std::ops::Range;
use std::time::Instant;

use super::body::BodyError;
use super::conn::Conn;
use super::error::RequestError;
use super::forward::{Client, Forwarded, forward};
use super::log::{Target, Trail};
use super::watch::Reader;
use crate::http::limits::{INITIAL_READ_BUF, RETAINED_BUF_MAX};
use crate::http::write::upstream_request_head;
use crate::route::Endpoint;
use crate::route::peek::peek;
use crate::runtime::clock;
use crate::shed::Class;
use crate::state::counters::{RequestType, add};
use crate::state::{Model, Snapshot};

/// What is being forwarded.
#[derive(Debug)]
pub(super) struct Outbound<'a> {
    pub snap: &'a Snapshot,
    pub model: &'a Model,
    pub endpoint: Endpoint,
    pub request_type: RequestType,
    pub class: Class,
    pub prompt_tokens: u64,
    /// The prompt value (`messages`, `prompt` or `input`) within the body.
    pub prompt: Range<usize>,
    /// The de-chunked body within the client buffer.
    pub body: Range<usize>,
    /// Bytes of this request (head and raw body) at the start of the client buffer.
    pub request_end: usize,
    /// The `x-worker-id` value within the client buffer (direct routing).
    pub worker_id: Option<Range<usize>>,
    pub client_minor: u8,
    pub client_keep_alive: bool,
    pub started: Instant,
}

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
    let model = snap.model(name).ok_or(RequestError::UnknownModel)?;
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

impl Conn {
    /// The class the request's header names, else the model's (an unknown value is no
    /// error).
    fn class_of(&self, buf: &[u8], snap: &Snapshot, model: &Model) -> Class {
        let header = self.head.headers.find(buf, &snap.config.classes.header);
        header.and_then(Class::parse).unwrap_or(model.class)
    }

    /// The upstream request's head, into the reused `out` buffer, with trace context.
    fn upstream_head(&mut self, buf: &[u8], body_len: usize) {
        let create = self.trace_context(buf);
        let out = &mut self.io.out;
        out.clear();
        let (head, rid) = (&self.head, self.request_id.get());
        upstream_request_head(out, buf, head, body_len, self.peer.get(), rid);
        if create {
            self.add_traceparent();
        }
    }

    /// Returns whether the connection stays open.
    pub(super) async fn proxy(&mut self, mut reader: Reader<'_>, endpoint: Endpoint) -> bool {
        let started = clock::now();
        let target = Target::of(self, reader.buf());
        if !self.continue_100(&reader).await {
            return false;
        }
        let body = match self.read_body(reader.as_mut()).await {
            Ok(b) => b,
            Err(BodyError::Closed) => return false,
            Err(BodyError::Bad(e)) => return self.refuse(RequestError::Framing(e)).await,
        };
        let snap = self.snap.clone();
        let found = find_model(
            &snap,
            reader.buf().get(body.range.clone()).unwrap_or_default(),
            &mut self.scratch,
        );
        let keep = self.head.keep_alive;
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                add(&self.ctx.counters().bad_requests, 1);
                reader.as_mut().consume(body.request_end, INITIAL_READ_BUF);
                let status = e.status(snap.config.overload_status_code);
                let (keep, bytes_out) = self.answer_counted(e, keep, true).await;
                let bytes_in = body.request_end as u64;
                self.log_local(&target, status, started, bytes_in, bytes_out);
                return keep;
            }
        };
        self.class = self.class_of(reader.buf(), &snap, found.model);
        let req = Outbound {
            snap: &snap,
            model: found.model,
            endpoint,
            request_type: found.request_type,
            class: self.class,
            prompt_tokens: found.prompt_tokens,
            prompt: found.prompt,
            body: body.range,
            request_end: body.request_end,
            worker_id: self
                .head
                .worker_id
                .map(|s| s.start as usize..s.end as usize),
            client_minor: self.head.minor_version,
            client_keep_alive: keep,
            started,
        };
        self.upstream_head(reader.buf(), req.body.len());
        let mut trail = Trail::default();
        let mut client = Client {
            reader: reader.as_mut(),
            io: &mut self.io,
            request_id: self.request_id.get(),
            trail: &mut trail,
        };
        let forwarded = forward(&self.ctx, &mut client, &req).await;
        let keep = match forwarded {
            Forwarded::Done { keep_alive, .. } => keep_alive,
            Forwarded::Aborted(_) => false,
            Forwarded::Rejected(e) => {
                let (keep, written) = self.answer_counted(e, keep, true).await;
                trail.bytes_out += written;
                keep
            }
        };
        self.log_forwarded(&target, &req, forwarded, &trail);
        if self.io.out.capacity() > RETAINED_BUF_MAX {
            // One large body must not pin its buffer on an idle keep-alive connection.
            self.io.out.clear();
            self.io.out.shrink_to(4096);
        }
        keep
    }
}
