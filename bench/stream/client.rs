#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // a load generator times itself
//! The streaming client of `bench/stream/run.sh`: CONNS keep-alive connections on one
//! monoio thread, each in a closed loop of `POST` (the body from BODY_FILE, a streamed chat
//! completion) and reading the SSE answer to its end, for SECONDS (a request under way then
//! is read to its end and counted, so a proxy's CPU over the client's run divides by the
//! requests this prints). Prints one
//! line of `key=value` figures: requests, errors, SSE events, the time to the first event
//! and the gaps between events as the client sees them (inter-token latency, per event: an
//! event that came in the same read as the one before it counts a gap of 0).
//!
//! It exists because wrk times whole responses only; the question here is what a proxy adds
//! between tokens. One thread with io_uring keeps the client's own CPU low beside the origin.
//!
//! `cargo build --release --example stream_client`;
//! `target/release/examples/stream_client 127.0.0.1:PORT SECONDS CONNS BODY_FILE`

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use spillway::http::chunked::ChunkedParser;
use spillway::http::sse::SseCounter;

#[derive(Default)]
struct Figures {
    requests: u64,
    errors: u64,
    events: u64,
    bytes: u64,
    ttft_us: Vec<u32>,
    itl_us: Vec<u32>,
}

/// How the response body ends.
enum Body {
    Chunked(ChunkedParser),
    Length(usize),
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: stream_client ADDR SECONDS CONNS BODY_FILE");
        std::process::exit(2);
    }
    let addr: SocketAddr = args[1].parse().expect("ADDR");
    let secs: f64 = args[2].parse().expect("SECONDS");
    let conns: usize = args[3].parse().expect("CONNS");
    let body = std::fs::read(&args[4]).expect("BODY_FILE");
    let request = Rc::new(request(addr, &body));
    let figures = Rc::new(RefCell::new(Figures::default()));
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .build()
        .expect("runtime");
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    rt.block_on(async {
        let tasks: Vec<_> = (0..conns)
            .map(|_| monoio::spawn(connection(addr, request.clone(), figures.clone(), end)))
            .collect();
        for t in tasks {
            t.await;
        }
    });
    let window = start.elapsed().as_secs_f64();
    report(&mut figures.borrow_mut(), window);
}

fn request(addr: SocketAddr, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: text/event-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// One connection's closed loop until `end`; reconnects after an error.
async fn connection(
    addr: SocketAddr,
    request: Rc<Vec<u8>>,
    figures: Rc<RefCell<Figures>>,
    end: Instant,
) {
    let mut buf = Vec::with_capacity(64 * 1024);
    while Instant::now() < end {
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            figures.borrow_mut().errors += 1;
            monoio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        while Instant::now() < end {
            let sent = Instant::now();
            let (res, _) = stream.write_all((*request).clone()).await;
            let outcome = match res {
                Ok(_) => exchange(&mut stream, &mut buf, sent).await,
                Err(_) => None,
            };
            let mut f = figures.borrow_mut();
            match outcome {
                Some(one) => f.add(one),
                None => {
                    f.errors += 1;
                    break;
                }
            }
        }
    }
}

/// What one streamed response showed.
struct One {
    events: u64,
    bytes: u64,
    ttft_us: u32,
    itl_us: Vec<u32>,
}

impl Figures {
    fn add(&mut self, one: One) {
        self.requests += 1;
        self.events += one.events;
        self.bytes += one.bytes;
        self.ttft_us.push(one.ttft_us);
        self.itl_us.extend_from_slice(&one.itl_us);
    }
}

/// Reads one response to its end; None on an error or a status other than 200.
async fn exchange(stream: &mut TcpStream, buf: &mut Vec<u8>, sent: Instant) -> Option<One> {
    buf.clear();
    let mut sse = SseCounter::default();
    let mut one = One {
        events: 0,
        bytes: 0,
        ttft_us: 0,
        itl_us: Vec::with_capacity(128),
    };
    let mut last: Option<Instant> = None;
    let mut body: Option<Body> = None;
    loop {
        let (n, b) = stream.read(std::mem::take(buf)).await;
        *buf = b;
        let n = n.ok()?;
        if n == 0 {
            return None;
        }
        let now = Instant::now();
        one.bytes += n as u64;
        if body.is_none() {
            let Some((head_len, b)) = head(buf)? else {
                continue;
            };
            body = Some(b);
            buf.drain(..head_len);
        }
        let mut events = 0;
        let done = match body.as_mut()? {
            Body::Chunked(p) => {
                let (used, done) = p.skim(buf, |d| events += sse.feed(d)).ok()?;
                buf.drain(..used);
                done
            }
            Body::Length(left) => {
                let take = (*left).min(buf.len());
                events += sse.feed(&buf[..take]);
                buf.drain(..take);
                *left -= take;
                *left == 0
            }
        };
        for _ in 0..events {
            match last {
                None => one.ttft_us = micros(now - sent),
                Some(l) => one.itl_us.push(micros(now - l)),
            }
            last = Some(now);
        }
        one.events += events;
        if done {
            return Some(one);
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 * 1024);
        }
    }
}

/// Parses the response head at the start of `buf`: its length and how the body ends
/// (`Some(None)`: not all there yet; None: an error, or a status other than 200).
fn head(buf: &[u8]) -> Option<Option<(usize, Body)>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(len) = resp.parse(buf).ok()? else {
        return Some(None);
    };
    if resp.code != Some(200) {
        return None;
    }
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Some(Some((len, Body::Chunked(ChunkedParser::new()))));
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(h.value).ok()?.trim().parse().ok()?;
            return Some(Some((len, Body::Length(n))));
        }
    }
    None
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn pct(v: &[u32], p: f64) -> u32 {
    if v.is_empty() {
        return 0;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn report(f: &mut Figures, window: f64) {
    f.ttft_us.sort_unstable();
    f.itl_us.sort_unstable();
    println!(
        "requests={} errors={} events={} bytes={} rate={:.1} events_per_s={:.0} \
         ttft_p50_us={} ttft_p99_us={} itl_p50_us={} itl_p90_us={} itl_p99_us={} itl_p999_us={} \
         itl_samples={}",
        f.requests,
        f.errors,
        f.events,
        f.bytes,
        f.requests as f64 / window,
        f.events as f64 / window,
        pct(&f.ttft_us, 0.5),
        pct(&f.ttft_us, 0.99),
        pct(&f.itl_us, 0.5),
        pct(&f.itl_us, 0.9),
        pct(&f.itl_us, 0.99),
        pct(&f.itl_us, 0.999),
        f.itl_us.len(),
    );
}
