//! The predicted-cache index of one model in `kv` mode (Dynamo's approximate mode, without
//! KV events): which members are predicted to hold which prefix chunks, learned from
//! Spillway's own routing decisions. A request routed to a member is predicted to leave
//! its chunks in that member's cache for `ttl` (refreshed by every later request that
//! shares them) or until the member has been sent its KV capacity's worth of newer chunks.
//!
//! Shared by every core, lock-free and allocation-free after construction:
//! - a fixed table of entries (chunk hash, bitmask of members, last use), in buckets of
//!   [`WAYS`]; a new hash takes an empty, expired or least recently used entry of its
//!   bucket. Lossy by design: a race or an eviction can make one lookup wrong, which
//!   costs a prefill, never a wrong answer.
//! - per member, a ring of the chunks it was predicted to receive, as long as its KV
//!   capacity in blocks: when a chunk is new to a member and the ring is full, the oldest
//!   chunk's bit is cleared (the engine evicts too).
//!
//! Memory is fixed at construction ([`PredictedCache::memory_bytes`]): 24 bytes per entry,
//! twice as many entries as the members' capacities add up to (a power of two, between
//! 1,024 and 2^21), plus 8 bytes per ring slot.

use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

/// Members a model's index can tell apart (bits of a mask); members beyond are never
/// predicted to hold anything.
pub const MAX_MEMBERS: usize = 64;
/// Entries per bucket.
const WAYS: usize = 4;
const MIN_ENTRIES: usize = 1 << 10;
/// A held chunk's last use is rewritten at most this many times per TTL.
const REFRESH_EVERY: u64 = 16;
const MAX_ENTRIES: usize = 1 << 21;

#[derive(Debug, Default)]
struct Entry {
    /// The chunk hash; 0 = empty.
    tag: AtomicU64,
    members: AtomicU64,
    /// Last use, ms.
    stamp: AtomicU64,
}

#[derive(Debug)]
struct Ring {
    slots: Box<[AtomicU64]>,
    head: AtomicU64,
}

/// What one [`PredictedCache::record`] changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// Chunks new to the member.
    pub added: u64,
    /// Live entries of other chunks given up to make room (table full in a bucket), and
    /// chunks the member's ring pushed out (its capacity).
    pub evicted: u64,
}

#[derive(Debug)]
pub struct PredictedCache {
    entries: Box<[Entry]>,
    rings: Box<[Ring]>,
    ttl_ms: u64,
}

impl PredictedCache {
    /// An index for members with these KV capacities (blocks), predictions kept `ttl_ms`.
    pub fn new(capacities: &[u64], ttl_ms: u64) -> PredictedCache {
        let total: u64 = capacities.iter().take(MAX_MEMBERS).sum();
        let want = usize::try_from(total.saturating_mul(2)).unwrap_or(MAX_ENTRIES);
        let n = want.clamp(MIN_ENTRIES, MAX_ENTRIES).next_power_of_two();
        let rings = capacities
            .iter()
            .take(MAX_MEMBERS)
            .map(|&c| Ring {
                slots: (0..c.clamp(1, MAX_ENTRIES as u64))
                    .map(|_| AtomicU64::new(0))
                    .collect(),
                head: AtomicU64::new(0),
            })
            .collect();
        PredictedCache {
            entries: (0..n).map(|_| Entry::default()).collect(),
            rings,
            ttl_ms,
        }
    }

    /// Bytes this index holds (fixed).
    pub fn memory_bytes(&self) -> usize {
        let ring_slots: usize = self.rings.iter().map(|r| r.slots.len()).sum();
        self.entries.len() * std::mem::size_of::<Entry>() + ring_slots * 8
    }

    /// Entries that name a chunk some member is predicted to hold (a scan: for scrapes).
    pub fn live_entries(&self, now_ms: u64) -> usize {
        self.entries
            .iter()
            .filter(|e| {
                e.tag.load(Relaxed) != 0
                    && e.members.load(Relaxed) != 0
                    && self.fresh(e.stamp.load(Relaxed), now_ms)
            })
            .count()
    }

    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    fn fresh(&self, stamp: u64, now_ms: u64) -> bool {
        now_ms.saturating_sub(stamp) < self.ttl_ms
    }

