//! Stage: stream the response to the client as it arrives. Every upstream read is written
//! at once (chunked passed through; close-delimited re-chunked for HTTP/1.1 clients);
//! SSE events count as generated tokens for tracked load; TTFT and ITL are observed.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::runtime::stream::Upstream;

use super::error::AttemptError;
use super::forward::Client;
use super::guards::Tracked;
use super::request::Outbound;
use super::watch::{Interrupt, read_upstream};
use crate::http::chunked::ChunkedParser;
use crate::http::response::ResponseHead;
use crate::http::sse::SseCounter;
use crate::http::usage::{UsageScanner, output_tokens};
use crate::http::write::{ClientFraming, LAST_CHUNK, chunk, client_response_head};
use crate::http::{BodyFraming, HttpError};
use crate::runtime::clock;
use crate::runtime::reader::ReadDone;
use crate::state::counters::{
    ITL_BUCKETS, ModelCore, OSL_BUCKETS, Outcome, RequestType, TTFT_BUCKETS,
};

/// Where the upstream body stands.
enum Body {
    Length(u64),
    Chunked(ChunkedParser),
    UntilClose,
    Done,
}

impl Body {
    fn new(framing: BodyFraming) -> Body {
        match framing {
            BodyFraming::None => Body::Done,
            BodyFraming::Length(n) => Body::Length(n),
            BodyFraming::Chunked => Body::Chunked(ChunkedParser::new()),
            BodyFraming::UntilClose => Body::UntilClose,
        }
    }

    /// Bytes of `buf` belonging to the body (to forward now) and whether it is complete.
    fn advance(
        &mut self,
        buf: &[u8],
        on_data: &mut impl FnMut(&[u8]),
    ) -> Result<(usize, bool), HttpError> {
        let (take, done) = match self {
            Body::Length(remaining) => {
                let take = (*remaining).min(buf.len() as u64) as usize;
                on_data(&buf[..take]);
                *remaining -= take as u64;
                (take, *remaining == 0)
            }
            Body::Chunked(p) => p.skim(buf, &mut *on_data)?,
            Body::UntilClose => {
                on_data(buf);
                (buf.len(), false)
            }
            Body::Done => (0, true),
        };
        if done {
            *self = Body::Done;
        }
        Ok((take, done))
    }
}

/// Time marks of one response, for TTFT and ITL.
struct Timing<'a> {
    cells: &'a ModelCore,
    started: Instant,
    stream: bool,
    last_data: Option<Instant>,
}

impl Timing<'_> {
    /// Body bytes arrived: the first observes TTFT (and ends prefill; returned), later
    /// ones ITL.
    fn data(&mut self, tracked: &mut Tracked<'_>) -> Option<Duration> {
        let now = clock::now();
        let mut first = None;
        match self.last_data {
            None => {
                let ttft = now.duration_since(self.started);
                tracked.first_byte(ttft);
                self.cells.ttft.observe(&TTFT_BUCKETS, ttft.as_secs_f64());
                first = Some(ttft);
            }
            Some(last) if self.stream => {
                let itl = now.duration_since(last).as_secs_f64();
                self.cells.itl.observe(&ITL_BUCKETS, itl);
            }
            Some(_) => {}
        }
        self.last_data = Some(now);
        first
    }
}

