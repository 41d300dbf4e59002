//! The misbehaving worker: a thread accepting on a listener that now and then closes
//! (connects refused, idle connections closed) or stops accepting, and a thread per
//! connection answering each request as the seeded dice say. It records when it started
//! and stopped answering each request.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use socket2::{Domain, SockRef, Socket, Type};
use spillway_testkit::*;

use crate::{TICK, is_timeout, ms};

/// Switches shared by every worker.
pub struct Chaos {
    pub seed: u64,
    /// Off: every request is answered at once and well.
    pub on: AtomicBool,
    pub stop: AtomicBool,
}

/// What a worker records.
#[derive(Default)]
pub struct Log {
    pub handled: Mutex<Vec<Handled>>,
    /// Requests open now, and the most ever, as the worker's threads counted them.
    open: AtomicUsize,
    pub max_open: AtomicUsize,
    serial: AtomicU64,
    /// Bumped when the listener closes: idle connections of an older epoch close too.
    epoch: AtomicU64,
    pub outages: AtomicUsize,
    /// Requests that did not arrive as the client sent them.
    pub problems: Mutex<Vec<String>>,
}

pub struct Worker {
    index: usize,
    pub name: String,
    addr: SocketAddr,
    chaos: Arc<Chaos>,
    pub log: Log,
}

/// What a worker does with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// A JSON body with Content-Length after `delay_ms`; keep-alive.
    Json { delay_ms: u64 },
    /// A chunked SSE stream, ended by `[DONE]` and the last chunk, or cut mid-chunk.
    Sse {
        events: u64,
        gap_ms: u64,
        cut: Option<Cut>,
    },
    /// A body delimited by the close.
    UntilClose,
    /// A Content-Length longer than the body, then a close.
    ShortBody,
    /// A status line that is not one.
    BadStatus(&'static [u8]),
    /// A valid chunk, then a bad one, then a close.
    BadChunk,
    /// A whole JSON answer with this status (529 and 503 are refusals: the request moves).
    Status(u16),
    /// A close without an answer.
    Hangup,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Reset,
    Close,
}

impl Worker {
    pub fn start(index: usize, chaos: Arc<Chaos>) -> Arc<Worker> {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let w = Arc::new(Worker {
            index,
            name: format!("w{index}"),
            addr: listener.local_addr().unwrap(),
            chaos,
            log: Log::default(),
        });
        let me = w.clone();
        thread::spawn(move || me.accept_loop(listener));
        w
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let mut rng = Rng::new(self.chaos.seed ^ (0xacce + self.index as u64));
        let mut listener = Some(listener);
        let mut next_outage = Instant::now() + ms(300 + rng.below(900));
        while !self.chaos.stop.load(SeqCst) {
            if self.chaos.on.load(SeqCst) && Instant::now() >= next_outage {
                self.outage(&mut listener, &mut rng);
                next_outage = Instant::now() + ms(300 + rng.below(900));
            }
            let Some(l) = &listener else {
                // The port may be briefly taken; a worker that cannot bind stays down.
                listener = bind(self.addr);
                thread::sleep(TICK);
                continue;
            };
            if let Ok((s, _)) = l.accept() {
                let me = self.clone();
                thread::spawn(move || me.serve(s));
            }
        }
    }

    /// 80 to 300 ms down: the listener closed (connects refused, idle connections closed),
    /// or open but not accepting (one connect waits in the backlog, more time out).
    fn outage(&self, listener: &mut Option<TcpListener>, rng: &mut Rng) {
        let length = ms(80 + rng.below(220));
        if rng.below(2) == 0 {
            *listener = None;
            self.log.epoch.fetch_add(1, SeqCst);
            thread::sleep(length);
            *listener = bind(self.addr);
        } else {
            thread::sleep(length);
        }
        self.log.outages.fetch_add(1, SeqCst);
    }

