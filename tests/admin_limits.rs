#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! The admin listener's limits: a client that sends its request too slowly is cut off after
//! `admin_read_timeout_ms` (408 once it started, a silent close before); at
//! `admin_max_connections` the oldest connection with no request head in progress is
//! closed to make room, so hundreds of half-open connections never keep an operator out,
//! and only when every place holds a request under way does a newcomer get 503 at once;
//! meanwhile the monitor keeps publishing the busy set.

use spillway_testkit::*;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// An admin request for a keep-alive connection.
fn req(method: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: admin\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn slow_admin_clients_are_cut_off_after_the_read_timeout() {
    let up = echo_upstream("a");
    let p = proxy(
        1,
        &format!(
            "[limits]\nadmin_read_timeout_ms = 300\n{}",
            model("m", "", &[up.url()])
        ),
    );
    let mut half_head = Client::connect(p.admin_addr);
    half_head.send(b"GET /health HTTP/1.1\r\nHo");
    let mut half_body = Client::connect(p.admin_addr);
    half_body.send(
        b"POST /load HTTP/1.1\r\nhost: a\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"worker_id\"",
    );
    let mut silent = Client::connect(p.admin_addr);

    // The slow ones hold nothing up.
    let r = admin_get(p.admin_addr, "/health");
    assert_eq!(r.status, 200, "{}", r.text());

    for (c, message) in [
        (&mut half_head, "timed out reading the request head"),
        (&mut half_body, "timed out reading the request body"),
    ] {
        let r = c.response();
        assert_eq!(r.status, 408, "{}", r.text());
        assert_eq!(r.json()["error"], message);
        assert_eq!(r.header("connection"), Some("close"));
        assert!(c.closed(), "{message}: connection stayed open");
    }
    assert!(silent.closed(), "a silent connection stayed open");

    // A keep-alive client is answered, then closed once it idles past the timeout.
    let mut idle = Client::connect(p.admin_addr);
    assert_eq!(idle.request(&req("GET", "/health", "")).status, 200);
    assert!(idle.closed(), "an idle keep-alive connection stayed open");
    assert_eq!(up.count(), 0);
}

/// A connection in the middle of its second request: the first (`GET /health`) answered,
/// the second's head complete and part of its body sent. Both went in one write, so the
/// connection never waits for a head: its place is never one to evict.
fn mid_request(admin: SocketAddr) -> Client {
    let mut c = Client::connect(admin);
    let mut raw = req("GET", "/health", "");
    raw.extend_from_slice(
        b"POST /busy_threshold HTTP/1.1\r\nhost: admin\r\ncontent-type: application/json\r\n\
          content-length: 13\r\n\r\n{\"model\"",
    );
    assert_eq!(c.request(&raw).status, 200);
    c
}

/// The rest of [`mid_request`]'s body, and its answer.
fn finish(c: &mut Client) -> Response {
    c.request(b":\"m\"}")
}

#[test]
fn admin_connections_are_capped_while_the_monitor_keeps_publishing() {
    let held = Held::new("a");
    let toml = format!(
        "[limits]\nadmin_max_connections = 3\nadmin_read_timeout_ms = 60000\n\
         [[models]]\nname = \"m\"\nactive_prefill_tokens_threshold = 0\n\
         [[models.workers]]\nurl = \"{}\"\nname = \"a\"\n",
        held.url()
    );
    let p = proxy(1, &toml);

    // Two clients hold a place each in the middle of a request.
    let mut mid: Vec<Client> = (0..2).map(|_| mid_request(p.admin_addr)).collect();
    // The third and last place: a keep-alive client (its answer proves it was accepted,
    // after the others).
    let mut k = Client::connect(p.admin_addr);
    assert_eq!(k.request(&req("GET", "/health", "")).status, 200);

    // The monitor's timers still run: a request held in flight is tracked prefill load,
    // folded into the busy set every monitor interval; its completion clears it again.
    let metric = |k: &mut Client, series: &str| {
        let text = k.request(&req("GET", "/metrics", "")).text();
        metric_value(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    let publishes = "spillway_busy_publish_total";
    let busy = "spillway_busy_workers{model=\"m\"}";
    let before = metric(&mut k, publishes);
    let in_flight = spawn_request(p.data_addr, chat("m"));
    eventually(
        "the held request marks the worker busy",
        Duration::from_secs(10),
        || metric(&mut k, busy) == 1.0,
    );
    held.release(1);
    assert_eq!(in_flight.join().unwrap().status, 200);
    eventually(
        "the finished request clears it",
        Duration::from_secs(10),
        || metric(&mut k, busy) == 0.0,
    );
    assert!(metric(&mut k, publishes) >= before + 2.0);

    // At the cap, the keep-alive client between requests is the oldest without a request
    // in progress: it makes room, and is closed.
    let mut third = mid_request(p.admin_addr);
    assert!(k.closed(), "the idle keep-alive connection kept its place");

    // Every place has a request under way: 503 at once, without reading a byte, then close.
    let mut over = Client::connect(p.admin_addr);
    let r = over.response();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"], "Too many admin connections");
    assert!(over.closed());

    // The ones in the middle of a request kept their places: each is answered.
    for c in mid.iter_mut().chain([&mut third]) {
        let r = finish(c);
        assert_eq!(r.status, 200, "lost its place: {}", r.text());
        assert_eq!(r.json()["model"], "m");
    }
    let text = third.request(&req("GET", "/metrics", "")).text();
    let evicted = "spillway_admin_connections_evicted_total";
    assert_eq!(metric_value(&text, evicted), Some(1.0), "{text}");
    // A place frees when a client leaves.
    drop(mid);
    eventually("a place frees up", Duration::from_secs(10), || {
        let mut c = Client::connect(p.admin_addr);
        c.request(&req("GET", "/health", "")).status == 200
    });
}

/// A connection that sent half a head, or nothing, and never sends more.
struct HalfOpen(TcpStream);

impl HalfOpen {
    fn open(admin: SocketAddr, i: usize) -> HalfOpen {
        let mut s = TcpStream::connect(admin).expect("connect");
        if !i.is_multiple_of(4) {
            s.write_all(b"GET /health HTTP/1.1\r\nHo").expect("send");
        }
        s.set_nonblocking(true).unwrap();
        HalfOpen(s)
    }

    /// True once the proxy closed it (EOF or reset); never blocks.
    fn closed(&mut self) -> bool {
        let mut tmp = [0u8; 64];
        match self.0.read(&mut tmp) {
            Ok(0) => true,
            Ok(n) => panic!(
                "an evicted connection got an answer: {}",
                String::from_utf8_lossy(&tmp[..n])
            ),
            Err(e) => e.kind() != ErrorKind::WouldBlock,
        }
    }
}

/// Raises the fd soft limit to the hard one: the test holds 300 sockets and the proxy's
/// side of its admitted ones.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    }
}

#[test]
fn half_open_connections_never_keep_an_operator_out() {
    const HALF_OPEN: usize = 300;
    const CAP: usize = 16;
    raise_fd_limit();
    let up = echo_upstream("a");
    let p = proxy(
        1,
        &format!(
            "[limits]\nadmin_max_connections = {CAP}\nadmin_read_timeout_ms = 60000\n{}",
            model("m", "", &[up.url()])
        ),
    );
    let mut half: Vec<HalfOpen> = (0..HALF_OPEN)
        .map(|i| HalfOpen::open(p.admin_addr, i))
        .collect();
    let started = Instant::now();
    for round in 0..3 {
        let r = admin_get(p.admin_addr, "/health");
        assert_eq!(
            (r.status, r.json()["status"].clone()),
            (200, "healthy".into())
        );
        let r = admin_get(p.admin_addr, "/metrics");
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        let body = r#"{"model":"m","active_prefill_tokens_threshold":5000}"#;
        let r = admin_post(p.admin_addr, "/busy_threshold", body);
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        assert_eq!(r.json()["active_prefill_tokens_threshold"], 5000);
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "operator requests waited {:?}",
        started.elapsed()
    );
    // The oldest went first: all but the last CAP were closed before any operator came,
    // and the first operator request closed one more.
    eventually(
        "the oldest half-open connections are closed",
        Duration::from_secs(10),
        || half[..HALF_OPEN - CAP].iter_mut().all(HalfOpen::closed),
    );
    let text = metrics(p.admin_addr);
    let evicted = metric_value(&text, "spillway_admin_connections_evicted_total").unwrap();
    assert!(evicted as usize > HALF_OPEN - CAP, "{evicted}");
    // Each eviction is a half-open connection its client sees closed; no other closed.
    eventually(
        "every eviction is seen closed",
        Duration::from_secs(10),
        || {
            half.iter_mut()
                .filter_map(|h| h.closed().then_some(()))
                .count()
                == evicted as usize
        },
    );
    assert_eq!(up.count(), 0);
}
