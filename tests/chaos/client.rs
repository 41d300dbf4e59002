//! The clients: one request after another on a keep-alive connection while it lasts, and
//! what they check in every byte that comes back.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use socket2::SockRef;
use spillway_testkit::*;

use crate::{ANSWER_WITHIN, PER_CLIENT, is_timeout, ms};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A whole response with this status.
    Answered(u16),
    /// Closed or reset by the proxy before the response was whole.
    Closed,
    /// The client left.
    Left,
}

pub struct Record {
    pub tag: String,
    pub outcome: Outcome,
    pub left_at: Option<Instant>,
}

/// A whole response.
struct Whole {
    status: u16,
    close: bool,
    sse: bool,
    body: Vec<u8>,
    /// Bytes it took, head and body.
    len: usize,
}

enum Parse {
    /// More to come; the (de-chunked) body so far.
    Partial(Vec<u8>),
    Whole(Whole),
}

enum Got {
    More,
    Closed,
    Deadline,
}

/// A completion request tagged `tag` (its `user`), with a prompt of `pad` bytes; its body
/// in two chunks when `chunked`.
pub fn request(tag: &str, stream: bool, pad: usize, chunked: bool) -> Vec<u8> {
    let prompt = "x".repeat(pad);
    let body = format!(r#"{{"model":"m","user":"{tag}","stream":{stream},"prompt":"{prompt}"}}"#);
    if !chunked {
        return post("/v1/completions", &body);
    }
    let (a, b) = body.split_at(body.len() / 2);
    let head = "POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n";
    let mut raw = format!("{head}transfer-encoding: chunked\r\n\r\n").into_bytes();
    raw.extend_from_slice(&chunk(a));
    raw.extend_from_slice(&chunk(b));
    raw.extend_from_slice(b"0\r\n\r\n");
    raw
}

pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        let _ = stream.set_nodelay(true);
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends `raw` and reads its response: see [`Conn::receive`].
    pub fn exchange(
        &mut self,
        tag: &str,
        raw: &[u8],
        leave: Option<(Duration, bool)>,
    ) -> (Record, bool, Option<String>) {
        if self.stream.write_all(raw).is_err() {
            return (closed(tag), false, None);
        }
        self.receive(tag, leave, true)
    }

    /// Reads the response to `tag`, or leaves after `leave.0` (with a reset when
    /// `leave.1`); `last` when no other response is due, so that bytes past this one are
    /// a problem. Returns what happened, whether the connection can carry the next
    /// request, and what was wrong with what arrived.
    pub fn receive(
        &mut self,
        tag: &str,
        leave: Option<(Duration, bool)>,
        last: bool,
    ) -> (Record, bool, Option<String>) {
        let deadline = Instant::now() + leave.map_or(ANSWER_WITHIN, |l| l.0);
        let record = |outcome, left_at| Record {
            tag: tag.to_string(),
            outcome,
            left_at,
        };
        loop {
            let partial = match parse(&self.buf) {
                Err(e) => return (record(Outcome::Closed, None), false, Some(e)),
                Ok(Parse::Whole(w)) => {
                    // Bytes past the last response: a second one spliced on, unasked for.
                    let extra = last && self.buf.len() > w.len;
                    self.buf.drain(..w.len);
                    let problem = match extra {
                        true => Some("bytes after the response".to_string()),
                        false => check_whole(tag, &w).err(),
                    };
                    let keep = !w.close && !extra;
                    return (record(Outcome::Answered(w.status), None), keep, problem);
                }
                Ok(Parse::Partial(body)) => body,
            };
            match self.read_more(deadline) {
                Got::More => {}
                Got::Closed => {
                    let problem = check_ids(tag, &partial, false).err();
                    return (record(Outcome::Closed, None), false, problem);
                }
                Got::Deadline => {
                    let Some((_, reset)) = leave else {
                        let hang = format!("no answer within {ANSWER_WITHIN:?}");
                        return (record(Outcome::Closed, None), false, Some(hang));
                    };
                    if reset {
                        let _ = SockRef::from(&self.stream).set_linger(Some(Duration::ZERO));
                    }
                    let problem = check_ids(tag, &partial, false).err();
                    return (record(Outcome::Left, Some(Instant::now())), false, problem);
                }
            }
        }
    }

    fn read_more(&mut self, deadline: Instant) -> Got {
        let now = Instant::now();
        if now >= deadline {
            return Got::Deadline;
        }
        let _ = self.stream.set_read_timeout(Some(deadline - now));
        let mut tmp = [0u8; 16384];
        match self.stream.read(&mut tmp) {
            Ok(0) => Got::Closed,
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                Got::More
            }
            Err(e) if is_timeout(&e) => Got::More,
            Err(_) => Got::Closed,
        }
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// How far the response in `buf` has arrived; an error when it is not HTTP/1.1 as
/// written by the RFC (a bad head, bad chunk framing, no framing at all).
fn parse(buf: &[u8]) -> Result<Parse, String> {
    let mut hs = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut hs);
    let head = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(Parse::Partial(Vec::new())),
        Err(e) => return Err(format!("bad response head ({e}): {:?}", lossy(buf))),
    };
    let header = |name: &str| {
        let h = r.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name));
        h.map(|h| lossy(h.value).to_ascii_lowercase())
    };
    let status = r.code.unwrap_or(0);
    let close = header("connection").is_some_and(|v| v.contains("close"));
    let sse = header("content-type").is_some_and(|v| v.contains("text/event-stream"));
    let rest = &buf[head..];
    let (body, used) = if let Some(cl) = header("content-length") {
        let cl: usize = cl.parse().map_err(|_| format!("content-length {cl}"))?;
        if rest.len() < cl {
            return Ok(Parse::Partial(rest.to_vec()));
        }
        (rest[..cl].to_vec(), cl)
    } else if header("transfer-encoding").as_deref() == Some("chunked") {
        match dechunk(rest)? {
            (body, None) => return Ok(Parse::Partial(body)),
            (body, Some(used)) => (body, used),
        }
    } else {
        return Err(format!("no framing: {:?}", lossy(&buf[..head])));
    };
    let len = head + used;
    Ok(Parse::Whole(Whole {
        status,
        close,
        sse,
        body,
        len,
    }))
}

