//! NATS server operations (`fleet::nats::proto::parse`) from arbitrary bytes, the stream
//! cut at arbitrary points (two control bytes, as `chunked` and `codec`; the top bit of
//! the second picks a tiny payload bound, 0..63 bytes, instead of the default 1 MiB).
//! Every cut reads the same operations and ends the same way as one read of the whole
//! stream; each operation consumes 1..=buffered bytes; a payload stays within the bound;
//! a buffer that still asks for more holds no complete control line over the limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway::fuzzing::nats_proto::{DEFAULT_MAX_PAYLOAD, MAX_CONTROL_LINE, ServerOp, parse};
use spillway_fuzz::{Feed, Pieces, control};

/// What a stream reads as: its operations, then how it stopped.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    ops: Vec<String>,
    end: Result<usize, String>,
}

/// Parses every complete operation of `buf[*pos..]`; `Err` on the first refusal.
fn drain(buf: &[u8], pos: &mut usize, max: usize, ops: &mut Vec<String>) -> Result<(), String> {
    loop {
        let rest = &buf[*pos..];
        match parse(rest, max) {
            Ok(Some((op, used))) => {
                assert!(
                    used >= 1 && used <= rest.len(),
                    "consumed {used} of {}",
                    rest.len()
                );
                if let ServerOp::Msg { payload, .. } = &op {
                    assert!(payload.len() <= max);
                }
                ops.push(format!("{op:?}"));
                *pos += used;
            }
            Ok(None) => {
                let line_end = rest.iter().position(|&b| b == b'\n');
                assert!(line_end.is_some() || rest.len() <= MAX_CONTROL_LINE + 1);
                assert!(rest.len() <= MAX_CONTROL_LINE + 2 + max + 2);
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn read(stream: &[u8], pieces: Pieces, max: usize) -> Outcome {
    let mut feed = Feed::new(stream, pieces);
    let mut buf = Vec::new();
    let mut pos = 0;
    let mut ops = Vec::new();
    while let Some(piece) = feed.next_piece() {
        buf.extend_from_slice(piece);
        if let Err(e) = drain(&buf, &mut pos, max, &mut ops) {
            return Outcome { ops, end: Err(e) };
        }
    }
    Outcome {
        ops,
        end: Ok(buf.len() - pos),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((ctl, stream)) = control(data) else {
        return;
    };
    let max = if ctl[1] & 0x80 != 0 {
        usize::from(ctl[1] & 0x3f)
    } else {
        DEFAULT_MAX_PAYLOAD
    };
    let whole = read(stream, Pieces::whole(), max);
    let cut = read(stream, Pieces::new(ctl), max);
    assert_eq!(whole, cut);
});
