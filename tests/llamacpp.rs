#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! Spillway in front of llama.cpp's own server (`llama-server`, built by
//! tests/llamacpp/build.sh) serving a tiny model with random weights
//! (tests/llamacpp/tiny_gguf.py): both OpenAI endpoints streamed and whole, back-to-back
//! streams over engine connections that llama-server closes after every stream, the engine
//! killed mid-stream and restarted, a client leaving mid-stream, worker admission in front
//! of it, and the official OpenAI Python client. Each test is skipped where llama-server
//! or the `gguf` package is missing, and fails instead under CI (testkit/src/llamacpp.rs).
//!
//! llama-server runs with `--ignore-eos`, so a request for N tokens gets exactly N.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use spillway_testkit::llamacpp::{Extra, MODEL, setup};
use spillway_testkit::*;

/// A `/v1/completions` request for `tokens` tokens.
fn completion(tokens: u32, stream: bool) -> Vec<u8> {
    post(
        "/v1/completions",
        &format!(
            r#"{{"model":"{MODEL}","prompt":"once upon a time","max_tokens":{tokens},"stream":{stream}}}"#
        ),
    )
}

/// A `/v1/chat/completions` request for `tokens` tokens; streamed, it asks for usage.
fn chat_for(tokens: u32, stream: bool) -> Vec<u8> {
    let usage = if stream {
        r#","stream_options":{"include_usage":true}"#
    } else {
        ""
    };
    post(
        "/v1/chat/completions",
        &format!(
            r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"hello world"}}],"max_tokens":{tokens},"stream":{stream}{usage}}}"#
        ),
    )
}

/// The JSON events of a whole SSE body, checked: each event one `data: ` line and a
/// blank line, the last one `data: [DONE]`, the others JSON objects.
fn sse_events(body: &[u8]) -> Result<Vec<Value>, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("not UTF-8: {e}"))?;
    let events = text
        .strip_suffix("\n\n")
        .ok_or_else(|| format!("does not end with a blank line: {text:?}"))?;
    let mut out = Vec::new();
    let mut done = false;
    for event in events.split("\n\n") {
        let data = event
            .strip_prefix("data: ")
            .filter(|d| !d.contains('\n') && !done)
            .ok_or_else(|| format!("not one data line, or after [DONE]: {event:?}"))?;
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let value: Value =
            serde_json::from_str(data).map_err(|e| format!("{e}: an event {data:?}"))?;
        if !value.is_object() {
            return Err(format!("an event that is no object: {data}"));
        }
        out.push(value);
    }
    if !done {
        return Err(format!("no data: [DONE]: {text}"));
    }
    Ok(out)
}

/// A streamed answer: 200, `text/event-stream`, well-formed events, one with
/// `finish_reason` `length`, and `tokens` completion tokens in the usage.
fn check_stream(r: &Response, tokens: u32) -> Result<(), String> {
    if r.status != 200
        || !r
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/event-stream"))
    {
        return Err(format!("{} {:?}: {}", r.status, r.headers, r.text()));
    }
    let events = sse_events(&r.body)?;
    let finished = events
        .iter()
        .any(|e| e["choices"][0]["finish_reason"] == "length");
    let usage = events.iter().rev().find_map(|e| e.get("usage"));
    if !finished || usage.is_none_or(|u| u["completion_tokens"] != tokens) {
        return Err(format!(
            "no finish_reason length, or not {tokens} tokens in the usage: {}",
            r.text()
        ));
    }
    Ok(())
}

/// A whole answer: 200, a JSON `object`, `finish_reason` `length` and `tokens`
/// completion tokens.
fn check_whole(r: &Response, object: &str, tokens: u32) -> Result<(), String> {
    if r.status != 200 {
        return Err(format!("{} {:?}: {}", r.status, r.headers, r.text()));
    }
    let v: Value = serde_json::from_slice(&r.body).map_err(|e| format!("{e}: {}", r.text()))?;
    let usage = &v["usage"];
    let ok = v["object"] == object
        && v["choices"][0]["finish_reason"] == "length"
        && usage["completion_tokens"] == tokens
        && usage["total_tokens"].as_u64()
            == usage["prompt_tokens"]
                .as_u64()
                .map(|p| p + u64::from(tokens));
    if !ok {
        return Err(format!("not a {object} of {tokens} tokens: {v}"));
    }
    Ok(())
}

