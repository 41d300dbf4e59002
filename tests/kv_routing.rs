#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `router_mode = "kv"`: a conversation's turns go where its prefix was sent; busy workers
//! stay excluded; a refusal migrates and re-scores without the refuser; the index and
//! the router's histograms show on /metrics.

use spillway_testkit::*;

const SYSTEM: &str = "You are a careful assistant who answers briefly and cites sources. ";

/// Turn `turn` of conversation `conv`: the shared system prompt, the history so far (each
/// earlier question and a fixed answer) and a new question.
fn turn_body(conv: usize, turn: usize) -> String {
    let mut messages = vec![format!(
        r#"{{"role":"system","content":"{}"}}"#,
        SYSTEM.repeat(8)
    )];
    for t in 0..=turn {
        messages.push(format!(
            r#"{{"role":"user","content":"conversation {conv} question {t}: {}"}}"#,
            "please explain this in more detail. ".repeat(4)
        ));
        if t < turn {
            messages.push(format!(
                r#"{{"role":"assistant","content":"answer {t}: {}"}}"#,
                "here is the detail you asked for. ".repeat(4)
            ));
        }
    }
    format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","))
}

fn turn(conv: usize, t: usize) -> Vec<u8> {
    post("/v1/chat/completions", &turn_body(conv, t))
}

/// Which worker (by name) served each (conversation, turn), from the echo upstreams.
fn served(ups: &[Upstream], names: &[&str], conv: usize, t: usize) -> Vec<String> {
    let needle = format!("conversation {conv} question {t}:");
    let mut out = Vec::new();
    for (u, name) in ups.iter().zip(names) {
        for s in u.seen() {
            let body = s.body_str();
            // The last question in the body is the turn's own.
            if body.contains(&needle) && !body.contains(&format!("question {}:", t + 1)) {
                out.push(name.to_string());
            }
        }
    }
    out
}

fn kv_proxy(ups: &[Upstream], extra_model: &str, extra_worker: &str) -> ServerHandle {
    let mut toml = format!(
        "{}[[models]]\nname = \"m\"\nrouter_mode = \"kv\"\n{extra_model}\n",
        test_head(1)
    );
    for (i, u) in ups.iter().enumerate() {
        toml += &format!(
            "[[models.workers]]\nurl = \"{}\"\nname = \"w{i}\"\n{extra_worker}\n",
            u.url()
        );
    }
    proxy_file(&ConfigFile::new(&toml))
}

#[test]
fn every_turn_of_a_conversation_goes_where_its_history_is() {
    let names = ["w0", "w1", "w2", "w3"];
    let ups: Vec<Upstream> = names.iter().map(|n| echo_upstream(n)).collect();
    let p = kv_proxy(&ups, "", "");
    let mut c = Client::connect(p.data_addr);
    for t in 0..4 {
        for conv in 0..12 {
            assert_eq!(c.request(&turn(conv, t)).status, 200);
        }
    }
    for conv in 0..12 {
        let first = served(&ups, &names, conv, 0);
        assert_eq!(first.len(), 1, "conversation {conv}: {first:?}");
        for t in 1..4 {
            assert_eq!(
                served(&ups, &names, conv, t),
                first,
                "conversation {conv} turn {t} left its worker"
            );
        }
    }
    let m = metrics(p.admin_addr);
    let hits = metric_value(&m, "dynamo_component_router_kv_hit_rate_count{model=\"m\"}");
    assert_eq!(hits, Some(48.0), "{m}");
    let routed: f64 = names
        .iter()
        .filter_map(|n| {
            metric_value(
                &m,
                &format!("spillway_kv_routed_blocks_total{{worker=\"{n}\"}}"),
            )
        })
        .sum();
    let predicted: f64 = names
        .iter()
        .filter_map(|n| {
            metric_value(
                &m,
                &format!("spillway_kv_predicted_hit_blocks_total{{worker=\"{n}\"}}"),
            )
        })
        .sum();
    assert!(
        predicted > 0.5 * routed,
        "{predicted} of {routed} blocks predicted cached"
    );
    assert!(metric_value(&m, "spillway_kv_index_bytes{model=\"m\"}").unwrap() > 0.0);
    assert!(metric_value(&m, "spillway_kv_index_entries{model=\"m\"}").unwrap() > 0.0);
    assert!(metric_value(&m, "spillway_kv_index_inserts_total{model=\"m\"}").unwrap() > 0.0);
    assert!(m.contains("spillway_kv_router_overhead_seconds_bucket{model=\"m\",le=\"0.000001\"}"));
    if let Some(problems) = promtool_problems(&m) {
        assert!(problems.is_empty(), "{problems:?}");
    }
}

