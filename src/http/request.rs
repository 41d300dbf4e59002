//! Request heads: httparse into a stack array, then offsets, framing and the forwarding mask.

use super::limits::{MAX_HEADERS, MAX_REQUEST_ID_LEN};
use super::target::parse_target;
use super::{
    BodyFraming, ConnectionOptions, HeaderList, HeaderSpan, HttpError, Method, Span, is_hop_by_hop,
    list_tokens, name_is, parse_content_length,
};

/// A parsed request head; all spans index the buffer it was parsed from.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: Method,
    pub method_span: Span,
    /// Origin-form target (`/v1/chat/completions?x=1`); absolute-form is reduced to it.
    /// Never holds a dot-segment (`.`, `..`, also percent-encoded): those are refused.
    pub target: Span,
    /// `host[:port]` of an absolute-form target: the upstream Host is taken from it, and
    /// the client's Host fields are not forwarded (RFC 9112 §3.2.2).
    pub authority: Option<Span>,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Bytes of the head including the blank line.
    pub head_len: usize,
    pub headers: HeaderList,
    pub body: BodyFraming,
    pub keep_alive: bool,
    pub expect_continue: bool,
    pub content_type: Option<Span>,
    /// A client `x-request-id` we can echo (printable ASCII, at most 128 bytes).
    pub request_id: Option<Span>,
    pub worker_id: Option<Span>,
    pub authorization: Option<Span>,
    /// The OpenAI SDKs' `x-stainless-timeout` (the client's budget, seconds).
    pub stainless_timeout: Option<Span>,
    /// Bit i set: field i is an `X-Forwarded-For` we extend.
    pub forwarded_for: u128,
    /// A Host field was present (an HTTP/1.0 request may lack one).
    pub has_host: bool,
}

impl Default for RequestHead {
    fn default() -> Self {
        Self {
            method: Method::Other,
            method_span: Span::default(),
            target: Span::default(),
            authority: None,
            minor_version: 1,
            head_len: 0,
            headers: HeaderList::default(),
            body: BodyFraming::None,
            keep_alive: true,
            expect_continue: false,
            content_type: None,
            request_id: None,
            worker_id: None,
            authorization: None,
            stainless_timeout: None,
            forwarded_for: 0,
            has_host: false,
        }
    }
}

impl RequestHead {
    /// The path without the query string.
    pub fn path<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        let t = self.target.get(buf);
        match memchr::memchr(b'?', t) {
            Some(q) => &t[..q],
            None => t,
        }
    }

    pub fn content_length(&self) -> u64 {
        match self.body {
            BodyFraming::Length(n) => n,
            _ => 0,
        }
    }
}

/// Parses a request head at the start of `buf` into `out`.
///
/// `Ok(false)`: incomplete, read more. `Ok(true)`: `out` holds the head. Errors mean the
/// request must be answered with `err.status()` and the connection closed.
pub fn parse_request(
    buf: &[u8],
    max_header_bytes: usize,
    max_body_bytes: u64,
    out: &mut RequestHead,
) -> Result<bool, HttpError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n > max_header_bytes => {
            return Err(HttpError::HeaderTooLarge);
        }
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= max_header_bytes => {
            return Err(HttpError::HeaderTooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(false),
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::HeaderTooLarge),
        Err(httparse::Error::Version) => return Err(version_error(buf)),
        Err(e) => return Err(classify(buf, e)),
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(HttpError::Malformed("incomplete request line"));
    };
    *out = RequestHead::default();
    out.head_len = head_len;
    out.minor_version = version;
    out.keep_alive = version == 1;
    out.method = Method::from_bytes(method.as_bytes());
    out.method_span = Span::of(buf, method.as_bytes());
    let target = parse_target(buf, target.as_bytes())?;
    (out.target, out.authority) = (target.origin, target.authority);

    let mut scan = FieldScan::default();
    for (i, h) in req.headers.iter().enumerate() {
        scan.field(buf, i, h.name.as_bytes(), h.value, out)?;
    }
    out.headers.len = req.headers.len();
    scan.options.mark(buf, &mut out.headers);
    out.body = scan.framing(version, max_body_bytes)?;
    out.has_host = scan.hosts > 0;
    if out.body == BodyFraming::None {
        out.expect_continue = false;
    }
    Ok(true)
}

