#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! Chaos with audits (issue 12): a few thousand requests from many clients through a
//! 2-core Spillway to workers that misbehave at random (slow answers, SSE streams cut by a
//! reset or a close, a Content-Length longer than the body, bad status lines, bad chunk
//! framing, refusals, hang-ups, listeners closed or not accepting for a while), while
//! clients leave at random (queued, running, mid-stream), queue deadlines expire and the
//! config is reloaded. Then the audits: every slot, queue place, tracked-load cell and
//! in-flight count is back to zero; no worker ever had more than N requests open; every
//! client got a well-formed response (ids of one worker response only, for its own
//! request) or a close; and the proxy still serves normally.
//!
//! The workers' choices come from testkit's seeded xorshift; a failure prints its seed, and
//! `SPILLWAY_TEST_SEED=<seed>` replays the choices (not the thread interleavings).

#[path = "chaos/client.rs"]
mod client;
#[path = "chaos/worker.rs"]
mod worker;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::thread;
use std::time::{Duration, Instant};

use client::{Conn, Outcome, Record, request};
use spillway_testkit::*;
use worker::{Chaos, Worker};

const CORES: usize = 2;
/// engine_request_limit and request_queue_limit of every worker.
const N: usize = 2;
const Q: usize = 4;
const WORKERS: usize = 4;
const CLIENTS: u64 = 16;
const PER_CLIENT: u64 = 150;
/// How long a client that does not leave waits for its answer before calling it a hang.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);
/// How soon after its client left a request must stop at its worker.
const ABORTED_WITHIN: Duration = Duration::from_millis(1000);
/// How often idle worker threads look up from a blocking accept or read.
const TICK: Duration = Duration::from_millis(20);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// The config of generation `generation`: what changes between reloads is the router
/// mode, the migration limit, output-block tracking, a prefill threshold, the queue
/// deadline and how soon idle client connections park (at once, after 5 ms, after 1 s);
/// never a worker's N or Q (new limits would start a new gate).
fn config(urls: &[String], generation: u64) -> String {
    const MODES: [&str; 4] = ["round-robin", "least-loaded", "power-of-two", "random"];
    let mut s = test_head(CORES);
    s += &format!(
        "monitor_interval_ms = 10\nmigration_limit = {}\n[limits]\nconnect_timeout_ms = 200\n\
         upstream_first_byte_timeout_ms = 5000\nworker_down_backoff_ms = 20\n\
         worker_down_backoff_max_ms = 160\nworker_refusal_hold_ms = 20\n\
         buffer_release_ms = {}\n",
        1 + generation % 3,
        [0, 5, 1000][generation as usize % 3]
    );
    s += &format!(
        "[[models]]\nname = \"m\"\nrouter_mode = \"{}\"\ntrack_output_blocks = {}\n",
        MODES[generation as usize % MODES.len()],
        generation.is_multiple_of(2)
    );
    if generation % 4 == 3 {
        s += "active_prefill_tokens_threshold = 600\n";
    }
    for (i, u) in urls.iter().enumerate() {
        s += &format!(
            "[[models.workers]]\nurl = \"{u}\"\nname = \"w{i}\"\nengine_request_limit = {N}\n\
             request_queue_limit = {Q}\nrequest_queue_timeout_ms = {}\n",
            40 + 30 * (generation % 3)
        );
    }
    s
}

/// Rewrites the config and reloads it every second until `stop`; the second time, a
/// broken file first, which must be refused. Returns the good reloads and the problems.
fn reloader(
    file: &ConfigFile,
    admin: SocketAddr,
    urls: &[String],
    stop: &AtomicBool,
) -> (u64, Vec<String>) {
    let mut problems = Vec::new();
    for generation in 2.. {
        let until = Instant::now() + ms(1000);
        while Instant::now() < until {
            if stop.load(SeqCst) {
                return (generation - 2, problems);
            }
            thread::sleep(TICK);
        }
        if generation == 3 {
            file.write("this is [not toml");
            let r = admin_post(admin, "/reload", "");
            if r.status != 400 {
                problems.push(format!("a broken file: {} {}", r.status, r.text()));
            }
        }
        file.write(&config(urls, generation));
        let r = admin_post(admin, "/reload", "");
        if r.status != 200 || r.json()["generation"] != generation {
            problems.push(format!("reload {generation}: {} {}", r.status, r.text()));
        }
    }
    unreachable!()
}

