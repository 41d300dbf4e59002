//! The mock engine's I/O: one monoio runtime on its own thread running the accept loop,
//! one task per connection, the scheduler task that drives [`Engine`] with the clock, and
//! the optional load pusher. Everything shares one `Rc<Mock>`; nothing crosses threads
//! except the stop signal.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use monoio::io::{AsyncWriteRentExt, Splitable};
use monoio::net::tcp::TcpOwnedWriteHalf;
use monoio::net::{TcpListener, TcpStream};

use super::MockConfig;
use super::openai::{self, Api, ApiError, DONE_EVENT, Generate, Renderer, Text, Usage};
use super::push::{self, Target};
use super::sim::{Engine, EngineConfig, Load, Micros, SeqId, Token};
use crate::core::reader::{ClientReader, ReadDone, read_more};
use crate::http::canned::{canonical_reason, status_line};
use crate::http::limits::INITIAL_READ_BUF;
use crate::http::request::{RequestHead, parse_request};
use crate::http::write::{LAST_CHUNK, chunk};
use crate::http::{BodyFraming, HttpError, Method};

/// Idle keep-alive connections close after this long: uvicorn's default, which vLLM and
/// SGLang run under (Spillway's pool closes its idle connections before that).
const KEEP_ALIVE_IDLE: Duration = Duration::from_secs(5);
const MAX_HEAD_BYTES: usize = 16 * 1024;
const MAX_BODY_BYTES: u64 = 32 * 1024 * 1024;

/// State of the mock shared by its tasks.
pub struct Mock {
    cfg: MockConfig,
    engine_cfg: EngineConfig,
    /// The served model as a JSON string, quotes included.
    model_json: String,
    epoch: Instant,
    engine: RefCell<Engine>,
    /// The connection waiting on each sequence.
    slots: RefCell<HashMap<SeqId, Rc<Slot>>>,
    /// Wakes the scheduler when a request arrives.
    kick: Signal,
}

impl Mock {
    fn now(&self) -> Micros {
        self.epoch.elapsed().as_micros() as Micros
    }

    pub fn load(&self) -> Load {
        self.engine.borrow().load()
    }

    pub fn engine_config(&self) -> &EngineConfig {
        &self.engine_cfg
    }
}

/// A one-waiter, level-triggered wakeup on one thread.
#[derive(Default)]
struct Signal {
    set: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Signal {
    fn notify(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.set.replace(false) {
                Poll::Ready(())
            } else {
                self.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await
    }
}

/// Where the scheduler leaves a sequence's progress for its connection.
#[derive(Default)]
struct Slot {
    generated: Cell<u32>,
    done: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

/// Aborts the sequence (freeing its blocks) when its connection stops waiting for it, on
/// every path: disconnect, write error, shutdown. A finished sequence is already gone.
struct SeqGuard<'a> {
    mock: &'a Mock,
    id: SeqId,
}

impl Drop for SeqGuard<'_> {
    fn drop(&mut self) {
        self.mock.slots.borrow_mut().remove(&self.id);
        if self.mock.engine.borrow_mut().abort(self.id) {
            tracing::debug!(seq = self.id, "sequence aborted");
        }
    }
}

/// Binds the listener (SO_REUSEADDR, no SO_REUSEPORT: two mocks never share a port).
pub fn bind(addr: SocketAddr) -> io::Result<StdListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// The mock's thread: runs until a byte arrives on `stop`.
pub fn run(
    cfg: MockConfig,
    engine_cfg: EngineConfig,
    listener: StdListener,
    stop: StdUnixStream,
    push: Option<(Target, String)>,
) {
    let mut rt = match crate::core::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the mock engine runtime");
            return;
        }
    };
    rt.block_on(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot adopt the mock engine listener");
                return;
            }
        };
        let push_interval = Duration::from_millis(cfg.push_interval_ms.max(1));
        let mock = Rc::new(Mock {
            model_json: serde_json::to_string(&cfg.model).unwrap_or_else(|_| "\"\"".into()),
            engine: RefCell::new(Engine::new(engine_cfg.clone())),
            engine_cfg,
            cfg,
            epoch: Instant::now(),
            slots: RefCell::new(HashMap::new()),
            kick: Signal::default(),
        });
        monoio::spawn(drive(mock.clone()));
        if let Some((target, worker)) = push {
            monoio::spawn(push::run(mock.clone(), target, worker, push_interval));
        }
        crate::core::accept_until_stopped(&listener, stop, "mock", |stream, _| {
            monoio::spawn(serve(mock.clone(), stream));
        })
        .await;
    });
}

