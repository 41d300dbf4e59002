#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! Disaggregated serving (docs/behaviour.md §23): a model with a prefill pool, in front of
//! mock engines in the prefill and decode roles (vLLM's handoff, checked at the engines) and
//! misbehaving raw-socket workers: both stages' exact fields, the conditional skip, a
//! prefill refusal migrating within its pool, a decode refusal retried with the same
//! transfer parameters, busy pools answered and named, a failing prefill pool falling back,
//! a client leaving during each stage, and SGLang's fan-out (one request to a prefill and a
//! decode worker at once, a hung prefill side closed once the answer is whole).

use spillway_testkit::tools::scratch_dir;
use spillway_testkit::*;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spillway_mock::{MockConfig, MockHandle, Role, start};

fn engine(role: Role) -> MockHandle {
    start(MockConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        model: "m".into(),
        decode_step_base_ms: 1.0,
        decode_step_per_seq_ms: 0.0,
        role,
        ..MockConfig::default()
    })
    .expect("mock engine starts")
}

fn url(e: &MockHandle) -> String {
    format!("http://{}", e.addr)
}

/// Model `m` decoding on `decode` with its prefill pool `m-prefill` on `prefill`;
/// `extra_m` and `extra_p` go to each entry.
fn disaggregated(decode: &[String], prefill: &[String], extra_m: &str, extra_p: &str) -> String {
    let front = format!("prefill = \"m-prefill\"\n{extra_m}");
    let pool = format!("role = \"prefill\"\n{extra_p}");
    format!(
        "{}{}",
        model("m", &front, decode),
        model("m-prefill", &pool, prefill)
    )
}

