//! One client connection: read a request, decide what it asks for, answer it (or run its
//! generation, in `generate.rs`), and go on while keep-alive lasts.

use std::rc::Rc;
use std::time::Duration;

use monoio::io::{AsyncWriteRentExt, Splitable};
use monoio::net::TcpStream;
use monoio::net::tcp::TcpOwnedWriteHalf;

use super::Mock;
use super::handoff::Job;
use crate::clock;
use crate::fault::{self, Behaviour};
use crate::http::{self, HttpError, INITIAL_READ_BUF, Method, RequestHead, parse_request};
use crate::openai::{self, Api, ApiError};
use crate::reader::Reader;

/// Idle keep-alive connections close after this long: uvicorn's default, which vLLM and
/// SGLang run under (Spillway's pool closes its idle connections before that).
const KEEP_ALIVE_IDLE: Duration = Duration::from_secs(5);
const MAX_HEAD_BYTES: usize = 16 * 1024;
const MAX_BODY_BYTES: u64 = 32 * 1024 * 1024;

pub async fn serve(mock: Rc<Mock>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (read_half, writer) = stream.into_split();
    let mut conn = Conn {
        mock,
        reader: Reader::new(read_half, Vec::with_capacity(INITIAL_READ_BUF)),
        writer,
        out: Vec::with_capacity(4096),
        event: Vec::with_capacity(512),
    };
    conn.run().await;
}

pub(super) struct Conn {
    pub(super) mock: Rc<Mock>,
    pub(super) reader: Reader,
    writer: TcpOwnedWriteHalf,
    /// What the next write sends.
    pub(super) out: Vec<u8>,
    /// One event being rendered, before chunk framing.
    pub(super) event: Vec<u8>,
}

/// What a request asks for, decided before its bytes leave the read buffer.
enum Action {
    Reply {
        status: u16,
        content_type: &'static str,
        body: Vec<u8>,
    },
    Generate(Job),
    /// Never answer (a fault mode): the connection stays open until the client leaves.
    Hang,
}

impl Action {
    fn error(e: ApiError) -> Action {
        Action::Reply {
            status: e.status,
            content_type: "application/json",
            body: e.body(),
        }
    }

    fn method_not_allowed() -> Action {
        Action::error(ApiError {
            status: 405,
            kind: "MethodNotAllowed",
            message: "Method Not Allowed".into(),
        })
    }
}

impl Conn {
    async fn run(&mut self) {
        loop {
            let (head, total) = match self.read_request().await {
                Ok(Some(request)) => request,
                Ok(None) => return,
                // A hung engine answers nothing, not even malformed requests.
                Err(_) if self.mock.fault.hung() => return self.hang().await,
                Err(e) => {
                    let status = e.status();
                    let body = ApiError {
                        status,
                        kind: http::canonical_reason(status),
                        message: e.to_string(),
                    }
                    .body();
                    self.reply(status, "application/json", &body, false, true);
                    let _ = self.flush().await;
                    return;
                }
            };
            // HTTP/1.0 keep-alive is not worth its special cases here: such clients get a close.
            let keep = head.keep_alive && head.minor_version == 1;
            let with_body = head.method != Method::Head;
            let action = self.decide(&head, &self.reader.buf()[head.head_len..total]);
            self.reader.consume(total, INITIAL_READ_BUF);
            let keep = match action {
                Action::Reply {
                    status,
                    content_type,
                    body,
                } => {
                    self.reply(status, content_type, &body, keep, with_body);
                    self.flush().await && keep
                }
                Action::Generate(job) => self.generate(job, head.minor_version == 1, keep).await,
                Action::Hang => {
                    self.hang().await;
                    false
                }
            };
            if !keep {
                return;
            }
        }
    }

    /// Reads one request head and its Content-Length body; returns the head and the
    /// request's length. `None`: the client closed or idled out between requests.
    async fn read_request(&mut self) -> Result<Option<(RequestHead, usize)>, HttpError> {
        let head = loop {
            let buf = self.reader.buf();
            if !buf.is_empty()
                && !self.reader.is_reading()
                && let Some(head) = parse_request(buf, MAX_HEAD_BYTES, MAX_BODY_BYTES)?
            {
                break head;
            }
            if !self.fill().await {
                return Ok(None);
            }
        };
        let total = head.head_len + head.content_length as usize;
        self.reader.reserve_total(total);
        if head.expect_continue && self.reader.buf().len() < total && !self.mock.fault.hung() {
            self.out.clear();
            self.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            if !self.flush().await {
                return Ok(None);
            }
        }
        while self.reader.buf().len() < total {
            if !self.fill().await {
                return Ok(None);
            }
        }
        Ok(Some((head, total)))
    }

    /// Reads more of the request; false when the client closed, failed or idled out. A
    /// hung engine closes nothing: while it hangs, an idle connection stays open.
    async fn fill(&mut self) -> bool {
        loop {
            // A timeout leaves the read in flight in the reader; the next call resumes it.
            match monoio::time::timeout(KEEP_ALIVE_IDLE, self.reader.fill()).await {
                Ok(Ok(n)) => return n > 0,
                Ok(Err(_)) => return false,
                Err(_) if self.mock.fault.hung() => {}
                Err(_) => return false,
            }
        }
    }

