//! From a parsed generation request to a job: its disaggregation plan (local prefill, a
//! prefill for a decode engine, or KV received from a prefill engine), the prompt's
//! prefix block hashes, and the transfer time a received prompt waits.

use super::Mock;
use crate::disagg::{self, Plan};
use crate::openai::{self, Api, ApiError, Generate, Request};
use crate::sim::{Micros, prefix};

/// A generation request, decided.
pub(super) struct Job {
    pub g: Generate,
    /// The prompt's prefix block hashes (empty without prefix caching, and for a
    /// received prompt, which is not looked up).
    pub prefix: Vec<u64>,
    pub plan: Plan,
}

impl Mock {
    /// Plans a request: a malformed or misdirected handoff is refused (400). A prefill
    /// for an SGLang decode engine stops at its first token.
    pub(super) fn job(&self, api: Api, body: &[u8], request: Request) -> Result<Job, ApiError> {
        let Request {
            generate: mut g,
            handoff,
        } = request;
        let caching = self.engine_cfg.enable_prefix_caching;
        let text = if caching || handoff.needs_text() {
            openai::prompt_text(api, body)
        } else {
            Vec::new()
        };
        let plan = disagg::plan(&self.disagg, &handoff, g.prompt_tokens, &text)
            .map_err(ApiError::bad_request)?;
        if plan == Plan::PrefillSglang {
            g.max_tokens = 1;
            g.finish = openai::Finish::Length;
        }
        let prefix = if caching && !matches!(plan, Plan::Receive(..)) {
            prefix::block_hashes(&text, self.engine_cfg.block_bytes())
        } else {
            Vec::new()
        };
        Ok(Job { g, prefix, plan })
    }

    /// How long `blocks` KV blocks take to arrive from a prefill engine.
    pub(super) fn transfer_us(&self, blocks: u64) -> Micros {
        let us = blocks as f64 * self.cfg.kv_transfer_ms_per_block * 1000.0;
        us.round() as Micros
    }
}
