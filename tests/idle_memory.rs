#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! What one parked keep-alive connection holds on the heap: a byte-counting global
//! allocator measures the heap that 2,000 parked connections add to a proxy, and the sizes
//! of what they keep. The figure is bounded (bench/results/connections.md has the RSS); a
//! state of kilobytes kept in the parked connection's task (as a TLS handshake's once was)
//! fails it.
//!
//! The count is process-wide, so this binary has no test harness (as tests/alloc.rs).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use spillway_testkit::alloc::{CountingAlloc, Watch, live_by_size, live_bytes};
use spillway_testkit::*;

/// Heap bytes a parked plain connection may hold (task, halves, socket, probe, the core's
/// tables): 759 to 800 B measured on io_uring, 805 to 867 on epoll (the same blocks; its
/// driver's tables are larger).
const MAX_BYTES_PER_PARKED: i64 = 1_200;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn snapshot() -> (i64, Vec<i64>) {
    let by_size = live_by_size();
    (live_bytes(), by_size)
}

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 27\r\n\r\n{\"choices\":[{\"text\":\"hi\"}]}";

/// A fake worker on port 0 that answers each request (read whole, one per read) with
/// `RESPONSE` and keeps no record (the testkit's workers record what they receive, which
/// the count would see).
fn worker() -> String {
    let worker = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", worker.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut s in worker.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 16384];
                while matches!(s.read(&mut buf), Ok(n) if n > 0) {
                    if s.write_all(RESPONSE).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

fn gauge(admin: std::net::SocketAddr, series: &str) -> f64 {
    metric_value(&metrics(admin), series).unwrap_or_else(|| panic!("{series} missing"))
}

/// One request on `c`, its answer read whole (a short Content-Length body), without
/// allocating.
fn one_request(c: &mut TcpStream, request: &[u8], buf: &mut [u8]) {
    c.write_all(request).unwrap();
    let mut filled = 0;
    loop {
        let n = c.read(&mut buf[filled..]).unwrap();
        assert!(n > 0, "closed before the answer");
        filled += n;
        let data = &buf[..filled];
        let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        assert!(data.starts_with(b"HTTP/1.1 200"), "{:?}", &data[..end]);
        const FIELD: &[u8] = b"\r\ncontent-length:";
        let at = data[..end]
            .windows(FIELD.len())
            .position(|w| w.eq_ignore_ascii_case(FIELD))
            .unwrap();
        let len = data[at + FIELD.len()..end]
            .iter()
            .skip_while(|b| **b == b' ')
            .take_while(|b| b.is_ascii_digit())
            .fold(0, |a, d| a * 10 + usize::from(d - b'0'));
        if filled >= end + 4 + len {
            return;
        }
    }
}

/// Opens `n` connections, one request each, and waits until `total` are parked with no
/// buffer lent and the pools have trimmed back.
fn park(p: &ServerHandle, clients: &mut Vec<TcpStream>, n: usize, request: &[u8]) {
    let mut buf = [0u8; 4096];
    for _ in 0..n {
        let mut c = TcpStream::connect(p.data_addr).unwrap();
        one_request(&mut c, request, &mut buf);
        clients.push(c);
    }
    let total = clients.len() as f64;
    eventually("every connection parked", Duration::from_secs(20), || {
        gauge(p.admin_addr, "spillway_connections_parked") == total
            && gauge(p.admin_addr, "spillway_connection_buffers_lent") == 0.0
    });
    // Two trims of the buffer pools (once a second): back to their idle size.
    std::thread::sleep(Duration::from_millis(2_500));
}

fn parked_connection_holds_under_a_kilobyte_or_so() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    const WARM: usize = 100;
    const N: usize = 2_000;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < 3 * N as u64 {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    }
    let url = worker();
    let p = proxy(
        1,
        &format!(
            "[limits]\nbuffer_release_ms = 0\n{}",
            model("m", "", &[url])
        ),
    );
    let request = chat("m");
    let mut clients = Vec::with_capacity(WARM + N);
    park(&p, &mut clients, WARM, &request);
    let (before, sizes_before) = snapshot();
    park(&p, &mut clients, N, &request);
    let (after, sizes_after) = snapshot();
    let per = (after - before) / N as i64;
    let mut kept = String::new();
    for (size, (a, b)) in sizes_after.iter().zip(&sizes_before).enumerate() {
        let d = a - b;
        if d.unsigned_abs() as usize >= N / 2 {
            kept += &format!("\n  {d:>6} x {size} B");
        }
    }
    eprintln!("heap per parked connection: {per} B; allocations kept:{kept}");
    assert!(
        per <= MAX_BYTES_PER_PARKED,
        "a parked connection holds {per} B of heap (at most {MAX_BYTES_PER_PARKED}):{kept}"
    );
    drop(clients);
}

/// Heap allocations a connection makes to wake and park again: its burst's state, the
/// burst's read slot, and the fresh canceller monoio makes when the read is cancelled.
const MAX_ALLOCATIONS_PER_WAKE: u64 = 3;

/// Waking a parked connection and parking it again allocates a bounded few blocks (its
/// buffers and canceller come from the core's pools), whatever the number of wakes.
fn a_wake_and_a_park_allocate_a_bounded_few() {
    let p = proxy(
        1,
        &format!(
            "[limits]\nbuffer_release_ms = 0\n{}",
            model("m", "", &[worker()])
        ),
    );
    let request = chat("m");
    let mut buf = [0u8; 4096];
    let mut c = TcpStream::connect(p.data_addr).unwrap();
    let mut cycle = |c: &mut TcpStream| {
        one_request(c, &request, &mut buf);
        // buffer_release_ms = 0: it parks as soon as the answer is out.
        std::thread::sleep(Duration::from_millis(20));
    };
    for _ in 0..20 {
        cycle(&mut c);
    }
    const WAKES: u64 = 100;
    let watch = Watch::start();
    for _ in 0..WAKES {
        cycle(&mut c);
    }
    let (n, whose) = watch.stop();
    eprintln!("{n} allocations over {WAKES} wakes");
    // A stray few beside them: the core's tables growing once, other threads' timers.
    assert!(
        n <= MAX_ALLOCATIONS_PER_WAKE * WAKES + 10,
        "{n} heap allocations over {WAKES} wakes and parks: {whose}"
    );
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let tests: [(&str, fn()); 2] = [
        (
            "parked_connection_holds_under_a_kilobyte_or_so",
            parked_connection_holds_under_a_kilobyte_or_so,
        ),
        (
            "a_wake_and_a_park_allocate_a_bounded_few",
            a_wake_and_a_park_allocate_a_bounded_few,
        ),
    ];
    for (name, test) in tests {
        if filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str())) {
            eprintln!("test {name} ...");
            test();
            eprintln!("test {name} ... ok");
        }
    }
}
