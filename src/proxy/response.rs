//! Stage: the worker's response head, read while the client is watched. The whole head
//! must arrive within `upstream_first_byte_timeout_ms` of the request's last byte going
//! out (a deadline: a head trickled a byte at a time does not stretch it). Interim 1xx
//! heads are skipped; a 529 or 503 before any body byte is a worker-local refusal, so the
//! request may migrate (ARCHITECTURE.md, "Admission gate"). A model with health checks
//! watches the wait for its worker hanging ([`HungWatch`]).

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::runtime::stream::Upstream;

use super::core::CoreCtx;
use super::error::{AttemptError, Refusal};
use super::exchange::Exchange;
use super::watch::{Interrupt, read_upstream_until};
use crate::http::response::{ResponseHead, parse_response};
use crate::http::{HttpError, Limits};
use crate::runtime::clock;
use crate::state::Worker;

/// Watches a wait for a head for its worker hanging (docs/behaviour.md §22.4): once the
/// request waited a check interval and no core got a head from the worker in that time,
/// nor did a check pass, the worker is suspect: new requests avoid it and the control
/// thread checks it at once. A suspicion that no check clears within the checks' timeout
/// (or a check that fails first) means the worker hangs, and the wait ends so that
/// another worker can take the request; unless the model ignores health (§22.7).
pub(super) struct HungWatch<'a> {
    ctx: &'a CoreCtx,
    worker: &'a Worker,
    model_id: u32,
    /// The checks' interval and timeout.
    interval_ms: u64,
    timeout_ms: u64,
    next: Cell<Instant>,
}

impl<'a> HungWatch<'a> {
    pub(super) fn new(
        ctx: &'a CoreCtx,
        worker: &'a Worker,
        model_id: u32,
        (interval_ms, timeout_ms): (u64, u64),
    ) -> Self {
        let next = Cell::new(clock::now() + Duration::from_millis(interval_ms));
        HungWatch {
            ctx,
            worker,
            model_id,
            interval_ms,
            timeout_ms,
            next,
        }
    }

    /// The next checkpoint, or `None` when the worker hangs.
    fn checkpoint(&self, now: Instant) -> Option<Instant> {
        let state = &self.worker.state;
        let now_ms = clock::now_ms();
        if !state.is_suspect() {
            state.stalled(now_ms, self.interval_ms);
        }
        let (out, ignored) = {
            let busy = &mut self.ctx.busy.borrow_mut();
            let busy = busy.load();
            (busy.is_unhealthy(state.slot), busy.panics(self.model_id))
        };
        let wait_ms = match state.suspect_since() {
            Some(since) if !ignored => match (since + self.timeout_ms).checked_sub(now_ms) {
                Some(left) if left > 0 && !out => left,
                _ => return None,
            },
            _ => self.interval_ms,
        };
        let next = now + Duration::from_millis(wait_ms);
        self.next.set(next);
        Some(next)
    }
}

/// Reads the final response head into `resp`; its bytes stay at the start of `from_worker`. A
/// close or reset before any byte is [`AttemptError::Hangup`].
pub(super) async fn read_response_head(
    ex: &mut Exchange<'_, '_>,
    stream: &mut Upstream,
    limits: &Limits,
    resp: &mut ResponseHead,
    hung: Option<&HungWatch<'_>>,
) -> Result<(), AttemptError> {
    let deadline = clock::now() + Duration::from_millis(limits.upstream_first_byte_timeout_ms);
    let mut checkpoint = |now: Instant| hung.and_then(|h| h.checkpoint(now));
    ex.io.from_worker.clear();
    let mut received = false;
    loop {
        if !ex.io.from_worker.is_empty() {
            received = true;
            match parse_response(&ex.io.from_worker, limits.max_header_bytes, false, resp) {
                Ok(false) => {}
                Ok(true) if resp.status == 101 => {
                    return Err(AttemptError::BadGateway("unexpected protocol switch"));
                }
                Ok(true) if resp.is_informational() => {
                    ex.io.from_worker.drain(..resp.head_len);
                    continue;
                }
                Ok(true) => return Ok(()),
                Err(HttpError::HeaderTooLarge) => {
                    return Err(AttemptError::BadGateway("response head too large"));
                }
                Err(_) => {
                    return Err(AttemptError::BadGateway(
                        "malformed response from the worker",
                    ));
                }
            }
        }
        let check = hung.map(|h| (h.next.get(), &mut checkpoint as _));
        let rbuf = &mut ex.io.from_worker;
        match read_upstream_until(stream, rbuf, &mut ex.reader, deadline, check).await {
            Err(Interrupt::ClientGone) => return Err(AttemptError::ClientGone),
            Err(Interrupt::Timeout) => return Err(AttemptError::Timeout),
            Err(Interrupt::Abandoned) => return Err(AttemptError::Stalled),
            Ok(Ok(0)) | Ok(Err(_)) if !received => return Err(AttemptError::Hangup),
            Ok(Ok(0)) | Ok(Err(_)) => {
                return Err(AttemptError::BadGateway(
                    "the worker closed the connection before its response head's end",
                ));
            }
            Ok(Ok(_)) => {}
        }
    }
}

/// A refusal by the worker itself, from its status before any body byte: 529, and the
/// configured overload status when it is 429 or 5xx (a front Spillway before a back one
/// configured alike), say "overloaded"; 503 says "unavailable". Anything else, a 2xx
/// above all, is the worker's answer and goes to the client as it is.
pub(super) fn refusal(status: u16, overload_status: u16) -> Option<Refusal> {
    let overload_like = |s: u16| s == 429 || (500..600).contains(&s);
    match status {
        529 => Some(Refusal::UpstreamOverloaded),
        s if s == overload_status && overload_like(s) => Some(Refusal::UpstreamOverloaded),
        503 => Some(Refusal::UpstreamUnavailable),
        _ => None,
    }
}

/// A worker's failure by its status: a 5xx that is not a refusal (docs/behaviour.md §22.1).
pub(super) fn failed(status: u16, overload_status: u16) -> bool {
    status >= 500 && refusal(status, overload_status).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (upstream status, configured overload status, refusal)
    const STATUSES: &[(u16, u16, Option<Refusal>)] = &[
        (529, 529, Some(Refusal::UpstreamOverloaded)),
        (529, 200, Some(Refusal::UpstreamOverloaded)),
        (503, 529, Some(Refusal::UpstreamUnavailable)),
        (503, 503, Some(Refusal::UpstreamOverloaded)),
        (429, 429, Some(Refusal::UpstreamOverloaded)),
        (429, 529, None),
        (500, 500, Some(Refusal::UpstreamOverloaded)),
        (500, 529, None),
        // A 2xx is never a refusal, whatever the configured code.
        (200, 200, None),
        (200, 529, None),
        // The configured code counts only when it is 429 or 5xx.
        (400, 400, None),
        (404, 404, None),
    ];

    #[test]
    fn failures_by_status() {
        for &(status, configured, want) in &[
            (500, 529, true),
            (502, 529, true),
            (504, 529, true),
            (503, 529, false),
            (529, 529, false),
            (500, 500, false),
            (404, 529, false),
            (200, 529, false),
        ] {
            assert_eq!(
                failed(status, configured),
                want,
                "{status} with {configured}"
            );
        }
    }

    #[test]
    fn refusals_by_status() {
        for &(status, configured, want) in STATUSES {
            assert_eq!(
                refusal(status, configured),
                want,
                "{status} with {configured}"
            );
        }
    }
}
