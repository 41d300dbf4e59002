#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The access log: one JSON line per request with the fields the README lists (a success,
//! a 529 with its knob, a migration, a client gone mid-stream, a queue timeout), the text
//! format, W3C trace context, reopening after logrotate, and a writer that cannot keep up
//! dropping and counting.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use spillway_testkit::tools::{scratch_dir, skip_missing_tool};
use spillway_testkit::*;

fn log_table(path: &Path, extra: &str) -> String {
    format!("[access_log]\npath = \"{}\"\n{extra}\n", path.display())
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits until `path` has `n` lines, then parses them.
fn json_lines(path: &Path, n: usize) -> Vec<Value> {
    eventually("log lines written", Duration::from_secs(10), || {
        read_lines(path).len() >= n
    });
    read_lines(path)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Sends `raw` (which asks to close) on a fresh connection; every byte the proxy wrote.
fn raw_exchange(addr: std::net::SocketAddr, raw: &str) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    got
}

fn setup(what: &str) -> (PathBuf, PathBuf) {
    let dir = scratch_dir(what);
    let log = dir.join("access.log");
    (dir, log)
}

#[test]
fn success_fields_and_trace_context() {
    let (dir, log) = setup("log-ok");
    let up = echo_upstream("a");
    let p = proxy(
        1,
        &format!("{}{}", log_table(&log, ""), model("m", "", &[up.url()])),
    );
    let r = once(
        p.data_addr,
        &post_with(
            "/v1/chat/completions",
            "x-request-id: abc\r\n",
            r#"{"model":"m","messages":[]}"#,
        ),
    );
    assert_eq!(r.status, 200);
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let r = once(
        p.data_addr,
        &post_with(
            "/v1/completions",
            &format!("traceparent: {tp}\r\ntracestate: k=v\r\n"),
            r#"{"model":"m"}"#,
        ),
    );
    assert_eq!(r.status, 200);
    let not_found = raw_exchange(
        p.data_addr,
        "GET /nope HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    );
    assert!(not_found.starts_with(b"HTTP/1.1 404 "));
    let models = raw_exchange(
        p.data_addr,
        "GET /v1/models HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    );
    assert!(models.starts_with(b"HTTP/1.1 200 "));
    let no_model = post_with("/v1/completions", "connection: close\r\n", "{}");
    let no_model = raw_exchange(p.data_addr, std::str::from_utf8(&no_model).unwrap());
    assert!(no_model.starts_with(b"HTTP/1.1 400 "));
    let lines = json_lines(&log, 5);
    let v = &lines[0];
    assert_eq!(v["request_id"], "abc");
    assert_eq!(v["client"], "127.0.0.1");
    assert_eq!(v["method"], "POST");
    assert_eq!(v["path"], "/v1/chat/completions");
    assert_eq!(v["model"], "m");
    assert_eq!(v["router"], "round-robin");
    assert_eq!(v["worker"], worker_name(&up.url()));
    assert_eq!(v["status"], 200);
    assert_eq!(v["knob"], Value::Null);
    assert_eq!(v["class"], "standard");
    assert_eq!(v["migrations"], 0);
    assert_eq!(v["closed"], Value::Null);
    assert!(v["ttft_ms"].as_f64().unwrap() >= 0.0);
    assert!(v["duration_ms"].as_f64().unwrap() >= v["ttft_ms"].as_f64().unwrap());
    assert!(v["bytes_in"].as_u64().unwrap() > 27);
    assert!(v["bytes_out"].as_u64().unwrap() > 16);
    assert!(v["time"].as_str().unwrap().ends_with('Z'));
    // No traceparent from the client: one was made and sent upstream.
    let seen = up.seen();
    let made = seen[0].header("traceparent").unwrap();
    assert_eq!(&made[3..35], v["trace_id"].as_str().unwrap());
    // The client's is passed through, with its tracestate.
    assert_eq!(seen[1].header("traceparent"), Some(tp));
    assert_eq!(seen[1].header("tracestate"), Some("k=v"));
    assert_eq!(lines[1]["trace_id"], "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(lines[2]["status"], 404);
    assert_eq!(lines[2]["model"], Value::Null);
    // Spillway's own answers log the bytes the client got.
    assert_eq!(lines[2]["bytes_out"], not_found.len(), "{}", lines[2]);
    assert_eq!(lines[3]["path"], "/v1/models");
    assert_eq!(lines[3]["bytes_out"], models.len(), "{}", lines[3]);
    assert_eq!(lines[4]["status"], 400);
    assert_eq!(lines[4]["bytes_out"], no_model.len(), "{}", lines[4]);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// How many fields called `name` the worker received.
fn count(seen: &Seen, name: &str) -> usize {
    seen.headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .count()
}

/// An invalid `traceparent` is never forwarded as it is: replaced by a new one (and its
/// `tracestate` dropped) with `traceparent = "create"`, dropped with `"pass"`.
#[test]
fn invalid_traceparent_is_replaced_or_dropped() {
    let bad = [
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01",
    ];
    for mode in ["create", "pass"] {
        let (dir, log) = setup(&format!("log-badtrace-{mode}"));
        let up = echo_upstream("a");
        let table = log_table(&log, &format!("traceparent = \"{mode}\""));
        let p = proxy(1, &format!("{table}{}", model("m", "", &[up.url()])));
        for tp in bad {
            let fields = format!("traceparent: {tp}\r\ntracestate: k=v\r\n");
            let r = once(
                p.data_addr,
                &post_with("/v1/completions", &fields, r#"{"model":"m"}"#),
            );
            assert_eq!(r.status, 200);
        }
        let lines = json_lines(&log, bad.len());
        let seen = up.seen();
        assert_eq!(seen.len(), bad.len());
        for (s, line) in seen.iter().zip(&lines) {
            assert_eq!(count(s, "tracestate"), 0, "{mode}: {:?}", s.headers);
            if mode == "create" {
                assert_eq!(count(s, "traceparent"), 1, "{:?}", s.headers);
                let made = s.header("traceparent").unwrap();
                assert!(!bad.contains(&made), "{made}");
                assert_eq!(made.len(), 55);
                assert_eq!(&made[3..35], line["trace_id"].as_str().unwrap(), "{line}");
            } else {
                assert_eq!(count(s, "traceparent"), 0, "{:?}", s.headers);
                assert_eq!(line["trace_id"], Value::Null, "{line}");
            }
        }
        drop(p);
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn refusals_migration_and_queue_timeout() {
    let (dir, log) = setup("log-refused");
    let busy = upstream(|_| Reply::Raw(json_response(529, r#"{"message":"busy"}"#)));
    let ok = echo_upstream("ok");
    let held = Held::new("h");
    let toml = format!(
        "migration_limit = 1\n{}{}{}[[models]]\nname = \"q\"\n[[models.workers]]\nurl = \"{}\"\nname = \"h\"\nengine_request_limit = 1\nrequest_queue_limit = 2\nrequest_queue_timeout_ms = 300\n",
        log_table(&log, ""),
        model("m", "", &[busy.url(), ok.url()]),
        model("t", "active_prefill_tokens_threshold = 10", &[ok.url()]),
        held.url()
    );
    let p = proxy(1, &toml);
    // Round robin starts at the refusing worker: one migration to the other.
    let r = once(p.data_addr, &chat("m"));
    assert_eq!(r.status, 200);
    let push = format!(
        r#"[{{"worker_id":"{}","active_prefill_tokens":500}}]"#,
        worker_name(&ok.url())
    );
    assert_eq!(admin_post(p.admin_addr, "/load", &push).status, 200);
    let body = r#"{"model":"t","messages":[]}"#;
    let refused = String::from_utf8(raw_exchange(
        p.data_addr,
        std::str::from_utf8(&post_with(
            "/v1/chat/completions",
            "connection: close\r\n",
            body,
        ))
        .unwrap(),
    ))
    .unwrap();
    assert!(refused.starts_with("HTTP/1.1 529 "), "{refused}");
    let running = spawn_request(p.data_addr, chat("q"));
    eventually("held", Duration::from_secs(5), || held.up.count() == 1);
    assert_eq!(once(p.data_addr, &chat("q")).status, 529);
    held.release(1);
    assert_eq!(running.join().unwrap().status, 200);

    let lines = json_lines(&log, 4);
    let migrated = lines.iter().find(|v| v["model"] == "m").unwrap();
    assert_eq!(migrated["migrations"], 1, "{migrated}");
    assert_eq!(migrated["worker"], worker_name(&ok.url()));
    assert_eq!(migrated["status"], 200);
    let busy_line = lines.iter().find(|v| v["model"] == "t").unwrap();
    assert_eq!(busy_line["status"], 529);
    assert_eq!(busy_line["knob"], "prefill_tokens");
    assert_eq!(busy_line["worker"], Value::Null);
    assert_eq!(busy_line["bytes_out"], refused.len(), "{busy_line}");
    let timed_out = lines
        .iter()
        .find(|v| v["model"] == "q" && v["status"] == 529)
        .unwrap();
    assert_eq!(timed_out["knob"], "queue_timeout");
    assert!(
        timed_out["queue_ms"].as_f64().unwrap() >= 290.0,
        "{timed_out}"
    );
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn client_gone_mid_stream() {
    let (dir, log) = setup("log-abort");
    let up = upstream(|_| {
        Reply::Steps(vec![
            Step::Write(SSE_HEAD.as_bytes().to_vec()),
            Step::Write(chunk("data: {\"token\":0}\n\n")),
            Step::WaitClose,
        ])
    });
    let p = proxy(
        1,
        &format!("{}{}", log_table(&log, ""), model("m", "", &[up.url()])),
    );
    let mut c = Client::connect(p.data_addr);
    c.send(&post(
        "/v1/chat/completions",
        r#"{"model":"m","stream":true}"#,
    ));
    eventually("streaming", Duration::from_secs(5), || up.count() == 1);
    std::thread::sleep(Duration::from_millis(100));
    drop(c);
    let lines = json_lines(&log, 1);
    assert_eq!(lines[0]["closed"], "client", "{}", lines[0]);
    assert_eq!(lines[0]["status"], 200);
    assert!(lines[0]["ttft_ms"].is_number());
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn text_format_sampling_and_reopen() {
    let (dir, log) = setup("log-text");
    let up = echo_upstream("a");
    let extra = "format = \"text\"\ntext_format = \"$status $model $worker $knob\"\nsample = 2";
    let p = proxy(
        1,
        &format!("{}{}", log_table(&log, extra), model("m", "", &[up.url()])),
    );
    for _ in 0..4 {
        assert_eq!(once(p.data_addr, &chat("m")).status, 200);
    }
    assert_eq!(once(p.data_addr, &chat("nope")).status, 404);
    let w = worker_name(&up.url());
    eventually("3 lines", Duration::from_secs(10), || {
        read_lines(&log).len() == 3
    });
    let lines = read_lines(&log);
    assert_eq!(lines[0], format!("200 m {w} -"));
    assert_eq!(lines[2], "404 - - -");
    // logrotate moves the file, then signals: lines go to a new file.
    let rotated = dir.join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    p.reopen_access_log();
    std::thread::sleep(Duration::from_millis(100));
    eventually("reopened", Duration::from_secs(10), || {
        let _ = once(p.data_addr, &chat("nope"));
        !read_lines(&log).is_empty()
    });
    assert!(read_lines(&rotated).len() >= 3);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// A log whose reader never reads (a FIFO): the writer blocks, the cores' buffers run
/// out, lines are dropped and counted, and requests are served as before.
#[test]
fn writer_behind_drops_and_counts() {
    use std::os::unix::fs::OpenOptionsExt;
    let (dir, log) = setup("log-fifo");
    let made = std::process::Command::new("mkfifo").arg(&log).status();
    if !made.is_ok_and(|s| s.success()) {
        skip_missing_tool("mkfifo", "cannot make a FIFO");
        return;
    }
    // Held open for reading, never read: writes block once the pipe is full.
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_nonblock())
        .open(&log)
        .unwrap();
    let up = echo_upstream("a");
    let p = proxy(
        1,
        &format!("{}{}", log_table(&log, ""), model("m", "", &[up.url()])),
    );
    let mut c = Client::connect(p.data_addr);
    eventually("lines dropped", Duration::from_secs(60), || {
        for _ in 0..200 {
            assert_eq!(c.request(&chat("m")).status, 200);
        }
        metric_value(&metrics(p.admin_addr), "spillway_access_log_dropped_total")
            .is_some_and(|n| n > 0.0)
    });
    let text = metrics(p.admin_addr);
    let written = metric_value(&text, "spillway_access_log_lines_total").unwrap();
    assert!(written >= 4.0 * 60.0, "{text}");
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}

/// `O_NONBLOCK` (opening a FIFO for reading must not wait for a writer).
fn libc_nonblock() -> i32 {
    0o4000
}

/// A reload (`POST /reload`) that changes `access_log.path` moves the lines to the new
/// file within a second or so; one that turns the log off stops them.
#[test]
fn reload_moves_and_stops_the_log() {
    let (dir, first) = setup("log-reload");
    let second = dir.join("second.log");
    let up = echo_upstream("a");
    let text = |table: &str| format!("{}{table}{}", test_head(1), model("m", "", &[up.url()]));
    let file = ConfigFile::new(&text(&log_table(&first, "")));
    let p = proxy_file(&file);
    assert_eq!(once(p.data_addr, &chat("m")).status, 200);
    json_lines(&first, 1);
    file.write(&text(&log_table(
        &second,
        "format = \"text\"\ntext_format = \"$status\"",
    )));
    assert_eq!(admin_post(p.admin_addr, "/reload", "").status, 200);
    eventually("the new file is used", Duration::from_secs(10), || {
        assert_eq!(once(p.data_addr, &chat("m")).status, 200);
        read_lines(&second).iter().any(|l| l == "200")
    });
    file.write(&text("[access_log]\npath = \"off\"\n"));
    assert_eq!(admin_post(p.admin_addr, "/reload", "").status, 200);
    std::thread::sleep(Duration::from_millis(300));
    let before = read_lines(&second).len();
    for _ in 0..5 {
        assert_eq!(once(p.data_addr, &chat("m")).status, 200);
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(read_lines(&second).len(), before);
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}
