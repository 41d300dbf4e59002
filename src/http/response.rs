//! Upstream response heads: status, framing (RFC 9112 §6.3) and the forwarding mask.

use super::limits::MAX_HEADERS;
use super::request::keep_alive_after;
use super::{
    BodyFraming, ConnectionOptions, HeaderList, HeaderSpan, HttpError, Span, is_hop_by_hop,
    list_tokens, name_is, parse_content_length,
};

#[derive(Debug, Clone, Default)]
pub struct ResponseHead {
    pub status: u16,
    pub reason: Span,
    pub minor_version: u8,
    pub head_len: usize,
    pub headers: HeaderList,
    pub body: Option<BodyFraming>,
    /// The upstream connection may carry another request once this body is read.
    pub reusable: bool,
    /// `Content-Type: text/event-stream`.
    pub event_stream: bool,
}

impl ResponseHead {
    pub fn framing(&self) -> BodyFraming {
        self.body.unwrap_or(BodyFraming::UntilClose)
    }

    pub fn is_informational(&self) -> bool {
        (100..200).contains(&self.status)
    }
}

/// Parses an upstream response head at the start of `buf`. `Ok(false)` means read more.
/// Any error makes the response unusable (502 to the client, connection discarded).
pub fn parse_response(
    buf: &[u8],
    max_header_bytes: usize,
    request_was_head: bool,
    out: &mut ResponseHead,
) -> Result<bool, HttpError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut fields);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= max_header_bytes => {
            return Err(HttpError::HeaderTooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(false),
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::HeaderTooLarge),
        Err(httparse::Error::Version) => return Err(HttpError::Version),
        Err(_) => return Err(HttpError::Malformed("invalid upstream response head")),
    };
    let (Some(code), Some(version)) = (resp.code, resp.version) else {
        return Err(HttpError::Malformed("incomplete status line"));
    };
    if code < 100 {
        // Three digits on the wire, but no status class: relayed, it would not be a
        // valid status line.
        return Err(HttpError::Malformed("invalid status code"));
    }
    *out = ResponseHead {
        status: code,
        reason: resp
            .reason
            .map(|r| Span::within(buf, r.as_bytes()))
            .unwrap_or_default(),
        minor_version: version,
        head_len,
        reusable: version == 1,
        ..ResponseHead::default()
    };
    let mut scan = FieldScan::default();
    for (i, h) in resp.headers.iter().enumerate() {
        scan.field(buf, i, h.name.as_bytes(), h.value, out)?;
    }
    out.headers.len = resp.headers.len();
    scan.options.mark(buf, &mut out.headers);
    let no_body = request_was_head || code < 200 || code == 204 || code == 304;
    out.body = if no_body {
        Some(BodyFraming::None)
    } else {
        scan.framing(&mut out.reusable)?
    };
    Ok(true)
}

/// What the fields of one response head say about its framing.
#[derive(Default)]
struct FieldScan<'a> {
    content_length: Option<u64>,
    length_error: Option<HttpError>,
    /// Whether the last transfer coding named is `chunked` (`None`: no Transfer-Encoding).
    chunked_last: Option<bool>,
    options: ConnectionOptions<'a>,
}

impl<'a> FieldScan<'a> {
    fn field(
        &mut self,
        buf: &[u8],
        i: usize,
        name: &[u8],
        value: &'a [u8],
        out: &mut ResponseHead,
    ) -> Result<(), HttpError> {
        out.headers.fields[i] = HeaderSpan {
            name: Span::of(buf, name),
            value: Span::of(buf, value),
        };
        let bit = 1u128 << i;
        if is_hop_by_hop(name) {
            out.headers.skip |= bit;
        }
        if name_is(name, "content-length") {
            out.headers.skip |= bit;
            match parse_content_length(value, self.content_length) {
                Ok(n) => self.content_length = Some(n),
                Err(e) => self.length_error = Some(e),
            }
        } else if name_is(name, "transfer-encoding") {
            self.chunked_last = list_tokens(value)
                .last()
                .map(|t| t.eq_ignore_ascii_case(b"chunked"))
                .or(self.chunked_last);
        } else if name_is(name, "connection") {
            self.options.add(value)?;
            out.reusable = keep_alive_after(out.reusable, value, out.minor_version == 0);
        } else if name_is(name, "x-request-id") {
            out.headers.skip |= bit;
        } else if name_is(name, "content-type") {
            out.event_stream = value
                .trim_ascii_start()
                .get(..17)
                .is_some_and(|t| t.eq_ignore_ascii_case(b"text/event-stream"));
        }
        Ok(())
    }

