//! `spillway mock-engine`: a simulated OpenAI-compatible inference engine to overload.
//!
//! It speaks what Spillway meets in front of vLLM: `POST /v1/chat/completions` and
//! `/v1/completions` (JSON or SSE streams shaped as vLLM emits them), `GET /metrics` in
//! vLLM's names, `GET /health`, `GET /v1/models`, and optionally pushes Dynamo-style load
//! events to a Spillway admin listener (`--push-load`). It can play either side of a
//! prefill/decode disaggregated deployment (`--role`). Behind the HTTP side sits a pure
//! simulator of continuous batching ([`sim`]), so load behaves like a GPU's: more
//! sequences make every token slower, a full batch makes requests queue, a full KV cache
//! preempts.
//!
//! # Time model
//!
//! The engine runs in steps, back to back while it has work; arrivals join at the next
//! step boundary. A step's batch is built vLLM-style: running sequences oldest first (a
//! decoding one takes 1 token of the `max_num_batched_tokens` budget, a prefilling one a
//! chunk of what is left), then admissions from the FIFO waiting queue while
//! `max_num_seqs`, the budget and free KV blocks allow; the queue's head blocks those
//! behind it. A step lasts `decode_step_base_ms + decode_step_per_seq_ms × sequences in
//! the batch + prefill tokens / prefill_tokens_per_s`. At its end every sequence whose
//! context is fully computed samples one token; the step that finishes a prompt's
//! prefill samples the first, so TTFT = queueing + prefill steps.
//!
//! KV cache: `kv_blocks` blocks of `block_size` tokens. A running sequence holds
//! ceil((prompt + generated + 1) / block_size) blocks: every token it has plus the one
//! being computed; admission needs that many free. When a decoding sequence needs a new
//! block and none is free, the newest running sequence is preempted (vLLM V1's recompute,
//! not a stall): its blocks are freed, it returns to the head of the queue and, once
//! readmitted, recomputes its prompt and generated tokens as prefill before its next
//! token. The client only sees a pause. A step that preempted admits nobody.
//!
//! Prefix caching (`enable_prefix_caching`, off by default) follows vLLM's automatic
//! prefix caching: the prompt text the engine sees (each chat message's role and text
//! content, or the completion `prompt` strings, written as JSON strings so boundaries stay
//! unambiguous) is cut into blocks of `block_size × 4` bytes, only full ones counting, each
//! named by a hash chained with its predecessor's ([`sim::prefix`]). An engine keeps the
//! most recently admitted `kv_blocks` block hashes in an LRU; at admission the prompt's
//! leading blocks found there are cached tokens and skip prefill (at least one token is
//! still computed), so they cost no step time; then all its blocks become the most
//! recently used. The cache saves compute, not memory: a sequence still holds blocks for
//! its whole context. `/metrics` counts the prompt tokens looked up and found
//! (`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`), and usage reports
//! `prompt_tokens_details.cached_tokens`.
//!
//! A sequence finishes at its `max_tokens` (`finish_reason` `"length"`; `"stop"` when the
//! request set no limit and `default_max_tokens` stood for the answer's natural end) and
//! frees its blocks; a client that disconnects aborts its sequence and frees them at
//! once. Requests whose prompt + max_tokens exceed the whole cache are refused (400).
//! Timing is deterministic given the arrival times: steps follow a virtual clock (each
//! starts exactly where the last ended), so a late wakeup of the mock's thread delays
//! delivery but never changes the schedule. The seed only picks the filler words.
//!
//! Prompt tokens are estimated as Spillway's tracked load does: bytes of the `messages`
//! or `prompt` value / 4, at least 1.
//!
//! # Fault modes
//!
//! To test what sits in front of it, the engine can play sick ([`Fault`]): set at start
//! (`--fault MODE`, [`MockConfig::fault`]) and switched at runtime with `POST /fault` on
//! its own port, body `{"mode":"<mode>"}` (optionally `"flap_period_ms":N`), answered 200
//! with the mode now in force (`{"mode":"fail"}`; a bad body gets 400). `GET /fault` says
//! which is in force. `/fault` itself is always answered, in every mode.
//!
//! - `none` (the default): healthy.
//! - `fail`: every `/v1/*` request is answered at once with `500` and
//!   `{"error":{"message":"engine failed","type":"InternalServerError","code":500}}`
//!   (keep-alive kept); `/health` still answers 200: an engine core dead behind a live API
//!   server that answers fast.
//! - `hang`: a hung process. Every request is read and never answered, `/health` and
//!   `/metrics` included; connections stay open (idle ones too) until the client closes
//!   them; `--push-load` pushes stop.
//! - `dead-core`: `/health` answers 200, every `/v1/*` request is read and never
//!   answered; only a real generation (a canary) catches it.
//! - `flap`: `--flap-period-ms` (default 2000) of healthy service, then as long of `fail`,
//!   and so on, starting healthy when the mode is set (at start or by `POST /fault`).
//!
//! A mode applies to requests read while it is in force: a response already under way
//! when it changes finishes as before.
//!
//! # Disaggregation (prefill/decode roles)
//!
//! An engine has a role ([`Role`], `--role`): `prefill`, `decode` or `both` (the default:
//! a whole engine, behaving as above). It speaks the two handoffs a disaggregating proxy
//! uses ([`disagg`]); a request without handoff fields is served as usual on every role
//! (a decode engine then prefills it locally).
//!
//! - vLLM (NixlConnector). Stage 1: a request whose `kv_transfer_params` has
//!   `"do_remote_decode": true`, on a prefill or whole engine, is prefilled and answered
//!   as usual; a non-streamed answer ends with a top-level `"kv_transfer_params":
//!   {"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[..],
//!   "remote_engine_id":"mock-<16 hex>","remote_host":"<listen IP>","remote_port":<listen
//!   port>,"tp_size":1}` (a streamed one gets none). The engine id is stable for a listen
//!   address and seed; the prompt's ceil(prompt tokens / `block_size`) block ids derive
//!   from a hash of the engine id and the prompt text (the text prefix caching reads).
//!   Stage 2: `"do_remote_prefill": true`, on a decode or whole engine, is received when
//!   the params check out (`remote_engine_id` a string, `remote_block_ids` the ids that
//!   engine id gives this prompt, `remote_host` a string, `remote_port` a port) and
//!   prefilled locally otherwise, as vLLM falls back when a transfer fails.
//! - SGLang: `bootstrap_host` (a non-empty string), `bootstrap_port` (1..=65535) and
//!   `bootstrap_room` (an integer in [0, 2^63)), all three. A prefill engine prefills and
//!   stops at the first token (`"length"`); the port must be its own `bootstrap_port`
//!   (default 8998). A decode engine receives the prompt. A whole engine ignores them.
//!
//! A received prompt waits `kv_transfer_ms_per_block` × its blocks (default 0.02 ms, a
//! 2 MiB block over ~100 GB/s), counted from its arrival (the mock does not wait for the
//! prefill engine), outside the waiting queue, blocking nobody but counted as waiting.
//! Then it joins the back of the queue at the next step boundary with every prompt token
//! but the last computed (vLLM recomputes the last one to sample from), so once admitted
//! its first token ends that step; it holds its blocks and counts its prompt tokens like
//! any sequence. Prefix caching does not look it up.
//!
//! Refused with 400, the message naming the field: `do_remote_decode` on a decode
//! engine, `do_remote_prefill` on a prefill one, both at once, `kv_transfer_params` that
//! is not an object, and malformed or partial bootstrap fields on a prefill or decode
//! engine. `kv_transfer_params` wins over bootstrap fields.
//!
//! To tell a real handoff from a fallback: every generation answered 200 carries
//! `x-mock-prefill: local` or `remote`; `/metrics` adds
//! `mock_kv_transfers_total{protocol="vllm"|"sglang",outcome="received"|"fallback"}`
//! (decode side, counted when the request is queued; SGLang's fields carry nothing to
//! check, so they are received or refused, never a fallback),
//! `mock_remote_prefills_total{protocol=..}` (prefill side, counted when the answer is
//! complete) and `mock_disagg_info{role,engine_id,bootstrap_port} 1.0`; and
//! `GET /last_request` answers the body of the last `POST /v1/*` request read, verbatim
//! (empty before the first), in every fault mode like `/fault`.

