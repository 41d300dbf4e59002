//! Fake workers: plain threads serving blocking sockets on port 0, answering each request
//! as the test's handler says and recording what they received.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One request as the fake worker received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The head as received, request line to blank line.
    pub head: Vec<u8>,
    /// Requests received before this one on its connection (0: the connection's first).
    pub on_connection: usize,
}

impl Seen {
    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8).
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// What the fake worker does with a request.
pub enum Reply {
    /// Write these bytes (a whole response); keep the connection open.
    Raw(Vec<u8>),
    /// Run these steps in order; keep the connection open unless one closes it.
    Steps(Vec<Step>),
    /// Close without answering.
    Close,
}

/// One step of a [`Reply::Steps`].
pub enum Step {
    /// Write these bytes.
    Write(Vec<u8>),
    /// Pause.
    Sleep(Duration),
    /// Write these bytes one at a time, pausing this long before each.
    Trickle(Vec<u8>, Duration),
    /// Block reading until the proxy closes the connection, record when, then close.
    WaitClose,
    /// Close the connection.
    Close,
    /// Reset the connection (RST: SO_LINGER 0, then close).
    Reset,
}

/// What a fake worker has seen, shared with its threads.
#[derive(Debug, Default)]
pub struct UpstreamState {
    /// Requests in arrival order.
    pub seen: Mutex<Vec<Seen>>,
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// Requests being answered now.
    pub active: AtomicUsize,
    /// The most requests ever answered at once.
    pub max_active: AtomicUsize,
    /// When the proxy closed connections a [`Step::WaitClose`] waited on.
    pub closed_by_peer: Mutex<Vec<Instant>>,
    /// Bytes a connection ended with that never formed a whole request.
    pub unparsed: Mutex<Vec<Vec<u8>>>,
}

/// A running fake worker; stops accepting when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    pub state: Arc<UpstreamState>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// How many requests were received so far.
    pub fn count(&self) -> usize {
        self.state.seen.lock().unwrap().len()
    }

    /// How many connections were accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Bytes connections ended with that never formed a whole request.
    pub fn unparsed(&self) -> Vec<Vec<u8>> {
        self.state.unparsed.lock().unwrap().clone()
    }

    /// When the proxy closed connections a [`Step::WaitClose`] waited on.
    pub fn closed_by_peer(&self) -> Vec<Instant> {
        self.state.closed_by_peer.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees `stop`.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Starts a fake worker answering every request with `handler`.
pub fn upstream(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Upstream {
    upstream_at("127.0.0.1", handler)
}

/// [`upstream`] on another loopback address (`127.0.0.2`, ...), as a second node's.
pub fn upstream_at(ip: &str, handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Upstream {
    serve_on(TcpListener::bind((ip, 0)).unwrap(), handler)
}

/// [`upstream`] at exactly `addr` (workers that share a port on several addresses, as
/// DNS A records give them); `None` when it is taken.
pub fn upstream_on(
    addr: SocketAddr,
    handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
) -> Option<Upstream> {
    TcpListener::bind(addr).ok().map(|l| serve_on(l, handler))
}

fn serve_on(
    listener: TcpListener,
    handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
) -> Upstream {
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(UpstreamState::default());
    let stop = Arc::new(AtomicBool::new(false));
    let handler = Arc::new(handler);
    {
        let state = state.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                state.connections.fetch_add(1, Ordering::SeqCst);
                let state = state.clone();
                let handler = handler.clone();
                std::thread::spawn(move || serve(stream, &state, &*handler));
            }
        });
    }
    Upstream { addr, state, stop }
}