    /// Answers nothing: reads and drops whatever the client sends until it closes.
    async fn hang(&mut self) {
        tracing::debug!("request left unanswered (fault mode)");
        self.reader.consume(usize::MAX, INITIAL_READ_BUF);
        while matches!(self.reader.fill().await, Ok(n) if n > 0) {
            self.reader.consume(usize::MAX, INITIAL_READ_BUF);
        }
    }

    /// `/fault` and `/last_request` (always answered), then what the fault mode in force
    /// does to this path.
    fn fault_action(&self, head: &RequestHead, body: &[u8]) -> Option<Action> {
        let state = &self.mock.fault;
        if head.path == "/last_request" {
            if !matches!(head.method, Method::Get | Method::Head) {
                return Some(Action::method_not_allowed());
            }
            return Some(Action::Reply {
                status: 200,
                content_type: "application/json",
                body: self.mock.last_request.borrow().clone(),
            });
        }
        if head.path == "/fault" {
            match head.method {
                Method::Get | Method::Head => {}
                Method::Post => match fault::parse_switch(body) {
                    Ok((mode, period)) => {
                        state.set(mode, period, clock::now());
                        tracing::info!(fault = %mode, "fault mode switched");
                    }
                    Err(e) => return Some(Action::error(ApiError::bad_request(e))),
                },
                Method::Other => return Some(Action::method_not_allowed()),
            }
            return Some(Action::Reply {
                status: 200,
                content_type: "application/json",
                body: fault::render(state.mode(), state.period()),
            });
        }
        let api = head.path.starts_with("/v1/");
        match state.behaviour(clock::now()) {
            Behaviour::HangAll => Some(Action::Hang),
            Behaviour::HangApi if api => Some(Action::Hang),
            Behaviour::Fail if api => Some(Action::Reply {
                status: 500,
                content_type: "application/json",
                body: fault::FAIL_BODY.to_vec(),
            }),
            _ => None,
        }
    }

    fn decide(&self, head: &RequestHead, body: &[u8]) -> Action {
        if head.method == Method::Post && head.path.starts_with("/v1/") {
            let mut last = self.mock.last_request.borrow_mut();
            last.clear();
            last.extend_from_slice(body);
        }
        if let Some(action) = self.fault_action(head, body) {
            return action;
        }
        let cfg = &self.mock.cfg;
        let method = head.method;
        let read_only = matches!(method, Method::Get | Method::Head);
        let api = match head.path.as_str() {
            "/v1/chat/completions" => Api::Chat,
            "/v1/completions" => Api::Completions,
            "/health" if read_only => {
                return Action::Reply {
                    status: 200,
                    content_type: "text/plain; charset=utf-8",
                    body: Vec::new(),
                };
            }
            "/metrics" if read_only => {
                let mut text = String::with_capacity(2048);
                crate::metrics::render(
                    &mut text,
                    &cfg.model,
                    &self.mock.engine_cfg,
                    &self.mock.load(),
                );
                crate::metrics::render_disagg(
                    &mut text,
                    &self.mock.disagg,
                    &self.mock.handoffs.get(),
                );
                return Action::Reply {
                    status: 200,
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    body: text.into_bytes(),
                };
            }
            "/v1/models" if read_only => {
                let mut body = Vec::with_capacity(256);
                openai::models(&mut body, &self.mock.model_json, clock::unix_secs());
                return Action::Reply {
                    status: 200,
                    content_type: "application/json",
                    body,
                };
            }
            "/health" | "/metrics" | "/v1/models" => return Action::method_not_allowed(),
            _ => return Action::error(ApiError::not_found("Not Found")),
        };
        if method != Method::Post {
            return Action::method_not_allowed();
        }
        let job = openai::parse_request(api, body, &cfg.model, cfg.default_max_tokens)
            .and_then(|request| self.mock.job(api, body, request));
        match job {
            Ok(job) => Action::Generate(job),
            Err(e) => Action::error(e),
        }
    }

    /// Renders one event with `f` and appends it to the output as its own chunk.
    pub(super) fn event(&mut self, chunked: bool, f: impl FnOnce(&mut Vec<u8>)) {
        self.event.clear();
        f(&mut self.event);
        if chunked {
            http::chunk(&mut self.out, &self.event);
        } else {
            self.out.extend_from_slice(&self.event);
        }
    }

    /// A complete response with a Content-Length body, in `out`.
    pub(super) fn reply(
        &mut self,
        status: u16,
        content_type: &str,
        body: &[u8],
        keep_alive: bool,
        with_body: bool,
    ) {
        self.out.clear();
        http::response_head(
            &mut self.out,
            status,
            content_type,
            Some(body.len()),
            true,
            keep_alive,
            b"",
        );
        if with_body {
            self.out.extend_from_slice(body);
        }
    }

    /// Writes `out`; false when the client is gone.
    pub(super) async fn flush(&mut self) -> bool {
        if self.out.is_empty() {
            return true;
        }
        let (res, buf) = self.writer.write_all(std::mem::take(&mut self.out)).await;
        self.out = buf;
        self.out.clear();
        res.is_ok()
    }
}
