//! Responses Spillway answers itself, rendered once (at config load) and copied on use.

use super::write::{canonical_reason, finish_head, status_line};

/// The messages of Spillway's own answers that docs/behaviour.md fixes (§7).
pub mod messages {
    pub const OVERLOADED: &str = "Service temporarily overloaded";
    pub const DIRECT_BUSY: &str = "Selected worker is overloaded, please retry later";
    pub const UNAVAILABLE: &str = "Service temporarily unavailable";
    pub const MODEL_NOT_FOUND: &str = "Model not found";
    pub const NOT_FOUND: &str = "Not found";
    pub const TOO_MANY_CONNECTIONS: &str = "Too many connections";
    pub const PLAIN_HTTP_ON_TLS: &str = "The plain HTTP request was sent to the TLS port";
}

/// A complete response minus the per-request part: the head without its blank line
/// (so `x-request-id` and `connection` can follow) and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canned {
    pub status: u16,
    pub head: Box<[u8]>,
    pub body: Box<[u8]>,
}

impl Canned {
    /// `{"message":..,"type":<canonical reason>,"code":<status>}` (docs/behaviour.md §7.1).
    pub fn error(status: u16, message: &str, extra: &[(&str, &str)]) -> Canned {
        Self::error_typed(status, message, canonical_reason(status), extra)
    }

    pub fn error_typed(status: u16, message: &str, kind: &str, extra: &[(&str, &str)]) -> Canned {
        let mut body = Vec::with_capacity(64 + message.len());
        error_body(&mut body, status, message, kind);
        Self::json(status, body, extra)
    }

