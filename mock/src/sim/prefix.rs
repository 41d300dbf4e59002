//! Automatic prefix caching, vLLM-style: a prompt is cut into full KV blocks, each block
//! named by a hash chained with its predecessor's (equal hashes, equal prefixes), and an
//! engine keeps the hashes of recently admitted blocks in a bounded LRU. Pure: the caller
//! supplies the text and decides what a hit saves.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hasher};

/// The chained hashes of the full `block_bytes`-byte blocks of `text`; a partial last
/// block has none (vLLM caches full blocks only).
pub fn block_hashes(text: &[u8], block_bytes: usize) -> Vec<u64> {
    if block_bytes == 0 {
        return Vec::new();
    }
    let mut prev = 0u64;
    text.chunks_exact(block_bytes)
        .map(|block| {
            // `DefaultHasher::new()` has fixed keys: the same text hashes alike in every run.
            let mut h = DefaultHasher::new();
            h.write_u64(prev);
            h.write(block);
            prev = h.finish();
            prev
        })
        .collect()
}

/// A bounded LRU of block hashes, shared by every request of one engine.
#[derive(Debug)]
pub struct PrefixCache {
    capacity: usize,
    /// Bumped on every use; a block's last use orders eviction.
    tick: u64,
    last_use: HashMap<u64, u64>,
    /// Last use → block, oldest first.
    by_age: BTreeMap<u64, u64>,
}

impl PrefixCache {
    /// A cache holding at most `capacity` blocks.
    pub fn new(capacity: u64) -> PrefixCache {
        PrefixCache {
            capacity: usize::try_from(capacity).unwrap_or(usize::MAX),
            tick: 0,
            last_use: HashMap::new(),
            by_age: BTreeMap::new(),
        }
    }

    /// Admits a request's blocks: returns how many leading blocks were cached, then makes
    /// all of them the most recently used (in order, so the prompt's tail is evicted
    /// before its head) and evicts the least recently used beyond the capacity.
    pub fn admit(&mut self, blocks: &[u64]) -> usize {
        let hits = blocks
            .iter()
            .take_while(|h| self.last_use.contains_key(h))
            .count();
        for &h in blocks.iter().rev() {
            self.touch(h);
        }
        while self.last_use.len() > self.capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            self.last_use.remove(&oldest);
        }
        hits
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.last_use.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_use.is_empty()
    }

    fn touch(&mut self, h: u64) {
        self.tick += 1;
        if let Some(old) = self.last_use.insert(h, self.tick) {
            self.by_age.remove(&old);
        }
        self.by_age.insert(self.tick, h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(blocks: &[&str]) -> Vec<u8> {
        blocks.concat().into_bytes()
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        assert_eq!(block_hashes(b"", 4).len(), 0);
        assert_eq!(block_hashes(b"abc", 4).len(), 0);
        assert_eq!(block_hashes(b"abcd", 4).len(), 1);
        assert_eq!(block_hashes(b"abcdefg", 4).len(), 1);
        assert_eq!(block_hashes(b"abcdefgh", 4).len(), 2);
        // The partial tail does not change the full blocks' hashes.
        assert_eq!(block_hashes(b"abcdefg", 4), block_hashes(b"abcdxyz", 4));
        assert_eq!(block_hashes(b"abcdefgh", 0).len(), 0);
    }

    #[test]
    fn a_shared_prefix_hits_up_to_the_first_difference() {
        let mut c = PrefixCache::new(100);
        let first = block_hashes(&text(&["sys.", "tem ", "aaaa", "bbbb"]), 4);
        assert_eq!(c.admit(&first), 0, "cold cache");
        assert_eq!(c.admit(&first), 4, "the same prompt again");
        let other = block_hashes(&text(&["sys.", "tem ", "cccc", "bbbb"]), 4);
        assert_eq!(c.admit(&other), 2, "shared system prompt only");
        let longer = block_hashes(&text(&["sys.", "tem ", "aaaa", "bbbb", "more"]), 4);
        assert_eq!(
            c.admit(&longer),
            4,
            "a longer prompt reuses the whole shorter one"
        );
        assert_eq!(c.len(), 7);
    }

    #[test]
    fn a_block_is_identified_by_its_whole_prefix() {
        let mut c = PrefixCache::new(100);
        c.admit(&block_hashes(&text(&["aaaa", "bbbb"]), 4));
        // "bbbb" is cached, but after "aaaa": at the front it is another block.
        let moved = block_hashes(&text(&["bbbb", "aaaa"]), 4);
        assert_eq!(c.admit(&moved), 0);
        let other_head = block_hashes(&text(&["xxxx", "bbbb"]), 4);
        assert_eq!(c.admit(&other_head), 0);
    }

    #[test]
    fn the_least_recently_used_block_is_evicted_at_capacity() {
        let mut c = PrefixCache::new(3);
        let a = block_hashes(&text(&["aaaa", "a2a2"]), 4);
        let b = block_hashes(&text(&["bbbb"]), 4);
        let d = block_hashes(&text(&["dddd"]), 4);
        c.admit(&a);
        c.admit(&b);
        assert_eq!(c.len(), 3);
        assert_eq!(c.admit(&a), 2, "touch a: b is now the oldest");
        c.admit(&d);
        assert_eq!(c.len(), 3);
        assert_eq!(c.admit(&b), 0, "b was evicted");
        // b's admission evicted a's tail (touched before its head), so a keeps its head.
        assert_eq!(c.admit(&a), 1);
    }
}
