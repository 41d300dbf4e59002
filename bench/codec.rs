#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What does the sans-io codec cost per request on the data path?
//!
//! - `parse_request`: an OpenAI chat request head as the openai Python client (httpx) sends it.
//! - `parse_response`: a vLLM (uvicorn) SSE response head.
//! - `peek`: the model scanner on request bodies of 200 B, 8 KiB and 256 KiB with `model`
//!   first and last, against `serde_json::from_slice` into a struct that borrows `model`.
//! - `skim`: the chunked parser over a streamed SSE body of 100 chunks.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use spillway::http::chunked::ChunkedParser;
use spillway::http::limits::MAX_HEADERS;
use spillway::http::limits::defaults::{MAX_BODY_BYTES, MAX_HEADER_BYTES};
use spillway::http::request::{RequestHead, parse_request};
use spillway::http::response::{ResponseHead, parse_response};
use spillway::http::sse::SseCounter;
use spillway::route::peek::peek;

/// 17 fields, in the order openai-python 1.x (over httpx) writes them.
const OPENAI_REQUEST_HEAD: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\n\
Host: spillway.internal:8000\r\n\
Accept-Encoding: gzip, deflate\r\n\
Connection: keep-alive\r\n\
Accept: application/json\r\n\
Content-Type: application/json\r\n\
User-Agent: OpenAI/Python 1.82.0\r\n\
X-Stainless-Lang: python\r\n\
X-Stainless-Package-Version: 1.82.0\r\n\
X-Stainless-OS: Linux\r\n\
X-Stainless-Arch: x64\r\n\
X-Stainless-Runtime: CPython\r\n\
X-Stainless-Runtime-Version: 3.12.3\r\n\
Authorization: Bearer sk-proj-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ\r\n\
X-Stainless-Async: false\r\n\
x-stainless-retry-count: 0\r\n\
x-stainless-read-timeout: 600\r\n\
Content-Length: 187\r\n\r\n";

/// What vLLM's OpenAI server (uvicorn) answers to `"stream": true`.
const VLLM_SSE_RESPONSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\n\
date: Tue, 14 Apr 2026 10:00:00 GMT\r\n\
server: uvicorn\r\n\
content-type: text/event-stream; charset=utf-8\r\n\
x-request-id: chatcmpl-5f0c2a8e9b7d4c1f8a6e3b2d1c0f9e8a\r\n\
transfer-encoding: chunked\r\n\r\n";

const MODEL: &str = "Qwen/Qwen3-0.6B";