    pub fn json(status: u16, body: Vec<u8>, extra: &[(&str, &str)]) -> Canned {
        let mut head = Vec::with_capacity(128);
        status_line(&mut head, status, canonical_reason(status).as_bytes());
        head.extend_from_slice(b"content-type: application/json\r\ncontent-length: ");
        head.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
        head.extend_from_slice(b"\r\n");
        for (k, v) in extra {
            head.extend_from_slice(k.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(v.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        Canned {
            status,
            head: head.into(),
            body: body.into(),
        }
    }

    /// Appends the whole response to `out`; the body is left out for HEAD requests.
    pub fn write(&self, out: &mut Vec<u8>, request_id: &[u8], keep_alive: bool, with_body: bool) {
        out.extend_from_slice(&self.head);
        finish_head(out, request_id, keep_alive);
        if with_body {
            out.extend_from_slice(&self.body);
        }
    }
}

/// `{"message":..,"type":..,"code":..}` in that order, the message JSON-escaped.
pub fn error_body(out: &mut Vec<u8>, status: u16, message: &str, kind: &str) {
    out.extend_from_slice(br#"{"message":"#);
    let _ = serde_json::to_writer(&mut *out, message);
    out.extend_from_slice(br#","type":"#);
    let _ = serde_json::to_writer(&mut *out, kind);
    out.extend_from_slice(br#","code":"#);
    out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
    out.push(b'}');
}

/// A one-off JSON error (docs/behaviour.md §7.1 shape), for errors not worth pre-rendering.
pub fn write_error(
    out: &mut Vec<u8>,
    status: u16,
    message: &str,
    allow: Option<&str>,
    request_id: &[u8],
    keep_alive: bool,
    with_body: bool,
) {
    let extra = allow.map(|a| ("allow", a));
    Canned::error(status, message, extra.as_slice()).write(out, request_id, keep_alive, with_body);
}

/// A field appended to an error body after Dynamo's three.
#[derive(Debug, Clone, Copy)]
pub enum Field<'a> {
    Str(&'a str),
    Num(f64),
    /// JSON `null`: a figure Spillway does not have.
    Null,
}

/// Largest error body rendered on the spot with extra fields.
const FIELDS_BODY_MAX: usize = 1024;

/// An error answer rendered on the spot without allocating: Dynamo's
/// `{"message","type","code"}` followed by `fields` (a client may ignore them), with
/// `headers` (e.g. `retry-after`) before the request id and `connection`.
#[derive(Debug)]
pub struct ErrorAnswer<'a> {
    pub status: u16,
    pub message: &'a str,
    pub kind: &'a str,
    pub fields: &'a [(&'a str, Field<'a>)],
    pub headers: &'a [(&'a str, &'a str)],
}

impl ErrorAnswer<'_> {
    /// Appends the whole response to `out`; the body is left out for HEAD requests.
    pub fn write(&self, out: &mut Vec<u8>, request_id: &[u8], keep_alive: bool, with_body: bool) {
        let mut buf = [0u8; FIELDS_BODY_MAX];
        let mut body = std::io::Cursor::new(&mut buf[..]);
        let _ = self.body(&mut body);
        let len = body.position() as usize;
        status_line(out, self.status, canonical_reason(self.status).as_bytes());
        out.extend_from_slice(b"content-type: application/json\r\ncontent-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
        out.extend_from_slice(b"\r\n");
        for (k, v) in self.headers {
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        finish_head(out, request_id, keep_alive);
        if with_body {
            out.extend_from_slice(&buf[..len]);
        }
    }

    fn body(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        w.write_all(br#"{"message":"#)?;
        serde_json::to_writer(&mut *w, self.message)?;
        w.write_all(br#","type":"#)?;
        serde_json::to_writer(&mut *w, self.kind)?;
        write!(w, r#","code":{}"#, self.status)?;
        for (name, value) in self.fields {
            write_field(w, name, *value)?;
        }
        w.write_all(b"}")
    }
}

/// `,"name":value`. Whole numbers (token counts) as integers, fractions as they are.
fn write_field(w: &mut impl std::io::Write, name: &str, value: Field<'_>) -> std::io::Result<()> {
    write!(w, ",")?;
    serde_json::to_writer(&mut *w, name)?;
    write!(w, ":")?;
    match value {
        Field::Str(s) => serde_json::to_writer(&mut *w, s)?,
        Field::Num(v) if v.fract() == 0.0 && v.abs() < 1e15 => write!(w, "{}", v as i64)?,
        Field::Num(v) if v.is_finite() => serde_json::to_writer(&mut *w, &v)?,
        Field::Num(_) | Field::Null => write!(w, "null")?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_exact_shape() {
        let c = Canned::error(404, "Model not found", &[]);
        let mut out = Vec::new();
        c.write(&mut out, b"rid-1", true, true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 59\r\n\
             x-request-id: rid-1\r\n\r\n{\"message\":\"Model not found\",\"type\":\"Not Found\",\"code\":404}"
        );
        let c = Canned::error_typed(
            529,
            "Service temporarily overloaded",
            "Overloaded",
            &[("retry-after", "1")],
        );
        let mut out = Vec::new();
        c.write(&mut out, b"r", false, false);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 529 Site is overloaded\r\n"));
        assert!(text.contains("retry-after: 1\r\n"));
        assert!(text.ends_with("connection: close\r\n\r\n"));
    }

    #[test]
    fn fields_follow_dynamos_three() {
        let mut out = Vec::new();
        let fields = [
            ("knob", Field::Str("decode_blocks")),
            ("value", Field::Num(0.875)),
            ("threshold", Field::Num(2000.0)),
            ("none", Field::Null),
            ("infinite", Field::Num(f64::INFINITY)),
        ];
        let answer = ErrorAnswer {
            status: 529,
            message: "Service temporarily overloaded",
            kind: "Overloaded",
            fields: &fields,
            headers: &[("retry-after", "1")],
        };
        answer.write(&mut out, b"r", true, true);
        let text = String::from_utf8(out).unwrap();
        let body = r#"{"message":"Service temporarily overloaded","type":"Overloaded","code":529,"knob":"decode_blocks","value":0.875,"threshold":2000,"none":null,"infinite":null}"#;
        assert!(text.ends_with(&format!("\r\n\r\n{body}")), "{text}");
        assert!(text.contains(&format!("content-length: {}\r\n", body.len())));
        assert!(text.contains("retry-after: 1\r\n"));
    }
}
