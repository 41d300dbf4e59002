//! One client connection: each request, forwarded on the connection's own kept-alive
//! upstream connection, and its response relayed back, until either side closes.

use std::io;
use std::net::SocketAddr;
use std::ops::Range;

use monoio::buf::{IoBuf, IoBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use crate::framing::{self, Body, Fed, Parsed, Request, Response};

/// Each direction's buffer: a request or response head must fit in it, a body streams
/// through it.
const BUF: usize = 16 * 1024;
const REFUSED: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
const BAD_GATEWAY: &[u8] =
    b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

pub async fn serve(client: TcpStream, upstream: SocketAddr) {
    let _ = client.set_nodelay(true);
    let mut conn = Conn {
        client,
        upstream: None,
        addr: upstream,
        cbuf: Vec::with_capacity(BUF),
        ubuf: Vec::with_capacity(BUF),
    };
    while let Ok(true) = conn.exchange().await {}
}

struct Conn {
    client: TcpStream,
    upstream: Option<TcpStream>,
    addr: SocketAddr,
    /// The client's bytes not yet forwarded: the request being read, and any pipelined
    /// after it.
    cbuf: Vec<u8>,
    /// The upstream's bytes not yet relayed.
    ubuf: Vec<u8>,
}

impl Conn {
    /// One request and its response; false when the connection is done.
    async fn exchange(&mut self) -> io::Result<bool> {
        let Some(req) = self.read_request().await? else {
            return Ok(false);
        };
        let res = match self.forward(&req).await {
            Ok(res) => res,
            Err(e) => {
                self.drop_upstream();
                let _ = self.client.write_all(BAD_GATEWAY).await;
                return Err(e);
            }
        };
        // Past here the client has seen bytes of the response: a failure only closes.
        let keep = self.relay(res, req.head_method).await?;
        Ok(keep && !req.close)
    }

    /// The next request head, reading until it is whole; None when the client closed or
    /// was refused.
    async fn read_request(&mut self) -> io::Result<Option<Request>> {
        loop {
            match framing::request(&self.cbuf) {
                Parsed::Complete(req) => return Ok(Some(req)),
                Parsed::Partial if self.cbuf.len() < self.cbuf.capacity() => {}
                Parsed::Partial | Parsed::Refused => {
                    self.client.write_all(REFUSED).await.0?;
                    return Ok(None);
                }
            }
            if fill(&mut self.client, &mut self.cbuf).await? == 0 {
                return Ok(None);
            }
        }
    }

    /// Sends the request upstream and reads the response's head. A request held whole in
    /// the buffer is sent again, once, on a fresh connection when a reused one turns out
    /// closed before answering (the origin's keep-alive timeout).
    async fn forward(&mut self, req: &Request) -> io::Result<Response> {
        let whole = req.head_len as u64 + req.body_len;
        if whole > self.cbuf.len() as u64 {
            self.connect().await?;
            self.stream_request(whole).await?;
            return self.response_head(req.head_method).await;
        }
        let reused = self.upstream.is_some();
        match self.send_buffered(whole as usize, req.head_method).await {
            Err(e) if reused && stale(&e) => {
                self.drop_upstream();
                self.send_buffered(whole as usize, req.head_method).await
            }
            other => other,
        }
    }

    async fn send_buffered(&mut self, len: usize, head_method: bool) -> io::Result<Response> {
        self.connect().await?;
        let up = self.upstream.as_mut().ok_or_else(not_connected)?;
        send(up, &mut self.cbuf, 0..len).await?;
        let res = self.response_head(head_method).await?;
        consume(&mut self.cbuf, len);
        Ok(res)
    }

    /// A request larger than what has arrived: what is there, then the rest as it comes.
    async fn stream_request(&mut self, mut left: u64) -> io::Result<()> {
        let up = self.upstream.as_mut().ok_or_else(not_connected)?;
        loop {
            let take = left.min(self.cbuf.len() as u64) as usize;
            send(up, &mut self.cbuf, 0..take).await?;
            consume(&mut self.cbuf, take);
            left -= take as u64;
            if left == 0 {
                return Ok(());
            }
            if fill(&mut self.client, &mut self.cbuf).await? == 0 {
                return Err(io::Error::other("client closed inside its request body"));
            }
        }
    }

    /// Reads until the response head is whole. A close before any byte is `UnexpectedEof`
    /// (the request may be sent again); one inside the head is not.
    async fn response_head(&mut self, head_method: bool) -> io::Result<Response> {
        loop {
            match framing::response(&self.ubuf, head_method) {
                Parsed::Complete(res) => return Ok(res),
                Parsed::Partial if self.ubuf.len() < self.ubuf.capacity() => {}
                Parsed::Partial | Parsed::Refused => return Err(invalid("response head")),
            }
            let up = self.upstream.as_mut().ok_or_else(not_connected)?;
            if fill(up, &mut self.ubuf).await? == 0 {
                let kind = if self.ubuf.is_empty() {
                    io::ErrorKind::UnexpectedEof
                } else {
                    io::ErrorKind::InvalidData
                };
                return Err(io::Error::new(kind, "upstream closed before its response"));
            }
        }
    }

    /// Relays the response whose head is in the buffer, its body as it arrives; whether
    /// the client connection stays open.
    async fn relay(&mut self, mut res: Response, head_method: bool) -> io::Result<bool> {
        while res.interim {
            send(&mut self.client, &mut self.ubuf, 0..res.head_len).await?;
            consume(&mut self.ubuf, res.head_len);
            res = self.response_head(head_method).await?;
        }
        let Response {
            head_len,
            mut body,
            close,
            ..
        } = res;
        let mut from = head_len;
        loop {
            let end = match body.feed(&self.ubuf[from..]) {
                Fed::End(n) => Some(from + n),
                Fed::More => None,
                Fed::Malformed => return Err(invalid("response body")),
            };
            let stop = end.unwrap_or(self.ubuf.len());
            if stop > 0 {
                send(&mut self.client, &mut self.ubuf, 0..stop).await?;
            }
            if let Some(end) = end {
                // Bytes after the response: the upstream cannot be trusted with another.
                if close || self.ubuf.len() > end {
                    self.drop_upstream();
                }
                self.ubuf.clear();
                return Ok(true);
            }
            self.ubuf.clear();
            from = 0;
            let up = self.upstream.as_mut().ok_or_else(not_connected)?;
            if fill(up, &mut self.ubuf).await? == 0 {
                self.drop_upstream();
                return match body {
                    Body::UntilClose => Ok(false),
                    _ => Err(invalid("response body cut short")),
                };
            }
        }
    }

    async fn connect(&mut self) -> io::Result<()> {
        if self.upstream.is_none() {
            let stream = TcpStream::connect_addr(self.addr).await?;
            stream.set_nodelay(true)?;
            self.upstream = Some(stream);
        }
        Ok(())
    }

    fn drop_upstream(&mut self) {
        self.upstream = None;
        self.ubuf.clear();
    }
}

/// Reads once into the buffer's free space; the bytes read (0: the peer closed).
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let len = buf.len();
    let (res, slice) = stream.read(std::mem::take(buf).slice_mut(len..)).await;
    *buf = slice.into_inner();
    res
}

/// Writes `range` of the buffer whole.
async fn send(stream: &mut TcpStream, buf: &mut Vec<u8>, range: Range<usize>) -> io::Result<()> {
    let (res, slice) = stream.write_all(std::mem::take(buf).slice(range)).await;
    *buf = slice.into_inner();
    res.map(drop)
}

/// Drops the first `n` bytes, keeping what follows them.
fn consume(buf: &mut Vec<u8>, n: usize) {
    buf.copy_within(n.., 0);
    buf.truncate(buf.len() - n);
}

/// A reused connection the upstream had already closed.
fn stale(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted
    )
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed {what}"))
}

fn not_connected() -> io::Error {
    io::Error::from(io::ErrorKind::NotConnected)
}
