//! The admin listener: health, liveness, metrics and the control APIs. Runs on the
//! monitor thread; request bodies are size-limited.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use crate::http::canned::{canonical_reason, status_line};
use crate::http::request::{RequestHead, parse_request};
use crate::http::{BodyFraming, Method};
use crate::monitor::Control;

/// Largest admin request body.
pub const MAX_ADMIN_BODY: usize = 1024 * 1024;
const MAX_ADMIN_HEAD: usize = 16 * 1024;

/// An admin response: status, content type, body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(status: u16, value: &serde_json::Value) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body: value.to_string().into_bytes(),
        }
    }

    /// `{"error": message}`: the admin API's error shape (semantics §5).
    pub fn error(status: u16, message: impl Into<String>) -> Reply {
        Reply::json(status, &serde_json::json!({ "error": message.into() }))
    }
}

pub async fn serve(control: Rc<RefCell<Control>>, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut head = RequestHead::default();
    loop {
        // Head.
        let parsed = loop {
            match parse_request(&buf, MAX_ADMIN_HEAD, MAX_ADMIN_BODY as u64, &mut head) {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(e) => break Err(e),
            }
            if buf.capacity() - buf.len() < 1024 {
                buf.reserve(4096);
            }
            let len = buf.len();
            let (res, slice) = stream.read(buf.slice_mut(len..)).await;
            buf = slice.into_inner();
            match res {
                Ok(n) if n > 0 => {}
                _ => return,
            }
        };
        if let Err(e) = parsed {
            let status = e.status();
            let _ = write(
                &mut stream,
                Reply::error(status, e.to_string()),
                false,
                true,
            )
            .await;
            return;
        }
        // Body (Content-Length only on the admin side; chunked is refused).
        let body_len = match head.body {
            BodyFraming::None => 0,
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
        while buf.len() < total {
            buf.reserve(total - buf.len());
            let len = buf.len();
            let (res, slice) = stream.read(buf.slice_mut(len..)).await;
            buf = slice.into_inner();
            match res {
                Ok(n) if n > 0 => {}
                _ => return,
            }
        }
        let keep = head.keep_alive;
        let with_body = head.method != Method::Head;
        let reply = route(&control, &head, &buf[..total]).await;
        buf.drain(..total);
        if !write(&mut stream, reply, keep, with_body).await || !keep {
            return;
        }
    }
}

async fn route(control: &Rc<RefCell<Control>>, head: &RequestHead, raw: &[u8]) -> Reply {
    let path = head.path(raw);
    let draining = control.borrow().shared.draining.load(Ordering::Relaxed);
    match (head.method, path) {
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
        (_, b"/health" | b"/live") => Reply::error(405, "Method not allowed"),
        _ => Reply::error(404, "Not found"),
    }
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
