#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Request classes: where a request's class comes from (header, model, default), the
//! busy thresholds each class sees, the share of a worker's slots each may fill, the
//! queue served by class, and the class in refusal bodies and metrics.

use spillway_testkit::*;
use std::time::Duration;

fn request(class: Option<&str>, tag: &str) -> Vec<u8> {
    let body = format!(r#"{{"model":"m","prompt":"{tag}"}}"#);
    let header = class.map_or(String::new(), |c| format!("x-spillway-class: {c}\r\n"));
    post_with("/v1/completions", &header, &body)
}

fn gauge(p: &ServerHandle, series: &str) -> f64 {
    scrape(p.admin_addr, series).unwrap_or(-1.0)
}

/// One worker with prefill threshold 1000; sheddable requests see it at half.
fn thresholds_config(url: &str, model_extra: &str) -> String {
    format!(
        "[classes.sheddable]\nbusy_threshold_scale = 0.5\n\
         [[models]]\nname = \"m\"\nactive_prefill_tokens_threshold = 1000\n{model_extra}\n\
         [[models.workers]]\nurl = \"{url}\"\nname = \"w\"\n"
    )
}

fn push_prefill(p: &ServerHandle, tokens: u64) {
    let body = format!(r#"{{"worker_id":"w","active_prefill_tokens":{tokens}}}"#);
    let r = admin_post(p.admin_addr, "/load", &body);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_sheddable_request_sees_the_worker_busy_first() {
    let up = echo_upstream("w");
    let p = proxy(2, &thresholds_config(&up.url(), ""));
    push_prefill(&p, 600);
    // 600 prefill tokens: over the sheddable 500, under everyone else's 1000.
    let cases: &[(Option<&str>, u16)] = &[
        (Some("sheddable"), 529),
        (Some(" SHEDDABLE "), 529),
        (None, 200),
        (Some("standard"), 200),
        (Some("critical"), 200),
        (Some("batch"), 200), // unknown: the default class, never an error
        (Some(""), 200),
    ];
    for (class, want) in cases {
        let r = once(p.data_addr, &request(*class, "x"));
        assert_eq!(r.status, *want, "class {class:?}: {}", r.text());
        if r.status == 529 {
            let v = r.json();
            assert_eq!(v["message"], "Service temporarily overloaded", "{v}");
            assert_eq!(v["knob"], "prefill_tokens", "{v}");
            assert_eq!(v["value"], 600, "{v}");
            assert_eq!(v["threshold"], 500, "{v}");
            assert_eq!(v["class"], "sheddable", "{v}");
        }
    }
    let m = metrics(p.admin_addr);
    let refused =
        "spillway_refusals_total{model=\"m\",knob=\"prefill_tokens\",class=\"sheddable\"}";
    assert_eq!(metric_value(&m, refused), Some(2.0));
    let routed = |c: &str| {
        metric_value(
            &m,
            &format!("spillway_class_requests_total{{model=\"m\",class=\"{c}\"}}"),
        )
    };
    assert_eq!(
        (routed("critical"), routed("standard"), routed("sheddable")),
        (Some(1.0), Some(4.0), Some(2.0))
    );
    // Over everyone's threshold: every class is refused, and says so.
    push_prefill(&p, 1200);
    let r = once(p.data_addr, &request(Some("critical"), "x"));
    assert_eq!(r.status, 529);
    assert_eq!(
        (r.json()["class"].clone(), r.json()["threshold"].clone()),
        ("critical".into(), 1000.into())
    );
}

#[test]
fn a_model_names_the_class_of_requests_that_name_none() {
    let up = echo_upstream("w");
    let p = proxy(2, &thresholds_config(&up.url(), "class = \"sheddable\""));
    push_prefill(&p, 600);
    assert_eq!(once(p.data_addr, &request(None, "x")).status, 529);
    assert_eq!(
        once(p.data_addr, &request(Some("nonsense"), "x")).status,
        529
    );
    assert_eq!(
        once(p.data_addr, &request(Some("critical"), "x")).status,
        200
    );
}

/// N = 2, sheddable may fill one slot: a second sheddable request waits beside a free
/// slot that a critical one then takes at once.
#[test]
fn a_sheddable_request_fills_only_its_share_of_the_slots() {
    let held = Held::new("w");
    let toml = format!(
        "[classes.sheddable]\nslot_share = 0.5\n[[models]]\nname = \"m\"\n\
         [[models.workers]]\nurl = \"{}\"\nname = \"w\"\nengine_request_limit = 2\nrequest_queue_limit = 4\n",
        held.url()
    );
    let p = proxy(2, &toml);
    let s1 = spawn_request(p.data_addr, request(Some("sheddable"), "s1"));
    eventually("s1 runs", Duration::from_secs(5), || held.up.count() == 1);
    let s2 = spawn_request(p.data_addr, request(Some("sheddable"), "s2"));
    eventually("s2 waits", Duration::from_secs(5), || {
        gauge(&p, "dynamo_request_queue{worker=\"w\"}") == 1.0
    });
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        held.up.count(),
        1,
        "a second sheddable request took the free slot"
    );
    let c = spawn_request(p.data_addr, request(Some("critical"), "c"));
    eventually(
        "the critical one runs at once",
        Duration::from_secs(5),
        || held.up.count() == 2,
    );
    held.release(3);
    for h in [s1, s2, c] {
        assert_eq!(h.join().unwrap().status, 200);
    }
    assert_eq!(held.up.count(), 3);
}

/// N = 1: while one runs, a sheddable, a standard and a critical request queue in that
/// order; they run critical first, then standard, then sheddable.
#[test]
fn the_queue_is_served_by_class_then_in_arrival_order() {
    let held = Held::new("w");
    let toml = format!(
        "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"{}\"\nname = \"w\"\n\
         engine_request_limit = 1\nrequest_queue_limit = 4\n",
        held.url()
    );
    let p = proxy(2, &toml);
    let first = spawn_request(p.data_addr, request(None, "first"));
    eventually("the first runs", Duration::from_secs(5), || {
        held.up.count() == 1
    });
    let mut queued = vec![first];
    for (i, class) in ["sheddable", "standard", "sheddable", "critical"]
        .iter()
        .enumerate()
    {
        queued.push(spawn_request(
            p.data_addr,
            request(Some(class), &format!("{class}{i}")),
        ));
        eventually("queued", Duration::from_secs(5), || {
            gauge(&p, "dynamo_request_queue{worker=\"w\"}") == (i + 1) as f64
        });
    }
    held.release(5);
    for h in queued {
        assert_eq!(h.join().unwrap().status, 200);
    }
    let order: Vec<String> = held
        .up
        .seen()
        .iter()
        .map(|s| {
            let v: serde_json::Value = serde_json::from_slice(&s.body).unwrap();
            v["prompt"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        order,
        [
            "first",
            "critical3",
            "standard1",
            "sheddable0",
            "sheddable2"
        ]
    );
}

#[test]
fn class_settings_are_checked() {
    let cases: &[(&str, &str)] = &[
        (
            "[classes]\ndefault = \"gold\"\n",
            "classes.default (line 2): unknown class `gold`",
        ),
        (
            "[classes]\nheader = \"x class\"\n",
            "classes.header (line 2): `x class` is not a header name",
        ),
        (
            "[classes.sheddable]\nslot_share = 0\n",
            "classes.sheddable.slot_share (line 2): must be greater than 0 and at most 1",
        ),
        (
            "[classes.critical]\nbusy_threshold_scale = 3.0\n",
            "classes.critical.busy_threshold_scale (line 2): must be greater than 0 and at most 2",
        ),
        ("[classes]\nbogus = 1\n", "unknown field `bogus`"),
    ];
    let model = "\n[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n";
    for (text, want) in cases {
        let err = spillway::Config::parse(&format!("{text}{model}"), &Default::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{text:?}: {err}");
    }
    let err = spillway::Config::parse(
        "[[models]]\nname = \"m\"\nclass = \"urgent\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
        &Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("models[0].class (line 3): unknown class `urgent`"),
        "{err}"
    );
}

/// The adaptive mode: a worker slower than the TTFT target has its thresholds closed
/// (down to the bound), until load that passed before now makes it busy.
#[test]
fn the_adaptive_mode_closes_the_thresholds_of_a_slow_worker() {
    let up = upstream(|_| {
        std::thread::sleep(Duration::from_millis(100));
        Reply::Raw(json_response(200, "{}"))
    });
    let toml = format!(
        "[[models]]\nname = \"m\"\nactive_prefill_tokens_threshold = 1000\n\
         adaptive_ttft_ms = 20\nadaptive_min_scale = 0.25\n\
         [[models.workers]]\nurl = \"{}\"\nname = \"w\"\n",
        up.url()
    );
    let p = proxy(1, &toml);
    let scale = || {
        gauge(
            &p,
            "spillway_adaptive_threshold_scale{model=\"m\",worker=\"w\"}",
        )
    };
    assert_eq!(scale(), 1.0);
    push_prefill(&p, 400);
    // Windows of 8 first tokens at ~100 ms against 40 (nothing refused, so near capacity:
    // twice the 20 ms target): the scale halves per window.
    let mut served = 0;
    while scale() > 0.25 {
        let r = once(p.data_addr, &request(None, "x"));
        if r.status == 529 {
            // The window that reached the bound closed between the check and this request
            // (the 400 pushed tokens are over 1000 × 0.25): a refusal at any other scale
            // is a failure.
            assert_eq!(scale(), 0.25, "refused above the bound: {}", r.text());
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        served += 1;
        assert!(
            served < 200,
            "the scale never reached its bound: {}",
            scale()
        );
    }
    push_prefill(&p, 400); // a fresh push republishes with the new scale
    let r = once(p.data_addr, &request(None, "x"));
    assert_eq!(r.status, 529, "{}", r.text());
    assert_eq!(r.json()["threshold"], 250, "{}", r.text());
}

/// The adaptive mode cuts queue waits short while the model is overloaded (a tenth of the
/// target), and leaves them to `request_queue_timeout_ms` near capacity.
#[test]
fn an_overloaded_adaptive_model_cuts_queue_waits_short() {
    let held = Held::new("w");
    let toml = format!(
        "[classes.sheddable]\nbusy_threshold_scale = 0.5\n\
         [[models]]\nname = \"m\"\nactive_prefill_tokens_threshold = 1000\n\
         adaptive_ttft_ms = 20\nadaptive_max_scale = 1\n\
         [[models.workers]]\nurl = \"{}\"\nname = \"w\"\n\
         engine_request_limit = 1\nrequest_queue_limit = 2\nrequest_queue_timeout_ms = 60000\n",
        held.url()
    );
    let p = proxy(1, &toml);
    let overloaded = || gauge(&p, "spillway_adaptive_overloaded{model=\"m\"}");
    let first = spawn_request(p.data_addr, request(None, "first"));
    eventually("the first runs", Duration::from_secs(5), || {
        held.up.count() == 1
    });
    // 600 prefill tokens: busy for sheddable requests (over 500), not for standard ones.
    push_prefill(&p, 600);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let refused = {
        let (stop, addr) = (stop.clone(), p.data_addr);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = once(addr, &request(Some("sheddable"), "s"));
                assert_eq!(r.status, 529, "{}", r.text());
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    eventually("overloaded", Duration::from_secs(10), || {
        overloaded() == 1.0
    });
    let r = once(p.data_addr, &request(None, "cut short"));
    assert_eq!(r.status, 529, "{}", r.text());
    let body = r.json();
    assert_eq!(body["knob"], "queue_timeout", "{}", r.text());
    assert_eq!(
        body["threshold"],
        2,
        "a tenth of the 20 ms target: {}",
        r.text()
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    refused.join().unwrap();
    // Near capacity again: a queued request waits for the slot.
    eventually("near capacity", Duration::from_secs(10), || {
        overloaded() == 0.0
    });
    let waits = spawn_request(p.data_addr, request(None, "waits"));
    eventually("it waits", Duration::from_secs(5), || {
        gauge(&p, "dynamo_request_queue{worker=\"w\"}") == 1.0
    });
    held.release(2);
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(waits.join().unwrap().status, 200);
}

#[test]
fn adaptive_settings_are_checked() {
    let cases: &[(&str, &str)] = &[
        (
            "adaptive_ttft_ms = 50\n",
            "models[0].adaptive_ttft_ms (line 3): the adaptive mode scales the busy thresholds: set at least one",
        ),
        (
            "active_prefill_tokens_threshold = 10\nadaptive_ttft_ms = 0\n",
            "models[0].adaptive_ttft_ms (line 4): must be greater than 0",
        ),
        (
            "active_prefill_tokens_threshold = 10\nadaptive_ttft_ms = 5\nadaptive_max_scale = 0.5\n",
            "models[0].adaptive_max_scale (line 5): must be in (0, 1] for the minimum, [1, 64] for the maximum",
        ),
    ];
    for (model, want) in cases {
        let text = format!(
            "[[models]]\nname = \"m\"\n{model}[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n"
        );
        let err = spillway::Config::parse(&text, &Default::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{model:?}: {err}");
    }
}
