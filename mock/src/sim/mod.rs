//! The engine simulator: continuous batching over a paged KV cache, as plain state driven
//! by the caller's clock. No I/O, no clock reads: every call takes `now` in microseconds
//! since an epoch the caller chooses. The rules are the "time model" of [`crate`].

use std::collections::{HashMap, VecDeque};

use prefix::PrefixCache;

/// Microseconds since the caller's epoch.
pub type Micros = u64;

/// A sequence (one request) inside the engine.
pub type SeqId = u64;

/// The simulated hardware and scheduler limits.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub kv_blocks: u64,
    pub block_size: u32,
    pub max_num_seqs: u32,
    pub max_num_batched_tokens: u32,
    pub prefill_tokens_per_s: f64,
    pub decode_step_base_ms: f64,
    pub decode_step_per_seq_ms: f64,
    /// vLLM's automatic prefix caching: prompt blocks seen before skip prefill.
    pub enable_prefix_caching: bool,
}

impl EngineConfig {
    /// The rules vLLM enforces at start, plus finite, non-negative timings.
    pub fn validate(&self) -> Result<(), String> {
        if self.kv_blocks == 0 || self.block_size == 0 {
            return Err("kv_blocks and block_size must be at least 1".into());
        }
        if self.max_num_seqs == 0 {
            return Err("max_num_seqs must be at least 1".into());
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return Err(format!(
                "max_num_batched_tokens ({}) must be at least max_num_seqs ({})",
                self.max_num_batched_tokens, self.max_num_seqs
            ));
        }
        if !(self.prefill_tokens_per_s.is_finite() && self.prefill_tokens_per_s > 0.0) {
            return Err("prefill_tokens_per_s must be a finite value above 0".into());
        }
        for (name, v) in [
            ("decode_step_base_ms", self.decode_step_base_ms),
            ("decode_step_per_seq_ms", self.decode_step_per_seq_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be a finite value >= 0, got {v}"));
            }
        }
        Ok(())
    }

    /// The longest context (prompt + max_tokens) one sequence may reach: the whole cache.
    pub fn max_model_len(&self) -> u64 {
        self.kv_blocks * u64::from(self.block_size)
    }

    /// Prompt bytes per KV block, at the mock's 4 bytes a token: how [`prefix`] cuts text.
    pub fn block_bytes(&self) -> usize {
        self.block_size as usize * 4
    }

    fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(u64::from(self.block_size))
    }

    /// One step's duration: fixed cost, per-sequence cost, prefill compute.
    fn step_us(&self, seqs: usize, prefill_tokens: u64) -> Micros {
        let ms = self.decode_step_base_ms + self.decode_step_per_seq_ms * seqs as f64;
        let us = ms * 1000.0 + prefill_tokens as f64 * 1e6 / self.prefill_tokens_per_s;
        (us.round() as Micros).max(1)
    }
}

/// Why a request is refused before it enters the engine (vLLM answers these with 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error(
        "This model's maximum context length is {max} tokens. However, you requested {tokens} tokens ({prompt} in the messages, {completion} in the completion)."
    )]
    TooLong {
        tokens: u64,
        prompt: u32,
        completion: u32,
        max: u64,
    },
}

/// One token sampled for a sequence at the end of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    pub id: SeqId,
    /// 0 for the first token.
    pub index: u32,
    /// The sequence reached its `max_tokens` and left the engine.
    pub last: bool,
    /// When the step that produced it ended.
    pub at: Micros,
    /// Prompt tokens found in the prefix cache when the sequence was first admitted.
    pub cached: u32,
}

/// What the engine holds right now, and its counters (the `/metrics` and load-push values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    pub running: u64,
    /// Queued sequences, those waiting for their prompt's KV transfer included.
    pub waiting: u64,
    /// Blocks held; only running sequences hold any.
    pub used_blocks: u64,
    /// Context tokens not yet prefilled, over waiting and running sequences.
    pub prefill_tokens: u64,
    /// Prompt tokens prefilled (recomputation after a preemption included) plus those found
    /// in the prefix cache: vLLM counts every prompt token.
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub preemptions_total: u64,
    /// Prompt tokens looked up in the prefix cache, one lookup per admission.
    pub prefix_cache_queries_total: u64,
    /// Of those, tokens found cached (and not prefilled).
    pub prefix_cache_hits_total: u64,
}

