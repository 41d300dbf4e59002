//! Stage: stream the response to the client as it arrives. Every upstream read is written
//! at once, in the client's framing (`http::reframe`: chunks passed through to HTTP/1.1
//! clients, de-chunked for HTTP/1.0 ones; a close-delimited body re-chunked for HTTP/1.1).
//! Between reads the worker may be silent for `upstream_stream_idle_timeout_ms`; a stream
//! that breaks off after the head never ends cleanly for the client, and an event stream
//! gets a last error event. SSE events count as generated tokens for tracked load; TTFT
//! and ITL are observed.

use std::io;
use std::time::{Duration, Instant};

use crate::runtime::stream::Upstream;

use super::error::AttemptError;
use super::exchange::Exchange;
use super::guards::Tracked;
use super::log::Trail;
use super::watch::{Interrupt, read_upstream};
use crate::http::reframe::{Break, Reframer};
use crate::http::response::ResponseHead;
use crate::http::sse::SseCounter;
use crate::http::usage::{UsageScanner, output_tokens};
use crate::http::write::{ClientFraming, client_response_head};
use crate::http::{BodyFraming, Limits};
use crate::runtime::clock;
use crate::state::counters::{
    ITL_BUCKETS, ModelCore, OSL_BUCKETS, Outcome, RequestType, TTFT_BUCKETS,
};

/// Time marks of one response, for TTFT and ITL.
struct Timing<'a> {
    cells: &'a ModelCore,
    started: Instant,
    /// `started` plus the wait in the model's room: the worker's own TTFT counts from
    /// here.
    at_worker: Instant,
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
                tracked.first_byte(now.duration_since(self.at_worker));
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

/// Streams the response whose head is at the start of `from_worker`. Returns whether the
/// upstream connection can be pooled.
pub(super) async fn relay(
    ex: &mut Exchange<'_, '_>,
    cells: &ModelCore,
    stream: &mut Upstream,
    resp: &ResponseHead,
    tracked: &mut Tracked<'_>,
    limits: &Limits,
) -> Result<bool, AttemptError> {
    let framing = resp.framing();
    let cf = ClientFraming::for_response(framing, ex.req.client_minor);
    begin(ex, resp, cf);
    let mut body = Reframer::new(framing, cf, resp.event_stream);
    let mut seen = Seen {
        timing: Timing {
            cells,
            started: ex.req.started,
            at_worker: ex.req.started + ex.before_worker,
            stream: ex.req.request_type == RequestType::Stream,
            last_data: None,
        },
        sse: SseCounter::default(),
        usage: UsageScanner::default(),
        events: 0,
        count_tokens: ex.req.model.track_output_blocks,
    };
    let idle = Duration::from_millis(limits.upstream_stream_idle_timeout_ms);
    let mut relayed = false;
    loop {
        let mut events = 0;
        let advanced = body.advance(&ex.io.from_worker, &mut ex.io.to_client, |d| {
            events += seen.sse.feed(d);
            seen.usage.feed(d);
        });
        let piece = match advanced {
            Ok(piece) => piece,
            // Nothing of the response reached the client yet: it can still get a 502.
            Err(_) if !relayed => return Err(INVALID_FRAMING),
            Err(_) => return broken(ex, &mut body, Break::Failed).await,
        };
        seen.piece(&mut ex.trail, tracked, piece.take, events);
        if piece.done {
            seen.observe_output();
        }
        write_piece(ex, piece.take, piece.direct).await?;
        relayed = true;
        ex.io.from_worker.drain(..piece.take);
        if piece.done {
            // Bytes past the end of the message: the connection is out of step; drop it.
            return Ok(resp.reusable
                && ex.io.from_worker.is_empty()
                && framing != BodyFraming::UntilClose);
        }
        let deadline = clock::now() + idle;
        match read_upstream(stream, &mut ex.io.from_worker, &mut ex.reader, deadline).await {
            Ok(Ok(0)) if body.eof(&mut ex.io.to_client).is_ok() => {
                // A body delimited by the close: that was its end.
                seen.observe_output();
                write_piece(ex, 0, true).await?;
                return Ok(false);
            }
            Ok(Ok(0)) | Ok(Err(_)) => return broken(ex, &mut body, Break::Failed).await,
            Ok(Ok(_)) => {}
            Err(Interrupt::ClientGone) => return Err(AttemptError::ClientGone),
            Err(Interrupt::Timeout | Interrupt::Abandoned) => {
                return broken(ex, &mut body, Break::Stalled).await;
            }
        }
    }
}

