//! Guards that give back what a connection or request holds, on drop, on every path
//! (completion, client gone, upstream error, timeout, migration): the connection count,
//! the core's requests in progress, the model's in-flight count, and the router-side load
//! tracked on a worker. Admission tickets are the gate's own guards.

use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::core::CoreCtx;
use crate::state::WorkerState;
use crate::state::counters::{ModelCore, Stage, add, sub};

/// One open client connection (across all cores, for `max_connections`).
pub(super) struct Connection(pub(super) Rc<CoreCtx>);

impl Connection {
    /// Counts a connection the caller has already added to `shared.connections`.
    pub(super) fn adopt(ctx: &Rc<CoreCtx>) -> Connection {
        Connection(ctx.clone())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.shared.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request in progress on this core (a drain waits for none).
pub(super) struct ActiveRequest(Rc<CoreCtx>);

impl ActiveRequest {
    pub(super) fn start(ctx: &Rc<CoreCtx>) -> ActiveRequest {
        ctx.active_requests.set(ctx.active_requests.get() + 1);
        ActiveRequest(ctx.clone())
    }
}

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        let n = &self.0.active_requests;
        n.set(n.get().saturating_sub(1));
    }
}

/// A proxied request in flight for its model (`dynamo_frontend_inflight_requests`).
pub(super) struct Inflight<'a>(&'a ModelCore);

impl<'a> Inflight<'a> {
    pub(super) fn start(cells: &'a ModelCore) -> Inflight<'a> {
        add(&cells.inflight, 1);
        Inflight(cells)
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        sub(&self.0.inflight, 1);
    }
}

/// The stage a request is in before its first response byte
/// (`dynamo_frontend_stage_requests`); none once the worker answered.
pub(super) struct InStage<'a> {
    cells: &'a ModelCore,
    stage: Option<Stage>,
}

impl<'a> InStage<'a> {
    pub(super) fn enter(cells: &'a ModelCore, stage: Stage) -> InStage<'a> {
        add(&cells.stages[stage as usize], 1);
        InStage {
            cells,
            stage: Some(stage),
        }
    }

    /// Moves to `stage` (`None`: out of every stage).
    pub(super) fn set(&mut self, stage: Option<Stage>) {
        if self.stage == stage {
            return;
        }
        if let Some(s) = self.stage {
            sub(&self.cells.stages[s as usize], 1);
        }
        if let Some(s) = stage {
            add(&self.cells.stages[s as usize], 1);
        }
        self.stage = stage;
    }
}

impl Drop for InStage<'_> {
    fn drop(&mut self) {
        self.set(None);
    }
}

/// A place in a model's retry budget (docs/behaviour.md §22.5), held from a request's
/// first retry to its end.
pub(super) struct RetryPlace<'a>(&'a AtomicU64);

impl<'a> RetryPlace<'a> {
    /// A place when fewer than `allowed` retries run now.
    pub(super) fn take(running: &'a AtomicU64, allowed: u64) -> Option<RetryPlace<'a>> {
        let mut now = running.load(Ordering::Relaxed);
        while now < allowed {
            match running.compare_exchange_weak(now, now + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(RetryPlace(running)),
                Err(seen) => now = seen,
            }
        }
        None
    }
}

impl Drop for RetryPlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One request bound for one worker, from its pick to its end (waiting at the worker's
/// gate, connecting, in the engine): the worker's requests in flight on this core
/// (power-of-two and least-loaded weigh them; the waiting-requests check counts them
/// against the engine's slots the moment the request is picked).
#[derive(Debug)]
pub(super) struct OnWorker<'a>(&'a AtomicU64);

impl<'a> OnWorker<'a> {
    pub(super) fn start(state: &'a WorkerState, core: usize) -> OnWorker<'a> {
        let cell = &state.tracked[core].inflight;
        add(cell, 1);
        OnWorker(cell)
    }
}

impl Drop for OnWorker<'_> {
    fn drop(&mut self) {
        sub(self.0, 1);
    }
}

/// Router-side accounting of one request on one worker (docs/behaviour.md §2.6): prefill
/// tokens until the first byte of the response body, KV blocks until the end.
#[derive(Debug)]
pub(super) struct Tracked<'a> {
    state: &'a WorkerState,
    core: usize,
    prompt_tokens: u64,
    block_size: u64,
    prefill: u64,
    blocks: u64,
    generated: u64,
}

