//! The request target (RFC 9112 §3.2): origin-form as it is; absolute-form reduced to
//! origin-form with its authority kept, from which the upstream request's Host is taken
//! (§3.2.2); and no dot-segment in the path, however it is spelled.

use super::{HttpError, Span};

const DOT_SEGMENT: HttpError = HttpError::Malformed("request path contains a dot-segment");
const NOT_A_PATH: HttpError = HttpError::Malformed("request target must be a path");
const NO_PATH: HttpError = HttpError::Malformed("absolute request target without a path");
const NO_HOST: HttpError = HttpError::Malformed("absolute request target without a host");
const USERINFO: HttpError = HttpError::Malformed("userinfo in the request target");
const BAD_AUTHORITY: HttpError = HttpError::Malformed("invalid authority in the request target");

/// Where a request target's parts lie in the buffer it was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    /// Origin-form: the path and the query (`/v1/chat/completions?x=1`).
    pub origin: Span,
    /// `host[:port]` of an absolute-form target; `None` for origin-form.
    pub authority: Option<Span>,
}

/// Reads `target`, a sub-slice of `buf`: origin-form, or `http(s)://authority/path`.
/// Refuses other forms, an authority with userinfo or without a host, and a path with
/// a dot-segment.
pub(crate) fn parse_target(buf: &[u8], target: &[u8]) -> Result<Target, HttpError> {
    let (origin, authority) = split_absolute(target)?;
    if has_dot_segment(origin) {
        return Err(DOT_SEGMENT);
    }
    Ok(Target {
        origin: Span::of(buf, origin),
        authority: authority.map(|a| Span::of(buf, a)),
    })
}

