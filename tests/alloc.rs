#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Proof of the zero-allocation data path: a counting global allocator sees no heap
//! allocation while the proxy serves steady keep-alive traffic (small JSON request,
//! Content-Length response). The client and the fake worker here use fixed buffers and
//! std sockets, so every allocation counted would be the proxy's.
//!
//! The count is process-wide, so this binary has no test harness (`harness = false`): the
//! harness's own threads allocate as they report one test and start the next, which a
//! slow machine can overlap with another test's measurement. `main` runs the checks one
//! after another instead; arguments filter them by name, as with the harness.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};

use spillway_testkit::alloc::{CountingAlloc, Watch, allocations};
use spillway_testkit::{model, proxy};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const REQUEST: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: spillway\r\nContent-Type: application/json\r\n\
Content-Length: 72\r\n\r\n{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"say hi\"}],\"stream\":0}";
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 27\r\n\r\n{\"choices\":[{\"text\":\"hi\"}]}";

/// Reads one HTTP message (head + Content-Length body) into `buf`; returns its length.
fn read_message(s: &mut TcpStream, buf: &mut [u8]) -> Option<usize> {
    let mut filled = 0;
    loop {
        let n = s.read(&mut buf[filled..]).ok()?;
        if n == 0 {
            return None;
        }
        filled += n;
        let data = &buf[..filled];
        let Some(head_end) = data.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = &data[..head_end];
        let len = head
            .split(|&b| b == b'\n')
            .find_map(|line| {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let (k, v) = line.split_at(line.iter().position(|&b| b == b':')?);
                k.eq_ignore_ascii_case(b"content-length").then(|| {
                    v[1..]
                        .trim_ascii()
                        .iter()
                        .fold(0usize, |a, d| a * 10 + usize::from(d - b'0'))
                })
            })
            .unwrap_or(0);
        if filled >= head_end + 4 + len {
            return Some(filled);
        }
    }
}

/// A fake worker on port 0 that reads each request whole and `answer`s it (given the
/// request).
fn fake_worker(answer: fn(&mut TcpStream, &[u8]) -> std::io::Result<()>) -> String {
    let worker = TcpListener::bind("127.0.0.1:0").unwrap();
    let worker_url = format!("http://{}", worker.local_addr().unwrap());
    std::thread::spawn(move || {
        for s in worker.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let _ = s.set_nodelay(true);
                let mut buf = [0u8; 16384];
                while let Some(n) = read_message(&mut s, &mut buf) {
                    if answer(&mut s, &buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    worker_url
}

/// A fake worker that answers every request with `RESPONSE`.
fn worker() -> String {
    fake_worker(|s, _| s.write_all(RESPONSE))
}

/// A fake worker that streams every answer: a chunked `text/event-stream` of `EVENTS`
/// token events, a usage event and `[DONE]`, each written on its own.
fn stream_worker() -> String {
    fake_worker(|s, _| write_stream(s))
}

const EVENTS: usize = 16;

fn write_stream(s: &mut TcpStream) -> std::io::Result<()> {
    s.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
    )?;
    const TOKEN: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" hi\"}}]}\n\n";
    const USAGE: &[u8] =
        b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":16}}\n\n";
    const DONE: &[u8] = b"data: [DONE]\n\n";
    let mut chunk = [0u8; 256];
    for event in std::iter::repeat_n(TOKEN, EVENTS).chain([USAGE, DONE]) {
        let head = format_hex(event.len(), &mut chunk);
        chunk[head..head + event.len()].copy_from_slice(event);
        chunk[head + event.len()..head + event.len() + 2].copy_from_slice(b"\r\n");
        s.write_all(&chunk[..head + event.len() + 2])?;
    }
    s.write_all(b"0\r\n\r\n")
}

/// Writes `n` in hex and CRLF at the start of `out`, without allocating; returns its length.
fn format_hex(n: usize, out: &mut [u8]) -> usize {
    let digits = (usize::BITS - n.leading_zeros()).div_ceil(4).max(1) as usize;
    for i in 0..digits {
        out[digits - 1 - i] = b"0123456789abcdef"[(n >> (4 * i)) & 0xf];
    }
    out[digits..digits + 2].copy_from_slice(b"\r\n");
    digits + 2
}

/// Reads one chunked response to its last chunk into `buf`; returns its length.
fn read_chunked(s: &mut TcpStream, buf: &mut [u8]) -> Option<usize> {
    let mut filled = 0;
    loop {
        let n = s.read(&mut buf[filled..]).ok()?;
        if n == 0 {
            return None;
        }
        filled += n;
        if buf[..filled].ends_with(b"\r\n0\r\n\r\n") {
            return Some(filled);
        }
    }
}

/// Heap allocations while a proxy in front of `workers` fake workers, configured by
/// `model_toml` (given their URLs), serves `requests` in turn 5,000 times, after a warm-up.
fn allocations_per_steady_run(
    workers: usize,
    model_toml: impl Fn(&[String]) -> String,
    requests: &[Vec<u8>],
) -> (u64, String) {
    allocations_with(worker, read_message, workers, model_toml, requests)
}

/// The same with other workers (`spawn_worker`) and answers (`read`).
fn allocations_with(
    spawn_worker: fn() -> String,
    read: fn(&mut TcpStream, &mut [u8]) -> Option<usize>,
    workers: usize,
    model_toml: impl Fn(&[String]) -> String,
    requests: &[Vec<u8>],
) -> (u64, String) {
    let urls: Vec<String> = (0..workers).map(|_| spawn_worker()).collect();
    // Connections that idle past `buffer_release_ms` park and allocate their request
    // loop's state again when they wake (once per wake, not per request): keep this one
    // busy whatever the machine's pauses.
    let toml = format!(
        "{}\n[limits]\nbuffer_release_ms = 600000\n",
        model_toml(&urls)
    );
    let p = proxy(1, &toml);
    let mut client = TcpStream::connect(p.data_addr).unwrap();
    client.set_nodelay(true).unwrap();
    let mut buf = [0u8; 4096];
    let mut round = |client: &mut TcpStream, request: &[u8]| {
        client.write_all(request).unwrap();
        let n = read(client, &mut buf).unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200 OK\r\n"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
    };
    for i in 0..500 {
        round(&mut client, &requests[i % requests.len()]);
    }
    assert!(allocations() > 0, "the counting allocator is not installed");
    let watch = Watch::start();
    for i in 0..5_000 {
        round(&mut client, &requests[i % requests.len()]);
    }
    watch.stop()
}

fn steady_state_proxying_allocates_nothing() {
    assert_eq!(
        REQUEST.len() - REQUEST.windows(4).position(|w| w == b"\r\n\r\n").unwrap() - 4,
        72
    );
    let (n, whose) =
        allocations_per_steady_run(1, |urls| model("m", "", urls), &[REQUEST.to_vec()]);
    assert_eq!(
        n, 0,
        "{n} heap allocations over 5,000 proxied requests: {whose}"
    );
}

/// Streamed answers with shedding on: every event is scanned (SSE count, usage), counted
/// into the tracked decode blocks and timed (ITL), and written through as it came. The
/// request states a budget as the OpenAI SDKs do, which is read per request.
fn streaming_with_shedding_allocates_nothing() {
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"say hi"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: spillway\r\nContent-Type: application/json\r\nX-Stainless-Timeout: 600\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    // The monitor folds the tracked load every `monitor_interval_ms` and publishes a busy set
    // whose figures changed, which allocates on the control thread (not the data path,
    // and once a tick, not per request): keep it out of the count.
    let shed = |urls: &[String]| {
        format!(
            "monitor_interval_ms = 600000\n[[models]]\nname = \"m\"\nactive_decode_blocks_threshold = 0.99\n\
             active_prefill_tokens_threshold = 1000000\ntrack_output_blocks = true\n\
             [[models.workers]]\nurl = \"{}\"\nload_sources = [\"tracked\"]\n\
             kv_total_blocks = 100000\nblock_size = 4\nengine_request_limit = 256\n",
            urls[0]
        )
    };
    let (n, whose) = allocations_with(
        stream_worker,
        read_chunked,
        1,
        shed,
        &[request.into_bytes()],
    );
    assert_eq!(
        n,
        0,
        "{n} heap allocations over 5,000 streamed requests of {} events: {whose}",
        EVENTS + 2
    );
}

/// `kv` mode: every request's prompt (a shared system prompt, then one of four
/// conversations) is hashed, looked up in the predicted-cache index and recorded there.
fn kv_routing_allocates_nothing() {
    let system = "You are a helpful assistant. ".repeat(40);
    let requests: Vec<Vec<u8>> = (0..4)
        .map(|k| {
            let body = format!(
                r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"conversation {k}: {}"}}]}}"#,
                "tell me more. ".repeat(20 + k)
            );
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: spillway\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        })
        .collect();
    let kv = |urls: &[String]| model("m", "router_mode = \"kv\"", urls);
    let (n, whose) = allocations_per_steady_run(3, kv, &requests);
    assert_eq!(
        n, 0,
        "{n} heap allocations over 5,000 kv-routed requests: {whose}"
    );
}

