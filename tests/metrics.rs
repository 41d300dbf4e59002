//! `/metrics`: Dynamo's names and labels, summed over cores, valid for `promtool`.

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
