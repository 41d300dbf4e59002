#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Can one monitor thread keep up with pushed load from a large fleet, and at what CPU cost?
//!
//! Starts Spillway in-process: 1,000 workers × dp_size 8 in one model, decode and prefill
//! thresholds set, `load_sources = ["push"]`, worker URLs on 127.0.0.1 ports nobody listens
//! on (checked), threads unpinned. Then, over one keep-alive admin connection, POSTs every
//! worker's 8 rank events to `/load` at 20 Hz (8,000 events per tick, 160,000 events/s), as
//! one JSON array per tick or split in a few. Bodies are built before the timed part; their
//! values change every tick (20 variants, ~1 worker in 5 busy, a different set each), so the
//! busy set changes with every push.
//!
//! Measured per phase: the monitor thread's CPU (utime+stime from
//! `/proc/self/task/<tid>/stat` of the thread named `spillway-monitor`, and its
//! `schedstat` run time as a cross-check), events/s accepted, publishes/s (the
//! `spillway_busy_publish_total` counter on `/metrics`), and `/load` POST latency. A first
//! phase without pushes measures the monitor's own 50 Hz re-evaluation tick.
//!
//! `cargo bench --bench monitor_scale`. `SPILLWAY_BENCH_SECS` sets the seconds per push
//! phase (default 10), `SPILLWAY_BENCH_PARTS` the arrays per tick to try (default `1,4`).
//! Without `--bench` (`cargo test --benches`) it runs a short smoke version.
#![allow(clippy::disallowed_methods)] // a benchmark times itself

#[path = "fleet.rs"]
mod fleet;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const WORKERS: usize = 1000;
const DP: u32 = 8;
const TICK: Duration = Duration::from_millis(50);
const VARIANTS: u64 = 20;

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A base port such that nothing accepts on `base..base + WORKERS` of 127.0.0.1.
fn closed_port_range() -> u16 {
    'base: for base in [41_000u16, 45_000, 51_000, 55_000] {
        for p in base..base + WORKERS as u16 {
            let addr = SocketAddr::from(([127, 0, 0, 1], p));
            if TcpStream::connect_timeout(&addr, Duration::from_millis(50)).is_ok() {
                continue 'base;
            }
        }
        return base;
    }
    panic!("no free range of {WORKERS} closed ports found");
}

struct Admin {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Admin {
    fn connect(addr: SocketAddr) -> Admin {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Admin {
            stream,
            buf: Vec::with_capacity(1 << 16),
        }
    }

    /// Sends one request and reads its Content-Length response: (status, body).
    fn call(&mut self, raw: &[u8]) -> (u16, Vec<u8>) {
        self.stream.write_all(raw).unwrap();
        self.buf.clear();
        let mut tmp = [0u8; 16 * 1024];
        loop {
            let mut hs = [httparse::EMPTY_HEADER; 16];
            let mut r = httparse::Response::new(&mut hs);
            if let httparse::Status::Complete(n) = r.parse(&self.buf).unwrap() {
                let len: usize = r
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .map(|h| std::str::from_utf8(h.value).unwrap().parse().unwrap())
                    .unwrap_or(0);
                let status = r.code.unwrap();
                while self.buf.len() < n + len {
                    let k = self.stream.read(&mut tmp).unwrap();
                    assert!(k > 0, "admin closed the connection");
                    self.buf.extend_from_slice(&tmp[..k]);
                }
                return (status, self.buf[n..n + len].to_vec());
            }
            let k = self.stream.read(&mut tmp).unwrap();
            assert!(k > 0, "admin closed the connection");
            self.buf.extend_from_slice(&tmp[..k]);
        }
    }

    fn publishes(&mut self) -> f64 {
        let (status, body) = self.call(b"GET /metrics HTTP/1.1\r\nhost: admin\r\n\r\n");
        assert_eq!(status, 200);
        let text = String::from_utf8(body).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("spillway_busy_publish_total "))
            .and_then(|v| v.trim().parse().ok())
            .expect("spillway_busy_publish_total")
    }
}

