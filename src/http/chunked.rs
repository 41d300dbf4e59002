//! Chunked transfer coding (RFC 9112 §7.1) as a pull parser over byte slices.
//!
//! [`ChunkedParser::next`] reports one event at a time with lengths relative to its input,
//! so the same state machine de-chunks request bodies in place ([`dechunk_in_place`]) and
//! tracks where a passed-through response body ends.

use super::HttpError;
use super::limits::{MAX_CHUNK_LINE, MAX_TRAILER_BYTES};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    Size,
    Data(u64),
    DataEnd,
    Trailer,
    Done,
}

/// See [`ChunkedParser::boundary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// Between chunks: a new chunk may follow at once.
    Chunk,
    /// A chunk's data is complete but not its CRLF: that CRLF, then a new chunk.
    AfterData,
    /// Inside a chunk's data, or past the last chunk: nothing can follow.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The input holds no complete token; present these bytes again with more after them.
    NeedMore,
    /// `n` framing bytes (size line, CRLF, trailer field) at the input's start.
    Framing(usize),
    /// `n` payload bytes at the input's start.
    Data(usize),
    /// The final `n` framing bytes; the message ends after them.
    Done(usize),
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ChunkedParser {
    state: State,
    trailer_bytes: usize,
}

impl ChunkedParser {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Where the message stands between chunks: what a writer that passed every
    /// consumed byte through must add before a chunk of its own.
    pub fn boundary(&self) -> Boundary {
        match self.state {
            State::Size => Boundary::Chunk,
            State::DataEnd => Boundary::AfterData,
            State::Data(_) | State::Trailer | State::Done => Boundary::None,
        }
    }

    pub fn next(&mut self, input: &[u8]) -> Result<Event, HttpError> {
        match self.state {
            State::Done => Ok(Event::Done(0)),
            State::Size => match size_line(input)? {
                Some((n, 0)) => {
                    self.state = State::Trailer;
                    Ok(Event::Framing(n))
                }
                Some((n, size)) => {
                    self.state = State::Data(size);
                    Ok(Event::Framing(n))
                }
                None => Ok(Event::NeedMore),
            },
            State::Data(remaining) => {
                if input.is_empty() {
                    return Ok(Event::NeedMore);
                }
                let n = remaining.min(input.len() as u64);
                self.state = if n == remaining {
                    State::DataEnd
                } else {
                    State::Data(remaining - n)
                };
                Ok(Event::Data(n as usize))
            }
            State::DataEnd => match input {
                [b'\r', b'\n', ..] => {
                    self.state = State::Size;
                    Ok(Event::Framing(2))
                }
                [] | [b'\r'] => Ok(Event::NeedMore),
                _ => Err(HttpError::InvalidChunk("chunk data not followed by CRLF")),
            },
            State::Trailer => {
                let Some(lf) = memchr::memchr(b'\n', input) else {
                    return if self.trailer_bytes + input.len() > MAX_TRAILER_BYTES {
                        Err(HttpError::InvalidChunk("trailer section too large"))
                    } else {
                        Ok(Event::NeedMore)
                    };
                };
                if lf == 0 || input[lf - 1] != b'\r' {
                    return Err(HttpError::InvalidChunk("bare LF in trailer section"));
                }
                if memchr::memchr(b'\r', &input[..lf - 1]).is_some() {
                    return Err(HttpError::InvalidChunk("bare CR in trailer section"));
                }
                self.trailer_bytes += lf + 1;
                if self.trailer_bytes > MAX_TRAILER_BYTES {
                    return Err(HttpError::InvalidChunk("trailer section too large"));
                }
                if lf == 1 {
                    self.state = State::Done;
                    Ok(Event::Done(2))
                } else if input[0] == b' ' || input[0] == b'\t' {
                    Err(HttpError::ObsFold)
                } else if memchr::memchr(b':', &input[..lf]).is_none() {
                    Err(HttpError::InvalidChunk("malformed trailer field"))
                } else {
                    Ok(Event::Framing(lf + 1))
                }
            }
        }
    }

    /// Advances over framing and payload without copying; returns the bytes consumed and
    /// whether the message ended. Unconsumed bytes (a partial size line) must be presented
    /// again with more data. `on_data` sees each payload range (relative to `input`).
    pub fn skim(
        &mut self,
        input: &[u8],
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<(usize, bool), HttpError> {
        let mut at = 0;
        loop {
            match self.next(&input[at..])? {
                Event::NeedMore => return Ok((at, false)),
                Event::Framing(n) => at += n,
                Event::Data(n) => {
                    on_data(&input[at..at + n]);
                    at += n;
                }
                Event::Done(n) => return Ok((at + n, true)),
            }
        }
    }
}

/// Where the scan of a chunk-size line's extensions stands (RFC 9112 §7.1.1:
/// `*( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] )`, plus optional
/// whitespace before the line's end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ext {
    /// After the size or a whole extension: whitespace, then `;` or the line's end.
    Between,
    /// After `;`: whitespace, then a name.
    NameStart,
    Name,
    /// After a name and whitespace: `=`, `;` or the line's end.
    AfterName,
    /// After `=`: whitespace, then a token or a quoted string.
    ValueStart,
    Token,
    Quoted,
    /// After a backslash in a quoted string.
    Escape,
}

