//! Load shedding: pushed, scraped and tracked load make workers busy; busy workers leave
//! rotation on every core; all busy → overload status; nothing routable → 503.
#![allow(clippy::disallowed_methods)] // tests time what they observe

use spillway_testkit::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Dynamo's body, then the knob that refused (the least busy worker's: b's 1001 prefill
/// tokens over 1000), its figures and the setting that tunes it.
const OVERLOADED: &str = concat!(
    r#"{"message":"Service temporarily overloaded","type":"Overloaded","code":529,"#,
    r#""knob":"prefill_tokens","value":1001,"threshold":1000,"#,
    r#""setting":"active_prefill_tokens_threshold","class":"standard"}"#
);

fn push(p: &ServerHandle, body: &str) {
    let r = admin_post(p.admin_addr, "/load", body);
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Sends `n` requests, each on a fresh connection (so SO_REUSEPORT spreads them over cores).
fn statuses(p: &ServerHandle, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| once(p.data_addr, &chat("m")).status)
        .collect()
}

fn two_workers(extra_model: &str, extra_worker: &str) -> ([Upstream; 2], ServerHandle) {
    let ups = [echo_upstream("a"), echo_upstream("b")];
    let toml = format!(
        "[[models]]\nname = \"m\"\n{extra_model}\n\
         [[models.workers]]\nurl = \"{}\"\nname = \"a\"\n{extra_worker}\n\
         [[models.workers]]\nurl = \"{}\"\nname = \"b\"\n{extra_worker}\n",
        ups[0].url(),
        ups[1].url()
    );
    let p = proxy(2, &toml);
    (ups, p)
}