/// A streamed chat request with `bytes` bytes of prompt (about `bytes / 4` tokens).
fn original(bytes: usize) -> Value {
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": "0123456789".repeat(bytes / 10)}],
        "max_tokens": 4,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

fn send(p: &ServerHandle, body: &Value) -> Response {
    once(
        p.data_addr,
        &post("/v1/chat/completions", &body.to_string()),
    )
}

fn last_request(e: &MockHandle) -> Value {
    let r = once(e.addr, &get("/last_request"));
    serde_json::from_slice(&r.body).unwrap_or(Value::Null)
}

fn handoffs(p: &ServerHandle, outcome: &str) -> f64 {
    let series = format!("spillway_handoffs_total{{model=\"m\",outcome=\"{outcome}\"}}");
    scrape(p.admin_addr, &series).unwrap_or(0.0)
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_request_runs_vllms_two_stages_with_their_exact_fields() {
    let (pe, de) = (engine(Role::Prefill), engine(Role::Decode));
    let p = proxy(2, &disaggregated(&[url(&de)], &[url(&pe)], "", ""));
    let request = original(4_000);
    let r = send(&p, &request);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-mock-prefill"), Some("remote"), "a real handoff");
    let text = r.text();
    assert!(text.contains("data: [DONE]"), "{text}");
    assert_eq!(text.matches("\"delta\":{\"content\"").count(), 4, "{text}");

    // Stage 1, as the prefill engine received it.
    let mut first = request.clone();
    let o = first.as_object_mut().unwrap();
    o.insert("stream".into(), json!(false));
    o.insert("max_tokens".into(), json!(1));
    o.remove("stream_options");
    o.insert(
        "kv_transfer_params".into(),
        json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
               "remote_block_ids": null, "remote_host": null, "remote_port": null}),
    );
    assert_eq!(last_request(&pe), first);
    // Stage 2: the client's request with the prefill answer's parameters.
    let mut second = last_request(&de);
    let params = second.as_object_mut().unwrap().remove("kv_transfer_params");
    assert_eq!(second, request);
    let params = params.expect("stage 2 carries kv_transfer_params");
    assert_eq!(params["do_remote_prefill"], true);
    assert_eq!(params["remote_port"], pe.addr.port());
    assert_eq!(handoffs(&p, "remote"), 1.0);
    assert_eq!(handoffs(&p, "fallback"), 0.0);
    // Each pool counts its own requests.
    let m = metrics(p.admin_addr);
    let requests = |model: &str, kind: &str| {
        let series = format!(
            "dynamo_frontend_requests_total{{model=\"{model}\",endpoint=\"chat_completions\",request_type=\"{kind}\",status=\"success\",error_type=\"\"}}"
        );
        metric_value(&m, &series)
    };
    assert_eq!(requests("m-prefill", "unary"), Some(1.0), "{m}");
    assert_eq!(requests("m", "stream"), Some(1.0), "{m}");
    let after_prefill = "spillway_handoff_first_token_seconds_count{model=\"m\"}";
    assert_eq!(metric_value(&m, after_prefill), Some(1.0), "{m}");
    let ttft = "dynamo_frontend_time_to_first_token_seconds_count{model=\"m-prefill\"}";
    assert_eq!(
        metric_value(&m, ttft),
        Some(1.0),
        "the prefill stage's latency: {m}"
    );
    if let Some(problems) = promtool_problems(&m) {
        assert!(problems.is_empty(), "promtool: {problems:?}");
    }
    // Dynamo's per-worker series say which pool a worker is in.
    let (pw, dw) = (worker_name(&url(&pe)), worker_name(&url(&de)));
    for load in [
        format!(r#"{{"worker_id":"{pw}","active_prefill_tokens":5}}"#),
        format!(r#"{{"worker_id":"{dw}","active_decode_blocks":3}}"#),
    ] {
        assert_eq!(admin_post(p.admin_addr, "/load", &load).status, 200);
    }
    let m = metrics(p.admin_addr);
    let series = |family: &str, worker: &str, kind: &str| {
        let s = format!("{family}{{worker_id=\"{worker}\",dp_rank=\"0\",worker_type=\"{kind}\"}}");
        metric_value(&m, &s)
    };
    let prefill_tokens = "dynamo_frontend_worker_active_prefill_tokens";
    assert_eq!(series(prefill_tokens, &pw, "prefill"), Some(5.0), "{m}");
    let decode_blocks = "dynamo_frontend_worker_active_decode_blocks";
    assert_eq!(series(decode_blocks, &dw, "decode"), Some(3.0), "{m}");
    // Clients cannot name the prefill pool, and the model list leaves it out.
    let mut to_pool = request.clone();
    to_pool["model"] = json!("m-prefill");
    assert_eq!(send(&p, &to_pool).status, 404);
    let list = once(p.data_addr, &get("/v1/models")).json();
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");
}

#[test]
fn a_short_uncached_prompt_skips_stage_one() {
    let (pe, de) = (engine(Role::Prefill), engine(Role::Decode));
    let extra = "max_local_prefill_tokens = 1000";
    let p = proxy(1, &disaggregated(&[url(&de)], &[url(&pe)], extra, ""));
    // 400 bytes: about 100 tokens, prefilled where it decodes.
    let r = send(&p, &original(400));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-mock-prefill"), Some("local"));
    assert_eq!(
        last_request(&pe),
        Value::Null,
        "the prefill pool never saw it"
    );
    assert_eq!(last_request(&de), original(400));
    assert_eq!(handoffs(&p, "local"), 1.0);
    // 8,000 bytes: about 2,000 tokens, prefilled remotely.
    let r = send(&p, &original(8_000));
    assert_eq!(r.header("x-mock-prefill"), Some("remote"));
    assert_eq!(handoffs(&p, "remote"), 1.0);
}

#[test]
fn a_prefill_refusal_migrates_within_the_prefill_pool() {
    let pe = engine(Role::Prefill);
    let de = engine(Role::Decode);
    let refusing = upstream(|_| Reply::Raw(json_response(529, r#"{"error":"busy"}"#)));
    let prefill = [refusing.url(), url(&pe)];
    let p = proxy(1, &disaggregated(&[url(&de)], &prefill, "", ""));
    for _ in 0..4 {
        let r = send(&p, &original(4_000));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-mock-prefill"), Some("remote"));
    }
    assert!(
        refusing.count() >= 1,
        "round robin tried the refusing worker"
    );
    assert_eq!(handoffs(&p, "remote"), 4.0);
    let migrated = scrape(
        p.admin_addr,
        "spillway_migrations_total{model=\"m-prefill\",reason=\"upstream_overloaded\"}",
    );
    assert!(migrated.unwrap_or(0.0) >= 1.0, "{}", metrics(p.admin_addr));
}

#[test]
fn a_decode_refusal_after_prefill_retries_stage_two_with_the_same_parameters() {
    let (pe, de) = (engine(Role::Prefill), engine(Role::Decode));
    let refusing = upstream(|_| Reply::Raw(json_response(529, r#"{"error":"busy"}"#)));
    let decode = [refusing.url(), url(&de)];
    let p = proxy(1, &disaggregated(&decode, &[url(&pe)], "", ""));
    for _ in 0..4 {
        let r = send(&p, &original(4_000));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-mock-prefill"), Some("remote"));
    }
    let refused = refusing.seen();
    assert!(!refused.is_empty(), "round robin tried the refusing worker");
    // The refused stage 2 carried the parameters the decode engine then used; stage 1 ran
    // once per request.
    let sent: Value = serde_json::from_slice(&refused[0].body).unwrap();
    assert_eq!(sent["kv_transfer_params"]["do_remote_prefill"], true);
    assert_eq!(
        sent["kv_transfer_params"],
        last_request(&de)["kv_transfer_params"]
    );
    let prefills = metric_value(
        &once(pe.addr, &get("/metrics")).text(),
        r#"mock_remote_prefills_total{protocol="vllm"}"#,
    );
    assert_eq!(prefills, Some(4.0));
}

#[test]
fn a_busy_pool_answers_at_once_and_names_itself() {
    let (pe, de) = (engine(Role::Prefill), engine(Role::Decode));
    let (dw, pw) = (worker_name(&url(&de)), worker_name(&url(&pe)));
    let toml = format!(
        "[[models]]\nname = \"m\"\nprefill = \"m-prefill\"\nactive_decode_blocks_threshold = 0.5\n\
         [[models.workers]]\nurl = \"{}\"\nname = \"{dw}\"\nkv_total_blocks = 100\n\
         [[models]]\nname = \"m-prefill\"\nrole = \"prefill\"\nactive_prefill_tokens_threshold = 1000\n\
         [[models.workers]]\nurl = \"{}\"\nname = \"{pw}\"\n",
        url(&de),
        url(&pe)
    );
    let p = proxy(1, &toml);
    let push = |body: String| {
        let r = admin_post(p.admin_addr, "/load", &body);
        assert_eq!(r.status, 200, "{}", r.text());
    };
    push(format!(
        r#"{{"worker_id":"{pw}","active_prefill_tokens":1001}}"#
    ));
    let r = send(&p, &original(4_000));
    assert_eq!(r.status, 529, "{}", r.text());
    let body = r.json();
    assert_eq!(body["pool"], "prefill", "{body}");
    assert_eq!(body["setting"], "active_prefill_tokens_threshold", "{body}");
    assert_eq!(
        last_request(&de),
        Value::Null,
        "nothing reached a decode worker"
    );

    push(format!(
        r#"{{"worker_id":"{pw}","active_prefill_tokens":0}}"#
    ));
    push(format!(
        r#"{{"worker_id":"{dw}","active_decode_blocks":90}}"#
    ));
    let r = send(&p, &original(4_000));
    assert_eq!(r.status, 529, "{}", r.text());
    let body = r.json();
    assert_eq!(body["pool"], "decode", "{body}");
    assert_eq!(body["setting"], "active_decode_blocks_threshold", "{body}");
    assert_eq!(
        last_request(&pe),
        Value::Null,
        "no prefill for a busy decode pool"
    );
}

#[test]
fn a_failing_prefill_pool_falls_back_to_local_prefill() {
    let de = engine(Role::Decode);
    let failing = upstream(|_| Reply::Raw(json_response(500, r#"{"error":"boom"}"#)));
    let p = proxy(1, &disaggregated(&[url(&de)], &[failing.url()], "", ""));
    let r = send(&p, &original(4_000));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-mock-prefill"), Some("local"));
    assert_eq!(
        last_request(&de),
        original(4_000),
        "the client's own request"
    );
    assert_eq!(failing.count(), 1);
    assert_eq!(handoffs(&p, "fallback"), 1.0);
    // A prefill answer without transfer parameters falls back too.
    let no_params = upstream(|_| Reply::Raw(json_response(200, r#"{"choices":[]}"#)));
    let p = proxy(1, &disaggregated(&[url(&de)], &[no_params.url()], "", ""));
    let r = send(&p, &original(400));
    assert_eq!(r.header("x-mock-prefill"), Some("local"));
    assert_eq!(handoffs(&p, "fallback"), 1.0);
}

/// The client leaves while `stage` (the hanging worker) has its request: the worker sees
/// its connection closed, and nothing else is sent.
fn client_leaves_during(stage: &str) {
    let hanging = scripted(|_, _| Script::new().hang());
    let (pe, de) = (engine(Role::Prefill), engine(Role::Decode));
    let toml = match stage {
        "prefill" => disaggregated(&[url(&de)], &[hanging.url()], "", ""),
        _ => disaggregated(&[hanging.url()], &[url(&pe)], "", ""),
    };
    let p = proxy(1, &toml);
    let mut c = Client::connect(p.data_addr);
    c.send(&post("/v1/chat/completions", &original(4_000).to_string()));
    wait_for("the request at the hanging worker", || hanging.count() == 1);
    drop(c);
    wait_for("the hanging worker's connection closed", || {
        hanging.closed_by_peer().len() == 1
    });
    if stage == "prefill" {
        assert_eq!(
            last_request(&de),
            Value::Null,
            "no stage 2 after the client left"
        );
    }
    wait_for("the request counted as cancelled", || {
        let series = "dynamo_frontend_requests_total{model=\"m\",endpoint=\"chat_completions\",request_type=\"stream\",status=\"error\",error_type=\"cancelled\"}";
        scrape(p.admin_addr, series) == Some(1.0)
    });
}

#[test]
fn a_client_leaving_during_stage_one_cancels_it() {
    client_leaves_during("prefill");
}

#[test]
fn a_client_leaving_during_stage_two_cancels_it() {
    client_leaves_during("decode");
}

/// A worker's SGLang request without its bootstrap fields, and those fields.
fn bootstrap_of(mut sent: Value) -> (Value, Value) {
    let o = sent.as_object_mut().unwrap();
    let fields = json!({
        "host": o.remove("bootstrap_host"),
        "port": o.remove("bootstrap_port"),
        "room": o.remove("bootstrap_room"),
    });
    (sent, fields)
}

#[test]
fn sglang_sends_one_request_to_a_prefill_and_a_decode_worker_at_once() {
    let (pe, de) = (engine(Role::Prefill), engine(Role::Decode));
    let sglang = "handoff = \"sglang\"";
    let p = proxy(1, &disaggregated(&[url(&de)], &[url(&pe)], sglang, ""));
    let request = original(4_000);
    let mut rooms = Vec::new();
    for n in 1..=2 {
        let r = send(&p, &request);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-mock-prefill"), Some("remote"), "a real handoff");
        let text = r.text();
        assert_eq!(text.matches("\"delta\":{\"content\"").count(), 4, "{text}");
        let (to_prefill, to_decode) = (last_request(&pe), last_request(&de));
        assert_eq!(to_prefill, to_decode, "one request, to both");
        let (own, fields) = bootstrap_of(to_decode);
        assert_eq!(
            own, request,
            "the client's request, its bootstrap fields added"
        );
        assert_eq!(fields["host"], "127.0.0.1");
        assert_eq!(
            fields["port"], 8998,
            "the prefill worker's default bootstrap port"
        );
        let room = fields["room"].as_u64().expect("a room below 2^63");
        assert!(room < 1 << 63);
        rooms.push(room);
        wait_for("the prefill side counted", || {
            let series = "mock_remote_prefills_total{protocol=\"sglang\"}";
            let m = once(pe.addr, &get("/metrics")).text();
            metric_value(&m, series) == Some(f64::from(n))
        });
    }
    assert_ne!(rooms[0], rooms[1], "a fresh room per request");
    assert_eq!(handoffs(&p, "remote"), 2.0);
    let series = "dynamo_frontend_requests_total{model=\"m-prefill\",endpoint=\"chat_completions\",request_type=\"unary\",status=\"success\",error_type=\"\"}";
    wait_for("the prefill pool's requests counted", || {
        scrape(p.admin_addr, series) == Some(2.0)
    });
}

#[test]
fn sglangs_hung_prefill_side_is_closed_once_the_answer_is_whole() {
    let hanging = scripted(|_, _| Script::new().hang());
    let de = engine(Role::Decode);
    let sglang = "handoff = \"sglang\"";
    let p = proxy(1, &disaggregated(&[url(&de)], &[hanging.url()], sglang, ""));
    let r = send(&p, &original(4_000));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-mock-prefill"), Some("remote"));
    wait_for("the hung prefill side closed", || {
        hanging.closed_by_peer().len() == 1
    });
}

#[test]
fn sglangs_sides_both_close_when_the_client_leaves() {
    let hang_p = scripted(|_, _| Script::new().hang());
    let hang_d = scripted(|_, _| Script::new().hang());
    let sglang = "handoff = \"sglang\"";
    let p = proxy(
        1,
        &disaggregated(&[hang_d.url()], &[hang_p.url()], sglang, ""),
    );
    let mut c = Client::connect(p.data_addr);
    c.send(&post("/v1/chat/completions", &original(4_000).to_string()));
    wait_for("both sides sent", || {
        hang_p.count() == 1 && hang_d.count() == 1
    });
    assert_eq!(
        hang_p.seen()[0].body,
        hang_d.seen()[0].body,
        "one request, to both"
    );
    drop(c);
    wait_for("both connections closed", || {
        hang_p.closed_by_peer().len() == 1 && hang_d.closed_by_peer().len() == 1
    });
}

#[test]
fn the_access_log_names_both_workers() {
    let dir = scratch_dir("disagg-log");
    let (pe, de) = (engine(Role::Prefill), engine(Role::Decode));
    for (i, handoff) in ["vllm", "sglang"].into_iter().enumerate() {
        let log = dir.join(format!("{handoff}.log"));
        let table = format!("[access_log]\npath = \"{}\"\n", log.display());
        let extra = format!("handoff = \"{handoff}\"");
        let models = disaggregated(&[url(&de)], &[url(&pe)], &extra, "");
        let p = proxy(1, &format!("{table}{models}"));
        assert_eq!(send(&p, &original(4_000)).status, 200);
        eventually("the line written", Duration::from_secs(10), || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.lines().count() == 1)
        });
        let line: Value = serde_json::from_str(&std::fs::read_to_string(&log).unwrap()).unwrap();
        assert_eq!(line["model"], "m", "{i}: {line}");
        assert_eq!(line["worker"], worker_name(&url(&de)).as_str(), "{line}");
        assert_eq!(
            line["prefill_worker"],
            worker_name(&url(&pe)).as_str(),
            "{line}"
        );
        assert_eq!(line["status"], 200, "{line}");
    }
}

#[test]
fn each_pool_takes_its_own_threshold_at_run_time() {
    let (pe, de) = (engine(Role::Prefill), engine(Role::Decode));
    let p = proxy(1, &disaggregated(&[url(&de)], &[url(&pe)], "", ""));
    let pw = worker_name(&url(&pe));
    let load = format!(r#"{{"worker_id":"{pw}","active_prefill_tokens":5000}}"#);
    assert_eq!(admin_post(p.admin_addr, "/load", &load).status, 200);
    assert_eq!(send(&p, &original(400)).status, 200, "no threshold yet");
    // Dynamo's advice: the prefill threshold on the prefill pool.
    let body = r#"{"model":"m-prefill","active_prefill_tokens_threshold":4096}"#;
    let r = admin_post(p.admin_addr, "/busy_threshold", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(&p, &original(400));
    assert_eq!(r.status, 529, "{}", r.text());
    assert_eq!(r.json()["pool"], "prefill");
    // The model's own entry (the decode pool) is untouched.
    let list = admin_get(p.admin_addr, "/busy_threshold").json();
    let of = |name: &str| {
        let all = list["thresholds"].as_array().unwrap();
        all.iter().find(|t| t["model"] == name).unwrap().clone()
    };
    assert_eq!(of("m-prefill")["active_prefill_tokens_threshold"], 4096);
    assert!(of("m")["active_prefill_tokens_threshold"].is_null());
}

#[test]
fn a_prompt_predicted_cached_at_a_decode_worker_skips_stage_one() {
    let (pe, de) = (engine(Role::Prefill), engine(Role::Decode));
    let extra = "router_mode = \"kv\"\nmax_local_prefill_tokens = 512";
    let p = proxy(1, &disaggregated(&[url(&de)], &[url(&pe)], extra, ""));
    // About 2,000 prompt tokens: the first time, prefilled remotely.
    let r = send(&p, &original(8_000));
    assert_eq!(r.header("x-mock-prefill"), Some("remote"));
    assert_eq!(handoffs(&p, "remote"), 1.0);
    // The same prompt again: predicted cached where it decoded, so fewer than 512
    // uncached tokens, prefilled there (the mock's prefix cache holds it).
    let r = send(&p, &original(8_000));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-mock-prefill"), Some("local"));
    assert_eq!(handoffs(&p, "local"), 1.0);
    assert_eq!(handoffs(&p, "remote"), 1.0, "stage 1 ran once");
}