#[derive(Debug)]
struct Seq {
    arrival: Micros,
    prompt: u32,
    max_tokens: u32,
    generated: u32,
    /// Context tokens to compute before the next token can be sampled: the prompt at
    /// first, prompt + generated after a preemption (recompute), 0 while decoding.
    prefill_left: u32,
    blocks: u64,
    running: bool,
    /// Chained hashes of the prompt's full blocks (empty without prefix caching).
    prefix: Vec<u64>,
    /// Prompt tokens cached at the first admission (vLLM's `num_cached_tokens`).
    cached: Option<u32>,
    /// Its prompt's KV came from another engine: no prefix-cache lookup.
    remote: bool,
    /// Prompt tokens received rather than computed, counted as prompt tokens at the
    /// first admission (then 0).
    received: u32,
}

impl Seq {
    fn context(&self) -> u64 {
        u64::from(self.prompt) + u64::from(self.generated)
    }
}

/// The batch of one step: each sequence with its prefill tokens (0: one decode token).
#[derive(Debug)]
struct Step {
    end: Micros,
    batch: Vec<(SeqId, u32)>,
}

/// The simulated engine: a FIFO waiting queue, a running batch and a block pool.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    /// Virtual time of the last step boundary.
    clock: Micros,
    step: Option<Step>,
    waiting: VecDeque<SeqId>,
    /// In admission order: the last one is the newest, the first to be preempted.
    running: Vec<SeqId>,
    /// Sequences waiting for their prompt's KV, by (landing time, id): each joins the
    /// back of `waiting` at the first step boundary at or after its landing.
    transfers: VecDeque<(Micros, SeqId)>,
    seqs: HashMap<SeqId, Seq>,
    used_blocks: u64,
    next_id: SeqId,
    prompt_tokens_total: u64,
    generation_tokens_total: u64,
    preemptions_total: u64,
    /// With `enable_prefix_caching`: the block hashes of recent prompts.
    prefix: Option<PrefixCache>,
    prefix_queries_total: u64,
    prefix_hits_total: u64,
    /// Reused batch storage.
    spare: Vec<(SeqId, u32)>,
}