    fn serve(&self, mut s: TcpStream) {
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(TICK));
        let epoch = self.log.epoch.load(SeqCst);
        let idle_over = || self.log.epoch.load(SeqCst) != epoch || self.chaos.stop.load(SeqCst);
        let mut buf = Vec::new();
        while let Some(request) = read_request(&mut s, &mut buf, &idle_over) {
            let (tag, stream) = match request {
                Ok(r) => r,
                Err(e) => return self.log.problems.lock().unwrap().push(e),
            };
            if !self.handle(&mut s, &tag, stream) {
                return;
            }
        }
    }

    /// Answers one request; false when the connection is to be closed.
    fn handle(&self, s: &mut TcpStream, tag: &str, stream: bool) -> bool {
        let start = Instant::now();
        let open = self.log.open.fetch_add(1, SeqCst) + 1;
        self.log.max_open.fetch_max(open, SeqCst);
        let serial = self.log.serial.fetch_add(1, SeqCst);
        let id = format!("{tag}@{}#{serial}", self.name);
        let mut end = Ending {
            open: &self.log.open,
            at: None,
        };
        let keep = perform(s, self.act(tag, stream), &id, &mut end);
        end.mark();
        let handled = Handled {
            tag: tag.to_string(),
            start,
            end: end.at.unwrap(),
        };
        self.log.handled.lock().unwrap().push(handled);
        keep
    }

    /// The worker's choice for `tag`: a function of the seed, the worker and the tag.
    fn act(&self, tag: &str, stream: bool) -> Act {
        let h = tag.bytes().fold(self.index as u64 + 1, |h, b| {
            h.wrapping_mul(0x100_0000_01b3) ^ u64::from(b)
        });
        let mut r = Rng::new(self.chaos.seed ^ h);
        let sse = |r: &mut Rng, cut| Act::Sse {
            events: 2 + r.below(6),
            gap_ms: r.below(15),
            cut,
        };
        if !self.chaos.on.load(SeqCst) {
            return if stream {
                sse(&mut r, None)
            } else {
                Act::Json { delay_ms: 0 }
            };
        }
        let roll = r.below(100);
        match (roll, stream) {
            (0..10, _) => Act::Json {
                delay_ms: 80 + r.below(170),
            },
            (10..16, true) => sse(&mut r, Some(Cut::Reset)),
            (16..22, true) => sse(&mut r, Some(Cut::Close)),
            (22..27, true) => Act::BadChunk,
            (10..16, false) => Act::UntilClose,
            (16..22, false) => Act::ShortBody,
            (22..27, false) => {
                let lines: [&[u8]; 3] = [b"HTTP/1.1 2x0 OK", b"SPDY/3 200 OK", b"HTTP/1.1 099 Low"];
                Act::BadStatus(lines[r.below(3) as usize])
            }
            (27..33, _) => Act::Status(529),
            (33..36, _) => Act::Status(503),
            (36..39, _) => Act::Status(500),
            (39..43, _) => Act::Hangup,
            // Long enough that only the proxy's close ends it early.
            (43..45, true) => Act::Sse {
                events: 40,
                gap_ms: 40,
                cut: None,
            },
            (_, true) => sse(&mut r, None),
            (_, false) => Act::Json {
                delay_ms: r.below(20),
            },
        }
    }
}

/// A listener on `addr` whose accept wakes every [`TICK`], with the smallest backlog
/// (Linux queues one connection).
fn bind(addr: SocketAddr) -> Option<TcpListener> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
    s.set_reuse_address(true).ok()?;
    s.bind(&addr.into()).ok()?;
    s.listen(0).ok()?;
    s.set_read_timeout(Some(TICK)).ok()?;
    Some(s.into())
}

/// Reads one request (Content-Length body); returns its tag and whether it streams, or
/// what is wrong with it. `None` when the connection ends, or when it is idle and
/// `idle_over` says to close.
fn read_request(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    idle_over: &dyn Fn() -> bool,
) -> Option<Result<(String, bool), String>> {
    loop {
        let mut hs = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut hs);
        if let Ok(httparse::Status::Complete(n)) = req.parse(buf) {
            let len: usize = (req.headers.iter())
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                .unwrap_or(0);
            let line = format!("{} {}", req.method.unwrap_or(""), req.path.unwrap_or(""));
            if buf.len() >= n + len {
                let body = buf.drain(..n + len).skip(n).collect::<Vec<u8>>();
                return Some(request_of(&line, &body));
            }
        }
        let mut tmp = [0u8; 16384];
        match s.read(&mut tmp) {
            Ok(0) => return None,
            Ok(k) => buf.extend_from_slice(&tmp[..k]),
            Err(e) if is_timeout(&e) => {
                if buf.is_empty() && idle_over() {
                    return None;
                }
            }
            Err(_) => return None,
        }
    }
}