fn heads(c: &mut Criterion) {
    let mut g = c.benchmark_group("head");
    let mut req = RequestHead::default();
    g.throughput(Throughput::Bytes(OPENAI_REQUEST_HEAD.len() as u64));
    g.bench_function("parse_request/openai_chat_17_fields", |b| {
        b.iter(|| {
            let done = parse_request(
                black_box(OPENAI_REQUEST_HEAD),
                MAX_HEADER_BYTES,
                MAX_BODY_BYTES as u64,
                &mut req,
            );
            black_box((done, req.head_len))
        })
    });
    // The same head without its `Connection: keep-alive` field (16 fields): what the
    // Connection-named pass costs when there is nothing to name.
    let no_connection = String::from_utf8(OPENAI_REQUEST_HEAD.to_vec())
        .unwrap()
        .replace("Connection: keep-alive\r\n", "");
    g.throughput(Throughput::Bytes(no_connection.len() as u64));
    g.bench_function("parse_request/openai_chat_16_fields_no_connection", |b| {
        b.iter(|| {
            let done = parse_request(
                black_box(no_connection.as_bytes()),
                MAX_HEADER_BYTES,
                MAX_BODY_BYTES as u64,
                &mut req,
            );
            black_box((done, req.head_len))
        })
    });
    // The most fields a head may carry (96), one of them `Connection: keep-alive`.
    let mut wide =
        String::from("POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\n");
    for i in 0..MAX_HEADERS - 2 {
        wide.push_str(&format!("X-Trace-{i}: {i:08x}\r\n"));
    }
    wide.push_str("\r\n");
    assert_eq!(
        parse_request(wide.as_bytes(), MAX_HEADER_BYTES, 1 << 30, &mut req),
        Ok(true)
    );
    assert_eq!(req.headers.len, MAX_HEADERS);
    g.throughput(Throughput::Bytes(wide.len() as u64));
    g.bench_function("parse_request/96_fields_with_connection", |b| {
        b.iter(|| {
            let done = parse_request(
                black_box(wide.as_bytes()),
                MAX_HEADER_BYTES,
                MAX_BODY_BYTES as u64,
                &mut req,
            );
            black_box((done, req.head_len))
        })
    });
    let wide_plain = wide.replace("Connection: keep-alive", "X-Trace-zz: keep-alive");
    g.throughput(Throughput::Bytes(wide_plain.len() as u64));
    g.bench_function("parse_request/96_fields_no_connection", |b| {
        b.iter(|| {
            let done = parse_request(
                black_box(wide_plain.as_bytes()),
                MAX_HEADER_BYTES,
                MAX_BODY_BYTES as u64,
                &mut req,
            );
            black_box((done, req.head_len))
        })
    });
    // A head naming more than MAX_CONNECTION_OPTIONS fields in `Connection` is refused:
    // 95 `Connection` fields of 39 tokens each, just under 16 KiB, stops at the first.
    let tokens: Vec<String> = (0..39).map(|t| format!("x{t:02}")).collect();
    let mut hostile = String::from("POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n");
    for _ in 0..MAX_HEADERS - 1 {
        hostile.push_str(&format!("Connection: {}\r\n", tokens.join(",")));
    }
    hostile.push_str("\r\n");
    assert!(hostile.len() <= MAX_HEADER_BYTES, "{}", hostile.len());
    assert!(parse_request(hostile.as_bytes(), MAX_HEADER_BYTES, 1 << 30, &mut req).is_err());
    // The worst head still accepted: 96 fields, one `Connection` naming 16 of them.
    let named: Vec<String> = (0..16).map(|t| format!("x-trace-{t}")).collect();
    let widest = wide.replace(
        "Connection: keep-alive",
        &format!("Connection: {}", named.join(",")),
    );
    assert_eq!(
        parse_request(widest.as_bytes(), MAX_HEADER_BYTES, 1 << 30, &mut req),
        Ok(true)
    );
    g.throughput(Throughput::Bytes(widest.len() as u64));
    g.bench_function("parse_request/96_fields_16_connection_options", |b| {
        b.iter(|| {
            let done = parse_request(
                black_box(widest.as_bytes()),
                MAX_HEADER_BYTES,
                MAX_BODY_BYTES as u64,
                &mut req,
            );
            black_box((done, req.head_len))
        })
    });
    g.throughput(Throughput::Bytes(hostile.len() as u64));
    g.bench_function("parse_request/95_connection_fields_16KiB", |b| {
        b.iter(|| {
            let done = parse_request(
                black_box(hostile.as_bytes()),
                MAX_HEADER_BYTES,
                MAX_BODY_BYTES as u64,
                &mut req,
            );
            black_box((done, req.head_len))
        })
    });
    g.throughput(Throughput::Bytes(OPENAI_REQUEST_HEAD.len() as u64));
    // Baseline: httparse alone into the same 96-slot stack array (no offsets, no framing,
    // no forwarding mask).
    g.bench_function("httparse_request_only/openai_chat_17_fields", |b| {
        b.iter(|| {
            let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut r = httparse::Request::new(&mut fields);
            black_box(
                r.parse(black_box(OPENAI_REQUEST_HEAD))
                    .map(|s| s.is_complete()),
            )
        })
    });
    assert_eq!(
        parse_request(OPENAI_REQUEST_HEAD, MAX_HEADER_BYTES, 1 << 30, &mut req),
        Ok(true)
    );
    assert_eq!(req.headers.len, 17);

    let mut resp = ResponseHead::default();
    g.throughput(Throughput::Bytes(VLLM_SSE_RESPONSE_HEAD.len() as u64));
    g.bench_function("parse_response/vllm_sse", |b| {
        b.iter(|| {
            let done = parse_response(
                black_box(VLLM_SSE_RESPONSE_HEAD),
                MAX_HEADER_BYTES,
                false,
                &mut resp,
            );
            black_box((done, resp.head_len))
        })
    });
    g.bench_function("httparse_response_only/vllm_sse", |b| {
        b.iter(|| {
            let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut r = httparse::Response::new(&mut fields);
            black_box(
                r.parse(black_box(VLLM_SSE_RESPONSE_HEAD))
                    .map(|s| s.is_complete()),
            )
        })
    });
    assert_eq!(
        parse_response(VLLM_SSE_RESPONSE_HEAD, MAX_HEADER_BYTES, false, &mut resp),
        Ok(true)
    );
    assert!(resp.event_stream);
    g.finish();
}

/// A chat body of exactly `target` bytes (when `target` exceeds the fixed part): a system
/// and a user message whose text carries the escapes a JSON encoder writes (`\n`, `\"`,
/// `\u00e9`), then the usual sampling fields. `model` is the first key or the last one.
fn chat_body(target: usize, model_first: bool) -> Vec<u8> {
    const TEXT: &str = "Summarise the following log excerpt.\\n\\\"ERROR\\\" lines matter most; \
                        caf\\u00e9 ordering is irrelevant. ";
    let build = |content: &str| {
        let model = format!(r#""model":"{MODEL}""#);
        let rest = format!(
            r#""messages":[{{"role":"system","content":"You are terse."}},{{"role":"user","content":"{content}"}}],"stream":true,"max_tokens":256,"temperature":0.7"#
        );
        let body = if model_first {
            format!("{{{model},{rest}}}")
        } else {
            format!("{{{rest},{model}}}")
        };
        body.into_bytes()
    };
    let room = target.saturating_sub(build("").len());
    let mut content = TEXT.repeat(room / TEXT.len());
    content.push_str(&"a".repeat(room - content.len()));
    build(&content)
}

#[derive(serde::Deserialize)]
struct ModelOnly<'a> {
    #[serde(borrow)]
    model: &'a str,
}