/// What the fields of one request head say about its framing, collected field by field.
#[derive(Default)]
struct FieldScan<'a> {
    content_length: Option<u64>,
    options: ConnectionOptions<'a>,
    /// A Transfer-Encoding field was present (even an empty one).
    transfer_encoding: bool,
    chunked: bool,
    /// The last transfer coding listed is `chunked`.
    chunked_last: bool,
    /// A coding other than `chunked` was listed.
    unknown_coding: bool,
    hosts: u32,
}

impl<'a> FieldScan<'a> {
    /// Records field `i` in `out` (its spans, skip bit, the facts it carries).
    fn field(
        &mut self,
        buf: &[u8],
        i: usize,
        name: &[u8],
        value: &'a [u8],
        out: &mut RequestHead,
    ) -> Result<(), HttpError> {
        let span = HeaderSpan {
            name: Span::of(buf, name),
            value: Span::of(buf, value),
        };
        out.headers.fields[i] = span;
        let bit = 1u128 << i;
        if is_hop_by_hop(name) {
            out.headers.skip |= bit;
        }
        let http10 = out.minor_version == 0;
        if name_is(name, "content-length") {
            self.content_length = Some(parse_content_length(value, self.content_length)?);
            out.headers.skip |= bit;
        } else if name_is(name, "transfer-encoding") {
            self.transfer_encoding(value, http10)?;
        } else if name_is(name, "connection") {
            self.options.add(value)?;
            out.keep_alive = keep_alive_after(out.keep_alive, value, http10);
        } else if name_is(name, "host") {
            self.hosts += 1;
            if out.authority.is_some() {
                out.headers.skip |= bit;
            }
        } else if name_is(name, "expect") {
            out.headers.skip |= bit;
            out.expect_continue |=
                !http10 && value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        } else if name_is(name, "content-type") {
            out.content_type = Some(span.value);
        } else if name_is(name, "x-request-id") {
            out.headers.skip |= bit;
            if is_echoable_id(value) {
                out.request_id = Some(span.value);
            }
        } else if name_is(name, "x-forwarded-for") {
            out.headers.skip |= bit;
            out.forwarded_for |= bit;
        } else if name_is(name, "x-worker-id") {
            out.worker_id = Some(span.value);
        } else if name_is(name, "authorization") {
            out.authorization = Some(span.value);
        } else if name_is(name, "x-stainless-timeout") {
            out.stainless_timeout = Some(span.value);
        }
        Ok(())
    }

    fn transfer_encoding(&mut self, value: &[u8], http10: bool) -> Result<(), HttpError> {
        if http10 {
            return Err(HttpError::Malformed(
                "Transfer-Encoding in an HTTP/1.0 request",
            ));
        }
        self.transfer_encoding = true;
        for coding in list_tokens(value) {
            self.chunked_last = coding.eq_ignore_ascii_case(b"chunked");
            if !self.chunked_last {
                self.unknown_coding = true;
            } else if self.chunked {
                return Err(HttpError::InvalidChunk("chunked applied twice"));
            }
            self.chunked |= self.chunked_last;
        }
        Ok(())
    }

