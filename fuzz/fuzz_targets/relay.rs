//! An upstream response (head and body) from arbitrary bytes, relayed as `proxy/relay.rs`
//! drives it without the I/O: the head parsed, the client's head written, the body passed
//! through `http::reframe::Reframer` piece by piece as reads would bring it, for an
//! HTTP/1.1 and an HTTP/1.0 client, until the body ends, fails or the bytes run out (the
//! worker closed); a stream that did not end is then broken off (`Reframer::fail`).
//!
//! What the client gets must parse back as one response whose body is exactly the
//! upstream's payload so far, in the client's framing: never a chunk line in an HTTP/1.0
//! body, never a byte past the upstream message's end, a clean end only when the
//! upstream's body was complete, and for a broken stream nothing after the break but one
//! well-framed error event.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway::http::BodyFraming;
use spillway::http::chunked::{ChunkedParser, Dechunker};
use spillway::http::limits::MAX_HEADERS;
use spillway::http::reframe::{Break, Reframer};
use spillway::http::response::{ResponseHead, parse_response};
use spillway::http::write::{ClientFraming, client_response_head};
use spillway_fuzz::{Feed, Pieces, control};

/// What the upstream's body says, read by a reference decoder from all of `body`.
#[derive(Debug, PartialEq)]
enum Upstream {
    /// The whole payload, and whether the message is complete (else the worker closed
    /// before its end).
    Payload(Vec<u8>, bool),
    /// The framing is invalid somewhere; the payload before the first invalid byte.
    Invalid(Vec<u8>),
}

fn reference(framing: BodyFraming, body: &[u8]) -> Upstream {
    match framing {
        BodyFraming::None => Upstream::Payload(Vec::new(), true),
        BodyFraming::Length(n) => {
            let k = body.len().min(usize::try_from(n).unwrap_or(usize::MAX));
            Upstream::Payload(body[..k].to_vec(), body.len() as u64 >= n)
        }
        BodyFraming::UntilClose => Upstream::Payload(body.to_vec(), true),
        BodyFraming::Chunked => {
            // Byte by byte, so that an error leaves the payload before it.
            let (mut payload, mut carried) = (Vec::new(), Vec::new());
            let mut p = ChunkedParser::new();
            for &b in body {
                carried.push(b);
                match p.skim(&carried, |d| payload.extend_from_slice(d)) {
                    Ok((_, true)) => return Upstream::Payload(payload, true),
                    Ok((used, false)) => drop(carried.drain(..used)),
                    Err(_) => return Upstream::Invalid(payload),
                }
            }
            Upstream::Payload(payload, p.is_done())
        }
    }
}

/// What the client got, relayed as the proxy does: its bytes, whether the reframer saw
/// the body complete, and whether it was broken off.
fn relay(
    buf: &[u8],
    resp: &ResponseHead,
    minor: u8,
    pieces: Pieces,
) -> Option<(Vec<u8>, bool, bool)> {
    let framing = resp.framing();
    let cf = ClientFraming::for_response(framing, minor);
    let mut got = Vec::new();
    let keep = cf.allows_keep_alive();
    client_response_head(&mut got, buf, resp, cf, b"rid", keep, minor);
    let head_len = got.len();
    let mut r = Reframer::new(framing, cf, resp.event_stream);
    let mut feed = Feed::new(&buf[resp.head_len..], pieces);
    let mut pending = Vec::new();
    loop {
        let mut out = Vec::new();
        let Ok(p) = r.advance(&pending, &mut out, |_| {}) else {
            // Invalid framing: before anything went out, a 502 instead (not relayed).
            if got.len() == head_len {
                return None;
            }
            let broke = r.fail(&mut got, Break::Failed);
            return Some((got, false, broke));
        };
        assert!(p.take <= pending.len());
        if p.direct {
            got.extend_from_slice(&pending[..p.take]);
        }
        got.extend_from_slice(&out);
        pending.drain(..p.take);
        if p.done {
            return Some((got, true, false));
        }
        if !feed.read_into(&mut pending) {
            let mut out = Vec::new();
            if r.eof(&mut out).is_ok() {
                got.extend_from_slice(&out);
                return Some((got, true, false));
            }
            let broke = r.fail(&mut got, Break::Failed);
            return Some((got, false, broke));
        }
    }
}

/// The body the client can read out of `got` (its head parsed back), and whether that
/// body was complete in the client's framing. Panics if the framing is not well-formed.
fn client_body(got: &[u8], closed: bool) -> (Vec<u8>, bool) {
    let mut back = ResponseHead::default();
    assert_eq!(parse_response(got, usize::MAX, false, &mut back), Ok(true));
    let body = &got[back.head_len..];
    match back.framing() {
        BodyFraming::None => {
            assert!(body.is_empty(), "a body where none may be");
            (Vec::new(), true)
        }
        BodyFraming::Length(n) => {
            assert!(body.len() as u64 <= n, "past the length");
            (body.to_vec(), body.len() as u64 == n)
        }
        BodyFraming::UntilClose => (body.to_vec(), closed),
        BodyFraming::Chunked => {
            let mut copy = body.to_vec();
            let mut d = Dechunker::new(0);
            let len = copy.len();
            let done = d
                .decode(&mut copy, len, usize::MAX)
                .expect("well-formed chunks");
            if done {
                assert_eq!(d.raw, len, "bytes after the last chunk");
            }
            (copy[..d.out].to_vec(), done)
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((ctl, stream)) = control(data) else {
        return;
    };
    let mut resp = ResponseHead::default();
    if parse_response(stream, 64 * 1024, false, &mut resp) != Ok(true) || resp.is_informational() {
        return;
    }
    // The client's head adds fields: near MAX_HEADERS it would pass our own parser's
    // bound when read back (the `response_head` target covers those heads).
    if resp.headers.len + 4 > MAX_HEADERS {
        return;
    }
    let upstream = reference(resp.framing(), &stream[resp.head_len..]);
    for minor in [1, 0] {
        let Some((got, done, broke)) = relay(stream, &resp, minor, Pieces::new(ctl)) else {
            assert!(
                matches!(upstream, Upstream::Invalid(_)),
                "a 502 for a valid body"
            );
            continue;
        };
        let (seen, clean) = client_body(&got, true);
        let framing = ClientFraming::for_response(resp.framing(), minor);
        let delimited = matches!(
            framing,
            ClientFraming::Chunked | ClientFraming::Rechunk | ClientFraming::Length(_)
        );
        if done {
            assert_eq!(
                upstream,
                Upstream::Payload(seen, true),
                "a complete body, exactly"
            );
            assert!(clean, "a complete body ends cleanly for the client");
            continue;
        }
        if delimited {
            assert!(!clean, "a broken body looks complete");
        }
        // Broken off: the payload so far, then at most the error event.
        if let Upstream::Payload(_, complete) = upstream {
            assert!(!complete, "broken off although complete");
        }
        let before = match seen.strip_suffix(Break::Failed.event()) {
            Some(before) if broke => before,
            _ => {
                assert!(!broke, "the error event is not last");
                seen.as_slice()
            }
        };
        let sent_as_is = |b: &[u8]| match &upstream {
            Upstream::Payload(payload, _) => b == payload.as_slice(),
            Upstream::Invalid(valid) => valid.starts_with(b),
        };
        let lead = broke
            && before
                .strip_suffix(b"\n".as_slice())
                .is_some_and(sent_as_is);
        assert!(
            sent_as_is(before) || lead,
            "the client got other bytes than the upstream's payload: {:?}",
            String::from_utf8_lossy(&seen)
        );
    }
});
