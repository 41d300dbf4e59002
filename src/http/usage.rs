//! Output tokens of a response, without parsing its JSON: the last `"completion_tokens"`
//! number (OpenAI's `usage`, in a unary body or the last event of a stream with
//! `stream_options.include_usage`), and whether a stream ended with `data: [DONE]`. Works
//! across arbitrary splits. Each needle is found with `memchr::memmem` (SIMD) and only a
//! match that a split cuts, and what follows the key, is stepped a byte at a time: every
//! relayed byte passes through here, so this runs once per event of every stream.

use std::sync::LazyLock;

use memchr::memmem::Finder;

const KEY: &[u8] = b"\"completion_tokens\"";
const DONE: &[u8] = b"[DONE]";

static KEY_FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(KEY));
static DONE_FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(DONE));

/// Matches one needle whose first byte occurs nowhere else in it but its end (so a
/// mismatch restarts at 0, or 1 when the byte is the first one).
#[derive(Debug, Clone, Copy, Default)]
struct Needle {
    matched: usize,
}

impl Needle {
    #[inline]
    fn step(&mut self, needle: &[u8], b: u8) -> bool {
        if needle[self.matched] == b {
            self.matched += 1;
            if self.matched == needle.len() {
                self.matched = 0;
                return true;
            }
        } else {
            self.matched = usize::from(needle[0] == b);
        }
        false
    }