/// Both OpenAI endpoints through Spillway, streamed and whole, on one client connection:
/// 200, well-formed JSON or SSE events ending in `data: [DONE]`, and exactly the requested
/// number of tokens in `usage`.
#[test]
fn chat_and_completions_through_spillway_streamed_and_whole() {
    let extra = Extra {
        worker: "engine_request_limit = 2",
        ..Extra::default()
    };
    let Some(s) = setup(2, 2048, 1, extra) else {
        return;
    };
    let mut c = Client::connect(s.proxy.data_addr);
    check_whole(&c.request(&chat_for(7, false)), "chat.completion", 7).unwrap();
    check_stream(&c.request(&chat_for(9, true)), 9).unwrap();
    check_whole(&c.request(&completion(7, false)), "text_completion", 7).unwrap();
    check_stream(&c.request(&completion(9, true)), 9).unwrap();
    counters_back_to_zero(s.proxy.admin_addr, MODEL, &s.worker);
}

/// `n` requests one after another on one keep-alive client connection: streams of both
/// endpoints, every fifth a whole answer (which leaves llama-server's connection open,
/// where a stream's is closed). The failures, described; a failed connection is replaced.
fn run_sequence(addr: SocketAddr, client: usize, n: usize) -> Vec<String> {
    let mut c = Client::connect(addr);
    let mut failures = Vec::new();
    for i in 0..n {
        let outcome = catch_unwind(AssertUnwindSafe(|| match i % 5 {
            4 => check_whole(&c.request(&completion(3, false)), "text_completion", 3),
            k if k % 2 == 0 => check_stream(&c.request(&chat_for(4, true)), 4),
            _ => check_stream(&c.request(&completion(4, true)), 4),
        }));
        let why = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(why)) => why,
            Err(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        };
        failures.push(format!("client {client}, request {i}: {why}"));
        c = Client::connect(addr);
    }
    failures
}

/// llama-server closes its connection right after every streamed response without
/// saying so (no `Connection: close`); Spillway's pool must never hand such a connection
/// to the next request (issue 26). Twenty requests back to back on one client
/// connection, then four clients with twenty each at once over two cores: not one fails.
#[test]
fn back_to_back_streams_on_one_connection_and_across_clients() {
    // As many engine slots as llama-server has: the gate is on the path, never full.
    let extra = Extra {
        worker: "engine_request_limit = 4",
        ..Extra::default()
    };
    let Some(s) = setup(4, 2048, 2, extra) else {
        return;
    };
    let addr = s.proxy.data_addr;
    let mut failures = run_sequence(addr, 0, 20);
    let clients: Vec<_> = (1..=4)
        .map(|i| std::thread::spawn(move || run_sequence(addr, i, 20)))
        .collect();
    for c in clients {
        failures.extend(c.join().unwrap());
    }
    let m = metrics(s.proxy.admin_addr);
    assert!(
        failures.is_empty(),
        "{} of 100 requests failed (reuse retries {:?}, idle closes {:?}):\n{}",
        failures.len(),
        metric_value(&m, "spillway_upstream_reuse_retries_total"),
        metric_value(&m, "spillway_upstream_idle_closed_total"),
        failures.join("\n")
    );
    counters_back_to_zero(s.proxy.admin_addr, MODEL, &s.worker);
}

/// Reads from `stream` until `enough` holds for what arrived (as text); panics if the
/// stream closes or stalls first.
fn read_until(stream: &mut TcpStream, enough: impl Fn(&str) -> bool) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 8192];
    while !enough(&String::from_utf8_lossy(&seen)) {
        let n = stream
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("{e} after: {}", String::from_utf8_lossy(&seen)));
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    seen
}

