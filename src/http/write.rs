//! Head rewriting: what goes upstream and what goes back to the client. Appends to a
//! reused buffer; allocates only if that buffer must grow.

use std::ops::Range;

use super::request::RequestHead;
use super::response::ResponseHead;
use super::{BodyFraming, HeaderSpan};

fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn forwarded_fields<'a>(
    out: &mut Vec<u8>,
    buf: &[u8],
    fields: impl Iterator<Item = &'a HeaderSpan>,
) {
    for h in fields {
        header(out, h.name.get(buf), h.value.get(buf));
    }
}

pub fn status_line(out: &mut Vec<u8>, status: u16, reason: &[u8]) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason);
    out.extend_from_slice(b"\r\n");
}

/// The registered reason phrase, with 529 named as the de-facto "Site is overloaded".
pub fn canonical_reason(status: u16) -> &'static str {
    match status {
        529 => "Site is overloaded",
        _ => http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Unknown"),
    }
}

/// Ends a head: `x-request-id`, `connection: close` when the connection will close, blank line.
pub fn finish_head(out: &mut Vec<u8>, request_id: &[u8], keep_alive: bool) {
    header(out, b"x-request-id", request_id);
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The request head sent upstream: same method and target (origin-form), HTTP/1.1,
/// forwarded fields, a de-chunked `content-length`, the extended `x-forwarded-for` and
/// the request id. An absolute-form target's authority becomes the Host, in place of the
/// client's (RFC 9112 §3.2.2; the parser marks those fields not to forward). An HTTP/1.0
/// request without Host gets an empty one (RFC 9112 §3.2: HTTP/1.1 requires the field,
/// empty when the target has no authority). Returns where the `content-length` value's
/// digits are in `out`, when it has one ([`set_content_length`] rewrites it).
pub fn upstream_request_head(
    out: &mut Vec<u8>,
    buf: &[u8],
    head: &RequestHead,
    body_len: usize,
    client_ip: &[u8],
    request_id: &[u8],
) -> Option<Range<usize>> {
    out.extend_from_slice(head.method_span.get(buf));
    out.push(b' ');
    out.extend_from_slice(head.target.get(buf));
    out.extend_from_slice(b" HTTP/1.1\r\n");
    match head.authority {
        Some(authority) => header(out, b"host", authority.get(buf)),
        None if !head.has_host => out.extend_from_slice(b"host: \r\n"),
        None => {}
    }
    forwarded_fields(out, buf, head.headers.forwarded());
    let mut length_at = None;
    if body_len > 0 || head.body != BodyFraming::None {
        out.extend_from_slice(b"content-length: ");
        let at = out.len();
        out.extend_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
        length_at = Some(at..out.len());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    for (i, h) in head.headers.iter().enumerate() {
        if head.forwarded_for & (1u128 << i) != 0 {
            out.extend_from_slice(h.value.get(buf));
            out.extend_from_slice(b", ");
        }
    }
    out.extend_from_slice(client_ip);
    out.extend_from_slice(b"\r\n");
    header(out, b"x-request-id", request_id);
    out.extend_from_slice(b"\r\n");
    length_at
}

/// Writes `len` over the `content-length` digits at `at` in `out` (a head, perhaps with
/// its body after it), moving what follows; returns the digits' new place. No allocation
/// while `out` has the room.
pub fn set_content_length(out: &mut Vec<u8>, at: Range<usize>, len: usize) -> Range<usize> {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(len).as_bytes();
    let start = at.start;
    out.splice(at, digits.iter().copied());
    start..start + digits.len()
}

/// How the client sees the response body (RFC 9112 §6.3): an HTTP/1.1 client gets the
/// upstream's length or chunks as they are, and a close-delimited body re-chunked; an
/// HTTP/1.0 client, which cannot read chunks, gets the length or a body delimited by the
/// close, de-chunked when the upstream chunked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFraming {
    None,
    Length(u64),
    /// Upstream chunks passed through as they are.
    Chunked,
    /// A close-delimited upstream body re-chunked for an HTTP/1.1 client.
    Rechunk,
    /// A chunked upstream body de-chunked for an HTTP/1.0 client; we close after it.
    Dechunk,
    /// A close-delimited body passed to an HTTP/1.0 client; we close after it.
    UntilClose,
}

impl ClientFraming {
    pub fn for_response(upstream: BodyFraming, client_minor: u8) -> ClientFraming {
        let http10 = client_minor == 0;
        match upstream {
            BodyFraming::None => ClientFraming::None,
            BodyFraming::Length(n) => ClientFraming::Length(n),
            BodyFraming::Chunked if http10 => ClientFraming::Dechunk,
            BodyFraming::Chunked => ClientFraming::Chunked,
            BodyFraming::UntilClose if http10 => ClientFraming::UntilClose,
            BodyFraming::UntilClose => ClientFraming::Rechunk,
        }
    }

    /// The client can tell where the body ends without the connection closing.
    pub fn allows_keep_alive(&self) -> bool {
        !matches!(self, ClientFraming::UntilClose | ClientFraming::Dechunk)
    }
}

/// The response head sent to the client.
pub fn client_response_head(
    out: &mut Vec<u8>,
    buf: &[u8],
    resp: &ResponseHead,
    framing: ClientFraming,
    request_id: &[u8],
    keep_alive: bool,
    client_minor: u8,
) {
    let reason = resp.reason.get(buf);
    let reason = if reason.is_empty() {
        canonical_reason(resp.status).as_bytes()
    } else {
        reason
    };
    status_line(out, resp.status, reason);
    forwarded_fields(out, buf, resp.headers.forwarded());
    match framing {
        ClientFraming::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        ClientFraming::None if !(resp.status < 200 || resp.status == 204 || resp.status == 304) => {
            out.extend_from_slice(b"content-length: 0\r\n");
        }
        ClientFraming::Chunked | ClientFraming::Rechunk => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        ClientFraming::None | ClientFraming::UntilClose | ClientFraming::Dechunk => {}
    }
    if keep_alive && client_minor == 0 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    finish_head(out, request_id, keep_alive);
}

/// Wraps `data` as one chunk (for [`ClientFraming::Rechunk`]).
pub fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    chunk_of(out, &[data]);
}

