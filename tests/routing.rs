#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Router modes, direct pinning, and failover past unreachable workers down to 503.

use spillway_testkit::*;
use std::time::Duration;

fn dead_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    url
}

fn counts(ups: &[Upstream]) -> Vec<usize> {
    ups.iter().map(Upstream::count).collect()
}

#[test]
fn round_robin_spreads_evenly() {
    let ups = [echo_upstream("a"), echo_upstream("b"), echo_upstream("c")];
    let urls: Vec<_> = ups.iter().map(Upstream::url).collect();
    let p = proxy(1, &model("m", "router_mode = \"round-robin\"", &urls));
    let mut c = Client::connect(p.data_addr);
    for _ in 0..9 {
        assert_eq!(c.request(&chat("m")).status, 200);
    }
    assert_eq!(counts(&ups), [3, 3, 3]);
}

#[test]
fn random_reaches_every_worker() {
    let ups = [echo_upstream("a"), echo_upstream("b"), echo_upstream("c")];
    let urls: Vec<_> = ups.iter().map(Upstream::url).collect();
    let p = proxy(1, &model("m", "router_mode = \"random\"", &urls));
    let mut c = Client::connect(p.data_addr);
    for _ in 0..90 {
        assert_eq!(c.request(&chat("m")).status, 200);
    }
    let n = counts(&ups);
    assert!(n.iter().all(|&k| k >= 10), "{n:?}");
}

/// Four concurrent slow requests over two workers: in-flight-aware modes split them 2/2.
fn balanced_by_inflight(mode: &str) {
    let slow = || {
        upstream(|_| {
            Reply::Steps(vec![
                Step::Sleep(Duration::from_millis(600)),
                Step::Write(json_response(200, "{}")),
            ])
        })
    };
    let ups = [slow(), slow()];
    let urls: Vec<_> = ups.iter().map(Upstream::url).collect();
    let p = proxy(1, &model("m", &format!("router_mode = \"{mode}\""), &urls));
    let mut clients: Vec<_> = (0..4).map(|_| Client::connect(p.data_addr)).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        c.send(&chat("m"));
        eventually("request reached a worker", Duration::from_secs(5), || {
            ups.iter().map(Upstream::count).sum::<usize>() == i + 1
        });
    }
    for c in &mut clients {
        assert_eq!(c.response().status, 200);
    }
    assert_eq!(counts(&ups), [2, 2], "{mode}");
}

#[test]
fn power_of_two_prefers_fewer_in_flight() {
    balanced_by_inflight("power-of-two");
}

#[test]
fn least_loaded_prefers_fewer_in_flight() {
    balanced_by_inflight("least-loaded");
}

#[test]
fn direct_mode_pins_by_header() {
    let ups = [echo_upstream("a"), echo_upstream("b")];
    let urls: Vec<_> = ups.iter().map(Upstream::url).collect();
    let p = proxy(1, &model("m", "router_mode = \"direct\"", &urls));
    let body = r#"{"model":"m"}"#;
    let pinned = |id: &str| {
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: h\r\nx-worker-id: {id}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut c = Client::connect(p.data_addr);
    for _ in 0..3 {
        assert_eq!(
            c.request(pinned(&worker_name(&urls[1])).as_bytes()).status,
            200
        );
    }
    assert_eq!(counts(&ups), [0, 3]);
    let r = c.request(pinned("nobody").as_bytes());
    assert_eq!(r.status, 404);
    let r = c.request(&post("/v1/completions", body));
    assert_eq!(r.status, 400);
    assert!(r.text().contains("x-worker-id"));
}

#[test]
fn unreachable_worker_fails_over_then_503() {
    let up = echo_upstream("live");
    let dead = dead_url();
    let p = proxy(1, &model("m", "", &[dead.clone(), up.url()]));
    let mut c = Client::connect(p.data_addr);
    for _ in 0..6 {
        let r = c.request(&chat("m"));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(up.count(), 6);

    // Only dead workers: 503 with the exact body and Retry-After.
    let p = proxy(1, &model("m", "", &[dead, dead_url()]));
    let r = once(p.data_addr, &chat("m"));
    assert_eq!(r.status, 503);
    assert_eq!(
        r.text(),
        concat!(
            r#"{"message":"Service temporarily unavailable","type":"Service Unavailable","code":503,"#,
            r#""knob":"unreachable","value":null,"threshold":null,"setting":"the model's workers (down after failed connects)","class":"standard"}"#
        )
    );
    assert_eq!(r.header("retry-after"), Some("1"));
}

#[test]
fn worker_back_up_after_backoff_gets_traffic_again() {
    // Reserve a port, start with nothing listening there.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let other = echo_upstream("other");
    let p = proxy(
        1,
        &format!(
            "[limits]\nworker_down_backoff_ms = 100\n{}",
            model("m", "", &[format!("http://{addr}"), other.url()])
        ),
    );
    let mut c = Client::connect(p.data_addr);
    assert_eq!(c.request(&chat("m")).status, 200);
    // The worker comes up on the same port.
    let back = std::net::TcpListener::bind(addr).unwrap();
    std::thread::spawn(move || {
        for s in back.incoming().flatten() {
            let mut s = s;
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let _ = s.write_all(&json_response(200, r#"{"worker":"back"}"#));
                }
            });
        }
    });
    eventually(
        "recovered worker serves again",
        Duration::from_secs(5),
        || c.request(&chat("m")).text().contains("back"),
    );
}
