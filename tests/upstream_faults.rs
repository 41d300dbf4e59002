#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! Workers that misbehave on the wire (issue 26), scripted byte by byte: bytes after a
//! response's end, connections closed while pooled, heads trickled, invalid first chunks,
//! streams that break off or stall, clients that stop reading. Nothing a worker sends
//! reaches the wrong client, every wait has a bound, and every slot comes back.

use std::time::{Duration, Instant};

use spillway_testkit::*;

const CHAT: &str = "/v1/chat/completions";

/// `{"model":"m","client":n}`: a request that says who sent it.
fn request(n: usize) -> Vec<u8> {
    post(CHAT, &format!(r#"{{"model":"m","client":{n}}}"#))
}

/// The worker's answer to `seen`: its own body back, so each client can tell its answer.
fn echo(seen: &Seen) -> Vec<u8> {
    json_response(200, &seen.body_str())
}

/// Requests 0..n on one keep-alive client connection, `gap_ms` apart: their answers.
fn sequence(p: &ServerHandle, n: usize, gap_ms: u64) -> Vec<(u16, String)> {
    let mut c = Client::connect(p.data_addr);
    (0..n)
        .map(|i| {
            std::thread::sleep(Duration::from_millis(gap_ms));
            let r = c.request(&request(i));
            (r.status, r.text())
        })
        .collect()
}

fn own_answers(n: usize) -> Vec<(u16, String)> {
    (0..n)
        .map(|i| (200, format!(r#"{{"model":"m","client":{i}}}"#)))
        .collect()
}

fn metric(p: &ServerHandle, series: &str) -> f64 {
    metric_value(&metrics(p.admin_addr), series).unwrap_or(0.0)
}

/// Defect 1: bytes a worker sends after a response has ended are never read as the next
/// request's response; the pooled connection that carried them is closed.
#[test]
fn bytes_after_a_response_never_reach_the_next_client() {
    let stale = json_response(200, "STALE");
    // (what the worker does wrong, its script for each request)
    type Misstep = Box<dyn Fn(&Seen) -> Script + Send + Sync>;
    let cases: Vec<(&str, Misstep)> = vec![
        (
            "an unsolicited second response 10 ms later",
            Box::new(move |s| Script::new().write(echo(s)).sleep_ms(10).write(&stale)),
        ),
        (
            "a body longer than its Content-Length",
            Box::new(|s| Script::new().write(echo(s)).sleep_ms(10).write("STALE")),
        ),
        (
            "a 204 with a body",
            Box::new(|_| {
                let head = "HTTP/1.1 204 No Content\r\n\r\n";
                Script::new().write(head).sleep_ms(10).write("STALE")
            }),
        ),
    ];
    for (name, script) in cases {
        let up = scripted(move |_, s| script(s));
        let p = proxy(1, &model("m", "", &[up.url()]));
        let want = match name {
            "a 204 with a body" => vec![(204, String::new()); 5],
            _ => own_answers(5),
        };
        assert_eq!(sequence(&p, 5, 50), want, "{name}");
        // Every pooled connection that carried stray bytes was closed, not reused; the
        // last one too, with no request to come (closed as the bytes arrived).
        assert_eq!(up.connections(), 5, "{name}");
        eventually("the last connection closed", Duration::from_secs(5), || {
            metric(&p, "spillway_upstream_idle_closed_total") == 5.0
        });
    }
}

/// Defect 2: a pooled connection the worker closed (an idle timeout shorter than the
/// gap, or one request per connection without `Connection: close`) is never a 502.
#[test]
fn a_pooled_connection_the_worker_closed_is_not_a_502() {
    // Closed right after each response (llama.cpp's server does this after streams),
    // or a little later, while pooled.
    for close_after_ms in [0, 20] {
        let up = scripted(move |_, s| {
            Script::new()
                .write(echo(s))
                .sleep_ms(close_after_ms)
                .close()
        });
        let p = proxy(1, &model("m", "", &[up.url()]));
        assert_eq!(
            sequence(&p, 6, 50),
            own_answers(6),
            "closed after {close_after_ms} ms"
        );
        assert_eq!(up.count(), 6, "a request was sent twice");
    }
}

/// Defect 2, the race: the worker closes a reused connection as the request arrives,
/// without answering. Sent again once on a fresh connection, the request succeeds; on a
/// fresh connection the same failure is the worker's, a 502, and is not retried.
#[test]
fn a_reused_connection_closed_before_any_response_byte_is_retried_once_fresh() {
    for hang_up in ["close", "reset"] {
        let up = scripted(move |_, s| match (s.on_connection, hang_up) {
            (0, _) => Script::new().write(echo(s)),
            (_, "close") => Script::new().close(),
            _ => Script::new().reset(),
        });
        let p = proxy(1, &model("m", "", &[up.url()]));
        assert_eq!(sequence(&p, 4, 20), own_answers(4), "{hang_up}");
        // Each reused connection took the request and hung up; each retry was fresh.
        assert_eq!(
            metric(&p, "spillway_upstream_reuse_retries_total"),
            3.0,
            "{hang_up}"
        );
        assert_eq!(up.count(), 7, "{hang_up}");
    }
    let up = scripted(|_, _| Script::new().close());
    let p = proxy(1, &model("m", "", &[up.url()]));
    let r = once(p.data_addr, &request(0));
    assert_eq!(r.status, 502);
    assert!(
        r.text().contains("closed the connection before responding"),
        "{}",
        r.text()
    );
    assert_eq!(
        up.count(),
        1,
        "a failure on a fresh connection is not retried"
    );
    assert_eq!(metric(&p, "spillway_upstream_reuse_retries_total"), 0.0);
}

const SSE_EVENTS: [&str; 2] = ["data: {\"token\":0}\n\n", "data: {\"token\":1}\n\n"];

fn sse_script() -> Script {
    let mut s = Script::new().write(SSE_HEAD);
    for e in SSE_EVENTS {
        s = s.write(chunk(e));
    }
    s.write(chunk("data: [DONE]\n\n")).write("0\r\n\r\n")
}

/// Defect 3: an HTTP/1.0 client (nginx's default `proxy_http_version`) gets a streamed
/// body de-chunked and delimited by the close, never the chunk framing.
#[test]
fn streams_to_http10_clients_are_de_chunked() {
    let up = scripted(|_, _| sse_script());
    let p = proxy(1, &model("m", "", &[up.url()]));
    let body = r#"{"model":"m","stream":true}"#;
    let raw = format!(
        "POST {CHAT} HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut c = Client::connect(p.data_addr);
    c.send(raw.as_bytes());
    let got = String::from_utf8(c.until_closed()).unwrap();
    let (head, body) = got.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("transfer-encoding"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert_eq!(
        body,
        format!("{}{}data: [DONE]\n\n", SSE_EVENTS[0], SSE_EVENTS[1])
    );
}

/// One model `m` on `up` with one engine slot and a long queue wait, after `head`.
fn limited(head: &str, up: &Upstream) -> String {
    format!(
        "{head}[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"{}\"\nname = \"{}\"\n\
         engine_request_limit = 1\nrequest_queue_timeout_ms = 15000\n",
        up.url(),
        worker_name(&up.url())
    )
}

/// Defect 4: a client that stops reading gives its engine slot back after
/// `client_send_timeout_ms` without progress; meanwhile and afterwards, others are served.
#[test]
fn a_client_that_stops_reading_gives_its_slot_back() {
    const BIG: usize = 32 << 20;
    let up = upstream(|s| {
        if s.body_str().contains("big") {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {BIG}\r\n\r\n");
            Reply::Steps(vec![
                Step::Write(head.into_bytes()),
                Step::Write(vec![b'x'; BIG]),
            ])
        } else {
            Reply::Raw(echo(s))
        }
    });
    let p = proxy(1, &limited("[limits]\nclient_send_timeout_ms = 300\n", &up));
    let reader = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    reader.set_recv_buffer_size(4096).unwrap();
    reader.connect(&p.data_addr.into()).unwrap();
    let mut stalled = std::net::TcpStream::from(reader);
    std::io::Write::write_all(&mut stalled, &post(CHAT, r#"{"model":"m","big":1}"#)).unwrap();
    // The stalled client holds the only slot until its send times out; the next request
    // waits in the queue for it, and is served.
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let r = once(p.data_addr, &request(1));
    assert_eq!((r.status, r.text()), own_answers(2)[1].clone());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let timed_out = "dynamo_frontend_requests_total{model=\"m\",endpoint=\"chat_completions\",\
                     request_type=\"unary\",status=\"error\",error_type=\"client_send_timeout\"}";
    eventually(
        "the send timeout is counted",
        Duration::from_secs(5),
        || metric(&p, timed_out) == 1.0,
    );
    counters_back_to_zero(p.admin_addr, "m", &worker_name(&up.url()));
    drop(stalled);
}

/// Defect 5: `upstream_first_byte_timeout_ms` bounds the whole head, however it trickles.
#[test]
fn the_response_head_has_a_deadline() {
    let head = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-slow: trickled-byte-by-byte\r\n\r\n{}";
    let up = scripted(move |_, _| Script::new().trickle(head, 100));
    let p = proxy(
        1,
        &format!(
            "[limits]\nupstream_first_byte_timeout_ms = 1000\n{}",
            model("m", "", &[up.url()])
        ),
    );
    let started = Instant::now();
    let r = once(p.data_addr, &request(0));
    assert_eq!(r.status, 504, "{}", r.text());
    // The head would take 7 s to arrive; the deadline is 1 s.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

/// Defect 6: invalid framing in the first bytes of the body, before anything reached the
/// client, is a 502 with Spillway's JSON error body, not an empty reply.
#[test]
fn an_invalid_first_chunk_is_a_502() {
    let bad = format!("{SSE_HEAD}zz\r\ndata: {{}}\r\n");
    let up = scripted(move |_, _| Script::new().write(&bad).close());
    let p = proxy(1, &model("m", "", &[up.url()]));
    let r = once(p.data_addr, &request(0));
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["code"], 502);
    assert!(r.text().contains("invalid framing"), "{}", r.text());
}

/// A stream that breaks off after its head never ends cleanly for the client: no last
/// chunk, and a last event in OpenAI's streaming error shape. Raw bytes, as the client
/// got them, until the close.
fn broken_stream(p: &ServerHandle) -> String {
    let mut c = Client::connect(p.data_addr);
    c.send(&post(CHAT, r#"{"model":"m","stream":true}"#));
    String::from_utf8(c.until_closed()).unwrap()
}

fn requests_with(p: &ServerHandle, error_type: &str) -> f64 {
    metric(
        p,
        &format!(
            "dynamo_frontend_requests_total{{model=\"m\",endpoint=\"chat_completions\",\
             request_type=\"stream\",status=\"error\",error_type=\"{error_type}\"}}"
        ),
    )
}

#[test]
fn a_stream_that_breaks_off_ends_with_an_error_event_and_no_clean_end() {
    for cut in ["close", "reset", "close mid-chunk"] {
        let up = scripted(move |_, _| {
            let s = Script::new()
                .write(SSE_HEAD)
                .write(chunk(SSE_EVENTS[0]))
                .sleep_ms(20);
            match cut {
                "close" => s.close(),
                "reset" => s.reset(),
                _ => s.write("40\r\ndata: {\"tok").sleep_ms(20).close(),
            }
        });
        let p = proxy(1, &limited("", &up));
        let got = broken_stream(&p);
        assert!(got.starts_with("HTTP/1.1 200"), "{cut}: {got}");
        assert!(got.contains(SSE_EVENTS[0]), "{cut}: {got}");
        assert!(!got.ends_with("0\r\n\r\n"), "{cut}: a clean end: {got}");
        let error_event =
            got.contains("data: {\"error\":{\"message\":\"The worker's response broke off");
        // Mid-chunk nothing can be added without breaking the framing: the cut shows.
        assert_eq!(error_event, cut != "close mid-chunk", "{cut}: {got}");
        eventually("counted", Duration::from_secs(5), || {
            requests_with(&p, "internal") == 1.0
        });
        counters_back_to_zero(p.admin_addr, "m", &worker_name(&up.url()));
    }
}

/// A stream that stalls past `upstream_stream_idle_timeout_ms` ends as an error (504 in
/// its last event), and the worker's slot comes back.
#[test]
fn a_stalled_stream_ends_after_the_idle_timeout() {
    let up = scripted(|_, _| {
        Script::new()
            .write(SSE_HEAD)
            .write(chunk(SSE_EVENTS[0]))
            .hang()
    });
    let p = proxy(
        1,
        &limited("[limits]\nupstream_stream_idle_timeout_ms = 300\n", &up),
    );
    let started = Instant::now();
    let got = broken_stream(&p);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(got.contains(SSE_EVENTS[0]), "{got}");
    assert!(got.contains("\"code\":504"), "{got}");
    assert!(!got.ends_with("0\r\n\r\n"), "{got}");
    eventually("counted", Duration::from_secs(5), || {
        requests_with(&p, "response_timeout") == 1.0
    });
    counters_back_to_zero(p.admin_addr, "m", &worker_name(&up.url()));
    // The proxy closed the worker's connection when it gave up.
    eventually("the worker saw the close", Duration::from_secs(5), || {
        up.closed_by_peer().len() == 1
    });
}
