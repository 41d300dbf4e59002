//! `/busy_threshold`: get, partial set, unset, every error case, and a change that holds
//! for the very next request on every core.

use spillway_testkit::*;

fn setup() -> (Upstream, ServerHandle) {
    let up = echo_upstream("a");
    let p = proxy(
        2,
        &format!(
            "[[models]]\nname = \"m\"\nactive_prefill_tokens_threshold = 5000\n[[models.workers]]\nurl = \"{u}\"\nname = \"a\"\nkv_total_blocks = 100\nload_sources = [\"push\"]\n\
         [[models]]\nname = \"other\"\n[[models.workers]]\nurl = \"{u}\"\nname = \"a\"\nkv_total_blocks = 100\nload_sources = [\"push\"]\n",
            u = up.url()
        ),
    );
    (up, p)
}

fn set(p: &ServerHandle, body: &str) -> Response {
    admin_post(p.admin_addr, "/busy_threshold", body)
}

#[test]
fn get_set_partial_merge_and_delete() {
    let (_up, p) = setup();
    let r = admin_get(p.admin_addr, "/busy_threshold");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        r#"{"thresholds":[{"model":"m","active_decode_blocks_threshold":null,"active_prefill_tokens_threshold":5000,"active_prefill_tokens_threshold_frac":null},{"model":"other","active_decode_blocks_threshold":null,"active_prefill_tokens_threshold":null,"active_prefill_tokens_threshold_frac":null}]}"#
    );
    let r = set(&p, r#"{"model":"m","active_decode_blocks_threshold":0.85}"#);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        r#"{"model":"m","active_decode_blocks_threshold":0.85,"active_prefill_tokens_threshold":5000,"active_prefill_tokens_threshold_frac":null}"#
    );
    // Absent and null fields keep their values.
    let r = set(
        &p,
        r#"{"model":"m","active_decode_blocks_threshold":null,"active_prefill_tokens_threshold_frac":1.5}"#,
    );
    assert_eq!(r.json()["active_decode_blocks_threshold"], 0.85);
    assert_eq!(r.json()["active_prefill_tokens_threshold"], 5000);
    assert_eq!(r.json()["active_prefill_tokens_threshold_frac"], 1.5);
    // No threshold in the body: a get.
    let r = set(&p, r#"{"model":"m"}"#);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["active_prefill_tokens_threshold_frac"], 1.5);
    // A get for an unknown model reads as unset.
    let r = set(&p, r#"{"model":"ghost"}"#);
    assert_eq!(r.status, 200);
    assert!(r.json()["active_decode_blocks_threshold"].is_null());
    // DELETE unsets all three.
    let r = admin_call(
        p.admin_addr,
        "DELETE",
        "/busy_threshold",
        Some("application/json"),
        r#"{"model":"m"}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        r#"{"model":"m","active_decode_blocks_threshold":null,"active_prefill_tokens_threshold":null,"active_prefill_tokens_threshold_frac":null}"#
    );
    let r = admin_get(p.admin_addr, "/busy_threshold");
    assert!(r.json()["thresholds"][0]["active_prefill_tokens_threshold"].is_null());
}

#[test]
fn every_error_case() {
    let (_up, p) = setup();
    let big = "x".repeat(16);
    /// (method, content type, body, status, exact error message)
    type Case = (
        &'static str,
        Option<&'static str>,
        String,
        u16,
        Option<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "POST",
            Some("text/plain"),
            r#"{"model":"m"}"#.into(),
            415,
            Some("Expected request with Content-Type application/json"),
        ),
        (
            "POST",
            None,
            r#"{"model":"m"}"#.into(),
            415,
            Some("Expected request with Content-Type application/json"),
        ),
        (
            "POST",
            Some("application/json"),
            "{not json".into(),
            400,
            None,
        ),
        (
            "POST",
            Some("application/json"),
            r#"{"model":"m","active_decode_blocks_threshold":1.5}"#.into(),
            400,
            Some("active_decode_blocks_threshold must be between 0.0 and 1.0, got 1.5"),
        ),
        (
            "POST",
            Some("application/json"),
            r#"{"model":"m","active_decode_blocks_threshold":-0.1}"#.into(),
            400,
            Some("active_decode_blocks_threshold must be between 0.0 and 1.0, got -0.1"),
        ),
        (
            "POST",
            Some("application/json"),
            r#"{"model":"m","active_prefill_tokens_threshold_frac":-1.0}"#.into(),
            400,
            Some(
                "active_prefill_tokens_threshold_frac must be a finite value greater than or equal to 0.0, got -1",
            ),
        ),
        (
            "POST",
            Some("application/json"),
            r#"{"model":"m","active_prefill_tokens_threshold":-5}"#.into(),
            422,
            None,
        ),
        (
            "POST",
            Some("application/json"),
            r#"{"model":"m","active_prefill_tokens_threshold":2.5}"#.into(),
            422,
            None,
        ),
        (
            "POST",
            Some("application/json"),
            r#"{"model":"m","active_decode_blocks_threshold":"high"}"#.into(),
            422,
            None,
        ),
        (
            "POST",
            Some("application/json"),
            r#"{"active_decode_blocks_threshold":0.5}"#.into(),
            422,
            None,
        ),
        (
            "POST",
            Some("application/json"),
            format!(r#"{{"model":"m","typo_threshold":"{big}"}}"#),
            422,
            None,
        ),
        (
            "POST",
            Some("application/json"),
            r#"{"model":"ghost","active_decode_blocks_threshold":0.5}"#.into(),
            404,
            Some("Model 'ghost' not found. Thresholds can only be set for discovered models."),
        ),
        (
            "DELETE",
            Some("application/json"),
            r#"{"model":"ghost"}"#.into(),
            404,
            Some("Model 'ghost' not found. Thresholds can only be set for discovered models."),
        ),
        (
            "PUT",
            Some("application/json"),
            r#"{"model":"m"}"#.into(),
            405,
            None,
        ),
    ];
    for (method, ct, body, status, message) in cases {
        let r = admin_call(p.admin_addr, method, "/busy_threshold", ct, &body);
        assert_eq!(r.status, status, "{method} {ct:?} {body}: {}", r.text());
        let err = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(!err.is_empty(), "{body}");
        if let Some(m) = message {
            assert_eq!(err, m, "{body}");
        }
        if status == 400 && message.is_none() || status == 422 {
            assert!(
                err.starts_with("Failed to parse the request body as JSON"),
                "{err}"
            );
        }
    }
    // Over the body limit: refused from the Content-Length alone.
    let mut c = Client::connect(p.admin_addr);
    let r = c.request(b"POST /busy_threshold HTTP/1.1\r\nhost: a\r\ncontent-type: application/json\r\ncontent-length: 99999999\r\n\r\n");
    assert_eq!(r.status, 413);
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("Request body exceeds the limit of")
    );
    // Nothing changed.
    let r = admin_get(p.admin_addr, "/busy_threshold");
    assert_eq!(
        r.json()["thresholds"][0]["active_prefill_tokens_threshold"],
        5000
    );
    assert!(r.json()["thresholds"][0]["active_decode_blocks_threshold"].is_null());
}

#[test]
fn a_change_holds_for_the_very_next_request_on_every_core() {
    let (up, p) = setup();
    let r = admin_post(
        p.admin_addr,
        "/load",
        r#"{"worker_id":"a","kv_used_blocks":90,"active_prefill_tokens":10}"#,
    );
    assert_eq!(r.status, 200);
    // Prefill is under 5000 and no decode threshold: free.
    assert_eq!(once(p.data_addr, &chat("m")).status, 200);
    assert_eq!(
        set(&p, r#"{"model":"m","active_decode_blocks_threshold":0.5}"#).status,
        200
    );
    for _ in 0..10 {
        assert_eq!(once(p.data_addr, &chat("m")).status, 529);
    }
    // The other model shares the worker but has no threshold: unaffected.
    assert_eq!(once(p.data_addr, &chat("other")).status, 200);
    let r = admin_call(
        p.admin_addr,
        "DELETE",
        "/busy_threshold",
        Some("application/json"),
        r#"{"model":"m"}"#,
    );
    assert_eq!(r.status, 200);
    for _ in 0..10 {
        assert_eq!(once(p.data_addr, &chat("m")).status, 200);
    }
    assert_eq!(up.count(), 12);
}
