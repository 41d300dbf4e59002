//! One client connection: read a request head, dispatch it (proxy, `/v1/models`, or a local
//! error), repeat while keep-alive holds. Pipelined requests are served in order.

use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use monoio::io::{AsyncWriteRentExt, Splitable};
use monoio::net::TcpStream;
use monoio::net::tcp::TcpOwnedWriteHalf;

use super::reader::{ClientReader, ReadDone, read_more};
use super::{CoreCtx, SnapshotRef};
use crate::http::canned::{Canned, write_error};
use crate::http::chunked::Dechunker;
use crate::http::limits::{INITIAL_READ_BUF, RESPONSE_READ_BUF, RETAINED_BUF_MAX};
use crate::http::request::{RequestHead, parse_request};
use crate::http::write::upstream_request_head;
use crate::http::{BodyFraming, HttpError, Method};
use crate::metrics::{RequestType, add};
use crate::route::Endpoint;
use crate::route::peek::{PeekError, peek};
use crate::upstream::forward::{Client, Forwarded, Outbound, Refusal, Reject, forward};

/// Answers a connection over `max_connections` and closes it.
pub async fn refuse(ctx: Rc<CoreCtx>, mut stream: TcpStream) {
    let mut out = Vec::with_capacity(256);
    ctx.shared
        .snapshot
        .load()
        .responses
        .too_many_connections
        .write(&mut out, b"-", false, true);
    let _ = stream.write_all(out).await;
}

/// Counts a request in progress on this core (a drain waits for none).
struct ActiveRequest(Rc<CoreCtx>);

impl ActiveRequest {
    fn new(ctx: &Rc<CoreCtx>) -> ActiveRequest {
        ctx.active_requests.set(ctx.active_requests.get() + 1);
        ActiveRequest(ctx.clone())
    }
}

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        self.0
            .active_requests
            .set(self.0.active_requests.get().saturating_sub(1));
    }
}

