//! Counting server-sent events in a streamed body: each `data:` line starts one event
//! (vLLM and SGLang stream about one token per event). Works across arbitrary splits.

const DATA: &[u8] = b"data:";

#[derive(Debug, Clone, Copy, Default)]
pub struct SseCounter {
    /// Bytes of `data:` matched at the current line start; `usize::MAX` = mid-line.
    matched: usize,
}

impl SseCounter {
    /// Returns how many events start in `bytes`. Mid-line, it jumps to the next newline
    /// with `memchr` rather than looking at every byte of the JSON payload.
    pub fn feed(&mut self, bytes: &[u8]) -> u64 {
        let mut events = 0;
        let mut i = 0;
        while i < bytes.len() {
            if self.matched == usize::MAX {
                match memchr::memchr(b'\n', &bytes[i..]) {
                    Some(p) => {
                        i += p + 1;
                        self.matched = 0;
                    }
                    None => break,
                }
                continue;
            }
            let b = bytes[i];
            if b == b'\n' {
                self.matched = 0;
            } else if DATA[self.matched] == b {
                self.matched += 1;
                if self.matched == DATA.len() {
                    events += 1;
                    self.matched = usize::MAX;
                }
            } else {
                self.matched = usize::MAX;
            }
            i += 1;
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_across_splits() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"b\":\"data: no\"}\n\n: comment\nevent: x\ndata: [DONE]\n\n";
        for split in 1..stream.len() {
            let mut c = SseCounter::default();
            let n: u64 = stream.chunks(split).map(|p| c.feed(p)).sum();
            assert_eq!(n, 3, "split {split}");
        }
    }
}