fn scanner(c: &mut Criterion) {
    let mut g = c.benchmark_group("peek");
    for (label, size) in [("200B", 200), ("8KiB", 8 * 1024), ("256KiB", 256 * 1024)] {
        for model_first in [true, false] {
            let body = chat_body(size, model_first);
            assert_eq!(body.len(), size);
            let place = if model_first { "first" } else { "last" };
            let id = format!("{label}/model_{place}");
            // Both must agree on the input, or the comparison is meaningless.
            let p = peek(&body).unwrap();
            assert_eq!(p.model.unwrap().raw, MODEL.as_bytes());
            let s: ModelOnly<'_> = serde_json::from_slice(&body).unwrap();
            assert_eq!(s.model, MODEL);

            g.throughput(Throughput::Bytes(body.len() as u64));
            g.bench_with_input(BenchmarkId::new("spillway_peek", &id), &body, |b, body| {
                b.iter(|| black_box(peek(black_box(body)).map(|p| p.model)))
            });
            g.bench_with_input(
                BenchmarkId::new("serde_json_borrowed", &id),
                &body,
                |b, body| {
                    b.iter(|| {
                        black_box(
                            serde_json::from_slice::<ModelOnly<'_>>(black_box(body))
                                .map(|m| m.model.len()),
                        )
                    })
                },
            );
        }
    }
    g.finish();
}

/// 100 chunks of a vLLM chat stream (one token per event, as vLLM writes them), then
/// `data: [DONE]` and the last chunk.
fn sse_stream(chunks: usize) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
    let mut wire = Vec::new();
    let mut pieces = Vec::new();
    for i in 0..chunks {
        let start = wire.len();
        let event = if i + 1 < chunks {
            format!(
                "data: {{\"id\":\"chatcmpl-5f0c2a8e9b7d4c1f8a6e3b2d1c0f9e8a\",\"object\":\"chat.completion.chunk\",\"created\":1776160800,\"model\":\"{MODEL}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" tok{i}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
            )
        } else {
            "data: [DONE]\n\n".to_string()
        };
        wire.extend_from_slice(format!("{:x}\r\n", event.len()).as_bytes());
        wire.extend_from_slice(event.as_bytes());
        wire.extend_from_slice(b"\r\n");
        if i + 1 == chunks {
            wire.extend_from_slice(b"0\r\n\r\n");
        }
        pieces.push(start..wire.len());
    }
    (wire, pieces)
}

fn chunked(c: &mut Criterion) {
    let (wire, pieces) = sse_stream(100);
    let mut g = c.benchmark_group("skim");
    g.throughput(Throughput::Bytes(wire.len() as u64));

    // The whole body in one buffer: the parser's own cost per byte and per chunk.
    g.bench_function("sse_100_chunks/one_buffer", |b| {
        b.iter(|| {
            let mut p = ChunkedParser::new();
            let mut data = 0usize;
            let r = p.skim(black_box(&wire), |d| data += d.len());
            black_box((r, data))
        })
    });
    // One read per chunk, as a token stream arrives: 101 calls per stream.
    g.bench_function("sse_100_chunks/one_read_per_chunk", |b| {
        b.iter(|| {
            let mut p = ChunkedParser::new();
            let mut data = 0usize;
            for r in &pieces {
                let got = p.skim(black_box(&wire[r.clone()]), |d| data += d.len());
                black_box(got.ok());
            }
            black_box(data)
        })
    });
    // The same with SSE event counting, which `track_output_blocks` adds on each piece.
    g.bench_function("sse_100_chunks/one_read_per_chunk+sse_count", |b| {
        b.iter(|| {
            let mut p = ChunkedParser::new();
            let mut sse = SseCounter::default();
            let mut events = 0u64;
            for r in &pieces {
                let got = p.skim(black_box(&wire[r.clone()]), |d| events += sse.feed(d));
                black_box(got.ok());
            }
            black_box(events)
        })
    });
    g.finish();

    // Sanity: the whole stream parses, ends, and holds 100 events.
    let mut p = ChunkedParser::new();
    let mut sse = SseCounter::default();
    let mut events = 0;
    assert_eq!(
        p.skim(&wire, |d| events += sse.feed(d)),
        Ok((wire.len(), true))
    );
    assert_eq!(events, 100);
}

criterion_group!(benches, heads, scanner, chunked);
criterion_main!(benches);