/// Reads until the peer closes (EOF or reset): what arrived, and whether it closed before
/// a read timed out.
fn read_to_close(stream: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (seen, true),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return (seen, false);
            }
            Err(_) => return (seen, true),
        }
    }
}

/// At least three SSE events arrived.
fn three_events(seen: &str) -> bool {
    seen.matches("data: {").count() >= 3
}

/// llama-server killed (SIGKILL) mid-stream: the client's stream ends with Spillway's
/// error event and no clean end (no last chunk, no `[DONE]`), not a hang. While the engine
/// is down each request gets a 502 or 503 quickly; after a restart on the same port
/// requests succeed again within a bounded time, and every gauge is back to zero.
#[test]
fn engine_killed_mid_stream_then_down_then_back() {
    // The default down-marking backoff (1 s, doubling): back about a second after the
    // restart; the bound below leaves room for a few doublings.
    let extra = Extra {
        worker: "engine_request_limit = 1",
        ..Extra::default()
    };
    let Some(mut s) = setup(1, 4096, 1, extra) else {
        return;
    };
    let addr = s.proxy.data_addr;
    let mut c = Client::connect(addr);
    c.stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    c.send(&completion(3500, true));
    let mut raw = read_until(&mut c.stream, three_events);
    s.llama.kill();
    let (rest, closed) = read_to_close(&mut c.stream);
    raw.extend(rest);
    let text = String::from_utf8_lossy(&raw);
    let mut from = text.len().saturating_sub(600);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    let tail = &text[from..];
    assert!(closed, "the stream hung after the engine died: {tail}");
    assert!(
        text.contains("The worker's response broke off before its end"),
        "no error event: {tail}"
    );
    assert!(
        !text.contains("[DONE]") && !text.contains("\r\n0\r\n\r\n"),
        "a clean end: {tail}"
    );

    for _ in 0..3 {
        let started = Instant::now();
        let r = once(addr, &completion(4, false));
        assert!(matches!(r.status, 502 | 503), "{} {}", r.status, r.text());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a {} after {:?}",
            r.status,
            started.elapsed()
        );
    }

    s.llama.restart();
    eventually(
        "a request succeeds after the restart",
        Duration::from_secs(30),
        || once(addr, &completion(4, false)).status == 200,
    );
    check_stream(&once(addr, &completion(6, true)), 6).unwrap();
    counters_back_to_zero(s.proxy.admin_addr, MODEL, &s.worker);
}

/// A client that leaves mid-stream: Spillway closes the engine's connection and
/// llama-server stops generating (its `requests_processing` is back to 0, and its
/// `n_decode_total` far below the 3,500 tokens asked for), Spillway's gauges come back to
/// zero and the freed slot serves the next request.
#[test]
fn client_leaving_mid_stream_stops_the_engine() {
    let extra = Extra {
        worker: "engine_request_limit = 1",
        ..Extra::default()
    };
    let Some(s) = setup(1, 4096, 1, extra) else {
        return;
    };
    let addr = s.proxy.data_addr;
    let mut c = Client::connect(addr);
    c.send(&completion(3500, true));
    read_until(&mut c.stream, three_events);
    assert_eq!(s.llama.metric("requests_processing"), 1.0);
    drop(c);
    eventually(
        "llama-server stops generating",
        Duration::from_secs(20),
        || s.llama.metric("requests_processing") == 0.0,
    );
    let decoded = s.llama.metric("n_decode_total");
    assert!(
        decoded < 1750.0,
        "llama-server went on after the client left: {decoded} decode steps"
    );
    counters_back_to_zero(s.proxy.admin_addr, MODEL, &s.worker);
    let disconnects = metric_value(
        &metrics(s.proxy.admin_addr),
        "spillway_client_disconnects_total",
    );
    assert!(disconnects >= Some(1.0), "{disconnects:?}");
    check_whole(&once(addr, &completion(5, false)), "text_completion", 5).unwrap();
}

/// Tokens per request in the admission test: long enough (about a second or more) that
/// two of them hold their slots while the rest arrive; within a slot's 1,024.
const LONG: u32 = 600;