impl Ext {
    fn step(self, b: u8) -> Option<Ext> {
        let ows = b == b' ' || b == b'\t';
        Some(match self {
            Ext::Between if ows => Ext::Between,
            Ext::Between | Ext::Name | Ext::AfterName | Ext::Token if b == b';' => Ext::NameStart,
            Ext::NameStart if ows => Ext::NameStart,
            Ext::NameStart | Ext::Name if is_tchar(b) => Ext::Name,
            Ext::Name | Ext::AfterName if ows => Ext::AfterName,
            Ext::Name | Ext::AfterName if b == b'=' => Ext::ValueStart,
            Ext::ValueStart if ows => Ext::ValueStart,
            Ext::ValueStart if b == b'"' => Ext::Quoted,
            Ext::ValueStart | Ext::Token if is_tchar(b) => Ext::Token,
            Ext::Token if ows => Ext::Between,
            Ext::Quoted if b == b'"' => Ext::Between,
            Ext::Quoted if b == b'\\' => Ext::Escape,
            Ext::Quoted if b == b'\t' || b == b' ' || b == 0x21 || (b >= 0x23 && b != 0x7f) => {
                Ext::Quoted
            }
            Ext::Escape if b == b'\t' || (b >= 0x20 && b != 0x7f) => Ext::Quoted,
            _ => return None,
        })
    }

    /// Whether the line may end here.
    fn may_end(self) -> bool {
        matches!(self, Ext::Between | Ext::Name | Ext::AfterName | Ext::Token)
    }
}

/// RFC 9110 `tchar`: the bytes of a token.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses a chunk-size line strictly: `Some((line length, size))`, or `None` while it is
/// incomplete. A bare CR or LF anywhere in it, a size over 64 bits and anything outside
/// the grammar are refused, so no reader before or after us can end the line elsewhere.
fn size_line(input: &[u8]) -> Result<Option<(usize, u64)>, HttpError> {
    let line = &input[..input.len().min(MAX_CHUNK_LINE)];
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 && !line.is_empty() {
        return Err(HttpError::InvalidChunk("invalid chunk size"));
    }
    let mut size: u64 = 0;
    for &b in &line[..digits] {
        if size > u64::MAX >> 4 {
            return Err(HttpError::InvalidChunk("chunk size too large"));
        }
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        };
        size = (size << 4) | u64::from(d);
    }
    let mut ext = Ext::Between;
    for (i, &b) in line.iter().enumerate().skip(digits) {
        match b {
            b'\r' => {
                return match input.get(i + 1) {
                    None => Ok(None),
                    Some(b'\n') if ext.may_end() => Ok(Some((i + 2, size))),
                    Some(b'\n') => Err(HttpError::InvalidChunk("invalid chunk extension")),
                    Some(_) => Err(HttpError::InvalidChunk("bare CR in chunk size line")),
                };
            }
            b'\n' => return Err(HttpError::InvalidChunk("bare LF in chunk size line")),
            _ => {
                ext = ext
                    .step(b)
                    .ok_or(HttpError::InvalidChunk("invalid chunk extension"))?;
            }
        }
    }
    if input.len() >= MAX_CHUNK_LINE {
        Err(HttpError::InvalidChunk("chunk size line too long"))
    } else {
        Ok(None)
    }
}

/// In-place de-chunking of a request body: `buf[raw..filled]` holds undecoded bytes,
/// `buf[..out]` the decoded payload so far. Returns true once the body is complete; `raw`
/// then points just past the message.
#[derive(Debug, Clone, Default)]
pub struct Dechunker {
    parser: ChunkedParser,
    pub raw: usize,
    pub out: usize,
}

impl Dechunker {
    pub fn new(start: usize) -> Self {
        Self {
            parser: ChunkedParser::new(),
            raw: start,
            out: start,
        }
    }

