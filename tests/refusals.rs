#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every knob that refuses a request, end to end: the answer's status and body (Dynamo's
//! `message`/`type`/`code`, then `knob`, `value`, `threshold`, `setting` and `class`) and
//! its count in `spillway_refusals_total{model,knob,class}`. Queue-full and queue-timeout
//! refusals need a held worker and are in `tests/admission.rs`; the class share is here.

use spillway_testkit::*;
use std::time::Duration;

/// One knob's case: model keys, worker keys, the load pushed for worker `w` (or none),
/// the request's class header, and what the refusal must say.
struct Case {
    model: &'static str,
    worker: &'static str,
    push: Option<&'static str>,
    class: &'static str,
    status: u16,
    message: &'static str,
    knob: &'static str,
    figures: Option<(f64, f64)>,
    setting: &'static str,
}

const BUSY: &str = "Service temporarily overloaded";

const CASES: &[Case] = &[
    Case {
        model: "active_decode_blocks_threshold = 0.5",
        worker: "kv_total_blocks = 100",
        push: Some(r#"{"worker_id":"w","active_decode_blocks":60}"#),
        class: "standard",
        status: 529,
        message: BUSY,
        knob: "decode_blocks",
        figures: Some((0.6, 0.5)),
        setting: "active_decode_blocks_threshold",
    },
    Case {
        model: "active_prefill_tokens_threshold = 100",
        worker: "",
        push: Some(r#"{"worker_id":"w","active_prefill_tokens":150}"#),
        class: "critical",
        status: 529,
        message: BUSY,
        knob: "prefill_tokens",
        figures: Some((150.0, 100.0)),
        setting: "active_prefill_tokens_threshold",
    },
    Case {
        model: "active_prefill_tokens_threshold_frac = 0.5",
        worker: "max_num_batched_tokens = 100",
        push: Some(r#"{"worker_id":"w","active_prefill_tokens":60}"#),
        class: "standard",
        status: 529,
        message: BUSY,
        knob: "prefill_tokens_frac",
        figures: Some((0.6, 0.5)),
        setting: "active_prefill_tokens_threshold_frac",
    },
    Case {
        model: "",
        worker: "",
        push: None,
        class: "sheddable",
        status: 529,
        message: "Server overloaded: worker at capacity",
        knob: "upstream_overloaded",
        figures: None,
        setting: "the worker's own limits",
    },
];

#[test]
fn every_knob_says_why_and_is_counted() {
    for case in CASES {
        let up = if case.push.is_some() {
            echo_upstream("w")
        } else {
            upstream(|_| Reply::Raw(json_response(529, r#"{"message":"full"}"#)))
        };
        let toml = format!(
            "migration_limit = 0\n[[models]]\nname = \"m\"\n{}\n[[models.workers]]\nurl = \"{}\"\nname = \"w\"\n{}\n",
            case.model,
            up.url(),
            case.worker
        );
        let p = proxy(1, &toml);
        if let Some(load) = case.push {
            let r = admin_post(p.admin_addr, "/load", load);
            assert_eq!(r.status, 200, "{}", r.text());
        }
        let r = once(p.data_addr, &classed(case.class));
        assert_eq!(r.status, case.status, "{}: {}", case.knob, r.text());
        let v = r.json();
        assert_eq!(v["message"], case.message, "{v}");
        assert_eq!(v["code"], case.status, "{v}");
        assert_eq!(v["knob"], case.knob, "{v}");
        match case.figures {
            Some((value, threshold)) => {
                assert_eq!(v["value"].as_f64(), Some(value), "{v}");
                assert_eq!(v["threshold"].as_f64(), Some(threshold), "{v}");
            }
            // No figure: the keys are there all the same, null.
            None => assert_eq!(
                (v.get("value"), v.get("threshold")),
                (
                    Some(&serde_json::Value::Null),
                    Some(&serde_json::Value::Null)
                ),
                "{v}"
            ),
        }
        assert_eq!(v["setting"], case.setting, "{v}");
        assert_eq!(v["class"], case.class, "{v}");
        let series = format!(
            "spillway_refusals_total{{model=\"m\",knob=\"{}\",class=\"{}\"}}",
            case.knob, case.class
        );
        assert_eq!(
            metric_value(&metrics(p.admin_addr), &series),
            Some(1.0),
            "{series}"
        );
    }
}

/// A sheddable request held back by its class's share of the slots, while a slot stands
/// free, is refused by that share when its queue wait ends.
#[test]
fn the_class_share_says_why_and_is_counted() {
    let held = Held::new("w");
    let toml = format!(
        "[classes.sheddable]\nslot_share = 0.5\n[[models]]\nname = \"m\"\n\
         [[models.workers]]\nurl = \"{}\"\nname = \"w\"\nengine_request_limit = 2\n\
         request_queue_limit = 2\nrequest_queue_timeout_ms = 200\n",
        held.url()
    );
    let p = proxy(1, &toml);
    let running = spawn_request(p.data_addr, classed("sheddable"));
    eventually("one runs", Duration::from_secs(5), || held.up.count() == 1);
    let r = once(p.data_addr, &classed("sheddable"));
    assert_eq!(r.status, 529, "{}", r.text());
    let v = r.json();
    assert_eq!(
        v["message"],
        "Server overloaded: request rejected after exceeding the backend admission queue delay"
    );
    assert_eq!(v["knob"], "class_share", "{v}");
    assert_eq!(
        (v["value"].as_f64(), v["threshold"].as_f64()),
        (Some(1.0), Some(1.0)),
        "{v}"
    );
    assert_eq!(v["setting"], "classes.<class>.slot_share", "{v}");
    assert_eq!(v["class"], "sheddable", "{v}");
    let series = "spillway_refusals_total{model=\"m\",knob=\"class_share\",class=\"sheddable\"}";
    assert_eq!(metric_value(&metrics(p.admin_addr), series), Some(1.0));
    // The share says nothing of the worker: a critical request takes the free slot now
    // (no refusal hold).
    let critical = spawn_request(p.data_addr, classed("critical"));
    eventually("the critical one runs", Duration::from_secs(5), || {
        held.up.count() == 2
    });
    held.release(2);
    assert_eq!(running.join().unwrap().status, 200);
    assert_eq!(critical.join().unwrap().status, 200);
}

fn classed(class: &str) -> Vec<u8> {
    let header = format!("x-spillway-class: {class}\r\n");
    post_with("/v1/completions", &header, r#"{"model":"m","prompt":"x"}"#)
}
