//! What the fuzz targets share: how an input becomes a byte stream cut at arbitrary
//! points, and the invariants of a parsed request head.

use spillway::http::limits::MAX_HEADERS;
use spillway::http::request::RequestHead;
use spillway::http::{BodyFraming, Method, Span};

/// Bytes at the start of a stream target's input that say how to cut the rest.
pub const CONTROL: usize = 2;

/// Splits an input into its control bytes and the stream (`None`: too short).
pub fn control(data: &[u8]) -> Option<([u8; CONTROL], &[u8])> {
    let (ctl, rest) = data.split_first_chunk::<CONTROL>()?;
    Some((*ctl, rest))
}

/// Piece lengths for a stream, deterministic in the control bytes: the low three bits of
/// the first pick the largest piece (0: the whole stream at once), the rest seed a
/// xorshift generator that draws each piece's length up to it.
#[derive(Debug, Clone)]
pub struct Pieces {
    state: u32,
    max: usize,
}

impl Pieces {
    pub fn new(ctl: [u8; CONTROL]) -> Pieces {
        const MAX: [usize; 8] = [usize::MAX, 1, 2, 3, 7, 16, 100, 1000];
        let seed = (u32::from(ctl[0]) << 8) | u32::from(ctl[1]);
        Pieces {
            state: seed.wrapping_mul(0x9e37_79b9) | 1,
            max: MAX[usize::from(ctl[0] & 7)],
        }
    }

    /// One stream at once, whatever the control bytes say.
    pub fn whole() -> Pieces {
        Pieces::new([0, 0])
    }

    /// The next piece's length, at least 1.
    pub fn next_len(&mut self) -> usize {
        if self.max == usize::MAX {
            return usize::MAX;
        }
        self.state ^= self.state << 13;
        self.state ^= self.state >> 17;
        self.state ^= self.state << 5;
        1 + self.state as usize % self.max
    }
}

/// A stream handed out piece by piece, as reads would.
#[derive(Debug, Clone)]
pub struct Feed<'a> {
    rest: &'a [u8],
    pieces: Pieces,
}

impl<'a> Feed<'a> {
    pub fn new(stream: &'a [u8], pieces: Pieces) -> Feed<'a> {
        Feed {
            rest: stream,
            pieces,
        }
    }

    /// The next piece; `None` once the stream is spent (the peer closed).
    pub fn next_piece(&mut self) -> Option<&'a [u8]> {
        if self.rest.is_empty() {
            return None;
        }
        let n = self.pieces.next_len().min(self.rest.len());
        let (piece, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(piece)
    }

    /// Appends the next piece to `buf`; false once the stream is spent.
    pub fn read_into(&mut self, buf: &mut Vec<u8>) -> bool {
        match self.next_piece() {
            Some(p) => {
                buf.extend_from_slice(p);
                true
            }
            None => false,
        }
    }
}

fn within(span: Span, end: usize) {
    assert!(span.start <= span.end, "span {span:?} runs backwards");
    assert!(span.end as usize <= end, "span {span:?} past {end}");
}

/// Whether a path (before `?`) has a segment that is `.` or `..` once `%2e` is decoded;
/// written apart from the parser's own check.
fn has_dot_segment(path: &[u8]) -> bool {
    let path = path.split(|&b| b == b'#').next().unwrap_or_default();
    path.split(|&b| b == b'/').any(|segment| {
        let decoded = String::from_utf8_lossy(segment)
            .to_ascii_lowercase()
            .replace("%2e", ".");
        decoded == "." || decoded == ".."
    })
}

/// What must hold of any head `parse_request` accepted from `buf`.
pub fn check_request_head(buf: &[u8], head: &RequestHead, max_header: usize, max_body: u64) {
    let end = head.head_len;
    assert!(end <= buf.len() && end <= max_header, "head_len {end}");
    assert!(head.minor_version <= 1);
    within(head.method_span, end);
    within(head.target, end);
    assert_eq!(Method::from_bytes(head.method_span.get(buf)), head.method);
    let target = head.target.get(buf);
    assert_eq!(target.first(), Some(&b'/'), "origin-form target");
    assert!(target.starts_with(head.path(buf)));
    assert!(
        !has_dot_segment(head.path(buf)),
        "dot-segment in {target:?}"
    );
    if let Some(authority) = head.authority {
        within(authority, end);
        let a = authority.get(buf);
        assert!(!a.is_empty() && !a.contains(&b'@'), "authority {a:?}");
        for (i, h) in head.headers.iter().enumerate() {
            if h.name.get(buf).eq_ignore_ascii_case(b"host") {
                assert_ne!(
                    head.headers.skip & (1 << i),
                    0,
                    "the client's Host forwarded"
                );
            }
        }
    }
    assert!(head.headers.len <= MAX_HEADERS);
    for h in head.headers.iter() {
        within(h.name, end);
        within(h.value, end);
        assert!(!h.name.is_empty());
    }
    let len = head.headers.len;
    assert_eq!(head.headers.skip.checked_shr(len as u32).unwrap_or(0), 0);
    assert_eq!(head.forwarded_for & !head.headers.skip, 0);
    for s in [
        head.content_type,
        head.request_id,
        head.worker_id,
        head.authorization,
    ]
    .into_iter()
    .flatten()
    {
        within(s, end);
    }
    if let Some(id) = head.request_id {
        let id = id.get(buf);
        assert!(!id.is_empty() && id.len() <= 128 && id.iter().all(u8::is_ascii_graphic));
    }
    match head.body {
        BodyFraming::Length(n) => assert!(n > 0 && n <= max_body, "length {n}"),
        BodyFraming::Chunked => assert_eq!(head.minor_version, 1),
        BodyFraming::None => assert!(!head.expect_continue),
        BodyFraming::UntilClose => panic!("a request is never close-delimited"),
    }
}
