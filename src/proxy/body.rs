//! Stage: read the request body whole (the model is in it), de-chunked in place, bounded
//! by `max_body_bytes`; each wait for more bytes is bounded by `body_read_timeout_ms`
//! (then 408 "timed out reading the request body"). `Expect: 100-continue` is answered
//! first when the body is wanted.

use std::ops::Range;
use std::time::Duration;

use super::session::Session;
use super::watch::Reader;
use crate::http::chunked::Dechunker;
use crate::http::limits::RETAINED_BUF_MAX;
use crate::http::{BodyFraming, HttpError};
use crate::runtime::stalls::Within;

pub(super) enum BodyError {
    /// The client went away.
    Closed,
    Bad(HttpError),
}

/// A body read whole: its bytes (de-chunked) and where the request's raw bytes end in the
/// client buffer.
pub(super) struct Body {
    pub range: Range<usize>,
    pub request_end: usize,
}

/// Invites the body with `100 Continue` when the client waits for it. False: the
/// client is gone.
pub(super) async fn continue_100(s: &mut Session, reader: &Reader<'_>) -> bool {
    if !s.head.expect_continue || reader.buf().len() > s.head.head_len {
        return true;
    }
    let io = &mut s.io;
    let write = io.writer.write_static(b"HTTP/1.1 100 Continue\r\n\r\n");
    let res = Within::new(write, &io.stalls, io.send_timeout_ms).await;
    matches!(res, Some(Ok(())))
}

pub(super) async fn read_body(s: &mut Session, mut reader: Reader<'_>) -> Result<Body, BodyError> {
    let limits = &s.snap.config.limits;
    let head_len = s.head.head_len;
    let gap = Duration::from_millis(limits.body_read_timeout_ms);
    let mut dechunker = Dechunker::new(head_len);
    let total = match s.head.body {
        BodyFraming::Length(n) => {
            let total = head_len + n as usize;
            // One allocation for the body, but only up to what a connection keeps
            // anyway: a head alone must not reserve up to `max_body_bytes`. A larger
            // body grows the buffer as its bytes arrive.
            reader
                .as_mut()
                .reserve_total(total.min(head_len + RETAINED_BUF_MAX));
            Some(total)
        }
        BodyFraming::Chunked => None,
        BodyFraming::None | BodyFraming::UntilClose => {
            return Ok(Body {
                range: head_len..head_len,
                request_end: head_len,
            });
        }
    };
    loop {
        match total {
            Some(total) if reader.buf().len() >= total => {
                return Ok(Body {
                    range: head_len..total,
                    request_end: total,
                });
            }
            Some(_) => {}
            None => {
                if let Some(buf) = reader.as_mut().buf_mut() {
                    let filled = buf.len();
                    match dechunker.decode(buf, filled, head_len + limits.max_body_bytes) {
                        Ok(true) => {
                            return Ok(Body {
                                range: head_len..dechunker.out,
                                request_end: dechunker.raw,
                            });
                        }
                        Ok(false) => {}
                        Err(e) => return Err(BodyError::Bad(e)),
                    }
                }
            }
        }
        match monoio::time::timeout(gap, reader.as_mut().fill()).await {
            Ok(Ok(n)) if n > 0 => {}
            Err(_) => return Err(BodyError::Bad(HttpError::BodyTimeout)),
            _ => return Err(BodyError::Closed),
        }
    }
}
