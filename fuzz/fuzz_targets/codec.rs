//! A client connection through the sans-io codec, as the data path drives it without the
//! I/O: bytes arrive cut at arbitrary points; the head is parsed each time more arrive
//! (`proxy/head.rs`); its body is read whole, waiting for a Content-Length body and
//! de-chunking a chunked one in place (`proxy/body.rs`); the model is found in it
//! (`route::peek`); the upstream head is written (`http::write`); the request's bytes are
//! consumed and the next pipelined request begins, until one does not keep the connection
//! alive. Checked: every request comes out the same whatever the cuts (as when the whole
//! stream arrives at once), offsets stay inside the buffer, a body stays within its bound,
//! and the head sent upstream is itself a well-formed head that frames the decoded body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway::http::chunked::Dechunker;
use spillway::http::request::{RequestHead, parse_request};
use spillway::http::write::upstream_request_head;
use spillway::http::{BodyFraming, HttpError, Limits};
use spillway::route::peek::peek;
use spillway_fuzz::{Feed, Pieces, check_request_head, control};

/// How one request came out: its head's framing, body and model, or how it failed.
#[derive(Debug, PartialEq)]
enum Outcome {
    Request {
        head_len: usize,
        framing: BodyFraming,
        body: Vec<u8>,
        request_end: usize,
        model: Option<Vec<u8>>,
        keep_alive: bool,
    },
    /// Refused (the connection is answered and closed).
    Refused,
    /// The client closed before the request was whole.
    Closed,
}

struct Conn<'a> {
    feed: Feed<'a>,
    buf: Vec<u8>,
    max_header: usize,
    max_body: usize,
}

impl Conn<'_> {
    /// `read_head`: parse whatever is buffered, read more while incomplete.
    fn read_head(&mut self, head: &mut RequestHead) -> Result<bool, HttpError> {
        loop {
            if !self.buf.is_empty() {
                let max_body = self.max_body as u64;
                if parse_request(&self.buf, self.max_header, max_body, head)? {
                    check_request_head(&self.buf, head, self.max_header, max_body);
                    return Ok(true);
                }
            }
            if !self.feed.read_into(&mut self.buf) {
                return Ok(false);
            }
        }
    }

    /// `read_body`: the de-chunked body's range and where the request's bytes end.
    fn read_body(&mut self, head: &RequestHead) -> Result<Option<(usize, usize)>, HttpError> {
        let head_len = head.head_len;
        match head.body {
            BodyFraming::Length(n) => {
                let total = head_len + n as usize;
                while self.buf.len() < total {
                    if !self.feed.read_into(&mut self.buf) {
                        return Ok(None);
                    }
                }
                Ok(Some((total, total)))
            }
            BodyFraming::Chunked => {
                let mut d = Dechunker::new(head_len);
                loop {
                    let filled = self.buf.len();
                    if d.decode(&mut self.buf, filled, head_len + self.max_body)? {
                        assert!(head_len <= d.out && d.out <= d.raw && d.raw <= filled);
                        return Ok(Some((d.out, d.raw)));
                    }
                    if !self.feed.read_into(&mut self.buf) {
                        return Ok(None);
                    }
                }
            }
            BodyFraming::None | BodyFraming::UntilClose => Ok(Some((head_len, head_len))),
        }
    }

    fn request(&mut self) -> Outcome {
        let mut head = RequestHead::default();
        match self.read_head(&mut head) {
            Ok(true) => {}
            Ok(false) => return Outcome::Closed,
            Err(_) => return Outcome::Refused,
        }
        let (body_end, request_end) = match self.read_body(&head) {
            Ok(Some(ends)) => ends,
            Ok(None) => return Outcome::Closed,
            Err(_) => return Outcome::Refused,
        };
        let body = &self.buf[head.head_len..body_end];
        assert!(body.len() <= self.max_body);
        let model = peek(body).ok().and_then(|p| p.model).map(|m| {
            let mut scratch = Vec::new();
            m.decoded(&mut scratch)
                .map(<[u8]>::to_vec)
                .unwrap_or_default()
        });
        upstream(&self.buf, &head, body.len());
        let out = Outcome::Request {
            head_len: head.head_len,
            framing: head.body,
            body: body.to_vec(),
            request_end,
            model,
            keep_alive: head.keep_alive,
        };
        self.buf.drain(..request_end);
        out
    }
}

/// The head sent upstream parses back as HTTP/1.1 (with a Host, empty for an HTTP/1.0
/// client that sent none) framing the decoded body by length.
fn upstream(buf: &[u8], head: &RequestHead, body_len: usize) {
    let mut out = Vec::new();
    upstream_request_head(&mut out, buf, head, body_len, b"192.0.2.1", b"rid-1");
    let mut up = RequestHead::default();
    let parsed = parse_request(&out, usize::MAX, u64::MAX, &mut up);
    assert_eq!(parsed, Ok(true), "{:?}", String::from_utf8_lossy(&out));
    assert_eq!(up.head_len, out.len());
    assert_eq!(up.minor_version, 1);
    assert_eq!(up.method, head.method);
    assert_eq!(up.target.get(&out), head.target.get(buf));
    let want = match body_len {
        0 => BodyFraming::None,
        n => BodyFraming::Length(n as u64),
    };
    assert_eq!(up.body, want);
}

/// The outcomes of a connection's requests, up to the first that ends it.
fn connection(stream: &[u8], pieces: Pieces, limits: (usize, usize)) -> Vec<Outcome> {
    let mut conn = Conn {
        feed: Feed::new(stream, pieces),
        buf: Vec::new(),
        max_header: limits.0,
        max_body: limits.1,
    };
    let mut outcomes = Vec::new();
    loop {
        let o = conn.request();
        let more = matches!(
            o,
            Outcome::Request {
                keep_alive: true,
                ..
            }
        );
        outcomes.push(o);
        if !more {
            return outcomes;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((ctl, stream)) = control(data) else {
        return;
    };
    let limits = if ctl[1] & 0x80 == 0 {
        let d = Limits::default();
        (d.max_header_bytes, d.max_body_bytes)
    } else {
        (64 + usize::from(ctl[1] & 0x3f), usize::from(ctl[1] & 0x3f))
    };
    let cut = connection(stream, Pieces::new(ctl), limits);
    let whole = connection(stream, Pieces::whole(), limits);
    assert_eq!(cut, whole);
});
