//! One access log line from a [`Record`], appended to a reused buffer: JSON (one object a
//! line) or a text template. Pure: no I/O, no clock (the time is in the record), no
//! allocation once the buffer has grown.

use std::io::Write as _;

use crate::config::access_log::{Field, Format, Piece};

/// Everything a line says about one request; byte slices borrowed from the connection.
#[derive(Debug, Default, Clone, Copy)]
pub struct Record<'a> {
    /// Unix time in ms when the request's head was read.
    pub unix_ms: u64,
    pub request_id: &'a [u8],
    pub client: &'a [u8],
    pub method: &'a [u8],
    pub path: &'a [u8],
    pub model: Option<&'a [u8]>,
    pub router: Option<&'static str>,
    pub worker: Option<&'a [u8]>,
    /// A disaggregated request's prefill worker.
    pub prefill_worker: Option<&'a [u8]>,
    pub status: u16,
    pub knob: Option<&'static str>,
    pub class: Option<&'static str>,
    pub migrations: u32,
    pub queue_us: u64,
    pub ttft_us: Option<u64>,
    pub duration_us: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// `client` or `upstream` when that side ended the exchange early.
    pub closed: Option<&'static str>,
    pub trace_id: Option<&'a [u8]>,
}

/// A value of a field: text, a number, milliseconds (from µs), or none.
enum Value<'a> {
    Text(&'a [u8]),
    Num(u64),
    Ms(u64),
    None,
}

impl<'a> Record<'a> {
    fn value(&self, f: Field) -> Value<'a> {
        let text = |o: Option<&'a [u8]>| o.map_or(Value::None, Value::Text);
        let label = |o: Option<&'static str>| o.map_or(Value::None, |s| Value::Text(s.as_bytes()));
        match f {
            Field::Time => Value::None,
            Field::RequestId => Value::Text(self.request_id),
            Field::Client => Value::Text(self.client),
            Field::Method => Value::Text(self.method),
            Field::Path => Value::Text(self.path),
            Field::Model => text(self.model),
            Field::Router => label(self.router),
            Field::Worker => text(self.worker),
            Field::PrefillWorker => text(self.prefill_worker),
            Field::Status => Value::Num(u64::from(self.status)),
            Field::Knob => label(self.knob),
            Field::Class => label(self.class),
            Field::Migrations => Value::Num(u64::from(self.migrations)),
            Field::QueueMs => Value::Ms(self.queue_us),
            Field::TtftMs => self.ttft_us.map_or(Value::None, Value::Ms),
            Field::DurationMs => Value::Ms(self.duration_us),
            Field::BytesIn => Value::Num(self.bytes_in),
            Field::BytesOut => Value::Num(self.bytes_out),
            Field::Closed => label(self.closed),
            Field::TraceId => text(self.trace_id),
        }
    }
}

/// Appends one line (ending in `\n`) for `r` in `format`.
pub fn write_line(out: &mut Vec<u8>, format: &Format, r: &Record<'_>) {
    match format {
        Format::Json => json(out, r),
        Format::Text(pieces) => text(out, pieces, r),
    }
    out.push(b'\n');
}

fn json(out: &mut Vec<u8>, r: &Record<'_>) {
    out.push(b'{');
    for (i, f) in Field::ALL.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(f.name().as_bytes());
        out.extend_from_slice(b"\":");
        if *f == Field::Time {
            out.push(b'"');
            rfc3339(out, r.unix_ms);
            out.push(b'"');
            continue;
        }
        match r.value(*f) {
            Value::Text(t) => {
                out.push(b'"');
                escape_json(out, t);
                out.push(b'"');
            }
            Value::Num(n) => number(out, n),
            Value::Ms(us) => ms(out, us),
            Value::None => out.extend_from_slice(b"null"),
        }
    }
    out.push(b'}');
}