    /// Decodes as far as `buf[..filled]` allows. `max_out` bounds the decoded length.
    pub fn decode(
        &mut self,
        buf: &mut [u8],
        filled: usize,
        max_out: usize,
    ) -> Result<bool, HttpError> {
        loop {
            match self.parser.next(&buf[self.raw..filled])? {
                Event::NeedMore => return Ok(false),
                Event::Framing(n) => self.raw += n,
                Event::Data(n) => {
                    if self.out + n > max_out {
                        return Err(HttpError::BodyTooLarge);
                    }
                    buf.copy_within(self.raw..self.raw + n, self.out);
                    self.out += n;
                    self.raw += n;
                }
                Event::Done(n) => {
                    self.raw += n;
                    return Ok(true);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dechunk_all(raw: &[u8]) -> Result<(Vec<u8>, usize), HttpError> {
        let mut buf = raw.to_vec();
        let mut d = Dechunker::new(0);
        if d.decode(&mut buf, raw.len(), usize::MAX)? {
            Ok((buf[..d.out].to_vec(), d.raw))
        } else {
            Err(HttpError::InvalidChunk("incomplete"))
        }
    }

    #[test]
    fn wire_table() {
        type Case = (&'static [u8], Result<(&'static [u8], usize), HttpError>);
        let cases: &[Case] = &[
            (b"5\r\nhello\r\n0\r\n\r\n", Ok((b"hello", 15))),
            (
                b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nNEXT",
                Ok((b"hello world", 26)),
            ),
            (b"5;ext=1\r\nhello\r\n0\r\n\r\n", Ok((b"hello", 21))),
            (
                b"A\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n",
                Ok((b"0123456789", 28)),
            ),
            (b"0\r\n\r\n", Ok((b"", 5))),
            (
                b"zz\r\nhello\r\n0\r\n\r\n",
                Err(HttpError::InvalidChunk("invalid chunk size")),
            ),
            (
                b"5\r\nhelloXX0\r\n\r\n",
                Err(HttpError::InvalidChunk("chunk data not followed by CRLF")),
            ),
            (
                b"ffffffffffffffffffff\r\n",
                Err(HttpError::InvalidChunk("chunk size too large")),
            ),
            (
                b"0\r\nX-T 1\r\n\r\n",
                Err(HttpError::InvalidChunk("malformed trailer field")),
            ),
            (
                b"0\r\n\n",
                Err(HttpError::InvalidChunk("bare LF in trailer section")),
            ),
            (b"5\r\nhel", Err(HttpError::InvalidChunk("incomplete"))),
        ];
        for (raw, want) in cases {
            let got = dechunk_all(raw);
            let want = (*want).map(|(b, n)| (b.to_vec(), n));
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(raw));
        }
    }

    /// Chunk-size lines: what RFC 9112 §7.1 allows is decoded, everything else (bare CR
    /// or LF anywhere, a malformed extension, an overflowing size) is refused at once, never
    /// left waiting for more bytes.
    #[test]
    fn size_line_table() {
        let bad = |m| Err(HttpError::InvalidChunk(m));
        let lf = bad("bare LF in chunk size line");
        let cr = bad("bare CR in chunk size line");
        let ext = bad("invalid chunk extension");
        let ok5 = Ok((&b"hello"[..], 0usize));
        type Case = (&'static [u8], Result<(&'static [u8], usize), HttpError>);
        let cases: Vec<Case> = vec![
            (b"5;a=b\nhello\r\n0\r\n\r\n", lf),
            (b"5;a\nhello\r\n0\r\n\r\n", lf),
            (b"5\nhello\r\n0\r\n\r\n", lf),
            (b"5 \nhello\r\n0\r\n\r\n", lf),
            (b"5;a=\"x\ny\"\r\nhello\r\n0\r\n\r\n", lf),
            (b"5\r\nhello\r\n0;a=b\n\r\n", lf),
            (b"5;a=b\rhello\r\n0\r\n\r\n", cr),
            (b"5\rhello\r\n0\r\n\r\n", cr),
            (b"5;a=b\r\rhello\r\n0\r\n\r\n", cr),
            (b"5;\r\nhello\r\n0\r\n\r\n", ext),
            (b"5;a=\r\nhello\r\n0\r\n\r\n", ext),
            (b"5;a b\r\nhello\r\n0\r\n\r\n", ext),
            (b"5;a\0\r\nhello\r\n0\r\n\r\n", ext),
            (b"5;a=\"b\r\nhello\r\n0\r\n\r\n", ext),
            (b"5;=b\r\nhello\r\n0\r\n\r\n", ext),
            (b"0x5\r\nhello\r\n0\r\n\r\n", ext),
            (b"5 6\r\nhello\r\n0\r\n\r\n", ext),
            (b"-5\r\nhello\r\n0\r\n\r\n", bad("invalid chunk size")),
            (b" 5\r\nhello\r\n0\r\n\r\n", bad("invalid chunk size")),
            (b"\r\nhello\r\n0\r\n\r\n", bad("invalid chunk size")),
            (b"10000000000000005\r\nhello", bad("chunk size too large")),
            (
                b"5\r\nhello\n0\r\n\r\n",
                bad("chunk data not followed by CRLF"),
            ),
            (
                b"5\r\nhello\r\n0\r\nX: a\rb\r\n\r\n",
                bad("bare CR in trailer section"),
            ),
            (b"5;a=b\r", bad("incomplete")),
            (b"ffffffffffffffff\r\nhello", bad("incomplete")),
            (b"5;a=b\r\nhello\r\n0\r\n\r\n", ok5),
            (b"5;a\r\nhello\r\n0\r\n\r\n", ok5),
            (b"5 ; a = b ; c\r\nhello\r\n0\r\n\r\n", ok5),
            (b"5;a=\"b;\\\"c\\\" d\"\r\nhello\r\n0\r\n\r\n", ok5),
            (b"5 \r\nhello\r\n0\r\n\r\n", ok5),
            (b"0000000000000000005\r\nhello\r\n0\r\n\r\n", ok5),
        ];
        for (raw, want) in cases {
            let got = dechunk_all(raw).map(|(b, _)| b);
            let want = want.map(|(b, _)| b.to_vec());
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(raw));
        }
        let long = [&b"5;"[..], &[b'a'; MAX_CHUNK_LINE]].concat();
        assert_eq!(
            dechunk_all(&long).err(),
            Some(HttpError::InvalidChunk("chunk size line too long"))
        );
    }

