//! `kv` routing (docs/behaviour.md §4.7): Dynamo's cost over the members' predicted cached prefixes
//! and loads, and the whole decision as the data path makes it (hash the prompt, look up
//! the index, pick). The prediction is recorded apart ([`record_kv`]), once the request
//! is bound to the member picked. Pure apart from the index's atomics; `now` is an
//! argument.

use super::cache::{MAX_MEMBERS, PredictedCache, Recorded};
use super::prefix::{chunk_bytes, prompt_hashes};
use super::{MemberState, Pick, Rng};

/// `kv` mode's settings, with Dynamo's names and defaults (docs/behaviour.md §4.7, §20.5).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct KvSettings {
    /// 0: the cheapest member; above 0: softmax sampling over the costs.
    pub router_temperature: f64,
    /// Weight of the prefill work (new blocks plus blocks in prefill) in the cost.
    pub router_prefill_load_scale: f64,
    /// Tokens per KV block: the prompt is hashed in chunks of this many tokens.
    pub kv_cache_block_size: u32,
    /// How long a routed prefix is predicted to stay in a worker's cache.
    pub router_ttl_secs: f64,
}

impl Default for KvSettings {
    fn default() -> Self {
        KvSettings {
            router_temperature: 0.0,
            router_prefill_load_scale: 1.0,
            kv_cache_block_size: 16,
            router_ttl_secs: 120.0,
        }
    }
}

impl KvSettings {
    /// Dynamo's cost of sending a request of `request_blocks` KV blocks to a member that
    /// is predicted to hold its first `overlap` blocks: prefill-load scale × (new prefill
    /// blocks + blocks already waiting for prefill there) + active decode blocks there.
    pub fn cost(&self, request_blocks: u64, overlap: u32, s: &MemberState) -> f64 {
        let block = f64::from(self.kv_cache_block_size.max(1));
        let new_blocks = request_blocks.saturating_sub(u64::from(overlap)) as f64;
        let queued = s.prefill_tokens as f64 / block;
        self.router_prefill_load_scale * (new_blocks + queued) + s.decode_blocks as f64
    }
}

/// `kv` mode: the eligible member with the lowest [`KvSettings::cost`] (ties at random),
/// or at a temperature above 0 one drawn with probability ∝ exp(−normalised cost / T).
/// `overlap(i)` is member i's predicted cached prefix, in blocks.
pub fn pick_kv(
    n: usize,
    state: impl Fn(usize) -> MemberState,
    overlap: impl Fn(usize) -> u32,
    request_blocks: u64,
    kv: &KvSettings,
    rng: &mut Rng,
) -> Pick {
    let (mut reachable, mut lo, mut hi) = (0usize, f64::INFINITY, f64::NEG_INFINITY);
    let (mut best, mut ties) = (None, 0u32);
    for i in 0..n {
        let s = state(i);
        reachable += usize::from(!s.unreachable);
        if !s.eligible() {
            continue;
        }
        let c = kv.cost(request_blocks, overlap(i), &s);
        hi = hi.max(c);
        if c < lo {
            (lo, best, ties) = (c, Some(i), 1);
        } else if c == lo {
            // Reservoir sampling over the ties: each equally likely.
            ties += 1;
            if rng.below(ties as usize) == 0 {
                best = Some(i);
            }
        }
    }
    let Some(best) = best else {
        return if reachable == 0 {
            Pick::Unavailable
        } else {
            Pick::Overloaded
        };
    };
    if kv.router_temperature <= 0.0 || hi <= lo {
        return Pick::Member(best);
    }
    let weight = |i: usize| {
        let s = state(i);
        if !s.eligible() {
            return 0.0;
        }
        let norm = (kv.cost(request_blocks, overlap(i), &s) - lo) / (hi - lo);
        (-norm / kv.router_temperature).exp()
    };
    let total: f64 = (0..n).map(weight).sum();
    let mut draw = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
    for i in 0..n {
        let w = weight(i);
        if w > 0.0 && draw < w {
            return Pick::Member(i);
        }
        draw -= w;
    }
    Pick::Member(best)
}

/// What a `kv` decision found (for the router's metrics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvDecision {
    pub pick: Pick,
    /// The request's size in KV blocks (its prompt-token estimate).
    pub blocks: u64,
    /// Blocks predicted cached on the chosen member.
    pub overlap: u32,
    /// The prompt's chunk hashes are `scratch[..chunks]`.
    pub chunks: usize,
}