fn post(body: &str) -> Vec<u8> {
    let mut raw = format!(
        "POST /load HTTP/1.1\r\nhost: admin\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body.as_bytes());
    raw
}

/// `{"accepted":N}` → N.
fn accepted(body: &[u8]) -> u64 {
    let text = std::str::from_utf8(body).unwrap();
    let digits: String = text.chars().filter(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("{text}"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

struct Phase {
    name: String,
    secs: f64,
    events: u64,
    posts: usize,
    cpu: f64,
    sched: f64,
    publishes: f64,
    latencies: Vec<Duration>,
    late_ticks: u64,
    bytes_per_tick: usize,
}

impl Phase {
    fn row(&self) -> String {
        let mut l = self.latencies.clone();
        l.sort_unstable();
        let dash = || "–".to_string();
        let lat = |p| {
            if l.is_empty() {
                dash()
            } else {
                ms(percentile(&l, p))
            }
        };
        format!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} |",
            self.name,
            if self.bytes_per_tick == 0 {
                dash()
            } else {
                format!("{:.0} KiB", self.bytes_per_tick as f64 / 1024.0)
            },
            self.events as f64 / self.secs,
            self.posts as f64 / self.secs,
            100.0 * self.cpu / self.secs,
            100.0 * self.sched / self.secs,
            self.publishes / self.secs,
            lat(0.5),
            lat(0.99),
            l.last().map_or_else(dash, |d| ms(*d)),
            self.late_ticks,
        )
    }
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let secs: f64 = env("SPILLWAY_BENCH_SECS").unwrap_or(if bench { 10.0 } else { 1.0 });
    let idle_secs = if bench { 3.0 } else { 0.5 };
    let parts_list: Vec<usize> = std::env::var("SPILLWAY_BENCH_PARTS")
        .ok()
        .map(|v| v.split(',').filter_map(|p| p.trim().parse().ok()).collect())
        .unwrap_or_else(|| if bench { vec![1, 4] } else { vec![1] });
    let ticks_per_sec = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;

    let base_port = closed_port_range();
    let cores = spillway::config::default_cores();
    let text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ncores = {cores}\npin_cores = false\n{}",
        fleet::model_toml(WORKERS, DP, "round-robin", base_port)
    );
    let overrides = spillway::Overrides::default();
    let config = spillway::Config::parse(&text, &overrides).unwrap();
    let server = spillway::start(
        config,
        spillway::ConfigSource {
            path: None,
            overrides,
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let tid = fleet::monitor_tid();
    let mut admin = Admin::connect(server.admin_addr);

    // Everything sent in the timed part, built now.
    let bodies: Vec<Vec<Vec<Vec<u8>>>> = parts_list
        .iter()
        .map(|&parts| {
            (0..VARIANTS)
                .map(|v| {
                    fleet::load_batches(v, WORKERS, DP, parts)
                        .iter()
                        .map(|b| post(b))
                        .collect()
                })
                .collect()
        })
        .collect();

    // Load state for every rank, so the idle phase evaluates a populated table.
    for raw in &bodies[0][0] {
        let (status, body) = admin.call(raw);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
    std::thread::sleep(Duration::from_millis(100));

    let mut phases = Vec::new();

    // The monitor's own tick: re-evaluates every monitor_interval_ms, publishes on change.
    let p0 = admin.publishes();
    let c0 = fleet::thread_cpu(tid, ticks_per_sec);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(idle_secs));
    let elapsed = t0.elapsed().as_secs_f64();
    let c1 = fleet::thread_cpu(tid, ticks_per_sec);
    let p1 = admin.publishes();
    phases.push(Phase {
        name: "no pushes (50 Hz tick only)".into(),
        secs: elapsed,
        events: 0,
        posts: 0,
        cpu: c1.0 - c0.0,
        sched: c1.1 - c0.1,
        publishes: p1 - p0,
        latencies: Vec::new(),
        late_ticks: 0,
        bytes_per_tick: 0,
    });

    for (pi, &parts) in parts_list.iter().enumerate() {
        let variants = &bodies[pi];
        let bytes_per_tick = variants[0].iter().map(Vec::len).sum();
        let ticks = (secs / TICK.as_secs_f64()).round() as u64;
        let mut latencies = Vec::with_capacity(ticks as usize * parts);
        let mut events = 0u64;
        let mut late = 0u64;

        let p0 = admin.publishes();
        let c0 = fleet::thread_cpu(tid, ticks_per_sec);
        let start = Instant::now();
        for tick in 0..ticks {
            let due = start + TICK * tick as u32;
            let now = Instant::now();
            if now < due {
                std::thread::sleep(due - now);
            } else if now > due + TICK / 10 {
                late += 1;
            }
            for raw in &variants[(tick % VARIANTS) as usize] {
                let sent = Instant::now();
                let (status, body) = admin.call(raw);
                latencies.push(sent.elapsed());
                assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
                events += accepted(&body);
            }
        }
        // The window is whole ticks: wait out the last one (unless already late).
        let end = start + TICK * ticks as u32;
        if let Some(rest) = end.checked_duration_since(Instant::now()) {
            std::thread::sleep(rest);
        }
        let elapsed = start.elapsed().as_secs_f64();
        let c1 = fleet::thread_cpu(tid, ticks_per_sec);
        let p1 = admin.publishes();
        phases.push(Phase {
            name: format!(
                "{parts} × {} events per tick",
                WORKERS * DP as usize / parts
            ),
            secs: elapsed,
            events,
            posts: latencies.len(),
            cpu: c1.0 - c0.0,
            sched: c1.1 - c0.1,
            publishes: p1 - p0,
            latencies,
            late_ticks: late,
            bytes_per_tick,
        });
    }
    server.shutdown();

    println!(
        "\n## monitor_scale: {WORKERS} workers × dp_size {DP}, /load at 20 Hz per worker \
         (target {} events/s), {cores} data core(s), threads unpinned\n",
        WORKERS * DP as usize * 20
    );
    println!(
        "| phase | JSON per tick | events/s processed | POSTs/s | monitor CPU % of one core (utime+stime) | (schedstat) | publishes/s | POST p50 ms | POST p99 ms | POST max ms | late ticks |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in &phases {
        println!("{}", p.row());
    }
    println!();
}