/// Streams the response whose head is at the start of `rbuf`. Returns whether the
/// upstream connection can be pooled.
pub(super) async fn relay<F: Future<Output = ReadDone>>(
    c: &mut Client<'_, F>,
    req: &Outbound<'_>,
    cells: &ModelCore,
    stream: &mut Upstream,
    resp: &ResponseHead,
    tracked: &mut Tracked<'_>,
    gap: Duration,
) -> Result<bool, AttemptError> {
    let framing = resp.framing();
    let cf = ClientFraming::for_response(framing, req.client_minor);
    begin(c, req, resp, cf);
    let mut body = Body::new(framing);
    let mut sse = SseCounter::default();
    let mut usage = UsageScanner::default();
    let mut all_events = 0;
    let count_tokens = req.model.track_output_blocks;
    let mut timing = Timing {
        cells,
        started: req.started,
        stream: req.request_type == RequestType::Stream,
        last_data: None,
    };
    let mut eof = false;
    loop {
        let mut events = 0;
        let (take, done) = body
            .advance(&c.io.rbuf, &mut |d| {
                events += sse.feed(d);
                usage.feed(d);
            })
            .map_err(|_| AttemptError::Broken(Outcome::Internal))?;
        let done = done || eof;
        if take > 0 {
            if let Some(ttft) = timing.data(tracked) {
                c.trail.ttft = Some(ttft);
            }
            c.trail.bytes_out += take as u64;
            all_events += events;
            if count_tokens {
                tracked.generated(events);
            }
        }
        if done {
            // Before the last write, so a client that has the whole response finds it
            // counted (the tokens were generated whether or not that write lands).
            observe_output(cells, &usage, timing.stream, all_events);
        }
        write_piece(c, cf, take, done).await?;
        c.io.rbuf.drain(..take);
        if done {
            // Bytes past the end of the message: the connection is out of step; drop it.
            return Ok(resp.reusable
                && !eof
                && c.io.rbuf.is_empty()
                && framing != BodyFraming::UntilClose);
        }
        let deadline = clock::now() + gap;
        match read_upstream(stream, &mut c.io.rbuf, &mut c.reader, deadline).await {
            Ok(Ok(0)) if matches!(body, Body::UntilClose) => eof = true,
            Ok(Ok(0)) | Ok(Err(_)) => return Err(AttemptError::Broken(Outcome::Internal)),
            Ok(Ok(_)) => {}
            Err(Interrupt::ClientGone) => return Err(AttemptError::ClientGone),
            Err(Interrupt::Timeout) => return Err(AttemptError::Broken(Outcome::ResponseTimeout)),
        }
    }
}

/// Puts the client's response head in `out` (the request there is no longer needed: the
/// response is committed to this worker) and drops the upstream's from `rbuf`.
fn begin<F: Future<Output = ReadDone>>(
    c: &mut Client<'_, F>,
    req: &Outbound<'_>,
    resp: &ResponseHead,
    cf: ClientFraming,
) {
    let keep_client = req.client_keep_alive && cf.allows_keep_alive();
    let (out, rbuf) = (&mut c.io.out, &mut c.io.rbuf);
    out.clear();
    client_response_head(
        out,
        rbuf,
        resp,
        cf,
        c.request_id,
        keep_client,
        req.client_minor,
    );
    rbuf.drain(..resp.head_len);
    c.trail.status = Some(resp.status);
    c.trail.bytes_out = out.len() as u64;
}

/// `dynamo_frontend_output_sequence_tokens` of a whole response.
fn observe_output(cells: &ModelCore, usage: &UsageScanner, stream: bool, events: u64) {
    if let Some(n) = output_tokens(usage, stream, events) {
        cells.osl.observe_count(&OSL_BUCKETS, n);
    }
}

/// Writes what `out` holds (the head, first time) and the first `take` bytes of `rbuf`,
/// re-chunked when the client needs it; straight from `rbuf` when nothing else is queued.
async fn write_piece<F>(
    c: &mut Client<'_, F>,
    cf: ClientFraming,
    take: usize,
    done: bool,
) -> Result<(), AttemptError> {
    let io = &mut *c.io;
    let rechunk = cf == ClientFraming::Rechunk;
    let written = if take > 0 && !rechunk && io.out.is_empty() {
        io.write_rbuf(take).await
    } else {
        if take > 0 && rechunk {
            chunk(&mut io.out, &io.rbuf[..take]);
        } else if take > 0 {
            io.out.extend_from_slice(&io.rbuf[..take]);
        }
        if done && rechunk {
            io.out.extend_from_slice(LAST_CHUNK);
        }
        if io.out.is_empty() {
            Ok(())
        } else {
            io.write_out().await
        }
    };
    written.map_err(|_| AttemptError::ClientGone)
}
