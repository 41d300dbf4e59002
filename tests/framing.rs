#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // tests time what they observe
//! Framing probes: request smuggling and malformed framing (RFC 9112 and the published
//! attack families: CL.TE, TE.CL, TE.TE obfuscation, chunk-size and chunk-extension
//! tricks, bare CR/LF, obs-fold, control bytes, versions, targets, Upgrade, pipelining),
//! one table in `tests/framing/cases.json` that `bench/framing/run.sh` also replays against
//! HAProxy and nginx. Each case is written in one go on a fresh connection; Spillway must
//! either refuse it (the status, then close) or forward exactly the requests the case
//! names, each one unambiguous: one Content-Length matching the body, no
//! Transfer-Encoding, one Host, CRLF line ends, the body intact.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;
use spillway_testkit::*;

/// One probe and what Spillway must do with it.
struct Case {
    name: String,
    request: Vec<u8>,
    statuses: Vec<u16>,
    upstream: Vec<Vec<u8>>,
    closes: bool,
}

/// One character per byte (U+0000..=U+00FF), as the corpus writes raw bytes.
fn bytes(v: &Value) -> Vec<u8> {
    let s = v.as_str().expect("a string");
    s.chars()
        .map(|c| u8::try_from(u32::from(c)).expect("one byte per character"))
        .collect()
}

fn corpus() -> Vec<Case> {
    let doc: Value = serde_json::from_str(include_str!("framing/cases.json")).unwrap();
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            request: bytes(&c["request"]),
            statuses: c["expect"]["statuses"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_u64().unwrap() as u16)
                .collect(),
            upstream: c["expect"]["upstream"]
                .as_array()
                .unwrap()
                .iter()
                .map(bytes)
                .collect(),
            closes: c["expect"]["closes"].as_bool().unwrap(),
        })
        .collect()
}

/// What the client saw.
#[derive(Debug)]
struct Outcome {
    statuses: Vec<u16>,
    /// The connection ended (EOF or reset).
    closed: bool,
    /// Bytes after the last whole response.
    rest: Vec<u8>,
}

/// One whole response at the start of `buf` (Content-Length bodies, 1xx skipped):
/// its status and length.
fn response(buf: &[u8]) -> Option<(u16, usize)> {
    let mut hs = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut hs);
    let httparse::Status::Complete(n) = r.parse(buf).ok()? else {
        return None;
    };
    let status = r.code?;
    let len: usize = r
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
        .unwrap_or(0);
    (buf.len() >= n + len).then_some((status, n + len))
}

/// Writes `raw` in one go, reads responses until `want` of them arrived (or the
/// connection ended, or 10 s passed), then watches for a close: up to 10 s when one is
/// expected, 200 ms otherwise.
fn exchange(addr: SocketAddr, raw: &[u8], want: usize, closes: bool) -> Outcome {
    let mut s = TcpStream::connect(addr).unwrap();
    let _ = s.set_nodelay(true);
    let _ = s.write_all(raw); // the proxy may close before reading everything
    let mut out = Outcome {
        statuses: Vec::new(),
        closed: false,
        rest: Vec::new(),
    };
    let read = |s: &mut TcpStream, out: &mut Outcome, wait: Duration| {
        s.set_read_timeout(Some(wait)).unwrap();
        let mut tmp = [0u8; 8192];
        match s.read(&mut tmp) {
            Ok(0) => out.closed = true,
            Ok(n) => out.rest.extend_from_slice(&tmp[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => out.closed = true,
        }
        while let Some((status, n)) = response(&out.rest) {
            out.rest.drain(..n);
            if status >= 200 {
                out.statuses.push(status);
            }
        }
        !out.closed
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.statuses.len() < want && Instant::now() < deadline {
        if !read(&mut s, &mut out, Duration::from_millis(500)) && out.closed {
            return out;
        }
    }
    if closes {
        while !out.closed && Instant::now() < deadline + Duration::from_secs(10) {
            read(&mut s, &mut out, Duration::from_millis(500));
        }
    } else {
        read(&mut s, &mut out, Duration::from_millis(200));
    }
    out
}

/// Whether a request the worker received is one unambiguous request carrying `body`.
fn check_forwarded(seen: &Seen, body: &[u8]) -> Result<(), String> {
    let count = |name: &str| {
        seen.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
    };
    let lengths: Vec<&str> = seen
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.as_str())
        .collect();
    let head = &seen.head;
    let bare_lf = (0..head.len()).any(|i| head[i] == b'\n' && (i == 0 || head[i - 1] != b'\r'));
    let bare_cr = (0..head.len()).any(|i| head[i] == b'\r' && head.get(i + 1) != Some(&b'\n'));
    let problems = [
        (seen.method != "POST", "method is not POST"),
        (
            seen.path != "/v1/chat/completions",
            "path is not /v1/chat/completions",
        ),
        (seen.body != body, "body differs"),
        (
            lengths != [body.len().to_string()],
            "not one Content-Length matching the body",
        ),
        (
            count("transfer-encoding") > 0,
            "Transfer-Encoding forwarded",
        ),
        (
            count("upgrade") + count("http2-settings") > 0,
            "Upgrade forwarded",
        ),
        (count("host") != 1, "not exactly one Host"),
        (bare_lf || bare_cr, "bare CR or LF in the head"),
    ];
    match problems.iter().find(|(bad, _)| *bad) {
        Some((_, why)) => Err(format!("{why}: {:?}", String::from_utf8_lossy(head))),
        None => Ok(()),
    }
}

fn check(case: &Case, got: &Outcome, seen: &[Seen]) -> Result<(), String> {
    if got.statuses != case.statuses {
        return Err(format!(
            "statuses {:?}, want {:?}",
            got.statuses, case.statuses
        ));
    }
    if got.closed != case.closes {
        return Err(format!("closed: {}, want {}", got.closed, case.closes));
    }
    if !got.rest.is_empty() {
        return Err(format!(
            "stray bytes {:?}",
            String::from_utf8_lossy(&got.rest)
        ));
    }
    if seen.len() != case.upstream.len() {
        return Err(format!(
            "worker saw {} requests, want {}: {:?}",
            seen.len(),
            case.upstream.len(),
            seen.iter().map(Seen::body_str).collect::<Vec<_>>()
        ));
    }
    for (s, body) in seen.iter().zip(&case.upstream) {
        check_forwarded(s, body)?;
    }
    Ok(())
}

#[test]
fn every_probe_is_refused_or_forwarded_unambiguously() {
    let up = echo_upstream("a");
    let limits = "[limits]\nmax_body_bytes = 1048576\nheader_read_timeout_ms = 500\n\
                  body_read_timeout_ms = 500\n";
    let p = proxy(1, &format!("{limits}{}", model("m", "", &[up.url()])));
    let cases = corpus();
    assert!(cases.len() >= 100, "the corpus shrank: {}", cases.len());
    let mut failures = Vec::new();
    let mut before = 0;
    for case in &cases {
        let got = exchange(p.data_addr, &case.request, case.statuses.len(), case.closes);
        let seen = up.seen();
        if let Err(why) = check(case, &got, &seen[before..]) {
            failures.push(format!("{}: {why}", case.name));
        }
        before = seen.len();
    }
    assert!(
        failures.is_empty(),
        "{} of {} probes:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // Nothing arrives late, and nothing reached the worker that it could not parse.
    std::thread::sleep(Duration::from_millis(300));
    let want: usize = cases.iter().map(|c| c.upstream.len()).sum();
    assert_eq!(
        up.count(),
        want,
        "requests reached the worker after their case"
    );
    assert!(up.unparsed().is_empty(), "{:?}", up.unparsed());
}
