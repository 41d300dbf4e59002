//! Stage: the worker's response head, read while the client is watched. The whole head
//! must arrive within `upstream_first_byte_timeout_ms` of the request's last byte going
//! out (a deadline: a head trickled a byte at a time does not stretch it). Interim 1xx
//! heads are skipped; a 529 or 503 before any body byte is a worker-local refusal, so the
//! request may migrate (ARCHITECTURE.md, "Admission gate").

use std::time::Duration;

use crate::runtime::stream::Upstream;

use super::error::{AttemptError, Refusal};
use super::exchange::Exchange;
use super::watch::{Interrupt, read_upstream};
use crate::http::response::{ResponseHead, parse_response};
use crate::http::{HttpError, Limits};
use crate::runtime::clock;

/// Reads the final response head into `resp`; its bytes stay at the start of `from_worker`. A
/// close or reset before any byte is [`AttemptError::Hangup`].
pub(super) async fn read_response_head(
    ex: &mut Exchange<'_, '_>,
    stream: &mut Upstream,
    limits: &Limits,
    resp: &mut ResponseHead,
) -> Result<(), AttemptError> {
    let deadline = clock::now() + Duration::from_millis(limits.upstream_first_byte_timeout_ms);
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
        match read_upstream(stream, &mut ex.io.from_worker, &mut ex.reader, deadline).await {
            Err(Interrupt::ClientGone) => return Err(AttemptError::ClientGone),
            Err(Interrupt::Timeout) => return Err(AttemptError::Timeout),
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
