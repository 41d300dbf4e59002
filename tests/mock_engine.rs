#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! The mock engine end to end: OpenAI shapes, SSE timing, queueing beyond the batch,
//! vLLM metrics read by Spillway's scraper, aborts freeing KV blocks, and load pushed to
//! a Spillway in front of it.

use spillway_testkit::*;
use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::Value;
use spillway_mock::{MockConfig, MockHandle, start};

fn mock(tune: impl FnOnce(&mut MockConfig)) -> MockHandle {
    let mut cfg = MockConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        model: "m".into(),
        decode_step_base_ms: 2.0,
        decode_step_per_seq_ms: 0.0,
        ..MockConfig::default()
    };
    tune(&mut cfg);
    start(cfg).expect("mock engine starts")
}

fn chat_body(extra: &str) -> String {
    format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"tell me about load shedding"}}]{extra}}}"#
    )
}

/// The JSON of every SSE event of a streamed response, `[DONE]` as `Value::Null`.
fn sse_events(r: &Response) -> Vec<Value> {
    r.pieces
        .iter()
        .map(|(_, piece)| {
            let text = std::str::from_utf8(piece).unwrap();
            let data = text
                .strip_prefix("data: ")
                .and_then(|t| t.strip_suffix("\n\n"))
                .unwrap_or_else(|| panic!("one event per chunk: {text:?}"));
            if data == "[DONE]" {
                Value::Null
            } else {
                serde_json::from_str(data).unwrap()
            }
        })
        .collect()
}

fn metric(addr: std::net::SocketAddr, name: &str) -> f64 {
    let text = once(addr, &get("/metrics")).text();
    metric_value(&text, &format!("{name}{{engine=\"0\",model_name=\"m\"}}"))
        .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
}

#[test]
fn non_streaming_responses_have_openai_shape_and_usage() {
    let m = mock(|_| {});
    let mut c = Client::connect(m.addr);
    let body = chat_body(r#","max_tokens":5"#);
    let r = c.request(&post("/v1/chat/completions", &body));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "m");
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(
        choice["message"]["content"]
            .as_str()
            .unwrap()
            .split(' ')
            .count(),
        5
    );
    assert_eq!(choice["finish_reason"], "length");
    // The messages value is 58 bytes: 14 prompt tokens at 4 bytes a token.
    assert_eq!(
        v["usage"],
        serde_json::json!({"prompt_tokens":14,"completion_tokens":5,"total_tokens":19})
    );

    // Same connection: completions, max_completion_tokens, then the default length.
    let r = c.request(&post(
        "/v1/completions",
        r#"{"model":"m","prompt":"0123456789abcdef","max_completion_tokens":3}"#,
    ));
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(
        v["choices"][0]["text"].as_str().unwrap().split(' ').count(),
        3
    );
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    let r = c.request(&post("/v1/completions", r#"{"prompt":"x"}"#));
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 128);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let r = c.request(&post(
        "/v1/chat/completions",
        &chat_body("").replace("\"m\"", "\"other\""),
    ));
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "NotFoundError");
    assert_eq!(r.json()["error"]["code"], 404);
    let r = c.request(&post(
        "/v1/chat/completions",
        r#"{"model":"m","max_tokens":0}"#,
    ));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "BadRequestError");
    assert_eq!(c.request(&get("/health")).status, 200);
    let models = c.request(&get("/v1/models")).json();
    assert_eq!(models["data"][0]["id"], "m");
    assert_eq!(c.request(&get("/v1/chat/completions")).status, 405);
    assert_eq!(c.request(&get("/nope")).status, 404);
}

