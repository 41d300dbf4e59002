use super::*;
use serde_json::{Value, json};

fn parsed(out: &[u8]) -> Value {
    serde_json::from_slice(out).unwrap_or_else(|e| {
        panic!("not JSON ({e}): {}", String::from_utf8_lossy(out));
    })
}

#[test]
fn vllm_prefill_bodies() {
    let params = json!({"do_remote_decode": true, "do_remote_prefill": false,
        "remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
        "remote_port": null});
    // (body, the prefill body's members)
    let cases: &[(&str, Value)] = &[
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":200}"#,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "stream": false, "max_tokens": 1, "kv_transfer_params": params}),
        ),
        (
            r#" { "model" : "m" , "prompt" : "a \"stream\": true" , "max_completion_tokens" : 9 } "#,
            json!({"model": "m", "prompt": "a \"stream\": true", "stream": false,
                "max_tokens": 1, "max_completion_tokens": 1, "kv_transfer_params": params}),
        ),
        // Escaped key spellings and repeated keys are left out as the engine reads them.
        (
            r#"{"model":"m","prompt":"p","str\u0065am":true,"stream":true,"kv_transfer_params":{"x":1}}"#,
            json!({"model": "m", "prompt": "p", "stream": false, "max_tokens": 1,
                "kv_transfer_params": params}),
        ),
        (
            r#"{}"#,
            json!({"stream": false, "max_tokens": 1, "kv_transfer_params": params}),
        ),
        (
            r#"{"model":"m","temperature":0.5,"nested":{"stream":true,"max_tokens":7}}"#,
            json!({"model": "m", "temperature": 0.5, "nested": {"stream": true, "max_tokens": 7},
                "stream": false, "max_tokens": 1, "kv_transfer_params": params}),
        ),
    ];
    let mut out = Vec::new();
    for (body, want) in cases {
        vllm_prefill(body.as_bytes(), &mut out).unwrap();
        assert_eq!(&parsed(&out), want, "{body}");
    }
}

#[test]
fn other_members_are_copied_byte_for_byte() {
    let body = br#"{"model":"m","messages":[{"role":"user","content":"caf\u00e9  \n"}],"seed":7}"#;
    let mut out = Vec::new();
    vllm_prefill(body, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.starts_with(r#"{"model":"m","messages":[{"role":"user","content":"caf\u00e9  \n"}],"seed":7,"stream":false"#),
        "{text}"
    );
}

#[test]
fn vllm_decode_splices_the_prefill_responses_params() {
    let response = br#"{"id":"c1","choices":[{"text":"x"}],"kv_transfer_params": {"do_remote_prefill":true,"remote_block_ids":[1,2,3],"remote_engine_id":"e","remote_host":"10.0.0.1","remote_port":5600} ,"usage":{}}"#;
    let (a, b) = kv_transfer_params(response).unwrap().unwrap();
    let params = &response[a..b];
    assert!(params.starts_with(b"{\"do_remote_prefill\"") && params.ends_with(b"5600}"));
    let body = br#"{"model":"m","prompt":"p","stream":true,"kv_transfer_params":{"old":1}}"#;
    let mut out = Vec::new();
    vllm_decode(body, params, &mut out).unwrap();
    let text = String::from_utf8(out.clone()).unwrap();
    assert!(text.ends_with(r#","kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2,3],"remote_engine_id":"e","remote_host":"10.0.0.1","remote_port":5600}}"#), "{text}");
    let v = parsed(&out);
    assert_eq!(v["stream"], true, "the client's request otherwise as sent");
    assert_eq!(
        v["kv_transfer_params"]["remote_block_ids"],
        json!([1, 2, 3])
    );
    for none in [&br#"{"id":"c"}"#[..], br#"{"kv_transfer_params":null}"#] {
        assert_eq!(kv_transfer_params(none).unwrap(), None);
    }
}

#[test]
fn sglang_adds_the_bootstrap_fields() {
    let body = br#"{"model":"m","prompt":"p","bootstrap_room":1,"stream":true}"#;
    let at = Bootstrap {
        host: "10.0.0.7",
        port: 8998,
        room: u64::MAX,
    };
    let mut out = Vec::new();
    sglang(body, at, &mut out).unwrap();
    assert_eq!(
        parsed(&out),
        json!({"model": "m", "prompt": "p", "stream": true, "bootstrap_host": "10.0.0.7",
            "bootstrap_port": 8998, "bootstrap_room": u64::MAX >> 1})
    );
    let odd = Bootstrap {
        host: "a\"b\\c\n",
        port: 1,
        room: 5,
    };
    sglang(b"{}", odd, &mut out).unwrap();
    assert_eq!(parsed(&out)["bootstrap_host"], "a\"b\\c");
}

#[test]
fn malformed_bodies_are_refused_and_buffers_are_reused() {
    let mut out = Vec::with_capacity(4096);
    for bad in [&b"[1]"[..], b"{\"a\":}", b"{\"a\":1", b"{\"a\":1} x", b""] {
        assert!(vllm_prefill(bad, &mut out).is_err());
        assert!(vllm_decode(bad, b"{}", &mut out).is_err());
        assert!(kv_transfer_params(bad).is_err());
    }
    let at = out.as_ptr();
    let body = br#"{"model":"m","prompt":"p"}"#;
    for _ in 0..3 {
        vllm_prefill(body, &mut out).unwrap();
        vllm_decode(body, b"{}", &mut out).unwrap();
    }
    assert_eq!(
        out.as_ptr(),
        at,
        "a buffer large enough is reused, not reallocated"
    );
}
