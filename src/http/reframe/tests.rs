use super::*;
use crate::http::chunked::Dechunker;

/// Runs `wire` (the upstream body bytes, then maybe a close) through a reframer, fed in
/// pieces of `split` bytes as reads would bring them: what the client got, whether the
/// body completed, and the bytes left over past its end.
fn relay(
    upstream: BodyFraming,
    client: ClientFraming,
    wire: &[u8],
    close: bool,
    split: usize,
) -> (Vec<u8>, bool, usize) {
    let mut r = Reframer::new(upstream, client, true);
    let (mut got, mut pending) = (Vec::new(), Vec::new());
    let mut fed = 0;
    while fed < wire.len() && !r.is_done() {
        let end = (fed + split).min(wire.len());
        pending.extend_from_slice(&wire[fed..end]);
        fed = end;
        let mut out = Vec::new();
        let p = r.advance(&pending, &mut out, |_| {}).unwrap();
        if p.direct {
            got.extend_from_slice(&pending[..p.take]);
        }
        got.extend_from_slice(&out);
        pending.drain(..p.take);
    }
    if close && !r.is_done() {
        let mut out = Vec::new();
        if r.eof(&mut out).is_ok() {
            got.extend_from_slice(&out);
        }
    }
    let left = pending.len() + wire.len() - fed;
    (got, r.is_done(), left)
}

const CHUNKED: &[u8] = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n";

#[test]
fn every_framing_pair_at_every_split() {
    use BodyFraming as U;
    use ClientFraming as C;
    // (upstream, client, wire, close, what the client gets, complete)
    type Case<'a> = (U, C, &'a [u8], bool, &'a [u8], bool);
    let cases: &[Case] = &[
        (U::Chunked, C::Chunked, CHUNKED, false, CHUNKED, true),
        (U::Chunked, C::Dechunk, CHUNKED, false, b"hello world", true),
        (U::Length(5), C::Length(5), b"hello", false, b"hello", true),
        (U::UntilClose, C::UntilClose, b"hello", true, b"hello", true),
        (U::None, C::None, b"", false, b"", true),
    ];
    for &(up, client, wire, close, want, complete) in cases {
        for split in 1..=wire.len().max(1) {
            let (got, done, left) = relay(up, client, wire, close, split);
            assert_eq!(got, want, "{up:?} → {client:?}, split {split}");
            assert_eq!(
                (done, left),
                (complete, 0),
                "{up:?} → {client:?}, split {split}"
            );
        }
    }
}

#[test]
fn a_rechunked_body_decodes_to_the_upstream_payload() {
    for split in 1..=11 {
        let (mut got, done, _) = relay(
            BodyFraming::UntilClose,
            ClientFraming::Rechunk,
            b"hello world",
            true,
            split,
        );
        assert!(done);
        assert!(got.ends_with(b"0\r\n\r\n"), "split {split}");
        let len = got.len();
        let mut d = Dechunker::new(0);
        assert!(d.decode(&mut got, len, 1 << 20).unwrap(), "split {split}");
        assert_eq!(
            (&got[..d.out], d.raw),
            (&b"hello world"[..], len),
            "split {split}"
        );
    }
}

#[test]
fn bytes_past_the_message_are_not_taken() {
    let mut wire = CHUNKED.to_vec();
    wire.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\nSTALE");
    let (got, done, left) = relay(
        BodyFraming::Chunked,
        ClientFraming::Chunked,
        &wire,
        false,
        7,
    );
    assert_eq!((got.as_slice(), done), (CHUNKED, true));
    assert_eq!(left, wire.len() - CHUNKED.len());
    let (got, done, left) = relay(
        BodyFraming::Length(5),
        ClientFraming::Length(5),
        b"helloSTALE",
        false,
        3,
    );
    assert_eq!((got.as_slice(), done, left), (&b"hello"[..], true, 5));
}

#[test]
fn a_body_cut_short_is_not_complete() {
    for (up, client) in [
        (BodyFraming::Chunked, ClientFraming::Chunked),
        (BodyFraming::Chunked, ClientFraming::Dechunk),
        (BodyFraming::Length(99), ClientFraming::Length(99)),
    ] {
        let (got, done, _) = relay(up, client, &CHUNKED[..12], true, 4);
        assert!(!done, "{up:?}");
        assert!(!got.ends_with(b"0\r\n\r\n"), "{up:?}: {got:?}");
    }
}