fn run_clients(addr: SocketAddr, seed: u64) -> (Vec<Record>, Vec<String>) {
    let threads: Vec<_> = (0..CLIENTS)
        .map(|t| thread::spawn(move || client::client(addr, t, seed)))
        .collect();
    let (mut records, mut problems) = (Vec::new(), Vec::new());
    for t in threads {
        let (r, p) = t.join().unwrap();
        records.extend(r);
        problems.extend(p);
    }
    (records, problems)
}

/// Every engine slot, queue place, tracked-load cell, in-flight count and client
/// connection is back to zero, in the proxy's state and on `/metrics` and `/load`.
fn audit_gauges(p: &ServerHandle) {
    for i in 0..WORKERS {
        counters_back_to_zero(p.admin_addr, "m", &format!("w{i}"));
    }
    let idle = |w: &spillway::state::Worker| {
        let sum = |f: &dyn Fn(&spillway::state::TrackedLoad) -> u64| {
            (w.state.tracked.iter()).fold(0u64, |s, c| s.wrapping_add(f(c)))
        };
        let cells = [
            sum(&|c| c.inflight.load(SeqCst)),
            sum(&|c| c.prefill_tokens.load(SeqCst)),
            sum(&|c| c.decode_blocks.load(SeqCst)),
        ];
        cells == [0; 3] && w.gate.as_ref().is_none_or(|g| g.occupancy() == (0, 0))
    };
    eventually(
        "tracked cells, gates, connections at zero",
        ms(10_000),
        || {
            let snap = p.shared.snapshot.load();
            p.shared.connections.load(SeqCst) == 0 && snap.workers.iter().all(idle)
        },
    );
    // Every connection buffer back in its core's pool (the gauges refresh once a second).
    eventually(
        "load, connection and buffer gauges at zero",
        ms(10_000),
        || {
            let m = metrics(p.admin_addr);
            let series: Vec<&str> = (m.lines())
                .filter(|l| {
                    l.starts_with("dynamo_frontend_worker_active_")
                        || l.starts_with("spillway_connections_active")
                        || l.starts_with("spillway_connections_parked")
                        || l.starts_with("spillway_connection_buffers_lent")
                })
                .collect();
            series.len() == 2 * WORKERS + 3 && series.iter().all(|l| l.ends_with(" 0"))
        },
    );
    let load = admin_get(p.admin_addr, "/load").json();
    for w in load["workers"].as_array().unwrap() {
        for key in ["inflight", "slots_in_use", "queued"] {
            assert_eq!(w[key], 0, "{key} of {}", w["worker_id"]);
        }
        for r in w["ranks"].as_array().unwrap() {
            for key in ["active_prefill_tokens", "active_decode_blocks"] {
                assert!(r[key] == 0 || r[key].is_null(), "{key}: {w}");
            }
        }
    }
}

/// No worker ever had more than N requests open at once. A request counts from its head
/// until the worker's last write or a broken connection, or until its client left. And
/// no request outlived its client at the worker by more than [`ABORTED_WITHIN`]: the proxy
/// closed its upstream connection (a streaming worker sees it at its next writes).
fn audit_cap(workers: &[Arc<Worker>], records: &[Record]) {
    let left: HashMap<String, Instant> = (records.iter())
        .filter_map(|r| Some((r.tag.clone(), r.left_at?)))
        .collect();
    for w in workers {
        let handled = w.log.handled.lock().unwrap();
        let most = most_open_at_once(&handled, &left);
        let cut_short = (handled.iter())
            .filter(|h| {
                left.get(&h.tag)
                    .is_some_and(|l| (h.start..h.end).contains(l))
            })
            .count();
        eprintln!(
            "{}: {} requests ({cut_short} left while it answered), {} outages, \
             at most {most} open (its live count: {})",
            w.name,
            handled.len(),
            w.log.outages.load(SeqCst),
            w.log.max_open.load(SeqCst)
        );
        let problems = w.log.problems.lock().unwrap();
        assert!(problems.is_empty(), "{} received: {problems:?}", w.name);
        assert!(most <= N, "{} had {most} requests open at once", w.name);
        let late: Vec<String> = (handled.iter())
            .filter_map(|h| {
                let after = h.end.checked_duration_since(*left.get(&h.tag)?)?;
                (after > ABORTED_WITHIN).then(|| format!("{} ({after:?})", h.tag))
            })
            .collect();
        assert!(
            late.is_empty(),
            "answered after their clients left: {late:?}"
        );
    }
}

