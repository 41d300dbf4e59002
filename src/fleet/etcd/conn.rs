//! One HTTP/1.1 POST to the gateway over monoio, one connection per request
//! (`Connection: close`): the request written, the response head parsed, then the body
//! read whole (a range) or piece by piece (a watch).

use std::net::SocketAddr;

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use crate::http::response::{ResponseHead, parse_response};

use super::EtcdError;
use super::stream::BodyDecoder;

/// The most a response head may take.
const MAX_HEAD: usize = 16 * 1024;
/// Bytes asked of each read.
const READ_SIZE: usize = 16 * 1024;
/// How much of an error answer's body is kept for the message.
const ERROR_BODY_SHOWN: usize = 512;

/// The connection and the bytes read off it.
pub struct Conn {
    pub addr: SocketAddr,
    stream: TcpStream,
    /// Bytes read and not yet consumed.
    pub raw: Vec<u8>,
    read_buf: Vec<u8>,
    /// The peer closed its side.
    pub eof: bool,
    /// A read was started and its future dropped: bytes may be lost (io_uring may have
    /// completed it), so the stream can no longer be trusted.
    interrupted: bool,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("addr", &self.addr)
            .field("buffered", &self.raw.len())
            .field("eof", &self.eof)
            .field("interrupted", &self.interrupted)
            .finish()
    }
}

impl Conn {
    /// Connects and writes `POST path` with a JSON `body`.
    pub async fn post(
        addr: SocketAddr,
        host: &str,
        path: &str,
        body: &[u8],
    ) -> Result<Conn, EtcdError> {
        let stream = TcpStream::connect_addr(addr)
            .await
            .map_err(|e| io(addr, "connect", e))?;
        let host = if host.is_empty() {
            addr.to_string()
        } else {
            host.to_string()
        };
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        let mut conn = Conn {
            addr,
            stream,
            raw: Vec::new(),
            read_buf: Vec::with_capacity(READ_SIZE),
            eof: false,
            interrupted: false,
        };
        let (res, _) = conn.stream.write_all(request).await;
        res.map_err(|e| io(addr, "write", e))?;
        Ok(conn)
    }

    /// Reads once more; sets `eof` when the peer has closed. Not cancel-safe: once a
    /// read's future is dropped, every later call is an error.
    pub async fn fill(&mut self) -> Result<(), EtcdError> {
        if self.interrupted {
            return Err(EtcdError::Io {
                addr: self.addr,
                reason: "an earlier read was cancelled; the stream is lost".into(),
            });
        }
        let mut buf = std::mem::take(&mut self.read_buf);
        buf.clear();
        buf.reserve(READ_SIZE);
        self.interrupted = true;
        let (res, buf) = self.stream.read(buf).await;
        self.interrupted = false;
        let n = res.map_err(|e| io(self.addr, "read", e))?;
        self.raw.extend_from_slice(&buf[..n.min(buf.len())]);
        self.read_buf = buf;
        self.eof = n == 0;
        Ok(())
    }

    /// The response head (its bytes consumed); 1xx heads are skipped.
    pub async fn head(&mut self) -> Result<ResponseHead, EtcdError> {
        let mut head = ResponseHead::default();
        loop {
            let complete = parse_response(&self.raw, MAX_HEAD, false, &mut head)
                .map_err(|e| EtcdError::Protocol(format!("response head: {e}")))?;
            if complete {
                self.raw.drain(..head.head_len);
                if !head.is_informational() {
                    return Ok(head);
                }
                continue;
            }
            if self.eof {
                return Err(closed(self.addr, "before the response head"));
            }
            self.fill().await?;
        }
    }

    /// Decodes the body into `out` until it ends; more than `max` bytes is an error.
    pub async fn body(
        &mut self,
        decoder: &mut BodyDecoder,
        out: &mut Vec<u8>,
        max: usize,
    ) -> Result<(), EtcdError> {
        loop {
            if decoder.feed(&mut self.raw, out, self.eof)? {
                return Ok(());
            }
            if out.len() > max {
                return Err(EtcdError::Protocol(format!(
                    "answer larger than {max} bytes"
                )));
            }
            if self.eof {
                return Err(closed(self.addr, "mid-body"));
            }
            self.fill().await?;
        }
    }

    /// A non-200 answer as [`EtcdError::Status`], with the start of its body.
    pub async fn status_error(&mut self, head: &ResponseHead) -> EtcdError {
        let mut body = Vec::new();
        let mut decoder = BodyDecoder::new(head.framing());
        // Only the start is shown: a body cut short or too long still makes the error.
        let _ = self.body(&mut decoder, &mut body, ERROR_BODY_SHOWN).await;
        body.truncate(ERROR_BODY_SHOWN);
        EtcdError::Status {
            addr: self.addr,
            status: head.status,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }
}

fn io(addr: SocketAddr, what: &str, e: std::io::Error) -> EtcdError {
    EtcdError::Io {
        addr,
        reason: format!("{what}: {e}"),
    }
}

pub fn closed(addr: SocketAddr, when: &str) -> EtcdError {
    EtcdError::Io {
        addr,
        reason: format!("connection closed {when}"),
    }
}
