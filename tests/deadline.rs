#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! A client's stated budget (docs/behaviour.md §8.10): `x-stainless-timeout` (the OpenAI
//! SDKs' timeout, in seconds) or the configured `client_budget_header` (ms) ends a wait
//! for a worker's slot, with knob `deadline`; the request does not move to another worker
//! and the worker is not held.

use spillway_testkit::*;
use std::time::{Duration, Instant};

const DEADLINE: &str = "Server overloaded: request rejected when the time the client gave it ran out while it waited for a slot";

/// One worker with one slot, its queue timeout `queue_ms`; refusals hold it for a minute
/// (so a hold would show).
fn one_slot(held: &Held, top: &str, queue_ms: u64) -> ServerHandle {
    proxy(
        1,
        &format!(
            "{top}\n[limits]\nworker_refusal_hold_ms = 60000\n[[models]]\nname = \"m\"\n\
             [[models.workers]]\nurl = \"{}\"\nname = \"w\"\nengine_request_limit = 1\n\
             request_queue_limit = 4\nrequest_queue_timeout_ms = {queue_ms}\n",
            held.url()
        ),
    )
}

fn gauge(p: &ServerHandle, series: &str) -> f64 {
    scrape(p.admin_addr, series).unwrap_or(0.0)
}

/// What each stated budget does to a request queued behind a held one, the queue timeout
/// being 5 s: (top-level config, header lines, expected knob, expected threshold, longest
/// wait in ms).
const CASES: &[(&str, &str, &str, f64, u64)] = &[
    // The SDKs' header, in seconds.
    ("", "x-stainless-timeout: 0.3\r\n", "deadline", 300.0, 3_000),
    // An operator's header, in ms.
    (
        "client_budget_header = \"X-Request-Budget-Ms\"",
        "x-request-budget-ms: 250\r\n",
        "deadline",
        250.0,
        3_000,
    ),
    // Both: the smaller.
    (
        "client_budget_header = \"x-request-budget-ms\"",
        "x-request-budget-ms: 2000\r\nx-stainless-timeout: 0.2\r\n",
        "deadline",
        200.0,
        1_900,
    ),
    // Nothing left: refused without waiting.
    ("", "x-stainless-timeout: 0\r\n", "deadline", 0.0, 1_900),
];

#[test]
fn a_stated_budget_ends_the_wait_for_a_slot() {
    for (top, headers, knob, threshold, longest_ms) in CASES {
        let held = Held::new("w");
        let p = one_slot(&held, top, 5_000);
        let running = spawn_request(p.data_addr, tagged("running", ""));
        eventually("running", Duration::from_secs(5), || held.up.count() == 1);
        let started = Instant::now();
        let r = once(p.data_addr, &tagged("late", headers));
        let waited = started.elapsed();
        assert_eq!(r.status, 529, "{headers:?}: {}", r.text());
        let v = r.json();
        assert_eq!(v["knob"], *knob, "{headers:?}: {v}");
        assert_eq!(v["message"], DEADLINE, "{v}");
        assert_eq!(v["threshold"].as_f64(), Some(*threshold), "{v}");
        assert!(v["value"].as_f64().unwrap() >= threshold - 5.0, "{v}");
        assert!(
            waited >= Duration::from_millis((*threshold as u64).saturating_sub(10)),
            "{headers:?}: refused after {waited:?}"
        );
        // The queue timeout (5 s) did not: the budget did, well before it.
        assert!(
            waited < Duration::from_millis(*longest_ms),
            "{headers:?}: refused after {waited:?}"
        );
        assert_eq!(
            gauge(
                &p,
                "spillway_refusals_total{model=\"m\",knob=\"deadline\",class=\"standard\"}"
            ),
            1.0
        );
        assert_eq!(
            gauge(&p, "dynamo_rejection_request_total{worker=\"w\"}"),
            1.0
        );
        // Not held: the next request (no budget) queues and runs when the slot frees.
        let next = spawn_request(p.data_addr, tagged("next", ""));
        eventually("next queued", Duration::from_secs(5), || {
            gauge(&p, "dynamo_request_queue{worker=\"w\"}") == 1.0
        });
        held.release(2);
        assert_eq!(running.join().unwrap().status, 200);
        assert_eq!(next.join().unwrap().status, 200);
        let seen: Vec<_> = held.up.seen().iter().map(|s| s.body_str()).collect();
        assert!(
            !seen.iter().any(|b| b.contains("late")),
            "the refused request reached the worker: {seen:?}"
        );
    }
}

