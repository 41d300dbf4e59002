//! A response body as the client gets it: the upstream's framing (a length, chunks, or
//! until the close) turned into the client's ([`ClientFraming`]), sans-io. Whatever the
//! two framings, the client gets the upstream's payload exactly, in its own framing, and
//! nothing of the upstream's framing that its own does not carry (no chunk lines inside
//! an HTTP/1.0 body, no bytes past the end of the message).
//!
//! When the upstream fails mid-body, the client must not see a clean end: no last chunk;
//! and for an event stream, where the framing allows it, a last event in OpenAI's
//! streaming error shape ([`Reframer::fail`]), so that clients raise instead of taking a
//! truncated answer as complete.

use super::chunked::{Boundary, ChunkedParser};
use super::write::{ClientFraming, LAST_CHUNK, chunk, chunk_of};
use super::{BodyFraming, HttpError};

/// Where the upstream body stands.
#[derive(Debug, Clone, Copy)]
enum Upstream {
    Length(u64),
    Chunked(ChunkedParser),
    UntilClose,
    Done,
}

/// What one [`Reframer::advance`] did with its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Bytes of the input that belong to the body (the rest is not read yet, or follows
    /// the message).
    pub take: usize,
    /// The client gets `input[..take]` as it is; otherwise what it gets was appended to
    /// `out`.
    pub direct: bool,
    /// The body is complete.
    pub done: bool,
}

/// Why a stream broke off after its head went to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Break {
    /// The worker closed, reset or sent invalid framing.
    Failed,
    /// The worker sent nothing for `upstream_stream_idle_timeout_ms`.
    Stalled,
}

impl Break {
    /// The last event of a broken event stream (OpenAI's streaming error shape, which the
    /// OpenAI SDKs raise as an `APIError`).
    pub fn event(self) -> &'static [u8] {
        match self {
            Break::Failed => {
                b"data: {\"error\":{\"message\":\"The worker's response broke off before its \
                  end\",\"type\":\"Bad Gateway\",\"param\":null,\"code\":502}}\n\n"
            }
            Break::Stalled => {
                b"data: {\"error\":{\"message\":\"The worker stopped sending for longer than \
                  upstream_stream_idle_timeout_ms\",\"type\":\"Gateway Timeout\",\"param\":null,\
                  \"code\":504}}\n\n"
            }
        }
    }
}

/// One response body on its way from the upstream to the client.
#[derive(Debug, Clone, Copy)]
pub struct Reframer {
    upstream: Upstream,
    client: ClientFraming,
    event_stream: bool,
    /// Line breaks ending the payload relayed so far, at most 2 (2: between events).
    newlines: u8,
}

impl Reframer {
    /// A body framed `upstream` for a client that gets it as `client`; `event_stream`: a
    /// `text/event-stream` response.
    pub fn new(upstream: BodyFraming, client: ClientFraming, event_stream: bool) -> Reframer {
        let upstream = match upstream {
            BodyFraming::None | BodyFraming::Length(0) => Upstream::Done,
            BodyFraming::Length(n) => Upstream::Length(n),
            BodyFraming::Chunked => Upstream::Chunked(ChunkedParser::new()),
            BodyFraming::UntilClose => Upstream::UntilClose,
        };
        Reframer {
            upstream,
            client,
            event_stream,
            newlines: 2,
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self.upstream, Upstream::Done)
    }

