#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Forwarding: keep-alive on both sides, headers, bodies, framing, pipelining, /v1/models.

use spillway_testkit::*;
use std::time::Duration;

#[test]
fn proxies_a_chat_completion_and_rewrites_headers() {
    let up = echo_upstream("a");
    let p = proxy(1, &model("m", "", &[up.url()]));
    let mut c = Client::connect(p.data_addr);
    let body = r#"{"model":"m","messages":[]}"#;
    let raw = format!(
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: proxy.example\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\nKeep-Alive: timeout=5\r\n\
         X-Forwarded-For: 10.9.8.7\r\nX-Request-Id: client-id-1\r\nX-Custom: yes\r\n\r\n{body}",
        body.len()
    );
    let r = c.request(raw.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), r#"{"worker":"a"}"#);
    assert_eq!(r.header("x-request-id"), Some("client-id-1"));
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    let s = &seen[0];
    assert_eq!(s.method, "POST");
    assert_eq!(s.path, "/v1/chat/completions?x=1");
    assert_eq!(s.body_str(), body);
    assert_eq!(s.header("host"), Some("proxy.example"));
    assert_eq!(s.header("x-custom"), Some("yes"));
    assert_eq!(s.header("x-forwarded-for"), Some("10.9.8.7, 127.0.0.1"));
    assert_eq!(s.header("x-request-id"), Some("client-id-1"));
    assert_eq!(
        s.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    for hop in ["connection", "x-drop", "keep-alive"] {
        assert!(s.header(hop).is_none(), "{hop} was forwarded");
    }
}

#[test]
fn generates_request_id_when_missing() {
    let up = echo_upstream("a");
    let p = proxy(1, &model("m", "", &[up.url()]));
    let r1 = once(p.data_addr, &chat("m"));
    let r2 = once(p.data_addr, &chat("m"));
    let (a, b) = (
        r1.header("x-request-id").unwrap(),
        r2.header("x-request-id").unwrap(),
    );
    assert_eq!(a.len(), 32);
    assert_ne!(a, b);
    assert_eq!(up.seen()[0].header("x-request-id"), Some(a));
}

#[test]
fn keep_alive_is_reused_on_both_sides() {
    let up = echo_upstream("a");
    let p = proxy(1, &model("m", "", &[up.url()]));
    let mut c = Client::connect(p.data_addr);
    for _ in 0..20 {
        assert_eq!(c.request(&chat("m")).status, 200);
    }
    assert_eq!(up.count(), 20);
    assert_eq!(up.connections(), 1, "upstream connection was not reused");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let up = upstream(|s| Reply::Raw(json_response(200, &s.body_str())));
    let p = proxy(1, &model("m", "", &[up.url()]));
    let mut c = Client::connect(p.data_addr);
    let mut raw = Vec::new();
    for i in 0..5 {
        raw.extend(post(
            "/v1/completions",
            &format!(r#"{{"model":"m","prompt":"{i}"}}"#),
        ));
    }
    c.send(&raw);
    for i in 0..5 {
        let r = c.response();
        assert_eq!(r.status, 200);
        assert!(
            r.text().contains(&format!(r#""prompt":"{i}""#)),
            "{}",
            r.text()
        );
    }
}

#[test]
fn chunked_request_body_is_forwarded_with_content_length() {
    let up = upstream(|s| Reply::Raw(json_response(200, &s.body_str())));
    let p = proxy(1, &model("m", "", &[up.url()]));
    let body = r#"{"model":"m","prompt":"hello world"}"#;
    let (a, b) = body.split_at(10);
    let raw = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x};ext=1\r\n{b}\r\n0\r\nX-Trailer: t\r\n\r\n",
        a.len(),
        b.len()
    );
    let mut c = Client::connect(p.data_addr);
    let r = c.request(raw.as_bytes());
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), body);
    let s = &up.seen()[0];
    assert_eq!(
        s.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    assert!(s.header("transfer-encoding").is_none());
    // The connection stays usable after the chunked body.
    assert_eq!(c.request(&chat("m")).status, 200);
}

#[test]
fn expect_continue_gets_100_then_the_response() {
    let up = echo_upstream("a");
    let p = proxy(1, &model("m", "", &[up.url()]));
    let body = r#"{"model":"m"}"#;
    let mut c = Client::connect(p.data_addr);
    c.send(format!("POST /v1/completions HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
    let r = c.response();
    assert_eq!(r.status, 100);
    c.send(body.as_bytes());
    let r = c.response();
    assert_eq!(r.status, 200);
    assert!(up.seen()[0].header("expect").is_none());
}

#[test]
fn chunked_and_close_delimited_responses() {
    let chunked = upstream(|_| {
        let mut b =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n"
                .to_vec();
        b.extend(chunk("hello "));
        b.extend(chunk("world"));
        b.extend(b"0\r\n\r\n");
        Reply::Raw(b)
    });
    let close = upstream(|_| {
        Reply::Steps(vec![
            Step::Write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil ".to_vec()),
            Step::Sleep(Duration::from_millis(20)),
            Step::Write(b"close".to_vec()),
            Step::Close,
        ])
    });
    let p = proxy(
        1,
        &format!(
            "{}{}",
            model("chunked", "", &[chunked.url()]),
            model("close", "", &[close.url()])
        ),
    );
    let mut c = Client::connect(p.data_addr);
    for _ in 0..3 {
        let r = c.request(&chat("chunked"));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("transfer-encoding"), Some("chunked"));
        assert_eq!(r.text(), "hello world");
    }
    assert_eq!(chunked.connections(), 1);
    // Close-delimited upstream: re-chunked for an HTTP/1.1 client, which keeps its connection.
    for _ in 0..2 {
        let r = c.request(&chat("close"));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("transfer-encoding"), Some("chunked"));
        assert_eq!(r.text(), "until close");
    }
    assert_eq!(
        close.connections(),
        2,
        "a close-delimited connection must not be reused"
    );
    // HTTP/1.0 client: close-delimited and the connection closes.
    let body = r#"{"model":"close"}"#;
    let mut c10 = Client::connect(p.data_addr);
    let r = c10.request(
        format!(
            "POST /v1/completions HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "until close");
    assert!(r.header("transfer-encoding").is_none());
}

#[test]
fn http10_keep_alive_is_honoured() {
    let up = echo_upstream("a");
    let p = proxy(1, &model("m", "", &[up.url()]));
    let body = r#"{"model":"m"}"#;
    let raw = format!(
        "POST /v1/completions HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut c = Client::connect(p.data_addr);
    let r = c.request(raw.as_bytes());
    assert_eq!(r.header("connection"), Some("keep-alive"));
    assert_eq!(c.request(raw.as_bytes()).status, 200);
}

#[test]
fn connection_close_from_client_is_honoured() {
    let up = echo_upstream("a");
    let p = proxy(1, &model("m", "", &[up.url()]));
    let body = r#"{"model":"m"}"#;
    let mut c = Client::connect(p.data_addr);
    let r = c.request(format!("POST /v1/completions HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len()).as_bytes());
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed());
}

#[test]
fn models_list_and_unknown_paths() {
    let up = echo_upstream("a");
    let p = proxy(
        1,
        &format!(
            "{}{}",
            model("m1", "", &[up.url()]),
            model("m2", "", &[up.url()])
        ),
    );
    let mut c = Client::connect(p.data_addr);
    let r = c.request(&get("/v1/models"));
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    let ids: Vec<_> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["m1", "m2"]);
    assert_eq!(v["data"][0]["owned_by"], "spillway");
    assert_eq!(v["data"][0]["object"], "model");
    assert!(v["data"][0]["created"].as_u64().unwrap() > 1_600_000_000);
    c.send(b"HEAD /v1/models HTTP/1.1\r\nHost: h\r\n\r\n");
    let r = c.response_to(true);
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-length")
            .unwrap()
            .parse::<usize>()
            .unwrap()
            > 0
    );
    // The connection is still in step after the HEAD.
    assert_eq!(c.request(&get("/v1/models")).status, 200);
}

/// An absolute-form target goes upstream in origin-form with Host taken from the target
/// and the client's Host dropped (RFC 9112 §3.2.2, issue 26 item 8); a target with
/// userinfo or an empty authority is refused with 400 and never forwarded.
#[test]
fn absolute_form_target_sets_the_upstream_host() {
    let up = echo_upstream("a");
    let p = proxy(1, &model("m", "", &[up.url()]));
    let body = r#"{"model":"m","messages":[]}"#;
    let head = |target: &str, host: &str| {
        format!(
            "POST {target} HTTP/1.1\r\n{host}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut c = Client::connect(p.data_addr);
    let r = c.request(head("http://other:9/v1/chat/completions?x=1", "Host: x\r\n").as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c.request(head("HTTPS://[::1]:8443/v1/completions", "hOsT: x\r\n").as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = up.seen();
    let hosts = |i: usize| -> Vec<&str> {
        let s = &seen[i];
        s.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("host"))
            .map(|(_, v)| v.as_str())
            .collect()
    };
    assert_eq!(seen[0].path, "/v1/chat/completions?x=1");
    assert_eq!(hosts(0), ["other:9"]);
    assert_eq!(seen[1].path, "/v1/completions");
    assert_eq!(hosts(1), ["[::1]:8443"]);
    for (target, why) in [
        ("http://u:pw@other:9/v1/chat/completions", "userinfo"),
        ("http://u@other/v1/chat/completions", "userinfo"),
        ("http:///v1/chat/completions", "without a host"),
        ("http://:9/v1/chat/completions", "without a host"),
    ] {
        let mut c = Client::connect(p.data_addr);
        let r = c.request(head(target, "Host: x\r\n").as_bytes());
        assert_eq!(r.status, 400, "{target}: {}", r.text());
        let message = r.json()["message"].as_str().unwrap().to_string();
        assert!(message.contains(why), "{target}: {message}");
        assert!(c.closed(), "{target}");
    }
    assert_eq!(up.count(), 2, "{:?}", up.seen());
}