/// The body so far of a chunked body and, once its last chunk is in, the bytes it took.
fn dechunk(b: &[u8]) -> Result<(Vec<u8>, Option<usize>), String> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let (n, size) = match httparse::parse_chunk_size(&b[at..]) {
            Ok(httparse::Status::Complete((n, size))) => (n, size as usize),
            Ok(httparse::Status::Partial) => return Ok((body, None)),
            Err(_) => return Err(format!("bad chunk size line: {:?}", lossy(b))),
        };
        let data = &b[at + n..];
        if data.len() < size + 2 {
            body.extend_from_slice(&data[..data.len().min(size)]);
            return Ok((body, None));
        }
        if &data[size..size + 2] != b"\r\n" {
            return Err(format!("chunk data without its CRLF: {:?}", lossy(b)));
        }
        body.extend_from_slice(&data[..size]);
        at += n + size + 2;
        if size == 0 {
            return Ok((body, Some(at)));
        }
    }
}

/// A whole response is the worker's, complete, for this request (200 and a relayed
/// 500), or one of Spillway's own answers (a 500 among them: the worker's failure was
/// retried and no other worker could take it, docs/behaviour.md §22.5).
fn check_whole(tag: &str, w: &Whole) -> Result<(), String> {
    let relayed = w.status == 200 || lossy(&w.body).contains("\"id\":\"");
    match w.status {
        200 | 500 if relayed => {
            check_ids(tag, &w.body, true)?;
            let complete = match w.sse {
                true => w.body.ends_with(b"data: [DONE]\n\n"),
                false => serde_json::from_slice::<serde_json::Value>(&w.body).is_ok(),
            };
            match complete {
                true => Ok(()),
                false => Err(format!("{} incomplete: {:?}", w.status, lossy(&w.body))),
            }
        }
        500 | 502 | 503 | 504 | 529 => {
            let v: serde_json::Value =
                serde_json::from_slice(&w.body).map_err(|e| e.to_string())?;
            match v["message"].is_string() {
                true => check_ids(tag, &w.body, false),
                false => Err(format!("{} without a message: {v}", w.status)),
            }
        }
        s => Err(format!("unexpected status {s}: {:?}", lossy(&w.body))),
    }
}

