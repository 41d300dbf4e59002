//! Output tokens of a response, without parsing its JSON: the last `"completion_tokens"`
//! number (OpenAI's `usage`, in a unary body or the last event of a stream with
//! `stream_options.include_usage`), and whether a stream ended with `data: [DONE]`. Works
//! across arbitrary splits; looks at each byte once.

const KEY: &[u8] = b"\"completion_tokens\"";
const DONE: &[u8] = b"[DONE]";

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
        for &b in bytes {
            self.step(b);
        }
    }

    #[inline]
    fn step(&mut self, b: u8) {
        if self.done.step(DONE, b) {
            self.saw_done = true;
        }
        self.after = match self.after {
            After::Key if self.key.step(KEY, b) => After::Colon { seen: false },
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
}