/// A worker that always answers 200 with `{"worker":"<name>"}`.
pub fn echo_upstream(name: &'static str) -> Upstream {
    upstream(move |_| Reply::Raw(json_response(200, &format!(r#"{{"worker":"{name}"}}"#))))
}

fn serve(
    mut stream: TcpStream,
    state: &UpstreamState,
    handler: &(dyn Fn(&Seen) -> Reply + Send + Sync),
) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    let mut on_connection = 0;
    while let Some(mut seen) = read_request(&mut stream, &mut buf) {
        seen.on_connection = on_connection;
        on_connection += 1;
        let n = state.active.fetch_add(1, Ordering::SeqCst) + 1;
        state.max_active.fetch_max(n, Ordering::SeqCst);
        state.seen.lock().unwrap().push(seen.clone());
        let keep = match handler(&seen) {
            Reply::Raw(bytes) => stream.write_all(&bytes).is_ok(),
            Reply::Close => false,
            Reply::Steps(steps) => run_steps(&mut stream, state, steps),
        };
        state.active.fetch_sub(1, Ordering::SeqCst);
        if !keep {
            return;
        }
    }
    if !buf.is_empty() {
        state.unparsed.lock().unwrap().push(buf);
    }
}

/// Runs `steps`; false when the connection is to be closed.
fn run_steps(stream: &mut TcpStream, state: &UpstreamState, steps: Vec<Step>) -> bool {
    for step in steps {
        match step {
            Step::Write(b) => {
                if stream.write_all(&b).is_err() {
                    return false;
                }
            }
            Step::Sleep(d) => std::thread::sleep(d),
            Step::Trickle(bytes, every) => {
                for b in bytes {
                    std::thread::sleep(every);
                    if stream.write_all(&[b]).is_err() {
                        return false;
                    }
                }
            }
            Step::Reset => {
                let _ = socket2::SockRef::from(&*stream).set_linger(Some(Duration::ZERO));
                return false;
            }
            Step::WaitClose => {
                let mut sink = [0u8; 1024];
                while let Ok(1..) = stream.read(&mut sink) {}
                state.closed_by_peer.lock().unwrap().push(Instant::now());
                return false;
            }
            Step::Close => return false,
        }
    }
    true
}

/// Reads one request (head and Content-Length body) from `stream`, keeping what follows
/// in `buf`; `None` when the connection ends first.
fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Seen> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(n)) = req.parse(buf) {
            let headers: Vec<(String, String)> = req
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            let len: usize = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            let method = req.method.unwrap_or("").to_string();
            let path = req.path.unwrap_or("").to_string();
            while buf.len() < n + len {
                if !fill(stream, buf) {
                    return None;
                }
            }
            let body = buf[n..n + len].to_vec();
            let head = buf[..n].to_vec();
            buf.drain(..n + len);
            return Some(Seen {
                method,
                path,
                headers,
                body,
                head,
                on_connection: 0,
            });
        }
        if !fill(stream, buf) {
            return None;
        }
    }
}

/// Appends one read to `buf`; false on EOF or error.
pub(crate) fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut tmp = [0u8; 8192];
    match stream.read(&mut tmp) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&tmp[..n]);
            true
        }
    }
}

/// A whole response with a JSON body and Content-Length.
pub fn json_response(status: u16, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// `data` as one chunk of a chunked body.
pub fn chunk(data: &str) -> Vec<u8> {
    format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
}

/// The head of a chunked `text/event-stream` response.
pub const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

/// A worker that holds every request until the test releases it (in arrival order), then
/// answers 200 with `{"worker":"<name>","body":<request body>}`.
pub struct Held {
    pub up: Upstream,
    /// (requests arrived, requests released).
    gate: Arc<(Mutex<(usize, usize)>, Condvar)>,
}

impl Held {
    /// Starts a holding worker named `name`.
    pub fn new(name: &'static str) -> Held {
        let gate: Arc<(Mutex<(usize, usize)>, Condvar)> = Arc::default();
        let g = gate.clone();
        let up = upstream(move |s| {
            let (lock, cv) = &*g;
            let mut st = lock.lock().unwrap();
            let me = st.0;
            st.0 += 1;
            while st.1 <= me {
                st = cv.wait(st).unwrap();
            }
            Reply::Raw(json_response(
                200,
                &format!(r#"{{"worker":"{name}","body":{}}}"#, s.body_str()),
            ))
        });
        Held { up, gate }
    }

    /// Lets the next `n` held (or future) requests answer.
    pub fn release(&self, n: usize) {
        let (lock, cv) = &*self.gate;
        lock.lock().unwrap().1 += n;
        cv.notify_all();
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        self.up.url()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release(1 << 20);
    }
}
