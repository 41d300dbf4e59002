//! Stage, in place of `relay.rs` for stage 1 of a disaggregated request
//! (docs/behaviour.md §23): the prefill worker's response body is read whole, de-chunked,
//! into `to_client` (which holds nothing for the client until stage 2 answers), within
//! `max_body_bytes`. Between reads the worker may be silent for
//! `upstream_stream_idle_timeout_ms`; the client is watched throughout. Nothing reaches the
//! client, so any failure here can still be retried or fall back.

use std::time::Duration;

use crate::runtime::stream::Upstream;

use super::error::AttemptError;
use super::exchange::Exchange;
use super::guards::Tracked;
use super::watch::{Interrupt, read_upstream};
use crate::http::reframe::Reframer;
use crate::http::response::ResponseHead;
use crate::http::write::ClientFraming;
use crate::http::{BodyFraming, Limits};
use crate::runtime::clock;
use crate::state::counters::{ModelCore, TTFT_BUCKETS};

const TOO_LARGE: AttemptError =
    AttemptError::BadGateway("the prefill worker's response is larger than max_body_bytes");
const INVALID_FRAMING: AttemptError =
    AttemptError::BadGateway("invalid framing in the worker's response body");
const CUT_SHORT: AttemptError =
    AttemptError::BadGateway("the worker closed the connection before the body's end");

/// Reads the body of the response whose head is at the start of `from_worker` into
/// `to_client`. Returns whether the upstream connection can be pooled. The stage's
/// worker time (its TTFT: the whole answer is its one token) is observed on `cells`.
pub(super) async fn collect(
    ex: &mut Exchange<'_, '_>,
    cells: &ModelCore,
    stream: &mut Upstream,
    resp: &ResponseHead,
    tracked: &mut Tracked<'_>,
    limits: &Limits,
) -> Result<bool, AttemptError> {
    let framing = resp.framing();
    // An HTTP/1.0 client's framing: chunks de-chunked, any other body as it is.
    let mut body = Reframer::new(framing, ClientFraming::for_response(framing, 0), false);
    ex.io.from_worker.drain(..resp.head_len);
    ex.io.to_client.clear();
    let idle = Duration::from_millis(limits.upstream_stream_idle_timeout_ms);
    loop {
        let io = &mut *ex.io;
        let piece = (body.advance(&io.from_worker, &mut io.to_client, |_| {}))
            .map_err(|_| INVALID_FRAMING)?;
        if piece.direct {
            io.to_client
                .extend_from_slice(&io.from_worker[..piece.take]);
        }
        io.from_worker.drain(..piece.take);
        if io.to_client.len() > limits.max_body_bytes {
            return Err(TOO_LARGE);
        }
        if piece.done {
            answered(ex, cells, tracked);
            return Ok(resp.reusable
                && ex.io.from_worker.is_empty()
                && framing != BodyFraming::UntilClose);
        }
        let deadline = clock::now() + idle;
        match read_upstream(stream, &mut ex.io.from_worker, &mut ex.reader, deadline).await {
            Ok(Ok(0)) if body.eof(&mut ex.io.to_client).is_ok() => {
                answered(ex, cells, tracked);
                return Ok(false);
            }
            Ok(Ok(0)) | Ok(Err(_)) => return Err(CUT_SHORT),
            Ok(Ok(_)) => {}
            Err(Interrupt::ClientGone) => return Err(AttemptError::ClientGone),
            Err(Interrupt::Timeout | Interrupt::Abandoned) => return Err(AttemptError::Stalled),
        }
    }
}

/// The stage's answer is whole: its time to the prefill pool's TTFT and the worker's.
fn answered(ex: &Exchange<'_, '_>, cells: &ModelCore, tracked: &mut Tracked<'_>) {
    let now = clock::now();
    tracked.first_byte(now.duration_since(ex.req.started + ex.before_worker));
    let ttft = now.duration_since(ex.req.started);
    cells.ttft.observe(&TTFT_BUCKETS, ttft.as_secs_f64());
}
