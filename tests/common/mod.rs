#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Test kit: in-process fake upstreams on port 0 (plain threads, blocking sockets), a raw
//! HTTP/1.1 client, and a proxy started in-process from a TOML snippet.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use spillway::ServerHandle;

// ---------------------------------------------------------------------------- upstream

/// One request as the fake upstream received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub conn: usize,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// What the fake upstream does with a request.
pub enum Reply {
    /// Write these bytes (a whole response); keep the connection open.
    Raw(Vec<u8>),
    /// Write pieces with pauses, then keep going (or close with `Step::Close`).
    Steps(Vec<Step>),
    /// Close without answering.
    Close,
}

pub enum Step {
    Write(Vec<u8>),
    Sleep(Duration),
    /// Block reading until the proxy closes the connection; records when.
    WaitClose,
    Close,
}

#[derive(Default)]
pub struct UpstreamState {
    pub seen: Mutex<Vec<Seen>>,
    pub connections: AtomicUsize,
    pub active: AtomicUsize,
    pub max_active: AtomicUsize,
    pub closed_by_peer: Mutex<Vec<Instant>>,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub state: Arc<UpstreamState>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }
    pub fn count(&self) -> usize {
        self.state.seen.lock().unwrap().len()
    }
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }
    pub fn closed_by_peer(&self) -> Vec<Instant> {
        self.state.closed_by_peer.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// A fake worker answering every request with `handler`.
pub fn upstream(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(UpstreamState::default());
    let stop = Arc::new(AtomicBool::new(false));
    let handler = Arc::new(handler);
    {
        let state = state.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            for (id, stream) in listener.incoming().enumerate() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                state.connections.fetch_add(1, Ordering::SeqCst);
                let state = state.clone();
                let handler = handler.clone();
                std::thread::spawn(move || serve_upstream(id, stream, &state, &*handler));
            }
        });
    }
    Upstream { addr, state, stop }
}

/// A worker that always answers 200 with a JSON body naming itself.
pub fn echo_upstream(name: &'static str) -> Upstream {
    upstream(move |_| Reply::Raw(json_response(200, &format!(r#"{{"worker":"{name}"}}"#))))
}

fn serve_upstream(
    id: usize,
    mut stream: TcpStream,
    state: &UpstreamState,
    handler: &(dyn Fn(&Seen) -> Reply + Send + Sync),
) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    loop {
        let Some(seen) = read_request(&mut stream, &mut buf, id) else {
            return;
        };
        let n = state.active.fetch_add(1, Ordering::SeqCst) + 1;
        state.max_active.fetch_max(n, Ordering::SeqCst);
        state.seen.lock().unwrap().push(seen.clone());
        let reply = handler(&seen);
        let keep = match reply {
            Reply::Raw(bytes) => stream.write_all(&bytes).is_ok(),
            Reply::Close => false,
            Reply::Steps(steps) => {
                let mut keep = true;
                for step in steps {
                    match step {
                        Step::Write(b) => {
                            if stream.write_all(&b).is_err() {
                                keep = false;
                                break;
                            }
                        }
                        Step::Sleep(d) => std::thread::sleep(d),
                        Step::WaitClose => {
                            let mut sink = [0u8; 1024];
                            loop {
                                match stream.read(&mut sink) {
                                    Ok(0) | Err(_) => break,
                                    Ok(_) => {}
                                }
                            }
                            state.closed_by_peer.lock().unwrap().push(Instant::now());
                            keep = false;
                            break;
                        }
                        Step::Close => {
                            keep = false;
                            break;
                        }
                    }
                }
                keep
            }
        };
        state.active.fetch_sub(1, Ordering::SeqCst);
        if !keep {
            return;
        }
    }
}

fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>, conn: usize) -> Option<Seen> {
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
            buf.drain(..n + len);
            return Some(Seen {
                method,
                path,
                headers,
                body,
                conn,
            });
        }
        if !fill(stream, buf) {
            return None;
        }
    }
}

fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut tmp = [0u8; 8192];
    match stream.read(&mut tmp) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&tmp[..n]);
            true
        }
    }
}

pub fn json_response(status: u16, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

pub fn chunk(data: &str) -> Vec<u8> {
    format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
}

pub const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

// ---------------------------------------------------------------------------- proxy

/// Starts Spillway from a TOML snippet; listeners on port 0, threads unpinned.
pub fn proxy(cores: usize, toml: &str) -> ServerHandle {
    proxy_with(cores, toml, spillway::Overrides::default())
}

pub fn proxy_with(cores: usize, toml: &str, overrides: spillway::Overrides) -> ServerHandle {
    let text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ncores = {cores}\npin_cores = false\n{toml}"
    );
    let config =
        spillway::Config::parse(&text, &overrides).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let source = spillway::monitor::ConfigSource {
        path: None,
        overrides,
    };
    spillway::start(config, source).expect("proxy starts")
}

/// A `[[models]]` block with these worker URLs, each named after its port (`w<port>`).
pub fn model(name: &str, extra: &str, urls: &[String]) -> String {
    let mut s = format!("[[models]]\nname = \"{name}\"\n{extra}\n");
    for u in urls {
        s.push_str(&format!(
            "[[models.workers]]\nurl = \"{u}\"\nname = \"{}\"\n",
            worker_name(u)
        ));
    }
    s
}

