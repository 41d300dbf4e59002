//! Just enough HTTP/1.1 framing to forward keep-alive traffic byte for byte: where a
//! request's head and body end, and where a response's body ends (Content-Length,
//! chunked, no body, or the connection's close).

/// Headers a head may carry before it is refused.
const MAX_HEADERS: usize = 64;

/// A request head read off the client's buffer.
#[derive(Debug, PartialEq)]
pub struct Request {
    pub head_len: usize,
    pub body_len: u64,
    /// The client asked to close after this exchange.
    pub close: bool,
    /// HEAD: the response has no body whatever its head says.
    pub head_method: bool,
}

/// What reading a head from the start of a buffer found.
#[derive(Debug, PartialEq)]
pub enum Parsed<T> {
    Complete(T),
    Partial,
    /// Malformed, or framing this forwarder does not carry (request bodies in chunks,
    /// conflicting lengths, HTTP/1.0): answered with an error and a close.
    Refused,
}

/// How a response body ends.
#[derive(Debug, PartialEq)]
pub enum Body {
    Length(u64),
    Chunked(Chunked),
    /// Until the upstream closes; the client is closed after it.
    UntilClose,
}

/// A response head read off the upstream's buffer.
#[derive(Debug, PartialEq)]
pub struct Response {
    pub head_len: usize,
    pub body: Body,
    /// 1xx: another head follows.
    pub interim: bool,
    /// The upstream closes after this response.
    pub close: bool,
}

pub fn request(buf: &[u8]) -> Parsed<Request> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Refused,
    };
    if req.version != Some(1) {
        return Parsed::Refused;
    }
    let Some(fields) = Fields::read(req.headers) else {
        return Parsed::Refused;
    };
    if fields.transfer_encoding {
        return Parsed::Refused;
    }
    Parsed::Complete(Request {
        head_len,
        body_len: fields.content_length.unwrap_or(0),
        close: fields.close,
        head_method: req.method == Some("HEAD"),
    })
}

pub fn response(buf: &[u8], head_method: bool) -> Parsed<Response> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    let head_len = match res.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Refused,
    };
    let (Some(code), Some(fields)) = (res.code, Fields::read(res.headers)) else {
        return Parsed::Refused;
    };
    if code == 101 {
        return Parsed::Refused;
    }
    let interim = (100..200).contains(&code);
    let body = if interim || head_method || code == 204 || code == 304 {
        Body::Length(0)
    } else if fields.chunked_last {
        Body::Chunked(Chunked::default())
    } else if fields.transfer_encoding {
        Body::UntilClose
    } else {
        fields.content_length.map_or(Body::UntilClose, Body::Length)
    };
    let close = fields.close || res.version != Some(1) || body == Body::UntilClose;
    Parsed::Complete(Response {
        head_len,
        body,
        interim,
        close,
    })
}

/// The header fields that frame a message.
struct Fields {
    content_length: Option<u64>,
    transfer_encoding: bool,
    /// The last transfer coding is `chunked`.
    chunked_last: bool,
    close: bool,
}

