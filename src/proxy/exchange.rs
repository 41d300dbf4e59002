//! One proxied request, from the moment its model is known to its answer: the
//! [`Exchange`] the stages that forward it share, with the request's facts
//! ([`Outbound`]), the client's read half, the buffers (the request kept whole for a
//! migration, its prompt's place in it), and the trail its log line is made of.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::log::Trail;
use super::session::ClientIo;
use super::watch::Reader;
use crate::route::Endpoint;
use crate::shed::Class;
use crate::state::counters::RequestType;
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
    /// The client's stated budget in ms (`x-stainless-timeout`, `client_budget_header`),
    /// counted from `started`: it bounds the request's waits for a slot.
    pub budget_ms: Option<u64>,
    /// The hash of its tenant's `tenant_header` value (0 without one): waiting rooms
    /// serve tenants in turn.
    pub tenant: u64,
}

/// What the stages of one proxied request work on, from `forward` to `relay`.
pub(super) struct Exchange<'a, 'r> {
    /// The request's facts; the stages read them.
    pub req: Outbound<'r>,
    /// The client's read half, watched while the worker works.
    pub reader: Reader<'a>,
    /// The client's write half and the buffers by role (`to_worker` holds the request).
    pub io: &'a mut ClientIo,
    /// The prompt value's place in `io.to_worker` (`kv` routing hashes it).
    pub prompt_at: Range<usize>,
    pub request_id: &'a [u8],
    /// What the request's log line will say.
    pub trail: Trail,
    /// Its time before the worker that answers had it (in the model's waiting room; a
    /// disaggregated request's stage 1): no doing of that worker's, so its TTFT sample for
    /// the adaptive mode leaves it out.
    pub before_worker: Duration,
    /// The client's request as it goes upstream: its head's length, and where its
    /// `content-length` digits are (a disaggregated request's stages rewrite both).
    pub head_len: usize,
    pub length_at: Option<Range<usize>>,
    /// Stage 1 of a disaggregated request: the response body is collected whole into
    /// `io.to_client`, not relayed.
    pub collect: bool,
}

impl Exchange<'_, '_> {
    /// The prompt value as the worker gets it.
    pub(super) fn prompt(&self) -> &[u8] {
        self.io
            .to_worker
            .get(self.prompt_at.clone())
            .unwrap_or_default()
    }
}
