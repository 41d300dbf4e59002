#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! The engine's own queue as a busy signal (docs/behaviour.md §3.13,
//! `waiting_requests_threshold`): Spillway's own requests beyond the engine's slots count at once, llama.cpp's
//! `requests_deferred` and `/props` slot count through a scrape, and the threshold is
//! set at run time through `/busy_threshold`. A scraped metric the engine lacks is named
//! in `spillway_scrape_missing`.

use spillway_testkit::*;
use std::time::Duration;

fn completion(tag: &str) -> Vec<u8> {
    post(
        "/v1/completions",
        &format!(r#"{{"model":"m","prompt":"{tag}"}}"#),
    )
}

fn gauge(p: &ServerHandle, series: &str) -> Option<f64> {
    scrape(p.admin_addr, series)
}

/// A 2-slot engine and a threshold of 0: the third request Spillway sends would wait in
/// the engine's queue, so it and every later one are refused at once, naming the knob.
#[test]
fn requests_beyond_the_engines_slots_are_refused_at_once() {
    let held = Held::new("w");
    let p = proxy(
        1,
        &format!(
            "[[models]]\nname = \"m\"\nwaiting_requests_threshold = 0\n\
             [[models.workers]]\nurl = \"{}\"\nname = \"w\"\ntotal_slots = 2\n",
            held.url()
        ),
    );
    let running: Vec<_> = (0..2)
        .map(|i| spawn_request(p.data_addr, completion(&format!("r{i}"))))
        .collect();
    eventually(
        "two requests at the engine",
        Duration::from_secs(10),
        || held.up.count() == 2,
    );
    for i in 0..4 {
        let r = once(p.data_addr, &completion(&format!("x{i}")));
        assert_eq!(r.status, 529, "{}", r.text());
        let v = r.json();
        assert_eq!(v["knob"], "waiting_requests", "{v}");
        assert_eq!(v["setting"], "waiting_requests_threshold", "{v}");
        assert_eq!(
            (v["value"].as_f64(), v["threshold"].as_f64()),
            (Some(1.0), Some(0.0))
        );
    }
    assert_eq!(held.up.count(), 2, "a refused request reached the engine");
    assert_eq!(
        gauge(&p, "spillway_worker_engine_slots{worker_id=\"w\"}"),
        Some(2.0)
    );
    let refusals =
        "spillway_refusals_total{model=\"m\",knob=\"waiting_requests\",class=\"standard\"}";
    assert_eq!(gauge(&p, refusals), Some(4.0));
    held.release(1 << 10);
    for h in running {
        assert_eq!(h.join().unwrap().status, 200);
    }
    // Room again once they are done.
    eventually("the engine's slots free", Duration::from_secs(10), || {
        once(p.data_addr, &completion("after")).status != 529
    });
}

/// `/busy_threshold` reads, sets and clears the threshold like the others.
#[test]
fn the_threshold_is_set_at_run_time() {
    let up = echo_upstream("a");
    let p = proxy(1, &model("m", "", &[up.url()]));
    let r = admin_post(
        p.admin_addr,
        "/busy_threshold",
        r#"{"model":"m","waiting_requests_threshold":3}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["waiting_requests_threshold"], 3, "{}", r.text());
    let r = admin_get(p.admin_addr, "/busy_threshold");
    assert_eq!(r.json()["thresholds"][0]["waiting_requests_threshold"], 3);
    let bad = admin_post(
        p.admin_addr,
        "/busy_threshold",
        r#"{"model":"m","waiting_requests_threshold":-1}"#,
    );
    assert_eq!(bad.status, 422, "{}", bad.text());
}

/// A fake llama.cpp server: `/metrics` with `deferred` requests waiting (and without
/// `requests_deferred` at all when `None`), `/props` with 4 slots, answers otherwise.
fn llamacpp(deferred: Option<u32>) -> Upstream {
    upstream(move |s| match s.path.as_str() {
        "/metrics" => {
            let mut text = String::from("# TYPE llamacpp:requests_processing gauge\n");
            text.push_str("llamacpp:requests_processing 4\n");
            if let Some(n) = deferred {
                text.push_str(&format!("llamacpp:requests_deferred {n}\n"));
            }
            Reply::Raw(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{text}",
                    text.len()
                )
                .into_bytes(),
            )
        }
        "/props" => Reply::Raw(json_response(
            200,
            r#"{"total_slots":4,"is_sleeping":false}"#,
        )),
        _ => Reply::Raw(json_response(200, r#"{"ok":true}"#)),
    })
}

/// Scrape only: llama.cpp's deferred requests over the threshold make the worker busy,
/// its `/props` says the slots, and a metric it lacks is named, never read as zero.
#[test]
fn llamacpp_deferred_requests_make_the_worker_busy() {
    let (queued, silent) = (llamacpp(Some(3)), llamacpp(None));
    let worker = |name: &str, url: &str| {
        format!(
            "[[models.workers]]\nurl = \"{url}\"\nname = \"{name}\"\nload_sources = [\"scrape\"]\n\
             metrics_format = \"llamacpp\"\n"
        )
    };
    let p = proxy(
        1,
        &format!(
            "scrape_interval_ms = 50\n[[models]]\nname = \"m\"\nwaiting_requests_threshold = 2\n{}\
             [[models]]\nname = \"n\"\nwaiting_requests_threshold = 2\n{}",
            worker("q", &queued.url()),
            worker("s", &silent.url())
        ),
    );
    eventually("both scraped", Duration::from_secs(10), || {
        gauge(&p, "spillway_worker_engine_slots{worker_id=\"q\"}") == Some(4.0)
            && gauge(&p, "spillway_worker_engine_slots{worker_id=\"s\"}") == Some(4.0)
    });
    let series =
        "spillway_worker_waiting_requests{worker_id=\"q\",dp_rank=\"0\",worker_type=\"decode\"}";
    assert_eq!(gauge(&p, series), Some(3.0));
    let r = once(p.data_addr, &completion("m"));
    assert_eq!(r.status, 529, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (&v["knob"], v["value"].as_f64()),
        (&"waiting_requests".into(), Some(3.0))
    );
    let load = admin_get(p.admin_addr, "/load").json();
    let q = load["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_id"] == "q")
        .unwrap();
    assert_eq!(q["ranks"][0]["waiting_requests"], 3, "{q}");
    // The silent one: its figure is unknown, so it serves, and the gap is named.
    let missing = "spillway_scrape_missing{worker_id=\"s\",metric=\"llamacpp:requests_deferred\"}";
    assert_eq!(gauge(&p, missing), Some(1.0));
    let served = once(
        p.data_addr,
        &post("/v1/completions", r#"{"model":"n","prompt":"x"}"#),
    );
    assert_eq!(served.status, 200, "{}", served.text());
    let silent_missing = "spillway_scrape_missing{worker_id=\"q\",";
    assert!(!metrics(p.admin_addr).contains(silent_missing));
}