/// Wraps `parts`, one after the other, as one chunk.
pub fn chunk_of(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let mut hex = [0u8; 16];
    let mut n: usize = parts.iter().map(|p| p.len()).sum();
    let mut i = hex.len();
    loop {
        i -= 1;
        hex[i] = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&hex[i..]);
    out.extend_from_slice(b"\r\n");
    for p in parts {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(b"\r\n");
}

pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::request::parse_request;
    use crate::http::response::parse_response;

    #[test]
    fn upstream_head_rewrite() {
        let raw =
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\
                    Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nX-Forwarded-For: 9.9.9.9\r\n\
                    Content-Type: application/json\r\n\r\n";
        let mut head = RequestHead::default();
        assert_eq!(parse_request(raw, 4096, 1 << 20, &mut head), Ok(true));
        let mut out = Vec::new();
        let at = upstream_request_head(&mut out, raw, &head, 17, b"10.0.0.1", b"rid").unwrap();
        assert_eq!(&out[at.clone()], b"17");
        // A stage's body in place of the client's: the length follows, digits and all.
        let mut staged = out.clone();
        staged.extend_from_slice(b"{}");
        let at2 = set_content_length(&mut staged, at.clone(), 2);
        assert_eq!(&staged[at2.clone()], b"2");
        assert!(staged.ends_with(b"content-length: 2\r\nx-forwarded-for: 9.9.9.9, 10.0.0.1\r\nx-request-id: rid\r\n\r\n{}"));
        let at3 = set_content_length(&mut staged, at2, 12_345);
        assert_eq!(&staged[at3], b"12345");
        assert_eq!(staged.len(), out.len() + 3 + 2);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n\
             content-length: 17\r\nx-forwarded-for: 9.9.9.9, 10.0.0.1\r\nx-request-id: rid\r\n\r\n"
        );
        let raw = b"POST /v1/completions HTTP/1.0\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(parse_request(raw, 4096, 1 << 20, &mut head), Ok(true));
        let mut out = Vec::new();
        upstream_request_head(&mut out, raw, &head, 2, b"10.0.0.1", b"rid");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /v1/completions HTTP/1.1\r\nhost: \r\ncontent-length: 2\r\n\
             x-forwarded-for: 10.0.0.1\r\nx-request-id: rid\r\n\r\n"
        );
    }

    /// Wire table: request head in, head sent upstream out (body length 0).
    const UPSTREAM_HEADS: &[(&str, &str)] = &[
        (
            "POST http://other:9/v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\n",
            "POST /v1/chat/completions HTTP/1.1\r\nhost: other:9\r\nX-A: 1\r\n",
        ),
        (
            "GET HTTPS://[::1]:8443/v1/models?a=b HTTP/1.1\r\nX-A: 1\r\nhOsT: x\r\n\r\n",
            "GET /v1/models?a=b HTTP/1.1\r\nhost: [::1]:8443\r\nX-A: 1\r\n",
        ),
        (
            "POST http://other/v1/completions HTTP/1.0\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\nhost: other\r\n",
        ),
        (
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
        ),
    ];

    #[test]
    fn upstream_host_from_the_target() {
        for (raw, want) in UPSTREAM_HEADS {
            let mut head = RequestHead::default();
            let done = parse_request(raw.as_bytes(), 4096, 1 << 20, &mut head);
            assert_eq!(done, Ok(true), "{raw:?}");
            let mut out = Vec::new();
            upstream_request_head(&mut out, raw.as_bytes(), &head, 0, b"10.0.0.1", b"rid");
            let tail = "x-forwarded-for: 10.0.0.1\r\nx-request-id: rid\r\n\r\n";
            assert_eq!(String::from_utf8(out).unwrap(), format!("{want}{tail}"));
        }
    }

    #[test]
    fn client_head_rewrite() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\
                    X-Request-Id: theirs\r\n\r\n";
        let mut resp = ResponseHead::default();
        assert_eq!(parse_response(raw, 4096, false, &mut resp), Ok(true));
        let framing = ClientFraming::for_response(resp.framing(), 1);
        assert_eq!(framing, ClientFraming::Rechunk);
        let mut out = Vec::new();
        client_response_head(&mut out, raw, &resp, framing, b"ours", true, 1);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\ntransfer-encoding: chunked\r\n\
             x-request-id: ours\r\n\r\n"
        );
    }

    #[test]
    fn chunk_framing() {
        let mut out = Vec::new();
        chunk(&mut out, &[b'x'; 26]);
        assert!(out.starts_with(b"1a\r\n"));
        assert!(out.ends_with(b"x\r\n"));
        let mut out = Vec::new();
        chunk(&mut out, b"");
        assert_eq!(out, b"0\r\n\r\n");
    }
}
