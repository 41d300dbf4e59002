#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]
//! Prefill/decode disaggregation over raw TCP: vLLM's two stages across a prefill and a
//! decode engine (a real handoff, a tampered one that falls back), SGLang's bootstrap
//! fields, role `both`, and `GET /last_request`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spillway_mock::{Fault, MockConfig, MockHandle, Role, start};

fn mock(role: Role) -> MockHandle {
    mock_with(MockConfig {
        role,
        ..MockConfig::default()
    })
}

fn mock_with(cfg: MockConfig) -> MockHandle {
    start(MockConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        model: "m".into(),
        decode_step_base_ms: 1.0,
        decode_step_per_seq_ms: 0.0,
        ..cfg
    })
    .unwrap()
}

/// A response read to the close: status, head fields (names lowercase), the body with
/// chunks joined, and when its first byte after the head arrived.
struct Response {
    status: u16,
    head: Vec<(String, String)>,
    body: String,
    first_byte: Duration,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.head
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> Response {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: m\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let sent = Instant::now();
    s.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let mut first_byte = None;
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n");
        if first_byte.is_none() && head_end.is_some_and(|h| raw.len() > h + 4) {
            first_byte = Some(sent.elapsed());
        }
    }
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let head: Vec<(String, String)> = lines
        .map(|l| {
            let (n, v) = l.split_once(": ").unwrap();
            (n.to_ascii_lowercase(), v.to_string())
        })
        .collect();
    let chunked = head
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v == "chunked");
    Response {
        status,
        body: if chunked {
            dechunk(body)
        } else {
            body.to_string()
        },
        head,
        first_byte: first_byte.unwrap_or_default(),
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size, 16).unwrap();
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

fn post(addr: SocketAddr, body: &Value) -> Response {
    send(addr, "POST", "/v1/chat/completions", &body.to_string())
}

fn metric(addr: SocketAddr, series: &str) -> f64 {
    let text = send(addr, "GET", "/metrics", "").body;
    let line = text
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("{series} missing: {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

const VLLM_RECEIVED: &str = r#"mock_kv_transfers_total{protocol="vllm",outcome="received"}"#;
const VLLM_FALLBACK: &str = r#"mock_kv_transfers_total{protocol="vllm",outcome="fallback"}"#;
const SGLANG_RECEIVED: &str = r#"mock_kv_transfers_total{protocol="sglang",outcome="received"}"#;

/// A streamed chat request with `bytes` bytes of prompt.
fn original(bytes: usize) -> Value {
    let content = "0123456789".repeat(bytes / 10);
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// vLLM's stage 1: the request made non-streaming, one token, asking for a remote decode.
fn stage_1(original: &Value) -> Value {
    let mut r = original.clone();
    let o = r.as_object_mut().unwrap();
    o.insert("stream".into(), json!(false));
    o.insert("max_tokens".into(), json!(1));
    o.remove("stream_options");
    o.insert(
        "kv_transfer_params".into(),
        json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
               "remote_block_ids": null, "remote_host": null, "remote_port": null}),
    );
    r
}

/// vLLM's stage 2: the original request with the prefill's `kv_transfer_params`.
fn stage_2(original: &Value, params: &Value) -> Value {
    let mut r = original.clone();
    r["kv_transfer_params"] = params.clone();
    r
}

#[test]
fn a_vllm_handoff_skips_the_decode_engines_prefill() {
    let (p, d) = (mock(Role::Prefill), mock(Role::Decode));
    // 40,000 bytes of content: about 10,000 prompt tokens, half a second of prefill.
    let request = original(40_000);
    let first = stage_1(&request);
    let r = post(p.addr, &first);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-mock-prefill"), Some("local"));
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 1);
    let params = v["kv_transfer_params"].clone();
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        params["remote_block_ids"].as_array().unwrap().len() as u64,
        prompt_tokens.div_ceil(16)
    );
    assert_eq!(params["do_remote_prefill"], true);
    assert_eq!(params["do_remote_decode"], false);
    assert_eq!(params["remote_host"], "127.0.0.1");
    assert_eq!(params["remote_port"], p.addr.port());
    assert_eq!(params["tp_size"], 1);
    assert!(
        params["remote_engine_id"]
            .as_str()
            .unwrap()
            .starts_with("mock-")
    );
    assert_eq!(
        metric(p.addr, r#"mock_remote_prefills_total{protocol="vllm"}"#),
        1.0
    );
    // The prefill engine saw exactly what was sent.
    assert_eq!(send(p.addr, "GET", "/last_request", "").json(), first);

    let second = stage_2(&request, &params);
    let remote = post(d.addr, &second);
    assert_eq!(remote.status, 200, "{}", remote.body);
    assert_eq!(remote.header("x-mock-prefill"), Some("remote"));
    assert!(remote.body.ends_with("data: [DONE]\n\n"), "{}", remote.body);
    assert_eq!(remote.body.matches("\"delta\":{\"content\"").count(), 4);
    assert_eq!(metric(d.addr, VLLM_RECEIVED), 1.0);
    assert_eq!(metric(d.addr, VLLM_FALLBACK), 0.0);
    assert_eq!(send(d.addr, "GET", "/last_request", "").json(), second);

    // The same request prefilled on the decode engine itself waits for its prefill.
    let local = post(d.addr, &request);
    assert_eq!(local.header("x-mock-prefill"), Some("local"));
    // The schedule is on a virtual clock: local's first token is never before its ~500 ms
    // of prefill, remote's is due ~20 ms after arrival; only a stall of the mock's
    // thread of several hundred ms could delay it past local's.
    assert!(
        remote.first_byte < local.first_byte,
        "remote TTFT {:?}, local {:?}",
        remote.first_byte,
        local.first_byte
    );
    assert!(
        local.first_byte >= Duration::from_millis(400),
        "{:?}",
        local.first_byte
    );
    assert_eq!(metric(d.addr, VLLM_RECEIVED), 1.0);
}

