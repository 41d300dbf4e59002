//! Responses Spillway answers itself, rendered once (at config load) and copied on use.

use super::write::finish_head;

/// The messages of Spillway's own answers that the spec fixes (semantics §4).
pub mod messages {
    pub const OVERLOADED: &str = "Service temporarily overloaded";
    pub const DIRECT_BUSY: &str = "Selected worker is overloaded, please retry later";
    pub const UNAVAILABLE: &str = "Service temporarily unavailable";
    pub const MODEL_NOT_FOUND: &str = "Model not found";
    pub const NOT_FOUND: &str = "Not found";
    pub const TOO_MANY_CONNECTIONS: &str = "Too many connections";
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
    /// `{"message":..,"type":<canonical reason>,"code":<status>}` (semantics §4).
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

/// A one-off JSON error (semantics §4 shape), for errors not worth pre-rendering.
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

pub fn status_line(out: &mut Vec<u8>, status: u16, reason: &[u8]) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason);
    out.extend_from_slice(b"\r\n");
}

/// The registered reason phrase, with 529 named as the de-facto "Site is overloaded".
pub fn canonical_reason(status: u16) -> &'static str {
    match status {
        529 => "Site is overloaded",
        _ => http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Unknown"),
    }
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
}
