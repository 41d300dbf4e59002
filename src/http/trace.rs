//! W3C Trace Context (`traceparent`): reading a client's, making a new one. Pure; the
//! randomness is passed in.

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
