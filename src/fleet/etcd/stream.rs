//! A watch's byte stream, without I/O: the HTTP body's framing taken off
//! ([`BodyDecoder`]), then the payload cut into whole JSON objects ([`JsonSplitter`]).
//! The gateway writes one object per chunk, but nothing here relies on chunk boundaries:
//! an object may span chunks and several may share one.

use crate::http::BodyFraming;
use crate::http::chunked::ChunkedParser;

use super::EtcdError;

/// Takes a response body's framing off, as bytes arrive.
#[derive(Debug)]
pub enum BodyDecoder {
    Chunked(ChunkedParser),
    /// Bytes still to come.
    Length(u64),
    UntilClose,
}

impl BodyDecoder {
    pub fn new(framing: BodyFraming) -> BodyDecoder {
        match framing {
            BodyFraming::None => BodyDecoder::Length(0),
            BodyFraming::Length(n) => BodyDecoder::Length(n),
            BodyFraming::Chunked => BodyDecoder::Chunked(ChunkedParser::new()),
            BodyFraming::UntilClose => BodyDecoder::UntilClose,
        }
    }

    /// Moves the payload at the start of `raw` to `out` (framing dropped, an unfinished
    /// size line left in `raw`); returns whether the body has ended. `eof`: no more bytes
    /// will come. Bytes after the body's end stay in `raw`.
    pub fn feed(
        &mut self,
        raw: &mut Vec<u8>,
        out: &mut Vec<u8>,
        eof: bool,
    ) -> Result<bool, EtcdError> {
        match self {
            BodyDecoder::Chunked(parser) => {
                let (used, done) = parser
                    .skim(raw, |data| out.extend_from_slice(data))
                    .map_err(|e| EtcdError::Protocol(e.to_string()))?;
                raw.drain(..used);
                Ok(done)
            }
            BodyDecoder::Length(left) => {
                let n = raw.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                out.extend(raw.drain(..n));
                *left -= n as u64;
                Ok(*left == 0)
            }
            BodyDecoder::UntilClose => {
                out.append(raw);
                Ok(eof)
            }
        }
    }
}

/// Cuts a stream of concatenated JSON objects (whitespace between them allowed) into
/// whole objects. Only brackets, strings and escapes are tracked; the object itself is
/// checked by the JSON decoder afterwards.
#[derive(Debug)]
pub struct JsonSplitter {
    /// The unfinished object at `buf[0]` (leading whitespace already dropped), then
    /// whatever followed it.
    buf: Vec<u8>,
    /// How far the current object has been scanned.
    scanned: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
    max: usize,
}

impl JsonSplitter {
    /// `max` bounds the bytes held at once (an unfinished object plus what followed it).
    pub fn new(max: usize) -> JsonSplitter {
        JsonSplitter {
            buf: Vec::new(),
            scanned: 0,
            depth: 0,
            in_string: false,
            escaped: false,
            max,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) -> Result<(), EtcdError> {
        if self.buf.len() + bytes.len() > self.max {
            return Err(EtcdError::Protocol(format!(
                "watch object larger than {} bytes",
                self.max
            )));
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// The next whole object, if the bytes pushed so far hold one.
    pub fn next_object(&mut self) -> Result<Option<Vec<u8>>, EtcdError> {
        if self.scanned == 0 {
            let start = self
                .buf
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .unwrap_or(self.buf.len());
            self.buf.drain(..start);
            match self.buf.first() {
                None => return Ok(None),
                Some(b'{') => {}
                Some(&b) => {
                    return Err(EtcdError::Protocol(format!(
                        "watch stream: expected a JSON object, found byte {b:#04x}"
                    )));
                }
            }
        }
        let Some(end) = self.scan() else {
            return Ok(None);
        };
        let object = self.buf.drain(..end).collect();
        self.scanned = 0;
        Ok(Some(object))
    }

    /// Scans on from `scanned`; the object's length once its closing brace is seen.
    fn scan(&mut self) -> Option<usize> {
        while self.scanned < self.buf.len() {
            let b = self.buf[self.scanned];
            self.scanned += 1;
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(self.scanned);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(pieces: &[&[u8]]) -> Result<Vec<String>, EtcdError> {
        let mut s = JsonSplitter::new(1 << 20);
        let mut out = Vec::new();
        for piece in pieces {
            s.push(piece)?;
            while let Some(object) = s.next_object()? {
                out.push(String::from_utf8(object).unwrap());
            }
        }
        Ok(out)
    }

    #[test]
    fn objects_are_cut_whatever_the_pieces() {
        let stream: &[u8] = br#"{"a":1}
 {"b":{"c":[1,{"d":"}{\"]"}]}}{"e":"\\"}
"#;
        let want = [
            r#"{"a":1}"#,
            r#"{"b":{"c":[1,{"d":"}{\"]"}]}}"#,
            r#"{"e":"\\"}"#,
        ];
        assert_eq!(split_all(&[stream]).unwrap(), want);
        for cut in 0..stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(split_all(&[a, b]).unwrap(), want, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(split_all(&bytes).unwrap(), want);
    }

    #[test]
    fn garbage_and_oversize_are_errors() {
        assert!(split_all(&[b"  x{}"]).is_err());
        assert!(split_all(&[b"{}]"]).is_err());
        assert_eq!(
            split_all(&[b"{\"a\":", b"  "]).unwrap(),
            Vec::<String>::new()
        );
        let mut s = JsonSplitter::new(8);
        s.push(b"{\"a\":\"").unwrap();
        assert!(s.push(b"xyz").is_err());
    }

    fn feed_all(framing: BodyFraming, pieces: &[&[u8]]) -> Result<(Vec<u8>, bool), EtcdError> {
        let mut d = BodyDecoder::new(framing);
        let (mut raw, mut out, mut done) = (Vec::new(), Vec::new(), false);
        for (i, piece) in pieces.iter().enumerate() {
            raw.extend_from_slice(piece);
            done = d.feed(&mut raw, &mut out, i + 1 == pieces.len())?;
        }
        Ok((out, done))
    }

    #[test]
    fn body_framings() {
        let chunked: &[&[u8]] = &[b"5\r\nhel", b"lo\r\n3", b"\r\n{}\n\r\n"];
        assert_eq!(
            feed_all(BodyFraming::Chunked, chunked).unwrap(),
            (b"hello{}\n".to_vec(), false)
        );
        let ended: &[&[u8]] = &[b"2\r\n{}\r\n0\r\n\r\n"];
        assert_eq!(
            feed_all(BodyFraming::Chunked, ended).unwrap(),
            (b"{}".to_vec(), true)
        );
        assert!(feed_all(BodyFraming::Chunked, &[b"zz\r\n"]).is_err());
        assert_eq!(
            feed_all(BodyFraming::Length(4), &[b"ab", b"cdEXTRA"]).unwrap(),
            (b"abcd".to_vec(), true)
        );
        assert_eq!(
            feed_all(BodyFraming::UntilClose, &[b"ab", b"cd"]).unwrap(),
            (b"abcd".to_vec(), true)
        );
        assert_eq!(
            feed_all(BodyFraming::None, &[b"x"]).unwrap(),
            (Vec::new(), true)
        );
    }
}