const INVALID_FRAMING: AttemptError =
    AttemptError::BadGateway("invalid framing in the worker's response body");

/// The stream broke off after its head reached the client: an event stream's client gets
/// a last error event where its framing allows one, and never a clean end.
async fn broken(
    ex: &mut Exchange<'_, '_>,
    body: &mut Reframer,
    why: Break,
) -> Result<bool, AttemptError> {
    if body.fail(&mut ex.io.to_client, why) {
        ex.trail.bytes_out += ex.io.to_client.len() as u64;
        write_piece(ex, 0, true).await?;
    }
    Err(AttemptError::Broken(match why {
        Break::Failed => Outcome::Internal,
        Break::Stalled => Outcome::ResponseTimeout,
    }))
}

/// What the payload told so far: time marks, events, usage.
struct Seen<'a> {
    timing: Timing<'a>,
    sse: SseCounter,
    usage: UsageScanner,
    /// SSE events so far.
    events: u64,
    /// `track_output_blocks`: events count as generated tokens in the tracked load.
    count_tokens: bool,
}

impl Seen<'_> {
    /// `take` more body bytes, with `events` SSE events.
    fn piece(&mut self, trail: &mut Trail, tracked: &mut Tracked<'_>, take: usize, events: u64) {
        if take == 0 {
            return;
        }
        if let Some(ttft) = self.timing.data(tracked) {
            trail.ttft = Some(ttft);
        }
        trail.bytes_out += take as u64;
        self.events += events;
        if self.count_tokens {
            tracked.generated(events);
        }
    }

    /// `dynamo_frontend_output_sequence_tokens` of a whole response. Before the last
    /// write, so a client that has the whole response finds it counted (the tokens were
    /// generated whether or not that write lands).
    fn observe_output(&self) {
        if let Some(n) = output_tokens(&self.usage, self.timing.stream, self.events) {
            let cells = self.timing.cells;
            cells.osl.observe_count(&OSL_BUCKETS, n);
        }
    }
}

/// Puts the client's response head in `to_client` (the request there is no longer needed: the
/// response is committed to this worker) and drops the upstream's from `from_worker`.
fn begin(ex: &mut Exchange<'_, '_>, resp: &ResponseHead, cf: ClientFraming) {
    let keep_client = ex.req.client_keep_alive && cf.allows_keep_alive();
    let (out, rbuf) = (&mut ex.io.to_client, &mut ex.io.from_worker);
    out.clear();
    client_response_head(
        out,
        rbuf,
        resp,
        cf,
        ex.request_id,
        keep_client,
        ex.req.client_minor,
    );
    rbuf.drain(..resp.head_len);
    ex.trail.status = Some(resp.status);
    ex.trail.bytes_out = out.len() as u64;
}

/// Writes what `to_client` holds (the head, the first time; re-chunked or de-chunked pieces)
/// and, for a `direct` piece, the first `take` bytes of `from_worker`: straight from `from_worker` when
/// nothing else is queued.
async fn write_piece(
    ex: &mut Exchange<'_, '_>,
    take: usize,
    direct: bool,
) -> Result<(), AttemptError> {
    let io = &mut *ex.io;
    let written = if direct && take > 0 && io.to_client.is_empty() {
        io.write_from_worker(take).await
    } else {
        if direct && take > 0 {
            io.to_client.extend_from_slice(&io.from_worker[..take]);
        }
        if io.to_client.is_empty() {
            Ok(())
        } else {
            io.write_to_client().await
        }
    };
    written.map_err(|e| match e.kind() {
        io::ErrorKind::TimedOut => AttemptError::ClientSendTimeout,
        _ => AttemptError::ClientGone,
    })
}
