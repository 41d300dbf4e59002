//! W3C Trace Context (`traceparent`): reading a client's, making a new one. Pure; the
//! randomness is passed in.

use super::{HeaderList, name_is};

/// `00-` + 32 hex trace id + `-` + 16 hex parent id + `-` + 2 hex flags.
pub const TRACEPARENT_LEN: usize = 55;

/// A request's trace id (32 lowercase hex digits), when it has one.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceId {
    text: [u8; 32],
    set: bool,
}

fn hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

/// What a request head carries as trace context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// No `traceparent` field.
    Absent,
    /// Exactly one `traceparent`, valid: it and its `tracestate` go upstream as they are.
    Valid,
    /// A `traceparent` that cannot be parsed, or more than one: W3C forbids passing it on
    /// as is, or using its `tracestate`.
    Invalid,
}

/// Reads the head's trace context into `id` (cleared unless [`Inbound::Valid`]); also
/// returns the skip-mask bits of every `traceparent` and `tracestate` field, for a caller
/// that drops or replaces them.
pub fn inbound(headers: &HeaderList, buf: &[u8], id: &mut TraceId) -> (Inbound, u128) {
    id.clear();
    let (mut fields, mut parents) = (0u128, 0u32);
    let mut value: &[u8] = &[];
    for (i, h) in headers.iter().enumerate() {
        let name = h.name.get(buf);
        if name_is(name, "traceparent") {
            parents += 1;
            value = h.value.get(buf);
            fields |= 1u128 << i;
        } else if name_is(name, "tracestate") {
            fields |= 1u128 << i;
        }
    }
    let found = match parents {
        0 => Inbound::Absent,
        1 if id.parse(value) => Inbound::Valid,
        _ => {
            id.clear();
            Inbound::Invalid
        }
    };
    (found, fields)
}

impl TraceId {
    pub fn id(&self) -> Option<&[u8]> {
        self.set.then_some(&self.text[..])
    }

    pub fn clear(&mut self) {
        self.set = false;
    }

    /// Takes the trace id of a valid `traceparent` value (version 00 or a later one, not
    /// `ff`; ids not all zero); false (and cleared) when it is not valid.
    pub fn parse(&mut self, value: &[u8]) -> bool {
        self.set = false;
        let v = value.trim_ascii();
        let ok = v.len() >= TRACEPARENT_LEN
            && (v.len() == TRACEPARENT_LEN || (v[..2] != *b"00" && v[TRACEPARENT_LEN] == b'-'))
            && v[..2].iter().all(|&b| hex(b))
            && v[..2] != *b"ff"
            && v[2] == b'-'
            && v[35] == b'-'
            && v[52] == b'-'
            && v[3..35]
                .iter()
                .chain(&v[36..52])
                .chain(&v[53..55])
                .all(|&b| hex(b))
            && v[3..35].iter().any(|&b| b != b'0')
            && v[36..52].iter().any(|&b| b != b'0');
        if ok {
            self.text.copy_from_slice(&v[3..35]);
            self.set = true;
        }
        ok
    }