/// The same over TLS: a kept-alive session's requests are opened and its responses sealed
/// in place, so the steady state still allocates nothing. The client is a Python process
/// (its allocations are not this process's).
fn steady_state_over_tls_allocates_nothing() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let python = std::env::var("SPILLWAY_PYTHON").unwrap_or_else(|_| "python3".into());
    if Command::new(&python).arg("--version").output().is_err() {
        spillway_testkit::tools::skip_missing_tool(
            "python3",
            format_args!("`{python}` is missing"),
        );
        return;
    }
    let pki = spillway_testkit::tls::Pki::new(&spillway_testkit::tools::scratch_dir("alloc-tls"));
    let toml = format!(
        "[limits]\nbuffer_release_ms = 600000\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n{}",
        pki.cert.display(),
        pki.key.display(),
        model("m", "", &[worker()])
    );
    let p = proxy(1, &toml);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tls_client.py");
    let mut child = Command::new(&python)
        .arg(script)
        .arg(p.data_addr.ip().to_string())
        .arg(p.data_addr.port().to_string())
        .arg(&pki.ca)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let hex: String = REQUEST.iter().map(|b| format!("{b:02x}")).collect();
    writeln!(stdin, "{hex}").unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "warm", "the TLS client failed");
    let watch = Watch::start();
    writeln!(stdin, "go").unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    let (n, whose) = watch.stop();
    assert_eq!(line.trim(), "done", "the TLS client failed");
    // Only now may the client close: the end of its session frees the connection's
    // buffers, which is not the steady state (and once raced the count above).
    drop(stdin);
    assert!(child.wait().unwrap().success());
    assert_eq!(
        n, 0,
        "{n} heap allocations over 5,000 requests on one TLS session: {whose}"
    );
}