#[test]
fn streamed_tokens_are_spaced_by_decode_steps_and_end_with_done() {
    const STEP: Duration = Duration::from_millis(25);
    let m = mock(|c| c.decode_step_base_ms = STEP.as_secs_f64() * 1000.0);
    let mut c = Client::connect(m.addr);
    let sent = Instant::now();
    let r = c.request(&post(
        "/v1/chat/completions",
        &chat_body(r#","stream":true,"max_tokens":6,"stream_options":{"include_usage":true}"#),
    ));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    let events = sse_events(&r);
    // Role, six tokens, usage, [DONE]: each its own chunk.
    assert_eq!(events.len(), 9, "{events:#?}");
    assert_eq!(
        events[0]["choices"][0]["delta"],
        serde_json::json!({"role":"assistant","content":""})
    );
    let id = events[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    let mut text = String::new();
    for (i, e) in events[1..7].iter().enumerate() {
        assert_eq!(e["id"], id);
        assert_eq!(e["object"], "chat.completion.chunk");
        assert_eq!(e["model"], "m");
        let choice = &e["choices"][0];
        text.push_str(choice["delta"]["content"].as_str().unwrap());
        let finish = if i == 5 { "length".into() } else { Value::Null };
        assert_eq!(choice["finish_reason"], finish, "{e}");
    }
    assert_eq!(text.split(' ').count(), 6, "{text}");
    assert_eq!(events[7]["choices"], serde_json::json!([]));
    assert_eq!(events[7]["usage"]["completion_tokens"], 6);
    assert_eq!(events[7]["usage"]["prompt_tokens"], 14);
    assert_eq!(events[8], Value::Null);

    // Six steps at least (the engine never runs ahead of its clock), and the tokens came
    // one step apart rather than in a burst.
    let done = r.pieces.last().unwrap().0;
    assert!(done.duration_since(sent) >= STEP * 6, "{:?}", done - sent);
    let mut gaps: Vec<_> = r.pieces[1..7]
        .windows(2)
        .map(|w| w[1].0.duration_since(w[0].0))
        .collect();
    gaps.sort();
    assert!(gaps[gaps.len() / 2] >= STEP / 2, "token gaps {gaps:?}");

    // Completions streams text_completion chunks, and the connection is reusable.
    let r = c.request(&post(
        "/v1/completions",
        r#"{"model":"m","prompt":"hi","stream":true,"max_tokens":2}"#,
    ));
    let events = sse_events(&r);
    assert_eq!(events.len(), 3, "{events:#?}");
    assert_eq!(events[0]["object"], "text_completion");
    assert!(events[0]["choices"][0]["text"].is_string());
    assert_eq!(events[1]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[2], Value::Null);
}

#[test]
fn requests_beyond_max_num_seqs_queue_and_wait_longer_for_their_first_token() {
    const STEP_MS: f64 = 20.0;
    const TOKENS: u32 = 15;
    let m = mock(|c| {
        c.max_num_seqs = 2;
        c.decode_step_base_ms = STEP_MS;
    });
    let addr = m.addr;
    let body = chat_body(&format!(r#","stream":true,"max_tokens":{TOKENS}"#));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let (barrier, body) = (barrier.clone(), body.clone());
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                barrier.wait();
                let sent = Instant::now();
                let r = c.request(&post("/v1/chat/completions", &body));
                assert_eq!(sse_events(&r).len(), TOKENS as usize + 2);
                r.pieces[0].0.duration_since(sent)
            })
        })
        .collect();
    // While they run: two in the batch, the rest queued.
    let mut saw_queue = false;
    let end = Instant::now() + Duration::from_secs(10);
    while !saw_queue && Instant::now() < end {
        let running = metric(addr, "vllm:num_requests_running");
        assert!(running <= 2.0, "running {running}");
        saw_queue = running == 2.0 && metric(addr, "vllm:num_requests_waiting") >= 1.0;
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(saw_queue, "never saw requests waiting behind a full batch");
    let mut ttft: Vec<Duration> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    ttft.sort();
    // Three waves: the last two wait for two full generations of the first ones.
    let one_generation = Duration::from_secs_f64(STEP_MS * f64::from(TOKENS) / 1000.0);
    assert!(
        ttft[4] >= ttft[1] + one_generation,
        "TTFT should grow with the queue: {ttft:?}"
    );
    assert!(ttft[5] >= one_generation * 2, "{ttft:?}");
}

#[test]
fn metrics_are_vllm_shaped_and_read_by_spillways_scraper() {
    let m = mock(|c| {
        c.kv_blocks = 1000;
        c.block_size = 32;
    });
    for _ in 0..3 {
        let r = once(
            m.addr,
            &post(
                "/v1/completions",
                r#"{"model":"m","prompt":"x","max_tokens":4}"#,
            ),
        );
        assert_eq!(r.status, 200);
    }
    let r = once(m.addr, &get("/metrics"));
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let text = r.text();
    assert!(
        text.contains("# TYPE vllm:kv_cache_usage_perc gauge\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE vllm:generation_tokens_total counter\n"),
        "{text}"
    );
    assert!(text.contains("block_size=\"32\""), "{text}");
    let series = |name: &str| format!("{name}{{engine=\"0\",model_name=\"m\"}}");
    assert_eq!(
        metric_value(&text, &series("vllm:generation_tokens_total")),
        Some(12.0)
    );
    assert_eq!(
        metric_value(&text, &series("vllm:prompt_tokens_total")),
        Some(3.0)
    );
    assert_eq!(
        metric_value(&text, &series("vllm:kv_cache_usage_perc")),
        Some(0.0)
    );

    // vLLM's names carry colons, which promtool's linter frowns on; nothing else may fail.
    if let Some(problems) = promtool_problems(&text) {
        let real: Vec<_> = problems
            .iter()
            .filter(|p| !p.ends_with("metric names should not contain ':'"))
            .collect();
        assert!(real.is_empty(), "promtool: {real:?}\n{text}");
    }

    let worker = spillway::Config::parse(
        "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
        &spillway::Overrides::default(),
    )
    .unwrap()
    .workers[0]
        .clone();
    let ranks =
        spillway::monitor::scrape::parse(spillway::config::MetricsFormat::Vllm, &text, &worker)
            .ranks;
    assert_eq!(
        ranks,
        [spillway::monitor::scrape::ScrapedRank {
            kv_used_blocks: Some(0),
            kv_total_blocks: Some(1000),
            running: Some(0),
            waiting: Some(0),
        }]
    );
}

/// Reads a stream until `n` events have arrived.
fn read_events(c: &mut Client, n: usize) {
    let mut seen = Vec::new();
    let mut tmp = [0u8; 4096];
    while seen.windows(5).filter(|w| w == b"data:").count() < n {
        let got = c.stream.read(&mut tmp).unwrap();
        assert!(got > 0, "stream ended early");
        seen.extend_from_slice(&tmp[..got]);
    }
}

#[test]
fn a_client_that_leaves_frees_its_blocks_at_once() {
    let m = mock(|c| {
        c.max_num_seqs = 1;
        c.decode_step_base_ms = 10.0;
    });
    let body = chat_body(r#","stream":true,"max_tokens":5000"#);
    let mut running = Client::connect(m.addr);
    running.send(&post("/v1/chat/completions", &body));
    read_events(&mut running, 3);
    let mut queued = Client::connect(m.addr);
    queued.send(&post("/v1/chat/completions", &body));
    eventually("second request queued", Duration::from_secs(5), || {
        metric(m.addr, "vllm:num_requests_waiting") == 1.0
    });
    assert_eq!(metric(m.addr, "vllm:num_requests_running"), 1.0);
    assert!(metric(m.addr, "vllm:kv_cache_usage_perc") > 0.0);

    // Leaving the queue: noticed through the socket, not a write.
    drop(queued);
    eventually("queued request aborted", Duration::from_secs(5), || {
        metric(m.addr, "vllm:num_requests_waiting") == 0.0
    });
    assert_eq!(metric(m.addr, "vllm:num_requests_running"), 1.0);
    // Leaving mid-stream frees the blocks.
    drop(running);
    eventually("blocks freed", Duration::from_secs(5), || {
        metric(m.addr, "vllm:kv_cache_usage_perc") == 0.0
            && metric(m.addr, "vllm:num_requests_running") == 0.0
    });
    // The engine still serves.
    let r = once(
        m.addr,
        &post("/v1/chat/completions", &chat_body(r#","max_tokens":2"#)),
    );
    assert_eq!(r.status, 200);
}

#[test]
fn serves_through_spillway_and_pushes_load_to_it() {
    let serving = mock(|_| {});
    let toml = format!(
        "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"{}\"\n",
        serving.url()
    );
    let p = proxy(1, &toml);
    let r = once(
        p.data_addr,
        &post("/v1/chat/completions", &chat_body(r#","max_tokens":3"#)),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
    let r = once(
        p.data_addr,
        &post(
            "/v1/chat/completions",
            &chat_body(r#","stream":true,"max_tokens":3"#),
        ),
    );
    assert_eq!(sse_events(&r).len(), 5);

    // The proxy's admin port is known only now, so a second mock pushes under the first
    // one's worker name (Spillway's default name for its URL: host:port).
    let name = serving.addr.to_string();
    let _pusher = mock(|c| {
        c.kv_blocks = 500;
        c.max_num_batched_tokens = 1024;
        c.push_load = Some(format!("http://{}", p.admin_addr));
        c.worker_name = Some(name.clone());
        c.push_interval_ms = 20;
    });
    eventually("load pushed", Duration::from_secs(10), || {
        let state = admin_get(p.admin_addr, "/load").json();
        let w = state["workers"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["worker_id"] == name.as_str()).cloned());
        w.is_some_and(|w| {
            !w["last_push_age_ms"].is_null()
                && w["ranks"][0]["kv_total_blocks"] == 500
                && w["ranks"][0]["max_num_batched_tokens"] == 1024
                && w["ranks"][0]["kv_used_blocks"] == 0
        })
    });
}

// Cross-checks of the mock's output against Spillway's own parsers (the mock crate does
// not depend on Spillway, so they live here).

/// The mock's `/metrics` text, label escaping included, is what Spillway's vLLM scrape reads.
#[test]
fn spillway_scrape_reads_the_mock_metrics() {
    use spillway_mock::sim::{EngineConfig, Load};
    let cfg = EngineConfig {
        kv_blocks: 2048,
        block_size: 16,
        max_num_seqs: 64,
        max_num_batched_tokens: 2048,
        prefill_tokens_per_s: 20_000.0,
        decode_step_base_ms: 8.0,
        decode_step_per_seq_ms: 0.25,
        enable_prefix_caching: false,
    };
    let load = Load {
        running: 5,
        waiting: 3,
        used_blocks: 517,
        prefill_tokens: 100,
        prompt_tokens_total: 1000,
        generation_tokens_total: 200,
        preemptions_total: 1,
        ..Load::default()
    };
    let mut text = String::new();
    spillway_mock::metrics::render(&mut text, "Qwen/\"odd\"", &cfg, &load);
    assert!(
        text.contains(
            "vllm:num_requests_running{engine=\"0\",model_name=\"Qwen/\\\"odd\\\"\"} 5.0\n"
        )
    );
    let worker = spillway::Config::parse(
        "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
        &spillway::Overrides::default(),
    )
    .unwrap()
    .workers[0]
        .clone();
    assert_eq!(
        spillway::monitor::scrape::parse(spillway::config::MetricsFormat::Vllm, &text, &worker)
            .ranks,
        [spillway::monitor::scrape::ScrapedRank {
            kv_used_blocks: Some(517),
            kv_total_blocks: Some(2048),
            running: Some(5),
            waiting: Some(3),
        }]
    );
}

/// A pushed load event, worker name escaping included, is what Spillway's `/load` accepts.
#[test]
fn spillway_accepts_the_mock_load_event() {
    use spillway_mock::sim::{EngineConfig, Load};
    let cfg = EngineConfig {
        kv_blocks: 100,
        block_size: 16,
        max_num_seqs: 8,
        max_num_batched_tokens: 512,
        prefill_tokens_per_s: 1.0,
        decode_step_base_ms: 1.0,
        decode_step_per_seq_ms: 0.0,
        enable_prefix_caching: false,
    };
    let load = Load {
        used_blocks: 7,
        prefill_tokens: 300,
        ..Load::default()
    };
    let mut out = String::new();
    spillway_mock::push::event(&mut out, "w\"1", &cfg, &load);
    let mut events = spillway::monitor::load::parse_events(out.as_bytes()).unwrap();
    assert_eq!(events.len(), 1, "one event");
    let e = events.remove(0);
    assert_eq!(e.worker_id.name(), "w\"1");
    assert_eq!(e.dp_rank, 0);
    assert_eq!(e.active_decode_blocks, Some(7));
    assert_eq!(e.kv_used_blocks, Some(7));
    assert_eq!(e.active_prefill_tokens, Some(300));
    assert_eq!(e.kv_total_blocks, Some(100));
    assert_eq!(e.max_num_batched_tokens, Some(512));
}

/// The mock's prompt estimate is Spillway's tracked-load estimate: bytes of the raw
/// `messages`, `prompt` and `input` values / 4, at least 1.
#[test]
fn prompt_estimate_matches_spillways_body_scanner() {
    use spillway_mock::openai::{Api, parse};
    let bodies = [
        r#"{"model":"m","messages":[{"role":"user","content":"tell me about load shedding"}]}"#,
        r#"{ "messages" : [ {"role":"user", "content":"spaced \"out\" \\ text"} ] , "model":"m" }"#,
        r#"{"prompt":"0123456789abcdef","max_tokens":3}"#,
        r#"{"prompt":["a","b"],"input":"cdefgh","stream":false}"#,
        r#"{"pr\u006fmpt":"escaped key","messages":"caf\u00e9 \ud83d\ude00"}"#,
        r#"{"messages":[],"messages":[1,2,3]}"#,
        r#"{"prompt":{"nested":{"model":"not the model"}},"model":"m"}"#,
        r#"{"max_tokens":1}"#,
        r#"{}"#,
    ];
    for body in bodies {
        let peeked = spillway::route::peek::peek(body.as_bytes()).unwrap();
        let want = u32::try_from((peeked.prompt_bytes / 4).max(1)).unwrap();
        let got = parse(Api::Chat, body.as_bytes(), "m", 16).unwrap();
        assert_eq!(got.prompt_tokens, want, "{body}");
    }
}
