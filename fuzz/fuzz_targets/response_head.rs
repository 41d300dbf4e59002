//! An upstream response head from arbitrary bytes, after a HEAD request and after any
//! other: offsets stay inside the head, and the head written back to the client (for an
//! HTTP/1.1 and an HTTP/1.0 client) is itself a well-formed head with the same status and
//! the framing `ClientFraming` promises.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway::http::limits::MAX_HEADERS;
use spillway::http::response::{ResponseHead, parse_response};
use spillway::http::write::{ClientFraming, client_response_head};
use spillway::http::{BodyFraming, HttpError, Span};

fn within(span: Span, end: usize) {
    assert!(
        span.start <= span.end && span.end as usize <= end,
        "{span:?} past {end}"
    );
}

/// The head the client gets, parsed back.
fn relayed(buf: &[u8], resp: &ResponseHead, was_head: bool, client_minor: u8, keep: bool) {
    let framing = ClientFraming::for_response(resp.framing(), client_minor);
    let mut out = Vec::new();
    client_response_head(&mut out, buf, resp, framing, b"rid", keep, client_minor);
    let mut back = ResponseHead::default();
    let parsed = parse_response(&out, usize::MAX, was_head, &mut back);
    if parsed == Err(HttpError::HeaderTooLarge) {
        // The fields added to an upstream head near MAX_HEADERS take it past our own
        // parser's bound: still a well-formed head.
        let mut fields = [httparse::EMPTY_HEADER; 2 * MAX_HEADERS];
        let mut r = httparse::Response::new(&mut fields);
        assert_eq!(r.parse(&out), Ok(httparse::Status::Complete(out.len())));
        assert_eq!(r.code, Some(resp.status));
        return;
    }
    assert_eq!(parsed, Ok(true), "{:?}", String::from_utf8_lossy(&out));
    assert_eq!(back.head_len, out.len());
    assert_eq!(back.status, resp.status);
    let want = match framing {
        ClientFraming::None => BodyFraming::None,
        ClientFraming::Length(n) => BodyFraming::Length(n),
        ClientFraming::Chunked | ClientFraming::Rechunk => BodyFraming::Chunked,
        ClientFraming::UntilClose | ClientFraming::Dechunk => BodyFraming::UntilClose,
    };
    assert_eq!(back.framing(), want, "{:?}", String::from_utf8_lossy(&out));
    if !keep {
        assert!(!back.reusable);
    }
}

fn one(data: &[u8], was_head: bool) {
    let mut resp = ResponseHead::default();
    match parse_response(data, 64 * 1024, was_head, &mut resp) {
        Ok(true) => {
            let end = resp.head_len;
            assert!(end <= data.len());
            within(resp.reason, end);
            assert!(resp.headers.len <= MAX_HEADERS);
            for h in resp.headers.iter() {
                within(h.name, end);
                within(h.value, end);
            }
            let no_body = was_head || resp.status < 200 || matches!(resp.status, 204 | 304);
            if no_body {
                assert_eq!(resp.body, Some(BodyFraming::None));
            }
            if let BodyFraming::Length(n) = resp.framing() {
                assert!(n > 0);
            }
            for (minor, keep) in [(1, true), (1, false), (0, true), (0, false)] {
                relayed(data, &resp, was_head, minor, keep);
            }
        }
        Ok(false) => assert!(data.len() < 64 * 1024),
        Err(_) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    one(data, false);
    one(data, true);
});