/// `REQUEST` with trace context fields after its Host line.
fn with_fields(fields: &str) -> Vec<u8> {
    let text = std::str::from_utf8(REQUEST).unwrap();
    text.replacen(
        "Host: spillway\r\n",
        &format!("Host: spillway\r\n{fields}"),
        1,
    )
    .into_bytes()
}

/// With the access log on (JSON lines to a file; trace context made when absent, passed
/// through when valid, replaced when invalid), cores format into reused buffers and the
/// writer thread hands them back: still nothing allocated per request.
fn access_log_allocates_nothing() {
    let dir = spillway_testkit::tools::scratch_dir("alloc-log");
    let path = dir.join("access.log");
    let with_log = |urls: &[String]| {
        format!(
            "[access_log]\npath = \"{}\"\n{}",
            path.display(),
            model("m", "", urls)
        )
    };
    let requests = [
        REQUEST.to_vec(),
        with_fields(
            "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\ntracestate: k=v\r\n",
        ),
        with_fields(
            "traceparent: 00-00000000000000000000000000000000-b7ad6b7169203331-01\r\ntracestate: k=v\r\n",
        ),
    ];
    let (n, whose) = allocations_per_steady_run(1, with_log, &requests);
    let lines = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .count();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        n, 0,
        "{n} heap allocations over 5,000 logged requests: {whose}"
    );
    assert!(lines > 0, "no line reached the log");
}

