#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]
//! The mock engine's fault modes over raw TCP: `GET`/`POST /fault`, and what `fail`, `hang`,
//! `dead-core` and `flap` answer (or do not).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use spillway_mock::{Fault, MockConfig, MockHandle, start};

/// How long a silent engine is listened to before the test calls it silent.
const SILENCE: Duration = Duration::from_millis(300);

fn mock(fault: Fault) -> MockHandle {
    mock_with(MockConfig { fault, ..config() })
}

fn config() -> MockConfig {
    MockConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        model: "m".into(),
        decode_step_base_ms: 1.0,
        decode_step_per_seq_ms: 0.0,
        ..MockConfig::default()
    }
}

fn mock_with(cfg: MockConfig) -> MockHandle {
    start(cfg).unwrap()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: m\r\n\r\n")
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: m\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

const GENERATE: &str = r#"{"prompt":"x","max_tokens":2}"#;

/// Sends `request` and reads one Content-Length response: its status and body.
fn exchange(s: &mut TcpStream, request: &str) -> (u16, String) {
    s.write_all(request.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "closed mid-head: {buf:?}");
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .expect("content-length")
        .parse()
        .unwrap();
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).unwrap();
    (
        head[9..12].parse().unwrap(),
        String::from_utf8(body).unwrap(),
    )
}

/// One request on a fresh connection.
fn once(addr: SocketAddr, request: &str) -> (u16, String) {
    exchange(&mut connect(addr), request)
}

/// Sends `request` and asserts that nothing comes back for a while and the connection
/// stays open.
fn assert_silent(s: &mut TcpStream, request: &str) {
    s.write_all(request.as_bytes()).unwrap();
    s.set_read_timeout(Some(SILENCE)).unwrap();
    let mut buf = [0u8; 256];
    match s.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        Ok(0) => panic!("the connection was closed"),
        Ok(n) => panic!("answered: {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(e) => panic!("read failed: {e}"),
    }
}

#[test]
fn the_mode_is_read_and_switched_at_runtime() {
    let m = mock(Fault::None);
    assert_eq!(
        once(m.addr, &get("/fault")),
        (200, r#"{"mode":"none"}"#.into())
    );
    let mut s = connect(m.addr);
    let switch = post("/fault", r#"{"mode":"fail"}"#);
    assert_eq!(
        exchange(&mut s, &switch),
        (200, r#"{"mode":"fail"}"#.into())
    );
    assert_eq!(exchange(&mut s, &get("/fault")).1, r#"{"mode":"fail"}"#);
    for bad in [r#"{"mode":"sick"}"#, r#"{"fault":"hang"}"#, "hang", ""] {
        let (status, body) = once(m.addr, &post("/fault", bad));
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains(r#""type":"BadRequestError""#), "{body}");
    }
    let put = "PUT /fault HTTP/1.1\r\nhost: m\r\ncontent-length: 0\r\n\r\n";
    assert_eq!(once(m.addr, put).0, 405);
    let flap = post("/fault", r#"{"mode":"flap","flap_period_ms":500}"#);
    assert_eq!(
        once(m.addr, &flap).1,
        r#"{"mode":"flap","flap_period_ms":500}"#
    );
    assert_eq!(once(m.addr, &post("/fault", r#"{"mode":"none"}"#)).0, 200);
    assert_eq!(once(m.addr, &post("/v1/completions", GENERATE)).0, 200);
}

#[test]
fn fail_answers_every_api_request_with_500_at_once_and_health_with_200() {
    let m = mock(Fault::Fail);
    let mut s = connect(m.addr);
    let started = Instant::now();
    let (status, body) = exchange(&mut s, &post("/v1/chat/completions", "{}"));
    assert_eq!(status, 500);
    assert_eq!(
        body,
        r#"{"error":{"message":"engine failed","type":"InternalServerError","code":500}}"#
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    // The same connection goes on: the API server is alive.
    assert_eq!(exchange(&mut s, &get("/health")).0, 200);
    assert_eq!(exchange(&mut s, &get("/v1/models")).0, 500);
    assert_eq!(exchange(&mut s, &post("/v1/completions", GENERATE)).0, 500);
    assert_eq!(exchange(&mut s, &get("/metrics")).0, 200);
    assert_eq!(exchange(&mut s, &get("/fault")).1, r#"{"mode":"fail"}"#);
    exchange(&mut s, &post("/fault", r#"{"mode":"none"}"#));
    assert_eq!(exchange(&mut s, &post("/v1/completions", GENERATE)).0, 200);
}

#[test]
fn hang_reads_everything_answers_nothing_and_keeps_connections_open() {
    let m = mock(Fault::Hang);
    let mut health = connect(m.addr);
    assert_silent(&mut health, &get("/health"));
    let mut generate = connect(m.addr);
    assert_silent(&mut generate, &post("/v1/completions", GENERATE));
    assert_silent(&mut connect(m.addr), "not http\r\n\r\n");
    // /fault still answers, so the engine can be healed.
    assert_eq!(once(m.addr, &get("/fault")).1, r#"{"mode":"hang"}"#);
    assert_eq!(once(m.addr, &post("/fault", r#"{"mode":"none"}"#)).0, 200);
    assert_eq!(once(m.addr, &get("/health")).0, 200);
    // A request that hung stays unanswered.
    assert_silent(&mut health, "");
}

#[test]
fn hang_stops_load_pushes() {
    let admin = TcpListener::bind("127.0.0.1:0").unwrap();
    admin.set_nonblocking(true).unwrap();
    let m = mock_with(MockConfig {
        fault: Fault::Hang,
        push_load: Some(format!("http://{}", admin.local_addr().unwrap())),
        push_interval_ms: 10,
        ..config()
    });
    std::thread::sleep(SILENCE);
    assert!(admin.accept().is_err(), "a hung engine pushed its load");
    once(m.addr, &post("/fault", r#"{"mode":"none"}"#));
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin.accept().is_err() {
        assert!(Instant::now() < deadline, "no push after healing");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn dead_core_answers_health_but_never_a_generation() {
    let m = mock(Fault::DeadCore);
    let mut s = connect(m.addr);
    assert_eq!(exchange(&mut s, &get("/health")).0, 200);
    assert_eq!(exchange(&mut s, &get("/metrics")).0, 200);
    assert_silent(&mut s, &post("/v1/chat/completions", "{}"));
    assert_silent(&mut connect(m.addr), &post("/v1/completions", GENERATE));
    assert_eq!(once(m.addr, &get("/health")).0, 200);
    assert_eq!(once(m.addr, &get("/fault")).1, r#"{"mode":"dead-core"}"#);
}

#[test]
fn flap_alternates_healthy_and_failing_starting_healthy() {
    let m = mock_with(MockConfig {
        fault: Fault::Flap,
        flap_period_ms: 150,
        ..config()
    });
    let mut s = connect(m.addr);
    let mut statuses = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1000) {
        let (status, _) = exchange(&mut s, &post("/v1/completions", GENERATE));
        if statuses.last() != Some(&status) {
            statuses.push(status);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Runs of equal statuses: healthy first, then failing, then healthy again, ...
    assert!(statuses.len() >= 3, "{statuses:?}");
    for (i, status) in statuses.iter().enumerate() {
        assert_eq!(*status, if i % 2 == 0 { 200 } else { 500 }, "{statuses:?}");
    }
    // Health stays up through the failing half.
    assert_eq!(exchange(&mut s, &get("/health")).0, 200);
}