    /// The body's framing once every field is seen; refuses what is ambiguous.
    fn framing(&self, version: u8, max_body_bytes: u64) -> Result<BodyFraming, HttpError> {
        if self.hosts > 1 {
            return Err(HttpError::Malformed("more than one Host header"));
        }
        if self.hosts == 0 && version == 1 {
            return Err(HttpError::MissingHost);
        }
        if self.transfer_encoding {
            // RFC 9112 §6.3: with Transfer-Encoding the length is known only when chunked
            // comes last (else 400 and close); a coding we cannot undo before it is 501.
            if self.content_length.is_some() {
                return Err(HttpError::LengthAndChunked);
            }
            if !self.chunked_last {
                return Err(HttpError::Malformed(
                    "chunked is not the final transfer coding",
                ));
            }
            if self.unknown_coding {
                return Err(HttpError::UnsupportedTransferCoding);
            }
        }
        match (self.content_length, self.chunked) {
            (Some(_), true) => Err(HttpError::LengthAndChunked),
            (Some(n), false) if n > max_body_bytes => Err(HttpError::BodyTooLarge),
            (Some(0), false) | (None, false) => Ok(BodyFraming::None),
            (Some(n), false) => Ok(BodyFraming::Length(n)),
            (None, true) => Ok(BodyFraming::Chunked),
        }
    }
}

/// Keep-alive after one `Connection` value: `close` ends it; `keep-alive` opts an
/// HTTP/1.0 message in.
pub(crate) fn keep_alive_after(keep: bool, value: &[u8], http10: bool) -> bool {
    list_tokens(value).fold(keep, |keep, token| {
        if token.eq_ignore_ascii_case(b"close") {
            false
        } else if token.eq_ignore_ascii_case(b"keep-alive") && http10 {
            true
        } else {
            keep
        }
    })
}

/// httparse's version error: 505 only for a well-formed `HTTP/d.d` we do not speak; a
/// request line that is malformed elsewhere (a space in the target, `http/1.1`) is 400.
fn version_error(buf: &[u8]) -> HttpError {
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|&b| b == b' ');
    let well_formed = matches!(
        (parts.next(), parts.next(), parts.next(), parts.next()),
        (Some(_), Some(_), Some([b'H', b'T', b'T', b'P', b'/', major, b'.', minor]), None)
            if major.is_ascii_digit() && minor.is_ascii_digit()
    );
    if well_formed {
        HttpError::Version
    } else {
        HttpError::Malformed("invalid request line")
    }
}

fn classify(buf: &[u8], e: httparse::Error) -> HttpError {
    let folded = memchr::memmem::find(buf, b"\r\n ").is_some()
        || memchr::memmem::find(buf, b"\r\n\t").is_some();
    match e {
        httparse::Error::HeaderName | httparse::Error::Token | httparse::Error::HeaderValue
            if folded =>
        {
            HttpError::ObsFold
        }
        httparse::Error::HeaderName => HttpError::Malformed("invalid header name"),
        httparse::Error::HeaderValue => HttpError::Malformed("invalid header value"),
        httparse::Error::NewLine => HttpError::Malformed("invalid line ending"),
        httparse::Error::Token => HttpError::Malformed("invalid request line"),
        _ => HttpError::Malformed("invalid request"),
    }
}