/// Every response id in `body` is the same one, of a response to `tag`, and its SSE
/// events come numbered 0, 1, 2... (none lost, repeated or out of order; the last one
/// may be cut off).
fn check_ids(tag: &str, body: &[u8], needed: bool) -> Result<(), String> {
    let text = lossy(body);
    let ids: Vec<&str> = (text.split("\"id\":\"").skip(1))
        .filter_map(|s| s.split_once('"').map(|(id, _)| id))
        .collect();
    let numbers: Vec<&str> = (text.split("\"n\":").skip(1))
        .filter_map(|s| s.split_once('}').map(|(n, _)| n))
        .collect();
    let in_order = numbers.iter().enumerate().all(|(i, n)| *n == i.to_string());
    let mine = format!("{tag}@");
    match ids.first() {
        None if needed => Err(format!("no response id: {text:?}")),
        None => Ok(()),
        Some(first) if !first.starts_with(&mine) => Err(format!("another's response: {text:?}")),
        Some(first) if ids.iter().any(|id| id != first) => Err(format!("spliced: {text:?}")),
        Some(_) if !in_order => Err(format!("events lost or out of order: {text:?}")),
        Some(_) => Ok(()),
    }
}

fn closed(tag: &str) -> Record {
    Record {
        tag: tag.to_string(),
        outcome: Outcome::Closed,
        left_at: None,
    }
}

/// One client: `PER_CLIENT` rounds on a keep-alive connection while it lasts. A round is
/// one request (a quarter with a chunked body), or two pipelined in one write (one in
/// ten that do not leave); one in six leaves after 0 to 200 ms (queued, running or
/// mid-stream), half of those with a reset. Returns what happened to each request, and
/// the problems seen.
pub fn client(addr: SocketAddr, t: u64, seed: u64) -> (Vec<Record>, Vec<String>) {
    let mut rng = Rng::new(seed ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let (mut records, mut problems) = (Vec::new(), Vec::new());
    let mut conn: Option<Conn> = None;
    for i in 0..PER_CLIENT {
        let mut tags = vec![format!("c{t}-{i}")];
        let pad = rng.below(3000) as usize;
        let mut raw = request(&tags[0], rng.below(2) == 0, pad, rng.below(4) == 0);
        let leave = (rng.below(6) == 0).then(|| (ms(rng.below(200)), rng.below(2) == 0));
        if leave.is_none() && rng.below(10) == 0 {
            tags.push(format!("c{t}-{i}b"));
            raw.extend(request(&tags[1], rng.below(2) == 0, 10, false));
        }
        let c = conn.get_or_insert_with(|| Conn::connect(addr));
        let mut keep = c.stream.write_all(&raw).is_ok();
        for (k, tag) in tags.iter().enumerate() {
            let (record, kept, problem) = match keep {
                true => c.receive(tag, leave, k + 1 == tags.len()),
                false => (closed(tag), false, None),
            };
            keep = kept;
            if let Some(p) = problem {
                problems.push(format!("{tag}: {p}"));
            }
            records.push(record);
        }
        if !keep {
            conn = None;
        }
        thread::sleep(ms(rng.below(40)));
    }
    (records, problems)
}