    /// Advances over `input`, the upstream bytes read so far past the head. What the
    /// client gets is `input[..take]` when the piece is `direct`, else appended to `out`
    /// (and for the last piece of a re-chunked body, the last chunk). `on_data` sees the
    /// payload. On an error nothing changed: `out` and the state are as before the call.
    pub fn advance(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<Piece, HttpError> {
        let mut next = *self;
        let out_len = out.len();
        let result = next.step(input, out, &mut on_data);
        match result {
            Ok(_) => *self = next,
            Err(_) => out.truncate(out_len),
        }
        result
    }

    fn step(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        on_data: &mut impl FnMut(&[u8]),
    ) -> Result<Piece, HttpError> {
        let dechunk = self.client == ClientFraming::Dechunk;
        let rechunk = self.client == ClientFraming::Rechunk;
        let newlines = &mut self.newlines;
        let mut seen = |d: &[u8]| {
            *newlines = trailing_newlines(*newlines, d);
            on_data(d);
        };
        let (take, done) = match &mut self.upstream {
            Upstream::Done => (0, true),
            Upstream::Length(remaining) => {
                let take = (*remaining).min(input.len() as u64) as usize;
                seen(&input[..take]);
                *remaining -= take as u64;
                (take, *remaining == 0)
            }
            Upstream::Chunked(parser) if dechunk => parser.skim(input, |d| {
                seen(d);
                out.extend_from_slice(d);
            })?,
            Upstream::Chunked(parser) => parser.skim(input, &mut seen)?,
            Upstream::UntilClose => {
                seen(input);
                if rechunk && !input.is_empty() {
                    chunk(out, input);
                }
                (input.len(), false)
            }
        };
        if done {
            self.finish(out);
        }
        Ok(Piece {
            take,
            direct: !(dechunk || rechunk),
            done,
        })
    }

    /// The upstream closed the connection. For a body delimited by the close that is its
    /// end (a re-chunked one gets its last chunk in `out`); for any other, the body is
    /// cut short: an error, and nothing is added.
    pub fn eof(&mut self, out: &mut Vec<u8>) -> Result<(), HttpError> {
        match self.upstream {
            Upstream::UntilClose => {
                self.finish(out);
                Ok(())
            }
            Upstream::Done => Ok(()),
            Upstream::Length(_) | Upstream::Chunked(_) => Err(HttpError::Malformed(
                "the worker closed the connection before the body's end",
            )),
        }
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        if self.client == ClientFraming::Rechunk && !self.is_done() {
            out.extend_from_slice(LAST_CHUNK);
        }
        self.upstream = Upstream::Done;
    }

    /// The stream broke off mid-body: appends to `out` the last event that tells an event
    /// stream's client so, where the client's framing and the payload so far allow one
    /// (between chunks, at the end of a line; never into a body of known length). Returns
    /// whether it did. Nothing ever ends the body cleanly: no last chunk follows.
    pub fn fail(&mut self, out: &mut Vec<u8>, why: Break) -> bool {
        let lead: &[u8] = match self.newlines {
            _ if !self.event_stream || self.is_done() => return false,
            0 => return false,
            1 => b"\n",
            _ => b"",
        };
        let event = why.event();
        match (self.client, self.upstream) {
            (ClientFraming::Chunked, Upstream::Chunked(parser)) => match parser.boundary() {
                Boundary::Chunk => chunk_of(out, &[lead, event]),
                Boundary::AfterData => {
                    out.extend_from_slice(b"\r\n");
                    chunk_of(out, &[lead, event]);
                }
                Boundary::None => return false,
            },
            (ClientFraming::Rechunk, _) => chunk_of(out, &[lead, event]),
            (ClientFraming::Dechunk | ClientFraming::UntilClose, _) => {
                out.extend_from_slice(lead);
                out.extend_from_slice(event);
            }
            _ => return false,
        }
        self.upstream = Upstream::Done;
        true
    }
}

/// The line breaks ending the payload after `data` follows a payload that ended with
/// `before` of them (CR is taken as part of a CRLF).
fn trailing_newlines(before: u8, data: &[u8]) -> u8 {
    let mut n = 0u8;
    for &b in data.iter().rev() {
        match b {
            b'\n' => n += 1,
            b'\r' => {}
            _ => return n.min(2),
        }
        if n >= 2 {
            return 2;
        }
    }
    (before + n).min(2)
}

#[cfg(test)]
mod tests;