#[test]
fn transfer_params_that_do_not_check_out_fall_back_to_local_prefill() {
    let (p, d) = (mock(Role::Prefill), mock(Role::Decode));
    let request = original(400);
    let params = post(p.addr, &stage_1(&request)).json()["kv_transfer_params"].clone();
    let mut tampered = params.clone();
    tampered["remote_block_ids"][0] = json!(tampered["remote_block_ids"][0].as_u64().unwrap() ^ 1);
    let r = post(d.addr, &stage_2(&request, &tampered));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-mock-prefill"), Some("local"));
    // Another prompt under the same params falls back too.
    let r = post(d.addr, &stage_2(&original(800), &params));
    assert_eq!(r.header("x-mock-prefill"), Some("local"));
    assert_eq!(metric(d.addr, VLLM_FALLBACK), 2.0);
    assert_eq!(metric(d.addr, VLLM_RECEIVED), 0.0);
    // The real params still work.
    let r = post(d.addr, &stage_2(&request, &params));
    assert_eq!(r.header("x-mock-prefill"), Some("remote"));
    assert_eq!(metric(d.addr, VLLM_RECEIVED), 1.0);

    // Each stage sent to the wrong role is refused, naming the field.
    let r = post(d.addr, &stage_1(&request));
    assert_eq!(r.status, 400);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("do_remote_decode"), "{message}");
    let r = post(p.addr, &stage_2(&request, &params));
    assert_eq!(r.status, 400);
    assert!(r.body.contains("do_remote_prefill"), "{}", r.body);
}

fn with_bootstrap(mut r: Value, room: Value) -> Value {
    r["bootstrap_host"] = json!("127.0.0.1");
    r["bootstrap_port"] = json!(8998);
    r["bootstrap_room"] = room;
    r
}

#[test]
fn sglang_bootstrap_fields_hand_off_to_the_decode_engine() {
    let (p, d) = (mock(Role::Prefill), mock(Role::Decode));
    let request = with_bootstrap(original(4_000), json!((1u64 << 63) - 1));
    let r = post(d.addr, &request);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-mock-prefill"), Some("remote"));
    assert_eq!(metric(d.addr, SGLANG_RECEIVED), 1.0);
    // The prefill engine stops at the first token.
    let r = post(p.addr, &request);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-mock-prefill"), Some("local"));
    assert_eq!(r.body.matches("\"delta\":{\"content\"").count(), 1);
    assert_eq!(
        metric(p.addr, r#"mock_remote_prefills_total{protocol="sglang"}"#),
        1.0
    );

    for room in [json!(-1), json!(1u64 << 63), json!("7"), json!(1.5)] {
        for engine in [&d, &p] {
            let r = post(engine.addr, &with_bootstrap(original(40), room.clone()));
            assert_eq!(r.status, 400, "{room}: {}", r.body);
            assert_eq!(r.json()["error"]["type"], "BadRequestError");
            assert!(r.body.contains("bootstrap_room"), "{}", r.body);
        }
    }
    let mut other_port = request.clone();
    other_port["bootstrap_port"] = json!(9000);
    assert_eq!(
        post(p.addr, &other_port).status,
        400,
        "not this prefill engine's"
    );
    assert_eq!(metric(d.addr, SGLANG_RECEIVED), 1.0);
}

#[test]
fn role_both_serves_whole_requests_and_both_vllm_stages() {
    let m = mock(Role::Both);
    let request = original(400);
    let r = post(m.addr, &request);
    assert_eq!((r.status, r.header("x-mock-prefill")), (200, Some("local")));
    // SGLang's fields are ignored, malformed or not.
    let r = post(
        m.addr,
        &with_bootstrap(request.clone(), json!("not a room")),
    );
    assert_eq!((r.status, r.header("x-mock-prefill")), (200, Some("local")));
    assert_eq!(r.body.matches("\"delta\":{\"content\"").count(), 4);
    // vLLM's stages both work on one engine.
    let params = post(m.addr, &stage_1(&request)).json()["kv_transfer_params"].clone();
    let r = post(m.addr, &stage_2(&request, &params));
    assert_eq!(
        (r.status, r.header("x-mock-prefill")),
        (200, Some("remote"))
    );
    assert_eq!(metric(m.addr, VLLM_RECEIVED), 1.0);
    assert_eq!(metric(m.addr, SGLANG_RECEIVED), 0.0);
    assert_eq!(
        metric(m.addr, r#"mock_remote_prefills_total{protocol="vllm"}"#),
        1.0
    );
    let info = send(m.addr, "GET", "/metrics", "").body;
    assert!(info.contains("mock_disagg_info{role=\"both\","), "{info}");
}

#[test]
fn the_last_request_is_answered_in_every_fault_mode() {
    let m = mock_with(MockConfig {
        fault: Fault::Hang,
        ..MockConfig::default()
    });
    assert_eq!(send(m.addr, "GET", "/last_request", "").body, "");
    // A hung engine reads the request and never answers it.
    let body = r#"{"prompt":"x","kv_transfer_params":{"do_remote_decode":true}}"#;
    let mut hung = TcpStream::connect(m.addr).unwrap();
    write!(
        hung,
        "POST /v1/completions HTTP/1.1\r\nhost: m\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = send(m.addr, "GET", "/last_request", "");
        assert_eq!(r.status, 200);
        if r.body == body {
            break;
        }
        assert!(Instant::now() < deadline, "never recorded: {:?}", r.body);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(send(m.addr, "POST", "/last_request", "").status, 405);
}