impl Fields {
    /// None: lengths that disagree or do not parse.
    fn read(headers: &[httparse::Header<'_>]) -> Option<Fields> {
        let mut f = Fields {
            content_length: None,
            transfer_encoding: false,
            chunked_last: false,
            close: false,
        };
        for h in headers {
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = digits(h.value)?;
                if f.content_length.is_some_and(|m| m != n) {
                    return None;
                }
                f.content_length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                f.transfer_encoding = true;
                f.chunked_last = h
                    .value
                    .rsplit(|&b| b == b',')
                    .next()
                    .is_some_and(|last| trim(last).eq_ignore_ascii_case(b"chunked"));
            } else if h.name.eq_ignore_ascii_case("connection") {
                f.close |= h
                    .value
                    .split(|&b| b == b',')
                    .any(|t| trim(t).eq_ignore_ascii_case(b"close"));
            }
        }
        if f.transfer_encoding && f.content_length.is_some() {
            return None;
        }
        Some(f)
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// A decimal length: digits only, no sign, no overflow.
fn digits(s: &[u8]) -> Option<u64> {
    let s = trim(s);
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

/// Where a chunked body stands, fed its bytes as they arrive.
#[derive(Debug, Default, PartialEq)]
pub struct Chunked {
    state: Chunk,
    size: u64,
    digits: u8,
}

#[derive(Debug, Default, PartialEq, Clone, Copy)]
enum Chunk {
    #[default]
    Size,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    Trailer,
    TrailerLine,
    EndLf,
    Done,
}

/// What feeding bytes to a body's framing found.
#[derive(Debug, PartialEq)]
pub enum Fed {
    /// All of them belong to the body, and it goes on.
    More,
    /// The body ends after this many of them.
    End(usize),
    Malformed,
}

impl Body {
    pub fn feed(&mut self, bytes: &[u8]) -> Fed {
        match self {
            Body::UntilClose => Fed::More,
            Body::Length(left) => {
                let n = bytes.len() as u64;
                if n < *left {
                    *left -= n;
                    return Fed::More;
                }
                let end = *left as usize;
                *left = 0;
                Fed::End(end)
            }
            Body::Chunked(c) => c.feed(bytes),
        }
    }
}

impl Chunked {
    pub fn feed(&mut self, bytes: &[u8]) -> Fed {
        let mut i = 0;
        while i < bytes.len() {
            if self.state == Chunk::Data {
                let take = self.size.min((bytes.len() - i) as u64);
                self.size -= take;
                i += take as usize;
                if self.size == 0 {
                    self.state = Chunk::DataCr;
                }
                continue;
            }
            if !self.step(bytes[i]) {
                return Fed::Malformed;
            }
            i += 1;
            if self.state == Chunk::Done {
                return Fed::End(i);
            }
        }
        Fed::More
    }

    /// One byte outside chunk data; false when it cannot be there.
    fn step(&mut self, b: u8) -> bool {
        self.state = match (self.state, b) {
            (Chunk::Size, _) if b.is_ascii_hexdigit() => {
                if self.digits == 15 {
                    return false;
                }
                self.digits += 1;
                self.size = self.size << 4 | u64::from((b as char).to_digit(16).unwrap_or(0));
                Chunk::Size
            }
            (Chunk::Size, b';' | b' ' | b'\t') if self.digits > 0 => Chunk::Ext,
            (Chunk::Size | Chunk::Ext, b'\r') if self.digits > 0 => Chunk::SizeLf,
            (Chunk::Ext, b'\n') => return false,
            (Chunk::Ext, _) => Chunk::Ext,
            (Chunk::SizeLf, b'\n') if self.size == 0 => Chunk::Trailer,
            (Chunk::SizeLf, b'\n') => Chunk::Data,
            (Chunk::DataCr, b'\r') => Chunk::DataLf,
            (Chunk::DataLf, b'\n') => {
                self.digits = 0;
                Chunk::Size
            }
            (Chunk::Trailer, b'\r') => Chunk::EndLf,
            (Chunk::Trailer, b'\n') => return false,
            (Chunk::TrailerLine, b'\n') => Chunk::Trailer,
            (Chunk::Trailer | Chunk::TrailerLine, _) => Chunk::TrailerLine,
            (Chunk::EndLf, b'\n') => Chunk::Done,
            _ => return false,
        };
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn request_heads() {
        let r = b"POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(
            request(r),
            Parsed::Complete(Request {
                head_len: r.len() - 5,
                body_len: 5,
                close: false,
                head_method: false
            })
        );
        assert_eq!(request(&r[..20]), Parsed::Partial);
        let close = b"GET / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n";
        assert!(matches!(
            request(close),
            Parsed::Complete(Request { close: true, .. })
        ));
        for bad in [
            &b"GET / HTTP/1.0\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
        ] {
            assert_eq!(request(bad), Parsed::Refused);
        }
    }

    #[test]
    fn response_framing() {
        let body = |r: &[u8], head| match response(r, head) {
            Parsed::Complete(res) => res.body,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", false),
            Body::Length(3)
        );
        assert_eq!(
            body(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", true),
            Body::Length(0)
        );
        assert_eq!(body(b"HTTP/1.1 204 No\r\n\r\n", false), Body::Length(0));
        assert_eq!(body(b"HTTP/1.1 200 OK\r\n\r\n", false), Body::UntilClose);
        assert_eq!(
            body(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                false
            ),
            Body::Chunked(Chunked::default())
        );
        let early = response(b"HTTP/1.1 103 Early\r\n\r\n", false);
        assert!(matches!(
            early,
            Parsed::Complete(Response { interim: true, .. })
        ));
    }

    #[test]
    fn chunked_bodies_end_where_they_end_whatever_the_reads() {
        let stream = b"4;x=y\r\nwiki\r\n5\r\npedia\r\n0\r\nTrailer: t\r\n\r\nNEXT";
        let end = stream.len() - 4;
        for split in 0..=stream.len() {
            let mut c = Chunked::default();
            let (a, b) = stream.split_at(split);
            let got = match c.feed(a) {
                Fed::End(n) => n,
                Fed::More => match c.feed(b) {
                    Fed::End(n) => split + n,
                    other => panic!("split {split}: {other:?}"),
                },
                Fed::Malformed => panic!("split {split}: malformed"),
            };
            assert_eq!(got, end, "split {split}");
        }
        for bad in [
            &b"x\r\n"[..],
            b"4\r\nwikiXX",
            b"\r\n",
            b"1234567890abcdef0\r\n",
            b"0\r\n\n",
        ] {
            assert_eq!(Chunked::default().feed(bad), Fed::Malformed, "{bad:?}");
        }
    }

    #[test]
    fn lengths_count_down_across_reads() {
        let mut b = Body::Length(5);
        assert_eq!(b.feed(b"abc"), Fed::More);
        assert_eq!(b.feed(b"deNEXT"), Fed::End(2));
    }
}