fn text(out: &mut Vec<u8>, pieces: &[Piece], r: &Record<'_>) {
    for p in pieces {
        match p {
            Piece::Text(t) => out.extend_from_slice(t.as_bytes()),
            Piece::Field(Field::Time) => rfc3339(out, r.unix_ms),
            Piece::Field(f) => match r.value(*f) {
                Value::Text(t) => escape_text(out, t),
                Value::Num(n) => number(out, n),
                Value::Ms(us) => ms(out, us),
                Value::None => out.push(b'-'),
            },
        }
    }
}

fn number(out: &mut Vec<u8>, n: u64) {
    let _ = write!(out, "{n}");
}

/// Microseconds as milliseconds with three decimals.
fn ms(out: &mut Vec<u8>, us: u64) {
    let _ = write!(out, "{}.{:03}", us / 1000, us % 1000);
}

fn escape_json(out: &mut Vec<u8>, s: &[u8]) {
    for &b in s {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x20..=0x7e => out.push(b),
            _ => {
                let _ = write!(out, "\\u{:04x}", b);
            }
        }
    }
}

/// Text values: printable ASCII kept, the rest (and `"`, `\`) hex-escaped as nginx does.
fn escape_text(out: &mut Vec<u8>, s: &[u8]) {
    for &b in s {
        match b {
            b'"' | b'\\' => {
                let _ = write!(out, "\\x{:02X}", b);
            }
            0x21..=0x7e => out.push(b),
            _ => {
                let _ = write!(out, "\\x{:02X}", b);
            }
        }
    }
}

/// `2026-12-01T01:40:28.123Z`.
pub fn rfc3339(out: &mut Vec<u8>, unix_ms: u64) {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(days as i64);
    let _ = write!(
        out,
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        unix_ms % 1000
    );
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's `civil_from_days`).
fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::access_log::parse_template;

    fn record() -> Record<'static> {
        Record {
            unix_ms: 1_764_553_228_123,
            request_id: b"r1",
            client: b"127.0.0.1",
            method: b"POST",
            path: b"/v1/chat/completions",
            model: Some(b"m\"x"),
            router: Some("round-robin"),
            worker: Some(b"w1"),
            prefill_worker: Some(b"p1"),
            status: 529,
            knob: Some("active_decode_blocks_threshold"),
            class: Some("standard"),
            migrations: 1,
            queue_us: 1500,
            ttft_us: None,
            duration_us: 12,
            bytes_in: 70,
            bytes_out: 0,
            closed: None,
            trace_id: Some(b"0af7651916cd43dd8448eb211c80319c"),
        }
    }

    #[test]
    fn json_line() {
        let mut out = Vec::new();
        write_line(&mut out, &Format::Json, &record());
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("}\n"));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["time"], "2025-12-01T01:40:28.123Z");
        assert_eq!(v["model"], "m\"x");
        assert_eq!(v["status"], 529);
        assert_eq!(v["queue_ms"], 1.5);
        assert_eq!(v["ttft_ms"], serde_json::Value::Null);
        assert_eq!(v["knob"], "active_decode_blocks_threshold");
        assert_eq!(
            (&v["worker"], &v["prefill_worker"]),
            (&"w1".into(), &"p1".into())
        );
        assert_eq!(v.as_object().unwrap().len(), Field::ALL.len());
    }

    #[test]
    fn text_line() {
        let mut out = Vec::new();
        let t =
            parse_template("$client [$time] \"$method $path\" $status $model $ttft_ms $queue_ms")
                .unwrap();
        write_line(&mut out, &Format::Text(t), &record());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "127.0.0.1 [2025-12-01T01:40:28.123Z] \"POST /v1/chat/completions\" 529 m\\x22x - 1.500\n"
        );
    }

    #[test]
    fn dates() {
        let mut out = Vec::new();
        rfc3339(&mut out, 0);
        rfc3339(&mut out, 951_782_400_000);
        assert_eq!(out, b"1970-01-01T00:00:00.000Z2000-02-29T00:00:00.000Z");
    }
}
