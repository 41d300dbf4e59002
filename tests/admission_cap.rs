#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! The hard cap under churn (docs/behaviour.md §8.1–§8.2): clients that leave while queued or running,
//! queue timeouts and completions, against a worker that records what it had open. N is a
//! bound at every instant: a waiter that leaves frees a queue place, never an engine slot.
//!
//! Randomness comes from testkit's seeded xorshift; a failure prints its seed, and
//! `SPILLWAY_TEST_SEED=<seed>` replays it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use spillway_testkit::*;

const QUEUE_DELAY: &str =
    "Server overloaded: request rejected after exceeding the backend admission queue delay";

/// What the recording worker shares with the test.
#[derive(Default)]
struct Log {
    handled: Mutex<Vec<Handled>>,
    /// Requests whose handling started and has not ended, and the most ever.
    open: AtomicUsize,
    max_open: AtomicUsize,
    /// Tags starting with `hold` wait for this.
    released: (Mutex<bool>, Condvar),
}

impl Log {
    fn release(&self) {
        *self.released.0.lock().unwrap() = true;
        self.released.1.notify_all();
    }

    fn wait_released(&self) {
        let mut r = self.released.0.lock().unwrap();
        while !*r {
            r = self.released.1.wait(r).unwrap();
        }
    }

    fn tags(&self) -> Vec<String> {
        let h = self.handled.lock().unwrap();
        h.iter().map(|h| h.tag.clone()).collect()
    }
}

/// A worker that answers after `delay(tag)` (tags starting with `hold` wait for
/// [`Log::release`]) and records each request it handled and the most it had open at once.
fn recording_worker(
    delay: impl Fn(&str) -> Duration + Send + Sync + 'static,
) -> (Upstream, Arc<Log>) {
    let log = Arc::new(Log::default());
    let l = log.clone();
    let up = upstream(move |s| {
        let v: serde_json::Value = serde_json::from_slice(&s.body).unwrap();
        let tag = v["prompt"].as_str().unwrap().to_string();
        let start = Instant::now();
        let open = l.open.fetch_add(1, Ordering::SeqCst) + 1;
        l.max_open.fetch_max(open, Ordering::SeqCst);
        if tag.starts_with("hold") {
            l.wait_released();
        } else {
            thread::sleep(delay(&tag));
        }
        let end = Instant::now();
        l.open.fetch_sub(1, Ordering::SeqCst);
        l.handled.lock().unwrap().push(Handled { tag, start, end });
        Reply::Raw(json_response(200, "{}"))
    });
    (up, log)
}

fn body(tag: &str) -> Vec<u8> {
    post(
        "/v1/completions",
        &format!(r#"{{"model":"m","prompt":"{tag}"}}"#),
    )
}

fn config(url: &str, n: u32, q: u32, queue_timeout_ms: u64) -> String {
    // No refusal hold: every request meets the gate, none is turned away before it.
    format!(
        "[limits]\nworker_refusal_hold_ms = 0\n[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"{url}\"\nname = \"w\"\nengine_request_limit = {n}\nrequest_queue_limit = {q}\nrequest_queue_timeout_ms = {queue_timeout_ms}\n"
    )
}

/// (running, waiting) as the gauges show them.
fn occupancy(p: &ServerHandle) -> (f64, f64) {
    let m = metrics(p.admin_addr);
    let v = |s: &str| metric_value(&m, s).unwrap();
    (
        v("dynamo_engine_request{worker=\"w\"}"),
        v("dynamo_request_queue{worker=\"w\"}"),
    )
}

/// N = 1: one request runs (held by the worker) while others queue in a known order and
/// a random part of them leave. Nothing else may reach the worker while the first runs,
/// and after it the rest run in arrival order. One round instead lets the rest time out.
#[test]
fn a_waiter_that_leaves_frees_a_place_never_a_slot() {
    let mut rng = Rng::new(seed());
    for round in 0..4 {
        let timeout_round = round == 3;
        let (up, log) = recording_worker(|_| Duration::from_millis(5));
        let p = proxy(
            2,
            &config(&up.url(), 1, 4, if timeout_round { 600 } else { 5000 }),
        );
        let hold = format!("hold-{round}");
        let first = spawn_request(p.data_addr, body(&hold));
        eventually("the first runs", Duration::from_secs(5), || {
            log.open.load(Ordering::SeqCst) == 1
        });
        // Four wait, each admitted before the next is sent: their arrival order is known.
        let mut queued = Vec::new();
        for i in 0..4 {
            let tag = format!("q{round}-{i}");
            let mut c = Client::connect(p.data_addr);
            c.send(&body(&tag));
            eventually("queued", Duration::from_secs(5), || {
                occupancy(&p) == (1.0, (i + 1) as f64)
            });
            queued.push((tag, c));
        }
        // Each leaves with probability 1/2, at least one (the first, the last or one in
        // between, at random).
        let forced = rng.below(4) as usize;
        let (left, stay): (Vec<_>, Vec<_>) = queued
            .into_iter()
            .enumerate()
            .partition(|(i, _)| *i == forced || rng.below(2) == 0);
        drop(left);
        let waiting = stay.len() as f64;
        eventually("leavers gone", Duration::from_secs(5), || {
            occupancy(&p) == (1.0, waiting)
        });
        // A slot freed by a leaver would let the next one in now: give it the time.
        thread::sleep(Duration::from_millis(150));
        assert_eq!(
            log.tags(),
            Vec::<String>::new(),
            "reached the worker meanwhile"
        );
        assert_eq!(
            log.open.load(Ordering::SeqCst),
            1,
            "more than N at the worker"
        );
        if timeout_round {
            for (_, (_, mut c)) in stay {
                let r = c.response();
                assert_eq!(r.status, 529);
                assert_eq!(r.json()["message"], QUEUE_DELAY);
            }
            log.release();
            assert_eq!(first.join().unwrap().status, 200);
            assert_eq!(
                log.tags(),
                std::slice::from_ref(&hold),
                "a timed-out request ran"
            );
        } else {
            log.release();
            assert_eq!(first.join().unwrap().status, 200);
            let mut order = vec![hold.clone()];
            for (_, (tag, mut c)) in stay {
                assert_eq!(c.response().status, 200, "{tag}");
                order.push(tag);
            }
            assert_eq!(log.tags(), order, "not in arrival order");
        }
        assert_eq!(log.max_open.load(Ordering::SeqCst), 1, "round {round}");
        counters_back_to_zero(p.admin_addr, "m", "w");
    }
}

/// What one client did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Served,
    Refused,
    TimedOut,
    Left,
}

