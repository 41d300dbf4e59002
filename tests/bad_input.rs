#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Bad input: each case gets its status and JSON error, the connection closes where the
//! framing is in doubt, and nothing ambiguous reaches a worker.

use spillway_testkit::*;
use std::time::Duration;

fn setup(extra: &str) -> (Upstream, ServerHandle) {
    let up = echo_upstream("a");
    let p = proxy(1, &format!("{extra}\n{}", model("m", "", &[up.url()])));
    (up, p)
}

/// (name, raw request, status, connection closes afterwards)
fn cases() -> Vec<(&'static str, Vec<u8>, u16, bool)> {
    let big_header = format!(
        "GET / HTTP/1.1\r\nHost: h\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    vec![
        ("malformed request line", b"GARBAGE\r\n\r\n".to_vec(), 400, true),
        ("bad method token", b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n".to_vec(), 400, true),
        ("bad header name", b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nBad Header: x\r\n\r\n".to_vec(), 400, true),
        ("unsupported version", b"GET / HTTP/2.0\r\nHost: h\r\n\r\n".to_vec(), 505, true),
        ("missing host", b"GET /v1/models HTTP/1.1\r\n\r\n".to_vec(), 400, true),
        ("header section too large", big_header.into_bytes(), 431, true),
        ("body too large", b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 999999999\r\n\r\n".to_vec(), 413, true),
        ("content-length and transfer-encoding",
         b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 17\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(), 400, true),
        ("differing content-lengths",
         b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 13\r\nContent-Length: 14\r\n\r\n{\"model\":\"m\"}".to_vec(), 400, true),
        ("invalid content-length", b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 1x\r\n\r\n".to_vec(), 400, true),
        ("invalid chunk size",
         b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{\"model\":\"m\"}\r\n0\r\n\r\n".to_vec(), 400, true),
        ("unsupported transfer coding",
         b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n".to_vec(), 501, true),
        ("obs-fold", b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n  folded\r\nContent-Length: 13\r\n\r\n{\"model\":\"m\"}".to_vec(), 400, true),
        ("chunked body too large", {
            let mut r = b"POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            r.extend(format!("{:x}\r\n{}\r\n", 2000, "a".repeat(2000)).as_bytes());
            r
        }, 413, true),
        ("non-JSON body", post("/v1/chat/completions", "model=m"), 400, false),
        ("truncated JSON", post("/v1/chat/completions", r#"{"model":"m""#), 400, false),
        ("JSON array body", post("/v1/chat/completions", r#"[{"model":"m"}]"#), 400, false),
        ("missing model", post("/v1/chat/completions", r#"{"messages":[{"model":"m"}]}"#), 400, false),
        ("model not a string", post("/v1/chat/completions", r#"{"model":7}"#), 400, false),
        ("duplicate model", post("/v1/chat/completions", r#"{"model":"m","model":"x"}"#), 400, false),
        ("empty body", post("/v1/chat/completions", ""), 400, false),
        ("unknown model", chat("nope"), 404, false),
        ("unknown path", get("/nope"), 404, false),
        ("admin path on data listener", get("/metrics"), 404, false),
        ("wrong method", get("/v1/chat/completions"), 405, false),
    ]
}

#[test]
fn every_bad_input_gets_its_status_and_nothing_is_forwarded() {
    let (up, p) = setup("[limits]\nmax_body_bytes = 1024");
    for (name, raw, status, closes) in cases() {
        let mut c = Client::connect(p.data_addr);
        let r = c.request(&raw);
        assert_eq!(r.status, status, "{name}: {}", r.text());
        let v = r.json();
        assert_eq!(v["code"], status, "{name}");
        assert!(
            v["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{name}"
        );
        assert_eq!(
            v["type"],
            http::StatusCode::from_u16(status)
                .unwrap()
                .canonical_reason()
                .unwrap(),
            "{name}"
        );
        assert!(r.header("x-request-id").is_some(), "{name}");
        if closes {
            assert_eq!(r.header("connection"), Some("close"), "{name}");
            assert!(c.closed(), "{name}: connection stayed open");
        } else {
            // Framing is intact: the same connection serves the next request.
            let next = c.request(&chat("m"));
            assert_eq!(next.status, 200, "{name}: connection unusable afterwards");
        }
    }
    let forwarded: Vec<_> = up.seen().iter().map(|s| s.body_str()).collect();
    assert!(
        forwarded
            .iter()
            .all(|b| b == r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#),
        "{forwarded:?}"
    );
}

#[test]
fn exact_model_not_found_body() {
    let (_up, p) = setup("");
    let r = once(p.data_addr, &chat("missing"));
    assert_eq!(r.status, 404);
    assert_eq!(
        r.text(),
        r#"{"message":"Model not found","type":"Not Found","code":404}"#
    );
}

#[test]
fn slow_header_gets_408_then_close() {
    let (up, p) = setup("[limits]\nheader_read_timeout_ms = 200");
    let mut c = Client::connect(p.data_addr);
    c.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\n");
    let r = c.response();
    assert_eq!(r.status, 408);
    assert!(c.closed());
    assert_eq!(up.count(), 0);
}

#[test]
fn stalled_body_gets_its_own_408_then_close() {
    // The idle timeout is long: only the body timeout can end this request.
    let (up, p) = setup("[limits]\nbody_read_timeout_ms = 200\nidle_timeout_ms = 60000");
    let mut c = Client::connect(p.data_addr);
    c.send(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 40\r\n\r\n{\"model\"",
    );
    let r = c.response();
    assert_eq!(r.status, 408, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        "timed out reading the request body",
        "{}",
        r.text()
    );
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed());
    assert_eq!(up.count(), 0);
}

#[test]
fn idle_keep_alive_connection_closes_silently() {
    let (_up, p) = setup("[limits]\nidle_timeout_ms = 200");
    let mut c = Client::connect(p.data_addr);
    assert_eq!(c.request(&chat("m")).status, 200);
    std::thread::sleep(Duration::from_millis(400));
    assert!(c.closed());
}

#[test]
fn too_many_connections_are_refused_cleanly() {
    let (_up, p) = setup("[limits]\nmax_connections = 2");
    let mut a = Client::connect(p.data_addr);
    let mut b = Client::connect(p.data_addr);
    assert_eq!(a.request(&chat("m")).status, 200);
    assert_eq!(b.request(&chat("m")).status, 200);
    let mut c = Client::connect(p.data_addr);
    let r = c.response();
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["message"], "Too many connections");
    assert!(c.closed());
    drop(a);
    eventually("a slot frees up", Duration::from_secs(5), || {
        let mut d = Client::connect(p.data_addr);
        d.send(&chat("m"));
        d.response().status == 200
    });
}

/// A path with a dot-segment (`.` or `..`, also percent-encoded) is refused with 400
/// before routing, so `/v1/../internal/reset` never reaches a worker that would
/// normalise it to `/internal/reset` (issue 26, item 7). Dots in a query, longer runs of
/// dots and encoded slashes pass as they are.
#[test]
fn dot_segments_are_refused_before_anything_is_forwarded() {
    let (up, p) = setup("");
    let body = r#"{"model":"m","messages":[]}"#;
    for path in [
        "/v1/../internal/reset",
        "/v1/%2e%2e/internal/reset",
        "/v1/%2E%2E/internal/reset",
        "/v1/.%2e/internal/reset",
        "/v1/%2e./internal/reset",
        "/v1/./chat/completions",
        "/v1/chat/completions/..",
        "/v1/%2e/chat/completions?x=1",
        "http://h/v1/../internal/reset",
    ] {
        let mut c = Client::connect(p.data_addr);
        let r = c.request(&post(path, body));
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(
            r.json()["message"],
            "malformed request: request path contains a dot-segment",
            "{path}"
        );
        assert!(c.closed(), "{path}: connection stayed open");
    }
    assert_eq!(up.count(), 0, "forwarded: {:?}", up.seen());
    for path in [
        "/v1/chat/completions?next=/../x",
        "/v1/.../x",
        "/v1/.well-known/x",
        "/v1/%2e%2e%2Finternal",
    ] {
        let r = once(p.data_addr, &post(path, body));
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    let paths: Vec<String> = up.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(
        paths,
        [
            "/v1/chat/completions?next=/../x",
            "/v1/.../x",
            "/v1/.well-known/x",
            "/v1/%2e%2e%2Finternal"
        ]
    );
}
