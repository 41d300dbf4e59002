#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Fleet scale (issue 13): can one front door's monitor follow 4,096 workers × 8 ranks
//! registered in etcd, with their load arriving over NATS at 20 Hz and 1 % of the members
//! leaving and joining every second? At what CPU, and how soon does a load change reach
//! the cores?
//!
//! Starts etcd and nats-server (Debian's packages) on loopback ports, registers the
//! workers under `/bench/w/` (values with dp_size 8 and their capacity), then starts
//! Spillway in-process (1 data core, threads unpinned) with that prefix as its `etcd`
//! source and `bench.load.>` as its NATS subscription. While measuring:
//! - a publisher sends, every 50 ms, one NATS message per worker carrying its 8 rank
//!   events (a `POST /load` array; values vary per tick, about one worker in five busy),
//!   spread over the tick in 25 parts 2 ms apart as independent engines' reports are
//!   (`SPILLWAY_BENCH_BURSTS=1`: all of a tick's messages in one write);
//! - a churn thread deletes 1 % of the keys every second and puts back the ones it deleted
//!   the second before, timing how long until the re-added workers are in the running
//!   generation;
//! - a probe flips worker `w0000`'s load between busy and idle every 100 ms on its own
//!   connection and times publish → the core's busy replica showing it (polled every
//!   ~20 µs, so figures carry up to ~0.1 ms of polling delay), and publish → delivered to
//!   a second, plain subscriber of that worker's subject alone (NATS's share of it).
//!
//! Reported: the monitor thread's CPU (utime+stime of `spillway-monitor`), messages and
//! events per second received, generations built per second, join latency, and publish →
//! visible percentiles. `cargo bench --bench fleet_scale`; `SPILLWAY_BENCH_WORKERS`
//! (default 4096), `SPILLWAY_BENCH_SECS` (default 20) and `SPILLWAY_BENCH_CHURN_PCT`
//! (percent of the workers leaving per second, default 1; 0 for none); with
//! `SPILLWAY_BENCH_LOG` set, Spillway's info log goes to stderr. Without `--bench`
//! (`cargo test --benches`) a short smoke run with 128 workers.
#![allow(clippy::disallowed_methods)] // a benchmark times itself

#[path = "fleet.rs"]
mod fleet;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fleet::{KV_TOTAL_BLOCKS, MAX_BATCHED_TOKENS, MODEL, THRESHOLDS, worker_name};
use spillway::ServerHandle;
use spillway::shed::Class;
use spillway_testkit::etcd::Etcd;
use spillway_testkit::nats::Nats;
use spillway_testkit::{metric_value, metrics, proxy};

const DP: u32 = 8;
const TICK: Duration = Duration::from_millis(50);
const VARIANTS: u64 = 4;
/// A tick's messages go out in this many parts, `SLICE` apart.
const SLICES: usize = 25;
const SLICE: Duration = Duration::from_millis(2);
const PROBE_EVERY: Duration = Duration::from_millis(100);
const PREFIX: &str = "/bench/w/";

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn key(i: usize) -> String {
    format!("{PREFIX}{}", worker_name(i))
}

/// Worker `i`'s etcd value. Nothing listens at its URL: no request is sent.
fn value(i: usize) -> Vec<u8> {
    format!(
        r#"{{"url":"http://127.0.0.1:{}","name":"{}","dp_size":{DP},"kv_total_blocks":{KV_TOTAL_BLOCKS},"max_num_batched_tokens":{MAX_BATCHED_TOKENS}}}"#,
        20_000 + i,
        worker_name(i)
    )
    .into_bytes()
}

/// One NATS `PUB` of worker `w`'s 8 rank events with `decode(rank)` blocks.
fn pub_line(out: &mut Vec<u8>, w: usize, decode: impl Fn(u32) -> (u64, u64)) {
    let events: Vec<String> = (0..DP)
        .map(|r| {
            let (d, p) = decode(r);
            format!(
                r#"{{"worker_id":"{}","dp_rank":{r},"active_decode_blocks":{d},"active_prefill_tokens":{p}}}"#,
                worker_name(w)
            )
        })
        .collect();
    let body = format!("[{}]", events.join(","));
    write!(
        out,
        "PUB bench.load.{} {}\r\n{body}\r\n",
        worker_name(w),
        body.len()
    )
    .unwrap();
}