    /// Finds `needle` in `bytes`, continuing a match cut by the last split; returns the
    /// offset just past the first whole match, or None with the state left at the
    /// longest match that `bytes` ends in.
    fn find(&mut self, needle: &[u8], finder: &Finder<'_>, bytes: &[u8]) -> Option<usize> {
        let mut i = 0;
        while self.matched > 0 {
            let &b = bytes.get(i)?;
            i += 1;
            if self.step(needle, b) {
                return Some(i);
            }
        }
        if let Some(p) = finder.find(&bytes[i..]) {
            return Some(i + p + needle.len());
        }
        // No whole match: a cut one can only start in the last `needle.len() - 1` bytes.
        let tail = bytes.len().saturating_sub(needle.len() - 1).max(i);
        for &b in &bytes[tail..] {
            self.step(needle, b);
        }
        None
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum After {
    /// Looking for the key.
    #[default]
    Key,
    /// After the key: spaces and one colon.
    Colon { seen: bool },
    /// In the number.
    Digits(u64),
}

#[derive(Debug, Clone, Copy, Default)]
pub struct UsageScanner {
    key: Needle,
    done: Needle,
    after: After,
    completion_tokens: Option<u64>,
    saw_done: bool,
}

impl UsageScanner {
    pub fn feed(&mut self, bytes: &[u8]) {
        if !self.saw_done && self.done.find(DONE, &DONE_FINDER, bytes).is_some() {
            self.saw_done = true;
        }
        let mut i = 0;
        while i < bytes.len() {
            if self.after == After::Key {
                match self.key.find(KEY, &KEY_FINDER, &bytes[i..]) {
                    Some(past) => {
                        i += past;
                        self.after = After::Colon { seen: false };
                    }
                    None => return,
                }
            } else {
                self.after_key(bytes[i]);
                i += 1;
            }
        }
    }

    /// One byte after the key: spaces and a colon, then the number.
    #[inline]
    fn after_key(&mut self, b: u8) {
        self.after = match self.after {
            After::Key => After::Key,
            After::Colon { seen } => match b {
                b' ' | b'\t' | b'\r' | b'\n' => After::Colon { seen },
                b':' if !seen => After::Colon { seen: true },
                b'0'..=b'9' if seen => After::Digits(u64::from(b - b'0')),
                _ => After::Key,
            },
            After::Digits(n) => match b {
                b'0'..=b'9' => {
                    After::Digits(n.saturating_mul(10).saturating_add(u64::from(b - b'0')))
                }
                _ => {
                    self.completion_tokens = Some(n);
                    After::Key
                }
            },
        };
    }

    /// The last `completion_tokens` seen (a number still open at the end counts).
    pub fn completion_tokens(&self) -> Option<u64> {
        match self.after {
            After::Digits(n) => Some(n),
            _ => self.completion_tokens,
        }
    }

    pub fn saw_done(&self) -> bool {
        self.saw_done
    }
}

/// Output tokens of a response: its `usage` when it carries one; else, for a stream, one
/// token per SSE `data:` event (the router's estimate), less the `[DONE]` marker.
pub fn output_tokens(usage: &UsageScanner, stream: bool, events: u64) -> Option<u64> {
    match usage.completion_tokens() {
        Some(n) => Some(n),
        None if stream => Some(events.saturating_sub(u64::from(usage.saw_done()))),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(body: &[u8], split: usize) -> UsageScanner {
        let mut u = UsageScanner::default();
        for piece in body.chunks(split) {
            u.feed(piece);
        }
        u
    }

    #[test]
    fn unary_usage_across_splits() {
        let body = br#"{"choices":[{"text":"\"completion_tokens\" x"}],"usage":{"prompt_tokens":9,"completion_tokens" : 123,"total_tokens":132}}"#;
        for split in 1..body.len() {
            let u = scan(body, split);
            assert_eq!(u.completion_tokens(), Some(123), "split {split}");
            assert!(!u.saw_done());
        }
    }

    #[test]
    fn stream_without_usage_counts_events() {
        let body = b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n";
        let u = scan(body, 5);
        assert_eq!(u.completion_tokens(), None);
        assert!(u.saw_done());
        assert_eq!(output_tokens(&u, true, 3), Some(2));
        assert_eq!(output_tokens(&u, false, 0), None);
    }

    #[test]
    fn last_usage_wins_and_open_number_counts() {
        let u = scan(br#"{"completion_tokens":1} {"completion_tokens":42"#, 3);
        assert_eq!(u.completion_tokens(), Some(42));
        let u = scan(br#"{"completion_tokens":"x"}"#, 2);
        assert_eq!(u.completion_tokens(), None);
    }

    /// The byte-at-a-time scanner this one replaced, as the reference.
    fn reference(body: &[u8]) -> (Option<u64>, bool) {
        let (mut key, mut done, mut after) = (Needle::default(), Needle::default(), After::Key);
        let (mut last, mut saw_done) = (None, false);
        for &b in body {
            saw_done |= done.step(DONE, b);
            after = match after {
                After::Key if key.step(KEY, b) => After::Colon { seen: false },
                After::Key => After::Key,
                After::Colon { seen } => match b {
                    b' ' | b'\t' | b'\r' | b'\n' => After::Colon { seen },
                    b':' if !seen => After::Colon { seen: true },
                    b'0'..=b'9' if seen => After::Digits(u64::from(b - b'0')),
                    _ => After::Key,
                },
                After::Digits(n) => match b {
                    b'0'..=b'9' => {
                        After::Digits(n.saturating_mul(10).saturating_add(u64::from(b - b'0')))
                    }
                    _ => {
                        last = Some(n);
                        After::Key
                    }
                },
            };
        }
        match after {
            After::Digits(n) => (Some(n), saw_done),
            _ => (last, saw_done),
        }
    }

    #[test]
    fn same_answers_as_byte_at_a_time_whatever_the_splits() {
        let bodies: [&[u8]; 5] = [
            br#"{"usage":{"completion_tokens":7}} "completion_tokens" : 12 x"#,
            b"data: {\"a\":1}\n\ndata: [DON[DONE]\n\n\"completion_tokens\"\"completion_tokens\":3",
            br#""completion_tokens""completion_tokens":"completion_tokens":45"#,
            b"[[DONE] [DONE",
            br#"{"id":"chatcmpl-bench","choices":[{"index":0}],"usage":{"completion_tokens": 9}}"#,
        ];
        for body in bodies {
            let want = reference(body);
            for split in 1..=body.len() {
                let u = scan(body, split);
                assert_eq!((u.completion_tokens(), u.saw_done()), want, "split {split}");
            }
            for cut in 0..=body.len() {
                let mut u = UsageScanner::default();
                u.feed(&body[..cut]);
                u.feed(&body[cut..]);
                assert_eq!((u.completion_tokens(), u.saw_done()), want, "cut {cut}");
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_the_byte_at_a_time_scanner(
            pieces in proptest::collection::vec(0usize..12, 0..40),
            cuts in proptest::collection::vec(1usize..24, 1..8),
        ) {
            const ALPHABET: [&[u8]; 12] = [
                b"\"completion_tokens\"", b"\"completion_tok", b"ens\"", b":", b" ", b"42",
                b"7", b"[DONE]", b"[DON", b"E]", b"\"", b"data: {\"x\":[1]}\n\n",
            ];
            let body: Vec<u8> = pieces.iter().flat_map(|&p| ALPHABET[p].iter().copied()).collect();
            let mut u = UsageScanner::default();
            let (mut at, mut k) = (0, 0);
            while at < body.len() {
                let end = (at + cuts[k % cuts.len()]).min(body.len());
                u.feed(&body[at..end]);
                at = end;
                k += 1;
            }
            proptest::prop_assert_eq!((u.completion_tokens(), u.saw_done()), reference(&body));
        }
    }
}
