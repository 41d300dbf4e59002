#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! Idle keep-alive connections hold no buffer: after `buffer_release_ms` with nothing to
//! read a connection parks (its buffers back in the core's pool), wakes on its next
//! request with every byte of it, and the pool returns to its idle size after traffic.

use spillway_testkit::*;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

/// Free buffers a core's pool keeps after traffic (`BUFFER_POOL_IDLE`), per size.
const POOL_IDLE: f64 = 16.0;
/// The two buffer sizes: reads (client and upstream) and writes.
const READ_BUF: f64 = 16.0 * 1024.0;
const WRITE_BUF: f64 = 4.0 * 1024.0;

fn gauges(admin: SocketAddr) -> (f64, f64, f64) {
    let text = metrics(admin);
    let get = |s: &str| metric_value(&text, s).unwrap_or_else(|| panic!("{s} missing"));
    (
        get("spillway_connections_parked"),
        get("spillway_connection_buffers_lent"),
        get("spillway_connection_buffer_pool_bytes"),
    )
}

fn proxy_with_release(release_ms: u64, idle_ms: u64, urls: &[String]) -> ServerHandle {
    proxy(
        2,
        &format!(
            "[limits]\nbuffer_release_ms = {release_ms}\nidle_timeout_ms = {idle_ms}\n{}",
            model("m", "", urls)
        ),
    )
}

#[test]
fn idle_connections_park_wake_and_the_pool_returns_to_idle_size() {
    let w = echo_upstream("w");
    let p = proxy_with_release(50, 60_000, &[w.url()]);
    const CLIENTS: usize = 120;
    let mut clients: Vec<Client> = (0..CLIENTS).map(|_| Client::connect(p.data_addr)).collect();
    for c in &mut clients {
        assert_eq!(c.request(&chat("m")).status, 200);
    }
    eventually(
        "every idle connection parked, no buffer lent",
        Duration::from_secs(10),
        || {
            let (parked, lent, _) = gauges(p.admin_addr);
            parked == CLIENTS as f64 && lent == 0.0
        },
    );
    // Wake each: a request longer than the probe, then two pipelined in one write.
    for c in &mut clients {
        assert_eq!(c.request(&chat("m")).status, 200);
    }
    let two = [chat("m"), chat("m")].concat();
    for c in clients.iter_mut().take(20) {
        c.send(&two);
        assert_eq!(c.response().status, 200);
        assert_eq!(c.response().status, 200);
    }
    // Every request arrived whole, once.
    assert_eq!(w.count(), CLIENTS * 2 + 40);
    let bound = 2.0 * POOL_IDLE * (READ_BUF + WRITE_BUF);
    eventually(
        "the pools back to their idle size",
        Duration::from_secs(10),
        || {
            let (parked, lent, pooled) = gauges(p.admin_addr);
            parked == CLIENTS as f64 && lent == 0.0 && pooled <= bound
        },
    );
    // Parked connections still close cleanly when the client leaves.
    drop(clients);
    eventually("connections gone", Duration::from_secs(10), || {
        let (parked, lent, _) = gauges(p.admin_addr);
        parked == 0.0 && lent == 0.0
    });
}

#[test]
fn a_parked_connection_still_idles_out() {
    let w = echo_upstream("w");
    let p = proxy_with_release(50, 600, &[w.url()]);
    let mut c = Client::connect(p.data_addr);
    assert_eq!(c.request(&chat("m")).status, 200);
    let t = std::time::Instant::now();
    assert!(c.closed(), "the server closes an idle connection");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(8),
        "closed after {waited:?}, idle_timeout_ms = 600"
    );
}

/// `buffer_release_ms = 0`: every request of a connection finds it parked (its read
/// cancelled as soon as nothing is buffered), including requests sent in pieces across
/// the probe and requests racing the cancel.
#[test]
fn release_at_once_loses_no_byte() {
    let w = echo_upstream("w");
    let p = proxy_with_release(0, 60_000, &[w.url()]);
    let mut c = Client::connect(p.data_addr);
    for i in 0..300 {
        let raw = chat("m");
        match i % 3 {
            0 => c.send(&raw),
            1 => {
                // Split inside the probe's 32 bytes and after it.
                for part in [&raw[..7], &raw[7..40], &raw[40..]] {
                    c.send(part);
                    c.stream.flush().unwrap();
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            _ => {
                c.send(&raw[..raw.len() - 1]);
                std::thread::sleep(Duration::from_millis(1));
                c.send(&raw[raw.len() - 1..]);
            }
        }
        let r = c.response();
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    assert_eq!(w.count(), 300);
    assert!(w.unparsed().is_empty());
}