    /// Found by `fuzz/` (target `chunked`) in the parser before the strict size line: a
    /// line over the limit was refused when it came in pieces but accepted in one read.
    #[test]
    fn long_size_line_is_refused_however_it_arrives() {
        let line = |ext: usize| format!("5;{}\r\nhello\r\n0\r\n\r\n", "x".repeat(ext));
        let fed = |raw: &[u8], step: usize| {
            let mut buf = raw.to_vec();
            let mut d = Dechunker::new(0);
            let mut filled = 0;
            loop {
                filled = (filled + step).min(raw.len());
                match d.decode(&mut buf, filled, usize::MAX) {
                    Ok(false) if filled < raw.len() => {}
                    other => return other,
                }
            }
        };
        // "5;" and the extension: with its CR, MAX_CHUNK_LINE bytes pass, one more does not.
        let longest = line(MAX_CHUNK_LINE - 3);
        let too_long = line(MAX_CHUNK_LINE - 2);
        for step in [1, 7, 1000, usize::MAX / 2] {
            assert_eq!(fed(longest.as_bytes(), step), Ok(true), "step {step}");
            assert_eq!(
                fed(too_long.as_bytes(), step),
                Err(HttpError::InvalidChunk("chunk size line too long")),
                "step {step}"
            );
        }
    }

    #[test]
    fn body_limit_applies_to_decoded_length() {
        let raw = b"5\r\nhello\r\n0\r\n\r\n";
        let mut buf = raw.to_vec();
        let mut d = Dechunker::new(0);
        assert_eq!(
            d.decode(&mut buf, raw.len(), 4),
            Err(HttpError::BodyTooLarge)
        );
    }

    proptest::proptest! {
        /// Any body, chunked at any sizes and delivered in any splits, decodes to itself;
        /// the skimming parser finds the same end.
        #[test]
        fn roundtrip(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
                     sizes in proptest::collection::vec(1usize..50, 1..20),
                     split in 1usize..40) {
            let mut wire = Vec::new();
            let mut rest = &body[..];
            let mut i = 0;
            while !rest.is_empty() {
                let n = sizes[i % sizes.len()].min(rest.len());
                wire.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                wire.extend_from_slice(&rest[..n]);
                wire.extend_from_slice(b"\r\n");
                rest = &rest[n..];
                i += 1;
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            let total = wire.len();
            wire.extend_from_slice(b"GET /next");

            // In place, fed incrementally.
            let mut buf = wire.clone();
            let mut d = Dechunker::new(0);
            let mut filled = 0;
            let done = loop {
                filled = (filled + split).min(buf.len());
                if d.decode(&mut buf, filled, usize::MAX).unwrap() { break true; }
                if filled == buf.len() { break false; }
            };
            proptest::prop_assert!(done);
            proptest::prop_assert_eq!(&buf[..d.out], &body[..]);
            proptest::prop_assert_eq!(d.raw, total);

            // Skimming with carry-over of unconsumed bytes.
            let mut p = ChunkedParser::new();
            let mut carried = Vec::new();
            let mut seen = Vec::new();
            let mut consumed_total = 0;
            for piece in wire.chunks(split) {
                carried.extend_from_slice(piece);
                let (used, end) = p.skim(&carried, |d| seen.extend_from_slice(d)).unwrap();
                consumed_total += used;
                carried.drain(..used);
                if end { break; }
            }
            proptest::prop_assert!(p.is_done());
            proptest::prop_assert_eq!(consumed_total, total);
            proptest::prop_assert_eq!(seen, body);
        }
    }
}