#![forbid(unsafe_code)]

mod clock;
pub mod disagg;
pub mod fault;
mod http;
pub mod metrics;
pub mod openai;
pub mod push;
mod reader;
mod rng;
mod server;
pub mod sim;

use std::io;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::thread::JoinHandle;

pub use disagg::Role;
pub use fault::Fault;
use sim::EngineConfig;

/// Defaults: a small GPU serving a small model (one vLLM engine, default scheduler limits).
pub mod defaults {
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    /// vLLM's port.
    pub const LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8000);
    pub const MODEL: &str = "mock-model";
    pub const SEED: u64 = 0;
    /// 2048 × 16 = 32k tokens of KV cache.
    pub const KV_BLOCKS: u64 = 2048;
    pub const BLOCK_SIZE: u32 = 16;
    pub const MAX_NUM_SEQS: u32 = 64;
    pub const MAX_NUM_BATCHED_TOKENS: u32 = 2048;
    pub const PREFILL_TOKENS_PER_S: f64 = 20_000.0;
    /// About 120 tokens/s for a lone sequence.
    pub const DECODE_STEP_BASE_MS: f64 = 8.0;
    /// A full batch of 64 takes 24 ms a step: ~2,700 tokens/s in all.
    pub const DECODE_STEP_PER_SEQ_MS: f64 = 0.25;
    pub const DEFAULT_MAX_TOKENS: u32 = 128;
    pub const PUSH_INTERVAL_MS: u64 = 100;
    /// Each half of a `flap` fault's cycle.
    pub const FLAP_PERIOD_MS: u64 = 2000;
    /// A block of 16 tokens of an 8B model's KV (2 MiB) over a ~100 GB/s RDMA link.
    pub const KV_TRANSFER_MS_PER_BLOCK: f64 = 0.02;
    /// SGLang's default `--disaggregation-bootstrap-port`.
    pub const BOOTSTRAP_PORT: u16 = 8998;
}

