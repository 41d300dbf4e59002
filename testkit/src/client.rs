//! A raw HTTP/1.1 client on blocking sockets, and request builders.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::upstream::fill;

/// One response as the client read it.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
    /// The whole body, de-chunked.
    pub body: Vec<u8>,
    /// Body pieces (de-chunked) with their arrival times.
    pub pieces: Vec<(Instant, Vec<u8>)>,
}

impl Response {
    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON; panics with the body when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
}

/// One client connection; reads time out after 20 s.
pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
    /// A TLS session over `stream` ([`Client::connect_tls`]).
    tls: Option<Box<rustls::ClientConnection>>,
}

impl Client {
    /// Connects to `addr`.
    pub fn connect(addr: SocketAddr) -> Client {
        Client::try_connect(addr).expect("connect")
    }

    /// Connects to `addr`; the error when that fails (nothing listens there yet).
    pub fn try_connect(addr: SocketAddr) -> std::io::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        let _ = stream.set_nodelay(true);
        Ok(Client {
            stream,
            buf: Vec::new(),
            tls: None,
        })
    }

    /// Connects to `addr` over TLS, trusting `config`'s roots, for server name `name`;
    /// the handshake completes before this returns (its error is returned).
    pub fn connect_tls(
        addr: SocketAddr,
        config: std::sync::Arc<rustls::ClientConfig>,
        name: &str,
    ) -> std::io::Result<Client> {
        let mut c = Client::connect(addr);
        let name = rustls::pki_types::ServerName::try_from(name.to_string())
            .map_err(std::io::Error::other)?;
        let mut conn =
            rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
        while conn.is_handshaking() {
            conn.complete_io(&mut c.stream)?;
        }
        c.tls = Some(Box::new(conn));
        Ok(c)
    }

    /// The negotiated TLS version and ALPN protocol.
    pub fn tls_info(&self) -> Option<(rustls::ProtocolVersion, Option<Vec<u8>>)> {
        let conn = self.tls.as_ref()?;
        Some((
            conn.protocol_version()?,
            conn.alpn_protocol().map(<[u8]>::to_vec),
        ))
    }

    /// TLS: reads until the session ends; an error unless the server said close_notify
    /// before closing.
    pub fn tls_end(&mut self) -> std::io::Result<()> {
        let conn = self.tls.as_mut().expect("a TLS client");
        let mut tmp = [0u8; 4096];
        loop {
            match rustls::Stream::new(&mut **conn, &mut self.stream).read(&mut tmp)? {
                0 => return Ok(()),
                n => self.buf.extend_from_slice(&tmp[..n]),
            }
        }
    }

    /// Bytes read but not taken by a response yet.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// The server's leaf certificate (DER).
    pub fn peer_certificate(&self) -> Option<Vec<u8>> {
        let conn = self.tls.as_ref()?;
        Some(conn.peer_certificates()?.first()?.to_vec())
    }

    /// Writes `raw` as is.
    pub fn send(&mut self, raw: &[u8]) {
        self.write_raw(raw).expect("send");
    }

    /// Writes `raw` as is; the error, if any, is the caller's to judge.
    pub fn write_raw(&mut self, raw: &[u8]) -> std::io::Result<()> {
        match &mut self.tls {
            Some(conn) => rustls::Stream::new(&mut **conn, &mut self.stream).write_all(raw),
            None => self.stream.write_all(raw),
        }
    }

    fn read_raw(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match &mut self.tls {
            Some(conn) => {
                let n = rustls::Stream::new(&mut **conn, &mut self.stream).read(buf);
                // The server's TCP close without close_notify is its end of stream.
                match n {
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
                    n => n,
                }
            }
            None => self.stream.read(buf),
        }
    }

    /// Sends `raw` and reads one response.
    pub fn request(&mut self, raw: &[u8]) -> Response {
        self.send(raw);
        self.response()
    }

    /// Sends `raw` and reads one response; `None` when the write fails or the connection
    /// closes before a whole response head (a server still starting, or going away).
    pub fn try_request(&mut self, raw: &[u8]) -> Option<Response> {
        self.write_raw(raw).ok()?;
        while !self.buf.windows(4).any(|w| w == b"\r\n\r\n") {
            if !self.fill() {
                return None;
            }
        }
        Some(self.response())
    }

    /// Reads one response.
    pub fn response(&mut self) -> Response {
        self.response_to(false)
    }

    /// Reads one response; `head_only` for a response to HEAD (no body).
    pub fn response_to(&mut self, head_only: bool) -> Response {
        let (status, headers, n) = loop {
            let mut hs = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut hs);
            match r.parse(&self.buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let headers: Vec<(String, String)> = r
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_ascii_lowercase(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect();
                    break (r.code.unwrap(), headers, n);
                }
                Ok(httparse::Status::Partial) => {}
                Err(e) => panic!(
                    "bad response: {e}: {:?}",
                    String::from_utf8_lossy(&self.buf)
                ),
            }
            assert!(
                self.fill(),
                "connection closed before a response head: {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        };
        self.buf.drain(..n);
        let get = |k: &str| headers.iter().find(|(h, _)| h == k).map(|(_, v)| v.clone());
        let mut pieces = Vec::new();
        let mut body = Vec::new();
        if head_only || status == 204 || status == 304 || (100..200).contains(&status) {
        } else if let Some(len) = get("content-length") {
            let len: usize = len.parse().unwrap();
            while self.buf.len() < len {
                assert!(self.fill(), "closed mid-body");
            }
            body = self.buf.drain(..len).collect();
            pieces.push((Instant::now(), body.clone()));
        } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            loop {
                let (size, n) = loop {
                    if let Ok(httparse::Status::Complete((n, size))) =
                        httparse::parse_chunk_size(&self.buf)
                    {
                        break (size as usize, n);
                    }
                    assert!(self.fill(), "closed mid-chunk-size");
                };
                while self.buf.len() < n + size + 2 {
                    assert!(self.fill(), "closed mid-chunk");
                }
                let data: Vec<u8> = self.buf[n..n + size].to_vec();
                assert_eq!(&self.buf[n + size..n + size + 2], b"\r\n");
                self.buf.drain(..n + size + 2);
                if size == 0 {
                    break;
                }
                pieces.push((Instant::now(), data.clone()));
                body.extend_from_slice(&data);
            }
        } else {
            while self.fill() {}
            body = std::mem::take(&mut self.buf);
            pieces.push((Instant::now(), body.clone()));
        }
        Response {
            status,
            headers,
            body,
            pieces,
        }
    }

    /// Everything the peer sends until it closes (what was buffered first), raw.
    pub fn until_closed(&mut self) -> Vec<u8> {
        while self.fill() {}
        std::mem::take(&mut self.buf)
    }

    /// Reads until the peer closes; true if it closed (EOF or reset) within the read timeout.
    pub fn closed(&mut self) -> bool {
        let mut tmp = [0u8; 4096];
        loop {
            match self.read_raw(&mut tmp) {
                Ok(0) => return true,
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    return false;
                }
                Err(_) => return true,
            }
        }
    }

    fn fill(&mut self) -> bool {
        if self.tls.is_none() {
            return fill(&mut self.stream, &mut self.buf);
        }
        let mut tmp = [0u8; 16384];
        match self.read_raw(&mut tmp) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                true
            }
        }
    }
}

/// A POST with a JSON body.
pub fn post(path: &str, body: &str) -> Vec<u8> {
    post_with(path, "", body)
}

/// A POST with a JSON body and extra header lines (`name: value\r\n` each).
pub fn post_with(path: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A minimal chat completion request for `model`.
pub fn chat(model: &str) -> Vec<u8> {
    post(
        "/v1/chat/completions",
        &format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#),
    )
}

/// A completion request for model `m` whose prompt is `tag` (a test finds it in what the
/// worker saw), with extra header lines.
pub fn tagged(tag: &str, headers: &str) -> Vec<u8> {
    post_with(
        "/v1/completions",
        headers,
        &format!(r#"{{"model":"m","prompt":"{tag}"}}"#),
    )
}

/// A GET without a body.
pub fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: t\r\n\r\n").into_bytes()
}

/// One request on a fresh connection.
pub fn once(addr: SocketAddr, raw: &[u8]) -> Response {
    Client::connect(addr).request(raw)
}

/// Sends `raw` on a fresh connection from another thread; join for the response.
pub fn spawn_request(addr: SocketAddr, raw: Vec<u8>) -> std::thread::JoinHandle<Response> {
    std::thread::spawn(move || once(addr, &raw))
}