#[test]
fn pushed_load_removes_a_worker_from_rotation_on_every_core() {
    let (ups, p) = two_workers(
        "active_decode_blocks_threshold = 0.8",
        "kv_total_blocks = 100",
    );
    push(&p, r#"{"worker_id":"a","active_decode_blocks":90}"#);
    let before = metric_value(&metrics(p.admin_addr), "spillway_busy_publish_total").unwrap();
    assert!(before >= 1.0);
    let s = statuses(&p, 40);
    assert!(s.iter().all(|&c| c == 200), "{s:?}");
    assert_eq!(ups[0].count(), 0, "busy worker got traffic");
    assert_eq!(ups[1].count(), 40);
    let m = metrics(p.admin_addr);
    for core in 0..2 {
        let served = metric_value(
            &m,
            &format!("spillway_core_connections_total{{core=\"{core}\"}}"),
        )
        .unwrap_or(0.0);
        assert!(
            served > 0.0,
            "core {core} served nothing; the test did not cover it:\n{m}"
        );
    }
    assert_eq!(
        metric_value(&m, "spillway_busy_workers{model=\"m\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &m,
            "dynamo_frontend_worker_active_decode_blocks{worker_id=\"a\",dp_rank=\"0\",worker_type=\"decode\"}"
        ),
        Some(90.0)
    );
    // `GET /load` names the models each worker is busy in.
    let state = admin_get(p.admin_addr, "/load").json();
    let busy_in = |name: &str| {
        state["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["worker_id"] == name)
            .map(|w| w["busy_in"].clone())
    };
    assert_eq!(busy_in("a"), Some(serde_json::json!(["m"])), "{state}");
    assert_eq!(busy_in("b"), Some(serde_json::json!([])), "{state}");
    // Load drops: back in rotation at once.
    push(&p, r#"{"worker_id":"a","active_decode_blocks":10}"#);
    let _ = statuses(&p, 10);
    assert!(ups[0].count() > 0);
}

#[test]
fn dp_worker_with_one_free_rank_still_gets_traffic() {
    let (ups, p) = two_workers(
        "active_decode_blocks_threshold = 0.5",
        "kv_total_blocks = 100\ndp_size = 2",
    );
    push(
        &p,
        r#"[{"worker_id":"a","dp_rank":0,"kv_used_blocks":90},{"worker_id":"b","dp_rank":0,"kv_used_blocks":90},{"worker_id":"b","dp_rank":1,"kv_used_blocks":90}]"#,
    );
    let s = statuses(&p, 10);
    assert!(s.iter().all(|&c| c == 200));
    assert_eq!(
        ups[0].count(),
        10,
        "a has a free rank and must take all traffic"
    );
    assert_eq!(ups[1].count(), 0, "b has every rank busy");
    push(&p, r#"{"worker_id":"a","dp_rank":1,"kv_used_blocks":51}"#);
    let r = once(p.data_addr, &chat("m"));
    assert_eq!(r.status, 529);
}

#[test]
fn all_busy_gets_529_with_exact_body_and_retry_after() {
    let (ups, p) = two_workers("active_prefill_tokens_threshold = 1000", "");
    push(
        &p,
        r#"[{"worker_id":"a","active_prefill_tokens":5000},{"worker_id":"b","active_prefill_tokens":1001}]"#,
    );
    let started = Instant::now();
    let r = once(
        p.data_addr,
        &post(
            "/v1/chat/completions",
            r#"{"model":"m","stream":true,"messages":[]}"#,
        ),
    );
    assert_eq!(r.status, 529);
    assert_eq!(r.text(), OVERLOADED);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(ups[0].count() + ups[1].count(), 0);
    let m = metrics(p.admin_addr);
    assert_eq!(
        metric_value(
            &m,
            "spillway_refusals_total{model=\"m\",knob=\"prefill_tokens\",class=\"standard\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &m,
            "dynamo_frontend_model_rejection_total{model=\"m\",endpoint=\"chat_completions\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &m,
            "dynamo_frontend_requests_total{model=\"m\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"error\",error_type=\"overload\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn overload_status_comes_from_the_environment_with_dynamo_parse_rules() {
    for (env, want) in [
        ("429", 429u16),
        (" 503 ", 503),
        ("abc", 529),
        ("150", 529),
        ("", 529),
    ] {
        let up = echo_upstream("a");
        let overrides = spillway::Overrides {
            overload_status_env: Some(env.to_string()),
            ..Default::default()
        };
        let p = proxy_with(
            1,
            &format!(
                "[[models]]\nname = \"m\"\nactive_prefill_tokens_threshold = 0\n[[models.workers]]\nurl = \"{}\"\nname = \"a\"\n",
                up.url()
            ),
            overrides,
        );
        push(&p, r#"{"worker_id":"a","active_prefill_tokens":1}"#);
        let r = once(p.data_addr, &chat("m"));
        assert_eq!(r.status, want, "env {env:?}");
        assert_eq!(r.json()["code"], want, "env {env:?}");
        assert_eq!(r.json()["type"], "Overloaded");
    }
}

#[test]
fn all_workers_down_is_503_even_with_thresholds() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let p = proxy(
        1,
        &model("m", "active_decode_blocks_threshold = 0.5", &[dead]),
    );
    let r = once(p.data_addr, &chat("m"));
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
}

#[test]
fn each_threshold_alone() {
    // (model keys, worker keys, event that trips it, event that does not)
    let cases = [
        (
            "active_decode_blocks_threshold = 0.5",
            "kv_total_blocks = 100",
            r#"{"worker_id":"a","active_decode_blocks":51}"#,
            r#"{"worker_id":"a","active_decode_blocks":50}"#,
        ),
        (
            "active_decode_blocks_threshold = 0.5",
            "kv_total_blocks = 100",
            r#"{"worker_id":"a","kv_used_blocks":51}"#,
            r#"{"worker_id":"a","kv_used_blocks":50}"#,
        ),
        (
            "active_prefill_tokens_threshold = 100",
            "",
            r#"{"worker_id":"a","active_prefill_tokens":101}"#,
            r#"{"worker_id":"a","active_prefill_tokens":100}"#,
        ),
        (
            "active_prefill_tokens_threshold_frac = 1.5",
            "max_num_batched_tokens = 100",
            r#"{"worker_id":"a","active_prefill_tokens":151}"#,
            r#"{"worker_id":"a","active_prefill_tokens":150}"#,
        ),
    ];
    for (model_keys, worker_keys, trips, calm) in cases {
        let up = echo_upstream("a");
        let p = proxy(
            1,
            &format!(
                "[[models]]\nname = \"m\"\n{model_keys}\n[[models.workers]]\nurl = \"{}\"\nname = \"a\"\nload_sources = [\"push\"]\n{worker_keys}\n",
                up.url()
            ),
        );
        push(&p, calm);
        assert_eq!(
            once(p.data_addr, &chat("m")).status,
            200,
            "{model_keys}: {calm}"
        );
        push(&p, trips);
        assert_eq!(
            once(p.data_addr, &chat("m")).status,
            529,
            "{model_keys}: {trips}"
        );
    }
    // No threshold set: the same load does nothing.
    let up = echo_upstream("a");
    let p = proxy(
        1,
        &format!(
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"{}\"\nname = \"a\"\nkv_total_blocks = 100\n",
            up.url()
        ),
    );
    push(
        &p,
        r#"{"worker_id":"a","active_decode_blocks":100,"active_prefill_tokens":999999}"#,
    );
    assert_eq!(once(p.data_addr, &chat("m")).status, 200);
}

#[test]
fn stale_load_ages_out() {
    let up = echo_upstream("a");
    let p = proxy(
        1,
        &format!(
            "load_staleness_ms = 300\n[[models]]\nname = \"m\"\nactive_prefill_tokens_threshold = 10\n[[models.workers]]\nurl = \"{}\"\nname = \"a\"\nload_sources = [\"push\"]\n",
            up.url()
        ),
    );
    push(&p, r#"{"worker_id":"a","active_prefill_tokens":1000}"#);
    assert_eq!(once(p.data_addr, &chat("m")).status, 529);
    eventually(
        "stale load no longer counts",
        Duration::from_secs(5),
        || once(p.data_addr, &chat("m")).status == 200,
    );
}

#[test]
fn push_errors() {
    let (_ups, p) = two_workers("", "");
    let cases = [
        (r#"{"worker_id":"nobody","active_decode_blocks":1}"#, 404),
        (
            r#"[{"worker_id":"a","active_decode_blocks":1},{"worker_id":"ghost"}]"#,
            404,
        ),
        (r#"{"worker_id":"a","active_decode_blocks":-1}"#, 400),
        (r#"{"worker_id":"a","bogus":1}"#, 400),
        (r#"{"worker_id":"a","dp_rank":3}"#, 400),
        (r#"not json"#, 400),
    ];
    for (body, status) in cases {
        let r = admin_post(p.admin_addr, "/load", body);
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert!(r.json()["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    // Nothing of the rejected batches was applied.
    let state = admin_get(p.admin_addr, "/load").json();
    for w in state["workers"].as_array().unwrap() {
        assert!(w["last_push_age_ms"].is_null(), "{state}");
    }
    assert_eq!(
        admin_call(p.admin_addr, "POST", "/load", Some("text/plain"), "{}").status,
        415
    );
}

#[test]
fn scraped_vllm_metrics_drive_busy() {
    let usage = Arc::new(AtomicU64::new(10));
    let u = usage.clone();
    let up = upstream(move |s| {
        if s.path == "/metrics" {
            let text = format!(
                "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} {}\n\
                 vllm:cache_config_info{{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"1000\"}} 1.0\n\
                 vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} 3.0\n",
                u.load(Ordering::SeqCst) as f64 / 100.0
            );
            Reply::Raw(format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{text}", text.len()).into_bytes())
        } else {
            Reply::Raw(json_response(200, "{}"))
        }
    });
    let p = proxy(
        1,
        &format!(
            "scrape_interval_ms = 50\n[[models]]\nname = \"m\"\nactive_decode_blocks_threshold = 0.8\n[[models.workers]]\nurl = \"{}\"\nname = \"a\"\nload_sources = [\"scrape\"]\n",
            up.url()
        ),
    );
    assert_eq!(once(p.data_addr, &chat("m")).status, 200);
    usage.store(90, Ordering::SeqCst);
    eventually(
        "scraped usage makes the worker busy",
        Duration::from_secs(5),
        || once(p.data_addr, &chat("m")).status == 529,
    );
    let state = admin_get(p.admin_addr, "/load").json();
    assert_eq!(state["workers"][0]["ranks"][0]["kv_used_blocks"], 900);
    assert_eq!(state["workers"][0]["ranks"][0]["kv_total_blocks"], 1000);
    usage.store(20, Ordering::SeqCst);
    eventually(
        "scraped usage frees the worker",
        Duration::from_secs(5),
        || once(p.data_addr, &chat("m")).status == 200,
    );
}

#[test]
fn tracked_load_alone_trips_the_prefill_threshold_under_a_burst() {
    // The worker holds every request for a while; nothing reports load but Spillway itself.
    let up = upstream(|_| {
        Reply::Steps(vec![
            Step::Sleep(Duration::from_millis(800)),
            Step::Write(json_response(200, "{}")),
        ])
    });
    let p = proxy(
        1,
        &format!(
            "[[models]]\nname = \"m\"\nactive_prefill_tokens_threshold = 100\n[[models.workers]]\nurl = \"{}\"\nname = \"a\"\nload_sources = [\"tracked\"]\n",
            up.url()
        ),
    );
    // Each request's prompt is ~200 bytes ≈ 50 tokens.
    let prompt = "x".repeat(200);
    let body = format!(r#"{{"model":"m","prompt":"{prompt}"}}"#);
    let mut held = Vec::new();
    let mut rejected = None;
    for i in 0..20 {
        let mut c = Client::connect(p.data_addr);
        c.send(&post("/v1/completions", &body));
        std::thread::sleep(Duration::from_millis(60));
        if up.count() < i + 1 {
            // Not forwarded: it must have been rejected.
            rejected = Some((i, c.response()));
            break;
        }
        held.push(c);
    }
    let (i, r) = rejected.expect("the burst never tripped the threshold");
    assert_eq!(r.status, 529, "{}", r.text());
    assert!(
        i >= 2,
        "tripped after {i} requests; 3 × 50 tokens are needed to exceed 100"
    );
    for mut c in held {
        assert_eq!(c.response().status, 200);
    }
    eventually("tracked load drains", Duration::from_secs(5), || {
        once(p.data_addr, &post("/v1/completions", &body)).status == 200
    });
}

/// A core counts the prefill it routes at once: a burst between two monitor folds finds
/// the worker busy as soon as what this core sent it crosses the threshold, and the
/// refusal says so. The monitor folds tracked load only once a minute here.
#[test]
fn a_core_sees_its_own_routing_before_the_monitor_folds_it() {
    let held = Held::new("a");
    let p = proxy(
        1,
        &format!(
            "monitor_interval_ms = 60000
[[models]]
name = \"m\"
\
             active_prefill_tokens_threshold = 100
[[models.workers]]
url = \"{}\"
\
             name = \"a\"
load_sources = [\"tracked\"]
",
            held.url()
        ),
    );
    // A core's count starts again with each busy set published: wait for the first
    // (the control thread's start-up publish), or a late one restarts the count.
    eventually(
        "the first busy set is published",
        Duration::from_secs(5),
        || admin_get(p.admin_addr, "/load").json()["generation"].as_u64() >= Some(1),
    );
    // 200 bytes of prompt (the quotes count) = 50 tokens each: 100 after two, over it
    // after three.
    let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(198));
    let mut sent = Vec::new();
    for i in 1..=3 {
        sent.push(spawn_request(p.data_addr, post("/v1/completions", &body)));
        eventually("forwarded", Duration::from_secs(5), || held.up.count() == i);
    }
    let r = once(p.data_addr, &post("/v1/completions", &body));
    assert_eq!(r.status, 529, "{}", r.text());
    let why = r.json();
    assert_eq!(why["knob"], "prefill_tokens", "{}", r.text());
    assert_eq!(
        (why["value"].as_f64(), why["threshold"].as_f64()),
        (Some(150.0), Some(100.0))
    );
    held.release(3);
    for h in sent {
        assert_eq!(h.join().unwrap().status, 200);
    }
}

#[test]
fn scrape_reads_a_chunked_body_that_arrives_in_pieces() {
    let up = upstream(|s| {
        if s.path != "/metrics" {
            return Reply::Raw(json_response(200, "{}"));
        }
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n";
        Reply::Steps(vec![
            Step::Write(head.as_bytes().to_vec()),
            Step::Write(chunk(
                "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"1000\"} 1.0\n",
            )),
            Step::Sleep(Duration::from_millis(30)),
            Step::Write(chunk(
                "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n",
            )),
            Step::Write(b"0\r\n\r\n".to_vec()),
        ])
    });
    let p = proxy(
        1,
        &format!(
            "scrape_interval_ms = 50\n[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"{}\"\nname = \"a\"\nload_sources = [\"scrape\"]\n",
            up.url()
        ),
    );
    eventually("chunked metrics scraped", Duration::from_secs(5), || {
        let state = admin_get(p.admin_addr, "/load").json();
        state["workers"][0]["ranks"][0]["kv_used_blocks"] == 250
    });
    let state = admin_get(p.admin_addr, "/load").json();
    assert!(state["workers"][0]["scrape_error"].is_null(), "{state}");
}

/// A worker made busy by a pushed report while a heavy tenant has two requests there:
/// the heavy tenant's next one is refused, a light tenant's (below the mean in flight)
/// still reaches the busy worker, and a second light one (at the mean) is refused. With
/// `busy_spares_light_tenants = false` the light tenant is refused like the heavy one.
#[test]
fn busy_workers_still_take_a_light_tenants_request() {
    for spares in [true, false] {
        let w = Held::new("w");
        let p = proxy(
            2,
            &format!(
                "tenant_header = \"x-tenant\"\nbusy_spares_light_tenants = {spares}\n\
                 [[models]]\nname = \"m\"\nactive_decode_blocks_threshold = 0.5\n\
                 [[models.workers]]\nurl = \"{}\"\nname = \"w\"\nkv_total_blocks = 100\n\
                 load_sources = [\"push\"]\n",
                w.url()
            ),
        );
        let as_tenant = |tenant: &str, tag: &str| tagged(tag, &format!("x-tenant: {tenant}\r\n"));
        let held: Vec<_> = (0..2)
            .map(|i| spawn_request(p.data_addr, as_tenant("heavy", &format!("heavy{i}"))))
            .collect();
        eventually("heavy at the worker", Duration::from_secs(5), || {
            w.up.count() == 2
        });
        push(&p, r#"{"worker_id":"w","active_decode_blocks":90}"#);
        let r = once(p.data_addr, &as_tenant("heavy", "refused"));
        assert_eq!(r.status, 529, "{}", r.text());
        assert_eq!(r.json()["knob"], "decode_blocks", "{}", r.text());
        let light = spawn_request(p.data_addr, as_tenant("light", "light"));
        if spares {
            eventually("light at the worker", Duration::from_secs(5), || {
                w.up.count() == 3
            });
            let r = once(p.data_addr, &as_tenant("light", "second"));
            assert_eq!(r.status, 529, "at the mean: {}", r.text());
            let (n, series) = scrape_family(p.admin_addr, "spillway_tenant_requests");
            assert_eq!(n, 3.0, "heavy's 2 and light's 1 in flight");
            assert!(series == 1 || series == 2, "{series} tenant buckets");
            let text = metrics(p.admin_addr);
            if let Some(problems) = promtool_problems(&text) {
                assert!(problems.is_empty(), "promtool: {problems:?}\n{text}");
            }
        } else {
            let (_, series) = scrape_family(p.admin_addr, "spillway_tenant_requests");
            assert_eq!(series, 0, "nothing counted without the rule");
        }
        w.release(3);
        let light = light.join().unwrap();
        let want = if spares { 200 } else { 529 };
        assert_eq!(light.status, want, "spares {spares}: {}", light.text());
        for h in held {
            assert_eq!(h.join().unwrap().status, 200);
        }
        assert_eq!(w.up.count(), if spares { 3 } else { 2 });
    }
}