    /// Makes a new trace from random bits and writes its `traceparent` header line
    /// (sampled flag set) to `out`.
    pub fn create(&mut self, random: [u64; 3], out: &mut Vec<u8>) {
        let mut id = [0u8; 48];
        for (i, v) in random.iter().enumerate() {
            for j in 0..16 {
                id[i * 16 + j] = b"0123456789abcdef"[((v >> (60 - 4 * j)) & 0xf) as usize];
            }
        }
        // All zeros is invalid; 2^-128 away, but make it impossible.
        id[31] = if id[..32].iter().all(|&b| b == b'0') {
            b'1'
        } else {
            id[31]
        };
        id[47] = if id[32..].iter().all(|&b| b == b'0') {
            b'1'
        } else {
            id[47]
        };
        self.text.copy_from_slice(&id[..32]);
        self.set = true;
        out.extend_from_slice(b"traceparent: 00-");
        out.extend_from_slice(&id[..32]);
        out.push(b'-');
        out.extend_from_slice(&id[32..]);
        out.extend_from_slice(b"-01\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    /// Each form W3C Trace Context (level 1 and 2, section 3.2) calls invalid, next to the
    /// valid ones.
    #[test]
    fn traceparent_table() {
        let cases: &[(&str, bool, &str)] = &[
            (VALID, true, "version 00"),
            (&VALID.replace("-01", "-00"), true, "not sampled"),
            (&VALID.replace("-01", "-ff"), true, "unknown flags are kept"),
            (&format!(" {VALID} "), true, "surrounding whitespace"),
            (&VALID.replacen("00", "01", 1), true, "a later version"),
            (
                &format!("cc{}-what-the-future-holds", &VALID[2..]),
                true,
                "later version, more fields",
            ),
            ("", false, "empty"),
            (&VALID[..54], false, "one short"),
            (&format!("{VALID}0"), false, "one long"),
            (&format!("{VALID}-x"), false, "version 00 with more fields"),
            (&VALID.replacen("00", "ff", 1), false, "version ff"),
            (&VALID.replacen("00", "0g", 1), false, "version not hex"),
            (&VALID.replacen("00", "0A", 1), false, "version upper case"),
            (
                &format!("cc{}x", &VALID[2..]),
                false,
                "later version, no dash after flags",
            ),
            (&VALID.replace('-', "_"), false, "wrong separators"),
            (
                &VALID.replacen("0af7", "0AF7", 1),
                false,
                "trace id upper case",
            ),
            (
                &VALID.replacen("0af7", "0az7", 1),
                false,
                "trace id not hex",
            ),
            (
                &VALID.replacen("0af7651916cd43dd8448eb211c80319c", &"0".repeat(32), 1),
                false,
                "trace id zero",
            ),
            (
                &VALID.replacen("b7ad6b7169203331", &"0".repeat(16), 1),
                false,
                "parent id zero",
            ),
            (
                &VALID.replacen("b7ad", "b7xd", 1),
                false,
                "parent id not hex",
            ),
            (
                &VALID.replacen("b7ad6b7169203331", "b7ad6b716920333", 1),
                false,
                "parent id short",
            ),
            (&VALID.replacen("-01", "-1", 1), false, "flags short"),
            (&VALID.replacen("-01", "-0x", 1), false, "flags not hex"),
        ];
        let mut t = TraceId::default();
        for (value, ok, what) in cases {
            assert_eq!(t.parse(value.as_bytes()), *ok, "{what}: {value:?}");
            assert_eq!(t.id().is_some(), *ok, "{what}");
            if *ok {
                assert_eq!(t.id(), Some(&value.trim().as_bytes()[3..35]), "{what}");
            }
        }
    }

    fn head(fields: &str) -> (Vec<u8>, crate::http::request::RequestHead) {
        let raw = format!("GET / HTTP/1.1\r\nhost: x\r\n{fields}\r\n").into_bytes();
        let mut head = crate::http::request::RequestHead::default();
        assert!(crate::http::request::parse_request(&raw, 8192, 0, &mut head).unwrap());
        (raw, head)
    }

    #[test]
    fn inbound_fields() {
        let mut t = TraceId::default();
        let (raw, h) = head("a: 1\r\n");
        assert_eq!(inbound(&h.headers, &raw, &mut t), (Inbound::Absent, 0));
        let (raw, h) = head("tracestate: k=v\r\n");
        assert_eq!(inbound(&h.headers, &raw, &mut t), (Inbound::Absent, 0b10));
        let (raw, h) = head(&format!(
            "TraceParent: {VALID}\r\na: 1\r\ntracestate: k=v\r\n"
        ));
        assert_eq!(inbound(&h.headers, &raw, &mut t), (Inbound::Valid, 0b1010));
        assert!(t.id().is_some());
        let (raw, h) = head("traceparent: 00-xyz\r\ntracestate: k=v\r\n");
        assert_eq!(inbound(&h.headers, &raw, &mut t), (Inbound::Invalid, 0b110));
        assert_eq!(t.id(), None);
        // Two, even both valid, are one ambiguous value.
        let (raw, h) = head(&format!("traceparent: {VALID}\r\ntraceparent: {VALID}\r\n"));
        assert_eq!(inbound(&h.headers, &raw, &mut t), (Inbound::Invalid, 0b110));
        assert_eq!(t.id(), None);
    }

    #[test]
    fn parses_valid_and_refuses_invalid() {
        let mut t = TraceId::default();
        assert!(t.parse(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
        assert_eq!(t.id(), Some(&b"0af7651916cd43dd8448eb211c80319c"[..]));
        // A later version may append fields.
        assert!(t.parse(b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-xyz"));
        for bad in [
            &b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x"[..],
            b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            b"00-00000000000000000000000000000000-b7ad6b7169203331-01",
            b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            b"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
            b"",
        ] {
            assert!(!t.parse(bad), "{}", String::from_utf8_lossy(bad));
            assert_eq!(t.id(), None);
        }
    }

    #[test]
    fn creates_a_valid_header() {
        let mut t = TraceId::default();
        let mut out = Vec::new();
        t.create([1, 2, 3], &mut out);
        let line = std::str::from_utf8(&out).unwrap();
        let value = line.strip_prefix("traceparent: ").unwrap().trim_end();
        let mut back = TraceId::default();
        assert!(back.parse(value.as_bytes()), "{value}");
        assert_eq!(back.id(), t.id());
    }
}
