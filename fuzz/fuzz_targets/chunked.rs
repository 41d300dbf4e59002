//! The chunked decoder in both directions over arbitrary bytes cut at arbitrary points:
//! de-chunking a request body in place (`Dechunker`) and skimming a passed-through
//! response body (`ChunkedParser::skim`, carrying unconsumed bytes over). Whatever the
//! cuts, both see the same payload, end at the same byte and fail alike as when the
//! bytes come at once; decoding never writes past what it read, a decoded-length bound
//! holds, the SSE counter counts the same across cuts, and a payload re-chunked as the
//! relay does decodes back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway::http::HttpError;
use spillway::http::chunked::{ChunkedParser, Dechunker};
use spillway::http::sse::SseCounter;
use spillway::http::write::{LAST_CHUNK, chunk};
use spillway_fuzz::{Feed, Pieces, control};

/// How a body ended: its payload and the bytes of the message, or not at all.
#[derive(Debug, PartialEq)]
enum End {
    Done { payload: Vec<u8>, raw: usize },
    Incomplete,
    Failed,
}

/// De-chunks in place as bytes arrive (the request direction).
fn in_place(stream: &[u8], pieces: Pieces, max_out: usize) -> Result<End, HttpError> {
    let mut buf = Vec::with_capacity(stream.len());
    let mut feed = Feed::new(stream, pieces);
    let mut d = Dechunker::new(0);
    while feed.read_into(&mut buf) {
        let filled = buf.len();
        let done = d.decode(&mut buf, filled, max_out)?;
        assert!(
            d.out <= d.raw && d.raw <= filled,
            "out {} raw {}",
            d.out,
            d.raw
        );
        assert!(d.out <= max_out);
        if done {
            return Ok(End::Done {
                payload: buf[..d.out].to_vec(),
                raw: d.raw,
            });
        }
    }
    Ok(End::Incomplete)
}

/// Skims as bytes arrive, keeping what was not consumed (the response direction).
fn skimmed(stream: &[u8], pieces: Pieces) -> (End, u64) {
    let mut feed = Feed::new(stream, pieces);
    let mut p = ChunkedParser::new();
    let (mut carried, mut payload, mut consumed) = (Vec::new(), Vec::new(), 0);
    let mut sse = SseCounter::default();
    let mut events = 0;
    while let Some(piece) = feed.next_piece() {
        carried.extend_from_slice(piece);
        let on_data = |d: &[u8]| {
            events += sse.feed(d);
            payload.extend_from_slice(d);
        };
        let Ok((used, end)) = p.skim(&carried, on_data) else {
            return (End::Failed, events);
        };
        assert!(used <= carried.len());
        consumed += used;
        carried.drain(..used);
        if end {
            assert!(p.is_done());
            return (
                End::Done {
                    payload,
                    raw: consumed,
                },
                events,
            );
        }
    }
    (End::Incomplete, events)
}

fn collapse(r: Result<End, HttpError>) -> End {
    r.unwrap_or(End::Failed)
}

fn rechunked(payload: &[u8], pieces: Pieces) {
    let mut wire = Vec::new();
    let mut feed = Feed::new(payload, pieces);
    while let Some(piece) = feed.next_piece() {
        chunk(&mut wire, piece);
    }
    wire.extend_from_slice(LAST_CHUNK);
    let back = in_place(&wire, Pieces::whole(), usize::MAX);
    let want = End::Done {
        payload: payload.to_vec(),
        raw: wire.len(),
    };
    assert_eq!(back, Ok(want));
}

fuzz_target!(|data: &[u8]| {
    let Some((ctl, stream)) = control(data) else {
        return;
    };
    let pieces = Pieces::new(ctl);
    let whole = collapse(in_place(stream, Pieces::whole(), usize::MAX));
    assert_eq!(
        collapse(in_place(stream, pieces.clone(), usize::MAX)),
        whole
    );
    let (skim, events) = skimmed(stream, pieces.clone());
    assert_eq!(skim, whole);

    // A bound on the decoded length: the same answer when it fits, 413 or an earlier
    // framing error when it does not.
    let max_out = usize::from(ctl[1]);
    let bounded = in_place(stream, pieces.clone(), max_out);
    match &whole {
        End::Done { payload, .. } if payload.len() > max_out => {
            assert_eq!(bounded, Err(HttpError::BodyTooLarge));
        }
        End::Done { payload, raw } => {
            let want = End::Done {
                payload: payload.clone(),
                raw: *raw,
            };
            assert_eq!(bounded, Ok(want));
        }
        _ => assert!(!matches!(bounded, Ok(End::Done { .. }))),
    }
    if let End::Done { payload, .. } = skim {
        let mut once = SseCounter::default();
        assert_eq!(once.feed(&payload), events);
        rechunked(&payload, pieces);
    }
});
