#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! Worker admission: N engine slots plus a FIFO queue of Q across all cores, refusals,
//! migration to another worker, a Spillway in front of Spillways, and counters back to
//! zero after any mix of faults.

use spillway_testkit::*;
use std::thread::JoinHandle;
use std::time::Duration;

const AT_CAPACITY: &str = "Server overloaded: worker at capacity";
const QUEUE_DELAY: &str =
    "Server overloaded: request rejected after exceeding the backend admission queue delay";

fn gated(name: &str, url: &str, n: u32, q: u32, extra: &str) -> String {
    format!(
        "[[models.workers]]\nurl = \"{url}\"\nname = \"{name}\"\nengine_request_limit = {n}\nrequest_queue_limit = {q}\n{extra}\n"
    )
}

fn body(tag: &str) -> Vec<u8> {
    post(
        "/v1/completions",
        &format!(r#"{{"model":"m","prompt":"{tag}"}}"#),
    )
}

fn gauge(p: &ServerHandle, series: &str) -> f64 {
    scrape(p.admin_addr, series).unwrap_or(-1.0)
}

#[test]
fn ten_at_once_on_two_slots_and_two_places() {
    let held = Held::new("w");
    let p = proxy(
        2,
        &format!(
            "[[models]]\nname = \"m\"\n{}",
            gated("w", &held.url(), 2, 2, "")
        ),
    );
    let pending: Vec<_> = (0..10)
        .map(|i| spawn_request(p.data_addr, body(&format!("r{i}"))))
        .collect();
    // Two run, two wait, six are refused at once.
    eventually("slots and queue fill", Duration::from_secs(10), || {
        held.up.count() == 2 && gauge(&p, "dynamo_request_queue{worker=\"w\"}") == 2.0
    });
    assert_eq!(gauge(&p, "dynamo_engine_request{worker=\"w\"}"), 2.0);
    let rejections = "dynamo_frontend_model_rejection_total{model=\"m\",endpoint=\"completions\"}";
    eventually("six refusals counted", Duration::from_secs(10), || {
        gauge(&p, rejections) == 6.0
    });
    // At least the first was refused by the gate itself; the rest may have skipped the
    // worker held after that refusal, and count at its gate all the same.
    assert_eq!(
        gauge(&p, "dynamo_rejection_request_total{worker=\"w\"}"),
        6.0
    );
    held.release(4);
    let responses: Vec<_> = pending.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = responses.iter().filter(|r| r.status == 200).count();
    let refused: Vec<_> = responses.iter().filter(|r| r.status == 529).collect();
    assert_eq!(ok, 4);
    assert_eq!(refused.len(), 6);
    for r in refused {
        // Dynamo's three fields, then which knob refused and what tunes it.
        let v = r.json();
        assert_eq!(
            (&v["message"], &v["type"], &v["code"]),
            (&AT_CAPACITY.into(), &"Overloaded".into(), &529.into()),
            "{v}"
        );
        assert_eq!(v["knob"], "queue_full", "{v}");
        assert_eq!(
            v["setting"], "engine_request_limit + request_queue_limit",
            "{v}"
        );
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    assert_eq!(
        gauge(
            &p,
            "spillway_refusals_total{model=\"m\",knob=\"queue_full\",class=\"standard\"}"
        ),
        6.0
    );
    assert_eq!(
        held.up
            .state
            .max_active
            .load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the worker saw more than N at once"
    );
    // Tickets are given back just after the last byte reaches the client.
    eventually("slots and queue empty", Duration::from_secs(5), || {
        gauge(&p, "dynamo_engine_request{worker=\"w\"}") == 0.0
            && gauge(&p, "dynamo_request_queue{worker=\"w\"}") == 0.0
    });
}

#[test]
fn queued_requests_run_in_arrival_order_and_time_out() {
    let held = Held::new("w");
    let p = proxy(
        2,
        &format!(
            "[[models]]\nname = \"m\"\n{}",
            gated("w", &held.url(), 1, 3, "request_queue_timeout_ms = 3000")
        ),
    );
    let first = spawn_request(p.data_addr, body("first"));
    eventually("first runs", Duration::from_secs(5), || {
        held.up.count() == 1
    });
    let mut queued = Vec::new();
    for (i, tag) in ["a", "b", "c"].iter().enumerate() {
        queued.push(spawn_request(p.data_addr, body(tag)));
        eventually("queued", Duration::from_secs(5), || {
            gauge(&p, "dynamo_request_queue{worker=\"w\"}") == (i + 1) as f64
        });
    }
    held.release(4);
    assert_eq!(first.join().unwrap().status, 200);
    for q in queued {
        assert_eq!(q.join().unwrap().status, 200);
    }
    let order: Vec<_> = held.up.seen().iter().map(|s| s.body_str()).collect();
    assert_eq!(
        order,
        ["first", "a", "b", "c"].map(|t| format!(r#"{{"model":"m","prompt":"{t}"}}"#))
    );

    // Past its deadline a queued request is refused with the queue-delay message.
    let held = Held::new("w");
    let p = proxy(
        1,
        &format!(
            "[[models]]\nname = \"m\"\n{}",
            gated("w", &held.url(), 1, 2, "request_queue_timeout_ms = 300")
        ),
    );
    let running = spawn_request(p.data_addr, body("running"));
    eventually("running", Duration::from_secs(5), || held.up.count() == 1);
    let started = std::time::Instant::now();
    let r = once(p.data_addr, &body("late"));
    assert_eq!(r.status, 529);
    assert_eq!(r.json()["message"], QUEUE_DELAY);
    let v = r.json();
    assert_eq!(v["knob"], "queue_timeout", "{v}");
    assert!(
        v["value"].as_f64().unwrap() >= v["threshold"].as_f64().unwrap() - 5.0,
        "{v}"
    );
    assert_eq!(v["setting"], "request_queue_timeout_ms");
    assert!(started.elapsed() >= Duration::from_millis(290));
    assert_eq!(
        gauge(&p, "dynamo_rejection_request_total{worker=\"w\"}"),
        1.0
    );
    held.release(1);
    assert_eq!(running.join().unwrap().status, 200);
    assert_eq!(
        held.up.count(),
        1,
        "the timed-out request reached the worker"
    );
}

/// Fills worker a (one running, two queued) and sends the next request, which a refuses
/// and b serves. Returns what the test needs to wind down.
fn fill_a_then_refuse(hold_ms: u64) -> (Held, Upstream, ServerHandle, Vec<JoinHandle<Response>>) {
    let a = Held::new("a");
    let b = echo_upstream("b");
    let p = proxy(
        1,
        &format!(
            "[limits]\nworker_refusal_hold_ms = {hold_ms}\n[[models]]\nname = \"m\"\n{}{}",
            gated("a", &a.url(), 1, 2, ""),
            gated("b", &b.url(), 1, 2, "")
        ),
    );
    // Round-robin alternates a and b.
    let mut pending = Vec::new();
    for i in 0..6 {
        let h = spawn_request(p.data_addr, body(&format!("r{i}")));
        if i % 2 == 0 {
            pending.push(h);
            eventually("a admitted", Duration::from_secs(5), || {
                gauge(&p, "dynamo_engine_request{worker=\"a\"}")
                    + gauge(&p, "dynamo_request_queue{worker=\"a\"}")
                    == (i / 2 + 1) as f64
            });
        } else {
            assert_eq!(h.join().unwrap().text(), r#"{"worker":"b"}"#);
        }
    }
    let r = once(p.data_addr, &body("migrated"));
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), r#"{"worker":"b"}"#);
    (a, b, p, pending)
}

const MIGRATIONS: &str =
    "dynamo_frontend_model_migration_total{model=\"m\",migration_type=\"new_request\"}";
const MOVED_AT_CAPACITY: &str =
    "spillway_migrations_total{model=\"m\",reason=\"worker_at_capacity\"}";

#[test]
fn a_refusing_worker_stays_out_of_rotation_whatever_the_monitor_publishes() {
    let (a, _b, p, pending) = fill_a_then_refuse(60_000);
    assert_eq!(gauge(&p, MIGRATIONS), 1.0);
    assert_eq!(gauge(&p, MOVED_AT_CAPACITY), 1.0);
    // A new busy-set generation before each request (a threshold set, then unset): a
    // stays skipped, so no further refusal, no further migration.
    let publishes = gauge(&p, "spillway_busy_publish_total");
    for i in 0..4 {
        let threshold = r#"{"model":"m","active_decode_blocks_threshold":0.99}"#;
        let r = if i % 2 == 0 {
            admin_post(p.admin_addr, "/busy_threshold", threshold)
        } else {
            admin_call(
                p.admin_addr,
                "DELETE",
                "/busy_threshold",
                Some("application/json"),
                r#"{"model":"m"}"#,
            )
        };
        assert_eq!(r.status, 200, "{}", r.text());
        let r = once(p.data_addr, &body(&format!("after{i}")));
        assert_eq!(r.text(), r#"{"worker":"b"}"#);
    }
    assert!(gauge(&p, "spillway_busy_publish_total") >= publishes + 4.0);
    assert_eq!(gauge(&p, MIGRATIONS), 1.0);
    assert_eq!(
        gauge(&p, "dynamo_rejection_request_total{worker=\"a\"}"),
        1.0
    );
    a.release(3);
    for h in pending {
        assert_eq!(h.join().unwrap().status, 200);
    }
}

#[test]
fn the_refusal_hold_ends_and_the_worker_is_tried_again() {
    let (a, _b, p, pending) = fill_a_then_refuse(200);
    std::thread::sleep(Duration::from_millis(400));
    // a is tried again (round-robin reaches it within two requests), still full: another
    // refusal, another migration.
    for i in 0..2 {
        let r = once(p.data_addr, &body(&format!("later{i}")));
        assert_eq!(r.text(), r#"{"worker":"b"}"#);
    }
    assert!(gauge(&p, MOVED_AT_CAPACITY) >= 2.0);
    a.release(3);
    for h in pending {
        assert_eq!(h.join().unwrap().status, 200);
    }
}

/// The hold lasts "for a defined time or until its next load report": a report for the
/// refusing worker ends it at once, and the worker meets the gate again.
#[test]
fn a_load_report_ends_the_refusal_hold() {
    let (a, _b, p, pending) = fill_a_then_refuse(60_000);
    assert_eq!(gauge(&p, MOVED_AT_CAPACITY), 1.0);
    // Held: a is skipped, no new refusal.
    for i in 0..2 {
        let r = once(p.data_addr, &body(&format!("held{i}")));
        assert_eq!(r.text(), r#"{"worker":"b"}"#);
    }
    assert_eq!(gauge(&p, MOVED_AT_CAPACITY), 1.0);
    // The monitor's clock is in ms: a report in the refusal's own ms does not end it.
    std::thread::sleep(Duration::from_millis(5));
    let r = admin_post(
        p.admin_addr,
        "/load",
        r#"{"worker_id":"a","active_decode_blocks":0}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // a is tried again (round-robin reaches it within two requests), still full: the gate
    // refuses it and the request moves to b.
    for i in 0..2 {
        let r = once(p.data_addr, &body(&format!("reported{i}")));
        assert_eq!(r.text(), r#"{"worker":"b"}"#);
    }
    assert_eq!(gauge(&p, MOVED_AT_CAPACITY), 2.0);
    a.release(3);
    for h in pending {
        assert_eq!(h.join().unwrap().status, 200);
    }
}

#[test]
fn every_worker_at_capacity_is_overloaded() {
    let (a, b) = (Held::new("a"), Held::new("b"));
    let p = proxy(
        1,
        &format!(
            "[[models]]\nname = \"m\"\n{}{}",
            gated("a", &a.url(), 1, 2, ""),
            gated("b", &b.url(), 1, 2, "")
        ),
    );
    let pending: Vec<_> = (0..6)
        .map(|i| spawn_request(p.data_addr, body(&format!("r{i}"))))
        .collect();
    eventually("both full", Duration::from_secs(5), || {
        ["a", "b"].iter().all(|w| {
            gauge(&p, &format!("dynamo_engine_request{{worker=\"{w}\"}}"))
                + gauge(&p, &format!("dynamo_request_queue{{worker=\"{w}\"}}"))
                == 3.0
        })
    });
    let r = once(p.data_addr, &body("extra"));
    assert_eq!(r.status, 529);
    assert_eq!(r.json()["message"], AT_CAPACITY);
    a.release(3);
    b.release(3);
    for h in pending {
        assert_eq!(h.join().unwrap().status, 200);
    }
}

#[test]
fn front_spillway_migrates_on_a_back_spillways_529() {
    let w1 = Held::new("w1");
    let w2 = echo_upstream("w2");
    let back1 = proxy(
        1,
        &format!(
            "[[models]]\nname = \"m\"\n{}",
            gated("w1", &w1.url(), 1, 2, "")
        ),
    );
    let back2 = proxy(
        1,
        &format!(
            "[[models]]\nname = \"m\"\n{}",
            gated("w2", &w2.url(), 1, 2, "")
        ),
    );
    let front = proxy(
        1,
        &format!(
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://{}\"\nname = \"back1\"\n[[models.workers]]\nurl = \"http://{}\"\nname = \"back2\"\n",
            back1.data_addr, back2.data_addr
        ),
    );
    let mut pending = Vec::new();
    for i in 0..6 {
        let h = spawn_request(front.data_addr, body(&format!("r{i}")));
        if i % 2 == 0 {
            pending.push(h);
            eventually("back1 admitted", Duration::from_secs(5), || {
                gauge(&back1, "dynamo_engine_request{worker=\"w1\"}")
                    + gauge(&back1, "dynamo_request_queue{worker=\"w1\"}")
                    == (i / 2 + 1) as f64
            });
        } else {
            assert_eq!(h.join().unwrap().text(), r#"{"worker":"w2"}"#);
        }
    }
    let r = once(front.data_addr, &body("chained"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), r#"{"worker":"w2"}"#);
    assert_eq!(
        gauge(
            &front,
            "spillway_migrations_total{model=\"m\",reason=\"upstream_overloaded\"}"
        ),
        1.0
    );
    assert_eq!(
        gauge(&back1, "dynamo_rejection_request_total{worker=\"w1\"}"),
        1.0
    );
    w1.release(3);
    for h in pending {
        assert_eq!(h.join().unwrap().status, 200);
    }
}

/// What a worker's status means with each configured overload status: a 2xx is always
/// the answer; the configured code is a refusal (migrate) only when it is 429 or 5xx.
#[test]
fn upstream_statuses_are_read_by_their_class() {
    // (configured overload status, what the first worker answers, what the client gets)
    let cases: [(u16, u16, (u16, &str)); 4] = [
        (200, 200, (200, "first")),
        (400, 400, (400, "first")),
        (429, 400, (400, "first")),
        (429, 429, (200, "second")),
    ];
    for (configured, answer, (status, from)) in cases {
        let first = upstream(move |_| Reply::Raw(json_response(answer, r#"{"from":"first"}"#)));
        let second = upstream(|_| Reply::Raw(json_response(200, r#"{"from":"second"}"#)));
        let p = proxy(
            1,
            &format!(
                "overload_status_code = {configured}\n{}",
                model("m", "", &[first.url(), second.url()])
            ),
        );
        let r = once(p.data_addr, &body("x"));
        let label = format!("configured {configured}, worker answers {answer}");
        // Round-robin starts with the first worker.
        assert_eq!(r.status, status, "{label}: {}", r.text());
        assert_eq!(r.json()["from"], from, "{label}");
        assert_eq!(first.count(), 1, "{label}");
    }
}

#[test]
fn counters_return_to_zero_after_mixed_faults() {
    // The worker misbehaves by prompt: resets, stalls past the first-byte timeout, holds
    // until the client leaves, or answers.
    let up = upstream(|s| {
        let b = s.body_str();
        if b.contains("reset") {
            Reply::Close
        } else if b.contains("stall") {
            Reply::Steps(vec![
                Step::Sleep(Duration::from_millis(600)),
                Step::Write(json_response(200, "{}")),
            ])
        } else if b.contains("hang") {
            Reply::Steps(vec![Step::WaitClose])
        } else {
            Reply::Steps(vec![
                Step::Sleep(Duration::from_millis(20)),
                Step::Write(json_response(200, "{}")),
            ])
        }
    });
    let p = proxy(
        2,
        &format!(
            // No refusal hold: every request meets the gate (the hold has its own tests),
            // so clients that give up are queued or in flight when they do.
            "[limits]\nupstream_first_byte_timeout_ms = 300\nworker_refusal_hold_ms = 0\n\
             [[models]]\nname = \"m\"\n{}",
            gated("w", &up.url(), 2, 3, "request_queue_timeout_ms = 200")
        ),
    );
    let kinds = ["ok", "reset", "stall", "hang", "ok", "leave"];
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let addr = p.data_addr;
            std::thread::spawn(move || {
                for i in 0..6 {
                    let kind = kinds[(t + i) % kinds.len()];
                    let mut c = Client::connect(addr);
                    c.send(&body(&format!("{kind}-{t}-{i}")));
                    if kind == "hang" || kind == "leave" {
                        std::thread::sleep(Duration::from_millis(50));
                        drop(c); // the client gives up, queued or in flight
                    } else {
                        let _ = c.response();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    counters_back_to_zero(p.admin_addr, "m", "w");
    let m = metrics(p.admin_addr);
    assert!(metric_value(&m, "spillway_client_disconnects_total").unwrap() > 0.0);
    assert!(
        metric_value(&m, "dynamo_rejection_request_total{worker=\"w\"}").unwrap() > 0.0,
        "{m}"
    );
    // Still serving: a leaked slot or queue place would refuse it.
    assert_eq!(once(p.data_addr, &body("ok-final")).status, 200);
}
