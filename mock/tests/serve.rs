#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The mock engine's HTTP side with a plain blocking client: framing, refusals, pipelining,
//! HTTP/1.0 streams and aborts. Run it on both drivers (`MONOIO_FORCE_LEGACY_DRIVER=1`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use spillway_mock::{MockConfig, MockHandle, start};

fn mock() -> MockHandle {
    start(MockConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        model: "m".into(),
        decode_step_base_ms: 1.0,
        decode_step_per_seq_ms: 0.0,
        ..MockConfig::default()
    })
    .unwrap()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Everything the server sends until it closes the connection.
fn until_close(mut s: TcpStream) -> String {
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// Reads until `text` has been received `n` times.
fn until_seen(s: &mut TcpStream, text: &str, n: usize) -> String {
    let mut out = String::new();
    let mut buf = [0u8; 4096];
    while out.matches(text).count() < n {
        let got = s.read(&mut buf).unwrap();
        assert!(got > 0, "closed early: {out:?}");
        out.push_str(std::str::from_utf8(&buf[..got]).unwrap());
    }
    out
}

fn post(path: &str, body: &str, extra: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: m\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let mut s = connect(addr);
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: m\r\nconnection: close\r\n\r\n")
        .unwrap();
    let text = until_close(s);
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .unwrap_or_else(|| panic!("{name} missing: {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn refusals_are_json_and_close_the_connection() {
    let m = mock();
    let mut s = connect(m.addr);
    s.write_all(b"GET /health HTTP/1.1\r\nhost: m\r\n\r\nGET /health HTTP/1.1\r\nhost: m\r\nconnection: close\r\n\r\n")
        .unwrap();
    let text = until_close(s);
    assert_eq!(text.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{text}");
    assert!(text.ends_with("connection: close\r\n\r\n"), "{text}");

    let mut s = connect(m.addr);
    s.write_all(b"GET /health HTTP/1.1\r\n\r\n").unwrap();
    let text = until_close(s);
    assert!(text.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{text}");
    assert!(
        text.ends_with(r#"{"error":{"message":"missing Host header","type":"Bad Request","param":null,"code":400}}"#),
        "{text}"
    );

    let mut s = connect(m.addr);
    s.write_all(post("/v1/completions", "", "transfer-encoding: gzip\r\n").as_bytes())
        .unwrap();
    assert!(until_close(s).starts_with("HTTP/1.1 501 Not Implemented\r\n"));
}

#[test]
fn expect_continue_then_a_generation_over_http_1_0() {
    let m = mock();
    let mut s = connect(m.addr);
    let body = r#"{"prompt":"x","max_tokens":2}"#;
    let request = post("/v1/completions", body, "expect: 100-continue\r\n");
    let head_len = request.len() - body.len();
    s.write_all(&request.as_bytes()[..head_len]).unwrap();
    until_seen(&mut s, "HTTP/1.1 100 Continue\r\n\r\n", 1);
    s.write_all(body.as_bytes()).unwrap();
    let text = until_seen(&mut s, "\"usage\"", 1);
    assert!(text.contains("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"));

    // HTTP/1.0 has no chunks: the stream is delimited by the close.
    let mut s = connect(m.addr);
    let body = r#"{"prompt":"x","max_tokens":2,"stream":true}"#;
    let request = post("/v1/completions", body, "").replacen("HTTP/1.1", "HTTP/1.0", 1);
    s.write_all(request.as_bytes()).unwrap();
    let text = until_close(s);
    assert!(
        text.starts_with(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\nx-mock-prefill: local\r\n\r\ndata: {"
        ),
        "{text}"
    );
    assert!(text.ends_with("\n\ndata: [DONE]\n\n"), "{text}");
}

#[test]
fn a_pipelined_request_waits_for_the_stream_before_it() {
    let m = mock();
    let mut s = connect(m.addr);
    let stream = post(
        "/v1/completions",
        r#"{"prompt":"x","max_tokens":3,"stream":true}"#,
        "",
    );
    let health = "GET /health HTTP/1.1\r\nhost: m\r\nconnection: close\r\n\r\n";
    s.write_all(format!("{stream}{health}").as_bytes()).unwrap();
    let text = until_close(s);
    let done = text.find("0\r\n\r\n").expect("last chunk");
    let second = text
        .find("HTTP/1.1 200 OK\r\ncontent-type: text/plain")
        .unwrap();
    assert!(done < second, "{text}");
    assert_eq!(text.matches("data: {").count(), 3, "{text}");
}

#[test]
fn leaving_aborts_the_sequence() {
    let m = mock();
    let mut s = connect(m.addr);
    let body = r#"{"messages":[],"max_tokens":30000,"stream":true}"#;
    s.write_all(post("/v1/chat/completions", body, "").as_bytes())
        .unwrap();
    until_seen(&mut s, "data: {", 3);
    assert_eq!(metric(m.addr, "vllm:num_requests_running"), 1.0);
    drop(s);
    for tries in 0.. {
        if metric(m.addr, "vllm:kv_cache_usage_perc") == 0.0 {
            break;
        }
        assert!(tries < 1000, "blocks never freed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(metric(m.addr, "vllm:num_requests_running"), 0.0);
}

#[test]
fn a_repeated_long_prompt_is_served_from_the_prefix_cache() {
    let m = start(MockConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        model: "m".into(),
        decode_step_base_ms: 1.0,
        decode_step_per_seq_ms: 0.0,
        enable_prefix_caching: true,
        ..MockConfig::default()
    })
    .unwrap();
    // 1,000 bytes of prompt: 250 tokens; its text ("..." with quotes, 1,002 bytes) holds
    // 15 full blocks of 16 tokens.
    let prompt = "0123456789".repeat(100);
    let body = format!(r#"{{"model":"m","prompt":"{prompt}","max_tokens":2}}"#);
    let usage = |text: &str| -> serde_json::Value {
        let json = &text[text.find("\r\n\r\n").unwrap() + 4..];
        serde_json::from_str::<serde_json::Value>(json).unwrap()["usage"].clone()
    };
    let generate = || {
        let mut s = connect(m.addr);
        s.write_all(post("/v1/completions", &body, "connection: close\r\n").as_bytes())
            .unwrap();
        until_close(s)
    };
    let first = generate();
    assert_eq!(usage(&first)["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(metric(m.addr, "vllm:prefix_cache_hits_total"), 0.0);
    let second = generate();
    assert_eq!(usage(&second)["prompt_tokens"], 250);
    assert_eq!(
        usage(&second)["prompt_tokens_details"]["cached_tokens"],
        240
    );
    assert_eq!(metric(m.addr, "vllm:prefix_cache_queries_total"), 500.0);
    assert_eq!(metric(m.addr, "vllm:prefix_cache_hits_total"), 240.0);
    assert_eq!(metric(m.addr, "vllm:prompt_tokens_total"), 500.0);
}
