#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! Broken workers leave rotation (issue 28, docs/behaviour.md §22): a worker that fails
//! every request fast, one that hangs, one killed and restarted on its port, one that
//! flaps; a fleet failing as a whole (no ejection storm, still routed); retries that
//! stop at their budget. Each runs over the router modes where the mode matters.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use spillway_testkit::*;

const MODES: &[&str] = &[
    "round-robin",
    "random",
    "power-of-two",
    "least-loaded",
    "kv",
];

/// A healthy worker: answers after `ms`, `/health` at once.
fn healthy(name: &'static str, ms: u64) -> Upstream {
    upstream(move |seen| {
        if seen.path != "/health" {
            std::thread::sleep(Duration::from_millis(ms));
        }
        Reply::Raw(json_response(200, &format!(r#"{{"worker":"{name}"}}"#)))
    })
}

/// A worker whose API server lives but whose engine fails every request at once.
fn failing() -> Upstream {
    upstream(|seen| match seen.path.as_str() {
        "/health" => Reply::Raw(json_response(200, "{}")),
        _ => Reply::Raw(json_response(500, r#"{"error":"engine failed"}"#)),
    })
}

fn chat(i: usize) -> Vec<u8> {
    post(
        "/v1/chat/completions",
        &format!(r#"{{"model":"m","messages":[{{"role":"user","content":"request {i}"}}]}}"#),
    )
}

/// `n` requests from `clients` keep-alive clients: (status, seconds taken) of each.
fn load(p: &ServerHandle, clients: usize, n: usize) -> Vec<(u16, f64)> {
    let next = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (addr, next) = (p.data_addr, next.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= n {
                        return out;
                    }
                    let t = Instant::now();
                    let status = c.request(&chat(i)).status;
                    out.push((status, t.elapsed().as_secs_f64()));
                }
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

fn failures(results: &[(u16, f64)]) -> usize {
    results.iter().filter(|(s, _)| *s != 200).count()
}

fn metric(p: &ServerHandle, series: &str) -> f64 {
    metric_value(&metrics(p.admin_addr), series).unwrap_or(0.0)
}

fn mode(m: &str) -> String {
    format!("router_mode = \"{m}\"")
}

/// Acceptance: with one of three workers answering 500 to everything, at most 2 % of
/// 1,000 requests fail in every mode; the worker is ejected once and gets less than a
/// tenth of the requests (least-loaded and kv would send it the most: it looks idle).
#[test]
fn a_worker_failing_fast_is_ejected_and_its_failures_retried_in_every_mode() {
    for m in MODES {
        let (a, b, bad) = (healthy("a", 2), healthy("b", 2), failing());
        let p = proxy(1, &model("m", &mode(m), &[a.url(), b.url(), bad.url()]));
        let results = load(&p, 8, 1_000);
        assert!(
            failures(&results) <= 20,
            "{m}: {} of 1000 failed",
            failures(&results)
        );
        let ejections = format!(
            "spillway_worker_ejections_total{{worker=\"{}\",reason=\"consecutive_failures\"}}",
            worker_name(&bad.url())
        );
        // Modes that weigh load count its failures as load and may avoid it before five
        // in a row; the others eject it.
        let ejected = metric(&p, &ejections);
        let avoids = !matches!(*m, "round-robin" | "random");
        assert!(
            ejected == 1.0 || (avoids && ejected == 0.0),
            "{m}: ejected {ejected} times"
        );
        // Its share would be a third; it gets less than a tenth.
        assert!(
            bad.count() < 100,
            "{m}: the failing worker got {} requests",
            bad.count()
        );
        assert!(
            metric(
                &p,
                "spillway_retries_total{model=\"m\",reason=\"status_5xx\"}"
            ) >= 1.0
        );
        if ejected == 0.0 {
            continue;
        }
        let workers = admin_get(p.admin_addr, "/workers").json();
        let bad_view = workers["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["name"] == worker_name(&bad.url()).as_str())
            .cloned()
            .unwrap();
        assert_eq!(bad_view["healthy"], false, "{m}: {bad_view}");
        assert_eq!(bad_view["ejection"]["state"], "ejected", "{m}: {bad_view}");
        assert_eq!(bad_view["ejection"]["reason"], "consecutive_failures");
    }
}

/// Acceptance: a worker that accepts and reads but never answers (its `/health` too)
/// holds no request longer than the check interval plus its timeout plus the service
/// time; new requests avoid it once a request of its stalled.
#[test]
fn a_hung_worker_stops_collecting_requests_in_every_mode() {
    const INTERVAL_MS: u64 = 1_000;
    const TIMEOUT_MS: u64 = 500;
    for m in MODES {
        let (a, b) = (healthy("a", 20), healthy("b", 20));
        let hung = scripted(|_, _| Script::new().hang());
        let toml = format!(
            "[limits]\nupstream_first_byte_timeout_ms = 20000\n\
             [health_check]\ninterval_ms = {INTERVAL_MS}\ntimeout_ms = {TIMEOUT_MS}\n{}",
            model("m", &mode(m), &[a.url(), b.url(), hung.url()])
        );
        let p = proxy(1, &toml);
        let results = load(&p, 6, 120);
        let longest = results.iter().map(|r| r.1).fold(0.0, f64::max);
        // Interval + timeout + service, and 0.3 s for a busy 2-core machine: far below
        // the 20 s head deadline the requests would otherwise wait out.
        let bound = (INTERVAL_MS + TIMEOUT_MS) as f64 / 1e3 + 0.02 + 0.3;
        assert!(
            longest < bound,
            "{m}: a request took {longest:.2} s (bound {bound:.2} s)"
        );
        assert_eq!(failures(&results), 0, "{m}");
        assert!(
            metric(&p, "spillway_retries_total{model=\"m\",reason=\"stalled\"}") >= 1.0,
            "{m}"
        );
        let out = format!(
            "spillway_worker_ejected{{worker=\"{}\"}}",
            worker_name(&hung.url())
        );
        assert_eq!(metric(&p, &out), 1.0, "{m}");
    }
}

/// A worker killed (its pooled connections reset, its port closed) and restarted on the
/// same port is back in rotation within its checks' rise, not after a doubled backoff.
#[test]
fn a_worker_killed_and_restarted_on_its_port_is_back_within_its_rise() {
    let other = healthy("other", 1);
    let dead = Arc::new(AtomicBool::new(false));
    let first = {
        let dead = dead.clone();
        upstream(move |_| match dead.load(Ordering::SeqCst) {
            true => Script::new().reset().into_reply(),
            false => Reply::Raw(json_response(200, r#"{"worker":"first"}"#)),
        })
    };
    let addr = first.addr;
    let toml = format!(
        "[health_check]\ninterval_ms = 200\ntimeout_ms = 200\n{}",
        model("m", "", &[first.url(), other.url()])
    );
    let p = proxy(1, &toml);
    assert_eq!(failures(&load(&p, 2, 20)), 0);
    dead.store(true, Ordering::SeqCst);
    drop(first);
    // Dead for 3 s under load: connects fail, the backoff doubles (1, 2, 4 s) and the
    // checks fail; no client sees it.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        assert_eq!(failures(&load(&p, 2, 10)), 0);
    }
    let back = upstream_on(addr, |_| {
        Reply::Raw(json_response(200, r#"{"worker":"back"}"#))
    })
    .unwrap();
    let restarted = Instant::now();
    eventually(
        "the restarted worker serves again",
        Duration::from_secs(10),
        || {
            let mut c = Client::connect(p.data_addr);
            (0..4).any(|i| c.request(&chat(i)).text().contains("back"))
        },
    );
    let took = restarted.elapsed();
    // Rise 2 × 200 ms, and slack; the doubled backoff alone would take about 4 s.
    assert!(took < Duration::from_millis(2_500), "back after {took:?}");
    assert!(back.count() > 0);
}

/// A worker that fails for 300 ms in every 600 ms is ejected (for longer each time) and
/// tried again; clients see at most 2 % of failures.
#[test]
fn a_flapping_worker_is_ejected_and_tried_again() {
    let start = Instant::now();
    let flapping = upstream(move |_| {
        let failing = (start.elapsed().as_millis() / 300) % 2 == 1;
        std::thread::sleep(Duration::from_millis(2));
        match failing {
            true => Reply::Raw(json_response(500, r#"{"error":"engine failed"}"#)),
            false => Reply::Raw(json_response(200, r#"{"worker":"flapping"}"#)),
        }
    });
    let (a, b) = (healthy("a", 2), healthy("b", 2));
    let toml = format!(
        "[outlier]\nbase_ejection_ms = 200\nmax_ejection_ms = 800\n{}",
        model(
            "m",
            &mode("round-robin"),
            &[a.url(), b.url(), flapping.url()]
        )
    );
    let p = proxy(1, &toml);
    let t = Instant::now();
    let mut results = Vec::new();
    while t.elapsed() < Duration::from_secs(4) {
        results.extend(load(&p, 6, 60));
    }
    assert!(
        failures(&results) * 50 <= results.len(),
        "{} of {} failed",
        failures(&results),
        results.len()
    );
    let name = worker_name(&flapping.url());
    let ejections: f64 = ["consecutive_failures", "failed_trial"]
        .iter()
        .map(|r| {
            metric(
                &p,
                &format!("spillway_worker_ejections_total{{worker=\"{name}\",reason=\"{r}\"}}"),
            )
        })
        .sum();
    assert!(ejections >= 2.0, "ejected {ejections} times");
    let served = flapping.count();
    assert!(
        served > 5,
        "tried again after its ejections: {served} requests"
    );
}

/// Every worker failing, checks too: at most the share beyond `min_healthy_percent` is
/// ejected, the model then ignores health and every request still reaches a worker
/// (the worker's own 500, never Spillway's 503).
#[test]
fn a_fleet_failing_as_a_whole_is_still_routed_and_ejects_no_more_than_its_share() {
    let all_bad = || upstream(|_| Reply::Raw(json_response(500, r#"{"error":"down"}"#)));
    let ws = [all_bad(), all_bad(), all_bad()];
    let urls: Vec<String> = ws.iter().map(Upstream::url).collect();
    let toml = format!(
        "[health_check]\ninterval_ms = 100\ntimeout_ms = 100\nfall = 2\n{}",
        model("m", "", &urls)
    );
    let p = proxy(1, &toml);
    let t = Instant::now();
    let mut results = Vec::new();
    while t.elapsed() < Duration::from_millis(1_500) {
        results.extend(load(&p, 4, 40));
    }
    let other: Vec<u16> = results.iter().map(|r| r.0).filter(|&s| s != 500).collect();
    assert!(
        other.is_empty(),
        "only the workers' own failures, not {other:?}"
    );
    let ejected: f64 = ws
        .iter()
        .map(|w| {
            let name = worker_name(&w.url());
            ["consecutive_failures", "failure_share", "failed_trial"]
                .iter()
                .map(|r| {
                    metric(
                        &p,
                        &format!(
                            "spillway_worker_ejections_total{{worker=\"{name}\",reason=\"{r}\"}}"
                        ),
                    )
                })
                .sum::<f64>()
        })
        .sum();
    assert!(
        ejected <= 1.0,
        "at most one of three ejected, got {ejected}"
    );
    assert!(metric(&p, "spillway_ejections_refused_total{model=\"m\"}") >= 1.0);
    eventually("health is ignored", Duration::from_secs(3), || {
        metric(&p, "spillway_model_health_ignored{model=\"m\"}") == 1.0
    });
    assert_eq!(load(&p, 2, 10).iter().filter(|r| r.0 == 503).count(), 0);
}

/// With a budget of one retry at a time, failures beyond it reach the client as the
/// worker sent them, and are counted.
#[test]
fn retries_stop_at_the_budget() {
    let slow = healthy("slow", 300);
    let bad = failing();
    let toml = format!(
        "retry_budget_percent = 0\nretry_budget_min = 1\n[outlier]\nenabled = false\n{}",
        model("m", "", &[bad.url(), slow.url()])
    );
    let p = proxy(1, &toml);
    let results = load(&p, 8, 8);
    let retried = metric(
        &p,
        "spillway_retries_total{model=\"m\",reason=\"status_5xx\"}",
    );
    let refused = metric(&p, "spillway_retry_budget_exhausted_total{model=\"m\"}");
    assert!(
        retried >= 1.0 && refused >= 1.0,
        "retried {retried}, refused {refused}"
    );
    assert_eq!(
        retried + refused,
        bad.count() as f64,
        "each failure retried or refused"
    );
    let relayed = results.iter().filter(|r| r.0 == 500).count();
    assert_eq!(
        relayed as f64, refused,
        "a refused retry relays the worker's 500"
    );
}