#[test]
fn a_busy_worker_is_skipped_even_when_it_holds_the_prefix() {
    let names = ["w0", "w1"];
    let ups: Vec<Upstream> = names.iter().map(|n| echo_upstream(n)).collect();
    let p = kv_proxy(
        &ups,
        "active_decode_blocks_threshold = 0.8",
        "kv_total_blocks = 100",
    );
    assert_eq!(once(p.data_addr, &turn(0, 0)).status, 200);
    let home = served(&ups, &names, 0, 0).pop().unwrap();
    let other = names.iter().find(|n| **n != home).unwrap();
    let busy = format!(r#"{{"worker_id":"{home}","active_decode_blocks":95}}"#);
    assert_eq!(admin_post(p.admin_addr, "/load", &busy).status, 200);
    eventually(
        "the busy set reached the core",
        std::time::Duration::from_secs(5),
        || {
            once(p.data_addr, &turn(0, 1)).status == 200
                && served(&ups, &names, 0, 1).contains(&other.to_string())
        },
    );
    // Both busy: the overload status, as in every mode.
    let both = format!(r#"{{"worker_id":"{other}","active_decode_blocks":95}}"#);
    assert_eq!(admin_post(p.admin_addr, "/load", &both).status, 200);
    eventually(
        "all busy gives 529",
        std::time::Duration::from_secs(5),
        || once(p.data_addr, &turn(0, 2)).status == 529,
    );
}

#[test]
fn a_refusal_migrates_and_rescores_without_the_refuser() {
    // The worker named in `refuser` answers 529; the other serves.
    let refuser = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let worker = |name: &'static str| {
        let refuser = refuser.clone();
        upstream(move |_| {
            if *refuser.lock().unwrap() == name {
                Reply::Raw(json_response(529, r#"{"error":"overloaded"}"#))
            } else {
                Reply::Raw(json_response(200, &format!(r#"{{"worker":"{name}"}}"#)))
            }
        })
    };
    let names = ["w0", "w1"];
    let ups = vec![worker("w0"), worker("w1")];
    let p = kv_proxy(&ups, "", "");
    assert_eq!(once(p.data_addr, &turn(0, 0)).status, 200);
    let home = served(&ups, &names, 0, 0).pop().unwrap();
    let other = names.iter().find(|n| **n != home).unwrap();
    *refuser.lock().unwrap() = home.clone();
    let r = once(p.data_addr, &turn(0, 1));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains(other), "{}", r.text());
    let m = metrics(p.admin_addr);
    assert!(
        m.contains(
            "dynamo_frontend_model_migration_total{model=\"m\",migration_type=\"new_request\"} 1"
        ),
        "{m}"
    );
}

/// With a waiting room, the index and the per-worker counts note only the worker a
/// request is bound to: a turn whose history is on a worker with no free slot waits in
/// the room and goes to the worker that frees one, and nothing of it is noted at the
/// first (docs/behaviour.md §8.12).
#[test]
fn a_waiter_is_noted_only_where_it_is_bound() {
    let held = [Held::new("w0"), Held::new("w1")];
    let mut toml =
        "[[models]]\nname = \"m\"\nrouter_mode = \"kv\"\nwaiting_room_size = 4\n".to_string();
    for (i, h) in held.iter().enumerate() {
        toml += &format!(
            "[[models.workers]]\nurl = \"{}\"\nname = \"w{i}\"\nengine_request_limit = 1\n",
            h.url()
        );
    }
    let p = proxy(1, &toml);
    let routed = |w: usize| {
        scrape(
            p.admin_addr,
            &format!("spillway_kv_routed_blocks_total{{worker=\"w{w}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let first = spawn_request(p.data_addr, turn(0, 0));
    let std_secs = std::time::Duration::from_secs(5);
    eventually("the first turn runs", std_secs, || {
        held[0].up.count() + held[1].up.count() == 1
    });
    let x = usize::from(held[0].up.count() == 0);
    let y = 1 - x;
    let other = spawn_request(p.data_addr, turn(1, 0));
    eventually("another conversation runs", std_secs, || {
        held[y].up.count() == 1
    });
    let at_x = routed(x);
    assert!(at_x > 0.0);
    // Conversation 0's next turn: its history is at x, whose only slot is taken.
    let next = spawn_request(p.data_addr, turn(0, 1));
    eventually("it waits in the room", std_secs, || {
        scrape(p.admin_addr, "spillway_waiting_room_requests{model=\"m\"}") == Some(1.0)
    });
    let before_y = routed(y);
    held[y].release(2);
    assert_eq!(other.join().unwrap().status, 200);
    assert_eq!(next.join().unwrap().status, 200);
    assert_eq!(
        held[y].up.count(),
        2,
        "the waiter went to the worker that freed a slot"
    );
    assert_eq!(routed(x), at_x, "nothing of the waiter was noted at x");
    assert!(routed(y) > before_y);
    held[x].release(1);
    assert_eq!(first.join().unwrap().status, 200);
}
