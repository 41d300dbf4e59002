#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! Streaming and cancellation: SSE events pass through one by one with their timing, and a
//! client that leaves makes the proxy close the upstream connection promptly.

use spillway_testkit::*;
use std::time::{Duration, Instant};

const GAP: Duration = Duration::from_millis(150);

fn sse_upstream(events: usize) -> Upstream {
    upstream(move |_| {
        let mut steps = vec![Step::Write(SSE_HEAD.as_bytes().to_vec())];
        for i in 0..events {
            steps.push(Step::Write(chunk(&format!("data: {{\"token\":{i}}}\n\n"))));
            steps.push(Step::Sleep(GAP));
        }
        steps.push(Step::Write(chunk("data: [DONE]\n\n")));
        steps.push(Step::Write(b"0\r\n\r\n".to_vec()));
        Reply::Steps(steps)
    })
}

#[test]
fn sse_events_arrive_one_by_one_with_their_timing() {
    let up = sse_upstream(4);
    let p = proxy(1, &model("m", "", &[up.url()]));
    let mut c = Client::connect(p.data_addr);
    let r = c.request(&post(
        "/v1/chat/completions",
        r#"{"model":"m","stream":true,"messages":[]}"#,
    ));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events: Vec<_> = r
        .pieces
        .iter()
        .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
        .collect();
    assert_eq!(events.len(), 5, "{events:?}");
    assert_eq!(events[0], "data: {\"token\":0}\n\n");
    assert_eq!(events[4], "data: [DONE]\n\n");
    // Each event reached the client on its own, about one gap after the previous one.
    for w in r.pieces.windows(2) {
        let gap = w[1].0.duration_since(w[0].0);
        assert!(
            gap >= GAP - Duration::from_millis(40),
            "events bunched together: {gap:?}"
        );
    }
    // The stream is complete and the connection reusable.
    assert_eq!(
        c.request(&post(
            "/v1/chat/completions",
            r#"{"model":"m","stream":true}"#
        ))
        .status,
        200
    );
    assert_eq!(up.connections(), 1);
}

fn stalled_upstream(head_first: bool) -> Upstream {
    upstream(move |_| {
        let mut steps = Vec::new();
        if head_first {
            steps.push(Step::Write(SSE_HEAD.as_bytes().to_vec()));
            steps.push(Step::Write(chunk("data: {\"token\":0}\n\n")));
        }
        steps.push(Step::WaitClose);
        Reply::Steps(steps)
    })
}

fn assert_upstream_closed_soon(up: &Upstream, left_at: Instant) {
    eventually("upstream connection closed", Duration::from_secs(5), || {
        !up.closed_by_peer().is_empty()
    });
    let closed = up.closed_by_peer()[0];
    let after = closed.saturating_duration_since(left_at);
    assert!(
        after < Duration::from_millis(100),
        "upstream closed {after:?} after the client left"
    );
}

#[test]
fn client_leaving_while_waiting_closes_upstream() {
    let up = stalled_upstream(false);
    let p = proxy(1, &model("m", "", &[up.url()]));
    let c = Client::connect(p.data_addr);
    let mut c = c;
    c.send(&post(
        "/v1/chat/completions",
        r#"{"model":"m","stream":true}"#,
    ));
    eventually("request reached upstream", Duration::from_secs(5), || {
        up.count() == 1
    });
    let left = Instant::now();
    drop(c);
    assert_upstream_closed_soon(&up, left);
}

#[test]
fn client_leaving_mid_stream_closes_upstream() {
    let up = stalled_upstream(true);
    let p = proxy(1, &model("m", "", &[up.url()]));
    let mut c = Client::connect(p.data_addr);
    c.send(&post(
        "/v1/chat/completions",
        r#"{"model":"m","stream":true}"#,
    ));
    // Read the head and the first event, then leave.
    let mut buf = [0u8; 512];
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("token") {
        use std::io::Read;
        let n = c.stream.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    let left = Instant::now();
    drop(c);
    assert_upstream_closed_soon(&up, left);
}

#[test]
fn large_bodies_stream_both_ways() {
    let up = upstream(|s| {
        let body = "x".repeat(3 * 1024 * 1024 + 7);
        let mut r = json_response(200, &body);
        r.extend_from_slice(b"");
        assert!(s.body.len() > 1_000_000);
        Reply::Raw(r)
    });
    let p = proxy(1, &model("m", "", &[up.url()]));
    let body = format!(
        r#"{{"model":"m","prompt":"{}"}}"#,
        "p".repeat(2 * 1024 * 1024)
    );
    let r = once(p.data_addr, &post("/v1/completions", &body));
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 3 * 1024 * 1024 + 7);
    assert_eq!(up.seen()[0].body, body.as_bytes());
}
