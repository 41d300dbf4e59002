//! The admin listener: health, liveness, metrics and the control APIs (`/busy_threshold`,
//! `/load`). Runs on the monitor thread, so handlers act on monitor state directly and a
//! threshold change is published to every core before the reply goes out.

pub mod thresholds;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use serde::Serialize;

use crate::core::clock;
use crate::http::canned::{canonical_reason, status_line};
use crate::http::request::{RequestHead, parse_request};
use crate::http::{BodyFraming, Method};
use crate::monitor::Control;
use crate::monitor::load::parse_events;

/// Largest admin request body (a `/load` batch for 1,000 workers × 8 ranks fits).
pub const MAX_ADMIN_BODY: usize = 8 * 1024 * 1024;
const MAX_ADMIN_HEAD: usize = 16 * 1024;

/// An admin response: status, content type, body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// Adds `WWW-Authenticate: Bearer` (401).
    pub www_authenticate: bool,
}

impl Reply {
    pub fn json(status: u16, value: &impl Serialize) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body: serde_json::to_vec(value).unwrap_or_default(),
            www_authenticate: false,
        }
    }

    /// `{"error": message}`: the admin API's error shape (semantics §5).
    pub fn error(status: u16, message: impl Into<String>) -> Reply {
        Reply::json(status, &serde_json::json!({ "error": message.into() }))
    }
}

/// The parts of an admin request handlers look at.
#[derive(Debug)]
pub struct Request<'a> {
    pub method: Method,
    pub path: &'a [u8],
    pub content_type: Option<&'a [u8]>,
    pub authorization: Option<&'a [u8]>,
    pub body: &'a [u8],
}

impl Request<'_> {
    /// Whether the request may change state: with a token configured, it must carry
    /// `Authorization: Bearer <token>`, compared in constant time.
    fn authorized(&self, token: Option<&str>) -> bool {
        use subtle::ConstantTimeEq as _;
        let Some(token) = token else { return true };
        let presented = self
            .authorization
            .and_then(|v| {
                v.strip_prefix(b"Bearer ")
                    .or_else(|| v.strip_prefix(b"bearer "))
            })
            .map(<[u8]>::trim_ascii)
            .unwrap_or_default();
        bool::from(presented.ct_eq(token.as_bytes()))
    }

    /// 415 unless the body is declared JSON (`application/json`, any parameters).
    pub fn require_json(&self) -> Result<(), Reply> {
        let ct = self.content_type.unwrap_or_default();
        let essence = ct
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        if essence.eq_ignore_ascii_case(b"application/json") {
            Ok(())
        } else {
            Err(Reply::error(
                415,
                "Expected request with Content-Type application/json",
            ))
        }
    }
}

pub async fn serve(control: Rc<RefCell<Control>>, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut head = RequestHead::default();
    loop {
        let parsed = loop {
            match parse_request(&buf, MAX_ADMIN_HEAD, u64::MAX, &mut head) {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(e) => break Err(e),
            }
            if !read_more(&mut stream, &mut buf).await {
                return;
            }
        };
        if let Err(e) = parsed {
            let _ = write(
                &mut stream,
                Reply::error(e.status(), e.to_string()),
                false,
                true,
            )
            .await;
            return;
        }
        let body_len = match head.body {
            BodyFraming::None => 0,
            BodyFraming::Length(n) if n as usize > MAX_ADMIN_BODY => {
                let msg = format!("Request body exceeds the limit of {MAX_ADMIN_BODY} bytes");
                let _ = write(&mut stream, Reply::error(413, msg), false, true).await;
                return;
            }
            BodyFraming::Length(n) => n as usize,
            _ => {
                let _ = write(
                    &mut stream,
                    Reply::error(411, "Content-Length required"),
                    false,
                    true,
                )
                .await;
                return;
            }
        };
        let total = head.head_len + body_len;
        buf.reserve(total.saturating_sub(buf.len()));
        while buf.len() < total {
            if !read_more(&mut stream, &mut buf).await {
                return;
            }
        }
        let keep = head.keep_alive;
        let with_body = head.method != Method::Head;
        let req = Request {
            method: head.method,
            path: head.path(&buf),
            content_type: head.content_type.map(|s| s.get(&buf)),
            authorization: head.authorization.map(|s| s.get(&buf)),
            body: &buf[head.head_len..total],
        };
        let reply = route(&control, &req);
        buf.drain(..total);
        if !write(&mut stream, reply, keep, with_body).await || !keep {
            return;
        }
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(4096);
    }
    let len = buf.len();
    let (res, slice) = stream.read(std::mem::take(buf).slice_mut(len..)).await;
    *buf = slice.into_inner();
    matches!(res, Ok(n) if n > 0)
}