/// With the chaos over, requests are served: one after a few tries (workers marked down
/// come back after their backoff), then twenty in a row on one connection.
fn audit_service(p: &ServerHandle) {
    // Pooled connections a worker closed in its last outage are idle long enough by then
    // to be checked before use (`POOL_PEEK_AFTER_IDLE_MS`).
    thread::sleep(ms(400));
    let served = |c: &mut Conn, tag: &str, stream: bool| {
        let (r, keep, problem) = c.exchange(tag, &request(tag, stream, 100, false), None);
        (
            r.outcome == Outcome::Answered(200) && keep && problem.is_none(),
            problem,
        )
    };
    eventually("a request served after the chaos", ms(10_000), || {
        served(&mut Conn::connect(p.data_addr), "after", false).0
    });
    let mut c = Conn::connect(p.data_addr);
    for i in 0..20 {
        let tag = format!("after-{i}");
        let (ok, problem) = served(&mut c, &tag, i % 2 == 0);
        assert!(ok, "{tag} not served: {problem:?}");
    }
}

/// What refused requests and moved them, and how often workers failed, from `/metrics`;
/// returns the text.
fn print_refusals(admin: SocketAddr) -> String {
    let m = metrics(admin);
    let families = [
        "spillway_refusals_total",
        "spillway_migrations_total",
        "spillway_upstream_connect_failures_total",
        "spillway_failovers_total",
        "spillway_client_disconnects_total",
        "spillway_io_driver",
    ];
    for l in m.lines() {
        if families.iter().any(|f| l.starts_with(f)) && !l.ends_with(" 0") {
            eprintln!("  {l}");
        }
    }
    m
}

/// The run saw what it was meant to: pipelined requests, answers, refusals, closes,
/// clients leaving, queue deadlines, failed connects, reloads.
fn assert_scenario(by: &HashMap<Outcome, usize>, requests: usize, m: &str, reloads: u64) {
    assert!(
        requests as u64 > CLIENTS * PER_CLIENT,
        "no pipelined requests"
    );
    for o in [
        Outcome::Answered(200),
        Outcome::Answered(529),
        Outcome::Closed,
        Outcome::Left,
    ] {
        assert!(by.get(&o).is_some_and(|&n| n > 0), "no {o:?}");
    }
    for series in [
        "spillway_migrations_total{model=\"m\",reason=\"queue_timeout\"}",
        "spillway_upstream_connect_failures_total",
        "spillway_client_disconnects_total",
    ] {
        assert!(
            metric_value(m, series).is_some_and(|v| v > 0.0),
            "no {series}"
        );
    }
    assert!(reloads >= 2, "{reloads} reloads");
}

fn summary(records: &[Record], problems: &[String]) -> HashMap<Outcome, usize> {
    let mut by: HashMap<Outcome, usize> = HashMap::new();
    for r in records {
        *by.entry(r.outcome).or_default() += 1;
    }
    let mut counts: Vec<_> = by.iter().map(|(o, n)| format!("{o:?}: {n}")).collect();
    counts.sort();
    eprintln!("{} requests: {}", records.len(), counts.join(", "));
    let first: Vec<&str> = problems.iter().take(20).map(String::as_str).collect();
    assert!(
        problems.is_empty(),
        "{} problems; the first:\n{}",
        problems.len(),
        first.join("\n")
    );
    by
}

#[test]
fn chaos_with_audits() {
    let seed = seed();
    let t0 = Instant::now();
    let chaos = Arc::new(Chaos {
        seed,
        on: AtomicBool::new(true),
        stop: AtomicBool::new(false),
    });
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| Worker::start(i, chaos.clone()))
        .collect();
    let urls: Vec<String> = workers.iter().map(|w| w.url()).collect();
    let file = ConfigFile::new(&config(&urls, 1));
    let p = proxy_file(&file);
    let stop = AtomicBool::new(false);
    let (records, mut problems, reloads) = thread::scope(|s| {
        let reloads = s.spawn(|| reloader(&file, p.admin_addr, &urls, &stop));
        let (records, problems) = run_clients(p.data_addr, seed);
        stop.store(true, SeqCst);
        (records, problems, reloads.join().unwrap())
    });
    let traffic = t0.elapsed();
    chaos.on.store(false, SeqCst);
    let m = print_refusals(p.admin_addr);
    problems.extend(reloads.1);
    let by = summary(&records, &problems);
    eprintln!("traffic {traffic:?}, {} reloads", reloads.0);
    audit_gauges(&p);
    audit_cap(&workers, &records);
    audit_service(&p);
    chaos.stop.store(true, SeqCst);
    assert_scenario(&by, records.len(), &m, reloads.0);
    eprintln!("chaos test: {:?} in all", t0.elapsed());
}