#[test]
fn invalid_framing_changes_nothing() {
    let mut r = Reframer::new(BodyFraming::Chunked, ClientFraming::Dechunk, true);
    let mut out = b"head".to_vec();
    assert!(r.advance(b"3\r\nabc\r\nzz\r\n", &mut out, |_| {}).is_err());
    assert_eq!(out, b"head");
    // The state is where the client's view is: nothing was taken.
    let p = r.advance(b"3\r\nabc\r\n", &mut out, |_| {}).unwrap();
    assert_eq!((p.take, out.as_slice()), (8, &b"headabc"[..]));
}

/// Feeds `wire` whole, then breaks the stream: what the client got in all.
fn broken(upstream: BodyFraming, client: ClientFraming, wire: &[u8], sse: bool) -> Vec<u8> {
    let mut r = Reframer::new(upstream, client, sse);
    let mut out = Vec::new();
    let p = r.advance(wire, &mut out, |_| {}).unwrap();
    let mut got = if p.direct {
        wire[..p.take].to_vec()
    } else {
        Vec::new()
    };
    got.append(&mut out);
    r.fail(&mut got, Break::Failed);
    got
}

#[test]
fn a_broken_event_stream_ends_with_an_error_event_where_framing_allows() {
    let event = Break::Failed.event();
    let ev = b"data: {\"a\":1}\n\n";
    let chunk_ev = b"f\r\ndata: {\"a\":1}\n\n\r\n";
    let with = |prefix: &[u8], tail: &[u8]| [prefix, tail].concat();
    let mut event_chunk = Vec::new();
    chunk(&mut event_chunk, event);
    let mut lf_event_chunk = Vec::new();
    chunk_of(&mut lf_event_chunk, &[b"\n", event]);
    use BodyFraming as U;
    use ClientFraming as C;
    // (upstream, client, wire so far, is SSE, what the client got in all)
    type Case<'a> = (U, C, &'a [u8], bool, Vec<u8>);
    let cases: Vec<Case> = vec![
        // Between chunks, after a whole event: the event as one more chunk, no last chunk.
        (
            U::Chunked,
            C::Chunked,
            chunk_ev,
            true,
            with(chunk_ev, &event_chunk),
        ),
        // A chunk's data complete, its CRLF not yet read: the CRLF first.
        (U::Chunked, C::Chunked, &chunk_ev[..18], true, {
            with(&chunk_ev[..18], &with(b"\r\n", &event_chunk))
        }),
        // Mid-chunk: nothing can be added.
        (
            U::Chunked,
            C::Chunked,
            &chunk_ev[..10],
            true,
            chunk_ev[..10].to_vec(),
        ),
        // One line break after a data line: the event needs one more first.
        (
            U::Chunked,
            C::Chunked,
            b"e\r\ndata: {\"a\":1}\n\r\n",
            true,
            { with(b"e\r\ndata: {\"a\":1}\n\r\n", &lf_event_chunk) },
        ),
        // Not an event stream: nothing is added.
        (U::Chunked, C::Chunked, chunk_ev, false, chunk_ev.to_vec()),
        (U::UntilClose, C::Rechunk, ev, true, {
            let mut v = Vec::new();
            chunk(&mut v, ev);
            with(&v, &event_chunk)
        }),
        // Mid-line: nothing.
        (U::UntilClose, C::Rechunk, b"data: {", true, {
            let mut v = Vec::new();
            chunk(&mut v, b"data: {");
            v
        }),
        (U::Chunked, C::Dechunk, chunk_ev, true, with(ev, event)),
        (U::UntilClose, C::UntilClose, ev, true, with(ev, event)),
        // A length the client counts on: nothing.
        (U::Length(99), C::Length(99), ev, true, ev.to_vec()),
    ];
    for (up, client, wire, sse, want) in cases {
        let got = broken(up, client, wire, sse);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "{up:?} → {client:?} after {:?}",
            String::from_utf8_lossy(wire)
        );
        assert!(!got.ends_with(b"0\r\n\r\n"));
    }
}

#[test]
fn newlines_across_pieces() {
    assert_eq!(trailing_newlines(0, b"data: x\n"), 1);
    assert_eq!(trailing_newlines(1, b"\n"), 2);
    assert_eq!(trailing_newlines(1, b"\r\n"), 2);
    assert_eq!(trailing_newlines(2, b"x"), 0);
    assert_eq!(trailing_newlines(1, b""), 1);
    assert_eq!(trailing_newlines(0, b"a\r\n\r\n"), 2);
}