fn route(control: &Rc<RefCell<Control>>, req: &Request<'_>) -> Reply {
    let draining = control.borrow().shared.draining.load(Ordering::Relaxed);
    let mutating = matches!(
        (req.method, req.path),
        (Method::Post | Method::Delete, b"/busy_threshold") | (Method::Post, b"/load" | b"/reload")
    );
    if mutating {
        let token = control
            .borrow()
            .shared
            .snapshot
            .load()
            .config
            .admin_token
            .clone();
        if !req.authorized(token.as_deref()) {
            let mut r = Reply::error(401, "Missing or invalid bearer token");
            r.www_authenticate = true;
            return r;
        }
    }
    match (req.method, req.path) {
        (Method::Get | Method::Head, b"/health") if draining => {
            Reply::json(503, &serde_json::json!({"status": "draining"}))
        }
        (Method::Get | Method::Head, b"/health") => {
            Reply::json(200, &serde_json::json!({"status": "healthy"}))
        }
        (Method::Get | Method::Head, b"/live") if draining => {
            Reply::json(503, &serde_json::json!({"status": "draining"}))
        }
        (Method::Get | Method::Head, b"/live") => {
            Reply::json(200, &serde_json::json!({"status": "live"}))
        }
        (Method::Get | Method::Head, b"/metrics") => Reply {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: crate::metrics::expose::render(&control.borrow()),
            www_authenticate: false,
        },
        (Method::Get, b"/busy_threshold") => thresholds::list(&control.borrow()),
        (Method::Post, b"/busy_threshold") => thresholds::post(&mut control.borrow_mut(), req),
        (Method::Delete, b"/busy_threshold") => thresholds::delete(&mut control.borrow_mut(), req),
        (Method::Post, b"/load") => push_load(&mut control.borrow_mut(), req),
        (Method::Get, b"/load") => load_state(&control.borrow()),
        (Method::Post, b"/reload") => match control.borrow_mut().reload() {
            Ok(generation) => Reply::json(200, &serde_json::json!({ "generation": generation })),
            Err(e) => Reply::error(400, e.to_string()),
        },
        (_, b"/health" | b"/live" | b"/metrics" | b"/busy_threshold" | b"/load" | b"/reload") => {
            Reply::error(405, "Method not allowed")
        }
        _ => Reply::error(404, "Not found"),
    }
}

/// `POST /load`: one load event or an array; all checked before any is applied.
fn push_load(control: &mut Control, req: &Request<'_>) -> Reply {
    if let Err(r) = req.require_json() {
        return r;
    }
    let events = match parse_events(req.body) {
        Ok(e) => e,
        Err(e) => return Reply::error(400, format!("Invalid load event: {e}")),
    };
    let snap = control.shared.snapshot.load_full();
    match control.monitor.table.push(&snap, &events, clock::now_ms()) {
        Ok(n) => {
            control.republish();
            Reply::json(200, &serde_json::json!({ "accepted": n }))
        }
        Err(e) => Reply::error(e.status(), e.to_string()),
    }
}

/// `GET /load`: what the monitor currently believes, per worker and rank.
fn load_state(control: &Control) -> Reply {
    let snap = control.shared.snapshot.load_full();
    let workers = control.monitor.report(&snap, clock::now_ms());
    let generation = control.monitor.published().generation;
    Reply::json(
        200,
        &serde_json::json!({ "generation": generation, "workers": workers }),
    )
}

async fn write(stream: &mut TcpStream, reply: Reply, keep_alive: bool, with_body: bool) -> bool {
    let mut out = Vec::with_capacity(256 + reply.body.len());
    status_line(
        &mut out,
        reply.status,
        canonical_reason(reply.status).as_bytes(),
    );
    out.extend_from_slice(b"content-type: ");
    out.extend_from_slice(reply.content_type.as_bytes());
    out.extend_from_slice(b"\r\ncontent-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(reply.body.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    if reply.www_authenticate {
        out.extend_from_slice(b"www-authenticate: Bearer\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if with_body {
        out.extend_from_slice(&reply.body);
    }
    let (res, _) = stream.write_all(out).await;
    res.is_ok()
}