/// A prefill worker's answer to vLLM's stage 1: one token, and the KV cache's transfer
/// parameters.
const PREFILL_RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 191\r\n\r\n\
{\"choices\":[{\"text\":\"h\"}],\"kv_transfer_params\":{\"do_remote_prefill\":true,\"do_remote_decode\":false,\"remote_block_ids\":[1,2,3],\"remote_engine_id\":\"e\",\"remote_host\":\"127.0.0.1\",\"remote_port\":1}}";

/// Model `m` on `decode`, with `extra` keys and its prefill pool on `prefill`.
fn with_prefill_pool(decode: &[String], prefill: &str, extra: &str) -> String {
    let front = model("m", &format!("prefill = \"m-prefill\"\n{extra}"), decode);
    let pool = model("m-prefill", "role = \"prefill\"", &[prefill.to_string()]);
    format!("{front}{pool}")
}

/// A disaggregated model (docs/behaviour.md §23): every request runs stage 1 on the prefill
/// pool (its body rewritten, its answer collected, the parameters spliced into stage 2),
/// then stage 2 on the decode pool, in the connection's reused buffers.
fn disaggregated_path_allocates_nothing() {
    static PREFILLS: AtomicUsize = AtomicUsize::new(0);
    static HANDED: AtomicUsize = AtomicUsize::new(0);
    let prefill = fake_worker(|s, request| {
        let stage_1 = br#""kv_transfer_params":{"do_remote_decode":true"#;
        if request.windows(stage_1.len()).any(|w| w == stage_1) {
            PREFILLS.fetch_add(1, Ordering::Relaxed);
        }
        s.write_all(PREFILL_RESPONSE)
    });
    fn decode() -> String {
        fake_worker(|s, request| {
            let stage_2 = br#""kv_transfer_params":{"do_remote_prefill":true"#;
            if request.windows(stage_2.len()).any(|w| w == stage_2) {
                HANDED.fetch_add(1, Ordering::Relaxed);
            }
            s.write_all(RESPONSE)
        })
    }
    let (n, whose) = allocations_with(
        decode,
        read_message,
        1,
        |urls| with_prefill_pool(urls, &prefill, ""),
        &[REQUEST.to_vec()],
    );
    assert_eq!(
        n, 0,
        "{n} heap allocations over 5,000 disaggregated requests: {whose}"
    );
    let (stage_1, stage_2) = (
        PREFILLS.load(Ordering::Relaxed),
        HANDED.load(Ordering::Relaxed),
    );
    assert_eq!(
        (stage_1, stage_2),
        (5_500, 5_500),
        "both stages, every request"
    );
}

/// SGLang's handoff (docs/behaviour.md §23.6): every request goes to a prefill worker
/// (its answer drained alongside) and a decode worker at once, with bootstrap fields
/// spliced in.
fn sglang_handoff_allocates_nothing() {
    static SENT: AtomicUsize = AtomicUsize::new(0);
    let prefill = fake_worker(|s, request| {
        let bootstrap = br#","bootstrap_room":"#;
        if request.windows(bootstrap.len()).any(|w| w == bootstrap) {
            SENT.fetch_add(1, Ordering::Relaxed);
        }
        s.write_all(RESPONSE)
    });
    let (n, whose) = allocations_per_steady_run(
        1,
        |urls| with_prefill_pool(urls, &prefill, "handoff = \"sglang\""),
        &[REQUEST.to_vec()],
    );
    assert_eq!(
        n, 0,
        "{n} heap allocations over 5,000 requests with SGLang's handoff: {whose}"
    );
    assert_eq!(
        SENT.load(Ordering::Relaxed),
        5_500,
        "every request's prefill side"
    );
}

/// A model with a waiting room and one slot, two clients at once: most requests find the
/// slot taken and wait in the room, are notified when it comes back and bind to it.
fn waiting_room_allocates_nothing() {
    let url = worker();
    // Tenants on: each request is counted in flight for its tenant (none here: one tenant).
    let toml = format!(
        "tenant_header = \"x-tenant\"\n{}\n[limits]\nbuffer_release_ms = 600000\n",
        model(
            "m",
            "waiting_room_size = 8\nwaiting_room_timeout_ms = 60000",
            &[url]
        )
        .replace(
            "\n[[models.workers]]\n",
            "\n[[models.workers]]\nengine_request_limit = 1\n"
        )
    );
    assert!(toml.contains("engine_request_limit = 1"), "{toml}");
    let p = proxy(1, &toml);
    // The clients close their connections only after the count (a close is not a request).
    let start = std::sync::Arc::new(std::sync::Barrier::new(3));
    let done = std::sync::Arc::new(std::sync::Barrier::new(3));
    let counted = std::sync::Arc::new(std::sync::Barrier::new(3));
    let clients: Vec<_> = (0..2)
        .map(|_| {
            let (start, done, counted) = (start.clone(), done.clone(), counted.clone());
            let addr = p.data_addr;
            std::thread::spawn(move || {
                let mut client = TcpStream::connect(addr).unwrap();
                client.set_nodelay(true).unwrap();
                let mut buf = [0u8; 4096];
                let mut round = || {
                    client.write_all(REQUEST).unwrap();
                    let n = read_message(&mut client, &mut buf).unwrap();
                    assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK\r\n"));
                };
                (0..500).for_each(|_| round());
                start.wait();
                (0..2_500).for_each(|_| round());
                done.wait();
                counted.wait();
            })
        })
        .collect();
    start.wait();
    let entered = || {
        let m = spillway_testkit::metrics(p.admin_addr);
        spillway_testkit::metric_value(&m, "spillway_waiting_room_entered_total{model=\"m\"}")
            .unwrap_or(0.0)
    };
    let watch = Watch::start();
    done.wait();
    let (n, whose) = watch.stop();
    counted.wait();
    let waited = entered();
    for c in clients {
        c.join().unwrap();
    }
    eprintln!("{waited} of 6,000 requests waited in the room");
    assert!(waited >= 100.0, "only {waited} requests waited in the room");
    assert_eq!(
        n, 0,
        "{n} heap allocations over 5,000 requests, {waited} of them through the room: {whose}"
    );
}

fn main() {
    let checks: [(&str, fn()); 8] = [
        (
            "sglang_handoff_allocates_nothing",
            sglang_handoff_allocates_nothing,
        ),
        (
            "disaggregated_path_allocates_nothing",
            disaggregated_path_allocates_nothing,
        ),
        (
            "steady_state_proxying_allocates_nothing",
            steady_state_proxying_allocates_nothing,
        ),
        ("kv_routing_allocates_nothing", kv_routing_allocates_nothing),
        (
            "streaming_with_shedding_allocates_nothing",
            streaming_with_shedding_allocates_nothing,
        ),
        (
            "steady_state_over_tls_allocates_nothing",
            steady_state_over_tls_allocates_nothing,
        ),
        ("access_log_allocates_nothing", access_log_allocates_nothing),
        (
            "waiting_room_allocates_nothing",
            waiting_room_allocates_nothing,
        ),
    ];
    // Harness flags (`--nocapture`, `--test-threads`, ...) are accepted and ignored; any
    // other argument keeps only the checks whose name contains it.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let chosen: Vec<_> = checks
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("\nrunning {} checks", chosen.len());
    for (name, check) in &chosen {
        check();
        println!("test {name} ... ok");
    }
    println!("\ntest result: ok. {} passed\n", chosen.len());
}
