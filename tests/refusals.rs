#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every knob that refuses a request, end to end: the answer's status and body (Dynamo's
//! `message`/`type`/`code`, then `knob`, `value`, `threshold`, `setting` and `class`) and
//! its count in `spillway_refusals_total{model,knob,class}`. Queue-full and queue-timeout
//! refusals need a held worker and are in `tests/admission.rs`; the class share is here,
//! and a burst whose every body and every counter must say the same.

use serde_json::Value;
use spillway_testkit::*;
use std::collections::BTreeMap;
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
                (Some(&Value::Null), Some(&Value::Null)),
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
    let m = metrics(p.admin_addr);
    assert_eq!(metric_value(&m, series), Some(1.0));
    // The worker's own Dynamo counter covers it too (docs/behaviour.md §7.10).
    let rejected = "dynamo_rejection_request_total{worker=\"w\"}";
    assert_eq!(metric_value(&m, rejected), Some(1.0));
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

/// The keys of every shed answer's body, in order.
const KEYS: [&str; 8] = [
    "message",
    "type",
    "code",
    "knob",
    "value",
    "threshold",
    "setting",
    "class",
];

/// The sum of every series of `family` in a metrics text.
fn family_sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A burst on two workers with one slot and two queue places each, held: one runs on
/// each, some wait and time out, the rest are refused at a full gate or, once a refusal
/// holds its worker, at the pick. Every refusal body of a knob has the same keys, with
/// figures; the counts per knob are the bodies'; each worker's
/// `dynamo_rejection_request_total` counts the queue-full and queue-timeout answers
/// about it (no migration here, so every refusal is an answer), and
/// `dynamo_frontend_model_rejection_total` every overload-status answer.
#[test]
fn a_burst_says_the_same_in_every_body_and_every_counter() {
    const BURST: usize = 16;
    let (a, b) = (Held::new("a"), Held::new("b"));
    let worker = |name: &str, url: String| {
        format!(
            "[[models.workers]]\nurl = \"{url}\"\nname = \"{name}\"\nengine_request_limit = 1\n\
             request_queue_limit = 2\nrequest_queue_timeout_ms = 1500\n"
        )
    };
    let toml = format!(
        "migration_limit = 0\n[limits]\nworker_refusal_hold_ms = 10000\n\
         [[models]]\nname = \"m\"\n{}{}",
        worker("a", a.url()),
        worker("b", b.url())
    );
    let p = proxy(2, &toml);
    let burst: Vec<_> = (0..BURST)
        .map(|_| spawn_request(p.data_addr, classed("standard")))
        .collect();
    // All but the two running are answered: refused at once, or when their queue wait
    // ends (the running ones are held meanwhile); then those two finish.
    eventually(
        "every other request answered",
        Duration::from_secs(15),
        || burst.iter().filter(|h| h.is_finished()).count() == BURST - 2,
    );
    assert_eq!(a.up.count() + b.up.count(), 2);
    a.release(BURST);
    b.release(BURST);
    let answers: Vec<_> = burst.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(answers.iter().filter(|r| r.status == 200).count(), 2);

    let mut by_knob: BTreeMap<String, usize> = BTreeMap::new();
    for r in answers.iter().filter(|r| r.status != 200) {
        assert_eq!(r.status, 529, "{}", r.text());
        let (text, v) = (r.text(), r.json());
        let at: Vec<usize> = KEYS
            .iter()
            .map(|k| {
                text.find(&format!("\"{k}\":"))
                    .unwrap_or_else(|| panic!("no {k}: {text}"))
            })
            .collect();
        assert!(at.is_sorted(), "keys out of order: {text}");
        assert_eq!(v.as_object().unwrap().len(), KEYS.len(), "{text}");
        let knob = v["knob"].as_str().unwrap().to_string();
        let (value, threshold) = (v["value"].as_f64(), v["threshold"].as_f64());
        match knob.as_str() {
            // Admitted against N + Q, at the gate or of the held worker with most room.
            "queue_full" => assert!(
                threshold == Some(3.0) && value.is_some_and(|x| (0.0..=3.0).contains(&x)),
                "{text}"
            ),
            "queue_timeout" => assert!(
                threshold == Some(1500.0) && value.is_some_and(|x| x >= 1400.0),
                "{text}"
            ),
            _ => panic!("unexpected knob: {text}"),
        }
        *by_knob.entry(knob).or_default() += 1;
    }
    assert!(
        by_knob.get("queue_full").is_some_and(|n| *n > 0),
        "{by_knob:?}"
    );
    assert!(
        by_knob.get("queue_timeout").is_some_and(|n| *n > 0),
        "{by_knob:?}"
    );

    let m = metrics(p.admin_addr);
    let refused: usize = by_knob.values().sum();
    for (knob, n) in &by_knob {
        let series =
            format!("spillway_refusals_total{{model=\"m\",knob=\"{knob}\",class=\"standard\"}}");
        assert_eq!(metric_value(&m, &series), Some(*n as f64), "{series}\n{m}");
    }
    assert_eq!(
        family_sum(&m, "spillway_refusals_total"),
        refused as f64,
        "{m}"
    );
    assert_eq!(
        family_sum(&m, "dynamo_rejection_request_total"),
        refused as f64,
        "every queue_full and queue_timeout answer counts at its worker's gate:\n{m}"
    );
    assert_eq!(
        family_sum(&m, "dynamo_frontend_model_rejection_total"),
        refused as f64,
        "{m}"
    );
}

