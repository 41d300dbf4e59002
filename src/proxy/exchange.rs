//! What one proxied request carries from the moment its model is known to its answer:
//! the request's facts ([`Outbound`]) and the client side lent to the stages that forward
//! it ([`Client`]: the read half, the buffers, the request id, the trail for the log).

use std::ops::Range;
use std::time::Instant;

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
}

/// The client side of the connection, lent to the forwarder.
pub(super) struct Client<'a> {
    pub reader: Reader<'a>,
    pub io: &'a mut ClientIo,
    pub request_id: &'a [u8],
    pub trail: &'a mut Trail,
}
