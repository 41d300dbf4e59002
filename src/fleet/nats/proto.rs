//! NATS's client protocol without I/O: [`parse`] reads one server operation from the front
//! of a buffer (incrementally: `Ok(None)` asks for more bytes), the `write_*` functions
//! append client operations to an output buffer. Bounds: a control line of at most
//! [`MAX_CONTROL_LINE`] bytes, a payload of at most the caller's `max_payload`; nothing is
//! allocated from what the server claims.

use super::NatsError;

/// The longest control line (without its CRLF) read or written: nats-server's default.
pub const MAX_CONTROL_LINE: usize = 4096;
/// The payload bound when the server's INFO names none: nats-server's default.
pub const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;
/// The most a server's INFO may raise the payload bound to (nats-server's own ceiling).
pub const MAX_PAYLOAD_CEILING: usize = 64 * 1024 * 1024;

pub const PING: &[u8] = b"PING\r\n";
pub const PONG: &[u8] = b"PONG\r\n";

/// One operation from the server, borrowing the buffer it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerOp<'a> {
    /// The JSON object after `INFO`.
    Info(&'a str),
    Msg {
        subject: &'a str,
        sid: u64,
        reply_to: Option<&'a str>,
        payload: &'a [u8],
    },
    Ping,
    Pong,
    Ok,
    /// The message of `-ERR '<msg>'`, without its quotes.
    Err(&'a str),
}

fn bad(what: impl Into<String>) -> NatsError {
    NatsError::Protocol(what.into())
}

/// Reads one operation from the front of `buf`: `Ok(None)` when more bytes are needed,
/// `Ok(Some((op, consumed)))` when one is complete, `Err` on bytes that are not NATS.
pub fn parse(buf: &[u8], max_payload: usize) -> Result<Option<(ServerOp<'_>, usize)>, NatsError> {
    let window = &buf[..buf.len().min(MAX_CONTROL_LINE + 2)];
    let Some(nl) = memchr::memchr(b'\n', window) else {
        if window.len() > MAX_CONTROL_LINE + 1 {
            return Err(bad("control line too long"));
        }
        return Ok(None);
    };
    if nl == 0 || buf[nl - 1] != b'\r' {
        return Err(bad("control line not ended by CRLF"));
    }
    let line = &buf[..nl - 1];
    let after = nl + 1;
    let (name, rest) = split_word(line);
    if name.eq_ignore_ascii_case(b"MSG") {
        return parse_msg(buf, rest, after, max_payload);
    }
    let op = if name.eq_ignore_ascii_case(b"PING") {
        no_args(rest, ServerOp::Ping)?
    } else if name.eq_ignore_ascii_case(b"PONG") {
        no_args(rest, ServerOp::Pong)?
    } else if name.eq_ignore_ascii_case(b"+OK") {
        no_args(rest, ServerOp::Ok)?
    } else if name.eq_ignore_ascii_case(b"-ERR") {
        let msg = utf8(trim(rest))?;
        let msg = msg
            .strip_prefix('\'')
            .and_then(|m| m.strip_suffix('\''))
            .unwrap_or(msg);
        ServerOp::Err(msg)
    } else if name.eq_ignore_ascii_case(b"INFO") {
        let json = trim(rest);
        if json.is_empty() {
            return Err(bad("INFO without a body"));
        }
        ServerOp::Info(utf8(json)?)
    } else if name.eq_ignore_ascii_case(b"HMSG") {
        return Err(bad("HMSG (headers) is not supported"));
    } else {
        return Err(bad("unknown operation"));
    };
    Ok(Some((op, after)))
}

fn parse_msg<'a>(
    buf: &'a [u8],
    args: &'a [u8],
    after: usize,
    max_payload: usize,
) -> Result<Option<(ServerOp<'a>, usize)>, NatsError> {
    let mut words = args
        .split(|&b| b == b' ' || b == b'\t')
        .filter(|w| !w.is_empty());
    let mut next = || words.next();
    let (Some(subject), Some(sid), Some(third)) = (next(), next(), next()) else {
        return Err(bad("MSG needs a subject, a sid and a size"));
    };
    let (reply_to, size) = match next() {
        Some(size) => (Some(utf8(third)?), size),
        None => (None, third),
    };
    if next().is_some() {
        return Err(bad("MSG with too many arguments"));
    }
    let sid = number(sid).ok_or_else(|| bad("MSG sid is not a number"))?;
    let len = number(size)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= max_payload)
        .ok_or_else(|| bad("MSG size is not a number within the payload bound"))?;
    let end = after + len;
    if buf.len() < end + 2 {
        return Ok(None);
    }
    if &buf[end..end + 2] != b"\r\n" {
        return Err(bad("MSG payload not followed by CRLF"));
    }
    let op = ServerOp::Msg {
        subject: utf8(subject)?,
        sid,
        reply_to,
        payload: &buf[after..end],
    };
    Ok(Some((op, end + 2)))
}