/// The whole `kv` decision: hash the prompt value's chunks into `scratch`, look up each
/// eligible member's predicted overlap, and pick by cost. Nothing is recorded: the pick
/// may not take the request (a full gate sends it to the waiting room).
#[allow(clippy::too_many_arguments)]
pub fn decide_kv(
    cache: &PredictedCache,
    kv: &KvSettings,
    prompt: &[u8],
    prompt_tokens: u64,
    n: usize,
    state: impl Fn(usize) -> MemberState,
    scratch: &mut [u64],
    now_ms: u64,
    rng: &mut Rng,
) -> KvDecision {
    let block_size = kv.kv_cache_block_size.max(1);
    let chunks = prompt_hashes(prompt, chunk_bytes(block_size), scratch);
    let hashes = &scratch[..chunks];
    let candidates = (0..n.min(MAX_MEMBERS))
        .filter(|&i| state(i).eligible())
        .fold(0u64, |m, i| m | 1 << i);
    let mut overlaps = [0u32; MAX_MEMBERS];
    cache.overlaps(hashes, candidates, now_ms, &mut overlaps);
    let overlap = |i: usize| overlaps.get(i).copied().unwrap_or(0);
    let blocks = prompt_tokens.div_ceil(u64::from(block_size));
    let pick = pick_kv(n, &state, overlap, blocks, kv, rng);
    let chosen = match pick {
        Pick::Member(i) => overlap(i),
        _ => 0,
    };
    KvDecision {
        pick,
        blocks,
        overlap: chosen,
        chunks,
    }
}

/// Records that `member` now holds the prompt: its chunk hashes are `scratch[..chunks]`
/// when `chunks` is given (the scratch its decision filled, untouched since), else the
/// prompt is hashed into `scratch` again.
pub fn record_kv(
    cache: &PredictedCache,
    kv: &KvSettings,
    (prompt, chunks): (&[u8], Option<usize>),
    member: usize,
    scratch: &mut [u64],
    now_ms: u64,
) -> Recorded {
    let block_size = kv.kv_cache_block_size.max(1);
    let chunks = chunks.unwrap_or_else(|| prompt_hashes(prompt, chunk_bytes(block_size), scratch));
    cache.record(&scratch[..chunks.min(scratch.len())], member, now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv_member(busy: bool, prefill_tokens: u64, decode_blocks: u64) -> MemberState {
        MemberState {
            busy,
            prefill_tokens,
            decode_blocks,
            ..MemberState::default()
        }
    }

    #[test]
    fn kv_cost_is_dynamos() {
        let kv = KvSettings {
            router_prefill_load_scale: 2.0,
            ..KvSettings::default()
        };
        // 2 × ((10 − 4) new + 32/16 queued) + 100 decode.
        assert_eq!(kv.cost(10, 4, &kv_member(false, 32, 100)), 116.0);
        assert_eq!(
            kv.cost(10, 12, &kv_member(false, 0, 0)),
            0.0,
            "never negative"
        );
    }

    #[test]
    fn kv_prefers_overlap_until_load_outweighs_it() {
        let kv = KvSettings::default();
        let mut rng = super::Rng::new(3);
        let overlap = [0, 40, 0];
        let even = |_| kv_member(false, 0, 10);
        assert_eq!(
            pick_kv(3, even, |i| overlap[i], 64, &kv, &mut rng),
            Pick::Member(1)
        );
        // Member 1 holds 40 of 64 blocks but decodes 100 more blocks than the others.
        let loaded = |i| kv_member(false, 0, if i == 1 { 110 } else { 10 });
        let p = pick_kv(3, loaded, |i| overlap[i], 64, &kv, &mut rng);
        assert!(
            matches!(p, Pick::Member(0 | 2)),
            "74 for members 0 and 2 against 24 + 110 for member 1: {p:?}"
        );
        let busy = |i| kv_member(i == 1, 0, 10);
        assert_ne!(
            pick_kv(3, busy, |i| overlap[i], 64, &kv, &mut rng),
            Pick::Member(1)
        );
    }

    #[test]
    fn kv_ties_spread_and_no_member_is_unavailable_or_overloaded() {
        let kv = KvSettings::default();
        let mut rng = super::Rng::new(5);
        let mut seen = [0u32; 4];
        for _ in 0..400 {
            if let Pick::Member(i) = pick_kv(4, |_| kv_member(false, 0, 0), |_| 0, 8, &kv, &mut rng)
            {
                seen[i] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c > 60), "{seen:?}");
        let down = |_| MemberState {
            unreachable: true,
            ..MemberState::default()
        };
        assert_eq!(pick_kv(2, down, |_| 0, 8, &kv, &mut rng), Pick::Unavailable);
        assert_eq!(
            pick_kv(2, |_| kv_member(true, 0, 0), |_| 0, 8, &kv, &mut rng),
            Pick::Overloaded
        );
        assert_eq!(pick_kv(0, down, |_| 0, 8, &kv, &mut rng), Pick::Unavailable);
    }

    #[test]
    fn kv_temperature_samples_towards_the_cheapest() {
        let kv = KvSettings {
            router_temperature: 0.5,
            ..KvSettings::default()
        };
        let mut rng = super::Rng::new(9);
        let overlap = [0, 64];
        let mut seen = [0u32; 2];
        for _ in 0..1000 {
            if let Pick::Member(i) = pick_kv(
                2,
                |_| kv_member(false, 0, 0),
                |i| overlap[i],
                64,
                &kv,
                &mut rng,
            ) {
                seen[i] += 1;
            }
        }
        // Weights 1 and e^-2: member 0 gets about 12 %.
        assert!(seen[1] > 800 && seen[0] > 60, "{seen:?}");
    }
}