/// Origin-form as it is; absolute-form split into its origin-form part and authority.
fn split_absolute(target: &[u8]) -> Result<(&[u8], Option<&[u8]>), HttpError> {
    if target.first() == Some(&b'/') {
        return Ok((target, None));
    }
    let scheme = |p: &[u8]| target.len() >= p.len() && target[..p.len()].eq_ignore_ascii_case(p);
    let rest = if scheme(b"http://") {
        &target[7..]
    } else if scheme(b"https://") {
        &target[8..]
    } else {
        return Err(NOT_A_PATH);
    };
    // RFC 3986 §3.2: the authority ends at the first `/`, `?` or `#`.
    let end = rest
        .iter()
        .position(|b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let (authority, origin) = rest.split_at(end);
    check_authority(authority)?;
    if origin.first() != Some(&b'/') {
        return Err(NO_PATH);
    }
    Ok((origin, Some(authority)))
}

/// `host[:port]`, as Host may carry it (RFC 9110 §7.2): a reg-name or a bracketed IP
/// literal, digits after the colon. Userinfo is an error (RFC 9110 §4.2.4), and so is an
/// empty host (§4.2.1).
fn check_authority(a: &[u8]) -> Result<(), HttpError> {
    if a.contains(&b'@') {
        return Err(USERINFO);
    }
    let (host, port) = match a.first() {
        Some(b'[') => match memchr::memchr(b']', a) {
            Some(close) => a.split_at(close + 1),
            None => return Err(BAD_AUTHORITY),
        },
        _ => a.split_at(memchr::memchr(b':', a).unwrap_or(a.len())),
    };
    let host_ok = match host {
        [] => return Err(NO_HOST),
        [b'[', inner @ .., b']'] => {
            !inner.is_empty() && inner.iter().all(|&b| b == b':' || is_reg_name(b))
        }
        _ => host.iter().all(|&b| is_reg_name(b)),
    };
    let port_ok = match port {
        [] => true,
        [b':', digits @ ..] => digits.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if host_ok && port_ok {
        Ok(())
    } else {
        Err(BAD_AUTHORITY)
    }
}

/// A byte of a reg-name (RFC 3986 §3.2.2): unreserved, percent-encoded or a sub-delim.
fn is_reg_name(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(&b)
}

/// Whether a segment of the path (before `?` or `#`) is `.` or `..` once percent-encoded
/// unreserved characters are decoded (RFC 3986 §2.3, §5.2.4). `%2F` is left as it is:
/// an encoded slash is a byte of its segment, not a separator.
fn has_dot_segment(origin: &[u8]) -> bool {
    let end = memchr::memchr2(b'?', b'#', origin).unwrap_or(origin.len());
    let path = &origin[..end];
    memchr::memchr2(b'.', b'%', path).is_some() && path.split(|&b| b == b'/').any(is_dot_segment)
}

/// `.` or `..`, each dot written as itself or as `%2E` (any case).
fn is_dot_segment(segment: &[u8]) -> bool {
    let mut dots = 0;
    let mut rest = segment;
    while !rest.is_empty() {
        rest = match rest {
            [b'.', tail @ ..] => tail,
            [b'%', b'2', b'e' | b'E', tail @ ..] => tail,
            _ => return false,
        };
        dots += 1;
    }
    matches!(dots, 1 | 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The origin-form part and the authority, or the refusal.
    type Want = Result<(&'static str, Option<&'static str>), HttpError>;

    /// Wire table: request target → what it is read as.
    const TARGETS: &[(&str, Want)] = &[
        ("/v1/chat/completions", Ok(("/v1/chat/completions", None))),
        ("/v1/x?a=/../b", Ok(("/v1/x?a=/../b", None))),
        ("/v1/.well-known/x", Ok(("/v1/.well-known/x", None))),
        ("/v1/.../x", Ok(("/v1/.../x", None))),
        ("/v1/..x/x.", Ok(("/v1/..x/x.", None))),
        ("/v1/%2e%2e%2fx", Ok(("/v1/%2e%2e%2fx", None))),
        ("/v1/%2F../", Ok(("/v1/%2F../", None))),
        ("/v1/%2e%41", Ok(("/v1/%2e%41", None))),
        ("/v1//x", Ok(("/v1//x", None))),
        ("/v1/../internal/reset", Err(DOT_SEGMENT)),
        ("/v1/./x", Err(DOT_SEGMENT)),
        ("/v1/..", Err(DOT_SEGMENT)),
        ("/v1/.", Err(DOT_SEGMENT)),
        ("/..", Err(DOT_SEGMENT)),
        ("/v1/..?x", Err(DOT_SEGMENT)),
        ("/v1/..#x", Err(DOT_SEGMENT)),
        ("/v1/%2e%2e/internal", Err(DOT_SEGMENT)),
        ("/v1/%2E%2E/internal", Err(DOT_SEGMENT)),
        ("/v1/.%2e/internal", Err(DOT_SEGMENT)),
        ("/v1/%2e./internal", Err(DOT_SEGMENT)),
        ("/v1/%2e/x", Err(DOT_SEGMENT)),
        (
            "http://other:9/v1/chat/completions",
            Ok(("/v1/chat/completions", Some("other:9"))),
        ),
        ("HTTPS://h/v1/x?q=1", Ok(("/v1/x?q=1", Some("h")))),
        ("http://[::1]:8000/v1/x", Ok(("/v1/x", Some("[::1]:8000")))),
        ("http://[::1]/v1/x", Ok(("/v1/x", Some("[::1]")))),
        ("http://h:/v1/x", Ok(("/v1/x", Some("h:")))),
        ("http://h/v1/../x", Err(DOT_SEGMENT)),
        ("http://h/v1/%2E%2e/x", Err(DOT_SEGMENT)),
        ("http://u@h/v1/x", Err(USERINFO)),
        ("http://u:pw@h:1/v1/x", Err(USERINFO)),
        ("http://@h/v1/x", Err(USERINFO)),
        ("http:///v1/x", Err(NO_HOST)),
        ("http://:80/v1/x", Err(NO_HOST)),
        ("http://h", Err(NO_PATH)),
        ("http://h?x/y", Err(NO_PATH)),
        ("http://h:x/v1", Err(BAD_AUTHORITY)),
        ("http://h:1:2/v1", Err(BAD_AUTHORITY)),
        ("http://[::1/v1", Err(BAD_AUTHORITY)),
        ("http://[]/v1", Err(BAD_AUTHORITY)),
        ("http://a[b]/v1", Err(BAD_AUTHORITY)),
        ("http://h\"/v1", Err(BAD_AUTHORITY)),
        ("ftp://h/v1/x", Err(NOT_A_PATH)),
        ("v1/x", Err(NOT_A_PATH)),
        ("*", Err(NOT_A_PATH)),
    ];

    #[test]
    fn target_table() {
        for (raw, want) in TARGETS {
            let buf = raw.as_bytes();
            let got = parse_target(buf, buf).map(|t| {
                let text = |s: Span| std::str::from_utf8(s.get(buf)).unwrap();
                (text(t.origin), t.authority.map(text))
            });
            assert_eq!(&got, want, "{raw:?}");
        }
    }
}