    fn bucket(&self, h: u64) -> &[Entry] {
        let start = (h as usize & (self.entries.len() - 1)) & !(WAYS - 1);
        &self.entries[start..start + WAYS]
    }

    /// The members predicted to hold chunk `h`.
    fn lookup(&self, h: u64, now_ms: u64) -> u64 {
        for e in self.bucket(h) {
            if e.tag.load(Acquire) == h {
                let members = e.members.load(Relaxed);
                let fresh = self.fresh(e.stamp.load(Relaxed), now_ms);
                return if fresh { members } else { 0 };
            }
        }
        0
    }

    /// For each member in `candidates` (bit i = member i), how many leading chunks of
    /// `hashes` it is predicted to hold, into `out[i]`. One lookup per chunk at most, and
    /// none once no candidate holds the prefix so far.
    pub fn overlaps(
        &self,
        hashes: &[u64],
        candidates: u64,
        now_ms: u64,
        out: &mut [u32; MAX_MEMBERS],
    ) {
        let mut active = candidates;
        for (i, &h) in hashes.iter().enumerate() {
            if active == 0 {
                return;
            }
            let holding = self.lookup(h, now_ms) & active;
            let mut ended = active & !holding;
            while ended != 0 {
                out[ended.trailing_zeros() as usize] = i as u32;
                ended &= ended - 1;
            }
            active = holding;
        }
        while active != 0 {
            out[active.trailing_zeros() as usize] = hashes.len() as u32;
            active &= active - 1;
        }
    }

    /// Predicts that `member` now holds every chunk of `hashes`.
    pub fn record(&self, hashes: &[u64], member: usize, now_ms: u64) -> Recorded {
        let mut r = Recorded::default();
        let Some(ring) = self.rings.get(member) else {
            return r;
        };
        let bit = 1u64 << member;
        for &h in hashes {
            let (new, evicted) = self.set(h, bit, now_ms);
            r.evicted += u64::from(evicted);
            if !new {
                continue;
            }
            r.added += 1;
            let slot = ring.head.fetch_add(1, Relaxed) % ring.slots.len() as u64;
            let old = ring.slots[slot as usize].swap(h, Relaxed);
            if old != 0 && old != h {
                r.evicted += u64::from(self.clear(old, bit));
            }
        }
        r
    }

    /// Sets `bit` on chunk `h`'s entry, taking one if needed. Returns (the bit is new,
    /// a live entry was given up).
    fn set(&self, h: u64, bit: u64, now_ms: u64) -> (bool, bool) {
        let bucket = self.bucket(h);
        if let Some(e) = bucket.iter().find(|e| e.tag.load(Acquire) == h) {
            // Held and refreshed lately: nothing to write (no shared line dirtied).
            let age = now_ms.saturating_sub(e.stamp.load(Relaxed));
            if age < self.ttl_ms / REFRESH_EVERY && e.members.load(Relaxed) & bit != 0 {
                return (false, false);
            }
            let fresh = self.fresh(e.stamp.swap(now_ms, Relaxed), now_ms);
            let before = if fresh {
                e.members.fetch_or(bit, Release)
            } else {
                e.members.swap(bit, Release);
                0
            };
            return (before & bit == 0, false);
        }
        // The emptiest victim: empty, else expired, else least recently used.
        let victim = bucket
            .iter()
            .min_by_key(|e| {
                let (tag, stamp) = (e.tag.load(Relaxed), e.stamp.load(Relaxed));
                match (tag, self.fresh(stamp, now_ms)) {
                    (0, _) => (0, 0),
                    (_, false) => (1, stamp),
                    _ => (2, stamp),
                }
            })
            .unwrap_or(&bucket[0]);
        let old = victim.tag.load(Relaxed);
        let live = old != 0
            && victim.members.load(Relaxed) != 0
            && self.fresh(victim.stamp.load(Relaxed), now_ms);
        if victim
            .tag
            .compare_exchange(old, h, Release, Relaxed)
            .is_err()
        {
            // Another core took it meanwhile: this prediction is lost (lossy by design).
            return (false, false);
        }
        victim.members.store(bit, Release);
        victim.stamp.store(now_ms, Release);
        (true, live)
    }

