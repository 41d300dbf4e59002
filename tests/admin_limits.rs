#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The admin listener's limits: a client that sends its request too slowly is cut off after
//! `admin_read_timeout_ms` (408 once it started, a silent close before), connections over
//! `admin_max_connections` get 503 at once, and meanwhile health checks are answered and
//! the monitor keeps publishing the busy set.

use spillway_testkit::*;
use std::time::Duration;

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

    // Two slowloris clients hold a place each with half a head.
    let mut slow: Vec<Client> = (0..2)
        .map(|_| {
            let mut c = Client::connect(p.admin_addr);
            c.send(b"GET /health HTTP/1.1\r\nHo");
            c
        })
        .collect();
    // The third and last place: a keep-alive client (its answer proves it was accepted,
    // after the slow ones).
    let mut k = Client::connect(p.admin_addr);
    assert_eq!(k.request(&req("GET", "/health", "")).status, 200);

    // Over the cap: 503 at once, without reading a byte, then close.
    let mut over = Client::connect(p.admin_addr);
    let r = over.response();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"], "Too many admin connections");
    assert!(over.closed());

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

    // A place frees when a client leaves; the slow ones still hold theirs.
    drop(k);
    eventually("a place frees up", Duration::from_secs(10), || {
        let mut c = Client::connect(p.admin_addr);
        c.request(&req("GET", "/health", "")).status == 200
    });
    for c in &mut slow {
        c.send(b"st: a\r\n\r\n");
        assert_eq!(c.response().status, 200, "a slow client lost its place");
    }
}