impl<'a> Tracked<'a> {
    /// Starts tracking a request of `prompt_tokens`, of which `cached_tokens` are predicted
    /// cached on the worker (`kv` routing; 0 otherwise): those hold KV blocks but need no
    /// prefill.
    pub(super) fn start(
        state: &'a WorkerState,
        core: usize,
        prompt_tokens: u64,
        cached_tokens: u64,
        block_size: u32,
    ) -> Tracked<'a> {
        let block_size = u64::from(block_size.max(1));
        let blocks = prompt_tokens.div_ceil(block_size);
        let prefill = prompt_tokens.saturating_sub(cached_tokens);
        let cell = &state.tracked[core];
        add(&cell.prefill_tokens, prefill);
        add(&cell.decode_blocks, blocks);
        Tracked {
            state,
            core,
            prompt_tokens,
            block_size,
            prefill,
            blocks,
            generated: 0,
        }
    }

    /// The first byte of the response body arrived, `ttft` after the request started:
    /// prefill is over.
    pub(super) fn first_byte(&mut self, ttft: Duration) {
        let cell = &self.state.tracked[self.core];
        add(&cell.ttft_us, ttft.as_micros() as u64);
        add(&cell.first_tokens, 1);
        if self.prefill > 0 {
            sub(&self.state.tracked[self.core].prefill_tokens, self.prefill);
            self.prefill = 0;
        }
    }

    /// `n` more generated tokens (with `track_output_blocks`).
    pub(super) fn generated(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.generated += n;
        let blocks = (self.prompt_tokens + self.generated).div_ceil(self.block_size);
        if blocks > self.blocks {
            add(
                &self.state.tracked[self.core].decode_blocks,
                blocks - self.blocks,
            );
            self.blocks = blocks;
        }
    }
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        let cell = &self.state.tracked[self.core];
        sub(&cell.prefill_tokens, self.prefill);
        sub(&cell.decode_blocks, self.blocks);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;
    use crate::config::{Config, Overrides};
    use crate::state::Snapshot;

    #[test]
    fn tracked_load_returns_to_zero() {
        let cfg = Config::parse(
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            &Overrides::default(),
        )
        .unwrap();
        let snap = Snapshot::standalone(cfg, 2).unwrap();
        let state = &snap.workers[0].state;
        {
            let _on = OnWorker::start(state, 1);
            let mut t = Tracked::start(state, 1, 100, 0, 16);
            assert_eq!(state.tracked[1].prefill_tokens.load(Relaxed), 100);
            assert_eq!(state.tracked[1].decode_blocks.load(Relaxed), 7);
            t.first_byte(Duration::from_millis(42));
            assert_eq!(state.tracked[1].prefill_tokens.load(Relaxed), 0);
            assert_eq!(
                state.ttft_totals(),
                (42_000, 1),
                "the adaptive mode's sample"
            );
            t.generated(13);
            assert_eq!(state.tracked[1].decode_blocks.load(Relaxed), 8);
            assert_eq!(state.inflight_total(), 1);
        }
        assert_eq!(state.inflight_total(), 0);
        assert_eq!(state.tracked[1].decode_blocks.load(Relaxed), 0);
        assert_eq!(state.tracked[0].decode_blocks.load(Relaxed), 0);
    }

    #[test]
    fn inflight_guard_gives_back() {
        let cells = ModelCore::default();
        {
            let _a = Inflight::start(&cells);
            let _b = Inflight::start(&cells);
            assert_eq!(cells.inflight.load(Relaxed), 2);
        }
        assert_eq!(cells.inflight.load(Relaxed), 0);
    }
}