    /// The body's framing (`None`: until close); clears `reusable` where the connection
    /// cannot carry another response.
    fn framing(&self, reusable: &mut bool) -> Result<Option<BodyFraming>, HttpError> {
        if let Some(chunked) = self.chunked_last {
            // Transfer-Encoding overrides Content-Length; a message carrying both is
            // suspect, so its connection is not reused.
            if self.content_length.is_some() || self.length_error.is_some() {
                *reusable = false;
            }
            if chunked {
                return Ok(Some(BodyFraming::Chunked));
            }
            *reusable = false;
            return Ok(None);
        }
        if let Some(e) = self.length_error {
            return Err(e);
        }
        match self.content_length {
            Some(0) => Ok(Some(BodyFraming::None)),
            Some(n) => Ok(Some(BodyFraming::Length(n))),
            None => {
                *reusable = false;
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BodyFraming::*;

    fn parse(raw: &str, head: bool) -> Result<Option<(u16, BodyFraming, bool)>, HttpError> {
        let mut out = ResponseHead::default();
        parse_response(raw.as_bytes(), 4096, head, &mut out)
            .map(|done| done.then(|| (out.status, out.framing(), out.reusable)))
    }

    type Case = (
        &'static str,
        bool,
        Result<Option<(u16, BodyFraming, bool)>, HttpError>,
    );

    /// Wire table: raw response head, whether the request was HEAD → status, framing and
    /// reusability, or the refusal.
    const WIRE: &[Case] = &[
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
            false,
            Ok(Some((200, Length(3), true))),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n",
            false,
            Ok(Option::None),
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
            Ok(Some((200, Chunked, true))),
        ),
        (
            "HTTP/1.1 200 OK\r\n\r\n",
            false,
            Ok(Some((200, UntilClose, false))),
        ),
        (
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n",
            false,
            Ok(Some((200, Length(1), false))),
        ),
        (
            "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n",
            false,
            Ok(Some((200, Length(1), false))),
        ),
        (
            "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n",
            false,
            Ok(Some((200, Length(1), true))),
        ),
        (
            "HTTP/1.1 204 No Content\r\n\r\n",
            false,
            Ok(Some((204, None, true))),
        ),
        (
            "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
            false,
            Ok(Some((304, None, true))),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
            true,
            Ok(Some((200, None, true))),
        ),
        (
            "HTTP/1.1 100 Continue\r\n\r\n",
            false,
            Ok(Some((100, None, true))),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
            Ok(Some((200, Chunked, false))),
        ),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            false,
            Ok(Some((200, UntilClose, false))),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            false,
            Err(HttpError::ConflictingLength),
        ),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            false,
            Err(HttpError::InvalidLength),
        ),
        ("HTTP/2 200 OK\r\n\r\n", false, Err(HttpError::Version)),
        // Found by `fuzz/` (target `response_head`): relayed as `HTTP/1.1 22`, malformed.
        (
            "HTTP/1.1 022 X\r\n\r\n",
            false,
            Err(HttpError::Malformed("invalid status code")),
        ),
        (
            "HTTP/1.1 000\r\n\r\n",
            true,
            Err(HttpError::Malformed("invalid status code")),
        ),
        ("garbage\r\n\r\n", false, Err(HttpError::Version)),
    ];

    #[test]
    fn wire_table() {
        for (raw, head, want) in WIRE {
            assert_eq!(&parse(raw, *head), want, "{raw:?}");
        }
    }

    /// Found by `fuzz/` (target `response_head`): httparse's reason for a status line
    /// without one is a static "", not part of the buffer; its offset underflowed.
    #[test]
    fn status_line_without_reason() {
        for raw in [
            "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
            "HTTP/1.1 200\n\n",
        ] {
            // On the heap, as a connection's buffer is.
            let buf = raw.as_bytes().to_vec();
            let mut out = ResponseHead::default();
            assert_eq!(parse_response(&buf, 4096, false, &mut out), Ok(true));
            assert_eq!(out.status, 200);
            assert_eq!(out.reason.get(&buf), b"");
        }
    }

    #[test]
    fn event_stream_and_masks() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\
                   Transfer-Encoding: chunked\r\nX-Request-Id: up\r\nKeep-Alive: 5\r\nX-Kept: 1\r\n\r\n";
        let mut out = ResponseHead::default();
        assert_eq!(
            parse_response(raw.as_bytes(), 4096, false, &mut out),
            Ok(true)
        );
        assert!(out.event_stream);
        let names: Vec<_> = out
            .headers
            .forwarded()
            .map(|h| String::from_utf8_lossy(h.name.get(raw.as_bytes())).into_owned())
            .collect();
        assert_eq!(names, ["Content-Type", "X-Kept"]);
    }
}
