//! One step of the engine: building its batch (running sequences, then FIFO admissions),
//! preempting when the cache is full, and applying the step once it has ended.

use super::prefix::PrefixCache;
use super::{Engine, Micros, Seq, SeqId, Step, Token};

impl Engine {
    /// Builds the batch of a step starting at `t`: running sequences first, oldest first
    /// (decode: one token, prefill: a chunk of the token budget), then admissions.
    pub(super) fn schedule(&mut self, t: Micros) -> Option<Step> {
        let mut batch = std::mem::take(&mut self.spare);
        batch.clear();
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(seq) = self.seqs.get(&id) else {
                self.running.remove(i);
                continue;
            };
            if seq.prefill_left > 0 {
                let n = seq.prefill_left.min(budget);
                batch.push((id, n));
                budget -= n;
                i += 1;
                continue;
            }
            // Decode: the token this step samples needs room in the cache.
            let need = self
                .cfg
                .blocks_for(seq.context() + 1)
                .saturating_sub(seq.blocks);
            let mut preempted_self = false;
            while need > self.free_blocks() {
                let Some(victim) = self.running.last().copied() else {
                    break;
                };
                preempted = true;
                self.preempt(victim);
                if victim == id {
                    preempted_self = true;
                    break;
                }
            }
            if preempted_self {
                break; // it was the newest: nobody after it is running
            }
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.blocks += need;
            }
            self.used_blocks += need;
            batch.push((id, 0));
            budget -= 1;
            i += 1;
        }
        // vLLM admits nobody in a step that had to preempt; an empty batch admits anyway
        // so the engine never idles with work queued.
        if !preempted || batch.is_empty() {
            self.admit(t, &mut budget, &mut batch);
        }
        if batch.is_empty() {
            self.spare = batch;
            return None;
        }
        let prefill: u64 = batch.iter().map(|&(_, n)| u64::from(n)).sum();
        Some(Step {
            end: t + self.cfg.step_us(batch.len(), prefill),
            batch,
        })
    }

    /// Strict FIFO: admits from the head of the queue while a sequence slot, the blocks
    /// for its context plus one token, and token budget are there; stops at the first
    /// that does not fit. With prefix caching, an admitted prompt's cached blocks skip
    /// prefill.
    fn admit(&mut self, t: Micros, budget: &mut u32, batch: &mut Vec<(SeqId, u32)>) {
        while let Some(&id) = self.waiting.front() {
            if self.running.len() >= self.cfg.max_num_seqs as usize || *budget == 0 {
                return;
            }
            let free = self.free_blocks();
            let Some(seq) = self.seqs.get_mut(&id) else {
                self.waiting.pop_front();
                continue;
            };
            let need = self.cfg.blocks_for(seq.context() + 1);
            if seq.arrival > t || need > free {
                return;
            }
            self.waiting.pop_front();
            seq.blocks = need;
            seq.running = true;
            // Received prompt tokens count once, as vLLM counts every prompt token.
            self.prompt_tokens_total += u64::from(std::mem::take(&mut seq.received));
            if let Some(cache) = self.prefix.as_mut().filter(|_| !seq.remote) {
                let cached = seq.skip_cached(cache, self.cfg.block_size);
                self.prefix_queries_total += u64::from(seq.prompt);
                self.prefix_hits_total += u64::from(cached);
                // vLLM counts every prompt token, cached or computed.
                self.prompt_tokens_total += u64::from(cached);
            }
            let n = seq.prefill_left.min(*budget);
            self.used_blocks += need;
            self.running.push(id);
            batch.push((id, n));
            *budget -= n;
        }
    }

    /// Sends a running sequence back to the head of the queue, freeing its blocks; its
    /// whole context is recomputed when it is admitted again (vLLM V1's preemption).
    fn preempt(&mut self, id: SeqId) {
        self.running.retain(|&r| r != id);
        if let Some(seq) = self.seqs.get_mut(&id) {
            self.used_blocks -= seq.blocks;
            seq.blocks = 0;
            seq.running = false;
            seq.prefill_left = u32::try_from(seq.context()).unwrap_or(u32::MAX);
        }
        self.waiting.push_front(id);
        self.preemptions_total += 1;
    }

    /// Applies a finished step: prefill progress, one token per sequence whose context is
    /// complete, and the release of every sequence that reached its `max_tokens`.
    pub(super) fn complete(&mut self, step: Step, out: &mut Vec<Token>) {
        let mut finished = false;
        for &(id, n) in &step.batch {
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue; // aborted during the step
            };
            self.prompt_tokens_total += u64::from(n);
            seq.prefill_left -= n.min(seq.prefill_left);
            if seq.prefill_left > 0 {
                continue;
            }
            seq.generated += 1;
            self.generation_tokens_total += 1;
            let last = seq.generated >= seq.max_tokens;
            out.push(Token {
                id,
                index: seq.generated - 1,
                last,
                at: step.end,
                cached: seq.cached.unwrap_or(0),
            });
            if last {
                self.used_blocks -= seq.blocks;
                self.seqs.remove(&id);
                finished = true;
            }
        }
        if finished {
            let seqs = &self.seqs;
            self.running.retain(|r| seqs.contains_key(r));
        }
        self.spare = step.batch;
    }
}

impl Seq {
    /// Looks the prompt's blocks up at admission (and makes them the most recently used):
    /// the leading cached ones need no prefill, but the last context token is always
    /// computed (vLLM recomputes it to sample from). Returns the tokens skipped.
    fn skip_cached(&mut self, cache: &mut PrefixCache, block_size: u32) -> u32 {
        let hit = cache.admit(&self.prefix) as u64 * u64::from(block_size);
        let cached = u32::try_from(hit)
            .unwrap_or(u32::MAX)
            .min(self.prefill_left.saturating_sub(1));
        self.prefill_left -= cached;
        self.cached.get_or_insert(cached);
        cached
    }
}