/// Worker admission (N = 2, Q = 2) in front of a 4-slot llama-server: of eight long
/// requests, two run and two wait, the other four get 529 at once (knob `queue_full`)
/// without reaching the engine; llama-server never has more than two slots busy though it
/// has four; every admitted request completes with all its tokens.
#[test]
fn admission_holds_the_engine_to_n_and_refuses_past_n_plus_q() {
    let worker =
        "engine_request_limit = 2\nrequest_queue_limit = 2\nrequest_queue_timeout_ms = 60000";
    let extra = Extra {
        worker,
        ..Extra::default()
    };
    let Some(s) = setup(4, 4096, 2, extra) else {
        return;
    };
    let (addr, admin) = (s.proxy.data_addr, s.proxy.admin_addr);
    let gauge = |series: String| metric_value(&metrics(admin), &series).unwrap_or(-1.0);
    let stop = AtomicBool::new(false);
    let most_busy = std::thread::scope(|scope| {
        // Bounded, so that a failed assertion below cannot leave the scope waiting.
        let watcher = scope.spawn(|| {
            let (mut most, end) = (0, Instant::now() + Duration::from_secs(120));
            while !stop.load(Ordering::SeqCst) && Instant::now() < end {
                most = most.max(s.llama.busy_slots());
                std::thread::sleep(Duration::from_millis(10));
            }
            most
        });
        let admitted: Vec<_> = (0..4u32)
            .map(|i| spawn_request(addr, completion(LONG, i % 2 == 0)))
            .collect();
        eventually("two run and two wait", Duration::from_secs(20), || {
            gauge(format!("dynamo_engine_request{{worker=\"{}\"}}", s.worker)) == 2.0
                && gauge(format!("dynamo_request_queue{{worker=\"{}\"}}", s.worker)) == 2.0
        });
        for _ in 0..4 {
            let started = Instant::now();
            let r = once(addr, &completion(LONG, false));
            assert_eq!(r.status, 529, "{}", r.text());
            assert_eq!(r.json()["knob"], "queue_full", "{}", r.text());
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{:?}",
                started.elapsed()
            );
        }
        for (i, h) in admitted.into_iter().enumerate() {
            let r = h.join().unwrap();
            match i % 2 {
                0 => check_stream(&r, LONG),
                _ => check_whole(&r, "text_completion", LONG),
            }
            .unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        watcher.join().unwrap()
    });
    assert_eq!(most_busy, 2, "llama-server's busiest moment, in slots");
    counters_back_to_zero(admin, MODEL, &s.worker);
}

/// Scrape only (`metrics_format = "llamacpp"`): six long requests on a 4-slot
/// llama-server, no threshold. Spillway reads the engine's slot count from `/props` and its
/// running requests from `/metrics` (`llamacpp:requests_processing`), shows two waiting,
/// and finds every metric the adapter reads (no `spillway_scrape_missing`).
#[test]
fn the_scrape_adapter_reads_llama_servers_slots_and_queue() {
    let extra = Extra {
        head: "scrape_interval_ms = 100",
        worker: "load_sources = [\"scrape\"]\nmetrics_format = \"llamacpp\"",
        ..Extra::default()
    };
    let Some(s) = setup(4, 4096, 1, extra) else {
        return;
    };
    let (addr, admin) = (s.proxy.data_addr, s.proxy.admin_addr);
    let running: Vec<_> = (0..6)
        .map(|_| spawn_request(addr, completion(LONG, true)))
        .collect();
    let slots = format!("spillway_worker_engine_slots{{worker_id=\"{}\"}}", s.worker);
    let waiting = format!(
        "spillway_worker_waiting_requests{{worker_id=\"{}\",dp_rank=\"0\",worker_type=\"decode\"}}",
        s.worker
    );
    eventually(
        "two wait in llama-server's queue",
        Duration::from_secs(20),
        || s.llama.metric("requests_deferred") == 2.0,
    );
    // The engine's own figures, as Spillway last scraped them (the waiting figure is also
    // Spillway's own count beyond the slots; tests/waiting_requests.rs isolates the
    // scraped one).
    eventually("Spillway reads the engine", Duration::from_secs(20), || {
        let text = metrics(admin);
        let rank = &admin_get(admin, "/load").json()["workers"][0]["ranks"][0];
        metric_value(&text, &slots) == Some(4.0)
            && metric_value(&text, &waiting) == Some(2.0)
            && rank["running_requests"] == 4
            && rank["waiting_requests"] == 2
    });
    assert!(!metrics(admin).contains("spillway_scrape_missing"));
    for h in running {
        check_stream(&h.join().unwrap(), LONG).unwrap();
    }
}

