//! The HTTP/1.1 the mock speaks: request heads read with `httparse` under the framing rules
//! a server must enforce (one Host, strict Content-Length, no chunked request bodies), and
//! response heads and chunks. No I/O here.

/// Most header fields accepted in one request head; more → 431.
pub const MAX_HEADERS: usize = 96;

/// Read buffer a connection starts with; grows only for large heads or bodies.
pub const INITIAL_READ_BUF: usize = 16 * 1024;

/// Most options (field names other than `close` and `keep-alive`) accepted in the
/// `Connection` fields of one head; more is refused as malformed.
const MAX_CONNECTION_OPTIONS: usize = 16;

/// The request methods the mock tells apart; everything else is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Other,
}

impl Method {
    fn from_name(m: &str) -> Method {
        match m {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            _ => Method::Other,
        }
    }
}

/// What the mock needs from a request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: Method,
    /// The path without the query string; an absolute-form target is reduced to it.
    pub path: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// Bytes of the head including the blank line.
    pub head_len: usize,
    /// Content-Length; 0 when absent.
    pub content_length: u64,
    pub keep_alive: bool,
    /// `Expect: 100-continue` on an HTTP/1.1 request with a body.
    pub expect_continue: bool,
}

/// Why a request head is refused. The request is answered with [`HttpError::status`] and
/// the connection closed, since its framing is in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    #[error("obsolete line folding is not accepted")]
    ObsFold,
    #[error("request header section too large")]
    HeaderTooLarge,
    #[error("request body too large")]
    BodyTooLarge,
    #[error("both Content-Length and Transfer-Encoding present")]
    LengthAndChunked,
    #[error("conflicting Content-Length values")]
    ConflictingLength,
    #[error("invalid Content-Length")]
    InvalidLength,
    #[error("invalid chunked encoding: {0}")]
    InvalidChunk(&'static str),
    #[error("unsupported transfer coding")]
    UnsupportedTransferCoding,
    #[error("unsupported HTTP version")]
    Version,
    #[error("missing Host header")]
    MissingHost,
}

impl HttpError {
    pub fn status(&self) -> u16 {
        match self {
            HttpError::HeaderTooLarge => 431,
            HttpError::BodyTooLarge => 413,
            HttpError::UnsupportedTransferCoding => 501,
            HttpError::Version => 505,
            _ => 400,
        }
    }
}

/// Parses the request head at the start of `buf`. `Ok(None)`: incomplete, read more.
pub fn parse_request(
    buf: &[u8],
    max_head_bytes: usize,
    max_body_bytes: u64,
) -> Result<Option<RequestHead>, HttpError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= max_head_bytes => {
            return Err(HttpError::HeaderTooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::HeaderTooLarge),
        Err(httparse::Error::Version) => return Err(HttpError::Version),
        Err(e) => return Err(classify(buf, e)),
    };
    if head_len > max_head_bytes {
        return Err(HttpError::HeaderTooLarge);
    }
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(HttpError::Malformed("incomplete request line"));
    };
    let mut head = RequestHead {
        method: Method::from_name(method),
        path: path_of(target)?.to_string(),
        minor_version: version,
        head_len,
        content_length: 0,
        keep_alive: version == 1,
        expect_continue: false,
    };
    read_fields(req.headers, &mut head)?;
    if head.content_length > max_body_bytes {
        return Err(HttpError::BodyTooLarge);
    }
    if head.content_length == 0 {
        head.expect_continue = false;
    }
    Ok(Some(head))
}