/// A budget longer than the queue timeout, or one that is not a number, changes nothing:
/// the queue timeout refuses as before.
#[test]
fn a_longer_or_unreadable_budget_leaves_the_queue_timeout() {
    for headers in [
        "x-stainless-timeout: 600\r\n",
        "x-stainless-timeout: soon\r\n",
        "x-stainless-timeout: -1\r\n",
    ] {
        let held = Held::new("w");
        let p = one_slot(&held, "", 200);
        let running = spawn_request(p.data_addr, tagged("running", ""));
        eventually("running", Duration::from_secs(5), || held.up.count() == 1);
        let r = once(p.data_addr, &tagged("late", headers));
        assert_eq!(r.status, 529, "{}", r.text());
        let v = r.json();
        assert_eq!(v["knob"], "queue_timeout", "{headers:?}: {v}");
        assert_eq!(v["threshold"].as_f64(), Some(200.0), "{v}");
        held.release(1);
        assert_eq!(running.join().unwrap().status, 200);
    }
}

/// A request whose budget ends its wait at one worker does not move to another (its time
/// is spent); one refused by the queue timeout does.
#[test]
fn a_spent_budget_does_not_migrate() {
    let (a, b) = (Held::new("a"), Held::new("b"));
    let worker = |h: &Held, name: &str| {
        format!(
            "[[models.workers]]\nurl = \"{}\"\nname = \"{name}\"\nengine_request_limit = 1\n\
             request_queue_limit = 4\nrequest_queue_timeout_ms = 5000\n",
            h.url()
        )
    };
    let p = proxy(
        1,
        &format!(
            "[[models]]\nname = \"m\"\nrouter_mode = \"round-robin\"\n{}{}",
            worker(&a, "a"),
            worker(&b, "b")
        ),
    );
    let first = spawn_request(p.data_addr, tagged("one", ""));
    let second = spawn_request(p.data_addr, tagged("two", ""));
    eventually("both slots taken", Duration::from_secs(5), || {
        a.up.count() == 1 && b.up.count() == 1
    });
    let r = once(p.data_addr, &tagged("late", "x-stainless-timeout: 0.2\r\n"));
    assert_eq!(r.status, 529, "{}", r.text());
    assert_eq!(r.json()["knob"], "deadline");
    let migrations = metrics(p.admin_addr)
        .lines()
        .filter(|l| l.starts_with("spillway_migrations_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert_eq!(migrations, 0.0, "a deadline refusal migrated");
    a.release(1);
    b.release(1);
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(second.join().unwrap().status, 200);
}

/// Behind a queue that moves at a measured pace, a request whose turn is predicted past
/// its budget is refused at once, not when its budget ends; one whose budget covers the
/// predicted wait waits its turn.
#[test]
fn a_turn_predicted_past_the_budget_is_refused_at_once() {
    let slow = upstream(|_| {
        std::thread::sleep(Duration::from_millis(150));
        Reply::Raw(json_response(200, r#"{"ok":true}"#))
    });
    let p = proxy(
        1,
        &format!(
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"{}\"\nname = \"w\"\n\
             engine_request_limit = 1\nrequest_queue_limit = 32\nrequest_queue_timeout_ms = 20000\n",
            slow.url()
        ),
    );
    let queued: Vec<_> = (0..20)
        .map(|i| spawn_request(p.data_addr, tagged(&format!("q{i}"), "")))
        .collect();
    // Slots come back every 150 ms while requests wait; the monitor measures that pace.
    eventually("a queue", Duration::from_secs(5), || {
        gauge(&p, "dynamo_request_queue{worker=\"w\"}") >= 12.0
    });
    std::thread::sleep(Duration::from_millis(700));
    let waiting = gauge(&p, "dynamo_request_queue{worker=\"w\"}");
    assert!(
        waiting >= 6.0,
        "the queue drained too fast to test: {waiting}"
    );
    // About 6+ places at ~6.7 a second: a turn about a second away, or more.
    let started = Instant::now();
    let r = once(p.data_addr, &tagged("late", "x-stainless-timeout: 0.6\r\n"));
    let waited = started.elapsed();
    eprintln!("refused after {waited:?} ({waiting} waiting)");
    assert_eq!(r.status, 529, "{}", r.text());
    let v = r.json();
    assert_eq!(v["knob"], "deadline", "{v}");
    assert!(
        waited < Duration::from_millis(450),
        "refused after {waited:?}, not at once"
    );
    // Its predicted turn, past the budget.
    assert!(v["value"].as_f64().unwrap() > 600.0, "{v}");
    assert_eq!(v["threshold"].as_f64(), Some(600.0), "{v}");
    // A budget that covers the predicted wait: the request waits its turn.
    let r = once(
        p.data_addr,
        &tagged("patient", "x-stainless-timeout: 15\r\n"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    for q in queued {
        assert_eq!(q.join().unwrap().status, 200);
    }
}