/// Issue 29's acceptance: scrape only, `waiting_requests_threshold = 0`, twenty long
/// requests at once on a 4-slot llama-server. Four run; the other sixteen get 529 at once
/// naming `waiting_requests` (Spillway counts its own requests against the slots `/props`
/// gave); llama-server's own queue stays empty the whole time, so no admitted request
/// waits there at all.
#[test]
fn a_waiting_threshold_of_zero_keeps_llama_servers_queue_empty() {
    let extra = Extra {
        head: "scrape_interval_ms = 100",
        model: "waiting_requests_threshold = 0",
        worker: "load_sources = [\"scrape\"]\nmetrics_format = \"llamacpp\"",
    };
    let Some(s) = setup(4, 4096, 1, extra) else {
        return;
    };
    let (addr, admin) = (s.proxy.data_addr, s.proxy.admin_addr);
    let slots = format!("spillway_worker_engine_slots{{worker_id=\"{}\"}}", s.worker);
    eventually(
        "the slots read from /props",
        Duration::from_secs(10),
        || metric_value(&metrics(admin), &slots) == Some(4.0),
    );
    let stop = AtomicBool::new(false);
    let (responses, most_deferred) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let (mut most, end) = (0.0f64, Instant::now() + Duration::from_secs(120));
            while !stop.load(Ordering::SeqCst) && Instant::now() < end {
                most = most.max(s.llama.metric("requests_deferred"));
                std::thread::sleep(Duration::from_millis(10));
            }
            most
        });
        let pending: Vec<_> = (0..20)
            .map(|i| spawn_request(addr, completion(LONG, i % 2 == 0)))
            .collect();
        let responses: Vec<_> = pending.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::SeqCst);
        (responses, watcher.join().unwrap())
    });
    let refused: Vec<_> = responses.iter().filter(|r| r.status == 529).collect();
    assert_eq!(
        refused.len(),
        16,
        "statuses: {:?}",
        responses.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    for r in refused {
        let v = r.json();
        assert_eq!(v["knob"], "waiting_requests", "{v}");
        assert_eq!(
            (v["value"].as_f64(), v["threshold"].as_f64()),
            (Some(1.0), Some(0.0))
        );
    }
    assert_eq!(responses.iter().filter(|r| r.status == 200).count(), 4);
    assert_eq!(
        most_deferred, 0.0,
        "requests waited in llama-server's queue"
    );
    let inflight = format!(
        "spillway_worker_inflight_requests{{worker=\"{}\"}}",
        s.worker
    );
    eventually("nothing left in flight", Duration::from_secs(10), || {
        metric_value(&metrics(admin), &inflight) == Some(0.0)
    });
}

/// The official OpenAI Python client (tests/llamacpp_client.py) through Spillway to
/// llama-server: chat whole and streamed, completions streamed, with the usage the engine
/// reports, and streams back to back on the client's kept-alive connections. Skipped
/// without the `openai` package, failing instead under CI.
#[test]
fn official_openai_client_through_spillway_to_llama_server() {
    let Some(python) = spillway_testkit::tools::python_with("openai") else {
        return;
    };
    let Some(s) = setup(2, 2048, 1, Extra::default()) else {
        return;
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/llamacpp_client.py");
    let out = Command::new(&python)
        .arg(script)
        .env("BASE_URL", format!("http://{}/v1", s.proxy.data_addr))
        .env("MODEL", MODEL)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openai client checks failed:\n{}\n{}\nllama-server:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        s.llama.log_tail()
    );
}