/// The mock engine's settings. [`Default`] looks like a small GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct MockConfig {
    /// Where to serve HTTP; port 0 picks a free port (see [`MockHandle::addr`]).
    pub listen: SocketAddr,
    /// The served model name; requests naming another model get 404.
    pub model: String,
    /// Seeds the generated text (the timing does not depend on it).
    pub seed: u64,
    /// KV-cache size in blocks (vLLM's `num_gpu_blocks`).
    pub kv_blocks: u64,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Most sequences running (in the batch) at once.
    pub max_num_seqs: u32,
    /// Token budget of one step: decode tokens plus prefill chunks.
    pub max_num_batched_tokens: u32,
    /// Prefill throughput: prompt tokens computed per second of step time.
    pub prefill_tokens_per_s: f64,
    /// Fixed cost of every step, in milliseconds.
    pub decode_step_base_ms: f64,
    /// Added cost per sequence in the step's batch, in milliseconds.
    pub decode_step_per_seq_ms: f64,
    /// `max_tokens` of requests that do not set one.
    pub default_max_tokens: u32,
    /// vLLM's automatic prefix caching (see the time model): off by default.
    pub enable_prefix_caching: bool,
    /// A Spillway admin base URL (`http://127.0.0.1:9090`): load events go to `{url}/load`.
    pub push_load: Option<String>,
    /// `worker_id` of pushed events; default: the `host:port` the mock listens on, which
    /// is Spillway's default worker name for that URL (set it when listening on 0.0.0.0).
    pub worker_name: Option<String>,
    /// How often load is pushed.
    pub push_interval_ms: u64,
    /// The fault mode at start (see the crate's "Fault modes"); `POST /fault` switches it.
    pub fault: Fault,
    /// Each half of a `flap` cycle (healthy, then failing), in milliseconds; at least 1.
    pub flap_period_ms: u64,
    /// Bytes of a `system_fingerprint` string in every response object and stream event
    /// (0: none), to make events as large as an engine's with logprobs.
    pub fingerprint_bytes: usize,
    /// The prefill/decode disaggregation role (see the crate's "Disaggregation"); the
    /// default, `Both`, is a whole engine.
    pub role: Role,
    /// Simulated KV transfer time per block of a prompt received from a prefill engine,
    /// in milliseconds (finite, at least 0).
    pub kv_transfer_ms_per_block: f64,
    /// SGLang's bootstrap port of this engine as a prefill worker: the `bootstrap_port` a
    /// request to a prefill engine must name.
    pub bootstrap_port: u16,
}