/// The scheduler: advances the engine to the clock, hands tokens to their connections,
/// and sleeps until the step under way ends or a request arrives.
async fn drive(mock: Rc<Mock>) {
    let mut tokens: Vec<Token> = Vec::new();
    loop {
        let now = mock.now();
        let deadline = {
            let mut engine = mock.engine.borrow_mut();
            engine.advance(now, &mut tokens);
            engine.next_deadline()
        };
        {
            let slots = mock.slots.borrow();
            for t in tokens.drain(..) {
                if let Some(slot) = slots.get(&t.id) {
                    slot.generated.set(t.index + 1);
                    slot.done.set(t.last);
                    if let Some(w) = slot.waker.take() {
                        w.wake();
                    }
                }
            }
        }
        match deadline {
            Some(d) => {
                // The timer counts whole milliseconds: round up, never wake early.
                let wait = Duration::from_millis(d.saturating_sub(now).div_ceil(1000));
                monoio::select! {
                    _ = monoio::time::sleep(wait) => {},
                    _ = mock.kick.wait() => {},
                }
            }
            None => mock.kick.wait().await,
        }
    }
}

async fn serve(mock: Rc<Mock>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (read_half, writer) = stream.into_split();
    let reader = std::pin::pin!(ClientReader::new(
        read_half,
        Vec::with_capacity(INITIAL_READ_BUF),
        read_more
    ));
    let mut conn = Conn {
        mock,
        writer,
        out: Vec::with_capacity(4096),
        event: Vec::with_capacity(512),
        head: RequestHead::default(),
    };
    conn.run(reader).await;
}

struct Conn {
    mock: Rc<Mock>,
    writer: TcpOwnedWriteHalf,
    /// What the next write sends.
    out: Vec<u8>,
    /// One event being rendered, before chunk framing.
    event: Vec<u8>,
    head: RequestHead,
}

/// What a request asks for, decided before its bytes leave the read buffer.
enum Action {
    Reply {
        status: u16,
        content_type: &'static str,
        body: Vec<u8>,
    },
    Generate(Generate),
}

impl Action {
    fn error(e: ApiError) -> Action {
        Action::Reply {
            status: e.status,
            content_type: "application/json",
            body: e.body(),
        }
    }
}

impl Conn {
    async fn run<F: Future<Output = ReadDone>>(&mut self, mut reader: Pin<&mut ClientReader<F>>) {
        loop {
            let total = match self.read_request(reader.as_mut()).await {
                Ok(Some(total)) => total,
                Ok(None) => return,
                Err(e) => {
                    let status = e.status();
                    let body = ApiError {
                        status,
                        kind: canonical_reason(status),
                        message: e.to_string(),
                    }
                    .body();
                    self.reply(status, "application/json", &body, false, true);
                    let _ = self.flush().await;
                    return;
                }
            };
            // HTTP/1.0 keep-alive is not worth its special cases here: such clients get a close.
            let keep = self.head.keep_alive && self.head.minor_version == 1;
            let with_body = self.head.method != Method::Head;
            let action = self.decide(&reader.buf()[..total]);
            reader.as_mut().consume(total, INITIAL_READ_BUF);
            let keep = match action {
                Action::Reply {
                    status,
                    content_type,
                    body,
                } => {
                    self.reply(status, content_type, &body, keep, with_body);
                    self.flush().await && keep
                }
                Action::Generate(g) => self.generate(reader.as_mut(), g, keep).await,
            };
            if !keep {
                return;
            }
        }
    }

