//! A client's time budget for its request, as its headers state it (docs/behaviour.md
//! §8.10): the OpenAI SDKs send their timeout in decimal seconds in `X-Stainless-Timeout`
//! (the request head keeps where), and an operator may name a header of whole
//! milliseconds (`client_budget_header`, as Envoy's `x-envoy-upstream-rq-timeout-ms`). A
//! value that is not a plain number states no budget: it is ignored, never an error.

/// Longer budgets are read as this (a year): no wait is that long, and sums stay far
/// from overflowing.
const MAX_MS: u64 = 365 * 24 * 3_600 * 1_000;

/// The budget a request states, in ms: the smaller of its `x-stainless-timeout` value
/// (`secs`) and its value of the configured header of milliseconds (`ms`), or `None`.
pub fn budget_ms(secs: Option<&[u8]>, ms: Option<&[u8]>) -> Option<u64> {
    let stated_secs = secs.and_then(seconds);
    let stated_ms = ms.and_then(millis);
    match (stated_secs, stated_ms) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Whole milliseconds: ASCII digits, surrounding blanks allowed.
pub fn millis(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    whole(digits).map(|n| n.min(MAX_MS))
}

/// Decimal seconds (`600`, `0.2`, `12.5`, `1.`), surrounding blanks allowed, in ms
/// rounded down; no sign, no exponent.
pub fn seconds(value: &[u8]) -> Option<u64> {
    let value = value.trim_ascii();
    let (int, frac) = match value.iter().position(|&b| b == b'.') {
        Some(dot) => (&value[..dot], &value[dot + 1..]),
        None => (value, &[][..]),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let secs = if int.is_empty() { 0 } else { whole(int)? };
    if !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // The first three fractional digits are the milliseconds; the rest is rounded down.
    let ms = frac
        .iter()
        .chain(b"000")
        .take(3)
        .fold(0, |a, d| a * 10 + u64::from(d - b'0'));
    Some(secs.saturating_mul(1_000).saturating_add(ms).min(MAX_MS))
}

/// A non-empty run of ASCII digits; saturates rather than overflow.
fn whole(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u64, |a, d| {
        a.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_table() {
        let cases: &[(&str, Option<u64>)] = &[
            ("600", Some(600_000)),
            ("0.2", Some(200)),
            (" 12.5 ", Some(12_500)),
            ("1.", Some(1_000)),
            (".25", Some(250)),
            ("0.0009", Some(0)),
            ("1.2345", Some(1_234)),
            ("0", Some(0)),
            ("99999999999999999999999", Some(MAX_MS)),
            ("", None),
            (".", None),
            ("-1", None),
            ("+1", None),
            ("1e3", None),
            ("1.2.3", None),
            ("0x10", None),
            ("1 2", None),
            ("NaN", None),
        ];
        for (raw, want) in cases {
            assert_eq!(seconds(raw.as_bytes()), *want, "{raw:?}");
        }
    }

    /// (header lines, configured ms header) → the budget.
    #[test]
    fn budget_from_a_head() {
        let cases: &[(&str, Option<&str>, Option<u64>)] = &[
            ("", None, None),
            ("x-stainless-timeout: 600\r\n", None, Some(600_000)),
            (
                "X-Stainless-Timeout: 0.5\r\n",
                Some("x-budget-ms"),
                Some(500),
            ),
            ("x-budget-ms: 250\r\n", None, None),
            ("x-budget-ms: 250\r\n", Some("x-budget-ms"), Some(250)),
            (
                "x-budget-ms: 250\r\nx-stainless-timeout: 0.1\r\n",
                Some("x-budget-ms"),
                Some(100),
            ),
            (
                "x-budget-ms: soon\r\nx-stainless-timeout: 2\r\n",
                Some("x-budget-ms"),
                Some(2_000),
            ),
            ("x-stainless-timeout: 1e9\r\n", None, None),
        ];
        for (lines, header, want) in cases {
            let raw = format!("POST / HTTP/1.1\r\nhost: t\r\n{lines}content-length: 0\r\n\r\n");
            let mut head = crate::http::request::RequestHead::default();
            let parsed =
                crate::http::request::parse_request(raw.as_bytes(), 8192, 1 << 20, &mut head);
            assert_eq!(parsed, Ok(true), "{raw:?}");
            let buf = raw.as_bytes();
            let secs = head.stainless_timeout.map(|s| s.get(buf));
            let ms = header.and_then(|name| head.headers.find(buf, name));
            let got = budget_ms(secs, ms);
            assert_eq!(got, *want, "{lines:?} with {header:?}");
        }
    }

    #[test]
    fn millis_table() {
        let cases: &[(&str, Option<u64>)] = &[
            ("250", Some(250)),
            ("\t250 ", Some(250)),
            ("0", Some(0)),
            ("18446744073709551616", Some(MAX_MS)),
            ("", None),
            ("2.5", None),
            ("-5", None),
            ("5ms", None),
        ];
        for (raw, want) in cases {
            assert_eq!(millis(raw.as_bytes()), *want, "{raw:?}");
        }
    }
}