impl Default for MockConfig {
    fn default() -> Self {
        use defaults::*;
        MockConfig {
            listen: LISTEN,
            model: MODEL.to_string(),
            seed: SEED,
            kv_blocks: KV_BLOCKS,
            block_size: BLOCK_SIZE,
            max_num_seqs: MAX_NUM_SEQS,
            max_num_batched_tokens: MAX_NUM_BATCHED_TOKENS,
            prefill_tokens_per_s: PREFILL_TOKENS_PER_S,
            decode_step_base_ms: DECODE_STEP_BASE_MS,
            decode_step_per_seq_ms: DECODE_STEP_PER_SEQ_MS,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            enable_prefix_caching: false,
            push_load: None,
            worker_name: None,
            push_interval_ms: PUSH_INTERVAL_MS,
            fault: Fault::None,
            flap_period_ms: FLAP_PERIOD_MS,
            fingerprint_bytes: 0,
            role: Role::Both,
            kv_transfer_ms_per_block: KV_TRANSFER_MS_PER_BLOCK,
            bootstrap_port: BOOTSTRAP_PORT,
        }
    }
}

impl MockConfig {
    /// The simulator's part of the settings.
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            kv_blocks: self.kv_blocks,
            block_size: self.block_size,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            prefill_tokens_per_s: self.prefill_tokens_per_s,
            decode_step_base_ms: self.decode_step_base_ms,
            decode_step_per_seq_ms: self.decode_step_per_seq_ms,
            enable_prefix_caching: self.enable_prefix_caching,
        }
    }
}

/// A running mock engine. Dropping it stops the engine and joins its thread.
#[derive(Debug)]
pub struct MockHandle {
    /// The address it serves on (the real port when `listen` had port 0).
    pub addr: SocketAddr,
    stop: StdUnixStream,
    thread: Option<JoinHandle<()>>,
}

impl MockHandle {
    /// The base URL, `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops serving (in-flight requests are cut) and waits for the thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        use std::io::Write as _;
        let _ = (&self.stop).write_all(b"x");
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Validates `cfg`, binds, and starts the mock engine on its own thread.
pub fn start(cfg: MockConfig) -> io::Result<MockHandle> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    let engine = cfg.engine();
    engine.validate().map_err(invalid)?;
    if cfg.default_max_tokens == 0 {
        return Err(invalid("default_max_tokens must be at least 1".into()));
    }
    if cfg.flap_period_ms == 0 {
        return Err(invalid("flap_period_ms must be at least 1".into()));
    }
    let per_block = cfg.kv_transfer_ms_per_block;
    if !(per_block.is_finite() && per_block >= 0.0) {
        return Err(invalid(format!(
            "kv_transfer_ms_per_block must be a finite value >= 0, got {per_block}"
        )));
    }
    let listener = server::bind(cfg.listen)?;
    let addr = listener.local_addr()?;
    let push = match &cfg.push_load {
        Some(url) => {
            let target = push::Target::resolve(url).map_err(invalid)?;
            let worker = cfg.worker_name.clone().unwrap_or_else(|| addr.to_string());
            Some((target, worker))
        }
        None => None,
    };
    let (stop, stop_rx) = StdUnixStream::pair()?;
    stop_rx.set_nonblocking(true)?;
    tracing::info!(
        %addr,
        model = %cfg.model,
        kv_blocks = cfg.kv_blocks,
        block_size = cfg.block_size,
        max_num_seqs = cfg.max_num_seqs,
        max_num_batched_tokens = cfg.max_num_batched_tokens,
        enable_prefix_caching = cfg.enable_prefix_caching,
        push_load = cfg.push_load.as_deref().unwrap_or("off"),
        fault = %cfg.fault,
        role = %cfg.role,
        "mock engine serving"
    );
    let thread = std::thread::Builder::new()
        .name("spillway-mock".into())
        .spawn(move || server::run(cfg, engine, listener, stop_rx, push))?;
    Ok(MockHandle {
        addr,
        stop,
        thread: Some(thread),
    })
}
