//! The admin listener: health, liveness, metrics and the control APIs (`/busy_threshold`,
//! `/load`, `/reload`). It runs on the control thread, so handlers act on monitor state
//! directly and a change is published to every core before the reply goes out.

mod error;
mod places;
mod routes;
pub(crate) mod thresholds;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

pub use error::{AdminError, Reply};
pub use places::Connections;
use places::{Evicted, Place};
pub use routes::Request;

use crate::http::limits::{MAX_ADMIN_BODY, MAX_ADMIN_HEAD};
use crate::http::request::{RequestHead, parse_request};
use crate::http::write::{canonical_reason, status_line};
use crate::http::{BodyFraming, HttpError, Method};
use crate::monitor::Control;
use crate::runtime::clock;

/// Takes an accepted admin connection from `peer`: served on its own task, making room
/// at `admin_max_connections` by closing the oldest connection with no request head in
/// progress, or, when every open one has a request under way, answered 503 and closed at
/// once. Either way the accept loop (and the monitor beside it) never waits for the
/// client.
pub fn accepted(
    control: &Rc<RefCell<Control>>,
    open: &Connections,
    stream: TcpStream,
    peer: SocketAddr,
) {
    let (max, timeout) = {
        let snap = control.borrow().shared.snapshot.load_full();
        let limits = &snap.config.limits;
        let timeout = Duration::from_millis(limits.admin_read_timeout_ms);
        (limits.admin_max_connections, timeout)
    };
    let mut evicted = |e: Evicted| {
        control.borrow_mut().admin_evictions += 1;
        tracing::debug!(
            evicted = %e.peer,
            age_ms = e.age.as_millis() as u64,
            newcomer = %peer,
            max,
            "admin connection closed to make room: no request head in progress"
        );
    };
    let Some(place) = open.take(peer, clock::now(), max, &mut evicted) else {
        monoio::spawn(async move {
            let mut stream = stream;
            let _ = write(
                &mut stream,
                AdminError::TooManyConnections.into(),
                false,
                true,
                timeout,
            )
            .await;
        });
        return;
    };
    monoio::spawn(serve(control.clone(), stream, timeout, place));
}

/// Serves one admin connection until it closes. Each request must arrive whole within
/// `timeout` of the connection opening or of the previous answer (408 once it started,
/// else a silent close), and each answer must be written within `timeout`. Told to close
/// while no request head is in progress (`place`), it closes at once, silently.
async fn serve(
    control: Rc<RefCell<Control>>,
    mut stream: TcpStream,
    timeout: Duration,
    place: Place,
) {
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut head = RequestHead::default();
    loop {
        let deadline = clock::now() + timeout;
        let read = read_request(&mut stream, &mut buf, &mut head, deadline, &place);
        let read = monoio::select! {
            () = place.evicted() => return,
            read = read => read,
        };
        // Told to close while a head was completing in the same turn: it lost its place.
        if place.is_evicted() {
            return;
        }
        let total = match read {
            Ok(Some(total)) => total,
            Ok(None) => return,
            Err(e) => {
                let _ = write(&mut stream, e.into(), false, true, timeout).await;
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
        if !write(&mut stream, reply, keep, with_body, timeout).await || !keep {
            return;
        }
    }
}

/// Reads one request (head and Content-Length body) into `buf` by `deadline`; returns its
/// length, or `None` when the client closed, or went quiet before sending anything.
/// `place` is busy from the head's completion until the next read for a head (a
/// pipelined head already in `buf` keeps it busy).
async fn read_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    head: &mut RequestHead,
    deadline: Instant,
    place: &Place,
) -> Result<Option<usize>, AdminError> {
    loop {
        match parse_request(buf, MAX_ADMIN_HEAD, u64::MAX, head) {
            Ok(true) => break,
            Ok(false) => place.set_busy(false),
            Err(e) => return Err(AdminError::Http(e)),
        }
        match read_more(stream, buf, deadline).await {
            Read::More => {}
            Read::Closed => return Ok(None),
            Read::TimedOut { quiet: true } => return Ok(None),
            Read::TimedOut { quiet: false } => {
                return Err(AdminError::Http(HttpError::HeaderTimeout));
            }
        }
    }
    place.set_busy(true);
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
        match read_more(stream, buf, deadline).await {
            Read::More => {}
            Read::Closed => return Ok(None),
            Read::TimedOut { .. } => return Err(AdminError::Http(HttpError::BodyTimeout)),
        }
    }
    Ok(Some(total))
}

/// How a read ended.
enum Read {
    More,
    Closed,
    /// The deadline passed; `quiet`: no byte of the request had arrived.
    TimedOut {
        quiet: bool,
    },
}

/// One read into `buf`, bounded by `deadline`. On a timeout the buffer is gone with the
/// cancelled read; the connection is closing then anyway.
async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>, deadline: Instant) -> Read {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(4096);
    }
    let len = buf.len();
    let wait = deadline.saturating_duration_since(clock::now());
    let read = stream.read(std::mem::take(buf).slice_mut(len..));
    match monoio::time::timeout(wait, read).await {
        Ok((res, slice)) => {
            *buf = slice.into_inner();
            match res {
                Ok(n) if n > 0 => Read::More,
                _ => Read::Closed,
            }
        }
        Err(_) => Read::TimedOut { quiet: len == 0 },
    }
}

/// Writes `reply`; false when the client is gone or did not take it within `timeout`.
async fn write(
    stream: &mut TcpStream,
    reply: Reply,
    keep_alive: bool,
    with_body: bool,
    timeout: Duration,
) -> bool {
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
    matches!(
        monoio::time::timeout(timeout, stream.write_all(out)).await,
        Ok((Ok(_), _))
    )
}