/// One client: sends `tag`; leaves after `leave_after` if given (recording when), else
/// reads the response.
fn client(
    addr: std::net::SocketAddr,
    tag: &str,
    leave_after: Option<Duration>,
) -> (Outcome, Option<Instant>) {
    let mut c = Client::connect(addr);
    c.send(&body(tag));
    if let Some(d) = leave_after {
        thread::sleep(d);
        let at = Instant::now();
        drop(c);
        return (Outcome::Left, Some(at));
    }
    let r = c.response();
    let outcome = match r.status {
        200 => Outcome::Served,
        529 if r.json()["message"] == QUEUE_DELAY => Outcome::TimedOut,
        529 => Outcome::Refused,
        s => panic!("{tag}: status {s}: {}", r.text()),
    };
    (outcome, None)
}

/// Many clients at once on N = 2, Q = 3: a random third leave (queued or running), some
/// time out in the queue, the rest are served or refused. The worker never has more than
/// N open, the gauges never show more than N running or Q waiting, and every counter
/// returns to zero.
#[test]
fn the_cap_holds_while_clients_leave_and_time_out() {
    const N: f64 = 2.0;
    const Q: f64 = 3.0;
    let seed = seed();
    // A tenth of the requests are slow: the queue behind them times out.
    let delay = move |tag: &str| {
        let mut r = Rng::new(
            seed ^ tag
                .bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31) ^ u64::from(b)),
        );
        match r.below(10) {
            0 => Duration::from_millis(150),
            _ => Duration::from_millis(2 + r.below(18)),
        }
    };
    let (up, log) = recording_worker(delay);
    let p = proxy(2, &config(&up.url(), 2, 3, 80));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (admin, stop) = (p.admin_addr, stop.clone());
        thread::spawn(move || {
            let mut most = (0.0f64, 0.0f64);
            while !stop.load(Ordering::SeqCst) {
                let m = metrics(admin);
                let v = |s: &str| metric_value(&m, s).unwrap();
                let (r, w) = (
                    v("dynamo_engine_request{worker=\"w\"}"),
                    v("dynamo_request_queue{worker=\"w\"}"),
                );
                most = (most.0.max(r), most.1.max(w));
                thread::sleep(Duration::from_millis(2));
            }
            most
        })
    };
    let threads: Vec<_> = (0..12u64)
        .map(|t| {
            let addr = p.data_addr;
            let mut rng = Rng::new(seed.wrapping_add(t.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
            thread::spawn(move || {
                (0..10)
                    .map(|i| {
                        let tag = format!("t{t}-{i}");
                        let leave =
                            (rng.below(3) == 0).then(|| Duration::from_millis(rng.below(40)));
                        let (outcome, left) = client(addr, &tag, leave);
                        thread::sleep(Duration::from_millis(rng.below(10)));
                        (tag, outcome, left)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let results: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    counters_back_to_zero(p.admin_addr, "m", "w");
    stop.store(true, Ordering::SeqCst);
    let (most_running, most_waiting) = sampler.join().unwrap();
    let count = |o: Outcome| results.iter().filter(|r| r.1 == o).count();
    let left: HashMap<String, Instant> = results
        .iter()
        .filter_map(|(tag, _, at)| at.map(|at| (tag.clone(), at)))
        .collect();
    let handled = log.handled.lock().unwrap().clone();
    eprintln!(
        "served {}, refused {}, timed out {}, left {}; the worker handled {}, its own count peaked at {}",
        count(Outcome::Served),
        count(Outcome::Refused),
        count(Outcome::TimedOut),
        count(Outcome::Left),
        handled.len(),
        log.max_open.load(Ordering::SeqCst),
    );
    assert!(count(Outcome::Served) > 0 && count(Outcome::Left) > 0);
    let most = most_open_at_once(&handled, &left);
    assert!(most <= N as usize, "the worker had {most} open at once");
    assert!(most_running <= N, "{most_running} running");
    assert!(most_waiting <= Q, "{most_waiting} waiting");
    // Served requests all reached the worker.
    for (tag, outcome, _) in &results {
        if *outcome == Outcome::Served {
            assert!(handled.iter().any(|h| &h.tag == tag), "{tag} served unseen");
        }
    }
}