fn is_echoable_id(v: &[u8]) -> bool {
    !v.is_empty() && v.len() <= MAX_REQUEST_ID_LEN && v.iter().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;
    use BodyFraming::{Chunked, Length};

    const MAX_BODY: u64 = 1024;

    fn parse(raw: &str) -> Result<Option<RequestHead>, HttpError> {
        let mut head = RequestHead::default();
        parse_request(raw.as_bytes(), 4096, MAX_BODY, &mut head).map(|done| done.then_some(head))
    }

    fn forwarded(raw: &str) -> Vec<String> {
        let head = parse(raw).unwrap().unwrap();
        head.headers
            .forwarded()
            .map(|h| String::from_utf8_lossy(h.name.get(raw.as_bytes())).to_lowercase())
            .collect()
    }

    type Want = Result<Option<(BodyFraming, bool)>, HttpError>;

    const NOT_FINAL: HttpError = HttpError::Malformed("chunked is not the final transfer coding");
    const DOT: HttpError = HttpError::Malformed("request path contains a dot-segment");
    const USERINFO: HttpError = HttpError::Malformed("userinfo in the request target");

    /// Wire table: raw request → framing and keep-alive, or the refusal.
    const WIRE: &[(&str, Want)] = &[
        (
            "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
            Ok(Some((BodyFraming::None, true))),
        ),
        ("GET / HTTP/1.1\r\nHost: a\r\n", Ok(Option::None)),
        (
            "GET / HTTP/1.0\r\n\r\n",
            Ok(Some((BodyFraming::None, false))),
        ),
        (
            "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            Ok(Some((BodyFraming::None, true))),
        ),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            Ok(Some((BodyFraming::None, false))),
        ),
        (
            "POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n",
            Ok(Some((Length(5), true))),
        ),
        (
            "POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
            Ok(Some((BodyFraming::None, true))),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            Ok(Some((Length(5), true))),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            Ok(Some((Chunked, true))),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n",
            Ok(Some((Chunked, true))),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            Err(HttpError::ConflictingLength),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            Err(HttpError::LengthAndChunked),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            Err(HttpError::UnsupportedTransferCoding),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
            Err(NOT_FINAL),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
            Err(NOT_FINAL),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n",
            Err(NOT_FINAL),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n",
            Err(NOT_FINAL),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ,\r\nContent-Length: 5\r\n\r\n",
            Err(HttpError::LengthAndChunked),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding:\r\n\r\n",
            Ok(Some((Chunked, true))),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked\r\n\r\n",
            Ok(Some((Chunked, true))),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            Err(HttpError::InvalidChunk("chunked applied twice")),
        ),
        (
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            Err(HttpError::Malformed(
                "Transfer-Encoding in an HTTP/1.0 request",
            )),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2048\r\n\r\n",
            Err(HttpError::BodyTooLarge),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n",
            Err(HttpError::InvalidLength),
        ),
        (
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
            Err(HttpError::InvalidLength),
        ),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
            Err(HttpError::ObsFold),
        ),
        ("GET / HTTP/1.1\r\n\r\n", Err(HttpError::MissingHost)),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            Err(HttpError::Malformed("more than one Host header")),
        ),
        ("GET / HTTP/2.0\r\nHost: a\r\n\r\n", Err(HttpError::Version)),
        ("GET / HTTP/1.2\r\nHost: a\r\n\r\n", Err(HttpError::Version)),
        ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Err(HttpError::Version)),
        (
            "GET / http/1.1\r\nHost: a\r\n\r\n",
            Err(HttpError::Malformed("invalid request line")),
        ),
        (
            "GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
            Err(HttpError::Malformed("invalid request line")),
        ),
        (
            "GET / HTTP/1.10\r\nHost: a\r\n\r\n",
            Err(HttpError::Malformed("invalid line ending")),
        ),
        (
            "GET  HTTP/1.1\r\nHost: a\r\n\r\n",
            Err(HttpError::Malformed("invalid request line")),
        ),
        (
            "G@T / HTTP/1.1\r\nHost: a\r\n\r\n",
            Err(HttpError::Malformed("invalid request line")),
        ),
        (
            "GET / HTTP/1.1\r\nHo st: a\r\n\r\n",
            Err(HttpError::Malformed("invalid header name")),
        ),
        (
            "GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n",
            Err(HttpError::Malformed("invalid header value")),
        ),
        (
            "GET foo HTTP/1.1\r\nHost: a\r\n\r\n",
            Err(HttpError::Malformed("request target must be a path")),
        ),
        ("POST /v1/../reset HTTP/1.1\r\nHost: a\r\n\r\n", Err(DOT)),
        ("POST /v1/%2e%2E/x HTTP/1.1\r\nHost: a\r\n\r\n", Err(DOT)),
        ("GET http://u@h/ HTTP/1.1\r\nHost: a\r\n\r\n", Err(USERINFO)),
        (
            "GET http://h/ HTTP/1.0\r\n\r\n",
            Ok(Some((BodyFraming::None, false))),
        ),
    ];

    #[test]
    fn wire_table() {
        for (raw, want) in WIRE {
            let got = parse(raw).map(|o| o.map(|h| (h.body, h.keep_alive)));
            assert_eq!(&got, want, "{raw:?}");
        }
    }

    #[test]
    fn header_section_limit() {
        let mut head = RequestHead::default();
        let big = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n", "a".repeat(5000));
        assert_eq!(
            parse_request(big.as_bytes(), 4096, MAX_BODY, &mut head),
            Err(HttpError::HeaderTooLarge)
        );
        let many: String = (0..200).map(|i| format!("X-{i}: v\r\n")).collect();
        let raw = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
        assert_eq!(
            parse_request(raw.as_bytes(), 1 << 20, MAX_BODY, &mut head),
            Err(HttpError::HeaderTooLarge)
        );
    }

    #[test]
    fn hop_by_hop_and_connection_named_are_not_forwarded() {
        let raw = "POST /v1/chat HTTP/1.1\r\nHost: h\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\n\
                   Keep-Alive: 5\r\nTE: trailers\r\nUpgrade: h2c\r\nProxy-Authorization: x\r\n\
                   Content-Length: 2\r\nExpect: 100-continue\r\nX-Request-Id: abc\r\n\
                   X-Forwarded-For: 1.2.3.4\r\nContent-Type: application/json\r\nX-Keep: y\r\n\r\n";
        assert_eq!(forwarded(raw), ["host", "content-type", "x-keep"]);
        let head = parse(raw).unwrap().unwrap();
        assert!(head.expect_continue);
        assert!(!head.keep_alive);
        assert_eq!(head.request_id.unwrap().get(raw.as_bytes()), b"abc");
        assert_eq!(head.forwarded_for.count_ones(), 1);
    }

    /// Found by `fuzz/` (target `codec`): `Connection: host` made Spillway forward an
    /// HTTP/1.1 request without Host.
    #[test]
    fn a_connection_option_naming_host_keeps_host() {
        let raw = "POST /v HTTP/1.1\r\nHost: r\r\nConnection: host, x-a\r\nX-A: 1\r\n\r\n";
        assert_eq!(forwarded(raw), ["host"]);
    }

    #[test]
    fn connection_options_are_bounded() {
        let sixteen: Vec<String> = (0..16).map(|i| format!("x-{i}")).collect();
        let raw = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, {}\r\nX-3: v\r\nX-Kept: v\r\n\r\n",
            sixteen.join(",")
        );
        assert_eq!(forwarded(&raw), ["host", "x-kept"]);
        let raw = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: {},x-16\r\n\r\n",
            sixteen.join(",")
        );
        assert_eq!(
            parse(&raw).err(),
            Some(HttpError::Malformed("too many Connection options"))
        );
    }

    #[test]
    fn absolute_form_and_path() {
        let raw = "POST http://example.com/v1/completions?x=1 HTTP/1.1\r\nHost: e\r\n\r\n";
        let head = parse(raw).unwrap().unwrap();
        assert_eq!(head.target.get(raw.as_bytes()), b"/v1/completions?x=1");
        assert_eq!(head.path(raw.as_bytes()), b"/v1/completions");
        assert_eq!(head.authority.unwrap().get(raw.as_bytes()), b"example.com");
        assert!(head.has_host);
        assert!(forwarded(raw).is_empty(), "Host comes from the target");
        let raw = "POST /v1/completions HTTP/1.1\r\nHost: e\r\n\r\n";
        assert_eq!(parse(raw).unwrap().unwrap().authority, None);
        assert_eq!(forwarded(raw), ["host"]);
    }

    #[test]
    fn unusable_request_id_is_replaced() {
        let long = "a".repeat(MAX_REQUEST_ID_LEN + 1);
        for bad in ["", "has space", long.as_str()] {
            let raw = format!("GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: {bad}\r\n\r\n");
            assert!(
                parse(&raw).unwrap().unwrap().request_id.is_none(),
                "{bad:?}"
            );
        }
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic and never produce spans outside the buffer.
        #[test]
        fn never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut head = RequestHead::default();
            if let Ok(true) = parse_request(&data, 4096, MAX_BODY, &mut head) {
                proptest::prop_assert!(head.head_len <= data.len());
                for h in head.headers.iter() {
                    proptest::prop_assert!(h.value.end as usize <= data.len());
                }
            }
        }
    }
}