/// Direct routing: a request pinned to a held worker is refused at the pick, with that
/// worker's figures, and counts at its gate like the gate's own refusal before it.
#[test]
fn a_direct_request_to_a_held_worker_gets_its_figures_and_is_counted_there() {
    let held = Held::new("w");
    let toml = format!(
        "[limits]\nworker_refusal_hold_ms = 10000\n[[models]]\nname = \"m\"\n\
         router_mode = \"direct\"\n[[models.workers]]\nurl = \"{}\"\nname = \"w\"\n\
         engine_request_limit = 1\nrequest_queue_limit = 2\nrequest_queue_timeout_ms = 10000\n",
        held.url()
    );
    let p = proxy(1, &toml);
    let pinned = || post_with("/v1/completions", "x-worker-id: w\r\n", r#"{"model":"m"}"#);
    let admitted: Vec<_> = (0..3)
        .map(|_| spawn_request(p.data_addr, pinned()))
        .collect();
    let queue = "dynamo_request_queue{worker=\"w\"}";
    eventually("one runs, two wait", Duration::from_secs(10), || {
        held.up.count() == 1 && metric_value(&metrics(p.admin_addr), queue) == Some(2.0)
    });
    // The gate refuses the fourth and holds the worker; the fifth never reaches the gate.
    let (at_gate, at_pick) = (once(p.data_addr, &pinned()), once(p.data_addr, &pinned()));
    for (r, message) in [
        (&at_gate, "Server overloaded: worker at capacity"),
        (
            &at_pick,
            "Selected worker is overloaded, please retry later",
        ),
    ] {
        assert_eq!(r.status, 529, "{}", r.text());
        let v = r.json();
        assert_eq!(v["message"], message, "{v}");
        assert_eq!(v["knob"], "queue_full", "{v}");
        assert_eq!(
            (v["value"].as_f64(), v["threshold"].as_f64()),
            (Some(3.0), Some(3.0))
        );
    }
    let m = metrics(p.admin_addr);
    let series = "spillway_refusals_total{model=\"m\",knob=\"queue_full\",class=\"standard\"}";
    assert_eq!(metric_value(&m, series), Some(2.0), "{m}");
    let rejected = "dynamo_rejection_request_total{worker=\"w\"}";
    assert_eq!(metric_value(&m, rejected), Some(2.0), "{m}");
    held.release(3);
    for r in admitted {
        assert_eq!(r.join().unwrap().status, 200);
    }
}