/// Applies the header fields to `head`. A chunked body is refused: the mock reads only
/// Content-Length bodies.
fn read_fields(fields: &[httparse::Header<'_>], head: &mut RequestHead) -> Result<(), HttpError> {
    let version = head.minor_version;
    let mut content_length: Option<u64> = None;
    let (mut chunked, mut hosts, mut options) = (false, 0u32, 0usize);
    for h in fields {
        let (name, value) = (h.name, h.value);
        if name.eq_ignore_ascii_case("content-length") {
            content_length = Some(parse_content_length(value, content_length)?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            if version == 0 {
                return Err(HttpError::Malformed(
                    "Transfer-Encoding in an HTTP/1.0 request",
                ));
            }
            for coding in list_tokens(value) {
                if !coding.eq_ignore_ascii_case(b"chunked") {
                    return Err(HttpError::UnsupportedTransferCoding);
                }
                if chunked {
                    return Err(HttpError::InvalidChunk("chunked applied twice"));
                }
                chunked = true;
            }
        } else if name.eq_ignore_ascii_case("connection") {
            for token in list_tokens(value) {
                if token.eq_ignore_ascii_case(b"close") {
                    head.keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    head.keep_alive |= version == 0;
                } else if options == MAX_CONNECTION_OPTIONS {
                    return Err(HttpError::Malformed("too many Connection options"));
                } else {
                    options += 1;
                }
            }
        } else if name.eq_ignore_ascii_case("host") {
            hosts += 1;
        } else if name.eq_ignore_ascii_case("expect") {
            head.expect_continue |=
                version == 1 && value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        }
    }
    if hosts > 1 {
        return Err(HttpError::Malformed("more than one Host header"));
    }
    if hosts == 0 && version == 1 {
        return Err(HttpError::MissingHost);
    }
    match (content_length, chunked) {
        (Some(_), true) => Err(HttpError::LengthAndChunked),
        (None, true) => Err(HttpError::Malformed(
            "chunked request bodies are not supported; send Content-Length",
        )),
        (n, false) => {
            head.content_length = n.unwrap_or(0);
            Ok(())
        }
    }
}

fn classify(buf: &[u8], e: httparse::Error) -> HttpError {
    let folded = buf.windows(3).any(|w| w == b"\r\n " || w == b"\r\n\t");
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

/// The path of an origin-form or absolute-form (`http://host/path`) target, without its
/// query string; other forms are refused.
fn path_of(target: &str) -> Result<&str, HttpError> {
    let origin = if target.starts_with('/') {
        target
    } else {
        let lower = |p: &str| {
            target
                .get(..p.len())
                .is_some_and(|t| t.eq_ignore_ascii_case(p))
        };
        let rest = if lower("http://") {
            &target[7..]
        } else if lower("https://") {
            &target[8..]
        } else {
            return Err(HttpError::Malformed("request target must be a path"));
        };
        match rest.find('/') {
            Some(p) => &rest[p..],
            None => {
                return Err(HttpError::Malformed(
                    "absolute request target without a path",
                ));
            }
        }
    };
    Ok(origin.split_once('?').map_or(origin, |(path, _)| path))
}

/// The comma-separated tokens of a list-valued header, trimmed of spaces and tabs.
fn list_tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(|t| t.trim_ascii())
        .filter(|t| !t.is_empty())
}

/// Strict Content-Length: one or more comma-separated copies of the same decimal number.
fn parse_content_length(value: &[u8], seen: Option<u64>) -> Result<u64, HttpError> {
    let mut out = seen;
    for token in value.split(|&b| b == b',') {
        let token = token.trim_ascii();
        if token.is_empty() || token.len() > 19 || !token.iter().all(u8::is_ascii_digit) {
            return Err(HttpError::InvalidLength);
        }
        let n = token
            .iter()
            .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0'));
        match out {
            Some(prev) if prev != n => return Err(HttpError::ConflictingLength),
            _ => out = Some(n),
        }
    }
    out.ok_or(HttpError::InvalidLength)
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

/// A response head. `length`: Content-Length, else chunked (or close-delimited when the
/// client cannot take chunks). `extra`: more header lines, each ending in CRLF.
pub fn response_head(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    length: Option<usize>,
    chunked: bool,
    keep_alive: bool,
    extra: &[u8],
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
    out.push(b' ');
    out.extend_from_slice(canonical_reason(status).as_bytes());
    out.extend_from_slice(b"\r\ncontent-type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\n");
    match length {
        Some(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        None if chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        None => {}
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(extra);
    out.extend_from_slice(b"\r\n");
}

/// Appends `data` as one chunk of a chunked body.
pub fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The end of a chunked body (no trailers).
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_BODY: u64 = 1024;

    fn parse(raw: &str) -> Result<Option<RequestHead>, HttpError> {
        parse_request(raw.as_bytes(), 4096, MAX_BODY)
    }

    /// Wire table: raw request → (Content-Length, keep-alive) or the refusal.
    #[test]
    fn wire_table() {
        type Want = Result<Option<(u64, bool)>, HttpError>;
        let cases: &[(&str, Want)] = &[
            ("GET / HTTP/1.1\r\nHost: a\r\n\r\n", Ok(Some((0, true)))),
            ("GET / HTTP/1.1\r\nHost: a\r\n", Ok(None)),
            ("GET / HTTP/1.0\r\n\r\n", Ok(Some((0, false)))),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                Ok(Some((0, false))),
            ),
            (
                "POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n",
                Ok(Some((5, true))),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                Err(HttpError::ConflictingLength),
            ),
            (
                "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                Err(HttpError::Malformed(
                    "chunked request bodies are not supported; send Content-Length",
                )),
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
            (
                "G@T / HTTP/1.1\r\nHost: a\r\n\r\n",
                Err(HttpError::Malformed("invalid request line")),
            ),
            (
                "GET / HTTP/1.1\r\nHo st: a\r\n\r\n",
                Err(HttpError::Malformed("invalid header name")),
            ),
            (
                "GET foo HTTP/1.1\r\nHost: a\r\n\r\n",
                Err(HttpError::Malformed("request target must be a path")),
            ),
        ];
        for (raw, want) in cases {
            let got = parse(raw).map(|o| o.map(|h| (h.content_length, h.keep_alive)));
            assert_eq!(&got, want, "{raw:?}");
        }
    }

    #[test]
    fn limits_expect_and_paths() {
        let big = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n", "a".repeat(5000));
        assert_eq!(parse(&big), Err(HttpError::HeaderTooLarge));
        let many: String = (0..200).map(|i| format!("X-{i}: v\r\n")).collect();
        let raw = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
        assert_eq!(
            parse_request(raw.as_bytes(), 1 << 20, MAX_BODY),
            Err(HttpError::HeaderTooLarge)
        );
        let options: Vec<String> = (0..17).map(|i| format!("x-{i}")).collect();
        let raw = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: {}\r\n\r\n",
            options.join(",")
        );
        assert_eq!(
            parse(&raw),
            Err(HttpError::Malformed("too many Connection options"))
        );
        let raw = "POST http://e/v1/completions?x=1 HTTP/1.1\r\nHost: e\r\n\
                   Expect: 100-continue\r\nContent-Length: 2\r\n\r\n";
        let head = parse(raw).unwrap().unwrap();
        assert_eq!(head.path, "/v1/completions");
        assert_eq!(head.method, Method::Post);
        assert!(head.expect_continue);
        assert_eq!(head.head_len, raw.len());
        let raw = "POST / HTTP/1.1\r\nHost: e\r\nExpect: 100-continue\r\n\r\n";
        assert!(!parse(raw).unwrap().unwrap().expect_continue, "no body");
    }

    #[test]
    fn response_framing() {
        let mut out = Vec::new();
        response_head(&mut out, 200, "text/event-stream", None, true, false, b"");
        assert_eq!(
            out,
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
              transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        out.clear();
        response_head(
            &mut out,
            404,
            "application/json",
            Some(12),
            true,
            true,
            b"x-a: b\r\n",
        );
        assert_eq!(
            out,
            b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 12\r\nx-a: b\r\n\r\n"
        );
        out.clear();
        chunk(&mut out, &[b'x'; 26]);
        assert!(out.starts_with(b"1a\r\nxx"));
        assert!(out.ends_with(b"x\r\n"));
        assert_eq!(canonical_reason(529), "Site is overloaded");
    }
}
