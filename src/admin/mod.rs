//! The admin listener: health, liveness, metrics and the control APIs (`/busy_threshold`,
//! `/load`, `/reload`). It runs on the control thread, so handlers act on monitor state
//! directly and a change is published to every core before the reply goes out.

mod error;
mod routes;
mod thresholds;

use std::cell::RefCell;
use std::rc::Rc;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

pub use error::{AdminError, Reply};
pub use routes::Request;

use crate::http::canned::{canonical_reason, status_line};
use crate::http::limits::{MAX_ADMIN_BODY, MAX_ADMIN_HEAD};
use crate::http::request::{RequestHead, parse_request};
use crate::http::{BodyFraming, Method};
use crate::monitor::Control;

/// Serves one admin connection until it closes.
pub async fn serve(control: Rc<RefCell<Control>>, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut head = RequestHead::default();
    loop {
        let total = match read_request(&mut stream, &mut buf, &mut head).await {
            Ok(Some(total)) => total,
            Ok(None) => return,
            Err(e) => {
                let _ = write(&mut stream, e.into(), false, true).await;
                return;
            }
        };
        let keep = head.keep_alive;
        let with_body = head.method != Method::Head;
        let req = Request {
            method: head.method,
            path: head.path(&buf),
            content_type: head.content_type.map(|s| s.get(&buf)),
            authorization: head.authorization.map(|s| s.get(&buf)),
            body: &buf[head.head_len..total],
        };
        let reply = routes::respond(&control, &req).await;
        buf.drain(..total);
        if !write(&mut stream, reply, keep, with_body).await || !keep {
            return;
        }
    }
}

/// Reads one request (head and Content-Length body) into `buf`; returns its length, or
/// `None` when the client closed.
async fn read_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    head: &mut RequestHead,
) -> Result<Option<usize>, AdminError> {
    loop {
        match parse_request(buf, MAX_ADMIN_HEAD, u64::MAX, head) {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => return Err(AdminError::Http(e)),
        }
        if !read_more(stream, buf).await {
            return Ok(None);
        }
    }
    let body_len = match head.body {
        BodyFraming::None => 0,
        BodyFraming::Length(n) if n as usize > MAX_ADMIN_BODY => {
            return Err(AdminError::TooLarge(MAX_ADMIN_BODY));
        }
        BodyFraming::Length(n) => n as usize,
        _ => return Err(AdminError::LengthRequired),
    };
    let total = head.head_len + body_len;
    buf.reserve(total.saturating_sub(buf.len()));
    while buf.len() < total {
        if !read_more(stream, buf).await {
            return Ok(None);
        }
    }
    Ok(Some(total))
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