/// The first word of `line` and what follows it.
fn split_word(line: &[u8]) -> (&[u8], &[u8]) {
    match line.iter().position(|&b| b == b' ' || b == b'\t') {
        Some(i) => (&line[..i], &line[i..]),
        None => (line, &[]),
    }
}

fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

fn no_args<'a>(rest: &[u8], op: ServerOp<'a>) -> Result<ServerOp<'a>, NatsError> {
    if trim(rest).is_empty() {
        Ok(op)
    } else {
        Err(bad("unexpected arguments"))
    }
}

fn utf8(bytes: &[u8]) -> Result<&str, NatsError> {
    std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8"))
}

/// A decimal number of at most 19 digits (no sign, no overflow).
fn number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')),
    )
}

/// The payload bound an INFO object names (`max_payload`), capped at
/// [`MAX_PAYLOAD_CEILING`]; [`DEFAULT_MAX_PAYLOAD`] when it names none.
pub fn info_max_payload(json: &str) -> Result<usize, NatsError> {
    let info: serde_json::Value =
        serde_json::from_str(json).map_err(|e| bad(format!("INFO is not JSON: {e}")))?;
    let max = match info.get("max_payload").and_then(serde_json::Value::as_u64) {
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => DEFAULT_MAX_PAYLOAD,
    };
    Ok(max.min(MAX_PAYLOAD_CEILING))
}

/// Checks a subject we send: not empty, no whitespace or control bytes, and short enough
/// for its control line.
pub fn validate_subject(subject: &str) -> Result<(), NatsError> {
    if subject.is_empty() {
        return Err(bad("empty subject"));
    }
    if subject
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(bad(format!("subject {subject:?} holds whitespace")));
    }
    if subject.len() > MAX_CONTROL_LINE - 64 {
        return Err(bad("subject too long"));
    }
    Ok(())
}

/// Appends `CONNECT {..}`: not verbose, not pedantic, no echo, no headers.
pub fn write_connect(out: &mut Vec<u8>, name: &str, version: &str) {
    let options = serde_json::json!({
        "verbose": false,
        "pedantic": false,
        "name": name,
        "lang": "rust",
        "version": version,
        "protocol": 1,
        "echo": false,
        "headers": false,
    });
    out.extend_from_slice(b"CONNECT ");
    out.extend_from_slice(options.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends `SUB <subject> <sid>`.
pub fn write_sub(out: &mut Vec<u8>, subject: &str, sid: u64) -> Result<(), NatsError> {
    validate_subject(subject)?;
    out.extend_from_slice(b"SUB ");
    out.extend_from_slice(subject.as_bytes());
    out.push(b' ');
    out.extend_from_slice(itoa::Buffer::new().format(sid).as_bytes());
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Appends `PUB <subject> <#bytes>` and the payload.
pub fn write_pub(out: &mut Vec<u8>, subject: &str, payload: &[u8]) -> Result<(), NatsError> {
    validate_subject(subject)?;
    out.extend_from_slice(b"PUB ");
    out.extend_from_slice(subject.as_bytes());
    out.push(b' ');
    out.extend_from_slice(itoa::Buffer::new().format(payload.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;
