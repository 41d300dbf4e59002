#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! How long after the monitor publishes a busy set does each core see it?
//!
//! One reader thread per data core spins on `arc_swap::Cache::load()` of its own replica, as
//! a core does per request; the publisher stores a new `Arc<BusySet>` into every replica in
//! turn, as `Monitor::publish` does. Latency is from the instant before the first store to
//! the instant a reader first sees the new `generation`. Threads are pinned when the
//! affinity mask allows: publisher on the first allowed CPU, readers on the next ones.
//!
//! A plain program, not criterion: the quantity is a cross-thread latency distribution
//! (p50/p99 over many publishes), which criterion's per-iteration timing of one thread
//! cannot express.
//!
//! `cargo bench --bench publish`; `SPILLWAY_BENCH_READERS=n` sets the reader count (default:
//! allowed CPUs minus one, Spillway's default core count), `SPILLWAY_BENCH_PUBLISHES=n` the
//! number of publishes (default 20,000). Without `--bench` (`cargo test --benches`) it runs
//! a 500-publish smoke test.
#![allow(clippy::disallowed_methods)] // a benchmark times itself

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use spillway::shed::Class;
use spillway::state::BusySet;

/// The last generation; readers stop on it.
const STOP: u64 = u64::MAX;

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A busy set the size of the monitor_scale fleet (1,000 members, ~1 in 5 busy).
fn template() -> BusySet {
    let mut s = BusySet::default();
    s.set_enabled(0);
    for m in 0..1000u32 {
        if m % 5 == 0 {
            s.set_busy(Class::Standard, m, None);
        }
        s.set_load(m, (m * 7 % 1000) as u16);
    }
    s
}

fn pin(core: Option<core_affinity::CoreId>) -> bool {
    core.is_some_and(core_affinity::set_for_current)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn fmt(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 10_000 {
        format!("{ns} ns")
    } else if ns < 10_000_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}

fn row(name: &str, mut v: Vec<Duration>) {
    v.sort_unstable();
    println!(
        "| {name} | {} | {} | {} | {} | {} | {} |",
        v.len(),
        fmt(percentile(&v, 0.5)),
        fmt(percentile(&v, 0.9)),
        fmt(percentile(&v, 0.99)),
        fmt(percentile(&v, 0.999)),
        fmt(v.last().copied().unwrap_or_default()),
    );
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let cpus = core_affinity::get_core_ids().unwrap_or_default();
    let readers = env_usize("SPILLWAY_BENCH_READERS")
        .unwrap_or(cpus.len().saturating_sub(1))
        .max(1);
    let publishes =
        env_usize("SPILLWAY_BENCH_PUBLISHES").unwrap_or(if bench { 20_000 } else { 500 }) as u64;
    let oversubscribed = readers + 1 > cpus.len();

    let empty = Arc::new(BusySet::default());
    let replicas: Vec<Arc<ArcSwap<BusySet>>> = (0..readers)
        .map(|_| Arc::new(ArcSwap::new(empty.clone())))
        .collect();
    let acks: Arc<Vec<CachePadded<AtomicU64>>> = Arc::new(
        (0..readers)
            .map(|_| CachePadded::new(AtomicU64::new(0)))
            .collect(),
    );

    let mut handles = Vec::new();
    let mut pinned = 0;
    for (r, replica) in replicas.iter().enumerate() {
        let replica = replica.clone();
        let acks = acks.clone();
        let cpu = (!cpus.is_empty()).then(|| cpus[(r + 1) % cpus.len()]);
        let capacity = publishes as usize + 1;
        handles.push(std::thread::spawn(move || {
            let was_pinned = pin(cpu);
            let mut cache = arc_swap::Cache::new(replica);
            let mut seen: Vec<(u64, Instant)> = Vec::with_capacity(capacity);
            let mut last = 0;
            loop {
                let generation = cache.load().generation;
                if generation != last {
                    let at = Instant::now();
                    last = generation;
                    if generation == STOP {
                        break;
                    }
                    seen.push((generation, at));
                    acks[r].store(generation, Ordering::Release);
                }
            }
            (seen, was_pinned)
        }));
    }
    let publisher_pinned = pin(cpus.first().copied());

    let base = template();
    let mut published_at: Vec<Instant> = Vec::with_capacity(publishes as usize + 1);
    let mut store_loop: Vec<Duration> = Vec::with_capacity(publishes as usize);
    let mut gap_rng = 0x2545_f491_4f6c_dd1d_u64;
    let started = Instant::now();
    published_at.push(started); // generation 0: never published
    for generation in 1..=publishes {
        // Let every reader see the previous generation, then idle 20-80 µs so the next
        // publish does not ride on a cache line still moving.
        while acks
            .iter()
            .any(|a| a.load(Ordering::Acquire) != generation - 1)
        {
            std::hint::spin_loop();
        }
        gap_rng ^= gap_rng << 13;
        gap_rng ^= gap_rng >> 7;
        gap_rng ^= gap_rng << 17;
        let until = Instant::now() + Duration::from_micros(20 + gap_rng % 60);
        let mut next = base.clone();
        next.generation = generation;
        let next = Arc::new(next);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        let t0 = Instant::now();
        for replica in &replicas {
            replica.store(next.clone());
        }
        let t1 = Instant::now();
        published_at.push(t0);
        store_loop.push(t1 - t0);
        black_box(&next);
    }
    while acks.iter().any(|a| a.load(Ordering::Acquire) != publishes) {
        std::hint::spin_loop();
    }
    let elapsed = started.elapsed();
    let mut stop = BusySet::default();
    stop.generation = STOP;
    let stop = Arc::new(stop);
    for replica in &replicas {
        replica.store(stop.clone());
    }

    let mut per_reader: Vec<Vec<Duration>> = Vec::new();
    for h in handles {
        let (seen, was_pinned) = h.join().unwrap();
        pinned += usize::from(was_pinned);
        assert_eq!(seen.len() as u64, publishes, "a reader skipped generations");
        per_reader.push(
            seen.iter()
                .map(|(g, at)| at.duration_since(published_at[*g as usize]))
                .collect(),
        );
    }
    let all: Vec<Duration> = per_reader.iter().flatten().copied().collect();
    let slowest: Vec<Duration> = (0..publishes as usize)
        .map(|i| per_reader.iter().map(|v| v[i]).max().unwrap_or_default())
        .collect();

    println!("\n## publish → visible\n");
    println!(
        "{readers} reader thread(s) ({pinned} pinned), publisher {}pinned, {} allowed CPU(s){}; \
         {publishes} publishes in {:.2} s.\n",
        if publisher_pinned { "" } else { "not " },
        cpus.len(),
        if oversubscribed {
            " (OVERSUBSCRIBED: more spinning threads than CPUs, figures include scheduling)"
        } else {
            ""
        },
        elapsed.as_secs_f64(),
    );
    println!("| measure | samples | p50 | p90 | p99 | p99.9 | max |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    row("store → seen, any reader", all);
    if readers > 1 {
        row("store → seen by every reader", slowest);
        for (r, v) in per_reader.into_iter().enumerate() {
            row(&format!("store → seen, reader {r}"), v);
        }
    }
    row(
        &format!("publisher: store into {readers} replica(s)"),
        store_loop,
    );
    println!();
}