    /// Clears `bit` on chunk `h`; whether it was set.
    fn clear(&self, h: u64, bit: u64) -> bool {
        self.bucket(h)
            .iter()
            .find(|e| e.tag.load(Acquire) == h)
            .is_some_and(|e| e.members.fetch_and(!bit, Release) & bit != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlaps(c: &PredictedCache, hashes: &[u64], candidates: u64, now: u64) -> Vec<u32> {
        let mut out = [0u32; MAX_MEMBERS];
        c.overlaps(hashes, candidates, now, &mut out);
        out[..4].to_vec()
    }

    #[test]
    fn a_recorded_prefix_is_found_on_its_member_only() {
        let c = PredictedCache::new(&[100, 100, 100], 1_000);
        assert_eq!(c.record(&[11, 12, 13], 1, 0).added, 3);
        assert_eq!(overlaps(&c, &[11, 12, 13, 14], 0b111, 10), [0, 3, 0, 0]);
        assert_eq!(overlaps(&c, &[11, 99, 13], 0b111, 10), [0, 1, 0, 0]);
        assert_eq!(
            overlaps(&c, &[11, 12], 0b101, 10),
            [0, 0, 0, 0],
            "not a candidate"
        );
        c.record(&[11, 12], 2, 20);
        assert_eq!(overlaps(&c, &[11, 12, 13], 0b111, 30), [0, 3, 2, 0]);
        assert_eq!(c.record(&[11, 12], 2, 40).added, 0, "already held");
    }

    #[test]
    fn predictions_expire_after_the_ttl_unless_refreshed() {
        let c = PredictedCache::new(&[100, 100], 1_000);
        c.record(&[1, 2], 0, 0);
        c.record(&[1], 1, 900);
        assert_eq!(overlaps(&c, &[1, 2], 0b11, 999), [2, 1, 0, 0]);
        assert_eq!(
            overlaps(&c, &[1, 2], 0b11, 1_500),
            [1, 1, 0, 0],
            "chunk 2 expired"
        );
        assert_eq!(overlaps(&c, &[1, 2], 0b11, 1_900), [0, 0, 0, 0]);
        assert_eq!(
            c.record(&[1], 1, 2_000).added,
            1,
            "an expired chunk is new again"
        );
    }

    #[test]
    fn a_member_holds_at_most_its_capacity() {
        let c = PredictedCache::new(&[4, 100], 60_000);
        let first: Vec<u64> = (1..=4).collect();
        c.record(&first, 0, 0);
        let r = c.record(&[5, 6], 0, 1);
        assert_eq!((r.added, r.evicted), (2, 2), "the two oldest make room");
        assert_eq!(overlaps(&c, &[1], 1, 2)[0], 0);
        assert_eq!(overlaps(&c, &[3, 4], 1, 2)[0], 2);
        assert_eq!(
            overlaps(&c, &[1, 2, 3, 4], 1, 2)[0],
            0,
            "a prefix counts from its first chunk"
        );
    }

    #[test]
    fn a_full_bucket_gives_up_its_least_recently_used_entry() {
        let c = PredictedCache::new(&[1_000], 60_000);
        let n = c.capacity() as u64;
        // Five hashes in one bucket of four.
        let same: Vec<u64> = (1..=5).map(|k| k * n).collect();
        for (t, &h) in same.iter().enumerate() {
            c.record(&[h], 0, t as u64);
        }
        assert_eq!(overlaps(&c, &same[..1], 1, 10)[0], 0, "the oldest went");
        assert_eq!(overlaps(&c, &same[4..], 1, 10)[0], 1);
        assert!(c.live_entries(10) == 4 && c.memory_bytes() > c.capacity() * 24);
    }

    #[test]
    fn members_beyond_the_mask_are_never_predicted() {
        let caps = vec![10u64; MAX_MEMBERS + 2];
        let c = PredictedCache::new(&caps, 1_000);
        assert_eq!(c.record(&[1], MAX_MEMBERS + 1, 0), Recorded::default());
        assert_eq!(c.record(&[1], MAX_MEMBERS - 1, 0).added, 1);
    }
}