/// A NATS connection for publishing: CONNECT sent, nothing read (the server's INFO and
/// PINGs are ignored; runs are shorter than its ping interval).
fn nats_conn(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false,\"name\":\"bench\",\"lang\":\"rust\",\"version\":\"0\",\"protocol\":1}\r\n").unwrap();
    s
}

/// Every worker but the probe, every tick, one of `VARIANTS` prepared ticks.
fn publisher(
    addr: SocketAddr,
    (workers, bursts): (usize, bool),
    stop: Arc<AtomicBool>,
) -> JoinHandle<(u64, u64)> {
    // Each tick in SLICES parts (whole messages), sent SLICE apart: workers whose
    // reports are spread over the tick, as engines' are; with `bursts`, one write per tick.
    let slices = if bursts { 1 } else { SLICES };
    let ticks: Vec<Vec<Vec<u8>>> = (0..VARIANTS)
        .map(|v| {
            let per = (workers - 1).div_ceil(slices).max(1);
            (1..workers)
                .collect::<Vec<_>>()
                .chunks(per)
                .map(|ws| {
                    let mut out = Vec::new();
                    for &w in ws {
                        pub_line(&mut out, w, |r| fleet::rank_values(v, w, r));
                    }
                    out
                })
                .collect()
        })
        .collect();
    std::thread::spawn(move || {
        let mut s = nats_conn(addr);
        let (mut sent, mut late) = (0u64, 0u64);
        let start = Instant::now();
        while !stop.load(Ordering::SeqCst) {
            let tick = start + TICK * sent as u32;
            for (i, part) in ticks[(sent % VARIANTS) as usize].iter().enumerate() {
                if let Some(d) = (tick + SLICE * i as u32).checked_duration_since(Instant::now()) {
                    std::thread::sleep(d);
                }
                s.write_all(part).unwrap();
            }
            sent += 1;
            match (start + TICK * sent as u32).checked_duration_since(Instant::now()) {
                Some(d) => std::thread::sleep(d),
                None => late += 1,
            }
        }
        (sent, late)
    })
}

