//! Prefix identity without a tokenizer (`kv` routing): a prompt's bytes, as
//! [`peek::prompt_parts`] feeds them, cut into fixed-size chunks, each chunk's hash chained
//! with its predecessor's. Two prompts that share their first k chunks share their first k
//! hashes, and a hash names its whole prefix, so an index of hashes is an index of
//! prefixes.
//!
//! A chunk stands for one KV block: `block_size` tokens at [`BYTES_PER_TOKEN`] bytes each
//! (the same estimate as the tracked prefill load). Only whole chunks count, as engines
//! cache only full blocks. The estimate is safe: a wrong guess of what an engine holds
//! costs one prefill, never a wrong answer, since the engine computes whatever it does
//! not have.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::peek::prompt_parts;

/// Bytes per token of the estimate (4, as OpenAI's rule of thumb and the tracked load).
pub const BYTES_PER_TOKEN: usize = 4;
/// The largest chunk: blocks of up to 256 tokens.
pub const MAX_CHUNK_BYTES: usize = 256 * BYTES_PER_TOKEN;
/// Chunks hashed per request at most: the leading part of a longer prompt decides (at 16
/// tokens a block, the first 256 KiB of the prompt).
pub const MAX_CHUNKS: usize = 4096;

/// The chunk size for a KV block of `block_size` tokens.
pub fn chunk_bytes(block_size: u32) -> usize {
    (block_size as usize * BYTES_PER_TOKEN).clamp(BYTES_PER_TOKEN, MAX_CHUNK_BYTES)
}

/// Cuts a byte stream into chunks and writes their chained hashes to `out`.
struct Chunker<'o> {
    pending: [u8; MAX_CHUNK_BYTES],
    len: usize,
    size: usize,
    prev: u64,
    out: &'o mut [u64],
    n: usize,
}

impl Chunker<'_> {
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.n < self.out.len() {
            if self.len == 0 && bytes.len() >= self.size {
                // A whole chunk straight from the input.
                let (chunk, rest) = bytes.split_at(self.size);
                self.emit(hash(chunk, self.prev));
                bytes = rest;
                continue;
            }
            let take = (self.size - self.len).min(bytes.len());
            self.pending[self.len..self.len + take].copy_from_slice(&bytes[..take]);
            self.len += take;
            bytes = &bytes[take..];
            if self.len == self.size {
                self.emit(hash(&self.pending[..self.size], self.prev));
                self.len = 0;
            }
        }
    }

    fn emit(&mut self, h: u64) {
        self.out[self.n] = h;
        self.n += 1;
        self.prev = h;
    }
}

/// A chunk's hash, chained with its predecessor's. 0 marks an empty index entry: never a
/// hash.
fn hash(chunk: &[u8], prev: u64) -> u64 {
    xxh3_64_with_seed(chunk, prev).max(1)
}

/// The chained chunk hashes of a prompt value (as found by `peek`), written to `out`;
/// returns how many (whole chunks only, at most `out.len()`). Allocates nothing.
pub fn prompt_hashes(value: &[u8], chunk: usize, out: &mut [u64]) -> usize {
    let mut c = Chunker {
        pending: [0; MAX_CHUNK_BYTES],
        len: 0,
        size: chunk.clamp(1, MAX_CHUNK_BYTES),
        prev: 0,
        out,
        n: 0,
    };
    prompt_parts(value, |part| c.feed(part));
    c.n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::peek::peek;

    fn hashes(body: &str, chunk: usize) -> Vec<u64> {
        let p = peek(body.as_bytes()).unwrap();
        let (a, b) = p.prompt.unwrap();
        let mut out = vec![0; MAX_CHUNKS];
        let n = prompt_hashes(&body.as_bytes()[a..b], chunk, &mut out);
        out.truncate(n);
        out
    }

    fn chat(messages: &[(&str, &str)]) -> String {
        let m: Vec<String> = messages
            .iter()
            .map(|(r, c)| format!(r#"{{"role":"{r}","content":"{c}"}}"#))
            .collect();
        format!(r#"{{"model":"m","messages":[{}]}}"#, m.join(","))
    }

    #[test]
    fn a_shared_leading_part_shares_leading_hashes() {
        let system = "s".repeat(200);
        let first = chat(&[("system", &system), ("user", "hello there, how are you")]);
        let second = chat(&[
            ("system", &system),
            ("user", "hello there, how are you"),
            ("assistant", "fine, and you? ".repeat(10).as_str()),
            ("user", "also fine"),
        ]);
        let (a, b) = (hashes(&first, 64), hashes(&second, 64));
        assert!(a.len() >= 3, "{a:?}");
        assert!(b.len() > a.len());
        assert_eq!(
            a[..],
            b[..a.len()],
            "the first turn is a prefix of the second"
        );
    }

    #[test]
    fn formatting_does_not_matter_but_content_and_roles_do() {
        let text = "x".repeat(300);
        let compact =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{text}"}}]}}"#);
        let spaced = format!(
            "{{ \"messages\" : [ {{ \"content\" : \"{text}\" , \"role\" : \"user\" , \"name\": \"n\" }} ] , \"model\":\"m\" }}"
        );
        assert_eq!(hashes(&compact, 64), hashes(&spaced, 64));
        let system = compact.replace("\"user\"", "\"system\"");
        assert_ne!(hashes(&compact, 64)[0], hashes(&system, 64)[0]);
    }

    #[test]
    fn chained_same_chunk_elsewhere_is_a_different_hash() {
        let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "a".repeat(128));
        let h = hashes(&body, 64);
        assert_eq!(h.len(), 2);
        assert_ne!(h[0], h[1], "equal chunks at two positions differ");
    }

    #[test]
    fn only_whole_chunks_and_at_most_the_output() {
        let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "a".repeat(100));
        assert_eq!(hashes(&body, 64).len(), 1);
        let mut small = [0u64; 2];
        let big = format!(r#"{{"model":"m","prompt":"{}"}}"#, "b".repeat(10_000));
        let p = peek(big.as_bytes()).unwrap().prompt.unwrap();
        assert_eq!(prompt_hashes(&big.as_bytes()[p.0..p.1], 64, &mut small), 2);
        assert!(small.iter().all(|h| *h != 0));
    }

    #[test]
    fn prompts_arrays_and_structured_content_hash_their_text() {
        let s = "p".repeat(70);
        let arr = format!(r#"{{"model":"m","prompt":["{s}","{s}"]}}"#);
        assert_eq!(hashes(&arr, 64).len(), 2);
        let parts = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"{s}"}}]}}]}}"#
        );
        assert_eq!(hashes(&parts, 64).len(), 1);
        let odd = format!(r#"{{"model":"m","messages":["{s}"]}}"#);
        assert_eq!(hashes(&odd, 64).len(), 1, "not objects: the raw text");
    }

    #[test]
    fn chunk_sizes_follow_the_block_size() {
        assert_eq!(chunk_bytes(16), 64);
        assert_eq!(chunk_bytes(0), 4);
        assert_eq!(chunk_bytes(100_000), MAX_CHUNK_BYTES);
    }
}
