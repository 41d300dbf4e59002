//! `/metrics`: Dynamo's names and labels, summed over cores, valid for `promtool`.

use std::time::Duration;

use spillway_testkit::*;

#[test]
fn exposition_has_dynamo_series_and_passes_promtool() {
    let ups = [echo_upstream("a"), echo_upstream("b")];
    let urls: Vec<_> = ups.iter().map(Upstream::url).collect();
    let p = proxy(
        2,
        &model("m", "active_prefill_tokens_threshold = 100", &urls),
    );
    for _ in 0..6 {
        assert_eq!(once(p.data_addr, &chat("m")).status, 200);
        assert_eq!(
            once(
                p.data_addr,
                &post("/v1/completions", r#"{"model":"m","stream":true}"#)
            )
            .status,
            200
        );
    }
    let push = format!(
        r#"[{{"worker_id":"{}","active_prefill_tokens":500}},{{"worker_id":"{}","active_prefill_tokens":500,"active_decode_blocks":7}}]"#,
        worker_name(&urls[0]),
        worker_name(&urls[1])
    );
    assert_eq!(admin_post(p.admin_addr, "/load", &push).status, 200);
    assert_eq!(once(p.data_addr, &chat("m")).status, 529);
    assert_eq!(once(p.data_addr, &chat("nope")).status, 404);

    let text = metrics(p.admin_addr);
    let ok = "dynamo_frontend_requests_total{model=\"m\",endpoint=\"chat_completions\",request_type=\"unary\",status=\"success\",error_type=\"\"}";
    assert_eq!(metric_value(&text, ok), Some(6.0), "{text}");
    let stream_ok = "dynamo_frontend_requests_total{model=\"m\",endpoint=\"completions\",request_type=\"stream\",status=\"success\",error_type=\"\"}";
    assert_eq!(metric_value(&text, stream_ok), Some(6.0));
    assert_eq!(
        metric_value(
            &text,
            "dynamo_frontend_model_rejection_total{model=\"m\",endpoint=\"chat_completions\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric_value(&text, "dynamo_frontend_inflight_requests{model=\"m\"}"),
        Some(0.0)
    );
    assert_eq!(
        metric_value(
            &text,
            "dynamo_frontend_time_to_first_token_seconds_count{model=\"m\"}"
        ),
        Some(12.0)
    );
    assert_eq!(
        metric_value(
            &text,
            "dynamo_frontend_request_duration_seconds_count{model=\"m\"}"
        ),
        Some(12.0)
    );
    assert!(
        text.contains(
            "dynamo_frontend_inter_token_latency_seconds_bucket{model=\"m\",le=\"+Inf\"}"
        )
    );
    let w1 = worker_name(&urls[1]);
    assert_eq!(
        metric_value(
            &text,
            &format!(
                "dynamo_frontend_worker_active_prefill_tokens{{worker_id=\"{w1}\",dp_rank=\"0\",worker_type=\"decode\"}}"
            )
        ),
        Some(500.0)
    );
    assert!(metric_value(&text, "spillway_busy_publish_total").unwrap() >= 1.0);
    assert_eq!(
        metric_value(&text, "spillway_busy_workers{model=\"m\"}"),
        Some(2.0)
    );
    assert_eq!(
        metric_value(&text, "spillway_connections_total"),
        Some(14.0 + 0.0)
    );
    let uring = metric_value(&text, "spillway_io_driver{driver=\"io_uring\"}").unwrap();
    let epoll = metric_value(&text, "spillway_io_driver{driver=\"epoll\"}").unwrap();
    assert_eq!(uring + epoll, 2.0);
    if std::env::var_os("MONOIO_FORCE_LEGACY_DRIVER").is_some() {
        assert_eq!(epoll, 2.0);
    }

    if let Some(problems) = promtool_problems(&text) {
        assert!(
            problems.is_empty(),
            "promtool check metrics failed:\n{}\n{text}",
            problems.join("\n")
        );
    }
}

/// The Dynamo frontend series beyond the first six: sequence lengths (input estimated as
/// the router does, output from `usage` or SSE events), predicted cached tokens (`kv`),
/// active, queued and per-stage requests; promtool-clean.
#[test]
fn dynamo_token_and_stage_series() {
    let unary = upstream(|_| {
        Reply::Raw(json_response(
            200,
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":150}}"#,
        ))
    });
    let sse = upstream(|_| {
        let mut raw = SSE_HEAD.as_bytes().to_vec();
        for _ in 0..5 {
            raw.extend(chunk("data: {\"choices\":[{\"text\":\"x\"}]}\n\n"));
        }
        raw.extend(chunk("data: [DONE]\n\n"));
        raw.extend(b"0\r\n\r\n");
        Reply::Raw(raw)
    });
    let toml = format!(
        "{}{}",
        model("u", "router_mode = \"kv\"", &[unary.url()]),
        model("s", "", &[sse.url()])
    );
    let p = proxy(2, &toml);
    let prompt = "x".repeat(800);
    let body = format!(r#"{{"model":"u","prompt":"{prompt}"}}"#);
    for _ in 0..2 {
        assert_eq!(
            once(p.data_addr, &post("/v1/completions", &body)).status,
            200
        );
    }
    let body = r#"{"model":"s","prompt":"hi","stream":true}"#;
    assert_eq!(
        once(p.data_addr, &post("/v1/completions", body)).status,
        200
    );

    // A request's gauges come down just after its last byte reaches the client.
    eventually(
        "the requests' gauges are back to 0",
        Duration::from_secs(5),
        || {
            let text = metrics(p.admin_addr);
            ["u", "s"].iter().all(|m| {
                let active = format!("dynamo_frontend_active_requests{{model=\"{m}\"}}");
                metric_value(&text, &active) == Some(0.0)
            })
        },
    );
    let text = metrics(p.admin_addr);
    let v = |s: &str| metric_value(&text, s);
    // 800 prompt bytes + quotes ≈ 201 tokens at 4 bytes a token: the 210 bucket.
    assert_eq!(
        v("dynamo_frontend_input_sequence_tokens_count{model=\"u\"}"),
        Some(2.0)
    );
    assert_eq!(
        v("dynamo_frontend_input_sequence_tokens_bucket{model=\"u\",le=\"100\"}"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        v("dynamo_frontend_input_sequence_tokens_bucket{model=\"u\",le=\"210\"}"),
        Some(2.0)
    );
    assert_eq!(
        v("dynamo_frontend_output_sequence_tokens_sum{model=\"u\"}"),
        Some(300.0)
    );
    // Five events and the `[DONE]` marker: five tokens.
    assert_eq!(
        v("dynamo_frontend_output_sequence_tokens_sum{model=\"s\"}"),
        Some(5.0)
    );
    assert_eq!(
        v("dynamo_frontend_cached_tokens_count{model=\"u\"}"),
        Some(2.0)
    );
    // The second identical prompt was predicted cached where the first went.
    assert!(v("dynamo_frontend_cached_tokens_sum{model=\"u\"}").unwrap() >= 192.0);
    assert_eq!(v("dynamo_frontend_cached_tokens_count{model=\"s\"}"), None);
    for m in ["u", "s"] {
        assert_eq!(
            v(&format!("dynamo_frontend_active_requests{{model=\"{m}\"}}")),
            Some(0.0)
        );
        assert_eq!(
            v(&format!(
                "dynamo_frontend_inflight_requests{{model=\"{m}\"}}"
            )),
            Some(0.0)
        );
        assert_eq!(
            v(&format!("dynamo_frontend_queued_requests{{model=\"{m}\"}}")),
            Some(0.0)
        );
    }
    // Dynamo's labels and stages: {stage, phase}, no model; `preprocess` has phase "".
    for (stage, phase) in [
        ("preprocess", ""),
        ("route", "aggregated"),
        ("dispatch", "aggregated"),
    ] {
        let s = format!("dynamo_frontend_stage_requests{{stage=\"{stage}\",phase=\"{phase}\"}}");
        assert_eq!(v(&s), Some(0.0), "{s}\n{text}");
    }
    let stage_series = text
        .lines()
        .filter(|l| l.starts_with("dynamo_frontend_stage_requests{"))
        .count();
    assert_eq!(stage_series, 3, "{text}");
    if let Some(problems) = promtool_problems(&text) {
        assert!(problems.is_empty(), "{}\n{text}", problems.join("\n"));
    }
}

/// A request held by its worker is in the `dispatch` stage and queued; one waiting at a
/// full admission gate is in `route`.
#[test]
fn stages_while_requests_wait() {
    let held = Held::new("h");
    let toml = format!(
        "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"{}\"\nengine_request_limit = 1\n",
        held.url()
    );
    let p = proxy(1, &toml);
    let a = spawn_request(p.data_addr, chat("m"));
    let b = spawn_request(p.data_addr, chat("m"));
    let stage = |s: &str| {
        let text = metrics(p.admin_addr);
        let series =
            format!("dynamo_frontend_stage_requests{{stage=\"{s}\",phase=\"aggregated\"}}");
        metric_value(&text, &series)
    };
    eventually(
        "one dispatched, one routing",
        Duration::from_secs(20),
        || stage("dispatch") == Some(1.0) && stage("route") == Some(1.0),
    );
    let text = metrics(p.admin_addr);
    assert_eq!(
        metric_value(&text, "dynamo_frontend_queued_requests{model=\"m\"}"),
        Some(2.0)
    );
    assert_eq!(
        metric_value(&text, "dynamo_frontend_active_requests{model=\"m\"}"),
        Some(2.0)
    );
    held.release(2);
    assert_eq!(a.join().unwrap().status, 200);
    assert_eq!(b.join().unwrap().status, 200);
    eventually("stages empty", Duration::from_secs(20), || {
        stage("dispatch") == Some(0.0) && stage("route") == Some(0.0)
    });
}