/// Deletes `per_s` keys every second and puts back last second's; returns how long
/// each batch of re-added workers took to be in the running generation.
fn churn(
    etcd: Arc<Etcd>,
    handle: Arc<ServerHandle>,
    (workers, per_s): (usize, usize),
    stop: Arc<AtomicBool>,
) -> JoinHandle<(usize, Vec<Duration>)> {
    std::thread::spawn(move || {
        let (mut cursor, mut out, mut joins, mut changed) = (1usize, Vec::new(), Vec::new(), 0);
        while !stop.load(Ordering::SeqCst) {
            let second = Instant::now();
            let back: Vec<usize> = std::mem::take(&mut out);
            let put_at = Instant::now();
            for &i in &back {
                etcd.put(&key(i), &value(i), 0);
            }
            for _ in 0..per_s.min(workers - 1) {
                cursor = if cursor + 1 >= workers { 1 } else { cursor + 1 };
                etcd.delete(&key(cursor));
                out.push(cursor);
            }
            changed += back.len() + per_s;
            if !back.is_empty() {
                let names: Vec<String> = back.iter().map(|&i| worker_name(i)).collect();
                while !names
                    .iter()
                    .all(|n| handle.shared.snapshot.load().worker_named(n).is_some())
                {
                    if put_at.elapsed() > Duration::from_secs(5) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                joins.push(put_at.elapsed());
            }
            if let Some(d) = Duration::from_secs(1).checked_sub(second.elapsed()) {
                std::thread::sleep(d);
            }
        }
        for i in out {
            etcd.put(&key(i), &value(i), 0);
        }
        (changed, joins)
    })
}

/// A second subscriber, to the probe worker's subject only: sends the instant each of
/// its messages arrives (NATS's share of publish → visible).
fn tap(addr: SocketAddr) -> std::sync::mpsc::Receiver<Instant> {
    use std::io::Read;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut s = nats_conn(addr);
    write!(s, "SUB bench.load.{} 1\r\nPING\r\n", worker_name(0)).unwrap();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = s.read(&mut buf) {
            let at = Instant::now();
            let got = &buf[..n];
            if n == 0 {
                return;
            }
            if got.windows(6).any(|w| w == b"PING\r\n") && s.write_all(b"PONG\r\n").is_err() {
                return;
            }
            // One message per flip, each far smaller than a read.
            for _ in 0..got.windows(4).filter(|w| w == b"MSG ").count() {
                if tx.send(at).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Flips the probe worker busy/idle and times publish → visible on core 0, and publish →
/// delivered to a plain NATS subscriber ([`tap`]).
fn probe(
    addr: SocketAddr,
    handle: Arc<ServerHandle>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<(Vec<Duration>, Vec<Duration>)> {
    let tapped = tap(addr);
    // The tap's subscription is in place before the first flip.
    std::thread::sleep(Duration::from_millis(100));
    let flips: Vec<Vec<u8>> = [3_900u64, 100]
        .iter()
        .map(|&d| {
            let mut out = Vec::new();
            pub_line(&mut out, 0, |_| (d, 0));
            out
        })
        .collect();
    std::thread::spawn(move || {
        let mut s = nats_conn(addr);
        let member = {
            let snap = handle.shared.snapshot.load();
            let model = snap.model(MODEL.as_bytes()).unwrap();
            let name = worker_name(0);
            model
                .members
                .iter()
                .find(|m| snap.workers[m.worker as usize].cfg.name == name)
                .unwrap()
                .id
        };
        let replica = handle.shared.busy[0].clone();
        let (mut seen, mut delivered) = (Vec::new(), Vec::new());
        let mut n = 0usize;
        while !stop.load(Ordering::SeqCst) {
            let busy = n.is_multiple_of(2);
            let sent = Instant::now();
            s.write_all(&flips[n % 2]).unwrap();
            while replica.load().is_busy(Class::Standard, member) != busy {
                if sent.elapsed() > Duration::from_secs(2) {
                    panic!("the probe's load did not show within 2 s");
                }
                std::thread::sleep(Duration::from_micros(20));
            }
            seen.push(sent.elapsed());
            if let Ok(at) = tapped.recv_timeout(Duration::from_secs(2)) {
                delivered.push(at.saturating_duration_since(sent));
            }
            n += 1;
            std::thread::sleep(PROBE_EVERY.saturating_sub(sent.elapsed()));
        }
        (seen, delivered)
    })
}

/// (NATS messages received, busy-set publications) so far.
fn counts(admin: SocketAddr) -> (f64, f64) {
    let text = metrics(admin);
    let get = |s: &str| metric_value(&text, s).unwrap_or(0.0);
    (
        get("spillway_nats_messages_total{direction=\"received\"}"),
        get("spillway_busy_publish_total"),
    )
}

fn pct(sorted: &[Duration], p: f64) -> String {
    if sorted.is_empty() {
        return "–".into();
    }
    let d = sorted[((sorted.len() - 1) as f64 * p).round() as usize];
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let workers: usize = env("SPILLWAY_BENCH_WORKERS").unwrap_or(if bench { 4096 } else { 128 });
    let secs: u64 = env("SPILLWAY_BENCH_SECS").unwrap_or(if bench { 20 } else { 2 });
    let churn_pct: usize = env("SPILLWAY_BENCH_CHURN_PCT").unwrap_or(1);
    if std::env::var_os("SPILLWAY_BENCH_LOG").is_some() {
        // Spillway's own log lines (e.g. each generation's `build_ms` and `commit_us`).
        tracing_subscriber::fmt()
            .with_env_filter("spillway=info")
            .with_writer(std::io::stderr)
            .init();
    }
    let (Some(etcd), Some(nats)) = (Etcd::start(), Nats::start()) else {
        return;
    };
    let etcd = Arc::new(etcd);
    let t = Instant::now();
    for i in 0..workers {
        etcd.put(&key(i), &value(i), 0);
    }
    let registered = t.elapsed();
    let toml = format!(
        "monitor_interval_ms = 20\n[nats]\nurl = \"nats://{}\"\nsubscribe = \"bench.load.>\"\n\
         [[models]]\nname = \"{MODEL}\"\n{THRESHOLDS}\
         [models.etcd]\nendpoints = [\"{}\"]\nprefix = \"{PREFIX}\"\n\
         [models.discovered]\nload_sources = [\"push\"]\n",
        nats.addr(),
        etcd.url()
    );
    let t = Instant::now();
    let handle = Arc::new(proxy(1, &toml));
    while handle.shared.snapshot.load().workers.len() < workers {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "membership incomplete after 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let full = t.elapsed();
    let ticks_per_sec = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let tid = fleet::monitor_tid();

    let stop = Arc::new(AtomicBool::new(false));
    let bursts = std::env::var_os("SPILLWAY_BENCH_BURSTS").is_some();
    let publishing = publisher(nats.addr(), (workers, bursts), stop.clone());
    std::thread::sleep(Duration::from_secs(1)); // the subscription's first ticks
    let (c0, r0, g0, w0) = (
        fleet::thread_cpu(tid, ticks_per_sec),
        counts(handle.admin_addr),
        handle.shared.snapshot.load().generation,
        Instant::now(),
    );
    let per_s = workers * churn_pct / 100;
    let churning = churn(etcd.clone(), handle.clone(), (workers, per_s), stop.clone());
    let probing = probe(nats.addr(), handle.clone(), stop.clone());
    std::thread::sleep(Duration::from_secs(secs));
    let (c1, r1, g1, wall) = (
        fleet::thread_cpu(tid, ticks_per_sec),
        counts(handle.admin_addr),
        handle.shared.snapshot.load().generation,
        w0.elapsed().as_secs_f64(),
    );
    stop.store(true, Ordering::SeqCst);
    let (ticks, late) = publishing.join().unwrap();
    let (changed, mut joins) = churning.join().unwrap();
    let (mut visible, mut delivered) = probing.join().unwrap();
    visible.sort_unstable();
    delivered.sort_unstable();
    joins.sort_unstable();
    let msgs = (r1.0 - r0.0) / wall;
    let publishes = (r1.1 - r0.1) / wall;
    println!(
        "| workers × ranks | load | churn | monitor CPU % (utime+stime) | (schedstat) | messages/s | rank events/s | busy-set publications/s | generations/s | join p50 / max ms | publish → visible p50 / p99 / max ms (n) | late ticks |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|");
    println!(
        "| {workers} × {DP} | 20 Hz, 1 message per worker{} | {:.0} changes/s | {:.1} | {:.1} | {:.0} | {:.0} | {:.0} | {:.1} | {} / {} | {} / {} / {} ({}) | {late} of {ticks} |",
        if bursts { ", all at once" } else { ", spread" },
        changed as f64 / wall,
        (c1.0 - c0.0) / wall * 100.0,
        (c1.1 - c0.1) / wall * 100.0,
        msgs,
        msgs * f64::from(DP),
        publishes,
        (g1 - g0) as f64 / wall,
        pct(&joins, 0.5),
        pct(&joins, 1.0),
        pct(&visible, 0.5),
        pct(&visible, 0.99),
        pct(&visible, 1.0),
        visible.len(),
    );
    let worst: Vec<String> = visible
        .iter()
        .rev()
        .take(10)
        .map(|d| format!("{:.2}", d.as_secs_f64() * 1000.0))
        .collect();
    println!(
        "\nThe tail of publish → visible: p90 {} / p95 {} / p98 {} ms; the 10 worst: {} ms.",
        pct(&visible, 0.90),
        pct(&visible, 0.95),
        pct(&visible, 0.98),
        worst.join(", ")
    );
    println!(
        "Publish → delivered to a plain subscriber of the probe's subject (NATS's share): p50 {} / p90 {} / p99 {} / max {} ms ({}).",
        pct(&delivered, 0.5),
        pct(&delivered, 0.9),
        pct(&delivered, 0.99),
        pct(&delivered, 1.0),
        delivered.len()
    );
    println!(
        "\nRegistering {workers} keys took {:.1} s; Spillway had them all {:.2} s after it started; measured for {wall:.1} s.",
        registered.as_secs_f64(),
        full.as_secs_f64()
    );
}