/// The name [`model`] gives the worker at `url`.
pub fn worker_name(url: &str) -> String {
    format!("w{}", url.rsplit(':').next().unwrap_or("0"))
}

// ---------------------------------------------------------------------------- client

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Body pieces (de-chunked) with their arrival times.
    pub pieces: Vec<(Instant, Vec<u8>)>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
}

pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let _ = stream.set_nodelay(true);
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, raw: &[u8]) {
        self.stream.write_all(raw).expect("send");
    }

    pub fn request(&mut self, raw: &[u8]) -> Response {
        self.send(raw);
        self.response()
    }

    /// Reads one response; `head_only` for responses to HEAD.
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

    pub fn response(&mut self) -> Response {
        self.response_to(false)
    }

    /// Reads until the peer closes; true if it closed (EOF or reset) within the read timeout.
    pub fn closed(&mut self) -> bool {
        let mut tmp = [0u8; 4096];
        loop {
            match self.stream.read(&mut tmp) {
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
        let mut tmp = [0u8; 8192];
        match self.stream.read(&mut tmp) {
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
    format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

pub fn chat(model: &str) -> Vec<u8> {
    post(
        "/v1/chat/completions",
        &format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#),
    )
}

pub fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: t\r\n\r\n").into_bytes()
}

/// One request on a fresh connection.
pub fn once(addr: SocketAddr, raw: &[u8]) -> Response {
    Client::connect(addr).request(raw)
}

/// Polls `cond` until true or the deadline (for effects that land asynchronously).
pub fn eventually(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("timed out waiting for: {what}");
}

// ---------------------------------------------------------------------------- admin

pub fn admin_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> Response {
    let ct = content_type
        .map(|c| format!("content-type: {c}\r\n"))
        .unwrap_or_default();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nhost: admin\r\n{ct}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    once(addr, raw.as_bytes())
}

pub fn admin_post(addr: SocketAddr, path: &str, body: &str) -> Response {
    admin_call(addr, "POST", path, Some("application/json"), body)
}

pub fn admin_get(addr: SocketAddr, path: &str) -> Response {
    admin_call(addr, "GET", path, None, "")
}

pub fn metrics(addr: SocketAddr) -> String {
    admin_get(addr, "/metrics").text()
}

/// The value of one series in a metrics text (`name{labels}` exactly as rendered).
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l[series.len()..].trim().parse().ok())
}

/// `promtool check metrics` over `text`: the problems it reports (empty when it passes),
/// or `None` when promtool cannot run (an error instead under `SPILLWAY_REQUIRE_PROMTOOL`).
pub fn promtool_problems(text: &str) -> Option<Vec<String>> {
    use std::process::{Command, Stdio};
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            assert!(
                std::env::var_os("SPILLWAY_REQUIRE_PROMTOOL").is_none(),
                "promtool is required but cannot run: {e}"
            );
            eprintln!("promtool not found; skipping the exposition lint ({e})");
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let problems: Vec<String> = report
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    if !out.status.success() && problems.is_empty() {
        return Some(vec![format!("promtool failed: {}", out.status)]);
    }
    Some(problems)
}

// ---------------------------------------------------------------------------- held worker

/// A worker that holds every request until the test releases it (in arrival order), then
/// answers 200 with `{"worker":name,"body":<request body>}`.
pub struct Held {
    pub up: Upstream,
    gate: Arc<(Mutex<(usize, usize)>, std::sync::Condvar)>,
}

impl Held {
    pub fn new(name: &'static str) -> Held {
        let gate: Arc<(Mutex<(usize, usize)>, std::sync::Condvar)> = Arc::default();
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

    pub fn url(&self) -> String {
        self.up.url()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release(1 << 20);
    }
}

/// Sends `raw` on a fresh connection from another thread; join for the response.
pub fn spawn_request(addr: SocketAddr, raw: Vec<u8>) -> std::thread::JoinHandle<Response> {
    std::thread::spawn(move || once(addr, &raw))
}

// ---------------------------------------------------------------------------- config files

/// A config file in a fresh temp directory (removed on drop).
pub struct ConfigFile {
    pub dir: std::path::PathBuf,
    pub path: std::path::PathBuf,
}

impl ConfigFile {
    pub fn new(text: &str) -> ConfigFile {
        use std::sync::atomic::AtomicU64;
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "spillway-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("spillway.toml");
        std::fs::write(&path, text).unwrap();
        ConfigFile { dir, path }
    }

    pub fn write(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The common head of test configs: port 0 listeners, unpinned threads.
pub fn test_head(cores: usize) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ncores = {cores}\npin_cores = false\n"
    )
}

/// Starts Spillway from a config file (so it can reload it).
pub fn proxy_file(file: &ConfigFile) -> ServerHandle {
    let overrides = spillway::Overrides::default();
    let config = spillway::Config::load(&file.path, &overrides).unwrap_or_else(|e| panic!("{e}"));
    let source = spillway::monitor::ConfigSource {
        path: Some(file.path.clone()),
        overrides,
    };
    spillway::start(config, source).expect("proxy starts")
}