struct ConnGuard(Rc<CoreCtx>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.shared.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

pub async fn serve(ctx: Rc<CoreCtx>, stream: TcpStream, peer: SocketAddr) {
    let _guard = ConnGuard(ctx.clone());
    let _ = stream.set_nodelay(true);
    let snap = ctx.snapshot();
    let (read_half, writer) = stream.into_split();
    let mut ip = [0u8; 48];
    let ip_len = {
        let mut cursor = std::io::Cursor::new(&mut ip[..]);
        let _ = write!(cursor, "{}", peer.ip());
        cursor.position() as usize
    };
    let mut conn = Conn {
        ctx,
        snap,
        writer,
        out: Vec::with_capacity(4096),
        rbuf: Vec::with_capacity(RESPONSE_READ_BUF),
        head: RequestHead::default(),
        ip,
        ip_len,
        rid: [0u8; 128],
        rid_len: 0,
        scratch: Vec::new(),
    };
    let reader = std::pin::pin!(ClientReader::new(
        read_half,
        Vec::with_capacity(INITIAL_READ_BUF),
        read_more
    ));
    conn.run(reader).await;
}

struct Conn {
    ctx: Rc<CoreCtx>,
    /// The config generation of the current request (refreshed before each request).
    snap: SnapshotRef,
    writer: TcpOwnedWriteHalf,
    out: Vec<u8>,
    rbuf: Vec<u8>,
    head: RequestHead,
    ip: [u8; 48],
    ip_len: usize,
    rid: [u8; 128],
    rid_len: usize,
    scratch: Vec<u8>,
}

enum HeadRead {
    Ready,
    Closed,
    Bad(HttpError),
}

enum BodyError {
    Closed,
    Bad(HttpError),
}

/// A response Spillway writes itself.
enum Local<'a> {
    Canned(&'a Canned),
    Error {
        status: u16,
        message: &'a str,
        allow: Option<&'static str>,
    },
}

impl Conn {
    async fn run<F: Future<Output = ReadDone>>(&mut self, mut reader: Pin<&mut ClientReader<F>>) {
        loop {
            self.snap = self.ctx.snapshot();
            match self.read_head(reader.as_mut()).await {
                HeadRead::Ready => {}
                HeadRead::Closed => return,
                HeadRead::Bad(e) => {
                    add(&self.ctx.counters().bad_requests, 1);
                    self.new_request_id(None);
                    self.refuse_framing(e).await;
                    return;
                }
            }
            let rid = self.head.request_id.map(|s| s.get(reader.buf()));
            self.new_request_id(rid);
            let draining = self.ctx.shared.draining.load(Ordering::Relaxed);
            if draining {
                // Answer, then close: clients move to other instances.
                self.head.keep_alive = false;
            }
            let _active = ActiveRequest::new(&self.ctx);
            if !self.dispatch(reader.as_mut()).await || draining {
                return;
            }
        }
    }

    fn new_request_id(&mut self, client: Option<&[u8]>) {
        match client {
            Some(id) => {
                self.rid[..id.len()].copy_from_slice(id);
                self.rid_len = id.len();
            }
            None => {
                let mut fresh = [0u8; 32];
                self.ctx.next_request_id(&mut fresh);
                self.rid[..32].copy_from_slice(&fresh);
                self.rid_len = 32;
            }
        }
    }

    async fn read_head<F: Future<Output = ReadDone>>(
        &mut self,
        mut reader: Pin<&mut ClientReader<F>>,
    ) -> HeadRead {
        let limits = &self.snap.config.limits;
        let mut started: Option<Instant> = None;
        loop {
            let buffered = reader.buf().len();
            if buffered > 0 && !reader.is_reading() {
                started.get_or_insert_with(Instant::now);
                match parse_request(
                    reader.buf(),
                    limits.max_header_bytes,
                    limits.max_body_bytes as u64,
                    &mut self.head,
                ) {
                    Ok(true) => return HeadRead::Ready,
                    Ok(false) => {}
                    Err(e) => return HeadRead::Bad(e),
                }
            }
            let wait = match started {
                None => Duration::from_millis(limits.idle_timeout_ms),
                Some(t) => {
                    Duration::from_millis(limits.header_read_timeout_ms).saturating_sub(t.elapsed())
                }
            };
            match monoio::time::timeout(wait, reader.as_mut().fill()).await {
                Ok(Ok(0)) | Ok(Err(_)) => return HeadRead::Closed,
                Ok(Ok(_)) => {}
                Err(_) if started.is_some() => return HeadRead::Bad(HttpError::HeaderTimeout),
                Err(_) => return HeadRead::Closed,
            }
        }
    }

    /// Reads the whole body into the buffer (de-chunked in place). Returns the body's range
    /// and the end of the request's bytes.
    async fn read_body<F: Future<Output = ReadDone>>(
        &mut self,
        mut reader: Pin<&mut ClientReader<F>>,
    ) -> Result<(std::ops::Range<usize>, usize), BodyError> {
        let limits = &self.snap.config.limits;
        let head_len = self.head.head_len;
        let gap = Duration::from_millis(limits.idle_timeout_ms);
        let mut dechunker = Dechunker::new(head_len);
        let total = match self.head.body {
            BodyFraming::Length(n) => {
                let total = head_len + n as usize;
                reader.as_mut().reserve_total(total);
                Some(total)
            }
            BodyFraming::Chunked => None,
            BodyFraming::None | BodyFraming::UntilClose => {
                return Ok((head_len..head_len, head_len));
            }
        };
        loop {
            match total {
                Some(total) if reader.buf().len() >= total => return Ok((head_len..total, total)),
                Some(_) => {}
                None => {
                    if let Some(buf) = reader.as_mut().buf_mut() {
                        let filled = buf.len();
                        match dechunker.decode(buf, filled, head_len + limits.max_body_bytes) {
                            Ok(true) => return Ok((head_len..dechunker.out, dechunker.raw)),
                            Ok(false) => {}
                            Err(e) => return Err(BodyError::Bad(e)),
                        }
                    }
                }
            }
            match monoio::time::timeout(gap, reader.as_mut().fill()).await {
                Ok(Ok(n)) if n > 0 => {}
                Err(_) => return Err(BodyError::Bad(HttpError::HeaderTimeout)),
                _ => return Err(BodyError::Closed),
            }
        }
    }

    async fn dispatch<F: Future<Output = ReadDone>>(
        &mut self,
        reader: Pin<&mut ClientReader<F>>,
    ) -> bool {
        let path = self.head.path(reader.buf());
        let method = self.head.method;
        if path == b"/v1/models" {
            return match method {
                Method::Get | Method::Head => {
                    let snap = self.snap.clone();
                    self.local(reader, Local::Canned(&snap.responses.models))
                        .await
                }
                _ => {
                    self.local(
                        reader,
                        Local::Error {
                            status: 405,
                            message: "Method not allowed",
                            allow: Some("GET, HEAD"),
                        },
                    )
                    .await
                }
            };
        }
        if path.starts_with(b"/v1/") {
            return match method {
                Method::Post => {
                    let endpoint = Endpoint::from_path(path);
                    self.proxy(reader, endpoint).await
                }
                _ => {
                    self.local(
                        reader,
                        Local::Error {
                            status: 405,
                            message: "Method not allowed",
                            allow: Some("POST"),
                        },
                    )
                    .await
                }
            };
        }
        let snap = self.snap.clone();
        self.local(reader, Local::Canned(&snap.responses.not_found))
            .await
    }

    /// Answers locally after reading and discarding the request body.
    async fn local<F: Future<Output = ReadDone>>(
        &mut self,
        mut reader: Pin<&mut ClientReader<F>>,
        resp: Local<'_>,
    ) -> bool {
        let with_body = self.head.method != Method::Head;
        if self.head.body != BodyFraming::None && self.head.expect_continue {
            // Do not invite a body we would discard: answer and close.
            let _ = self.respond(resp, false, with_body).await;
            return false;
        }
        match self.read_body(reader.as_mut()).await {
            Ok((_, end)) => {
                reader.as_mut().consume(end, INITIAL_READ_BUF);
                let keep = self.head.keep_alive;
                self.respond(resp, keep, with_body).await && keep
            }
            Err(BodyError::Closed) => false,
            Err(BodyError::Bad(e)) => self.refuse_framing(e).await,
        }
    }

    /// Answers a request whose framing is in doubt, and closes: returns false.
    async fn refuse_framing(&mut self, e: HttpError) -> bool {
        let message = e.to_string();
        let resp = Local::Error {
            status: e.status(),
            message: &message,
            allow: None,
        };
        let _ = self.respond(resp, false, true).await;
        false
    }

    async fn respond(&mut self, resp: Local<'_>, keep_alive: bool, with_body: bool) -> bool {
        self.out.clear();
        let rid = &self.rid[..self.rid_len];
        match resp {
            Local::Canned(c) => c.write(&mut self.out, rid, keep_alive, with_body),
            Local::Error {
                status,
                message,
                allow,
            } => {
                write_error(
                    &mut self.out,
                    status,
                    message,
                    allow,
                    rid,
                    keep_alive,
                    with_body,
                );
            }
        }
        let (res, out) = self.writer.write_all(std::mem::take(&mut self.out)).await;
        self.out = out;
        res.is_ok()
    }

    async fn proxy<F: Future<Output = ReadDone>>(
        &mut self,
        mut reader: Pin<&mut ClientReader<F>>,
        endpoint: Endpoint,
    ) -> bool {
        let started = Instant::now();
        if self.head.expect_continue && reader.buf().len() <= self.head.head_len {
            let (res, _) = self
                .writer
                .write_all(&b"HTTP/1.1 100 Continue\r\n\r\n"[..])
                .await;
            if res.is_err() {
                return false;
            }
        }
        let (body, end) = match self.read_body(reader.as_mut()).await {
            Ok(b) => b,
            Err(BodyError::Closed) => return false,
            Err(BodyError::Bad(e)) => {
                add(&self.ctx.counters().bad_requests, 1);
                return self.refuse_framing(e).await;
            }
        };

        let Conn {
            ctx,
            snap,
            writer,
            out,
            rbuf,
            head,
            ip,
            ip_len,
            rid,
            rid_len,
            scratch,
        } = self;
        let rid = &rid[..*rid_len];
        let keep = head.keep_alive;
        let buf = reader.buf();
        let found = match peek(buf.get(body.clone()).unwrap_or_default()) {
            Ok(p) => match p.model {
                Some(name) => match name.decoded(scratch) {
                    Ok(name) => match snap.model(name) {
                        Some(model) => Ok((model, p)),
                        None => Err(Err(())),
                    },
                    Err(e) => Err(Ok(e.to_string())),
                },
                None => Err(Ok(
                    "Missing required field `model` in the request body".to_string()
                )),
            },
            Err(PeekError::NotObject | PeekError::Syntax) => {
                Err(Ok("Request body must be a JSON object".to_string()))
            }
            Err(e) => Err(Ok(e.to_string())),
        };
        let (model, p) = match found {
            Ok(found) => found,
            Err(not_found) => {
                add(&ctx.counters().bad_requests, 1);
                reader.as_mut().consume(end, INITIAL_READ_BUF);
                out.clear();
                match not_found {
                    Err(()) => snap.responses.model_not_found.write(out, rid, keep, true),
                    Ok(msg) => write_error(out, 400, &msg, None, rid, keep, true),
                }
                let (res, o) = writer.write_all(std::mem::take(out)).await;
                *out = o;
                return res.is_ok() && keep;
            }
        };
        let outbound = Outbound {
            snap,
            model,
            endpoint,
            request_type: if p.stream {
                RequestType::Stream
            } else {
                RequestType::Unary
            },
            prompt_tokens: (p.prompt_bytes as u64).div_ceil(4),
            body: body.clone(),
            request_end: end,
            worker_id: head.worker_id.map(|s| s.start as usize..s.end as usize),
            client_minor: head.minor_version,
            client_keep_alive: keep,
            started,
        };
        out.clear();
        upstream_request_head(out, buf, head, body.len(), &ip[..*ip_len], rid);
        let mut client = Client {
            reader: reader.as_mut(),
            writer,
            out,
            rbuf,
            request_id: rid,
        };
        let forwarded = forward(ctx, &mut client, &outbound).await;
        if out.capacity() > RETAINED_BUF_MAX {
            // One large body must not pin its buffer on an idle keep-alive connection.
            out.clear();
            out.shrink_to(4096);
        }
        match forwarded {
            Forwarded::Done { keep_alive, .. } => keep_alive,
            Forwarded::Abort(_) => false,
            Forwarded::Reject(r) => {
                out.clear();
                match r {
                    Reject::Overloaded => snap.responses.overloaded.write(out, rid, keep, true),
                    Reject::WorkerOverloaded(Refusal::QueueTimeout) => {
                        snap.responses.queue_timeout.write(out, rid, keep, true)
                    }
                    Reject::WorkerOverloaded(_) => snap
                        .responses
                        .worker_at_capacity
                        .write(out, rid, keep, true),
                    Reject::DirectBusy => snap.responses.direct_busy.write(out, rid, keep, true),
                    Reject::Unavailable => snap.responses.unavailable.write(out, rid, keep, true),
                    Reject::DirectMissingHeader => write_error(
                        out,
                        400,
                        "The x-worker-id header is required in direct routing mode",
                        None,
                        rid,
                        keep,
                        true,
                    ),
                    Reject::DirectUnknownWorker => {
                        write_error(out, 404, "Worker not found", None, rid, keep, true)
                    }
                    Reject::BadGateway(why) => write_error(out, 502, why, None, rid, keep, true),
                    Reject::GatewayTimeout => write_error(
                        out,
                        504,
                        "The worker did not respond in time",
                        None,
                        rid,
                        keep,
                        true,
                    ),
                }
                let (res, o) = writer.write_all(std::mem::take(out)).await;
                *out = o;
                res.is_ok() && keep
            }
        }
    }
}