    /// Reads one request head and its Content-Length body; returns the request's length.
    /// `None`: the client closed or idled out between requests.
    async fn read_request<F: Future<Output = ReadDone>>(
        &mut self,
        mut reader: Pin<&mut ClientReader<F>>,
    ) -> Result<Option<usize>, HttpError> {
        loop {
            if !reader.buf().is_empty() && !reader.is_reading() {
                match parse_request(reader.buf(), MAX_HEAD_BYTES, MAX_BODY_BYTES, &mut self.head) {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => return Err(e),
                }
            }
            match monoio::time::timeout(KEEP_ALIVE_IDLE, reader.as_mut().fill()).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return Ok(None),
            }
        }
        let total = match self.head.body {
            BodyFraming::None | BodyFraming::UntilClose => return Ok(Some(self.head.head_len)),
            BodyFraming::Length(n) => self.head.head_len + n as usize,
            BodyFraming::Chunked => {
                return Err(HttpError::Malformed(
                    "chunked request bodies are not supported; send Content-Length",
                ));
            }
        };
        reader.as_mut().reserve_total(total);
        if self.head.expect_continue && reader.buf().len() < total {
            self.out.clear();
            self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            if !self.flush().await {
                return Ok(None);
            }
        }
        while reader.buf().len() < total {
            match monoio::time::timeout(KEEP_ALIVE_IDLE, reader.as_mut().fill()).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return Ok(None),
            }
        }
        Ok(Some(total))
    }

    fn decide(&self, request: &[u8]) -> Action {
        let cfg = &self.mock.cfg;
        let body = &request[self.head.head_len..];
        let method = self.head.method;
        let api = match self.head.path(request) {
            b"/v1/chat/completions" => Api::Chat,
            b"/v1/completions" => Api::Completions,
            b"/health" if matches!(method, Method::Get | Method::Head) => {
                return Action::Reply {
                    status: 200,
                    content_type: "text/plain; charset=utf-8",
                    body: Vec::new(),
                };
            }
            b"/metrics" if matches!(method, Method::Get | Method::Head) => {
                let mut text = String::with_capacity(2048);
                super::metrics::render(
                    &mut text,
                    &cfg.model,
                    &self.mock.engine_cfg,
                    &self.mock.load(),
                );
                return Action::Reply {
                    status: 200,
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    body: text.into_bytes(),
                };
            }
            b"/v1/models" if matches!(method, Method::Get | Method::Head) => {
                let mut body = Vec::with_capacity(256);
                openai::models(&mut body, &self.mock.model_json, unix_now());
                return Action::Reply {
                    status: 200,
                    content_type: "application/json",
                    body,
                };
            }
            b"/health" | b"/metrics" | b"/v1/models" => {
                return Action::error(ApiError {
                    status: 405,
                    kind: "MethodNotAllowed",
                    message: "Method Not Allowed".into(),
                });
            }
            _ => return Action::error(ApiError::not_found("Not Found")),
        };
        if method != Method::Post {
            return Action::error(ApiError {
                status: 405,
                kind: "MethodNotAllowed",
                message: "Method Not Allowed".into(),
            });
        }
        match openai::parse(api, body, &cfg.model, cfg.default_max_tokens) {
            Ok(g) => Action::Generate(g),
            Err(e) => Action::error(e),
        }
    }

    /// Runs one generation: submits it, then relays its tokens as they are produced,
    /// streaming them or collecting them into one body. Returns whether the connection
    /// stays open.
    async fn generate<F: Future<Output = ReadDone>>(
        &mut self,
        mut reader: Pin<&mut ClientReader<F>>,
        g: Generate,
        keep_alive: bool,
    ) -> bool {
        let mock = self.mock.clone();
        let submitted = mock
            .engine
            .borrow_mut()
            .submit(mock.now(), g.prompt_tokens, g.max_tokens);
        let id = match submitted {
            Ok(id) => id,
            Err(e) => {
                let body = ApiError::bad_request(e.to_string()).body();
                self.reply(400, "application/json", &body, keep_alive, true);
                return self.flush().await && keep_alive;
            }
        };
        let slot = Rc::new(Slot::default());
        mock.slots.borrow_mut().insert(id, slot.clone());
        let _guard = SeqGuard { mock: &mock, id };
        mock.kick.notify();

        let renderer = Renderer {
            api: g.api,
            id: mix(mock.cfg.seed, id),
            created: unix_now(),
            model_json: &mock.model_json,
        };
        let mut text = Text::new(mock.cfg.seed, id);
        // HTTP/1.0 has no chunked encoding: a stream is then delimited by the close.
        let chunked = self.head.minor_version == 1;
        let keep_alive = keep_alive && (chunked || !g.stream);
        tracing::debug!(
            seq = id,
            prompt_tokens = g.prompt_tokens,
            max_tokens = g.max_tokens,
            stream = g.stream,
            "request queued"
        );
        if g.stream {
            self.out.clear();
            head(
                &mut self.out,
                200,
                "text/event-stream",
                None,
                chunked,
                keep_alive,
            );
            if !self.flush().await {
                return false;
            }
        }
        let mut content = String::new();
        let mut sent = 0u32;
        reader.as_mut().watch();
        loop {
            let woke = std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = reader.as_mut().poll_read(cx) {
                    return Poll::Ready(Some(r));
                }
                if slot.generated.get() > sent || slot.done.get() {
                    return Poll::Ready(None);
                }
                slot.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            })
            .await;
            match woke {
                Some(Ok(0)) | Some(Err(_)) => {
                    tracing::debug!(seq = id, tokens = sent, "client left");
                    return false;
                }
                // A pipelined request: it stays buffered for after this one.
                Some(Ok(_)) => continue,
                None => {}
            }
            let (generated, done) = (slot.generated.get(), slot.done.get());
            self.out.clear();
            while sent < generated {
                let (space, word) = text.next_token();
                sent += 1;
                let finish = (done && sent == generated).then_some(g.finish);
                if !g.stream {
                    content.push_str(space);
                    content.push_str(word);
                    continue;
                }
                if sent == 1 && g.api == Api::Chat {
                    self.event(chunked, |e| renderer.role_event(e));
                }
                self.event(chunked, |e| renderer.token_event(e, &[space, word], finish));
            }
            if !done {
                if !self.flush().await {
                    tracing::debug!(seq = id, tokens = sent, "client left mid-stream");
                    return false;
                }
                continue;
            }
            let usage = Usage {
                prompt_tokens: g.prompt_tokens,
                completion_tokens: sent,
            };
            if g.stream {
                if g.include_usage {
                    self.event(chunked, |e| renderer.usage_event(e, usage));
                }
                self.event(chunked, |e| e.extend_from_slice(DONE_EVENT));
                if chunked {
                    self.out.extend_from_slice(LAST_CHUNK);
                }
            } else {
                self.event.clear();
                renderer.response(&mut self.event, &content, g.finish, usage);
                head(
                    &mut self.out,
                    200,
                    "application/json",
                    Some(self.event.len()),
                    true,
                    keep_alive,
                );
                self.out.extend_from_slice(&self.event);
            }
            tracing::debug!(seq = id, completion_tokens = sent, "request finished");
            return self.flush().await && keep_alive;
        }
    }

    /// Renders one event with `f` and appends it to the output as its own chunk.
    fn event(&mut self, chunked: bool, f: impl FnOnce(&mut Vec<u8>)) {
        self.event.clear();
        f(&mut self.event);
        if chunked {
            chunk(&mut self.out, &self.event);
        } else {
            self.out.extend_from_slice(&self.event);
        }
    }

    fn reply(
        &mut self,
        status: u16,
        content_type: &str,
        body: &[u8],
        keep_alive: bool,
        with_body: bool,
    ) {
        self.out.clear();
        head(
            &mut self.out,
            status,
            content_type,
            Some(body.len()),
            true,
            keep_alive,
        );
        if with_body {
            self.out.extend_from_slice(body);
        }
    }

    /// Writes `out`; false when the client is gone.
    async fn flush(&mut self) -> bool {
        if self.out.is_empty() {
            return true;
        }
        let (res, buf) = self.writer.write_all(std::mem::take(&mut self.out)).await;
        self.out = buf;
        self.out.clear();
        res.is_ok()
    }
}

/// A response head. `length`: Content-Length, else chunked (or close-delimited when the
/// client cannot take chunks).
fn head(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    length: Option<usize>,
    chunked: bool,
    keep_alive: bool,
) {
    status_line(out, status, canonical_reason(status).as_bytes());
    out.extend_from_slice(b"content-type: ");
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(b"\r\n");
    match length {
        Some(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        None if chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        None => {}
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A response id from the seed and the sequence id (splitmix64's finalizer).
fn mix(seed: u64, id: SeqId) -> u64 {
    let mut x = seed ^ id.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