/// The tag and stream flag of a request, which must be what the clients send.
fn request_of(line: &str, body: &[u8]) -> Result<(String, bool), String> {
    let bad = || format!("{line} {}", String::from_utf8_lossy(body));
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|_| bad())?;
    let pad = v["prompt"]
        .as_str()
        .is_some_and(|p| p.bytes().all(|b| b == b'x'));
    match v["user"].as_str() {
        Some(tag) if line == "POST /v1/completions" && v["model"] == "m" && pad => {
            Ok((tag.to_string(), v["stream"].as_bool().unwrap_or(false)))
        }
        _ => Err(bad()),
    }
}

/// When a request stops counting as open at its worker: before the response's last write
/// (Spillway cannot give the slot back before it has read it), or when the connection
/// broke. Marked once.
struct Ending<'a> {
    open: &'a AtomicUsize,
    at: Option<Instant>,
}

impl Ending<'_> {
    fn mark(&mut self) {
        if self.at.is_none() {
            self.at = Some(Instant::now());
            self.open.fetch_sub(1, SeqCst);
        }
    }
}

/// Writes the answer `act` says; false when the connection is to be closed.
fn perform(s: &mut TcpStream, act: Act, id: &str, end: &mut Ending<'_>) -> bool {
    let json = format!(r#"{{"id":"{id}","object":"text_completion","choices":[{{"text":"ok"}}]}}"#);
    let last = |s: &mut TcpStream, end: &mut Ending<'_>, bytes: &[u8]| {
        end.mark();
        s.write_all(bytes).is_ok()
    };
    match act {
        Act::Json { delay_ms } => {
            thread::sleep(ms(delay_ms));
            last(s, end, &json_response(200, &json))
        }
        Act::Sse {
            events,
            gap_ms,
            cut,
        } => sse(s, id, events, gap_ms, cut, end),
        Act::UntilClose => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close";
            last(s, end, format!("{head}\r\n\r\n{json}").as_bytes());
            false
        }
        Act::ShortBody => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json";
            let length = json.len() + 100;
            let bytes = format!("{head}\r\ncontent-length: {length}\r\n\r\n{json}");
            last(s, end, bytes.as_bytes());
            false
        }
        Act::BadStatus(line) => {
            last(s, end, &[line, b"\r\ncontent-length: 2\r\n\r\n{}"].concat());
            false
        }
        Act::BadChunk => {
            let mut bytes = SSE_HEAD.as_bytes().to_vec();
            bytes.extend_from_slice(&chunk(&event(id, 0)));
            let _ = s.write_all(&bytes);
            last(s, end, b"zz\r\nnot a chunk\r\n");
            false
        }
        Act::Status(code) => last(s, end, &json_response(code, &json)),
        Act::Hangup => false,
    }
}

fn event(id: &str, n: u64) -> String {
    format!("data: {{\"id\":\"{id}\",\"n\":{n}}}\n\n")
}

/// A chunked SSE stream of `events`, then `[DONE]`, or cut halfway through a chunk.
fn sse(
    s: &mut TcpStream,
    id: &str,
    events: u64,
    gap_ms: u64,
    cut: Option<Cut>,
    end: &mut Ending<'_>,
) -> bool {
    if s.write_all(SSE_HEAD.as_bytes()).is_err() {
        return false;
    }
    for n in 0..events {
        thread::sleep(ms(gap_ms));
        if s.write_all(&chunk(&event(id, n))).is_err() {
            return false;
        }
    }
    let mut tail = chunk(&event(id, events));
    match cut {
        None => {
            tail.extend_from_slice(&chunk("data: [DONE]\n\n"));
            tail.extend_from_slice(b"0\r\n\r\n");
            end.mark();
            s.write_all(&tail).is_ok()
        }
        Some(cut) => {
            end.mark();
            let _ = s.write_all(&tail[..tail.len() / 2]);
            if cut == Cut::Reset {
                let _ = SockRef::from(&*s).set_linger(Some(Duration::ZERO));
            }
            false
        }
    }
}