impl Engine {
    /// A new, idle engine. `cfg` must have passed [`EngineConfig::validate`].
    pub fn new(cfg: EngineConfig) -> Engine {
        Engine {
            prefix: cfg
                .enable_prefix_caching
                .then(|| PrefixCache::new(cfg.kv_blocks)),
            prefix_queries_total: 0,
            prefix_hits_total: 0,
            cfg,
            clock: 0,
            step: None,
            waiting: VecDeque::new(),
            running: Vec::new(),
            transfers: VecDeque::new(),
            seqs: HashMap::new(),
            used_blocks: 0,
            next_id: 0,
            prompt_tokens_total: 0,
            generation_tokens_total: 0,
            preemptions_total: 0,
            spare: Vec::new(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Queues a request that arrived at `now`. It is scheduled by the next [`advance`]
    /// that reaches a step boundary at or after `now`.
    ///
    /// [`advance`]: Engine::advance
    pub fn submit(
        &mut self,
        now: Micros,
        prompt_tokens: u32,
        max_tokens: u32,
    ) -> Result<SeqId, SubmitError> {
        self.submit_prefixed(now, prompt_tokens, max_tokens, Vec::new())
    }

    /// [`Engine::submit`] with the prompt's block hashes ([`prefix::block_hashes`]), which
    /// the prefix cache looks up at admission; ignored when prefix caching is off.
    pub fn submit_prefixed(
        &mut self,
        now: Micros,
        prompt_tokens: u32,
        max_tokens: u32,
        prefix: Vec<u64>,
    ) -> Result<SeqId, SubmitError> {
        let id = self.insert(now, prompt_tokens, max_tokens, prefix, false)?;
        self.waiting.push_back(id);
        Ok(id)
    }

    /// Queues a request whose prompt was prefilled by another engine and whose KV lands
    /// here at `landing` (at or after `now`): until then it waits outside the FIFO queue,
    /// blocking nobody; at the first step boundary at or after `landing` it joins the
    /// back of the queue with every prompt token but the last computed (the last is
    /// recomputed to sample from, as vLLM does). It holds blocks once admitted, like any
    /// sequence, and a preemption recomputes its whole context locally.
    pub fn submit_remote(
        &mut self,
        now: Micros,
        prompt_tokens: u32,
        max_tokens: u32,
        landing: Micros,
    ) -> Result<SeqId, SubmitError> {
        let id = self.insert(now, prompt_tokens, max_tokens, Vec::new(), true)?;
        let at = self
            .transfers
            .partition_point(|&(t, other)| (t, other) < (landing, id));
        self.transfers.insert(at, (landing, id));
        Ok(id)
    }

    /// Checks a request and adds its sequence, queued nowhere yet.
    fn insert(
        &mut self,
        now: Micros,
        prompt_tokens: u32,
        max_tokens: u32,
        prefix: Vec<u64>,
        remote: bool,
    ) -> Result<SeqId, SubmitError> {
        if max_tokens == 0 {
            return Err(SubmitError::ZeroMaxTokens);
        }
        let tokens = u64::from(prompt_tokens) + u64::from(max_tokens);
        if tokens > self.cfg.max_model_len() {
            return Err(SubmitError::TooLong {
                tokens,
                prompt: prompt_tokens,
                completion: max_tokens,
                max: self.cfg.max_model_len(),
            });
        }
        let received = if remote {
            prompt_tokens.saturating_sub(1)
        } else {
            0
        };
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.insert(
            id,
            Seq {
                arrival: now,
                prompt: prompt_tokens,
                max_tokens,
                generated: 0,
                prefill_left: prompt_tokens - received,
                blocks: 0,
                running: false,
                prefix,
                cached: None,
                remote,
                received,
            },
        );
        Ok(id)
    }

    /// Removes a sequence wherever it is and frees its blocks at once. A step already
    /// under way keeps its duration; the sequence just gets no token from it.
    pub fn abort(&mut self, id: SeqId) -> bool {
        let Some(seq) = self.seqs.remove(&id) else {
            return false;
        };
        self.used_blocks -= seq.blocks;
        if seq.running {
            self.running.retain(|&r| r != id);
        } else {
            self.waiting.retain(|&w| w != id);
            self.transfers.retain(|&(_, t)| t != id);
        }
        true
    }

    /// Runs every step that ends at or before `now`, appending the tokens they produce to
    /// `out`, and starts the next step when there is work.
    pub fn advance(&mut self, now: Micros, out: &mut Vec<Token>) {
        loop {
            if let Some(step) = self.step.take() {
                if step.end > now {
                    self.step = Some(step);
                    return;
                }
                self.clock = step.end;
                self.complete(step, out);
            }
            let Some(start) = self.next_start(now) else {
                return;
            };
            if start > now {
                return;
            }
            self.clock = start;
            self.land(start);
            match self.schedule(start) {
                Some(step) => self.step = Some(step),
                None => return,
            }
        }
    }

    /// A busy engine starts the next step where the last one ended; an idle one when the
    /// first waiting request arrived or the first transfer lands. `None`: nothing to do.
    fn next_start(&self, now: Micros) -> Option<Micros> {
        if !self.running.is_empty() {
            return Some(self.clock);
        }
        let head = self
            .waiting
            .front()
            .map(|id| self.seqs.get(id).map_or(now, |s| s.arrival));
        let landing = self.transfers.front().map(|&(t, _)| t);
        head.into_iter()
            .chain(landing)
            .min()
            .map(|t| t.max(self.clock))
    }

    /// Moves the transfers landed by `t` to the back of the waiting queue, in order.
    fn land(&mut self, t: Micros) {
        while let Some(&(at, id)) = self.transfers.front() {
            if at > t {
                return;
            }
            self.transfers.pop_front();
            self.waiting.push_back(id);
        }
    }

    /// The next time [`Engine::advance`] has work: when the step under way ends, or, on
    /// an idle engine, when the first transfer lands.
    pub fn next_deadline(&self) -> Option<Micros> {
        match &self.step {
            Some(s) => Some(s.end),
            None => self.transfers.front().map(|&(t, _)| t.max(self.clock)),
        }
    }

    pub fn load(&self) -> Load {
        Load {
            running: self.running.len() as u64,
            waiting: (self.waiting.len() + self.transfers.len()) as u64,
            used_blocks: self.used_blocks,
            prefill_tokens: self.seqs.values().map(|s| u64::from(s.prefill_left)).sum(),
            prompt_tokens_total: self.prompt_tokens_total,
            generation_tokens_total: self.generation_tokens_total,
            preemptions_total: self.preemptions_total,
            prefix_cache_queries_total: self.prefix_queries_total,
            prefix_cache_hits_total: self.prefix_hits_total,
        }
    }

    fn free_blocks(&self) -> u64 {
        self.cfg.kv_blocks - self.used_blocks
    }
}

pub mod prefix;
mod schedule;
#[cfg(test)]
mod tests;
